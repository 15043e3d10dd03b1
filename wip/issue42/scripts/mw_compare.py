"""Compare two dumps of mw_traj.py: per episode, the first step whose observation differs and the size of the differences."""
import sys
import numpy as np
A, B = np.load(sys.argv[1]), np.load(sys.argv[2])
for k in sorted(A.files):
    if k.endswith("rand_vecs"):
        print(k, "task table identical:", np.array_equal(A[k], B[k]))
for k in sorted(A.files):
    if not k.endswith("/obs"):
        continue
    a, b = A[k], B[k]
    n = min(len(a), len(b))
    d = np.abs(a[:n] - b[:n]).max(axis=1)
    diff = np.nonzero(d > 0)[0]
    first = int(diff[0]) if len(diff) else -1
    ra, rb = A[k[:-4] + "/rew"], B[k[:-4] + "/rew"]
    line = (f"{k:26s} obs identical={np.array_equal(a, b)!s:5s} first differing obs index={first:4d} "
            f"max|dobs| [0,10)={d[:10].max():.1e} [0,100)={d[:100].max():.1e} all={d.max():.1e}  "
            f"max|drew| [0,100)={np.abs(ra[:100]-rb[:100]).max():.1e}  return {ra.sum():.1f} vs {rb.sum():.1f}")
    sk = k[:-4] + "/succ"
    if sk in A.files:
        sa, sb = A[sk], B[sk]
        fa = int(np.argmax(sa > 0)) + 1 if sa.any() else -1
        fb = int(np.argmax(sb > 0)) + 1 if sb.any() else -1
        line += f"  first success {fa} vs {fb}, final {int(sa[-1])} vs {int(sb[-1])}"
    print(line)
