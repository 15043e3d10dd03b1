"""A missing extra, and bad input that used to get through: one or two lines naming it, rc 2, before Ray starts."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from raysim.cli import main
from tests.support.tmpfs import mounted_tmpfs


def refused(argv: list[str], capsys, calls: list, *expected: str) -> str:
    """Run ``raysim argv`` in this process: rc 2, one or two lines on stderr holding ``expected``, no Ray."""
    code = main(argv)
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (out, err)
    assert 1 <= len(lines) <= 2 and "Traceback" not in out + err, err
    assert all(text in err for text in expected), err
    assert not calls, "Ray was started"
    return err


# -- a missing optional dependency (issue 28, item 11) ---------------------------------------------


def without(monkeypatch, module: str) -> None:
    """``module`` as if it were not installed (and every module already imported that imports it forgotten)."""
    monkeypatch.setitem(sys.modules, module, None)
    dependent = {"mujoco": "gymnasium.envs.mujoco"}.get(module)
    for name in [n for n in sys.modules if dependent and n.startswith(dependent)]:
        monkeypatch.delitem(sys.modules, name)


def test_a_mujoco_config_without_mujoco_names_the_extra_to_install(tmp_path, capsys, monkeypatch, ray_never_starts):
    without(monkeypatch, "mujoco")
    run = tmp_path / "run"
    err = refused(["train", "hopper_ppo", "--run-dir", str(run)], capsys, ray_never_starts, "env.id: gym:Hopper-v5")
    assert 'pip install "raysim[mujoco]"' in err and "bug" not in err
    assert not run.exists()


def test_evaluating_or_exporting_a_mujoco_run_without_mujoco_names_the_extra(
    tmp_path, capsys, monkeypatch, ray_never_starts
):
    pytest.importorskip("mujoco", reason="a MuJoCo run to evaluate needs MuJoCo to train it")
    run = str(tmp_path / "run")
    tiny = ["--set", "algo.num_steps=8", "--set", "algo.num_minibatches=1", "--set", "train.total_steps=16"]
    tiny += ["--set", "eval.episodes=0"]
    assert main(["train", "hopper_ppo", "--local", *tiny, "--run-dir", run]) == 0
    capsys.readouterr()
    without(monkeypatch, "mujoco")
    refused(["eval", run, "--episodes", "2"], capsys, ray_never_starts, 'pip install "raysim[mujoco]"')
    refused(["export", run, "--out", str(tmp_path / "p.pt")], capsys, ray_never_starts, 'pip install "raysim[mujoco]"')


def test_any_gymnasium_dependency_that_is_missing_is_the_users_with_gymnasiums_own_install_line(
    tmp_path, capsys, monkeypatch, ray_never_starts
):
    without(monkeypatch, "Box2D")
    for name in [n for n in sys.modules if n.startswith("gymnasium.envs.box2d")]:
        monkeypatch.delitem(sys.modules, name)
    err = refused(
        ["train", "--set", "env.id=gym:LunarLander-v3", "--run-dir", str(tmp_path / "run")],
        capsys,
        ray_never_starts,
        "env.id: gym:LunarLander-v3: Box2D is not installed",
    )
    assert 'pip install "gymnasium[box2d]"' in err


def test_an_atari_id_without_ale_py_says_what_to_install_not_that_the_id_is_unknown(
    tmp_path, capsys, monkeypatch, ray_never_starts
):
    without(monkeypatch, "ale_py")
    err = refused(
        ["train", "--set", "env.id=gym:ALE/Pong-v5", "--run-dir", str(tmp_path / "run")],
        capsys,
        ray_never_starts,
        "env.id: gym:ALE/Pong-v5 needs ale_py, which is not installed",
    )
    assert 'pip install "raysim[atari]"' in err and "unknown" not in err


def test_the_atari_preset_without_ale_py_names_the_atari_extra(tmp_path, capsys, monkeypatch, ray_never_starts):
    without(monkeypatch, "ale_py")
    run = tmp_path / "run"
    err = refused(["train", "breakout_ppo", "--run-dir", str(run)], capsys, ray_never_starts, "env.id: gym:Breakout")
    assert 'pip install "raysim[atari]"' in err and "ale-py" in err
    assert not run.exists()


@pytest.mark.parametrize(
    "setting, expected",
    [
        (
            "env.kwargs.atari.noop=3",
            "env.kwargs.atari.noop: the Atari preset has no option 'noop'; did you mean 'noop_max'",
        ),
        ("env.kwargs.atari.frame_skip=0", "env.kwargs.atari.frame_skip: must be >= 1, got 0"),
        ("env.kwargs.atari.episodic_life=1", "env.kwargs.atari.episodic_life: must be bool, got 1"),
        ("env.kwargs.atari=[]", "env.kwargs.atari: must be a mapping of preset options"),
        ("env.frame_stack.k=2", "env.frame_stack: the Atari preset stacks frames itself"),
    ],
)
def test_a_wrong_atari_preset_option_is_one_line(setting, expected, tmp_path, capsys, ray_never_starts):
    pytest.importorskip("ale_py")
    extra = ["--set", "env.frame_stack.groups=[policy]"] if "frame_stack" in setting else []
    refused(
        ["train", "breakout_ppo", "--set", setting, *extra, "--run-dir", str(tmp_path / "run")],
        capsys,
        ray_never_starts,
        expected,
    )


def test_a_namespace_whose_package_is_installed_is_registered_by_importing_it(monkeypatch):
    import gymnasium

    from raysim.envs import gym_adapter, make

    monkeypatch.setitem(gym_adapter.NAMESPACE_PACKAGES, "RaysimTest", ("tests.support.namespaced", "raysim-test"))
    monkeypatch.delitem(sys.modules, "tests.support.namespaced", raising=False)
    env = make("gym:RaysimTest/Pole-v0", 2, seed=0)
    assert env.num_envs == 2
    env.close()
    gymnasium.registry.pop("RaysimTest/Pole-v0")


def test_tune_without_ray_tune_names_the_tune_extra(capsys, monkeypatch, ray_never_starts):
    without(monkeypatch, "ray.tune")
    err = refused(["tune", "--param", "algo.lr=loguniform:1e-4:1e-2"], capsys, ray_never_starts, "raysim tune")
    assert 'pip install "raysim[tune]"' in err


def test_onnx_export_without_onnx_names_the_export_extra_before_reading_the_run(tmp_path, capsys, monkeypatch):
    without(monkeypatch, "onnx")
    out = tmp_path / "policy.onnx"
    err = refused(["export", str(tmp_path / "no-run"), "--format", "onnx", "--out", str(out)], capsys, [], "onnx")
    assert 'pip install "raysim[export]"' in err and not out.exists()


# -- bad input that used to get through (issue 28, item 14) ----------------------------------------


@pytest.fixture
def read_only_dir(tmp_path):
    """A read-only tmpfs (tests run as root, whom no permission bit stops); skipped where mounting is not allowed."""
    with mounted_tmpfs(tmp_path, "ro,size=1m", "a read-only tmpfs") as mount:
        yield mount


def test_a_run_dir_on_a_read_only_filesystem_is_refused_before_ray_starts(read_only_dir, capsys, ray_never_starts):
    run = read_only_dir / "run"
    refused(["train", "--run-dir", str(run)], capsys, ray_never_starts, f"run_dir {run}", "Read-only file system")


def test_resuming_a_run_on_a_filesystem_made_read_only_is_refused_before_ray_starts(
    tmp_path, capsys, monkeypatch, ray_never_starts
):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        run = disk / "run"
        tiny = ["--set", "train.total_steps=256", "--set", "env.num_envs=4", "--set", "eval.episodes=0"]
        assert main(["train", "--local", *tiny, "--set", "train.stop_after=1", "--run-dir", str(run)]) == 0
        capsys.readouterr()
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        refused(["resume", str(run)], capsys, ray_never_starts, f"run_dir {run}", "Read-only file system")
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_run_dir_under_a_file_is_refused_before_ray_starts(tmp_path, capsys, ray_never_starts):
    (tmp_path / "a-file").write_text("x")
    run = tmp_path / "a-file" / "run"
    refused(["train", "--run-dir", str(run)], capsys, ray_never_starts, f"run_dir {run}", "a-file is a file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


@pytest.mark.parametrize("backend", [[], ["--local"]], ids=["embedded-ray", "local"])
def test_more_rows_than_the_machines_memory_holds_are_refused_before_ray_starts(
    tmp_path, capsys, ray_never_starts, backend
):
    run = tmp_path / "run"
    argv = ["train", *backend, "--set", "env.num_envs=100000000", "--run-dir", str(run)]
    err = refused(argv, capsys, ray_never_starts, "env.num_envs", "algo.num_steps", "memory")
    assert "this machine" in err and not run.exists()


def test_the_memory_estimate_counts_the_chunk_the_issue_failed_to_allocate_and_lets_the_packaged_configs_fit():
    import raysim
    from raysim.coordinator.memory import memory_need
    from raysim.coordinator.preflight import check_env_and_model

    huge = raysim.load_config(None, ["env.num_envs=100000000"])
    need = memory_need(huge, check_env_and_model(huge))
    assert need.chunk >= 1e8 * 129 * 4 * 4  # obs[T+1]: the 206 GB torch could not allocate
    assert need.together >= 2 * need.chunk and need.problem(22e9, None, "this machine")
    for name in ("cartpole_ppo", "reach_ppo", "cartpole_grpo"):
        config = raysim.load_config(name)
        assert memory_need(config, check_env_and_model(config)).problem(1e9, 1e9, "a laptop") is None, name


def test_more_rows_than_an_attached_clusters_memory_holds_are_refused_before_any_role_starts(
    ray_session, tmp_path, capsys
):
    argv = ["train", "--set", "env.num_envs=100000000", "--run-dir", str(tmp_path / "run")]
    refused_rc = main(argv)
    err = capsys.readouterr().err
    assert refused_rc == 2 and len(err.strip().splitlines()) <= 2, err
    assert "env.num_envs" in err and "the Ray cluster" in err and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("algo:\n  lr: 1e-3\n  gamma: [0.9\nenv:\n  id: x\n", ":4:4:"),
        ("algo:\n  lr: 1e-3\n bad: 1\n", ":3:2:"),
        ('name: "unterminated\n', ":2:1:"),
        ("algo:\n\t- 1\n", ":2:1:"),
    ],
    ids=["flow sequence", "indentation", "quote", "tab"],
)
def test_malformed_yaml_is_its_file_line_and_column_in_one_line(tmp_path, capsys, ray_never_starts, text, where):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    err = refused(["train", str(config)], capsys, ray_never_starts, f"{config}{where} not valid YAML")
    assert len(err.strip().splitlines()) == 1 and "<unicode string>" not in err


@pytest.mark.parametrize(
    ("text", "where", "key", "first"),
    [
        ("seed: 1\nname: dup\nseed: 2\n", ":3:1:", "'seed'", "line 1"),
        ("algo:\n  lr: 1e-3\n  gamma: 0.9\n  lr: 3e-4\n", ":4:3:", "'lr'", "line 2"),
    ],
    ids=["top level", "nested"],
)
def test_a_key_given_twice_is_refused_naming_it_its_file_and_both_lines(
    tmp_path, capsys, ray_never_starts, text, where, key, first
):
    config = tmp_path / "twice.yaml"
    config.write_text(text)
    err = refused(["train", str(config)], capsys, ray_never_starts, f"{config}{where}", key, first)
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("text", ["", "# nothing but a comment\n"], ids=["empty", "comment"])
def test_an_empty_config_file_is_refused_in_one_line(tmp_path, capsys, ray_never_starts, text):
    config = tmp_path / "empty.yaml"
    config.write_text(text)
    err = refused(["train", str(config), "--run-dir", str(tmp_path / "run")], capsys, ray_never_starts, str(config))
    assert "empty" in err and len(err.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


@pytest.fixture
def not_ray():
    """host:port of a TCP server that accepts connections and never answers (something that is not Ray)."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_an_address_where_something_else_listens_is_refused_before_ray_is_asked(
    not_ray, tmp_path, capsys, ray_never_starts
):
    argv = ["train", "--address", not_ray, "--run-dir", str(tmp_path / "run")]
    refused(argv, capsys, ray_never_starts, f"no Ray cluster answers at {not_ray}")
    assert not Path(tmp_path / "run").exists()


