"""The installation page's table of extras lists every optional extra of ``pyproject.toml``, and every CPU torch the
docs pin is inside the torch range raysim declares."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "installation.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_every_extra_of_the_project_has_a_row_in_the_installation_table():
    rows = set(re.findall(r"^\| `([\w-]+)` \|", PAGE.read_text(), re.M))
    assert set(PROJECT["optional-dependencies"]) == rows


def test_every_cpu_torch_the_docs_install_is_pinned_inside_the_projects_torch_range():
    torch = next(Requirement(r) for r in PROJECT["dependencies"] if Requirement(r).name == "torch")
    installs = [
        (page.name, found) for page in PAGES for found in re.findall(r"pip install (\S+) --index-url", page.read_text())
    ]
    pins = {found.strip('"').removeprefix("torch==") for _, found in installs}
    assert installs and all(found.startswith('"torch==') for _, found in installs), installs  # never unpinned
    assert all(torch.specifier.contains(pin) for pin in pins), (pins, str(torch.specifier))
