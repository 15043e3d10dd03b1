"""Policy servers (``shards.placement: servers``): a worker served by a server collects exactly what a collocated
shard collects, a server batches several workers' requests, keeps its last versions, and a run is the same run in
either placement, a server that dies included."""

from __future__ import annotations

import dataclasses
import re
import sys

import pyarrow.parquet as pq
import pytest
import torch

import raysim
from raysim.actors import LocalBackend, RayBackend
from raysim.checkpoint import locate_checkpoint
from raysim.cli import main
from raysim.coordinator import Trainer, faults
from raysim.coordinator.collector import Collector
from raysim.coordinator.servers import Servers
from raysim.coordinator.session import Session
from raysim.envs import make
from raysim.learner.window import episode_stats, episode_sums
from raysim.models import Actor, ModelConfig
from raysim.records import read_metrics
from raysim.rollout import EnvShard
from raysim.rollout.chunk import RolloutChunk, concat_rows
from raysim.rollout.endings import EvalEpisodes, FixedSteps
from raysim.rollout.pipelined import PipelinedShard
from raysim.rollout.server import ActReply, ActRequest, PolicyServer, ServerLost, WeightsMissing
from raysim.seeding import PIPELINE_GROUP, derive_seed
from raysim.storage import open_storage

CARTPOLE = ("raysim/CartPole", {})
STATELESS = ("raysim/CartPole", {"velocities": False, "max_episode_steps": 9})  # episodes end within a chunk
REACH = ("raysim/Reach", {"max_episode_steps": 20})
CAMERA = ("raysim/ReachCamera", {"camera": {"size": 8}, "max_episode_steps": 20})
CAMERA_MODEL = {"actor_inputs": ["camera", "joints"], "cnn_features": 8, "hidden_sizes": [16]}

# (env, model) of each kind of policy a worker must act with exactly as a collocated shard does
POLICIES = {
    "discrete": (CARTPOLE, {"hidden_sizes": [16, 16]}),
    "gaussian-obs-norm": (REACH, {"hidden_sizes": [16, 16], "obs_norm": True, "init_log_std": -0.5}),
    "gaussian-state-std": (REACH, {"hidden_sizes": [16, 16], "log_std": "state", "action_transform": "squash"}),
    "lstm": (STATELESS, {"recurrent": "lstm", "recurrent_size": 8, "hidden_sizes": [16]}),
    "gru": (STATELESS, {"recurrent": "gru", "recurrent_size": 8, "hidden_sizes": [16]}),
    "camera-keypoints": (CAMERA, {**CAMERA_MODEL, "cnn": "keypoints"}),
    "camera-small-cnn": (CAMERA, {**CAMERA_MODEL, "cnn": "small"}),
}


def trained_looking(actor: Actor, seed: int) -> dict[str, torch.Tensor]:
    """``actor``'s weights moved away from their initialization, its observation statistics made up: weights
    whose every part matters to the actions."""
    generator = torch.Generator().manual_seed(seed)
    state = {}
    for name, value in actor.state_dict().items():
        noise = torch.randn(value.shape, generator=generator).to(value.dtype)
        if name.endswith("obs_norm.var"):
            state[name] = 0.5 + noise.abs()
        elif name.endswith("obs_norm.count"):
            state[name] = torch.tensor(100.0, dtype=value.dtype)
        else:
            state[name] = value + 0.1 * noise
    return state


def placements(policy: str, rows: int = 4, seed: int = 3, teacher: dict | None = None):
    """A collocated shard and a worker of an in-process server, same env and seed; the weights (a dict, as the
    learner gives them) and the key of the same weights on the server (what the worker receives)."""
    (env_id, env_kwargs), model = POLICIES[policy]
    model = ModelConfig(**model)
    made = dict(env_kwargs=env_kwargs, seed=seed, model=model, teacher=teacher)
    collocated = EnvShard(env_id, rows, **made)
    server = PolicyServer(*collocated.spaces()[:2], model)
    worker = EnvShard(env_id, rows, **made, server=server.act)
    with torch.random.fork_rng():  # the weights depend on the seed alone, not on the tests run before
        torch.manual_seed(seed)
        actor = Actor(*collocated.spaces()[:2], model)
    weights = {"version": 4, "timeline": "a", "actor": trained_looking(actor, seed)}
    return collocated, worker, weights, server.load(weights)


