"""``raysim export``: standalone deterministic policies (TorchScript, ONNX) equal to raysim's own actions."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import raysim
from raysim.checkpoint import locate_checkpoint
from raysim.cli import main
from raysim.config import load_run_config
from raysim.models.networks import Actor
from raysim.rollout.inference import inference
from tests.support.multi_input import tiny_spot_run

SITE_PACKAGES = str(Path(torch.__file__).resolve().parent.parent)

RUNS = {
    # name: (config, overrides)
    "cartpole": (None, []),
    "reach_clip": ("reach_ppo", ["env.num_envs=8", "algo.num_steps=16"]),
    "reach_squash": ("reach_ppo", ["env.num_envs=8", "algo.num_steps=16", "model.action_transform=squash"]),
    "reach_norm": ("reach_ppo", ["env.num_envs=8", "algo.num_steps=16", "model.obs_norm=true"]),
    "reach_state": (  # a log-std per state: the net's outputs are the mean, then the log-std, and the export the mean
        "reach_ppo",
        ["env.num_envs=8", "algo.num_steps=16", "model.log_std=state", "model.action_transform=squash"],
    ),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny trained runs (a few PPO iterations, in-process), by name."""
    root = tmp_path_factory.mktemp("export_runs")
    out = {}
    for name, (config, overrides) in RUNS.items():
        cfg = raysim.load_config(
            config, ["backend=local", "train.total_steps=512", "eval.episodes=0", f"run_dir={root / name}", *overrides]
        )
        out[name] = Path(raysim.Trainer(cfg).train().run_dir)
    return out


def raysim_actions(run_dir: Path, obs: torch.Tensor) -> torch.Tensor:
    """What raysim's deterministic evaluation acts: ``env_action(deterministic(obs))`` under ``inference``.

    With ``model.obs_norm`` the actor normalizes by its own (loaded) running statistics.
    """
    storage, _, state, _ = locate_checkpoint(run_dir)
    config = load_run_config(storage)
    env = raysim.envs.make(config.env.id, 1, **config.env.kwargs)
    actor = Actor(env.observation_spaces, env.action_space, config.model)
    actor.load_state_dict({k[6:]: v for k, v in state["model"].items() if k.startswith("actor.")})
    with inference(actor):
        return actor.env_action(actor.deterministic(obs))


def observations(run_dir: Path, n: int = 256) -> torch.Tensor:
    """Observations the policy meets (env rows after random steps) plus wide random ones (clipping)."""
    config = raysim.load_config(Path(run_dir) / "configs" / "train.yaml")
    env = raysim.envs.make(config.env.id, 32, seed=5, **config.env.kwargs)
    rows = [env.reset(5)["policy"].clone()]
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        if hasattr(env.action_space, "n"):
            actions = torch.randint(int(env.action_space.n), (32,), generator=generator)
        else:
            actions = torch.rand(32, *env.action_space.shape, generator=generator) * 2 - 1
        rows.append(env.step(actions).obs["policy"].clone())
    seen = torch.cat(rows)
    wide = torch.randn(n - len(seen), seen.shape[1], generator=generator) * 3
    return torch.cat([seen, wide]).float()


def run_clean(code: str, cwd: Path) -> str:
    """Run ``code`` in a fresh interpreter where only torch's site-packages is importable (no raysim)."""
    prelude = f"import sys; sys.path.append({SITE_PACKAGES!r})\n"
    prelude += (
        "try:\n    import raysim\nexcept ImportError:\n    pass\nelse:\n    raise SystemExit('raysim is importable')\n"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", prelude + textwrap.dedent(code)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": os.environ.get("PATH", "")},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.parametrize("name", list(RUNS))
