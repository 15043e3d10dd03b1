"""Metrics: one reduction and one host copy per log step, the same record for every sink, the sinks."""

from __future__ import annotations

import io
import math
import os
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

import raysim
import raysim.learner.learner
from raysim.config import ConfigError
from raysim.coordinator.trainer import RunFailed
from raysim.metrics import ConsoleSink, ParquetSink, SinkSet, TensorBoardSink
from raysim.records import metric_parts, read_metrics
from raysim.rollout.shard import EnvShard
from raysim.storage import open_storage

# 1 shard x 4 rows x 32 steps = 128 env steps per iteration: 6 iterations
TINY = [
    "backend=local",
    "env.num_envs=4",
    "algo.num_steps=32",
    "algo.num_minibatches=2",
    "algo.update_epochs=1",
    "train.total_steps=768",
    "eval.episodes=2",
    "eval.num_envs=2",
]
CONTROL = ("\r", "\x1b", "\b")


class Recorder:
    def __init__(self, name: str):
        self.name, self.records, self.closed = name, [], False

    def write(self, record):
        self.records.append(record)

    def close(self):
        self.closed = True


class Broken:
    name = "broken"

    def write(self, record):
        raise OSError("disk full")

    def close(self):
        pass


class TTY(io.StringIO):
    def isatty(self):
        return True


def train(tmp_path: Path, *overrides: str, sinks=None, name: str = "run") -> raysim.Summary:
    config = raysim.load_config(None, [*TINY, *overrides, f"run_dir={tmp_path / name}"])
    return raysim.Trainer(config, sinks=sinks).train()


def count_host_copies(monkeypatch) -> list:
    calls = []
    real = raysim.learner.learner.to_host

    def counting(vector):
        calls.append(vector.numel())
        return real(vector)

    monkeypatch.setattr(raysim.learner.learner, "to_host", counting)
    return calls


def test_every_sink_gets_the_same_record_and_the_host_copy_happens_once_per_log_step(tmp_path, monkeypatch):
    copies = count_host_copies(monkeypatch)
    sinks = [Recorder("a"), Recorder("b"), Recorder("c")]
    summary = train(tmp_path, "train.log_every=2", "eval.every=3", "checkpoint.every=2", sinks=sinks)
    assert summary.iterations == 6
    assert len(copies) == 3  # log steps 2, 4, 6: one copy each, not one per iteration or per sink
    records = sinks[0].records
    assert [r["iteration"] for r in records] == [2, 4, 6]
    assert all(s.records == records and s.closed for s in sinks)
    assert all(isinstance(v, (int, float)) for r in records for v in r.values())
    for record in records:
        for key in (
            "episode_return",
            "episode_length",
            "episodes",
            "pg_loss",
            "v_loss",
            "entropy",
            "lr",
            "time_collect",
            "time_update",
            "time_eval",
            "time_checkpoint",
            "steps_per_s",
            "env_steps",
        ):
            assert key in record and math.isfinite(record[key]), key
        assert record["episode_return_min"] <= record["episode_return"] <= record["episode_return_max"]
        assert record["time_collect"] > 0 and record["time_update"] > 0
    assert records[1]["time_eval"] > 0 and "eval_return" in records[1]  # evaluation at iteration 3
    assert records[0]["time_eval"] == 0
    assert records[1]["time_checkpoint"] > 0  # the checkpoint of iteration 2, in the next window
    assert summary.metrics == records[-1]

    copies.clear()
    one = Recorder("one")
    train(tmp_path, "train.log_every=2", sinks=[one], name="one-sink")
    assert len(copies) == 3 and len(one.records) == 3  # whatever the number of sinks


def test_a_window_of_iterations_is_reduced_once_with_its_episodes_summed():
    from raysim.algos.ppo import PPOConfig
    from raysim.learner import Learner
    from raysim.models.networks import ModelConfig

    shard = EnvShard("raysim/CartPole", 4, seed=0)
    learner = Learner(
        *shard.spaces()[:2], ModelConfig(), PPOConfig(num_steps=64, num_minibatches=2, update_epochs=1), 10
    )
    chunks = [shard.rollout(learner.get_weights(), 64) for _ in range(2)]
    quiet = learner.update(chunks[0], log=False)
    assert set(quiet) == {"env_steps", "stale_steps", "policy_version", "skipped_updates", "lr"}  # no device copy
    logged = learner.update(chunks[1])
    returns = torch.cat([c.episodes["return"].float() for c in chunks])
    assert logged["episodes"] == returns.numel() and logged["env_steps"] == 256
    assert logged["episode_return"] == pytest.approx(returns.mean().item())
    assert logged["episode_return_min"] == returns.min().item() and logged["episode_return_max"] == returns.max().item()
    assert learner.metrics()["episodes"] == 0  # the window was reset


