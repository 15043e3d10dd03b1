"""The peers of raysim's benchmarks live in the source tree's ``benchmarks/``, not in the package.

``raysim bench`` runs raysim's own rows anywhere (an installed wheel too) and the peers' rows where
the source tree is present (a checkout, an editable install); elsewhere it says they were skipped.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SOURCE_BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
MISSING = (
    "the peers live in the source tree's benchmarks/, which an installed wheel does not have: "
    "run from a checkout (pip install -e .) to measure them"
)


def peer_module(name: str) -> ModuleType | None:
    """``benchmarks/<name>.py`` of the source tree, imported once; None where there is no source tree."""
    key = f"raysim_benchmarks_{name}"
    if key in sys.modules:
        return sys.modules[key]
    path = SOURCE_BENCHMARKS / f"{name}.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(key, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    spec.loader.exec_module(module)
    return module
