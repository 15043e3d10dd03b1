"""Run Meta-World scripted experts (and one random-action episode) with fixed tasks; dump per-step data.

usage: python mw_traj.py OUT.npz [episodes]
Two ways of building the env:
  raw: metaworld.MT1(name, seed=0) -> env_cls() -> set_task(train_tasks[ep]) -> reset()
  gym: gymnasium.make("Meta-World/MT1", env_name=name, seed=0) -> reset() per episode (wrapper picks the task)
"""
import hashlib
import sys
import time

import gymnasium
import metaworld
import mujoco
import numpy as np
from metaworld.policies import ENV_POLICY_MAP
import os

SHIM = os.environ.get("MW_SHIM")  # None | keep | zero : MuJoCo >= 4 has 12 eq_data fields, metaworld writes 11
if SHIM:
    from metaworld.sawyer_xyz_env import SawyerMocapBase

    def reset_mocap_welds(self):
        if self.model.nmocap > 0 and self.model.eq_data is not None:
            for i in range(self.model.eq_data.shape[0]):
                if self.model.eq_type[i] == mujoco.mjtEq.mjEQ_WELD:
                    self.model.eq_data[i, :11] = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 5.0]
                    if SHIM == "zero" and self.model.eq_data.shape[1] > 11:
                        self.model.eq_data[i, 11:] = 0.0

    SawyerMocapBase.reset_mocap_welds = reset_mocap_welds

out = sys.argv[1]
EPS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
TASKS = ["reach-v3", "push-v3", "pick-place-v3"]
res = {}
summary = []


def run_episode(env, policy, obs, actions=None):
    O, R, S = [obs.copy()], [], []
    t_step = 0.0
    n = 0
    for t in range(500):
        a = policy.get_action(obs) if actions is None else actions[t]
        t0 = time.perf_counter()
        obs, r, term, trunc, info = env.step(a)
        t_step += time.perf_counter() - t0
        n += 1
        O.append(obs.copy())
        R.append(float(r))
        S.append(float(info["success"]))
        if term or trunc:
            break
    return np.array(O), np.array(R), np.array(S), n, t_step


for name in TASKS:
    bench = metaworld.MT1(name, seed=0)
    rv = np.array([__import__("pickle").loads(t.data)["rand_vec"] for t in bench.train_tasks])
    res[f"{name}/rand_vecs"] = rv
    # raw classes
    env = bench.train_classes[name]()
    pol = ENV_POLICY_MAP[name]()
    tot_n, tot_t = 0, 0.0
    for ep in range(EPS):
        env.set_task(bench.train_tasks[ep])
        obs, _ = env.reset()
        O, R, S, n, ts = run_episode(env, pol, obs)
        tot_n += n
        tot_t += ts
        k = f"{name}/raw/{ep}"
        res[k + "/obs"], res[k + "/rew"], res[k + "/succ"] = O, R, S
        first = int(np.argmax(S > 0)) + 1 if S.any() else -1
        summary.append((name, "raw", ep, n, S.any(), bool(S[-1]), first,
                        hashlib.sha256(O[:100].tobytes()).hexdigest()[:12], round(R.sum(), 3)))
    # one random-action episode (actions from a fixed RNG) on task 0
    acts = np.random.default_rng(123).uniform(-1, 1, size=(500, 4)).astype(np.float32)
    env.set_task(bench.train_tasks[0])
    obs, _ = env.reset()
    O, R, S, n, ts = run_episode(env, pol, obs, actions=acts)
    res[f"{name}/rawrand/obs"], res[f"{name}/rawrand/rew"] = O, R
    summary.append((name, "rawrand", 0, n, S.any(), bool(S[-1]), -1,
                    hashlib.sha256(O[:100].tobytes()).hexdigest()[:12], round(R.sum(), 3)))
    res[f"{name}/raw_steps_per_s"] = np.array((tot_n + n) / (tot_t + ts))
    env.close()
    # gymnasium.make path
    genv = gymnasium.make("Meta-World/MT1", env_name=name, seed=0)
    gn, gt = 0, 0.0
    for ep in range(EPS):
        obs, _ = genv.reset()
        O, R, S, n, ts = run_episode(genv, pol, obs)
        gn += n
        gt += ts
        k = f"{name}/gym/{ep}"
        res[k + "/obs"], res[k + "/rew"], res[k + "/succ"] = O, R, S
        res[k + "/goal"] = genv.unwrapped._target_pos.copy()
        first = int(np.argmax(S > 0)) + 1 if S.any() else -1
        summary.append((name, "gym", ep, n, S.any(), bool(S[-1]), first,
                        hashlib.sha256(O[:100].tobytes()).hexdigest()[:12], round(R.sum(), 3)))
    res[f"{name}/gym_steps_per_s"] = np.array(gn / gt)
    genv.close()

np.savez(out, **res)
print("mujoco", mujoco.__version__, "metaworld", metaworld.__version__ if hasattr(metaworld, "__version__") else "3.1.1")
print("task path ep steps any_success final_success first_success_step sha256(obs[:100]) return")
for row in summary:
    print(*row)
for name in TASKS:
    print(name, "env.step/s raw %.0f gym %.0f" % (res[f"{name}/raw_steps_per_s"], res[f"{name}/gym_steps_per_s"]))
