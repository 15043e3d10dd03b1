"""``python benchmarks/mujoco.py``: the same as ``raysim bench mujoco``, with the peer of this source tree."""

from raysim.bench.mujoco import main

raise SystemExit(main())
