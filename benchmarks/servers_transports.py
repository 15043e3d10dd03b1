"""Env steps/s on Meta-World pick-place-v3: collocated shards against env workers + policy servers reached by plain
Ray calls or by Compiled Graphs, with the CPU each role spends (issue 45's speed target; results in
benchmarks/results/servers/transports.md).

    python benchmarks/servers_transports.py --rows 10 --steps 250 --repeats 5 --modes a,b,b2,c,cn,c2,c2n

Modes (2 workers, `--rows` rows each, `--steps` steps each per timed run; same total steps in every mode):
  a      collocated: each worker acts in-process (MLP [256,256], 1 torch thread, inference_mode)
  b      plain calls: each step ray.get(server.act.remote(request)) to one sync PolicyServer actor (shared)
  b2     plain calls, a server per worker (2 servers)
  c      Compiled Graph per worker: each worker compiles InputNode -> its own server's act (2 servers), execute().get()
  cn     as c, the 2 servers' threads at nice 19
  ci     as c, the 2 servers' threads SCHED_IDLE
  c2     one graph driven from the driver: inp -> w.produce (x2) -> server.act_many (one batch) -> w.consume (x2)
  c2n    as c2, server and driver at nice 19
Each repeat runs every mode in a rotating order; medians over repeats (the first `--warmups` repeats dropped).
CPU seconds of servers/workers/driver per run from /proc/<pid>/stat.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import ray
import torch

from raysim.bench.serving import Case
from raysim.rollout.inference import inference
from raysim.rollout.server import ActRequest, PolicyServer

TASK = {"benchmark": "MT1", "tasks": "pick-place-v3"}
KEY = ("bench", 1)
SIDE_BY_SIDE = {"worker_niceness": 0}  # as raysim's benches: Ray workers at the driver's niceness


def cpu_seconds(pid: int) -> float:
    f = open(f"/proc/{pid}/stat").read().rpartition(")")[2].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def deprioritize(how: str) -> None:
    """Every thread of this process at nice 19 or SCHED_IDLE (Linux: niceness is per thread)."""
    for tid in os.listdir("/proc/self/task"):
        tid = int(tid)
        if how == "nice":
            os.setpriority(os.PRIO_PROCESS, tid, 19)
        elif how == "idle":
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        else:  # back to normal (root may lower niceness)
            os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
            os.setpriority(os.PRIO_PROCESS, tid, 0)


def case(rows: int) -> Case:
    return Case(f"MetaWorld pick-place-v3, {rows} rows", "metaworld_pick_place_ppo", rows, [256, 256], TASK)


class Server(PolicyServer):
    def __init__(self, spaces, action_space, model, weights):
        super().__init__(spaces, action_space, model)
        self.load(weights)

    def pid(self) -> int:
        return os.getpid()

    def prio(self, how: str) -> None:
        deprioritize(how)

    def act_many(self, *requests):
        return self.serve(list(requests))


class Worker:
    def __init__(self, rows: int, seed: int, weights, index: int):
        torch.set_num_threads(1)
        self.rows, self.index = rows, index
        self.env, self.actor, _ = case(rows).build(seed)
        self.actor.load_state_dict(weights["actor"])
        self.actor.requires_grad_(False)
        self.obs = self.env.reset(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.graph = None
        self.pending = None

    def pid(self) -> int:
        return os.getpid()

    def request(self) -> ActRequest:
        draws = self.actor.draws(self.rows, self.gen)
        return ActRequest(KEY, {g: self.obs[g] for g in self.actor.inputs}, draws)

    def step_env(self, action) -> None:
        with torch.inference_mode():
            self.obs = self.env.step(self.actor.env_action(action)).obs

    def run_local(self, steps: int) -> float:
        t = time.perf_counter()
        with inference(self.actor), torch.inference_mode():
            for _ in range(steps):
                action, _ = self.actor.sample(self.obs, self.gen)
                self.obs = self.env.step(self.actor.env_action(action)).obs
        return time.perf_counter() - t

    def run_plain(self, server, steps: int) -> float:
        t = time.perf_counter()
        for _ in range(steps):
            reply = ray.get(server.act.remote(self.request()))
            self.step_env(reply.action)
        return time.perf_counter() - t

    def compile(self, server) -> float:
        from ray.dag import InputNode

        t = time.perf_counter()
        with InputNode() as inp:
            self.graph = server.act.bind(inp).experimental_compile()
        self.graph.execute(self.request()).get()
        return time.perf_counter() - t

    def run_graph(self, steps: int) -> float:
        t = time.perf_counter()
        for _ in range(steps):
            reply = self.graph.execute(self.request()).get()
            self.step_env(reply.action)
        return time.perf_counter() - t

    def teardown(self) -> None:
        if self.graph is not None:
            self.graph.teardown()
            self.graph = None

    # c2: a graph driven from the driver
    def produce(self, _):
        return self.request()

    def consume(self, replies):
        self.step_env(replies[self.index].action)
        return self.index


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=10)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--warmups", type=int, default=1)
    p.add_argument("--modes", default="a,b,c,cn,c2")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    modes = args.modes.split(",")
    load0 = open("/proc/loadavg").read().strip()
    ray.init(
        address="local",
        num_cpus=8,
        include_dashboard=False,
        _system_config=SIDE_BY_SIDE,
        logging_level="ERROR",
        log_to_driver=False,
    )
    try:
        env, actor, model = case(args.rows).build(0)
        spaces, action_space = env.observation_spaces, env.action_space
        env.close()
        weights = {"version": 1, "timeline": "bench", "actor": actor.state_dict()}
        RServer = ray.remote(Server).options(num_cpus=0)
        RWorker = ray.remote(Worker).options(num_cpus=0)
        workers = [RWorker.remote(args.rows, i + 1, weights, i) for i in range(2)]
        shared = RServer.remote(spaces, action_space, model, weights)
        own = [RServer.remote(spaces, action_space, model, weights) for _ in range(2)]
        wpids = ray.get([w.pid.remote() for w in workers])
        spid = ray.get(shared.pid.remote())
        opids = ray.get([s.pid.remote() for s in own])
        # warm: a few steps of every path
        ray.get([w.run_local.remote(20) for w in workers])
        ray.get([w.run_plain.remote(shared, 20) for w in workers])

        # idle CPU of a compiled graph's server (c): compile, sleep 2 s, read CPU
        ray.get([w.compile.remote(s) for w, s in zip(workers, own, strict=True)])
        time.sleep(0.5)
        before = [cpu_seconds(q) for q in opids]
        t = time.perf_counter()
        time.sleep(2.0)
        dt = time.perf_counter() - t
        idle_cpu = [100 * (cpu_seconds(q) - b) / dt for q, b in zip(opids, before, strict=True)]
        ray.get([w.teardown.remote() for w in workers])
        print(f"idle CG servers' CPU %: {[round(x) for x in idle_cpu]}", flush=True)

        def timed(mode: str):
            steps = args.steps
            extra = {}
            pids = {"workers": wpids}
            if mode == "a":
                calls = lambda: [w.run_local.remote(steps) for w in workers]  # noqa: E731
            elif mode == "b":
                pids["server"] = [spid]
                calls = lambda: [w.run_plain.remote(shared, steps) for w in workers]  # noqa: E731
            elif mode == "b2":
                pids["server"] = opids
                calls = lambda: [w.run_plain.remote(s, steps) for w, s in zip(workers, own, strict=True)]  # noqa: E731
            elif mode in ("c", "cn", "ci"):
                pids["server"] = opids
                if mode != "c":
                    ray.get([s.prio.remote("nice" if mode == "cn" else "idle") for s in own])
                extra["compile_s"] = ray.get([w.compile.remote(s) for w, s in zip(workers, own, strict=True)])
                calls = lambda: [w.run_graph.remote(steps) for w in workers]  # noqa: E731
            elif mode in ("c2", "c2n"):
                from ray.dag import InputNode, MultiOutputNode

                pids["server"] = [spid]
                pids["driver"] = [os.getpid()]
                with InputNode() as inp:
                    reqs = [w.produce.bind(inp) for w in workers]
                    replies = shared.act_many.bind(*reqs)
                    dag = MultiOutputNode([w.consume.bind(replies) for w in workers])
                if mode == "c2n":
                    ray.get(shared.prio.remote("nice"))
                graph = dag.experimental_compile()
                ray.get(graph.execute(0))
            cpu0 = {k: [cpu_seconds(q) for q in v] for k, v in pids.items()}
            t = time.perf_counter()
            if mode in ("c2", "c2n"):
                old = os.getpriority(os.PRIO_PROCESS, 0)
                if mode == "c2n":
                    os.setpriority(os.PRIO_PROCESS, 0, 19)
                pending = graph.execute(0)
                for _ in range(steps - 1):
                    nxt = graph.execute(0)  # 2 in flight
                    ray.get(pending)
                    pending = nxt
                ray.get(pending)
                inner = None
            else:
                inner = ray.get(calls())
            wall = time.perf_counter() - t
            cpu = {
                k: [round(100 * (cpu_seconds(q) - c) / wall) for q, c in zip(v, cpu0[k], strict=True)]
                for k, v in pids.items()
            }
            if mode in ("c", "cn", "ci"):
                ray.get([w.teardown.remote() for w in workers])
                ray.get([s.prio.remote("normal") for s in own])
            if mode in ("c2", "c2n"):
                os.setpriority(os.PRIO_PROCESS, 0, old)
                graph.teardown()
                ray.get(shared.prio.remote("normal"))
            return {"steps_per_s": 2 * args.rows * steps / wall, "wall": wall, "inner": inner, "cpu%": cpu, **extra}

        results = {m: [] for m in modes}
        for r in range(args.warmups + args.repeats):
            order = modes[r % len(modes) :] + modes[: r % len(modes)]
            for m in order:
                res = timed(m)
                print(
                    f"repeat {r} {m}: {res['steps_per_s']:.0f} steps/s cpu% {res['cpu%']}"
                    f"{'' if 'compile_s' not in res else ' compile ' + str([round(x, 2) for x in res['compile_s']])}",
                    flush=True,
                )
                if r >= args.warmups:
                    results[m].append(res)
        base = statistics.median(x["steps_per_s"] for x in results["a"]) if "a" in results else None
        print(
            f"\nrows/worker {args.rows}, {args.steps} steps/worker/run, "
            f"{args.repeats} repeats (+{args.warmups} warm-up)"
        )
        summary = {}
        for m in modes:
            sps = [x["steps_per_s"] for x in results[m]]
            med = statistics.median(sps)
            paired = None
            if "a" in results and m != "a":
                paired = statistics.median(
                    x["steps_per_s"] / y["steps_per_s"] for x, y in zip(results[m], results["a"], strict=True)
                )
            summary[m] = {"median": med, "all": sps, "ratio": None if base is None else med / base, "paired": paired}
            print(
                f"{m:4s} median {med:7.0f} steps/s  ratio {summary[m]['ratio']:.3f}  paired {paired}  "
                f"all {[round(s) for s in sps]}"
            )
    finally:
        ray.shutdown()
    load1 = open("/proc/loadavg").read().strip()
    print(f"loadavg before: {load0}; after: {load1}")
    if args.out:
        with open(args.out, "a") as f:
            f.write(
                json.dumps(
                    {
                        "rows": args.rows,
                        "steps": args.steps,
                        "idle_cg_server_cpu%": idle_cpu,
                        "summary": summary,
                        "runs": results,
                        "load": [load0, load1],
                    },
                    default=str,
                )
                + "\n"
            )


if __name__ == "__main__":
    main()
