"""Gymnasium MuJoCo locomotion: reset(seed=0), 200 steps of zero and of fixed random actions; dump observations.
On termination: reset(seed=1000+k) and go on (recorded)."""
import sys, time
import gymnasium as gym, mujoco, numpy as np
out = sys.argv[1]
res = {}
for name in ["Hopper-v5", "HalfCheetah-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5"]:
    env = gym.make(name)
    act_dim = env.action_space.shape[0]
    for kind in ["zero", "random"]:
        acts = (np.zeros((200, act_dim)) if kind == "zero" else
                np.random.default_rng(7).uniform(env.action_space.low, env.action_space.high, size=(200, act_dim)))
        obs, _ = env.reset(seed=0)
        O, R, resets = [obs], [], 0
        t0 = time.perf_counter()
        for t in range(200):
            obs, r, term, trunc, _ = env.step(acts[t].astype(np.float32))
            O.append(obs); R.append(r)
            if term or trunc:
                resets += 1
                obs, _ = env.reset(seed=1000 + resets); O.append(obs)
        res[f"{name}/{kind}/obs"], res[f"{name}/{kind}/rew"] = np.array(O), np.array(R)
        print(name, kind, "episodes ended", resets, "steps/s %.0f" % (200 / (time.perf_counter() - t0)))
np.savez(out, **res)
print("mujoco", mujoco.__version__, "gymnasium", gym.__version__)