def assert_same_chunk(a: RolloutChunk, b: RolloutChunk) -> None:
    """Every field of the two chunks equal: tensors bitwise (and of one dtype), dicts per group, None as None."""
    for field in dataclasses.fields(RolloutChunk):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, dict):
            assert x.keys() == y.keys(), field.name
            pairs = [(f"{field.name}.{k}", x[k], y[k]) for k in x]
        else:
            pairs = [(field.name, x, y)]
        for name, u, v in pairs:
            if isinstance(u, torch.Tensor):
                assert isinstance(v, torch.Tensor) and u.dtype == v.dtype and u.shape == v.shape, name
                assert torch.equal(u, v), name
            else:
                assert u == v, name


@pytest.mark.parametrize("policy", list(POLICIES))
def test_a_worker_served_alone_collects_bitwise_the_chunks_of_a_collocated_shard(policy):
    collocated, worker, weights, key = placements(policy)
    for _ in range(3):  # the rows' episodes, noise and recurrent state continue across chunks
        expected, chunk = collocated.rollout(weights, 12), worker.rollout(key, 12)
        assert_same_chunk(chunk, expected)
    assert worker.actor is None and chunk.policy_version == 4
    if collocated.memory is not None:
        assert chunk.state0 is not None and bool(chunk.starts[1:].any()) and len(chunk.final_t) > 0


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "stochastic"])
@pytest.mark.parametrize("policy", ["discrete", "gaussian-obs-norm", "gaussian-state-std", "lstm", "camera-keypoints"])
def test_a_workers_evaluation_records_equal_a_collocated_shards(policy, deterministic):
    collocated, worker, weights, key = placements(policy, rows=3)
    plan = EvalEpisodes([2, 1, 2], row_offset=0, seed=5, max_steps=40, deterministic=deterministic)
    expected, served = collocated.evaluate(weights, plan), worker.evaluate(key, plan)
    assert served == expected
    assert len(served[0]) == 5  # every episode counted


def test_a_workers_teacher_labels_and_acts_as_on_a_collocated_shard():
    """Distillation: the teacher stays on the worker; its labels, and the actions it takes for half the rows, are the
    collocated shard's."""
    (env_id, env_kwargs), _ = POLICIES["camera-keypoints"]
    env = make(env_id, 1, **env_kwargs)
    spaces, action_space = env.observation_spaces, env.action_space
    model = ModelConfig(hidden_sizes=[16])  # the teacher reads the student's joints as its ``policy`` group
    actor = Actor({"policy": spaces["joints"]}, action_space, model)
    teacher = {
        "key": "teacher",
        "source": "made up",
        "model": dataclasses.asdict(model),
        "inputs": {"policy": "joints"},
        "actor": trained_looking(actor, 7),
    }
    collocated, worker, weights, key = placements("camera-keypoints", teacher=teacher)
    plan = FixedSteps(12, teacher_share=0.5)
    for _ in range(2):
        expected, chunk = collocated.rollout(weights, plan), worker.rollout(key, plan)
        assert_same_chunk(chunk, expected)
    assert chunk.labels.shape == (12, 4, 2) and bool(chunk.labels.abs().sum() > 0)


class Recording:
    """A server's ``act`` that keeps a copy of each request it answers."""

    def __init__(self, server: PolicyServer):
        self.server, self.requests = server, []

    def __call__(self, request: ActRequest) -> ActReply:
        copy = {f.name: getattr(request, f.name) for f in dataclasses.fields(ActRequest)}
        copy["obs"] = {g: v.clone() for g, v in request.obs.items()}
        copy |= {k: v.clone() for k, v in copy.items() if isinstance(v, torch.Tensor)}
        self.requests.append(ActRequest(**copy))
        return self.server.act(request)


