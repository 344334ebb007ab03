"""Render a :class:`~wbfe.reporting.content.Report` as one self-contained HTML page: inline CSS,
a small inline script (sorting and filtering tables), figures as data: URIs, and a
Content-Security-Policy that forbids the page any fetch, so it opens offline and leaks nothing."""

from __future__ import annotations

import base64
import html
from typing import Any

from wbfe.reporting.content import Block, FigureBlock, FigureGrid, KeyValues, Paragraph, Report, Table
from wbfe.reporting.figures import render
from wbfe.reporting.text import display, is_number, visible

__all__ = ["render_html", "esc"]

_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"

_CSS = """
:root{--fg:#1b1f24;--mute:#57606a;--line:#d0d7de;--bg:#fff;--alt:#f6f8fa;--note:#fff8c5}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--fg);background:var(--bg)}
header{padding:18px 28px 10px;border-bottom:1px solid var(--line);background:var(--alt)}
header h1{margin:0 0 4px;font-size:20px;word-break:break-all}
header p{margin:0;color:var(--mute)}
nav{padding:6px 28px;border-bottom:1px solid var(--line);font-size:13px}
nav a{margin-right:14px;color:#0969da;text-decoration:none}
main{padding:6px 28px 40px;max-width:1500px}
section{margin-top:22px}
h2{font-size:17px;border-bottom:1px solid var(--line);padding-bottom:4px}
p.note{background:var(--note);border:1px solid #d4a72c;padding:6px 10px;border-radius:4px}
dl.kv{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:6px 0}
dl.kv dt{color:var(--mute)} dl.kv dd{margin:0;overflow-wrap:anywhere;font-family:ui-monospace,"DejaVu Sans Mono",monospace;font-size:12.5px}
details{margin:8px 0} summary{cursor:pointer;color:var(--mute)}
.tools{display:flex;gap:14px;align-items:center;margin:6px 0;font-size:13px;color:var(--mute)}
.tools>*{flex:none}.tools>span:last-child{flex:1 1 auto}
.tools input[type=search]{width:22em;padding:3px 6px;border:1px solid var(--line);border-radius:4px}
.tablebox{overflow-x:auto;max-height:80vh;border:1px solid var(--line);border-radius:4px}
table.data{border-collapse:collapse;font-size:12.5px;white-space:nowrap}
table.data th,table.data td{padding:3px 8px;border-bottom:1px solid #eaeef2;text-align:left}
table.data td.num{text-align:right;font-variant-numeric:tabular-nums}
table.data td.wrap,table.data th.wrap{white-space:normal;min-width:18em}
table.data thead th{position:sticky;top:0;background:var(--alt);border-bottom:1px solid var(--line);z-index:1}
table.sortable thead th{cursor:pointer;user-select:none}
table.sortable thead th[aria-sort=ascending]::after{content:" \\25B2";font-size:10px}
table.sortable thead th[aria-sort=descending]::after{content:" \\25BC";font-size:10px}
table.data tbody tr:nth-child(even){background:#fbfcfd}
table.data tbody tr:hover{background:#eef6ff}
table.data tr.head{font-weight:600}
table.data td.null{color:#b0b7bf}
table.hide-extra .extra{display:none}
td.note{color:var(--mute);white-space:normal;min-width:30em;max-width:60em;font-size:12px}
.sw{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:5px;vertical-align:-1px}
.figs{display:flex;flex-wrap:wrap;gap:14px}
figure{margin:8px 0} .figs figure{width:360px}
figure img{max-width:100%;height:auto;border:1px solid #eaeef2}
figcaption{font-size:12px;color:var(--mute);word-break:break-word}
footer{padding:10px 28px;color:var(--mute);font-size:12px;border-top:1px solid var(--line)}
"""

