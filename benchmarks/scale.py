"""``python benchmarks/scale.py``: the same as ``raysim bench scale``."""

from raysim.bench.scale import main

raise SystemExit(main())
