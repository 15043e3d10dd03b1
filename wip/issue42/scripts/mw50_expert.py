"""All 50 tasks: scripted expert, MT1(name, seed=0) tasks 0..E-1, 500 steps; success any/final, first step; rand_vec dim."""
import os, sys, time, hashlib, pickle, numpy as np, mujoco
if os.environ.get("MW_SHIM"):
    from metaworld.sawyer_xyz_env import SawyerMocapBase
    def _rmw(self):
        for i in range(self.model.eq_data.shape[0]):
            if self.model.eq_type[i] == mujoco.mjtEq.mjEQ_WELD:
                self.model.eq_data[i, :11] = [0, 0, 0, 0, 0, 0, -1, 0, 0, 0, 5.0]
    SawyerMocapBase.reset_mocap_welds = _rmw
import metaworld
from metaworld.env_dict import ALL_V3_ENVIRONMENTS
from metaworld.policies import ENV_POLICY_MAP
E = int(sys.argv[1]) if len(sys.argv) > 1 else 2
print("mujoco", mujoco.__version__)
tot_any = tot_fin = 0
t0 = time.perf_counter()
for name in ALL_V3_ENVIRONMENTS:
    b = metaworld.MT1(name, seed=0)
    env = b.train_classes[name](); pol = ENV_POLICY_MAP[name]()
    row = []
    for ep in range(E):
        env.set_task(b.train_tasks[ep]); obs, _ = env.reset(); h = hashlib.sha256(obs.tobytes()).hexdigest()[:8]
        S = []
        for t in range(500):
            obs, r, term, trunc, info = env.step(pol.get_action(obs)); S.append(info["success"])
            if trunc: break
        S = np.array(S); first = int(np.argmax(S > 0)) + 1 if S.any() else -1
        tot_any += bool(S.any()); tot_fin += bool(S[-1])
        row.append(f"ep{ep}: first={first} final={int(S[-1])} reset_sha={h}")
    print(f"{name:28s} rand_vec dim {len(env._last_rand_vec)}  " + "  ".join(row), flush=True)
print(f"any-step success {tot_any}/{50*E}, final-step success {tot_fin}/{50*E}, {time.perf_counter()-t0:.0f} s")
