import sys, numpy as np
A, B = np.load(sys.argv[1]), np.load(sys.argv[2])
for k in A.files:
    if not k.endswith("/obs"): continue
    a, b = A[k], B[k]
    if a.shape != b.shape:
        print(f"{k:28s} shapes differ {a.shape} vs {b.shape} (different terminations)"); n = min(len(a), len(b)); a, b = a[:n], b[:n]
    d = np.abs(a - b).max(axis=1); nz = np.nonzero(d > 0)[0]
    ra, rb = A[k[:-4] + "/rew"], B[k[:-4] + "/rew"]
    print(f"{k:28s} identical={np.array_equal(a, b)!s:5s} first differing obs={int(nz[0]) if len(nz) else -1:4d} "
          f"max|dobs| first10={d[:10].max():.1e} first50={d[:50].max():.1e} all200={d.max():.1e} "
          f"return {ra.sum():.2f} vs {rb.sum():.2f}")
