"""Resume: snapshots, one identity, relocation, exact continuation, learner ranks that agree on errors."""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

import raysim
from raysim.checkpoint import Checkpoints, locate_checkpoint
from raysim.cli import main
from raysim.config import ConfigError
from raysim.coordinator.run_state import RunState
from raysim.envs import make
from raysim.identity import env_identity
from raysim.learner.learner import Learner
from raysim.records import read_metrics
from raysim.rollout.shard import EnvShard
from raysim.storage import open_storage

TINY = [
    "backend=local",
    "env.num_envs=4",
    "algo.num_steps=32",
    "algo.num_minibatches=2",
    "algo.update_epochs=2",
    "train.total_steps=1024",
    "eval.episodes=4",
    "eval.num_envs=2",
    "train.log_every=1",
]


def write_declaration(folder: Path) -> Path:
    """A run config whose env is declared through a component file (with a generated resource)."""
    (folder / "envs").mkdir(parents=True)
    (folder / "envs" / "cartpole.yaml").write_text(
        "id: raysim/CartPole\nkwargs:\n  initial_states: {generate: 16, seed: 3}\nmetadata:\n  robot: cart and pole\n"
    )
    (folder / "train.yaml").write_text("name: declared\nenv:\n  component: envs/cartpole.yaml\n  num_envs: 4\n")
    return folder / "train.yaml"


def metrics(run_dir: str | Path) -> list[dict]:
    rows = read_metrics(open_storage(run_dir))
    return [{k: v for k, v in row.items() if not k.startswith("time") and k != "steps_per_s"} for row in rows]


def final_weights(run_dir: str | Path) -> dict:
    _, _, state, _ = locate_checkpoint(run_dir)
    return state["model"]


def test_raw_and_expanded_env_declarations_have_the_same_identity():
    raw = {"id": "raysim/CartPole", "kwargs": {}}
    expanded = {"id": "raysim/CartPole", "kwargs": {"max_episode_steps": 500, "initial_states": None}, "num_envs": 7}
    assert env_identity(raw)[0] == env_identity(expanded)[0]
    assert env_identity(raw)[0] != env_identity({"id": "raysim/CartPole", "kwargs": {"max_episode_steps": 400}})[0]
    generated = {"id": "raysim/CartPole", "kwargs": {"initial_states": {"generate": 8, "seed": 1}}}
    array = make("raysim/CartPole", 1, initial_states={"generate": 8, "seed": 1}).initial_states.numpy()
    assert env_identity(generated)[0] == env_identity({"id": "raysim/CartPole", "kwargs": {"initial_states": array}})[0]


def test_the_gymnasium_adapters_runtime_options_and_spelled_out_defaults_leave_the_identity_unchanged():
    identity = env_identity({"id": "gym:CartPole-v1", "kwargs": {}})[0]
    for kwargs in (
        {"vectorize": "sync"},
        {"vectorize": "async"},
        {"autoreset_mode": "SameStep"},
        {"max_episode_steps": 500},  # the registration's step limit
        {"sutton_barto_reward": False},  # CartPoleEnv's constructor default
    ):
        assert env_identity({"id": "gym:CartPole-v1", "kwargs": kwargs})[0] == identity, kwargs
    for kwargs in ({"max_episode_steps": 200}, {"sutton_barto_reward": True}):
        assert env_identity({"id": "gym:CartPole-v1", "kwargs": kwargs})[0] != identity, kwargs


#: What raysim saved in meta.json for ``gym:CartPole-v1`` with ``vectorize: sync`` before the adapter's
#: options left the identity (computed by that version; kept verbatim).
OLD_GYM_META = {
    "identity": "004952c0950dbf27",
    "canonical_env": {"id": "gym:CartPole-v1", "kwargs": {"max_episode_steps": 500, "vectorize": "sync"}},
}