def test_torchscript_policy_in_a_process_without_raysim_equals_raysim_actions(runs, name, tmp_path, capsys):
    out = tmp_path / "policy.pt"
    assert main(["export", str(runs[name]), "--format", "torchscript", "--out", str(out)]) == 0
    assert "export:" in capsys.readouterr().out
    obs = observations(runs[name])
    np.save(tmp_path / "obs.npy", obs.numpy())
    run_clean(
        f"""
        import numpy, torch
        extra = {{"raysim.json": ""}}
        policy = torch.jit.load({str(out)!r}, _extra_files=extra)
        with torch.no_grad():
            action = policy(torch.from_numpy(numpy.load({str(tmp_path / "obs.npy")!r})))
        numpy.save({str(tmp_path / "action.npy")!r}, action.numpy())
        open({str(tmp_path / "meta.json")!r}, "wb").write(extra["raysim.json"])
    """,
        tmp_path,
    )
    exported = np.load(tmp_path / "action.npy")
    expected = raysim_actions(runs[name], obs).numpy()
    assert exported.dtype == expected.dtype and exported.shape == expected.shape
    np.testing.assert_array_equal(exported, expected)
    meta = json.loads((tmp_path / "meta.json").read_text())
    if name == "cartpole":
        assert exported.dtype == np.int64 and exported.shape == (len(obs),) and meta["discrete"]
    else:
        assert exported.dtype == np.float32 and exported.shape == (len(obs), 2)
        assert (np.abs(exported) <= 1).all()  # in Reach's action space [-1, 1]


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
def test_export_bakes_in_the_actors_observation_normalization(runs, tmp_path):
    """A run trained with ``model.obs_norm=true``: the export applies the actor's running statistics,
    ``clamp((obs - mean) / sqrt(var + 1e-8), -10, 10)``, and acts exactly as raysim does."""
    _, checkpoint, state, _ = locate_checkpoint(runs["reach_norm"])
    mean, var, count = (state["model"][f"actor.obs_norm.{k}"] for k in ("mean", "var", "count"))
    assert float(count) > 0 and not torch.equal(var, torch.ones_like(var))  # trained statistics

    from raysim.export import export_policy

    info = export_policy(runs["reach_norm"], tmp_path / "p.pt")
    assert info["normalized"]
    policy = torch.jit.load(str(tmp_path / "p.pt"))
    obs = observations(runs["reach_norm"])
    with torch.no_grad():
        got = policy(obs)
    assert torch.equal(got, raysim_actions(runs["reach_norm"], obs))
    # by hand: the same network on the normalized observations; without them the actions differ
    config = raysim.load_config(runs["reach_norm"] / "configs" / "train.yaml")
    env = raysim.envs.make(config.env.id, 1, **config.env.kwargs)
    plain = Actor(env.observation_spaces, env.action_space, dataclasses.replace(config.model, obs_norm=False))
    plain.load_state_dict(
        {k[6:]: v for k, v in state["model"].items() if k.startswith("actor.net.") or k == "actor.log_std"}
    )
    normalized = torch.clamp((obs - mean) / torch.sqrt(var + 1e-8), -10.0, 10.0)
    with inference(plain):
        torch.testing.assert_close(got, plain.env_action(plain.deterministic(normalized)), rtol=1e-6, atol=1e-6)
        assert not torch.equal(got, plain.env_action(plain.deterministic(obs)))  # the normalization matters
    plain_info = export_policy(runs["reach_clip"], tmp_path / "q.pt")
    assert not plain_info["normalized"]


def onnx_runtime():
    """onnxruntime, or the test skipped naming what to install (the export needs onnx, the check onnxruntime)."""
    pytest.importorskip("onnx", reason="ONNX export needs the onnx package (pip install 'raysim[export]')")
    return pytest.importorskip(
        "onnxruntime", reason="checking the ONNX file needs onnxruntime (pip install 'raysim[export]')"
    )


@pytest.mark.parametrize("name", ["cartpole", "reach_squash", "reach_state"])
def test_onnx_policy_equals_raysim_actions(runs, name, tmp_path):
    ort = onnx_runtime()
    out = tmp_path / "policy.onnx"
    assert main(["export", str(runs[name]), "--format", "onnx", "--out", str(out)]) == 0
    obs = observations(runs[name])
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    (action,) = session.run(["action"], {"obs": obs.numpy()})
    expected = raysim_actions(runs[name], obs).numpy()
    assert action.dtype == expected.dtype and action.shape == expected.shape
    if name == "cartpole":
        np.testing.assert_array_equal(action, expected)
    else:  # another runtime's kernels: equal to float32 rounding
        np.testing.assert_allclose(action, expected, rtol=1e-5, atol=1e-5)
    (one,) = session.run(["action"], {"obs": obs[:1].numpy()})  # any batch size
    assert one.shape[0] == 1


def test_export_errors_are_clear(tmp_path, capsys):
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "p.pt")]) == 2
    assert "neither a run directory" in capsys.readouterr().err


RECURRENT_RUNS = {
    # name: (config, overrides, core, state size): an LSTM on stateless CartPole (discrete), a GRU on Reach
    # (continuous, obs_norm), a GRU on Spot (a dict of groups: an image and a vector)
    "cartpole_lstm": ("cartpole_stateless_lstm_ppo", ["algo.update_epochs=2", "model.recurrent_size=16"], "lstm", 32),
    "reach_gru": (
        "reach_ppo",
        [
            "env.num_envs=8",
            "algo.num_steps=16",
            "model.recurrent=gru",
            "model.recurrent_size=16",
            "model.obs_norm=true",
        ],
        "gru",
        16,
    ),
    "spot_gru": (None, tiny_spot_run("-", "model.recurrent=gru", "model.recurrent_size=8"), "gru", 8),
}


