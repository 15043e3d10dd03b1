"""``python benchmarks/startup.py``: the same as ``raysim bench startup``."""

from raysim.bench.startup import main

raise SystemExit(main())
