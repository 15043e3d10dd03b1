"""Videos of evaluations: ``raysim eval RUN --video FILE`` and ``eval.video`` film every step of the counted
episodes, one grid of the evaluation's rows per frame, blank tiles for rows done with their quota, at most
``--video-frames`` frames; the records are those of an evaluation without a video."""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from raysim.actors import LocalBackend, RayBackend
from raysim.cli import main
from raysim.envs import make
from raysim.envs.errors import CannotRender, MissingDependencyError
from raysim.envs.registry import registered
from raysim.evaluation import EvalSpec, evaluate_on_shards
from raysim.models.networks import ActorCritic, ModelConfig
from raysim.recording import Film
from raysim.rollout import EnvShard
from raysim.video import VideoWriter
from tests.support import painted

TINY = ["--local", "--set", "algo.num_steps=8", "--set", "eval.episodes=0", "--set", "train.log_every=1"]


def train(run_dir: Path, config: str | None, *overrides: str) -> Path:
    settings = [arg for pair in (("--set", o) for o in (*overrides, f"run_dir={run_dir}")) for arg in pair]
    assert main(["train", *([config] if config else []), *TINY, *settings]) == 0
    return run_dir


@pytest.fixture(scope="module")
def camera_run(tmp_path_factory) -> Path:
    """A camera-Reach run of two tiny iterations (an untrained arm: episodes of 100 steps, or fewer)."""
    run = tmp_path_factory.mktemp("camera") / "run"
    return train(run, "reach_camera_ppo", "env.num_envs=4", "train.total_steps=64")


@pytest.fixture(scope="module")
def painted_run(tmp_path_factory) -> Path:
    """A run on a Gymnasium env that renders ``rgb_array`` pictures telling each step."""
    run = tmp_path_factory.mktemp("painted") / "run"
    return train(run, None, "env.id=gym:RaysimTest/Painted-v0", "env.num_envs=2", "train.total_steps=32")


def frames_implied(records: list[dict]) -> int:
    """Frames of a filmed evaluation under the grid rule: every row's episodes one after the other, one frame per
    step they act on; the video is as long as its longest row."""
    steps = defaultdict(int)
    for record in records:
        steps[record["row"]] += record["length"]
    return max(steps.values())


def evaluate(run: Path, tmp_path: Path, *args: str) -> tuple[int, list[dict]]:
    records = tmp_path / "records.parquet"
    code = main(["eval", str(run), "--local", "--shards", "1", "--out", str(records), *args])
    return code, pq.read_table(records).to_pylist() if code == 0 else []


def test_a_video_of_a_camera_reach_evaluation_holds_every_frame_of_its_counted_episodes(camera_run, tmp_path, capsys):
    video = tmp_path / "out.mp4"
    code, records = evaluate(camera_run, tmp_path, "--episodes", "4", "--envs-per-shard", "2", "--video", str(video))
    assert code == 0
    frames = iio.imread(video, index=None)
    assert len(records) == 4 and frames.shape[0] == frames_implied(records)
    assert frames.shape[1:] == (128, 258, 3)  # two rows of 128 px pictures side by side, 2 px apart
    assert f"video: {video}: {frames.shape[0]} frames" in capsys.readouterr().out
    # a row done with its quota is a blank tile: the row that played the shorter episodes goes black first
    short_row = min((0, 1), key=lambda row: sum(r["length"] for r in records if r["row"] == row))
    done = sum(r["length"] for r in records if r["row"] == short_row)
    if done < frames.shape[0]:
        assert frames[done:, :, 130 * short_row : 130 * short_row + 128].max() < 24
    assert frames[0, :, 130 * short_row : 130 * short_row + 128].mean() > 12  # the arm over its background

    code, plain = evaluate(camera_run, tmp_path, "--episodes", "4", "--envs-per-shard", "2")
    assert code == 0 and plain == records  # filming only looks: the same episodes, the same records


