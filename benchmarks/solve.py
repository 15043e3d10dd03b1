"""Time-to-solve benchmark (see raysim/bench/solve.py); run from a checkout: python benchmarks/solve.py."""
import pathlib, sys; sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # noqa: E401,E702
from raysim.bench.solve import main  # noqa: E402
raise SystemExit(main())
