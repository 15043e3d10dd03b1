"""The config reference: every key with its type, default, allowed values and meaning, from the schema.

``raysim config`` prints it; the docs' config reference page is this text (``--markdown``), checked
against it by a test, so neither can drift from what the loader accepts.
"""

from __future__ import annotations

from raysim.algos import BC, GRPO, PPO, SAC, Distill
from raysim.config import Config
from raysim.envs.atari import AtariPreset
from raysim.schema import reference

HEADER = ("key", "type", "default", "allowed", "meaning")


def sections() -> list[tuple[str, list[tuple[str, str, str, str, str]]]]:
    """``(title, rows)``: the run's sections (after ``env``, the Atari preset's options), then each packaged
    algorithm's ``algo`` section."""
    rows = reference(Config)
    titled = [("run", [r for r in rows if "." not in r[0]])]
    for section in ("env", "shards", "servers", "model", "learner", "train", "eval", "checkpoint", "replay"):
        titled.append((section, [r for r in rows if r[0].startswith(f"{section}.")]))
        if section == "env":
            titled.append(
                ("env.kwargs.atari (the Atari preset of gym: Atari ids)", reference(AtariPreset, "env.kwargs.atari."))
            )
    for algorithm in (PPO, GRPO, BC, Distill, SAC):
        titled.append((f"algo ({algorithm.name})", reference(algorithm.Config, "algo.")))
    return titled


def markdown_cell(text: str) -> str:
    """``text`` as one Markdown table cell: ``|`` escaped, ``<`` as an entity (``runs/<name>`` is no HTML tag)."""
    return text.replace("|", "\\|").replace("<", "&lt;")


def config_reference(prefix: str = "", markdown: bool = False) -> str:
    """The reference of the keys that start with ``prefix``: aligned text, or Markdown tables."""
    out = []
    for title, rows in sections():
        rows = [r for r in rows if r[0].startswith(prefix)]
        if not rows:
            continue
        if markdown:
            out += [f"**{title}**", "", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
            out += ["| " + " | ".join(markdown_cell(cell) for cell in row) + " |" for row in rows]
        else:
            widths = [max(len(r[i]) for r in [HEADER, *rows]) for i in range(4)]
            out += [f"[{title}]"]
            out += [
                "  " + "  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4]
                for row in rows
            ]
        out.append("")
    return "\n".join(out).rstrip() + "\n"