def test_two_learner_ranks_log_the_mean_over_both_ranks_data(ray_session):
    from raysim.actors import RayBackend
    from raysim.algos.ppo import PPOConfig
    from raysim.learner import LearnerGroup
    from raysim.models.networks import ModelConfig

    shards = [EnvShard("raysim/CartPole", 4, seed=s) for s in (0, 1)]
    algo = PPOConfig(num_steps=64, num_minibatches=2, update_epochs=1)
    observation_spaces, action_space, _ = shards[0].spaces()
    group = LearnerGroup(
        RayBackend(),
        2,
        options={"num_cpus": 1},
        observation_spaces=observation_spaces,
        action_space=action_space,
        model=ModelConfig(),
        algo=algo,
        horizon=10,
        seed=0,
    )
    weights = ray_session.get(group.get_weights())
    rounds = []
    for _ in range(2):  # two iterations in one log window
        chunks = [shard.rollout(weights, 64) for shard in shards]
        chunks[1].episodes["return"] = chunks[1].episodes["return"] + 1000.0  # rank 1's episodes stand out
        rounds.append(chunks)
        result = group.update([[ray_session.put(c)] for c in chunks], log=False)
        assert result["env_steps"] == 2 * 4 * 64 and "episode_return" not in result
    metrics = group.metrics()
    returns = torch.cat([c.episodes["return"].double() for chunks in rounds for c in chunks])
    rank0 = torch.cat([chunks[0].episodes["return"].double() for chunks in rounds])
    assert metrics["episodes"] == returns.numel()
    assert metrics["episode_return"] == pytest.approx(returns.mean().item(), rel=1e-6)
    assert abs(metrics["episode_return"] - rank0.mean().item()) > 100  # not rank 0's mean
    assert metrics["episode_return_min"] == rank0.min().item()
    assert metrics["episode_return_max"] == returns.max().item()
    assert math.isfinite(metrics["pg_loss"]) and math.isfinite(metrics["v_loss"])


def test_a_resumed_run_continues_the_same_parquet_file_with_the_same_schema(tmp_path):
    common = ("train.log_every=1", "eval.every=2")
    first = train(tmp_path, *common, "train.stop_after=4", "train.sinks=[parquet]", name="resumed")
    assert first.interrupted
    storage = open_storage(tmp_path / "resumed")
    parts = metric_parts(storage)
    assert len(parts) == 1  # merged into one file at the end of the process
    schema = pq.read_schema(storage.path(parts[0][1]))
    assert [r["iteration"] for r in read_metrics(storage)] == [1, 2, 3, 4]
    raysim.Trainer.from_run_dir(tmp_path / "resumed").train()
    assert [r["iteration"] for r in read_metrics(storage)] == [1, 2, 3, 4, 5, 6]
    assert pq.read_schema(storage.path(metric_parts(storage)[0][1])) == schema
    assert all(field.type == pa.float64() for field in schema)
    train(tmp_path, *common, "train.sinks=[parquet]", name="straight")
    straight = open_storage(tmp_path / "straight")
    assert pq.read_schema(straight.path(metric_parts(straight)[0][1])) == schema
    assert not (tmp_path / "resumed" / "tb").exists()  # only the sinks the config lists


def test_parquet_columns_that_appear_later_are_null_before_and_a_failed_write_is_retried(tmp_path, monkeypatch):
    storage = open_storage(tmp_path)
    sink = ParquetSink(storage, flush_seconds=0)  # a part at every write
    sink.write({"iteration": 1, "env_steps": 10, "b": 0.5})
    sink.write({"iteration": 2, "env_steps": 20, "b": 0.25, "a": 3})
    assert len(metric_parts(storage)) == 2  # a new part each flush: no growing file rewritten
    sink.close()
    (part,) = metric_parts(storage)  # merged at the end
    table = pq.read_table(storage.path(part[1]))
    assert table.column_names == ["a", "b", "env_steps", "iteration"]
    assert table.to_pylist()[0] == {"a": None, "b": 0.5, "env_steps": 10.0, "iteration": 1.0}

    sink = ParquetSink(storage, flush_seconds=0)
    real = storage.write
    monkeypatch.setattr(storage, "write", lambda rel, data: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError):
        sink.write({"iteration": 3, "env_steps": 30, "b": 0.0})
    monkeypatch.setattr(storage, "write", real)
    sink.close()  # retries the failed write: nothing lost
    assert [r["iteration"] for r in read_metrics(storage)] == [1, 2, 3]
    ParquetSink(storage, keep_until=2).close()  # a resume from iteration 2 drops the rows after it
    assert [r["iteration"] for r in read_metrics(storage)] == [1, 2]


