"""Meta-World 3.1.1 APIs a native batched env needs: build costs, task tables, seeded resets, layout.

usage: python mw_api.py [cost|det|layout|all]   (MW_SHIM=keep to run on MuJoCo >= 4)
"""
import os
import pickle
import signal
import sys
import time

import numpy as np

t_imp = time.perf_counter()
import mujoco  # noqa: E402

if os.environ.get("MW_SHIM"):
    from metaworld.sawyer_xyz_env import SawyerMocapBase

    def _rmw(self):
        for i in range(self.model.eq_data.shape[0]):
            if self.model.eq_type[i] == mujoco.mjtEq.mjEQ_WELD:
                self.model.eq_data[i, :11] = [0, 0, 0, 0, 0, 0, -1, 0, 0, 0, 5.0]

    SawyerMocapBase.reset_mocap_welds = _rmw
import gymnasium as gym  # noqa: E402
import metaworld  # noqa: E402
from metaworld.env_dict import ALL_V3_ENVIRONMENTS, MT10_V3  # noqa: E402

t_imp = time.perf_counter() - t_imp
what = sys.argv[1] if len(sys.argv) > 1 else "all"


def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024


print("mujoco", mujoco.__version__, "| import mujoco+gymnasium+metaworld %.2f s, RSS %.0f MB" % (t_imp, rss_mb()))

if what in ("cost", "all"):
    keep = []
    for name in ["reach-v3", "reach-v3", "push-v3", "pick-place-v3", "assembly-v3", "door-open-v3"]:
        r0, t0 = rss_mb(), time.perf_counter()
        env = ALL_V3_ENVIRONMENTS[name]()
        keep.append(env)
        print(f"build {name:14s} {time.perf_counter()-t0:.3f} s  +{rss_mb()-r0:.1f} MB RSS")
    # ten more reach envs: marginal cost per env
    r0, t0 = rss_mb(), time.perf_counter()
    for _ in range(10):
        keep.append(ALL_V3_ENVIRONMENTS["reach-v3"]())
    print(f"10 more reach-v3 envs: {(time.perf_counter()-t0)/10:.3f} s and {(rss_mb()-r0)/10:.1f} MB each")
    e = keep[0]
    b = metaworld.MT1("reach-v3", seed=0)
    e.set_task(b.train_tasks[0])
    t0 = time.perf_counter()
    for _ in range(20):
        e.reset()
    print(f"reset() reach-v3: {(time.perf_counter()-t0)/20*1e3:.1f} ms")
    del keep
    for bname, mk in [("MT1(reach-v3)", lambda: metaworld.MT1("reach-v3", seed=0)),
                      ("MT10", lambda: metaworld.MT10(seed=0)), ("MT50", lambda: metaworld.MT50(seed=0))]:
        r0, t0 = rss_mb(), time.perf_counter()
        bench = mk()
        dt = time.perf_counter() - t0
        blob = pickle.dumps(bench.train_tasks)
        print(f"{bname:14s} built in {dt:.2f} s, +{rss_mb()-r0:.1f} MB RSS, {len(bench.train_tasks)} tasks, "
              f"pickled task list {len(blob)/1024:.0f} KiB")
    d = pickle.loads(bench.train_tasks[0].data)
    print("Task.data (unpickled) keys:", {k: (type(v).__name__ if k != "rand_vec" else v.shape) for k, v in d.items()})
    t0 = time.perf_counter()
    v = gym.make("Meta-World/MT1", env_name="reach-v3", seed=0)
    print(f"gym.make('Meta-World/MT1', env_name='reach-v3', seed=0): {time.perf_counter()-t0:.2f} s")
    t0 = time.perf_counter()
    v = gym.make_vec("Meta-World/MT10", vector_strategy="sync", seed=0, use_one_hot=True)
    print(f"gym.make_vec('Meta-World/MT10', sync, use_one_hot=True): {time.perf_counter()-t0:.2f} s, "
          f"num_envs {v.num_envs}, obs space {v.single_observation_space.shape}")
    v2 = gym.make_vec("Meta-World/MT10", vector_strategy="sync", seed=0, num_envs=3)
    print("gym.make_vec('Meta-World/MT10', num_envs=3).num_envs =", v2.num_envs)
    o, _ = v.reset()
    print("MT10 one-hot block of obs[:, 39:] is the identity:", np.array_equal(o[:, 39:], np.eye(10)),
          "| task order:", list(MT10_V3))