@pytest.mark.parametrize("policy", ["discrete", "gaussian-obs-norm", "lstm", "camera-keypoints"])
def test_two_workers_requests_served_in_one_batch_get_what_each_gets_served_alone(policy):
    """Each step of two workers (other seeds, other row counts): their requests served together, as one forward
    pass, against each served alone; to float tolerance (a batch of other rows may round otherwise). A recurrent
    actor's next state and a chunk's last peek too."""
    collocated, _, weights, key = placements(policy, rows=4, seed=3)
    server = PolicyServer(*collocated.spaces()[:2], ModelConfig(**POLICIES[policy][1]))
    server.load(weights)
    (env_id, env_kwargs), model = POLICIES[policy]
    workers = [Recording(server), Recording(server)]
    for rows, seed, recording in zip((4, 3), (3, 8), workers, strict=True):
        EnvShard(env_id, rows, seed=seed, model=model, env_kwargs=env_kwargs, server=recording).rollout(key, 3)
    assert len(workers[0].requests) == len(workers[1].requests) >= 3
    for first, second in zip(workers[0].requests, workers[1].requests, strict=True):
        together, alone = server.serve([first, second]), [server.act(first), server.act(second)]
        for a, b in zip(together, alone, strict=True):
            for field in ("action", "logp", "state", "output"):
                x, y = getattr(a, field), getattr(b, field)
                assert (x is None) == (y is None), field
                assert x is None or torch.allclose(x, y, rtol=1e-5, atol=1e-6), field
        if not first.peek:
            assert alone[0].action.shape[0] == 4 and alone[1].action.shape[0] == 3
            assert not torch.equal(alone[0].logp[:3], alone[1].logp)  # each worker's own rows, not the other's


def test_a_server_keeps_its_last_versions_and_refuses_a_request_for_another_naming_it():
    env = make("raysim/CartPole", 2)
    server = PolicyServer(env.observation_spaces, env.action_space, ModelConfig(), keep=2)
    state = Actor(env.observation_spaces, env.action_space, ModelConfig()).state_dict()
    keys = [server.load({"version": v, "timeline": "a", "actor": state}) for v in (1, 2)]
    assert server.held() == keys == [("a", 1), ("a", 2)]
    assert server.load({"version": 2, "timeline": "a", "actor": state}) == ("a", 2) and server.held() == keys
    keys.append(server.load({"version": 3, "timeline": "a", "actor": state}))
    assert server.held() == [("a", 2), ("a", 3)]  # the oldest dropped
    worker = EnvShard("raysim/CartPole", 2, server=server.act)
    assert worker.rollout(("a", 2), 4).policy_version == 2
    for missing in (("a", 1), ("b", 3)):  # evicted; never loaded (another timeline)
        with pytest.raises(WeightsMissing, match=re.escape(f"weights {missing} are not on this server")):
            worker.rollout(missing, 4)
    request = ActRequest(("a", 1), {"policy": env.reset(0)["policy"]}, torch.zeros(2, 2))
    refused, served = server.serve([request, dataclasses.replace(request, key=("a", 3))])
    assert isinstance(refused, WeightsMissing) and "('a', 1)" in str(refused) and served.action.shape == (2,)


TINY = [
    "env.num_envs=4",
    "algo.num_steps=32",
    "algo.num_minibatches=2",
    "algo.update_epochs=2",
    "train.total_steps=768",
    "train.log_every=1",
    "eval.every=3",
    "eval.episodes=4",
    "eval.num_envs=2",
    "train.sinks=[parquet]",
]
GRPO = [
    "cartpole_grpo",
    "env.num_envs=8",
    "algo.group_size=4",
    "algo.num_steps=100",
    "algo.update_epochs=2",
    "algo.num_minibatches=2",
    "train.total_steps=1500",
    "train.log_every=1",
    "eval.every=2",
    "eval.episodes=4",
    "eval.num_envs=2",
    "train.sinks=[parquet]",
]