def test_a_gif_of_a_gymnasium_env_shows_each_rows_episodes_step_by_step_then_a_blank_tile(painted_run, tmp_path):
    video = tmp_path / "out.gif"
    code, records = evaluate(painted_run, tmp_path, "--episodes", "5", "--envs-per-shard", "2", "--video", str(video))
    assert code == 0
    frames = iio.imread(video, index=None)[..., :3]
    height, width = painted.PICTURE
    assert frames.shape == (frames_implied(records), height, 2 * width + 2, 3)
    for row in (0, 1):  # row r plays episodes r, r + 2, ... in order; then its tile is blank
        expected = [
            painted.grey(t)
            for r in sorted(records, key=lambda r: r["episode"])
            if r["row"] == row
            for t in range(r["length"])
        ]
        expected += [0] * (frames.shape[0] - len(expected))
        assert frames[:, height // 2, (width + 2) * row + width // 2, 0].tolist() == expected


def test_a_video_is_cut_at_its_frame_cap_and_the_evaluation_still_counts_every_episode(camera_run, tmp_path, capsys):
    video = tmp_path / "out.mp4"
    args = ["--episodes", "4", "--envs-per-shard", "8", "--video", str(video), "--video-frames", "10"]
    code, records = evaluate(camera_run, tmp_path, *args, "--video-size", "32")
    assert code == 0 and len(records) == 4
    assert iio.imread(video, index=None).shape == (10, 66, 66, 3)  # the 4 rows that play, 2 x 2; 4 idle left out
    assert "10 frames (the --video-frames cap: the rest was not filmed)" in capsys.readouterr().out


def test_eval_video_during_training_films_every_evaluation_into_the_run(tmp_path):
    run = train(
        tmp_path / "run",
        "reach_camera_ppo",
        "env.num_envs=4",
        "train.total_steps=64",
        "eval.every=1",
        "eval.episodes=2",
        "eval.num_envs=2",
        "eval.max_steps=30",
        "eval.video=true",
        "eval.video_size=32",
    )
    evaluations = sorted(p.stem for p in (run / "eval").glob("*.parquet"))
    assert evaluations and sorted(p.stem for p in (run / "videos").iterdir()) == evaluations
    for iteration in evaluations:
        frames = iio.imread(run / "videos" / f"{iteration}.mp4", index=None)
        assert frames.shape == (30, 32, 66, 3)  # every episode is cut at eval.max_steps


class KillingWriter(VideoWriter):
    """A writer that kills shard 1 once ``at`` frames are written: mid-evaluation, after parts of it were filmed."""

    def __init__(self, path: Path, kill, at: int):
        super().__init__(path, max_frames=10_000)
        self.kill, self.at = kill, at

    def add(self, frame: np.ndarray) -> bool:
        if self.frames == self.at and self.kill is not None:
            self.kill()
            self.kill = None
        return super().add(frame)


@pytest.mark.slow  # a fault on Ray
def test_an_evaluation_filmed_on_ray_shards_one_of_which_dies_gives_the_frames_and_records_of_a_local_one(
    ray_session, tmp_path
):
    spec = EvalSpec(episodes=12, seed=5, max_steps=100)
    env_id, layout = "raysim/Reach", [3, 3]
    weights = {"version": 1, "actor": ActorCritic(*EnvShard(env_id, 1).spaces()[:2], ModelConfig()).actor.state_dict()}

    def film(backend, make, name: str, kill_at: int | None = None):
        shards = [make(i) for i in range(len(layout))]
        kill = None if kill_at is None else lambda: backend.kill(shards[1])
        writer = KillingWriter(tmp_path / name, kill, kill_at or 0)
        report = evaluate_on_shards(backend, make, shards, layout, weights, spec, film=Film(writer, 24))
        writer.close()
        return report, iio.imread(tmp_path / name, index=None)

    local = LocalBackend()
    expected, expected_frames = film(local, lambda i: local.create(EnvShard, env_id, layout[i], seed=i), "local.gif")
    ray = RayBackend()
    created = []

    def make(i: int):
        created.append(i)
        return ray.create(EnvShard, env_id, layout[i], seed=i, options={"num_cpus": 1})

    report, frames = film(ray, make, "ray.gif", kill_at=40)  # shard 1 filmed 48 steps and plays on: killed
    assert created.count(1) == 2, "shard 1 was not replaced"
    assert report.records == expected.records
    assert frames.shape[0] == frames_implied(expected.records) == expected_frames.shape[0]
    assert np.array_equal(frames, expected_frames)


@pytest.fixture(scope="module")
def blind_run(tmp_path_factory) -> Path:
    """A run on a Gymnasium env that draws nothing."""
    run = tmp_path_factory.mktemp("blind") / "run"
    return train(run, None, "env.id=gym:RaysimTest/Blind-v0", "env.num_envs=2", "train.total_steps=16")


def test_native_tasks_draw_their_rows_for_people_with_the_code_that_draws_reach_cameras_observation():
    reach, camera = make("raysim/Reach", 3, seed=4), make("raysim/ReachCamera", 3, seed=4, camera={"size": 64})
    pictures = reach.frames(64)
    assert pictures.shape == (3, 64, 64, 3) and pictures.dtype == torch.uint8
    assert torch.equal(pictures, camera.reset(4)["camera"].permute(0, 2, 3, 1))  # the same rows, the same scene
    assert camera.frames(128).shape == (3, 128, 128, 3)  # any size, whatever the observation's
    cartpole = make("raysim/CartPole", 2, seed=0)
    upright = cartpole.frames(48)
    cartpole.state[1, 2] = 0.2  # row 1's pole leans
    leaning = cartpole.frames(48)
    assert upright.shape == (2, 48, 48, 3)
    assert torch.equal(leaning[0], upright[0]) and not torch.equal(leaning[1], upright[1])


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("{tmp}", "is a directory"),
        ("{tmp}/out.avi", "unsupported file type '.avi'; write one of ['.gif', '.mp4']"),
        ("{file}/out.mp4", "is a file, not a directory"),
    ],
)
def test_a_video_path_that_cannot_be_written_is_one_line_and_exit_2(camera_run, tmp_path, capsys, target, message):
    (tmp_path / "file").write_text("")
    target = target.format(tmp=tmp_path, file=tmp_path / "file")
    assert main(["eval", str(camera_run), "--local", "--episodes", "1", "--video", target]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.glob("**/*.mp4"))


