"""The API reference's field tables of ``Summary`` and ``EvalReport`` name exactly the dataclasses' fields."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from raysim.coordinator import Summary
from raysim.evaluation import EvalReport

PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def table_after(block: str) -> list[str]:
    """The first column's names of the field table that follows the ``::: block`` directive on the page."""
    text = PAGE.read_text()
    start = text.index(f"::: {block}\n")
    table = re.search(r"^\| field \|.*?\n((?:\|.*\n)+)", text[start:], re.M)
    assert table, f"no field table after ::: {block}"
    return re.findall(r"^\| `(\w+)` \|", table.group(1), re.M)


@pytest.mark.parametrize(
    "cls, block", [(Summary, "raysim.coordinator.Summary"), (EvalReport, "raysim.evaluation.EvalReport")]
)
def test_the_field_table_of_a_returned_dataclass_names_its_fields_in_order(cls, block):
    assert table_after(block) == [field.name for field in dataclasses.fields(cls)]
