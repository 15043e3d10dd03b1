"""Collection benchmark (see raysim/bench/collect.py); run from a checkout: python benchmarks/collect.py."""
import pathlib, sys; sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # noqa: E401,E702
from raysim.bench.collect import main  # noqa: E402
raise SystemExit(main())