def test_a_merge_cut_before_it_removed_the_parts_it_replaces_reads_every_row_once(tmp_path, monkeypatch):
    storage = open_storage(tmp_path)
    sink = ParquetSink(storage, flush_seconds=0)
    for i in (1, 2, 3):
        sink.write({"iteration": i, "env_steps": 10 * i})
    monkeypatch.setattr(storage, "remove", lambda rel: None)  # the process is killed once the merged part is written
    sink.close()
    assert len(metric_parts(storage)) == 4  # three parts and the merge of them
    assert [r["iteration"] for r in read_metrics(storage)] == [1, 2, 3]
    monkeypatch.undo()
    sink = ParquetSink(storage, flush_seconds=0)  # a resumed run appends after the merged part, then merges again
    sink.write({"iteration": 4, "env_steps": 40})
    assert [r["iteration"] for r in read_metrics(storage)] == [1, 2, 3, 4]
    sink.close()
    assert len(metric_parts(storage)) == 1
    assert [r["iteration"] for r in read_metrics(storage)] == [1, 2, 3, 4]


def test_console_output_is_plain_lines_off_a_terminal_and_an_in_place_bar_on_one(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the bar is cut to the terminal's width: this test's, whatever runs it
    records = [
        {
            "iteration": i,
            "env_steps": 100 * i,
            "steps_per_s": 1234.5,
            "episode_return": 20.0 + i,
            "pg_loss": -0.01,
            "v_loss": 3.0,
        }
        for i in (1, 2, 3)
    ]
    plain = io.StringIO()
    sink = ConsoleSink(300, plain)
    for record in records:
        sink.write(record)
    sink.close()
    lines = plain.getvalue().splitlines()
    assert len(lines) == 3 and "100.0%" in lines[-1] and "episode_return 23" in lines[-1]
    assert not any(c in plain.getvalue() for c in CONTROL)

    tty = TTY()
    sink = ConsoleSink(300, tty)
    assert sink.live
    for record in records:
        sink.write(record)
    drawn = tty.getvalue()
    assert drawn.count("\r") == 3 and "\n" not in drawn  # redrawn in place
    assert drawn.rsplit("\r", 1)[1].startswith("\x1b[K[########################] 100.0%")
    assert "1,234 steps/s" in drawn and "return 23" in drawn and "pg_loss -0.01" in drawn
    sink.close()
    assert tty.getvalue().endswith("\n")


def test_a_real_run_prints_plain_lines_when_not_on_a_terminal_and_writes_tensorboard(tmp_path, capsys):
    train(tmp_path, "train.log_every=2")
    out = capsys.readouterr().out
    assert out.count("iter ") == 3 and not any(c in out for c in CONTROL)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "run" / "tb"))
    events.Reload()
    steps = [e.step for e in events.Scalars("train/episode_return")]
    assert steps == [256, 512, 768]
    rows = read_metrics(open_storage(tmp_path / "run"))
    returns = [e.value for e in events.Scalars("train/episode_return")]
    assert returns == pytest.approx([r["episode_return"] for r in rows])
    assert "loss/pg_loss" in events.Tags()["scalars"] and "time/time_update" in events.Tags()["scalars"]


def test_a_failing_sink_is_reported_once_and_the_others_get_every_record(tmp_path, capsys):
    good, other = Recorder("good"), Recorder("other")
    summary = train(tmp_path, "train.log_every=1", sinks=[good, Broken(), other])
    err = capsys.readouterr().err
    assert err.count("metrics sink 'broken' failed") == 1 and "OSError: disk full" in err
    assert [r["iteration"] for r in good.records] == list(range(1, summary.iterations + 1))
    assert other.records == good.records

    errors = io.StringIO()
    sinks = SinkSet([Broken(), Recorder("kept")], errors=errors)
    for i in range(4):
        sinks.write({"iteration": i})
    assert errors.getvalue().count("broken") == 1 and sinks.failures == {"broken": 4}
    assert len(sinks.sinks[1][1].records) == 4