def train(run_dir, overrides: list[str]):
    """A run of ``overrides`` (a first item without ``=`` names the config) in ``run_dir``; its summary."""
    name = overrides[0] if "=" not in overrides[0] else None
    overrides = overrides[1:] if name else overrides
    return Trainer(raysim.load_config(name, [*overrides, f"run_dir={run_dir}"])).train()


def assert_same_run(a, b) -> None:
    """Two runs' summaries: the same final weights, metric rows (but wall times) and evaluation records."""
    rows = [
        [{k: v for k, v in row.items() if not k.startswith("time") and k != "steps_per_s"} for row in read_metrics(s)]
        for s in (open_storage(a.run_dir), open_storage(b.run_dir))
    ]
    assert rows[0] == rows[1] and len(rows[0]) == a.iterations
    weights = [locate_checkpoint(s.run_dir)[2]["model"] for s in (a, b)]
    assert weights[0].keys() == weights[1].keys() and all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert a.evaluation.records == b.evaluation.records and a.evaluation.completed == 4


@pytest.mark.parametrize("config", [TINY, GRPO], ids=["ppo", "grpo"])
def test_a_run_with_policy_servers_is_the_collocated_run(tmp_path, config):
    collocated = train(tmp_path / "collocated", [*config, "backend=local"])
    served = train(tmp_path / "served", [*config, "backend=local", "shards.placement=servers"])
    assert served.iterations == collocated.iterations > 1
    assert_same_run(served, collocated)


class KillServerAt:
    """A phase hook that kills policy server 0 once, at ``phase`` of ``iteration`` (its process gone, as a node's)."""

    def __init__(self, phase: str, iteration: int):
        self.phase, self.iteration, self.fired = phase, iteration, False

    def __call__(self, phase: str, iteration: int, session: Session) -> None:
        if not self.fired and (phase, iteration) == (self.phase, self.iteration):
            session.backend.kill(session.roles.servers.handles[0])
            self.fired = True


def record_chunks(monkeypatch) -> list[tuple[int, int, bool]]:
    """``(iteration, shard, fresh)`` of every chunk a run trains on, read in the driver as the collector takes it."""
    chunks, collect = [], Collector.collect

    def recording(collector, *args, **kwargs):
        collected = collect(collector, *args, **kwargs)
        iteration = 1 + (chunks[-1][0] if chunks else 0)
        chunks.extend((iteration, c.shard, c.fresh) for part in collected.parts for c in collector.backend.get(part))
        return collected

    monkeypatch.setattr(Collector, "collect", recording)
    return chunks


SERVED_ON_RAY = [*TINY, "shards.count=2", "backend=ray", "shards.placement=servers", "shards.num_cpus=0.5"]


@pytest.mark.slow
def test_a_ray_run_of_two_workers_and_one_server_that_dies_twice_is_replaced_and_is_the_collocated_run(
    ray_session, tmp_path, capsys, monkeypatch
):
    """Two workers and one server on Ray: the server dies between collections (after iteration 1: its load of the
    weights fails before its shards begin the next chunk) and again before the final evaluation (after iteration 3).
    Each time a new one serves: nothing is lost, no training episode restarts, and the run (records, weights, rows,
    evaluation) is the collocated one. (One run for the three claims: its iterations without a fault are the
    fault-free served run.)"""
    chunks = record_chunks(monkeypatch)
    with faults.registered(between := KillServerAt("collect", 1)), faults.registered(before := KillServerAt("eval", 3)):
        served = train(tmp_path / "served", SERVED_ON_RAY)
    out = capsys.readouterr().out
    assert between.fired and before.fired and out.count("raysim: fault: policy server 0 died") == 2, out
    assert [fresh for _, _, fresh in chunks] == [True, True] + [False] * 4  # only the new shards' first chunks
    monkeypatch.undo()
    collocated = train(tmp_path / "collocated", [*TINY, "shards.count=2", "backend=local"])
    assert served.iterations == collocated.iterations == 3
    assert_same_run(served, collocated)


