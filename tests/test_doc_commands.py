"""The pages work when copied and read the same on GitHub: each ``raysim ...`` line of a code block parses with
raysim's own command line (a required flag left out, an unknown option or command fails here), its config and
``--set`` overrides load, a checkpoint it names is one the packaged run writes, and no page includes another file
(GitHub would show the include line)."""

from __future__ import annotations

import re
import shlex
from itertools import zip_longest
from pathlib import Path

import pytest

import raysim
from raysim.cli import build_parser
from raysim.config import PACKAGED_CONFIGS
from raysim.coordinator.schedule import planned_iterations

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
SHELL_OPERATORS = {"&", "&&", "|", "||", ";"}  # the command ends there (what follows is another)
CHECKPOINT = re.compile(r"runs/(\w+)/checkpoints/(\d+)\b")
MESSAGE = re.compile(r"raysim(?: [\w-]+)+: ")  # what a command printed (``raysim bench sac: ...``), not a command


def shown_commands() -> list[tuple[str, list[str]]]:
    """``(page:line, argv)`` of every ``raysim`` command in a code block of the pages (continuations joined,
    comments and a ``$`` prompt dropped), but those a page shows failing (the block after theirs is the error) and
    the messages a command printed (``raysim bench sac: ...``)."""
    found = []
    for page in PAGES:
        text = page.read_text()
        blocks = list(FENCE.finditer(text))
        for block, after in zip_longest(blocks, blocks[1:]):
            if after is not None and after.group(1).startswith("raysim: error"):
                continue
            first = text.count("\n", 0, block.start(1)) + 1
            lines = block.group(1).replace("\\\n", " ").splitlines()
            for offset, line in enumerate(lines):
                line = line.strip().removeprefix("$ ")
                if not line.startswith("raysim ") or MESSAGE.match(line):
                    continue
                try:
                    argv = shlex.split(line, comments=True)
                except ValueError:  # an unbalanced quote: not a command, e.g. output
                    continue
                ends = [i for i, word in enumerate(argv) if word in SHELL_OPERATORS or word.startswith((">", "2>"))]
                found.append((f"{page.relative_to(ROOT)}:{first + offset}", argv[: min(ends, default=len(argv))]))
    return found


COMMANDS = shown_commands()


def test_the_docs_show_commands_so_this_test_sees_them():
    shown = {argv[1] for _, argv in COMMANDS if len(argv) > 1}
    assert {"train", "resume", "eval", "export", "plot", "config", "bench", "demos"} <= shown, shown


@pytest.mark.parametrize("where, argv", COMMANDS, ids=[where for where, _ in COMMANDS])
def test_a_shown_command_parses_and_its_config_loads(where, argv):
    if "--help" in argv or "-h" in argv:
        return
    args = build_parser().parse_args(argv[1:])  # a UsageError names what is wrong
    if args.command == "train" and (args.config is None or (PACKAGED_CONFIGS / f"{args.config}.yaml").is_file()):
        overrides = [o for o in args.overrides if not re.search(r"[A-Z_]{4,}", o)]  # placeholders stay unchecked
        raysim.load_config(args.config, overrides=overrides)


def test_a_checkpoint_a_shown_command_names_is_the_last_one_its_packaged_run_writes():
    """``runs/<config>/checkpoints/<i>`` is the default run directory of a packaged config: ``checkpoint.every`` and
    ``every_seconds`` decide its other checkpoints, and ``keep_last`` drops them, so only the last is certain."""
    wrong = []
    for where, argv in COMMANDS:
        for name, iteration in CHECKPOINT.findall(" ".join(argv)):
            if (PACKAGED_CONFIGS / f"{name}.yaml").is_file():
                last = planned_iterations(raysim.load_config(name))
                if int(iteration) != last:
                    wrong.append(f"{where}: runs/{name}/checkpoints/{iteration} (its last: {last})")
    assert not wrong, wrong


#: A benchmark's table of results, copied into the page that explains it (``raysim bench <name>`` writes the file).
RESULT_TABLES = {
    "docs/distillation.md": "benchmarks/results/distill.md",
    "docs/finetuning.md": "benchmarks/results/finetune.md",
}


def test_no_page_includes_a_file_and_the_copied_result_tables_are_the_benchmarks_own():
    including = [str(page.relative_to(ROOT)) for page in PAGES if "--8<--" in page.read_text()]
    assert not including, f"{including}: an include reads as a raw line on GitHub; copy the text instead"
    for page, table in RESULT_TABLES.items():
        assert (ROOT / table).read_text().strip() in (ROOT / page).read_text(), f"copy {table} into {page} again"
