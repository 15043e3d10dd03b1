"""``python benchmarks/locomotion.py``: the same as ``raysim bench mujoco``, with the peer of this source tree.

Not named ``mujoco.py``: run as a script, that name would shadow the ``mujoco`` package.
"""

from raysim.bench.mujoco import main

raise SystemExit(main())
