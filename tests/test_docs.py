"""The documentation: the MkDocs site builds with ``--strict``, its generated config reference is current, and
the README links every page of it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import raysim
from raysim.cli import main

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def test_the_docs_site_builds_with_strict_so_no_link_anchor_or_reference_is_broken(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    environ = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path)],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "config-reference" / "index.html").is_file() and (tmp_path / "api" / "index.html").is_file()
    readme = (ROOT / "README.md").read_text()  # the README's links into the docs land on real anchors too
    for page, anchor in re.findall(r"\]\(docs/([^)#]+)\.md#([^)]+)\)", readme):
        built = tmp_path / (page.removesuffix("index") if page.endswith("index") else page + "/") / "index.html"
        assert f'id="{anchor}"' in built.read_text(), f"README links docs/{page}.md#{anchor}, which has no such anchor"


def test_the_config_reference_page_is_what_raysim_config_markdown_prints(capsys):
    assert main(["config", "--markdown"]) == 0
    printed = capsys.readouterr().out
    page = (DOCS / "config-reference.md").read_text()
    assert page == printed, "regenerate it: python -m raysim config --markdown > docs/config-reference.md"
    assert "| algo.max_policy_lag |" in page
    defaults = raysim.load_config(None)  # and every default the reference states is one the loader accepts
    assert defaults.env.id == "raysim/CartPole"


def nav_pages(nav: list) -> list[str]:
    """The page paths of an mkdocs ``nav``, in order."""
    pages = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_docs_page_is_in_the_nav_and_linked_from_the_short_readme():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)  # !!python/name tags stay text
    pages = nav_pages(config["nav"])
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(pages) == on_disk
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", readme))
    assert {f"docs/{page}" for page in pages if page != "index.md"} <= linked
    assert len(readme.splitlines()) < 300