def as_saved_by_an_older_raysim(checkpoint: Path) -> None:
    """Give a checkpoint the old identity in meta.json (and its manifest the new file's hash)."""
    meta = json.loads((checkpoint / "meta.json").read_text())
    data = json.dumps({**meta, **OLD_GYM_META}, indent=2, sort_keys=True).encode()
    (checkpoint / "meta.json").write_bytes(data)
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest["files"]["meta.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


def test_a_run_saved_with_the_old_identity_resumes_also_with_another_vectorization(tmp_path):
    run_dir = tmp_path / "run"
    gym = ["env.id=gym:CartPole-v1", "env.kwargs.vectorize=sync", "eval.episodes=0"]
    raysim.Trainer(raysim.load_config(None, [*TINY, *gym, "train.stop_after=1", f"run_dir={run_dir}"])).train()
    as_saved_by_an_older_raysim(run_dir / "checkpoints" / "1")
    assert locate_checkpoint(run_dir)[3]["identity"] == OLD_GYM_META["identity"]  # intact, and old
    for vectorize in ("sync", "async"):
        overrides = [f"env.kwargs.vectorize={vectorize}", "train.stop_after=1"]
        summary = raysim.Trainer.from_run_dir(run_dir, overrides=overrides).train()
        assert summary.stopped_by == "stop_after", vectorize
    assert summary.iterations == 3
    migrated = env_identity({"id": "gym:CartPole-v1", "kwargs": {}})[0]
    assert locate_checkpoint(run_dir)[3]["identity"] == migrated


def test_a_component_declared_run_resumes_from_its_snapshot_its_declaration_and_after_a_move(tmp_path):
    declaration = write_declaration(tmp_path / "src")
    run_dir = tmp_path / "run"
    first = raysim.Trainer(raysim.load_config(declaration, [*TINY, "train.stop_after=2", f"run_dir={run_dir}"])).train()
    assert first.interrupted and first.iterations == 2
    gym = (run_dir / "configs" / "gym.yaml").read_text()
    assert "../resources/initial_states.npy" in gym and "robot: cart and pole" in gym
    assert (run_dir / "resources" / "initial_states.npy").is_file()

    once_more = ["train.stop_after=1"]
    assert raysim.Trainer.from_run_dir(run_dir, overrides=once_more).train().iterations == 3
    assert raysim.Trainer.from_run_dir(run_dir, declaration, [*TINY, *once_more]).train().iterations == 4
    assert raysim.Trainer.from_run_dir(run_dir, run_dir / "configs" / "gym.yaml", once_more).train().iterations == 5

    moved = tmp_path / "elsewhere" / "run"
    moved.parent.mkdir()
    shutil.move(run_dir, moved)
    shutil.rmtree(tmp_path / "src")  # the original declaration is gone too: the snapshot must suffice
    trainer = raysim.Trainer.from_run_dir(moved)
    assert trainer.config.env.kwargs["initial_states"] == {"file": str(moved / "resources" / "initial_states.npy")}
    assert trainer.config.env.metadata == {"robot": "cart and pole"}
    summary = trainer.train()
    assert summary.iterations == 8 and not summary.interrupted and summary.evaluation.completed == 4
    assert [r["iteration"] for r in metrics(moved)] == list(range(1, 9))


def test_a_real_env_difference_is_refused_with_every_key_named_and_force_is_loud(tmp_path, capsys):
    run_dir = tmp_path / "run"
    raysim.Trainer(raysim.load_config(None, [*TINY, "train.stop_after=1", f"run_dir={run_dir}"])).train()
    with pytest.raises(ConfigError) as error:
        raysim.Trainer.from_run_dir(run_dir, overrides=["env.kwargs.max_episode_steps=200"])
    assert "kwargs.max_episode_steps: checkpoint has 500, this config has 200" in str(error.value)
    raysim.Trainer.from_run_dir(run_dir, overrides=["env.kwargs.max_episode_steps=200"], force=True)
    assert "WARNING" in capsys.readouterr().out


def test_a_forced_resume_whose_env_changed_its_observation_shapes_is_one_line_before_anything_is_written(tmp_path):
    run_dir = tmp_path / "run"
    reach = ["env.id=raysim/Reach", "env.kwargs={num_links: 2, link_lengths: [0.5, 0.5]}"]
    raysim.Trainer(raysim.load_config(None, [*TINY, *reach, "train.stop_after=1", f"run_dir={run_dir}"])).train()
    snapshot = (run_dir / "configs" / "train.yaml").read_bytes()
    three_links = ["env.kwargs.num_links=3", "env.kwargs.link_lengths=[0.4, 0.3, 0.3]"]
    with pytest.raises(ConfigError, match=r"cannot resume .*: the checkpoint's weights do not fit this env: "):
        raysim.Trainer.from_run_dir(run_dir, overrides=three_links, force=True)
    assert (run_dir / "configs" / "train.yaml").read_bytes() == snapshot


RECURRENT = ["model.recurrent=lstm", "model.recurrent_size=8", "env.kwargs={velocities: false}"]


@pytest.mark.parametrize("placement", ["collocated", "servers"])
@pytest.mark.parametrize("model", [[], RECURRENT], ids=["feed-forward", "recurrent"])
def test_train_2k_equals_train_k_stop_resume_train_k_bitwise(tmp_path, model, placement):
    """Also for a recurrent policy: its rows' states are part of the shard state a checkpoint keeps (on the shard,
    which keeps them with policy servers too)."""
    overrides = [*TINY, *model, f"shards.placement={placement}", "train.total_steps=2048"]  # 16 iterations
    straight = raysim.Trainer(raysim.load_config(None, [*overrides, f"run_dir={tmp_path / 'a'}"])).train()
    raysim.Trainer(raysim.load_config(None, [*overrides, "train.stop_after=8", f"run_dir={tmp_path / 'b'}"])).train()
    resumed = raysim.Trainer.from_run_dir(tmp_path / "b").train()
    assert straight.iterations == resumed.iterations == 16
    a, b = final_weights(tmp_path / "a"), final_weights(tmp_path / "b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert metrics(tmp_path / "a") == metrics(tmp_path / "b")
    assert straight.evaluation.records == resumed.evaluation.records


def test_the_callers_config_is_unchanged_after_building_several_envs_from_it():
    kwargs = {"initial_states": {"generate": 8, "seed": 1}, "max_episode_steps": 100}
    before = copy.deepcopy(kwargs)
    envs = [make("raysim/CartPole", 2, seed=i, **kwargs) for i in range(3)]
    shards = [EnvShard("raysim/CartPole", 2, seed=i, env_kwargs=kwargs) for i in range(2)]
    assert kwargs == before
    assert all(torch.equal(e.initial_states, envs[0].initial_states) for e in envs)
    assert shards[0].env.initial_states is not shards[1].env.initial_states


@pytest.mark.slow
def test_two_learner_ranks_agree_on_a_state_that_fails_on_one_rank_then_train_save_and_load(ray_session, tmp_path):
    from raysim.actors import RayBackend
    from raysim.algos.ppo import PPOConfig
    from raysim.learner import Learner, LearnerGroup
    from raysim.learner.group import combined
    from raysim.models.networks import ModelConfig

    shard = EnvShard("raysim/CartPole", 4, seed=0)
    spaces = shard.spaces()[:2]
    algo = PPOConfig(num_steps=16, num_minibatches=2, update_epochs=1)
    backend = RayBackend()
    group = LearnerGroup(
        backend,
        2,
        options={"num_cpus": 1},
        observation_spaces=spaces[0],
        action_space=spaces[1],
        model=ModelConfig(),
        algo=algo,
        horizon=10,
        seed=0,
    )

    good = combined(backend.get([h.call(Learner.snapshot) for h in group.handles]))  # every rank's, as saved
    bad = copy.deepcopy(good)
    bad["model"]["actor.net.0.weight"] = torch.zeros(3, 3)  # a shape rank 0's model cannot take
    errors = []
    calls = [group.handles[0].call(Learner.load_state, bad), group.handles[1].call(Learner.load_state, good)]
    for call in calls:  # each rank's own outcome
        with pytest.raises(Exception) as caught:
            ray_session.get(call, timeout=120)
        message = str(caught.value)
        errors.append(message[message.index("RankError") :])
    assert errors[0] == errors[1]
    assert "failed on rank 0: RuntimeError" in errors[0] and "rank 1" not in errors[0]

    group.load_state(good)  # the group is still usable
    weights = ray_session.get(group.get_weights())
    chunks = [shard.rollout(weights, 16) for _ in range(2)]
    metrics = group.update([[ray_session.put(c)] for c in chunks])
    assert metrics["policy_version"] == 1 and metrics["env_steps"] == 128
    checkpoints = Checkpoints(open_storage(tmp_path / "run"))
    saved = checkpoints.save(1, combined(backend.get(group.snapshots)), {"env_steps": 128})  # as the trainer saves
    state, _ = checkpoints.load(saved)
    group.load_state(state)
    group.update([[ray_session.put(shard.rollout(ray_session.get(group.get_weights()), 16))] for _ in range(2)])
    w0, w1 = (ray_session.get(h.call(Learner.get_weights)) for h in group.handles)
    assert w0["version"] == w1["version"] == 2
    assert all(torch.equal(w0["actor"][k], w1["actor"][k]) for k in w0["actor"])
    assert state["version"] == 1


def test_metric_rows_of_a_run_resumed_between_log_steps_equal_the_uninterrupted_runs(tmp_path):
    # 9 iterations, rows at 3, 6 and 9; an evaluation at 5, between log steps, waits for row 6
    overrides = [*TINY, "train.total_steps=1152", "train.log_every=3", "eval.every=5", "train.sinks=[parquet]"]
    raysim.Trainer(raysim.load_config(None, [*overrides, f"run_dir={tmp_path / 'a'}"])).train()
    stopped = raysim.Trainer(raysim.load_config(None, [*overrides, "train.stop_after=5", f"run_dir={tmp_path / 'b'}"]))
    assert stopped.train().iterations == 5  # stopped after an iteration that is not a log step
    raysim.Trainer.from_run_dir(tmp_path / "b").train()
    resumed = read_metrics(open_storage(tmp_path / "b"))
    assert [row["iteration"] for row in resumed] == [3, 6, 9]
    assert metrics(tmp_path / "b") == metrics(tmp_path / "a")  # row 6 covers iterations 4 to 6, with the evaluation
    assert "eval_return" in metrics(tmp_path / "b")[1]
    times = [row["time"] for row in resumed]
    assert times == sorted(times)  # training seconds continue across the resume


def test_a_checkpoint_saved_without_metric_windows_or_run_time_loads_with_empty_ones():
    config = raysim.load_config(None, ["backend=local"])
    shard = EnvShard("raysim/CartPole", 2, seed=0, model=config.model)
    observation_spaces, action_space, _ = shard.spaces()
    learner = Learner(observation_spaces, action_space, config.model, config.algo, horizon=1000)
    learner.update(shard.rollout(learner.get_weights(), 32), log=False)
    older = {k: v for k, v in learner.state_dict().items() if k != "window"}  # as saved before windows were kept
    fresh = Learner(observation_spaces, action_space, config.model, config.algo, horizon=1000)
    assert fresh.load_state(older) == 1
    assert fresh.metrics()["episodes"] == 0  # an empty window: no iteration counted twice
    state = RunState.from_checkpoint({"iteration": 1, "env_steps": 64}, older)
    assert state.seconds == 0.0 and state.unlogged == {}


def test_a_window_logged_at_a_runs_unplanned_last_iteration_is_not_saved_again(tmp_path):
    # solved at iteration 2 (eval.stop_return 0), not a log step: the last iteration logs after its update
    overrides = [*TINY, "train.log_every=3", "eval.every=2", "eval.stop_return=0", f"run_dir={tmp_path}"]
    summary = raysim.Trainer(raysim.load_config(None, overrides)).train()
    assert summary.stopped_by == "solved" and summary.iterations == 2 and summary.metrics["iteration"] == 2
    _, _, state, _ = locate_checkpoint(tmp_path)
    assert state["window"]["counts"] == {}  # a resume's first row will not count iterations 1 and 2 again


def test_overrides_given_to_a_resume_become_part_of_the_runs_config(tmp_path, capsys):
    run_dir = tmp_path / "run"
    raysim.Trainer(raysim.load_config(None, [*TINY, "train.stop_after=2", f"run_dir={run_dir}"])).train()
    raysim.Trainer.from_run_dir(run_dir, overrides=["train.total_steps=1536", "train.stop_after=1"]).train()
    out = capsys.readouterr().out
    assert raysim.Trainer.from_run_dir(run_dir).train().env_steps == 1536  # a plain resume: the new budget
    assert raysim.load_config(run_dir / "configs" / "train.yaml").train.total_steps == 1536
    assert "train.total_steps=1536" in out  # said in one line


def test_a_run_whose_only_checkpoint_is_damaged_says_what_the_user_can_do(tmp_path, capsys):
    run_dir = tmp_path / "run"
    raysim.Trainer(raysim.load_config(None, [*TINY, "checkpoint.keep_last=1", f"run_dir={run_dir}"])).train()
    (only,) = (run_dir / "checkpoints").iterdir()
    (only / "state.pt").write_bytes(b"damaged")
    shutil.copytree(only, run_dir / "checkpoints" / "abandoned" / f"20261205-{only.name}")
    assert main(["resume", str(run_dir), "--local"]) == 2
    err = capsys.readouterr().err
    assert f"no intact checkpoint in {run_dir / 'checkpoints'}: checkpoint file {only / 'state.pt'}" in err
    assert f"1 checkpoint(s) of abandoned timelines in {run_dir / 'checkpoints' / 'abandoned'}" in err
    assert f"raysim train {run_dir / 'configs' / 'train.yaml'} --run-dir NEW_DIR" in err


PLACEMENTS = {"collocated": ("collocated", 1), "servers": ("servers", 1), "pipelined": ("servers", 2)}


def placed(name: str) -> list[str]:
    """The settings of placement ``name`` (``PLACEMENTS``)."""
    placement, pipeline = PLACEMENTS[name]
    return [f"shards.placement={placement}", f"servers.pipeline={pipeline}"]


@pytest.mark.parametrize(
    ("before", "after"),
    [("pipelined", "servers"), ("servers", "pipelined"), ("collocated", "pipelined"), ("pipelined", "collocated")],
)
def test_a_resume_across_placements_continues_and_says_how_its_shards_continue(tmp_path, capsys, before, after):
    """The rows of a pipelined worker's groups are not one env's rows: they start fresh episodes, said in the resume's
    line; the run's config keeps the new setting, and a plain resume then runs to the end."""
    run_dir = tmp_path / "run"
    short = [*TINY, "train.total_steps=512", "eval.episodes=0", f"run_dir={run_dir}"]
    raysim.Trainer(raysim.load_config(None, [*short, *placed(before), "train.stop_after=1"])).train()
    capsys.readouterr()
    raysim.Trainer.from_run_dir(run_dir, overrides=[*placed(after), "train.stop_after=1"]).train()
    groups = "is that of 2 groups" if before == "pipelined" else "is not that of 2 groups"
    assert f"shards continue fresh episodes (the saved state {groups}: servers.pipeline)" in capsys.readouterr().out
    summary = raysim.Trainer.from_run_dir(run_dir).train()
    assert "shards continue exactly" in capsys.readouterr().out
    assert summary.iterations == 4 and summary.env_steps == 512
    kept = raysim.load_config(run_dir / "configs" / "train.yaml")
    assert (kept.shards.placement, kept.servers.pipeline) == PLACEMENTS[after]


def file_hashes(folder: Path) -> dict[str, str]:
    """The SHA-256 of every file under ``folder``, by its path there."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def test_a_resume_that_fails_while_restoring_changes_no_file_of_the_run(tmp_path, monkeypatch):
    """Its new setting is not written into the run's config, and the checkpoint it would have abandoned (the newest,
    damaged) is not retired: a resume that fails leaves the run as it found it."""
    run_dir = tmp_path / "run"
    saved = [*TINY, "checkpoint.every=1", "train.stop_after=2", f"run_dir={run_dir}"]
    raysim.Trainer(raysim.load_config(None, saved)).train()
    (run_dir / "checkpoints" / "2" / "state.pt").write_bytes(b"damaged")  # the resume would continue from 1
    before = file_hashes(run_dir)

    def set_state(shard: EnvShard, state: dict) -> str:
        raise RuntimeError("the shard could not restore its state")

    monkeypatch.setattr(EnvShard, "set_state", set_state)
    with pytest.raises(RuntimeError, match="could not restore"):
        raysim.Trainer.from_run_dir(run_dir, overrides=["shards.placement=servers", "train.total_steps=2048"]).train()
    assert file_hashes(run_dir) == before