# -- issue 41: settings that cannot mean what they say ------------------------------------------------


def test_an_atari_preset_stacking_more_frames_than_pixels_per_side_is_refused_naming_the_key(
    tmp_path, capsys, ray_never_starts
):
    """``[12, 10, 10]`` would read as channels last (10 channels of 12 x 10): refused as ``env.frame_stack`` is."""
    pytest.importorskip("ale_py")
    sets = ["env.kwargs.atari.frame_stack=12", "env.kwargs.atari.screen_size=10", "model.cnn=small"]
    argv = ["train", "breakout_ppo", *[arg for setting in sets for arg in ("--set", setting)]]
    expected = "env.kwargs.atari.frame_stack: 12 frames of 10x10 would read as another channel order"
    refused([*argv, "--run-dir", str(tmp_path / "run")], capsys, ray_never_starts, expected)


@pytest.mark.parametrize(
    "settings, expected",
    [
        (["model.cnn=nature"], "model.cnn: nature can have no effect: the env has no image observations"),
        (["model.shared_encoders=true", "model.cnn=impala"], "model.cnn: impala can have no effect"),
        (["model.shared_encoders=true"], "model.shared_encoders: True can have no effect"),
        (["model.cnn_features=64"], "model.cnn_features: 64 can have no effect"),
    ],
)
def test_a_cnn_setting_on_an_env_without_images_is_refused_naming_the_key(
    settings, expected, tmp_path, capsys, ray_never_starts
):
    sets = [arg for setting in settings for arg in ("--set", setting)]
    refused(["train", *sets, "--run-dir", str(tmp_path / "run")], capsys, ray_never_starts, expected, "leave model.")


