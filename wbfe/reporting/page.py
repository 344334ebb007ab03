"""Render a :class:`~wbfe.reporting.content.Report` as one self-contained HTML page: inline CSS,
a small inline script (sorting and filtering tables), figures as data: URIs, and a
Content-Security-Policy that forbids the page any fetch, so it opens offline and leaks nothing."""

from __future__ import annotations

import base64
import html
from importlib import resources
from typing import Any, Callable

from wbfe import __version__
from wbfe.reporting.content import FigureBlock, FigureGrid, KeyValues, Paragraph, Report, Table
from wbfe.reporting.figures import render
from wbfe.render.text import is_number
from wbfe.reporting.text import display, visible

__all__ = ["render_html", "esc"]

_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"

# The page's style and script (sorting with nulls last, filtering, the column toggle, and a mark that the
# script ran, which the browser test reads) are package files, inlined so that the page fetches nothing.
_CSS = resources.files("wbfe.reporting").joinpath("page.css").read_text(encoding="utf-8")
_JS = resources.files("wbfe.reporting").joinpath("page.js").read_text(encoding="utf-8")


def esc(text: Any) -> str:
    """Text safe inside an element or a quoted attribute: markup escaped, control characters written
    out, and ``://`` broken with an entity so that no address in the provenance reads as a URL."""
    return html.escape(visible(text), quote=True).replace("://", "&#58;//")


def _figure(block: FigureBlock) -> str:
    data = base64.b64encode(render(block.figure, "svg")).decode("ascii")
    return (f'<figure id="fig-{esc(block.name)}"><img src="data:image/svg+xml;base64,{data}" alt="{esc(block.alt)}">'
            f"<figcaption>{esc(block.caption)}</figcaption></figure>")


def _kv_value(value: Any) -> str:
    if isinstance(value, dict):
        # One line: options and versions took a screen each, one key per line.
        return esc(display(value)) or "{}"
    if isinstance(value, (list, tuple)) and value and not all(is_number(v) for v in value):
        return "<br>".join(esc(display(v)) for v in value)
    return esc(display(value)) if value is not None else '<span class="null">null</span>'


def _kv(block: KeyValues) -> str:
    out = '<dl class="kv">' + "".join(f"<dt>{esc(k)}</dt><dd>{_kv_value(v)}</dd>" for k, v in block.items) + "</dl>"
    return f"<details><summary>{esc(block.collapsed_title)}</summary>{out}</details>" if block.collapsed_title else out


def _td(value: Any, extra: bool, wrap: bool) -> str:
    cls = ["extra"] if extra else []
    if value is None:
        return f'<td class="{" ".join(cls + ["null"])}" data-null="">–</td>'
    if is_number(value):
        return f'<td class="{" ".join(cls + ["num"])}" data-v="{value!r}">{esc(display(value))}</td>'
    if wrap:
        cls.append("wrap")
    attr = f' class="{" ".join(cls)}"' if cls else ""
    return f"<td{attr}>{esc(display(value))}</td>"


def _table(table: Table) -> str:
    has_extra = any(c.extra for c in table.columns)
    notes = list(table.notes) if table.notes else []
    head = []
    for c in table.columns:
        cls = (["extra"] if c.extra else []) + (["wrap"] if c.key == "meaning" else [])
        sw = f'<span class="sw" style="background:{esc(c.colour)}"></span>' if c.colour else ""
        head.append(f'<th{" class=" + chr(34) + " ".join(cls) + chr(34) if cls else ""} data-key="{esc(c.key)}"'
                    f' title="{esc(c.title)}">{sw}{esc(c.label)}</th>')
    if notes:
        head.append('<th data-key="note" title="why a cell is null, and fit notes">note</th>')
    body = []
    for k, row in enumerate(table.rows):
        note = notes[k] if k < len(notes) else None
        strings = [display(row.get(c.key)) for c in table.columns if isinstance(row.get(c.key), str)]
        search = " ".join(strings + ([note] if note else [])).lower()
        cells = [_td(row.get(c.key), c.extra, c.key == "meaning") for c in table.columns]
        if cells and row.get("_colour"):
            cells[0] = cells[0].replace(">", f'><span class="sw" style="background:{esc(row["_colour"])}"></span>', 1)
        if notes:
            cells.append(f'<td class="note">{esc(note) if note else ""}</td>')
        row_class = ' class="head"' if row.get("role") == "head" else ""
        body.append(f'<tr{row_class} data-search="{esc(search)}">{"".join(cells)}</tr>')
    classes = ["data"] + (["sortable"] if table.sortable else []) + (["hide-extra"] if has_extra else [])
    tools = []
    if table.filterable:
        tools += [f'<input type="search" class="filter" data-table="t-{esc(table.id)}" placeholder="filter rows…" '
                  'aria-label="filter rows">', f'<span id="t-{esc(table.id)}-count">{len(table.rows)} rows</span>']
    if has_extra:
        tools.append(f'<label><input type="checkbox" class="allcols" data-table="t-{esc(table.id)}"> all columns'
                     '</label>')
    if table.caption:
        tools.append(f"<span>{esc(table.caption)}</span>")
    return (f'<div class="tools">{"".join(tools)}</div>' if tools else "") + (
        f'<div class="tablebox"><table id="t-{esc(table.id)}" class="{" ".join(classes)}">'
        f'<thead><tr>{"".join(head)}</tr></thead><tbody>{"".join(body)}</tbody></table></div>')


# Each kind of block's HTML.
_BLOCKS: dict[type, Callable[[Any], str]] = {
    Paragraph: lambda p: f'<p class="{esc(p.kind)}">{esc(p.text)}</p>' if p.kind else f"<p>{esc(p.text)}</p>",
    KeyValues: _kv, Table: _table, FigureBlock: _figure,
    FigureGrid: lambda grid: '<div class="figs">' + "".join(_figure(f) for f in grid.figures) + "</div>",
}


def render_html(report: Report) -> str:
    """The page as one string (UTF-8 text, no external reference of any kind)."""
    nav = "".join(f'<a href="#{esc(s.id)}">{esc(s.title)}</a>' for s in report.sections)
    sections = "".join(
        f'<section id="{esc(s.id)}"><h2>{esc(s.title)}</h2>{"".join(_BLOCKS[type(b)](b) for b in s.blocks)}</section>'
        for s in report.sections)
    foot = f"Made by wbfe {__version__} (wbfe report). Self-contained: no network fetch."
    return ("<!DOCTYPE html>\n"
            f'<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(report.title)}</title><style>{_CSS}</style></head>"
            f"<body><header><h1>{esc(report.title)}</h1><p>{esc(report.subtitle)}</p></header>"
            f"<nav>{nav}</nav><main>{sections}</main><footer>{esc(foot)}</footer>"
            f"<script>{_JS}</script></body></html>\n")
