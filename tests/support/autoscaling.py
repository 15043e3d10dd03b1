"""Training on Ray's fake autoscaling cluster, in its own process:  python -m tests.support.autoscaling RUN_DIR

The head has no ``shard`` resource; a worker type ``{CPU: 1, shard: 1}`` (up to 3 nodes) is added
by the autoscaler on demand. The run asks for 1..3 shards (elastic). Prints one JSON line.
Unlike ``ray.cluster_utils.AutoscalingCluster.start``, this never runs ``ray stop --force``
(which would stop every Ray on the machine): it stops only its own processes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import ray

import raysim
from raysim.coordinator import Trainer
from tests.support.ray_head import RAY, free_port, stop_processes


def cluster_config(port: int) -> dict:
    return {
        "cluster_name": "raysim-fake",
        "max_workers": 3,
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 1,
        "provider": {
            "type": "fake_multinode",
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
            "gcs_address": f"{ray.util.get_node_ip_address()}:{port}",
        },
        "auth": {"ssh_user": "ubuntu"},
        "docker": {},
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
        "head_node_type": "ray.head.default",
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 2}, "node_config": {}, "max_workers": 0},
            "shard_node": {"resources": {"CPU": 1, "shard": 1}, "node_config": {}, "min_workers": 0, "max_workers": 3},
        },
    }


class Placement:
    """A sink that records the node of every shard at each log step (the run's actors end with the run)."""

    def __init__(self, trainer: Trainer):
        self.trainer, self.nodes = trainer, []

    def write(self, record: dict) -> None:
        self.nodes = [
            ray.get(s.actor.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()))
            for s in self.trainer.session.roles.shards
        ]

    def close(self) -> None:
        pass


def main(run_dir: str) -> None:
    port, temp_dir = free_port(), tempfile.mkdtemp(prefix="rsa", dir="/tmp")
    config_file = Path(temp_dir) / "autoscaling.json"
    config_file.write_text(json.dumps(cluster_config(port)))
    # A private test cluster on this machine: no token authentication (Ray 2.60 enables it on `ray start`).
    environ = {**os.environ, "AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_FAKE_CLUSTER": "1", "RAY_AUTH_MODE": "disabled"}
    environ.pop("RAY_ADDRESS", None)
    environ["RAYSIM_TEST_CLUSTER"] = temp_dir  # in every process of the cluster: ``stop_processes`` finds them all
    session = ""
    try:
        subprocess.check_call(
            [
                RAY,
                "start",
                "--head",
                "--port",
                str(port),
                "--num-cpus",
                "2",
                "--temp-dir",
                temp_dir,
                f"--autoscaling-config={config_file}",
                "--disable-usage-stats",
                "--include-dashboard=false",
                "--dashboard-agent-listen-port",
                str(free_port()),
                "--metrics-export-port",
                str(free_port()),
            ],
            env=environ,
        )
        ray.init(address=f"{ray.util.get_node_ip_address()}:{port}")
        session = ray._private.worker._global_node.session_name
        config = raysim.load_config(
            None,
            [
                "backend=ray",
                "shards.count=1",
                "shards.max=3",
                "shards.resources={shard: 1}",
                "env.num_envs=4",
                "algo.num_steps=32",
                "algo.num_minibatches=2",
                "algo.update_epochs=1",
                "train.total_steps=12800",
                "train.log_every=1",
                "eval.episodes=0",
                "train.sinks=[parquet]",
                f"run_dir={run_dir}",
            ],
        )
        trainer = Trainer(config)
        placement = Placement(trainer)
        trainer.sinks = [placement]
        summary = trainer.train()
        nodes = placement.nodes
        shard_nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("shard")]
        print(
            json.dumps(
                {
                    "shards": len(nodes),
                    "shard_placement": nodes,
                    "shard_nodes": len(shard_nodes),
                    "env_steps": summary.env_steps,
                }
            ),
            flush=True,
        )
        ray.shutdown()
    finally:
        stop_processes(temp_dir, *([session] if session else []))
        shutil.rmtree(temp_dir, ignore_errors=True)  # its sessions' logs and sockets


if __name__ == "__main__":
    main(sys.argv[1])