if what in ("det", "all"):
    name = "push-v3"
    cls = ALL_V3_ENVIRONMENTS[name]
    b = metaworld.MT1(name, seed=0)
    b2 = metaworld.MT1(name, seed=0)
    st = np.random.get_state()[1][:3].copy()
    b3 = metaworld.MT1(name, seed=1)
    rv = lambda bb: np.array([pickle.loads(t.data)["rand_vec"] for t in bb.train_tasks])  # noqa: E731
    print("MT1(push-v3, seed=0) twice: same 50 rand_vecs:", np.array_equal(rv(b), rv(b2)),
          "| seed=1 differs:", not np.array_equal(rv(b), rv(b3)),
          "| global np.random state restored:", np.array_equal(st, np.random.get_state()[1][:3]))
    print("MT1(seed=None) twice differ:",
          not np.array_equal(rv(metaworld.MT1(name)), rv(metaworld.MT1(name))))
    env = cls()
    env.set_task(b.train_tasks[3])
    o1, _ = env.reset()
    acts = np.random.default_rng(0).uniform(-1, 1, (50, 4))
    tr1 = [env.step(a)[0] for a in acts]
    for a in np.random.default_rng(1).uniform(-1, 1, (120, 4)):  # some other history
        env.step(a)
    env.set_task(b.train_tasks[7])
    env.reset()
    env.set_task(b.train_tasks[3])
    o2, _ = env.reset(seed=12345)
    tr2 = [env.step(a)[0] for a in acts]
    fresh = cls()
    fresh.set_task(b.train_tasks[3])
    o3, _ = fresh.reset()
    tr3 = [fresh.step(a)[0] for a in acts]
    print("set_task(task 3)+reset after other episodes == first time:", np.array_equal(o1, o2),
          "| 50-step trajectories equal:", np.array_equal(np.array(tr1), np.array(tr2)),
          "| == a fresh env:", np.array_equal(o1, o3), np.array_equal(np.array(tr1), np.array(tr3)))
    # the gym path ignores reset(seed)
    g = gym.make("Meta-World/MT1", env_name=name)
    goals = [g.reset(seed=0)[0][36:].copy() for _ in range(3)]
    print("gym.make MT1, reset(seed=0) three times -> distinct goals:", len({tuple(x) for x in goals}))
    # sampled goals from a seed, option 1: the env's own seeded sampler (rejection loop stays the env's)
    env._freeze_rand_vec = False
    env.seeded_rand_vec = True

    def seeded_reset(e, seed):
        e.np_random = np.random.default_rng(seed)
        return e.reset()[0]

    a1 = seeded_reset(env, 42)
    v1 = env._last_rand_vec.copy()
    seeded_reset(env, 7)
    a2 = seeded_reset(env, 42)
    print("seeded_rand_vec + np_random=default_rng(42): same obs and rand_vec twice:", np.array_equal(a1, a2),
          np.array_equal(v1, env._last_rand_vec), "| rand_vec", np.round(v1, 4),
          "within _random_reset_space:", bool(env._random_reset_space.contains(v1)))
    # option 2: draw the vector ourselves and freeze it (the constraint must be checked by us)
    env._freeze_rand_vec = True
    env.seeded_rand_vec = False
    rng = np.random.default_rng(5)
    sp = env._random_reset_space
    for tries in range(1, 100):
        vec = rng.uniform(sp.low, sp.high)
        if np.linalg.norm(vec[:2] - vec[3:5]) >= 0.15:  # push-v3's own rejection condition (obj xy vs goal xy)
            break
    env._last_rand_vec = vec
    o5 = env.reset()[0]
    print(f"own vector frozen: accepted after {tries} draws; obs object xy {np.round(o5[4:6], 4)} "
          f"== vec[:2] {np.round(vec[:2], 4)}, goal {np.round(o5[36:], 4)} vs vec[3:] {np.round(vec[3:], 4)}")
    bad = sp.low.copy()
    bad[3:5] = bad[:2]  # object and goal on top of each other: violates the constraint
    env._last_rand_vec = bad

    def _alarm(*_):
        raise TimeoutError

    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(3)
    try:
        env.reset()
        print("frozen vector violating the task's constraint: reset returned")
    except TimeoutError:
        print("frozen vector violating the task's constraint: reset() loops forever (stopped after 3 s)")
    signal.alarm(0)

if what in ("layout", "all"):
    env = ALL_V3_ENVIRONMENTS["pick-place-v3"]()
    print("raw env before set_task: _partially_observable", env._partially_observable,
          "max_path_length", env.max_path_length, "reward_function_version", env.reward_function_version)
    try:
        env.reset()
    except AssertionError:
        print("reset() before set_task: AssertionError (_last_rand_vec is None, _freeze_rand_vec True)")
    try:
        env.step(np.zeros(4))
    except RuntimeError as e:
        print("step() before set_task: RuntimeError:", e)
    b = metaworld.MT1("pick-place-v3", seed=0)
    env.set_task(b.train_tasks[0])
    o, _ = env.reset()
    print("after MT task: _partially_observable", env._partially_observable, "obs shape", o.shape,
          "obs[36:39]", np.round(o[36:], 4), "== _target_pos", np.allclose(o[36:], env._target_pos))
    print("obs[18:36] == obs[0:18] right after reset:", np.array_equal(o[18:36], o[:18]))
    n = 0
    trunc = False
    while not trunc:
        o, r, term, trunc, info = env.step(np.zeros(4))
        n += 1
    print("raw env truncates itself at step", n, "| info keys", sorted(info))
    try:
        env.step(np.zeros(4))
    except ValueError as e:
        print("step after 500:", e)
    ev1 = ALL_V3_ENVIRONMENTS["pick-place-v3"](reward_function_version="v1")
    ev1.set_task(b.train_tasks[0])
    ev1.reset()
    env.reset()
    a = np.array([0.5, 0.5, -0.5, 0.0])
    print("reward v2 / v1 for one step:", round(float(env.step(a)[1]), 4), round(float(ev1.step(a)[1]), 4))
