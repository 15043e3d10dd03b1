"""A real second host: a Ray worker node that shares no filesystem with the driver (its own mount namespace).

The learner and the shards run there; the run directory lives where only the driver sees it. Training
with a learner death, stopping, resuming, evaluating, exporting and a task resource all work, because
only the driver reads or writes run storage. Both "hosts" share one network, so the loopback defect of
rank addresses is checked apart: a rank advertises its Ray node's IP, and holds its rendezvous port.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.ray_head import RayHead
from tests.support.second_host import SecondHost

ROOT = Path(__file__).resolve().parent.parent
WHY = SecondHost.available()


def driver(mode: str, head: RayHead, run_dir: Path) -> dict:
    env = {**head.env, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.second_host", mode, head.address, str(run_dir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=480,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def cluster():
    if WHY:
        print(f"skipped: {WHY}")
        pytest.skip(WHY)
    runs = Path(tempfile.mkdtemp(prefix="rsruns", dir="/tmp"))
    try:  # the head is thrown away after: its GCS and raylet need not end gracefully (grace)
        with RayHead(num_cpus=2, grace=0.5) as head, SecondHost(head, hidden=runs, num_cpus=3):
            yield head, runs
    finally:
        shutil.rmtree(runs, ignore_errors=True)


@pytest.mark.slow
def test_learner_and_shards_on_a_host_without_the_run_directory_train_restart_resume_evaluate_and_export(cluster):
    head, runs = cluster
    outcome = driver("learner", head, runs / "run")
    hostb = [node for node, resources in outcome["nodes"].items() if resources]
    assert len(hostb) == 1 and set(outcome["placement"]) == set(hostb)  # every learner rank and shard there
    assert outcome["sees"]["hostb"] == [] and "run" in outcome["sees"]["driver"]  # that host cannot see the run
    assert outcome["stopped_at"] == 5 and outcome["resumed_to"] == 8 and outcome["env_steps"] == 2048
    assert outcome["eval_completed"] == 4 and outcome["exported"]
    assert (runs / "run" / "resources" / "initial_states.npy").is_file()  # exported by the driver, beside it


@pytest.mark.slow
def test_two_learner_ranks_one_on_each_host_meet_and_train(cluster):
    head, runs = cluster
    outcome = driver("ranks", head, runs / "ranks")
    assert len(set(outcome["learner_nodes"])) == 2 and outcome["iterations"] == 2


@pytest.mark.slow
def test_bc_on_a_host_without_the_dataset_trains_on_what_the_driver_read_and_handed_over(cluster):
    pytest.importorskip("minari")
    head, runs = cluster
    outcome = driver("bc", head, runs / "bc")
    hostb = [node for node, resources in outcome["nodes"].items() if resources]
    assert outcome["learner_nodes"] == hostb  # the learner ran where the dataset cannot be seen
    assert outcome["sees"]["hostb"] == [] and outcome["sees"]["driver"] == ["raysim"]  # datasets/raysim/...
    assert outcome["iterations"] == 2 and outcome["eval_completed"] == 4


def test_a_rank_advertises_its_ray_nodes_ip_never_a_loopback_address_and_holds_its_port(ray_session):
    from raysim.learner.ranks import RankGroup

    @ray_session.remote(num_cpus=0)
    class Rank:
        def address(self):
            import torch

            self.group = RankGroup(0, 2, torch.device("cpu"))
            return self.group.rendezvous_address(), ray_session.util.get_node_ip_address()

    (host, port), node = ray_session.get(Rank.remote().address.remote())
    assert host == node and not host.startswith("127.")
    with socket.socket() as other, pytest.raises(OSError):  # rank 0 holds the port until the ranks meet
        other.bind((host, port))
