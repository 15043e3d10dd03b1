"""The live timeline: a run continued from a checkpoint (a resume past damage, a learner restarted from a
checkpoint, a PBT exploit) retires the checkpoints newer than it before it saves again, so pruning only ever
sees the live timeline and a run always ends with an intact checkpoint of itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import raysim
from raysim.checkpoint import Checkpoints, copy_files
from raysim.cli import main
from raysim.config import to_dict
from raysim.coordinator import Trainer
from raysim.metrics import ParquetSink
from raysim.storage import LocalStorage, open_storage
from tests.support.crashing import lost_object

# 1 shard x 4 rows x 32 steps = 128 env steps per iteration; 16 iterations planned
TINY = [
    "backend=local",
    "env.num_envs=4",
    "algo.num_steps=32",
    "algo.num_minibatches=2",
    "algo.update_epochs=1",
    "train.total_steps=2048",
    "train.log_every=1",
    "eval.every=0",
    "eval.episodes=2",
    "eval.num_envs=2",
    "train.sinks=[parquet]",
]


def names(run_dir: Path) -> list[str]:
    return [c.name for c in Checkpoints(LocalStorage(run_dir)).list()]


def abandoned(run_dir: Path) -> list[str]:
    """The checkpoints moved aside, by their old names (``<time>-<name>``)."""
    folder = run_dir / "checkpoints" / "abandoned"
    return sorted(p.name.rpartition("-")[2] for p in folder.iterdir()) if folder.is_dir() else []


def damage(path: Path) -> None:
    with open(path, "r+b") as handle:
        handle.seek(path.stat().st_size // 2)
        handle.write(b"\x41" * 512)


def run_with_damaged_newest(run_dir: Path) -> None:
    """A run with checkpoints 4 and 8, 8 damaged."""
    config = raysim.load_config(None, [*TINY, "checkpoint.every=4", "train.stop_after=8", f"run_dir={run_dir}"])
    Trainer(config).train()
    assert names(run_dir) == ["4", "8"]
    damage(run_dir / "checkpoints" / "8" / "state.pt")


def test_a_resume_past_a_damaged_checkpoint_with_keep_last_1_ends_with_an_intact_checkpoint_of_itself(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_with_damaged_newest(run_dir)
    sets = ["checkpoint.every=1", "checkpoint.keep_last=1", "train.stop_after=2"]
    assert main(["resume", str(run_dir), "--local", *[a for s in sets for a in ("--set", s)]]) == 0
    out = capsys.readouterr().out
    assert main(["eval", str(run_dir), "--episodes", "2", "--local"]) == 0
    assert "completed c / n        2/2" in (evaluated := capsys.readouterr().out) and "damaged" not in evaluated
    assert names(run_dir) == ["6"] and abandoned(run_dir) == ["8"]
    checkpoint, _, meta = Checkpoints(LocalStorage(run_dir)).newest_intact(announce=False)
    assert checkpoint.iteration == 6 and meta["env_steps"] == 6 * 128
    assert "(iteration 4," in out and "abandoned timeline" in out and "checkpoints/abandoned" in out


def test_a_damaged_checkpoint_is_never_what_retention_keeps_whatever_its_score(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_with_damaged_newest(run_dir)
    for name, score in (("4", 10.0), ("8", 500.0)):  # the damaged one holds the best evaluation
        (run_dir / "checkpoints" / name / "score.json").write_text(
            json.dumps({"iteration": int(name), "eval_return": score})
        )
    overrides = ["checkpoint.every=1", "checkpoint.keep_last=1", "train.stop_after=2"]
    Trainer.from_run_dir(run_dir, overrides=overrides).train()
    assert names(run_dir) == ["4", "6"]  # the best scored intact one and the newest


def test_pruning_never_keeps_a_damaged_best_scored_checkpoint_over_an_intact_one(tmp_path):
    checkpoints = Checkpoints(LocalStorage(tmp_path))
    for iteration, score in ((18, 10.0), (20, 500.0)):
        checkpoints.record_score(checkpoints.save(iteration, {"w": torch.ones(64) * iteration}, {}), score)
    damage(tmp_path / "checkpoints" / "20" / "state.pt")
    checkpoints.save(21, {"w": torch.ones(64)}, {})
    checkpoints.prune(keep_last=1)
    assert [c.name for c in checkpoints.list()] == ["18", "21"]


def test_retiring_moves_aside_under_unique_names_so_iteration_numbers_can_come_round_again(tmp_path, capsys):
    checkpoints = Checkpoints(LocalStorage(tmp_path))
    checkpoints.save(3, {"w": torch.full((4,), 3.0)}, {})
    for _ in range(2):
        for iteration in (5, 7):
            checkpoints.save(iteration, {"w": torch.full((4,), float(iteration))}, {})
        retired = checkpoints.retire_after(3)
        assert [c.name for c in retired] == ["7", "5"] and names(tmp_path) == ["3"]
    assert abandoned(tmp_path) == ["5", "5", "7", "7"]
    assert "checkpoints 5, 7 are newer than iteration 3" in capsys.readouterr().out


class KillLearnerAt:
    """A sink that, after the log step of ``iteration``, damages the newest checkpoint, kills the learner and
    loses its last completed state (as with its node): it restarts from the newest intact checkpoint. It
    records the checkpoints at every log step after that."""

    def __init__(self, trainer: Trainer, iteration: int):
        self.trainer, self.iteration, self.seen = trainer, iteration, []

    def write(self, record: dict) -> None:
        import ray

        run_dir = Path(self.trainer.run_dir)
        if self.seen or record["iteration"] == self.iteration:
            self.seen.append((int(record["iteration"]), names(run_dir)))
        if len(self.seen) == 1:
            damage(run_dir / "checkpoints" / "4" / "state.pt")
            ray.kill(self.trainer.session.roles.learner.handles[0].actor)
            self.trainer.session.roles.learner.snapshots = [ray.remote(lost_object).remote()]

    def close(self) -> None:
        self.trainer = None


@pytest.mark.slow
def test_a_learner_restarted_from_an_older_checkpoint_retires_the_newer_ones_before_it_goes_on(
    ray_session, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    overrides = [*TINY, "backend=ray", "train.total_steps=768", "checkpoint.every=2", "eval.episodes=0"]
    trainer = Trainer(raysim.load_config(None, [*overrides, f"run_dir={run_dir}"]))
    sink = KillLearnerAt(trainer, 5)
    trainer.sinks = [sink, ParquetSink(open_storage(run_dir))]
    summary = trainer.train()
    assert "restarted it from checkpoint" in capsys.readouterr().out
    assert sink.seen[:2] == [(5, ["2", "4"]), (3, ["2"])]  # retired when the learner restarted from 2
    assert abandoned(run_dir) == ["4"] and summary.iterations == 6
    assert Checkpoints(LocalStorage(run_dir)).newest_intact(announce=False)[0].iteration == 6


@pytest.fixture
def trial_runner(tmp_path):
    """Tune's trial path without Tune: ``run(trial_id, handed, **values)`` runs the trial's run as ``SweepTrial`` would,
    continuing from ``handed`` (a checkpoint directory Tune hands back, or None); it reports nothing."""
    from raysim.sweep.trial import TrialRun

    base = to_dict(raysim.load_config(None, [*TINY, "checkpoint.keep_last=2"]))

    def run(trial_id: str, handed: Path | None = None, **values) -> Path:
        trial = TrialRun(values, trial_id, base=base, experiment=str(tmp_path / "experiment"), metric="never_reported")
        if handed is not None:
            trial.continue_from(handed)
        trial.train(lambda record, checkpoint: False)
        return tmp_path / "experiment" / "trials" / trial_id

    return run


def newest_copy(run_dir: Path, folder: Path) -> Path:
    """The newest checkpoint of a trial, as Tune holds it (a self-contained copy)."""
    return copy_files(LocalStorage(run_dir), Checkpoints(LocalStorage(run_dir)).list()[-1], folder)


@pytest.mark.parametrize("own_until", [8, 2])  # the trial ahead of the donor's iteration 4, and behind it
def test_a_pbt_exploit_makes_the_donors_checkpoint_the_head_of_the_trials_timeline(tmp_path, trial_runner, own_until):
    donor = trial_runner("donor", seed=5, **{"train.stop_after": 4})
    own = trial_runner("trial", **{"train.stop_after": own_until})
    before = names(own)
    (own / "checkpoints" / before[0] / "score.json").write_text(json.dumps({"eval_return": 1e6}))  # its best
    trial_runner("trial", newest_copy(donor, tmp_path / "handed"), **{"train.stop_after": 2})  # the exploit
    assert names(own) == ["5", "6"] and abandoned(own) == before  # its own checkpoints: another timeline
    checkpoint, _, meta = Checkpoints(LocalStorage(own)).newest_intact(announce=False)
    assert checkpoint.iteration == 6 and meta["env_steps"] == 6 * 128


def test_a_trial_handed_back_its_own_newest_checkpoint_continues_its_own_timeline(tmp_path, trial_runner, capsys):
    own = trial_runner("trial", **{"train.stop_after": 4})
    trial_runner("trial", newest_copy(own, tmp_path / "handed"), **{"train.stop_after": 2})  # a Tune retry
    assert names(own) == ["5", "6"] and abandoned(own) == []
    assert "abandoned timeline" not in capsys.readouterr().out
