"""Every mistake on the command line or in a config: one or two lines naming the key, rc 2, nothing written."""

from __future__ import annotations

import dataclasses
import io
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from gymnasium.envs.classic_control.pendulum import PendulumEnv

from raysim.algos import GRPO, PPO
from raysim.cli import main
from raysim.config import Config
from raysim.schema import rule_of

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ["train", "--local"]

CASES = [
    # config values that used to be tracebacks
    (["--set", "env.num_envs=0"], "env.num_envs must be >= 1, got 0"),
    (["--set", "shards.count=0"], "shards.count must be >= 1, got 0"),
    (["--set", "algo.num_steps=0"], "algo.num_steps must be >= 1, got 0"),
    (["--set", "algo.num_minibatches=0"], "algo.num_minibatches must be >= 1, got 0"),
    (["--set", "train.log_every=0"], "train.log_every must be >= 1, got 0"),
    (["--set", "env.num_envs=-4"], "env.num_envs must be >= 1, got -4"),
    (["--set", "algo.lr=-1"], "algo.lr must be > 0, got -1.0"),
    (["--set", "backend=slurm"], "backend must be one of ['ray', 'local'], got 'slurm'"),
    (["--set", "model.activation=foo"], "model.activation must be one of"),
    (["--set", "model.actor_inputs=[]"], "model.actor_inputs must be a non-empty list of observation group names"),
    (["--set", "model.actor_inputs=[camera]"], "model: model.actor_inputs names group 'camera', which the env does"),
    (
        ["--set", "model.cnn=resnet"],
        "model.cnn must be one of ['auto', 'nature', 'small', 'impala', 'keypoints'], got 'resnet'",
    ),
    (
        ["--set", "model.cnn=keypoints", "--set", "model.cnn_features=31"],
        "model.cnn_features must be even with model.cnn: keypoints (an x and a y per keypoint), got 31",
    ),
    (
        ["cartpole_grpo", "--set", "model.recurrent=gru"],
        "algo 'grpo' does not train recurrent policies (model.recurrent: gru); use algo.name: ppo, or model.recurrent",
    ),
    (
        ["--set", "model.recurrent=lstm", "--set", "algo.num_minibatches=3"],
        "with model.recurrent a minibatch is whole rows: a learner rank's 8 rows",
    ),
    (["--set", "model.recurrent=rnn"], "model.recurrent must be one of ['none', 'lstm', 'gru'], got 'rnn'"),
    (["--set", "algo.lr_schedule=cosine"], "algo.lr_schedule must be one of ['constant', 'linear'], got 'cosine'"),
    (["--set", "env.on_nonfinite=ignore"], "env.on_nonfinite must be one of ['raise', 'mask'], got 'ignore'"),
    (["--set", "env.kwargs.max_steps=200"], "env.kwargs.max_steps: raysim/CartPole has no option 'max_steps'"),
    (["--set", "env.id=gym:NoSuchEnv-v9"], "env.id: unknown Gymnasium id 'NoSuchEnv-v9'"),
    (["--set", "env.id=raysim/CartPol"], "env.id: unknown env id 'raysim/CartPol'; did you mean 'raysim/CartPole'?"),
    # silently accepted before
    (["--set", "train.total_steps=0"], "train.total_steps must be >= 1, got 0"),
    (["--set", "train.total_steps=-5"], "train.total_steps must be >= 1, got -5"),
    (["--set", "eval.episodes=-3"], "eval.episodes must be >= 0, got -3"),
    (["--set", "algo.gamma=1.5"], "algo.gamma must be <= 1, got 1.5"),
    # keys, types, syntax
    (["--set", "algo.lrr=1"], "unknown key 'algo.lrr'; did you mean 'algo.lr'?"),
    (["--set", "env.num_envs=lots"], "env.num_envs must be int, got 'lots'"),
    (["--set", "nonsense"], "expected key=value"),
    (["no/such/config.yaml"], "config file 'no/such/config.yaml' not found"),
    (["--set", "learner.ranks=3"], "learner.ranks must be >= 1 and divide shards.count (1), got 3"),
    (["--set", "algo.num_steps=2", "--set", "algo.num_minibatches=32"], "algo.num_minibatches (32) is more than"),
    (["--bogus"], "unrecognized arguments: --bogus"),
]