def test_a_video_of_an_env_that_cannot_draw_is_one_line_and_exit_2(blind_run, tmp_path, capsys):
    video = tmp_path / "out.mp4"
    assert main(["eval", str(blind_run), "--local", "--episodes", "1", "--video", str(video)]) == 2
    err = capsys.readouterr().err
    assert "a video of gym:RaysimTest/Blind-v0 cannot be made" in err
    assert len(err.strip().splitlines()) == 1 and not video.exists()

    blind = ["eval.video=true", "env.id=gym:RaysimTest/Blind-v0"]
    args = ["train", *TINY, *[a for o in blind for a in ("--set", o)], "--set", f"run_dir={tmp_path / 'blind'}"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "a video of gym:RaysimTest/Blind-v0 cannot be made" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "blind").exists()  # said before anything is written


def test_a_video_without_the_video_extra_names_what_to_install(camera_run, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # import imageio_ffmpeg: ImportError
    assert main(["eval", str(camera_run), "--local", "--video", str(tmp_path / "out.mp4")]) == 2
    err = capsys.readouterr().err
    assert 'pip install -e ".[video]"' in err and len(err.strip().splitlines()) == 1


def test_a_resumed_run_retires_the_videos_of_iterations_after_its_checkpoint_with_their_records(tmp_path):
    sets = ["eval.every=1", "eval.episodes=2", "eval.num_envs=2", "eval.video=true", "eval.video_size=16"]
    run = train(tmp_path / "run", None, "env.num_envs=2", "train.total_steps=64", "train.stop_after=2", *sets)
    assert sorted(p.name for p in (run / "videos").iterdir()) == ["1.mp4", "2.mp4"]
    (run / "videos" / "5.mp4").write_bytes(b"an abandoned timeline's video")  # as if iteration 5 had been lost
    assert main(["resume", str(run), "--local"]) == 0  # on to the budget: iteration 4
    assert sorted(p.name for p in (run / "videos").iterdir()) == ["1.mp4", "2.mp4", "3.mp4", "4.mp4"]


def test_the_evaluation_page_names_every_native_task_that_draws_and_none_that_does_not():
    page = " ".join((Path(__file__).resolve().parent.parent / "docs" / "evaluation.md").read_text().split())
    pictures = page[page.index("- **Pictures**") : page.index("- **Streamed**")]
    nothing = pictures[pictures.index("An env that draws nothing") :]
    said_to_draw = set(re.findall(r"`(raysim/\w+)`", pictures[: pictures.index("An env that draws nothing")]))
    drawing = set()
    options = {"raysim/MetaWorld": {"tasks": "reach-v3"}}  # a task with no default
    for env_id in (e for e in registered() if e.startswith("raysim/")):  # the packaged ones, not tests' own
        try:
            make(env_id, 1, seed=0, **options.get(env_id, {})).frames(32)
            drawing.add(env_id)
        except (CannotRender, MissingDependencyError):  # MissingDependencyError: its extra is not installed
            pass
    assert said_to_draw == drawing
    assert not set(re.findall(r"`(raysim/\w+)`", nothing)) & drawing