@pytest.mark.slow
def test_a_server_that_dies_while_its_workers_collect_is_replaced_and_they_start_fresh_episodes(
    ray_session, tmp_path, capsys, monkeypatch
):
    """With ``max_policy_lag`` 1 each shard collects its next chunk while the driver handles the last one: the
    server dies during that collection (256 steps, each a call to the server)."""
    chunks = record_chunks(monkeypatch)
    overrides = [*SERVED_ON_RAY, "algo.max_policy_lag=1", "algo.num_steps=256", "train.total_steps=8192"]
    with faults.registered(kill := KillServerAt("collect", 2)):
        summary = train(tmp_path / "run", [*overrides, "eval.every=0"])
    out = capsys.readouterr().out
    assert kill.fired and "raysim: fault: policy server 0 died" in out and "replaced it" in out, out
    assert summary.iterations == 4 and summary.env_steps == 8192 and summary.evaluation.completed == 4
    assert [c[:2] for c in chunks] == [(i, s) for i in range(1, 5) for s in (0, 1)]
    assert [fresh for i, _, fresh in chunks if i <= 2] == [True, True, False, False]
    assert any(fresh for i, _, fresh in chunks if i == 3)  # the chunk collected again after the loss


class ElasticLossThenServerLoss:
    """A phase hook: after iteration 1 (three shards: two started, one added) shard 1 is lost with no room for a
    replacement, so the shard added as 2 moves down to position 1; after iteration 2 policy server 0 dies, the server
    of shards 0 and 2 (``servers.count`` 2)."""

    def __init__(self, room: list[int]):
        self.room, self.fired = room, []

    def __call__(self, phase: str, iteration: int, session: Session) -> None:
        if (phase, iteration) == ("collect", 1):
            self.room[0] = 0
            session.backend.kill(session.roles.shards[1])
            self.fired.append("shard")
        elif (phase, iteration) == ("collect", 2):
            session.backend.kill(session.roles.servers.handles[0])
            self.fired.append("server")


@pytest.mark.slow
def test_after_an_elastic_removal_a_dead_servers_shards_are_found_by_identity_and_the_run_goes_on(
    ray_session, tmp_path, capsys, monkeypatch
):
    """The shard added as 2, now at position 1, asks server 0: it is pointed to server 0's replacement (and its
    weights loaded there), not left calling the dead one while each recovery finds no server dead."""
    room = [1]  # the cluster's room for one more shard, as the autoscaler sees it
    monkeypatch.setattr(RayBackend, "room_for", lambda backend, request: room[0])
    found, recover = [], Servers.recover

    def recovering(servers: Servers, shards, why: str) -> bool:
        found.append(recover(servers, shards, why))
        assert found[-3:] != [False] * 3, "recoveries find no dead server: a shard keeps calling a dead one"
        return found[-1]

    monkeypatch.setattr(Servers, "recover", recovering)
    elastic = ["shards.max=3", "servers.count=2", "servers.num_cpus=0.5", "eval.every=0", "eval.episodes=0"]
    with faults.registered(hook := ElasticLossThenServerLoss(room)):
        summary = train(tmp_path / "run", [*SERVED_ON_RAY, *elastic, "train.total_steps=1024"])
    out = capsys.readouterr().out
    assert hook.fired == ["shard", "server"] and found[0] is True, out
    assert "elastic: added 1 shard(s)" in out and "continuing with 2 shards" in out
    assert "raysim: fault: policy server 0 died" in out and "policy server 1 died" not in out
    assert summary.iterations == 4 and summary.env_steps == 3 * 128 + 3 * 2 * 128


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (["shards.placement=nowhere"], "shards.placement must be one of ['collocated', 'servers'], got 'nowhere'"),
        (["shards.placement=servers", "servers.count=0"], "servers.count must be >= 1, got 0"),
    ],
    ids=["placement", "count"],
)
def test_a_bad_placement_or_server_count_is_one_line_naming_the_key(tmp_path, capsys, monkeypatch, settings, expected):
    monkeypatch.chdir(tmp_path)
    assert main(["train", *[a for s in settings for a in ("--set", s)]]) == 2
    out, err = capsys.readouterr()
    assert [line for line in err.splitlines() if line.strip()] == [err.strip()] and expected in err, err
    assert not out.strip() and not any(tmp_path.iterdir())  # nothing written


