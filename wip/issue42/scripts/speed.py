"""env.step/s: Meta-World raw envs (fixed task, random actions, reset every 500) and Gymnasium locomotion."""
import os, time, numpy as np, mujoco
if os.environ.get("MW_SHIM"):
    from metaworld.sawyer_xyz_env import SawyerMocapBase
    def _rmw(self):
        for i in range(self.model.eq_data.shape[0]):
            if self.model.eq_type[i] == mujoco.mjtEq.mjEQ_WELD:
                self.model.eq_data[i, :11] = [0, 0, 0, 0, 0, 0, -1, 0, 0, 0, 5.0]
    SawyerMocapBase.reset_mocap_welds = _rmw
import gymnasium as gym, metaworld
out = [mujoco.__version__]
for name in ["reach-v3", "push-v3", "pick-place-v3"]:
    b = metaworld.MT1(name, seed=0); env = b.train_classes[name](); env.set_task(b.train_tasks[0]); env.reset()
    acts = np.random.default_rng(0).uniform(-1, 1, (2000, 4)).astype(np.float32)
    t0 = time.perf_counter()
    for i, a in enumerate(acts):
        if i % 500 == 0: env.reset()
        env.step(a)
    out.append(f"{name} {2000/(time.perf_counter()-t0):.0f}")
for name in ["Hopper-v5", "HalfCheetah-v5"]:
    env = gym.make(name).unwrapped; env.reset(seed=0)
    acts = np.random.default_rng(0).uniform(-1, 1, (5000, env.action_space.shape[0]))
    t0 = time.perf_counter()
    for a in acts:
        _, _, term, _, _ = env.step(a)
        if term: env.reset()
    out.append(f"{name} {5000/(time.perf_counter()-t0):.0f}")
print(" | ".join(out))