def test_a_cnn_setting_where_the_networks_read_none_of_the_envs_images_is_refused_naming_the_inputs():
    from raysim import load_config
    from raysim.composition import ConfigError
    from raysim.coordinator.preflight import check_env_and_model
    from tests.support import multi_input  # noqa: F401  (registers RaysimTest/Spot-v0)

    vectors = ["env.id=gym:RaysimTest/Spot-v0", "model.actor_inputs=[joints]", "model.critic_inputs=[critic]"]
    with pytest.raises(ConfigError, match=r"model.cnn: small can have no effect: the networks read none of its image"):
        check_env_and_model(load_config(None, [*vectors, "model.cnn=small"]))
    assert check_env_and_model(load_config(None, [*vectors[:1], "model.actor_inputs=[camera, joints]"]))


def test_a_run_trained_with_a_cnn_setting_that_had_no_effect_still_resumes_and_evaluates_with_a_note(
    tmp_path, capsys, monkeypatch
):
    """Runs saved before the setting was refused keep working: their resume and evaluation only say it."""
    run_dir = tmp_path / "run"
    tiny = ["backend=local", "env.num_envs=4", "algo.num_steps=16", "train.total_steps=64", "eval.episodes=2"]
    with monkeypatch.context() as before:  # as raysim trained it before the check
        before.setattr("raysim.coordinator.preflight.check_image_settings", lambda *args: None)
        assert (
            main(["train", *[a for s in [*tiny, "model.cnn=nature"] for a in ("--set", s)], "--run-dir", str(run_dir)])
            == 0
        )
    capsys.readouterr()
    assert main(["resume", str(run_dir), "--set", "train.total_steps=128"]) == 0
    assert main(["eval", str(run_dir), "--local", "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("raysim: note: model.cnn: nature can have no effect") == 2