# -- pipelining: a worker's rows in groups acting at once (servers.pipeline) ------------------------------------------


@pytest.mark.parametrize("policy", ["gaussian-obs-norm", "lstm", "camera-keypoints"])
def test_a_pipelined_workers_chunk_joins_the_chunks_its_groups_collect_alone(policy):
    """Each group is a shard of its own seed (the worker's and the group's), served as it would be alone; the
    worker's chunk is theirs joined along the rows, the finished rows and episodes renumbered."""
    (env_id, env_kwargs), model = POLICIES[policy]
    model = ModelConfig(**model)
    made = dict(env_kwargs=env_kwargs, model=model)
    probe = EnvShard(env_id, 1, **made)
    server = PolicyServer(*probe.spaces()[:2], model)
    weights = {"version": 2, "timeline": "a", "actor": trained_looking(Actor(*probe.spaces()[:2], model), 5)}
    key = server.load(weights)
    pipelined = PipelinedShard(env_id, 6, groups=2, seed=7, **made, server=server.act)
    alone = [EnvShard(env_id, 3, seed=derive_seed(7, PIPELINE_GROUP, g), **made, server=server.act) for g in (0, 1)]
    finished = set()
    for _ in range(3):
        chunk, receipt, state = pipelined.collect(key, FixedSteps(12))
        assert_same_chunk(chunk, concat_rows([shard.rollout(key, 12) for shard in alone]))
        assert chunk.num_envs == 6 and receipt["env_steps"] == 72 and len(state["groups"]) == 2
        finished |= set(chunk.final_row.tolist())
    assert finished & {3, 4, 5}  # the second group's finished rows, renumbered


def test_a_pipelined_workers_chunk_keeps_the_episode_columns_whichever_group_ended_its_episodes():
    """Group 1 starts fresh episodes after the first chunk: in the second chunk only group 0 ends one, in the third
    only group 1. Each time the worker's chunk holds those episodes with every column the env reports, as an
    unpipelined chunk does, so the learner takes the success rate."""
    (env_id, _), model = POLICIES["gaussian-obs-norm"]
    model = ModelConfig(**model)
    made = dict(env_kwargs={"max_episode_steps": 4}, model=model)
    probe = EnvShard(env_id, 1, **made)
    server = PolicyServer(*probe.spaces()[:2], model)
    key = server.load({"version": 1, "timeline": "a", "actor": Actor(*probe.spaces()[:2], model).state_dict()})
    pipelined = PipelinedShard(env_id, 4, groups=2, seed=3, **made, server=server.act)
    alone = [EnvShard(env_id, 2, seed=derive_seed(3, PIPELINE_GROUP, g), **made, server=server.act) for g in (0, 1)]
    pipelined.collect(key, FixedSteps(2))
    for shard in alone:
        shard.rollout(key, 2)
    pipelined.groups[1].start_fresh(9)
    alone[1].start_fresh(9)
    for ended in (0, 1):
        chunk, _, _ = pipelined.collect(key, FixedSteps(2))
        groups = [shard.rollout(key, 2) for shard in alone]
        assert [g.episodes["row"].numel() > 0 for g in groups] == [ended == 0, ended == 1]
        expected = {**groups[ended].episodes, "row": groups[ended].episodes["row"] + 2 * ended}
        assert chunk.episodes.keys() == expected.keys() >= {"success", "failure", "return", "row", "t"}
        assert all(torch.equal(chunk.episodes[k], expected[k]) for k in expected)
        sums = episode_sums([chunk])
        del sums["extremes"]
        assert "success_rate" in episode_stats({k: float(v) for k, v in sums.items()})  # every episode reported it