class FailsFrom:
    """A sink named ``name`` whose writes fail from the record of ``iteration`` on, until ``recovers`` (if given)."""

    def __init__(self, name: str, iteration: int, recovers: int | None = None):
        self.name, self.iteration, self.recovers = name, iteration, recovers

    def write(self, record):
        if record["iteration"] >= self.iteration and (self.recovers is None or record["iteration"] < self.recovers):
            raise OSError(f"{self.name} cannot write")

    def close(self):
        pass


def test_a_sink_failure_line_names_only_the_sinks_that_still_work():
    errors = io.StringIO()
    sinks = SinkSet([Recorder("console"), FailsFrom("tensorboard", 1, recovers=4), FailsFrom("parquet", 2)], errors)
    for i in range(1, 4):
        sinks.write({"iteration": i})
    first, second = errors.getvalue().splitlines()
    assert first.endswith("every record still goes to console, parquet (reported once)"), first
    assert second.endswith("every record still goes to console (reported once)"), second  # not tensorboard
    sinks.write({"iteration": 4})  # tensorboard writes again
    sinks.failed("console", "write", OSError("closed"))
    assert errors.getvalue().splitlines()[-1].endswith("still goes to tensorboard (reported once)")


def test_all_three_sinks_are_the_default_and_unknown_sinks_are_refused():
    assert raysim.load_config(None).train.sinks == ["console", "parquet", "tensorboard"]
    valid = r"\['console', 'parquet', 'tensorboard', 'wandb'\]"
    with pytest.raises(ConfigError, match=rf"train.sinks must be one of {valid}"):
        raysim.load_config(None, ["train.sinks=[console, mlflow]"])


class FillDisk:
    """A sink that fills the disk at ``path`` to the last byte once the log step of ``iteration`` is written."""

    name = "fill"

    def __init__(self, path: Path, iteration: int):
        self.path, self.iteration = path, iteration

    def write(self, record):
        if record["iteration"] == self.iteration:
            stat = os.statvfs(self.path)
            with open(self.path / "filler", "wb", buffering=0) as filler:
                try:
                    filler.write(b"\0" * (stat.f_bavail * stat.f_frsize))
                    filler.write(b"\0" * 65536)
                except OSError:  # full
                    pass

    def close(self):
        pass


def uncaught_thread_failures(monkeypatch) -> list[BaseException]:
    """What reaches Python's hook for a thread's uncaught exception (its default prints the traceback)."""
    seen: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    return seen


def test_a_tensorboard_writer_thread_that_fails_on_a_full_disk_is_one_line_not_a_traceback(
    small_disk, capfd, monkeypatch
):
    uncaught = uncaught_thread_failures(monkeypatch)
    sinks = SinkSet([TensorBoardSink(open_storage(small_disk / "run")), FillDisk(small_disk, 1)])
    for i in range(1, 30):  # the writer's thread fails on the first write to the full disk
        sinks.write({"iteration": i, "env_steps": i, **{f"metric_{k}": float(k) for k in range(40)}})
    sinks.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err, err
    assert [line for line in err.splitlines() if line.strip()] == [err.strip()], err  # one line
    assert "metrics sink 'tensorboard' failed" in err and f"No space left on device: '{small_disk}/run/tb" in err
    assert sinks.failures["tensorboard"] >= 1 and not uncaught, uncaught


def test_a_run_that_fills_its_disk_says_so_in_raysims_own_words_without_a_traceback(small_disk, capfd, monkeypatch):
    uncaught = uncaught_thread_failures(monkeypatch)
    run_dir = small_disk / "run"
    config = raysim.load_config(None, [*TINY, "eval.episodes=0", "train.log_every=1", f"run_dir={run_dir}"])
    sinks = [TensorBoardSink(open_storage(small_disk / "tb")), FillDisk(small_disk, 3)]
    with pytest.raises(RunFailed, match="No space left on device"):
        raysim.Trainer(config, sinks=sinks).train()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in thread" not in err, err
    assert err.count("metrics sink 'tensorboard' failed") == 1 and not uncaught, (err, uncaught)


def test_merging_the_parts_removes_a_part_a_killed_writer_left_unfinished(tmp_path):
    storage = open_storage(tmp_path)
    sink = ParquetSink(storage)
    sink.write({"iteration": 1.0})
    sink.flush()
    (tmp_path / "metrics" / ".part-000001.parquet.tmp-99999").write_bytes(b"half a part")  # killed before its rename
    sink.write({"iteration": 2.0})
    sink.close()
    assert os.listdir(tmp_path / "metrics") == [metric_parts(storage)[0][1].split("/")[1]]
    assert [r["iteration"] for r in read_metrics(storage)] == [1.0, 2.0]