def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_clean_error(code: int, out: str, err: str, expected: str) -> None:
    assert code == 2, (out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert 1 <= len(lines) <= 2, err
    assert expected in err, err
    assert "Traceback" not in out + err and not out.strip(), out


@pytest.mark.parametrize(("args", "expected"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_a_bad_input_is_one_line_naming_the_key_with_rc_2_and_nothing_written(
    tmp_path, capsys, monkeypatch, args, expected
):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(["train", *args], capsys)  # without --local: the error comes before Ray would start
    assert_one_clean_error(code, out, err, expected)
    assert not any(tmp_path.iterdir())  # no run directory, nothing at all


def past_bounds() -> list[tuple[str, str, str]]:
    """``(key, value just past a bound, the rule's words)`` for every numeric setting of the schema."""
    cases = []
    sections = [(f.name, f.type) for f in dataclasses.fields(Config)]
    classes = [("", Config)] + [
        (name, dataclasses.fields(Config)[i].default_factory().__class__)
        for i, (name, _) in enumerate(sections)
        if name not in ("algo",) and dataclasses.is_dataclass(dataclasses.fields(Config)[i].default_factory)
    ]
    for prefix, cls in classes + [("algo", PPO.Config)]:
        for field in dataclasses.fields(cls):
            rule = rule_of(field)
            if rule is None or rule.choices is not None or not isinstance(field.default, (int, float)):
                continue
            key = f"{prefix}.{field.name}" if prefix else field.name
            number = (lambda v: v) if isinstance(field.default, float) else int
            if rule.low is not None:
                cases.append((key, str(number(rule.low if rule.open_low else rule.low - 1)), "must be"))
            if rule.high is not None:
                cases.append((key, str(number(rule.high if rule.open_high else rule.high + 1)), "must be"))
    return cases


def test_every_numeric_field_of_the_schema_just_past_its_bounds_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cases = past_bounds()
    assert len(cases) > 30 and {"env.num_envs", "algo.gamma", "eval.confidence", "seed"} <= {k for k, _, _ in cases}
    for key, value, words in cases:
        code, out, err = run_cli([*TRAIN, "--set", f"{key}={value}"], capsys)
        assert_one_clean_error(code, out, err, f"{key} {words}")
    grpo = [f for f in dataclasses.fields(GRPO.Config) if f.name == "group_size"][0]
    assert rule_of(grpo).low == 2
    assert not any(tmp_path.iterdir())


EVAL_CASES = [
    (["eval", "run", "--episodes", "-5"], "argument --episodes: must be an integer >= 1, got -5"),
    (["eval", "run", "--shards", "0"], "argument --shards: must be an integer >= 1, got 0"),
    (["eval", "run", "--envs-per-shard", "0"], "argument --envs-per-shard: must be an integer >= 1, got 0"),
    (["eval", "no-such-run"], "no-such-run is neither a run directory"),
    (["resume", "no-such-run"], "no-such-run has no checkpoint"),
    (["plot", "no-such-run"], "no-such-run has no metrics rows"),
]


@pytest.mark.parametrize(("args", "expected"), EVAL_CASES, ids=[" ".join(a) for a, _ in EVAL_CASES])
def test_bad_arguments_of_the_other_commands_are_one_line_errors(tmp_path, capsys, monkeypatch, args, expected):
    monkeypatch.chdir(tmp_path)
    assert_one_clean_error(*run_cli(args, capsys), expected)
    assert not any(tmp_path.iterdir())


def output_cases(tmp_path: Path) -> list[tuple[list[str], str]]:
    (tmp_path / "a-directory").mkdir()
    (tmp_path / "a-file").write_text("x")
    run = str(tmp_path / "no-run")
    return [
        (["export", run, "--out", str(tmp_path / "a-directory")], "is a directory"),
        (["export", run, "--out", str(tmp_path / "a-file" / "policy.pt")], "a-file is a file, not a directory"),
        (["export", run, "--out", "/proc/version"], "--out /proc/version"),
        (["eval", run, "--out", str(tmp_path / "a-directory")], "is a directory"),
        (["eval", run, "--out", "/proc/records.parquet"], "cannot write in /proc"),
        (["plot", run, "--out", str(tmp_path / "a-file" / "plot.png")], "a-file is a file, not a directory"),
    ]


def test_output_paths_are_checked_before_any_work(tmp_path, capsys):
    for args, expected in output_cases(tmp_path):
        assert_one_clean_error(*run_cli(args, capsys), expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-directory", "a-file"]


def test_an_explicit_run_dir_that_holds_a_run_is_refused_and_a_taken_default_name_is_said_first(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    tiny = ["--set", "train.total_steps=512", "--set", "eval.episodes=0", "--set", "env.num_envs=4"]
    assert main([*TRAIN, *tiny, "--run-dir", "mine"]) == 0
    capsys.readouterr()
    assert_one_clean_error(
        *run_cli([*TRAIN, *tiny, "--run-dir", "mine"], capsys),
        "run_dir mine holds a run: continue it with `raysim resume mine`",
    )
    assert main([*TRAIN, *tiny]) == 0
    capsys.readouterr()
    assert main([*TRAIN, *tiny]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == "raysim: runs/cartpole_ppo is taken: this run writes runs/cartpole_ppo-1"


def test_a_runtime_failure_is_its_message_and_how_to_resume_rc_1_without_a_stack(tmp_path, capsys):
    sets = [
        "--set",
        "env.id=tests.support.crashing:NaNRewards",
        "--set",
        "env.kwargs={every: 300}",
        "--set",
        "eval.episodes=0",
        "--set",
        "env.num_envs=4",
        "--set",
        "train.total_steps=2048",
    ]
    code, out, err = run_cli([*TRAIN, *sets, "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 1 and "Traceback" not in out + err
    assert "raysim: error: NonFiniteError: tests.support.crashing:NaNRewards returned a non-finite" in err
    assert f"raysim resume {tmp_path / 'run'}" in err


def test_a_bug_prints_its_one_line_error_and_how_to_get_the_trace(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("raysim.coordinator.Trainer.train", lambda self: 1 / 0)
    code, out, err = run_cli([*TRAIN, "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 1 and "Traceback" not in err
    assert "internal error: ZeroDivisionError: division by zero" in err and "--debug" in err
    with pytest.raises(ZeroDivisionError):
        main([*TRAIN, "--debug", "--run-dir", str(tmp_path / "run2")])


def test_a_reader_that_stops_reading_ends_the_command_without_calling_it_a_bug():
    """``raysim config algo | head -1``: the output's reader is gone before raysim writes (the pipe closed at once)."""
    command = [sys.executable, "-m", "raysim", "config", "algo"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1 and err == ""


class ReaderGoneAfter(io.StringIO):
    """Standard output whose reader stops after ``lines`` lines (``raysim train | head -2``)."""

    def __init__(self, lines: int):
        super().__init__()
        self.left = lines

    def write(self, text: str) -> int:
        if self.left <= 0:
            raise BrokenPipeError(32, "Broken pipe")
        self.left -= text.count("\n")
        return super().write(text)


def test_a_reader_that_stops_reading_during_training_costs_only_the_output(tmp_path, monkeypatch):
    """The run goes on to its final save and evaluation; only what it prints is lost."""
    stdout = ReaderGoneAfter(2)
    monkeypatch.setattr(sys, "stdout", stdout)
    tiny = ["--set", "train.total_steps=512", "--set", "eval.episodes=2", "--set", "env.num_envs=4"]
    assert main([*TRAIN, *tiny, "--run-dir", str(tmp_path / "run")]) == 0
    assert stdout.getvalue().count("\n") == 2
    assert list((tmp_path / "run" / "eval").glob("*.parquet")) and (tmp_path / "run" / "checkpoints").is_dir()


def test_an_embedded_ray_that_does_not_start_is_an_error_saying_what_to_do_not_a_bug(tmp_path, capsys, monkeypatch):
    import ray

    def times_out(**kwargs):
        raise Exception("The current node timed out during startup. This could happen because ...")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", times_out)
    code, out, err = run_cli(["train", "--address", "local", "--run-dir", str(tmp_path / "run")], capsys)
    assert code == 1 and "Traceback" not in out + err and "bug" not in err
    assert "raysim: error: the embedded Ray did not start (The current node timed out during startup." in err
    assert "ray start --head" in err and not (tmp_path / "run").exists()


def test_resuming_a_run_whose_budget_is_reached_says_how_to_extend_it(tmp_path, capsys):
    run_dir = tmp_path / "run"
    tiny = ["--set", "train.total_steps=512", "--set", "eval.episodes=2", "--set", "env.num_envs=4"]
    assert main([*TRAIN, *tiny, "--run-dir", str(run_dir)]) == 0
    capsys.readouterr()
    assert main(["resume", str(run_dir), "--local"]) == 0
    out = capsys.readouterr().out
    assert "nothing to train: the run is at 512 env steps and the config's budget is train.total_steps=512" in out
    assert f"raysim resume {run_dir} --set train.total_steps=<more>" in out


def test_a_few_inputs_in_a_real_subprocess_too(tmp_path):
    environ = {**os.environ, "PYTHONPATH": str(ROOT)}
    for args, expected in [
        (["train", "--set", "algo.gamma=1.5"], "algo.gamma must be <= 1"),
        (["train", "--address", "127.0.0.1:1"], "no Ray cluster answers at 127.0.0.1:1"),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "raysim", *args],
            cwd=tmp_path,
            env=environ,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and expected in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) <= 2 and not any(tmp_path.iterdir())


class NoisyPendulum(PendulumEnv):
    """Pendulum that writes a notice to the process's stderr when built (as a C library would)."""

    def __init__(self, **kwargs):
        os.write(2, b"NoisyPendulum: a start-up notice\n")
        super().__init__(**kwargs)


def test_a_box_action_space_raises_no_torch_warning_and_an_envs_start_up_message_is_kept_once(capfd):
    import warnings

    from raysim.rollout import EnvShard

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shard = EnvShard("gym:Pendulum-v1", 2, seed=0)
        shard.rollout({"version": 0, "actor": shard.actor.state_dict()}, 4)
    assert not [w for w in caught if "not writable" in str(w.message)]
    gym.register("RaysimTestNoisyPendulum-v0", entry_point=NoisyPendulum, max_episode_steps=200)
    capfd.readouterr()
    shard = EnvShard("gym:RaysimTestNoisyPendulum-v0", 3, seed=0)  # prints a notice per env it builds, as MuJoCo 4 did
    assert capfd.readouterr().err == ""  # nothing reaches the console from the shard...
    assert shard.messages == ["NoisyPendulum: a start-up notice"]  # ...it is kept, once
