"""``python benchmarks/solve.py``: the same as ``raysim bench solve``, with the peers of this source tree."""

from raysim.bench.solve import main

raise SystemExit(main())
