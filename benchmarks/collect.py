"""``python benchmarks/collect.py``: the same as ``raysim bench collect``, with the peers of this source tree."""

from raysim.bench.collect import main

raise SystemExit(main())
