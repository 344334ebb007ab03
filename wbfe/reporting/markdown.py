"""Render a :class:`~wbfe.reporting.content.Report` as Markdown (GitHub / Hugging Face model cards)
with its figures as PNG files beside it."""

from __future__ import annotations

import html
import re
from typing import Any

from wbfe import __version__
from wbfe.reporting.content import FigureGrid, KeyValues, Paragraph, Report, Table
from wbfe.reporting.figures import render
from wbfe.reporting.text import display

__all__ = ["render_markdown", "md_text"]

_SPECIAL = re.compile(r"([\\`*_\[\]|#~])")


def md_text(text: Any) -> str:
    """Literal text: Markdown and HTML markup escaped, one line (tables cannot hold newlines)."""
    s = html.escape(display(text), quote=False)
    s = _SPECIAL.sub(r"\\\1", s)
    return s.replace("\r", " ").replace("\n", " ").replace("://", ":&#47;&#47;")


def _table(columns: list[tuple[str, str]], rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| " + " | ".join(md_text(label) for _, label in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    return lines + ["| " + " | ".join(md_text(row.get(key)) for key, _ in columns) + " |" for row in rows]


def render_markdown(report: Report) -> tuple[str, dict[str, bytes]]:
    """The Markdown text and ``{file name: PNG bytes}`` of its figures (linked by relative path)."""
    files: dict[str, bytes] = {}
    lines = [f"# {md_text(report.title)}", "", md_text(report.subtitle), ""]

    for section in report.sections:
        lines += [f"## {md_text(section.title)}", ""]
        for block in section.blocks:
            if isinstance(block, Paragraph):
                lines += [("> **Note:** " if block.kind == "note" else "") + md_text(block.text), ""]
            elif isinstance(block, KeyValues):
                table = _table([("k", "key"), ("v", "value")], [{"k": k, "v": v} for k, v in block.items]) + [""]
                if block.collapsed_title:
                    summary = f"<details><summary>{md_text(block.collapsed_title)}</summary>"
                    table = [summary, "", *table, "</details>", ""]
                lines += table
            elif isinstance(block, Table):
                columns = [(c.key, c.label) for c in block.columns if not c.extra]
                rows = [dict(r) for r in block.rows]
                if block.notes and any(block.notes):
                    columns.append(("_note", "note"))
                    for row, note in zip(rows, block.notes):
                        row["_note"] = note
                lines += _table(columns, rows) + [""]
            else:  # a figure, or a grid of them
                for fig in block.figures if isinstance(block, FigureGrid) else [block]:
                    files[f"{fig.name}.png"] = render(fig.figure, "png")
                    lines += [f"![{md_text(fig.alt)}]({fig.name}.png)", "", f"*{md_text(fig.caption)}*", ""]
    lines += ["---", "", f"Made by wbfe {__version__} (`wbfe report --format md`)."]
    return "\n".join(lines) + "\n", files