# Sorting (nulls last either way), filtering and the column toggle; then a mark that the script ran,
# which the browser test reads.
_JS = """
(function(){
  "use strict";
  function cell(tr,i){return tr.cells[i];}
  function key(td){
    if(td.hasAttribute("data-null")) return null;
    var v=td.getAttribute("data-v");
    if(v!==null){var n=Number(v); return isNaN(n)?v:n;}
    return td.textContent.toLowerCase();
  }
  function compare(a,b,dir){
    if(a===null&&b===null) return 0; if(a===null) return 1; if(b===null) return -1;
    if(typeof a===typeof b) return (a<b?-1:a>b?1:0)*dir;
    return (typeof a==="number"?-1:1)*dir;
  }
  function sortTable(table,i){
    var th=table.tHead.rows[0].cells[i];
    var dir=th.getAttribute("aria-sort")==="ascending"?-1:1;
    Array.prototype.forEach.call(table.tHead.rows[0].cells,function(h){h.setAttribute("aria-sort","none");});
    th.setAttribute("aria-sort",dir===1?"ascending":"descending");
    var body=table.tBodies[0];
    var rows=Array.prototype.map.call(body.rows,function(tr,k){return [key(cell(tr,i)),k,tr];});
    rows.sort(function(x,y){return compare(x[0],y[0],dir)||x[1]-y[1];});
    rows.forEach(function(r){body.appendChild(r[2]);});
  }
  function filterTable(table,text,count){
    var q=text.trim().toLowerCase(), shown=0, rows=table.tBodies[0].rows;
    for(var k=0;k<rows.length;k++){
      var hit=q===""||(rows[k].getAttribute("data-search")||"").indexOf(q)>=0;
      rows[k].hidden=!hit; if(hit) shown++;
    }
    if(count) count.textContent=shown+" of "+rows.length+" rows";
  }
  document.querySelectorAll("table.sortable").forEach(function(table){
    Array.prototype.forEach.call(table.tHead.rows[0].cells,function(th,i){
      th.tabIndex=0; th.setAttribute("aria-sort","none");
      th.addEventListener("click",function(){sortTable(table,i);});
      th.addEventListener("keydown",function(e){if(e.key==="Enter"){sortTable(table,i);}});
    });
  });
  document.querySelectorAll("input.filter").forEach(function(input){
    var table=document.getElementById(input.getAttribute("data-table"));
    var count=document.getElementById(input.getAttribute("data-table")+"-count");
    input.addEventListener("input",function(){filterTable(table,input.value,count);});
    filterTable(table,input.value,count);
  });
  document.querySelectorAll("input.allcols").forEach(function(box){
    var table=document.getElementById(box.getAttribute("data-table"));
    box.addEventListener("change",function(){table.classList.toggle("hide-extra",!box.checked);});
  });
  document.documentElement.setAttribute("data-wbfe-ready",String(document.querySelectorAll("table.sortable").length));
})();
"""


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
    body = "".join(f"<dt>{esc(k)}</dt><dd>{_kv_value(v)}</dd>" for k, v in block.items)
    out = f'<dl class="kv">{body}</dl>'
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
        tools.append(f'<input type="search" class="filter" data-table="t-{esc(table.id)}" '
                     f'placeholder="filter rows…" aria-label="filter rows">')
        tools.append(f'<span id="t-{esc(table.id)}-count">{len(table.rows)} rows</span>')
    if has_extra:
        tools.append(f'<label><input type="checkbox" class="allcols" data-table="t-{esc(table.id)}"> all columns</label>')
    if table.caption:
        tools.append(f"<span>{esc(table.caption)}</span>")
    return (f'<div class="tools">{"".join(tools)}</div>' if tools else "") + (
        f'<div class="tablebox"><table id="t-{esc(table.id)}" class="{" ".join(classes)}">'
        f'<thead><tr>{"".join(head)}</tr></thead><tbody>{"".join(body)}</tbody></table></div>')


def _block(block: Block) -> str:
    if isinstance(block, Paragraph):
        return f'<p class="{esc(block.kind)}">{esc(block.text)}</p>' if block.kind else f"<p>{esc(block.text)}</p>"
    if isinstance(block, KeyValues):
        return _kv(block)
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, FigureBlock):
        return _figure(block)
    if isinstance(block, FigureGrid):
        return '<div class="figs">' + "".join(_figure(f) for f in block.figures) + "</div>"
    raise TypeError(f"unknown block {type(block).__name__}")  # pragma: no cover


def render_html(report: Report) -> str:
    """The page as one string (UTF-8 text, no external reference of any kind)."""
    nav = "".join(f'<a href="#{esc(s.id)}">{esc(s.title)}</a>' for s in report.sections)
    sections = "".join(
        f'<section id="{esc(s.id)}"><h2>{esc(s.title)}</h2>{"".join(_block(b) for b in s.blocks)}</section>'
        for s in report.sections)
    from wbfe import __version__

    foot = f"Made by wbfe {__version__} (wbfe report). Self-contained: no network fetch."
    return ("<!DOCTYPE html>\n"
            f'<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(report.title)}</title><style>{_CSS}</style></head>"
            f"<body><header><h1>{esc(report.title)}</h1><p>{esc(report.subtitle)}</p></header>"
            f"<nav>{nav}</nav><main>{sections}</main><footer>{esc(foot)}</footer>"
            f"<script>{_JS}</script></body></html>\n")