@pytest.fixture(scope="module")
def recurrent_runs(tmp_path_factory):
    """Tiny trained recurrent runs (a few PPO iterations, in-process), by name."""
    root = tmp_path_factory.mktemp("recurrent_runs")
    out = {}
    for name, (config, overrides, _, _) in RECURRENT_RUNS.items():
        cfg = raysim.load_config(
            config, ["backend=local", "train.total_steps=512", "eval.episodes=0", *overrides, f"run_dir={root / name}"]
        )
        out[name] = Path(raysim.Trainer(cfg).train().run_dir)
    return out


#: Rows that start an episode at each step of the loop (all at the first; some in the middle).
STARTS = [[0, 1, 2, 3, 4], [], [], [1, 3], [], [0], [], [2, 4], []]


def episode_loop(run_dir: Path, rows: int = 5):
    """The actor of ``run_dir`` acting with a ``RowMemory`` over ``STARTS``: per step, the observation batch (the one
    group's tensor, or a dict of the actor's groups), the starts flags, what raysim acts,
    ``env_action(deterministic(obs, memory))``, and the state after it."""
    from raysim.models import RowMemory

    storage, _, state, _ = locate_checkpoint(run_dir)
    config = load_run_config(storage)
    env = raysim.envs.make(config.env.id, rows, seed=5, **config.env.kwargs)
    actor = Actor(env.observation_spaces, env.action_space, config.model)
    actor.load_state_dict({k[6:]: v for k, v in state["model"].items() if k.startswith("actor.")})
    memory = RowMemory(actor.core, rows)

    def actor_obs(groups):
        if len(actor.inputs) == 1:
            return groups[actor.inputs[0]].clone()
        return {g: groups[g].clone() for g in actor.inputs}

    obs = actor_obs(env.reset(5))
    steps = []
    with inference(actor):
        for starting in STARTS:
            starts = torch.zeros(rows, dtype=torch.bool)
            starts[starting] = True
            memory.restart(starts)
            action = actor.env_action(actor.deterministic(obs, memory=memory))
            steps.append((obs, starts, action, memory.state.clone()))
            obs = actor_obs(env.step(action).obs)
    return steps, actor.core.state_size


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("name", list(RECURRENT_RUNS))
def test_a_recurrent_torchscript_policy_driven_over_episodes_acts_and_remembers_as_the_actor(
    recurrent_runs, name, tmp_path
):
    from raysim.export import export_policy

    out = tmp_path / "policy.pt"
    info = export_policy(recurrent_runs[name], out, "torchscript")
    steps, state_size = episode_loop(recurrent_runs[name])
    assert (info["recurrent"], info["state_size"]) == (*RECURRENT_RUNS[name][2:],) and state_size == info["state_size"]
    extra = {"raysim.json": ""}
    policy = torch.jit.load(str(out), _extra_files=extra)
    assert json.loads(extra["raysim.json"])["state_size"] == state_size
    rows = len(steps[0][1])  # not the two rows the export was traced with
    state = torch.zeros(rows, state_size)
    with torch.no_grad():
        for obs, starts, expected_action, expected_state in steps:
            action, state = policy(obs, state, starts)
            assert action.dtype == expected_action.dtype and action.shape == expected_action.shape
            assert torch.equal(action, expected_action)  # the actor's own operations on the same batch
            assert torch.equal(state, expected_state)
        assert state.abs().sum() > 0
        # the starts flags matter: without them (the state carried on) the last state differs
        carried = torch.zeros_like(state)
        for obs, _, _, _ in steps:
            _, carried = policy(obs, carried, torch.zeros(rows, dtype=torch.bool))
        assert not torch.allclose(carried, state)


@pytest.mark.parametrize("name", list(RECURRENT_RUNS))
def test_a_recurrent_onnx_policy_driven_over_episodes_acts_and_remembers_as_the_actor(recurrent_runs, name, tmp_path):
    ort = onnx_runtime()
    out = tmp_path / "policy.onnx"
    assert main(["export", str(recurrent_runs[name]), "--format", "onnx", "--out", str(out)]) == 0
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    steps, state_size = episode_loop(recurrent_runs[name])
    groups = list(steps[0][0]) if isinstance(steps[0][0], dict) else ["obs"]
    assert [i.name for i in session.get_inputs()] == [*groups, "state", "starts"]
    assert [o.name for o in session.get_outputs()] == ["action", "next_state"]
    state = np.zeros((len(steps[0][1]), state_size), np.float32)
    for obs, starts, expected_action, expected_state in steps:
        feed = {g: v.numpy() for g, v in obs.items()} if isinstance(obs, dict) else {"obs": obs.numpy()}
        action, state = session.run(["action", "next_state"], {**feed, "state": state, "starts": starts.numpy()})
        assert action.dtype == expected_action.numpy().dtype and action.shape == tuple(expected_action.shape)
        if expected_action.dtype == torch.int64:
            np.testing.assert_array_equal(action, expected_action.numpy())
        else:  # another runtime's kernels: equal to float32 rounding
            np.testing.assert_allclose(action, expected_action.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(state, expected_state.numpy(), rtol=1e-5, atol=1e-5)
