"""The placement benchmark's table (``raysim bench placement``), tiny and in process: its rows and its byte counts;
the Ray run (USS, the 50 MB actor, Meta-World) runs by hand."""

import json
import statistics

import pytest

from raysim.bench.placement import main
from raysim.envs import make
from raysim.models import Actor, ModelConfig


def test_the_tiny_in_process_run_counts_each_roles_policy_bytes_and_the_bytes_moved(tmp_path, capsys):
    out = tmp_path / "placement.md"
    assert main(["--tiny", "--local", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.read_text() == printed
    rows = [line.split(" | ")[:2] for line in printed.splitlines() if line.startswith("| ")][1:]
    weights = "| weights: CartPole, actor [16, 16]; 4 shards / 4 workers + 1 server"
    assert rows == [
        [weights, "actor state_dict, one copy"],
        [weights, "resident policy bytes per role (versions held)"],
        [weights, "resident policy bytes, all roles (collocated / servers)"],
        [weights, "weight bytes moved per iteration, pickled (collocated / servers)"],
        [weights, "iteration: a new version + 3 steps x 2 rows per shard, median ms (collocated / servers)"],
        ["| speed: CartPole", "env steps/s, 2 shards x 4 rows x 3 steps x 1 chunks, median (servers / collocated)"],
    ]
    line = json.loads((tmp_path / "placement.jsonl").read_text())
    assert line["bench"] == "placement" and line["cpus"] >= 1 and len(line["load_start"]) == 3
    measured = {row["measure"]: row for row in line["rows"]}

    env = make("raysim/CartPole", 1)
    actor = Actor(env.observation_spaces, env.action_space, ModelConfig(hidden_sizes=[16, 16]))
    actor_bytes = sum(t.nbytes for t in actor.state_dict().values())
    assert measured["actor state_dict, one copy"]["values"] == {"bytes": actor_bytes}
    held = measured["resident policy bytes per role (versions held)"]["values"]
    assert held["collocated"] == [{"kind": "shard", "versions": 1, "bytes": actor_bytes}] * 4
    # 3 versions loaded (1 warm-up, 2 repeats); the server keeps max_policy_lag + 2 = 2 of them
    assert held["servers"] == [{"kind": "worker", "versions": 0, "bytes": 0}] * 4 + [
        {"kind": "server", "versions": 2, "bytes": 2 * actor_bytes}
    ]
    resident = measured["resident policy bytes, all roles (collocated / servers)"]
    assert resident["values"] == {"collocated": 4 * actor_bytes, "servers": 2 * actor_bytes}
    assert resident["ratio"] == 2.0 and resident["target"] == 4.0
    moved = measured["weight bytes moved per iteration, pickled (collocated / servers)"]["values"]
    assert moved["weights"] > actor_bytes > moved["key"] > 0
    assert moved["collocated"] == 4 * moved["weights"]
    assert moved["servers"] == moved["weights"] + 4 * moved["key"]
    speed = line["rows"][-1]
    assert [len(samples) for samples in speed["values"].values()] == [2, 2]
    medians = {name: statistics.median(rates) for name, rates in speed["values"].items()}
    assert speed["ratio"] == pytest.approx(medians["servers"] / medians["collocated"])
    paired = [s / c for s, c in zip(speed["values"]["servers"], speed["values"]["collocated"], strict=True)]
    assert speed["paired"] == pytest.approx(statistics.median(paired))
    assert ">= 4x: NOT met" in printed  # 4 shards against a server holding 2 versions: 2x


def test_a_repeat_count_below_one_is_refused():
    with pytest.raises(SystemExit):
        main(["--repeats", "0"])