def test_a_server_lost_by_one_group_drops_every_groups_collection_and_they_start_fresh_episodes():
    (env_id, env_kwargs), model = POLICIES["gaussian-obs-norm"]
    model = ModelConfig(**model)
    probe = EnvShard(env_id, 1, env_kwargs=env_kwargs, model=model)
    server = PolicyServer(*probe.spaces()[:2], model)
    key = server.load({"version": 1, "timeline": "a", "actor": Actor(*probe.spaces()[:2], model).state_dict()})
    calls = []

    def dies_once(request: ActRequest) -> ActReply:
        calls.append(request.rows)
        if len(calls) == 15:  # mid-collection
            raise ServerLost("the server died")
        return server.act(request)

    pipelined = PipelinedShard(env_id, 4, groups=2, seed=1, env_kwargs=env_kwargs, model=model, server=dies_once)
    with pytest.raises(ServerLost):
        pipelined.collect(key, FixedSteps(10))
    assert [group.steps_done for group in pipelined.groups] == [0, 0]  # the collection goes back, whole
    chunk, _, _ = pipelined.collect(key, FixedSteps(10))
    assert chunk.fresh and chunk.num_steps == 10 and [group.steps_done for group in pipelined.groups] == [10, 10]


def test_a_pipelined_run_trains_and_resumes_exactly(tmp_path):
    pipelined = [*TINY, "backend=local", "shards.placement=servers", "servers.pipeline=2", "train.total_steps=1536"]
    straight = train(tmp_path / "straight", pipelined)
    train(tmp_path / "stopped", [*pipelined, "train.stop_after=3"])
    resumed = Trainer.from_run_dir(tmp_path / "stopped").train()
    assert straight.iterations == resumed.iterations == 12
    assert_same_run(straight, resumed)


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (["env.num_envs=5", "servers.pipeline=2"], "servers.pipeline (2) must divide env.num_envs (5)"),
        (["cartpole_grpo", "servers.pipeline=2"], "servers.pipeline (2) needs chunks of fixed steps (PPO, distill)"),
    ],
    ids=["rows", "grpo"],
)
def test_a_pipeline_that_cannot_work_is_refused_naming_the_keys(tmp_path, capsys, settings, expected):
    name = settings[0] if "=" not in settings[0] else None
    sets = [item for s in ["shards.placement=servers", *settings[bool(name) :]] for item in ("--set", s)]
    assert main(["train", *([name] if name else []), "--local", "--run-dir", str(tmp_path / "run"), *sets]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err
    assert not (tmp_path / "run").exists()


def test_an_elastic_run_asks_the_autoscaler_for_its_servers_beside_its_shards(tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(LocalBackend, "request_capacity", lambda self, requests: asked.append(requests))
    elastic = [*TINY, "backend=local", "shards.placement=servers", "shards.max=3", "servers.num_gpus=0.5"]
    train(tmp_path / "run", [*elastic, "train.total_steps=256"])
    assert asked == [[({"CPU": 1.0}, 3), ({"CPU": 1.0, "GPU": 0.5}, 1)]]


def test_raysim_eval_of_a_run_with_policy_servers_plays_on_a_server_the_collocated_episodes(tmp_path, monkeypatch):
    made = []
    evaluating = sys.modules["raysim.coordinator.evaluate"]  # the module (the package exports a function of its name)
    monkeypatch.setattr(evaluating, "Servers", lambda *args: made.append(Servers(*args)) or made[-1])
    runs = {
        placement: train(tmp_path / placement, [*TINY, "backend=local", f"shards.placement={placement}"])
        for placement in ("servers", "collocated")
    }
    for placement, run in runs.items():
        assert (
            main(["eval", run.run_dir, "--local", "--episodes", "6", "--out", str(tmp_path / f"{placement}.parquet")])
            == 0
        )
    served, collocated = (pq.read_table(tmp_path / f"{p}.parquet").to_pylist() for p in runs)
    assert len(made) == 1 and len(served) == 6 and served == collocated  # one server, for the servers run's eval
