"""From a laptop to a cluster: launcher configs that Ray validates, and a real `ray job submit`."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

import raysim
from raysim.config import PACKAGED_CONFIGS
from tests.support.ray_head import RAY, RayHead

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "cluster"


@pytest.mark.parametrize("name", ["aws.yaml", "onprem.yaml"])
def test_the_cluster_launcher_configs_pass_rays_own_validation(name):
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(yaml.safe_load((CLUSTER / name).read_text()))
    validate_config(config)
    assert config["head_node_type"] in config["available_node_types"]


def fits(request: dict, node_types: dict) -> list[str]:
    """The node types whose resources can hold ``request``."""
    return [
        name
        for name, node in node_types.items()
        if all(node.get("resources", {}).get(k, 0) >= v for k, v in request.items() if v)
    ]


def test_the_cluster_run_configs_ask_for_resources_that_the_worker_types_offer():
    node_types = yaml.safe_load((CLUSTER / "aws.yaml").read_text())["available_node_types"]
    onprem = yaml.safe_load((CLUSTER / "onprem.yaml").read_text())["available_node_types"]
    configs = sorted(PACKAGED_CONFIGS.glob("*_cluster.yaml"))
    assert configs
    for file in configs:
        config = raysim.load_config(file)
        shard = {"CPU": config.shards.num_cpus, **config.shards.resources}
        learner = {"CPU": config.learner.num_cpus, "GPU": config.learner.num_gpus, **config.learner.resources}
        assert fits(shard, node_types) == ["shard_cpu"], file
        assert fits(learner, node_types) == ["learner_gpu"], file
        assert fits(shard, onprem) and fits({**learner, "GPU": 0}, onprem), file


def job_state(head: RayHead, job_id: str) -> str:
    """The job's status from the head's jobs REST API ("" while it does not answer)."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{head.dashboard_port}/api/jobs/{job_id}",
        headers={"Authorization": f"Bearer {head.env['RAY_AUTH_TOKEN']}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return str(json.load(answer).get("status", ""))
    except (OSError, ValueError):
        return ""


@pytest.mark.slow
def test_a_real_ray_job_submission_trains_and_writes_its_run_directory(tmp_path):
    # thrown away after: its GCS and raylet need not end gracefully
    with RayHead(num_cpus=4, dashboard=True, grace=0.5) as head:
        environ = dict(head.env)
        work = tmp_path / "job"
        work.mkdir()
        (work / "small.yaml").write_text(
            "include: cartpole_ppo.yaml\nname: job\nshards: {count: 2}\nenv: {num_envs: 4}\n"
            "algo: {num_steps: 32, num_minibatches: 2}\ntrain: {total_steps: 1024, log_every: 2}\n"
            "eval: {episodes: 4, num_envs: 2}\n"
        )
        # configs/cartpole_ppo.yaml is packaged: the include finds it next to small.yaml only if copied
        (work / "cartpole_ppo.yaml").write_text((PACKAGED_CONFIGS / "cartpole_ppo.yaml").read_text())
        run_dir = tmp_path / "run"
        environ["RAY_ADDRESS"] = f"http://127.0.0.1:{head.dashboard_port}"
        job_id = f"raysim-test-{os.getpid()}"
        submit = [
            RAY,
            "job",
            "submit",
            "--no-wait",
            "--submission-id",
            job_id,
            "--working-dir",
            str(work),
            "--",
            "raysim",
            "train",
            "small.yaml",
            "--run-dir",
            str(run_dir),
        ]
        deadline = time.monotonic() + 180
        while True:  # the job server can take a few seconds after `ray start` to answer
            result = subprocess.run(submit, capture_output=True, text=True, env=environ, timeout=120)
            if result.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(3)
        assert result.returncode == 0, result.stdout + result.stderr
        deadline = time.monotonic() + 240  # the job's end, asked of the jobs REST API (no CLI process per question)
        while job_state(head, job_id) not in ("SUCCEEDED", "FAILED", "STOPPED") and time.monotonic() < deadline:
            time.sleep(0.5)
        status = subprocess.run([RAY, "job", "status", job_id], capture_output=True, text=True, env=environ).stdout
        logs = subprocess.run([RAY, "job", "logs", job_id], capture_output=True, text=True, env=environ).stdout
        assert "succeeded" in status.lower(), status + logs
        assert "iter    2 | steps" in logs and "done: 1,024 env steps" in logs
        progress = [line for line in logs.split("\n") if "| steps" in line]
        assert progress and all("\r" not in line and "\x1b" not in line for line in progress)  # plain lines
        assert (run_dir / "configs" / "train.yaml").is_file() and any((run_dir / "metrics").iterdir())
        assert any((run_dir / "checkpoints").iterdir())
