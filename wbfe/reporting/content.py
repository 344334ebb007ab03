"""The format-neutral document a report is: sections of paragraphs, key-value lists, tables and
figures. :mod:`~wbfe.reporting.page` renders it as HTML and :mod:`~wbfe.reporting.markdown` as
Markdown, so both formats hold the same content."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence, Union

__all__ = ["Column", "Table", "FigureBlock", "FigureGrid", "KeyValues", "Paragraph", "Section", "Report", "Block"]


@dataclass(frozen=True)
class Column:
    """One table column: ``key`` into the row dicts, its header ``label`` and a tooltip."""

    key: str
    label: str
    title: str = ""
    colour: Optional[str] = None
    extra: bool = False  # hidden until "all columns" is ticked (HTML); left out of Markdown


@dataclass
class Table:
    """Rows of raw values (numbers stay numbers: the page shows them rounded and keeps them exact)."""

    id: str
    columns: Sequence[Column]
    rows: Sequence[dict[str, Any]]
    caption: str = ""
    sortable: bool = True
    filterable: bool = False
    notes: Sequence[Optional[str]] = ()  # per row: why some of its cells are empty


@dataclass
class FigureBlock:
    """A matplotlib ``Figure`` (drawn on an Agg canvas) with its caption."""

    name: str
    figure: Any
    caption: str = ""
    alt: str = ""


@dataclass
class FigureGrid:
    """Small figures side by side (ESD thumbnails, scatter plots)."""

    figures: Sequence[FigureBlock]


@dataclass
class KeyValues:
    """A two-column list (provenance, options)."""

    items: Sequence[tuple[str, Any]]
    collapsed_title: str = ""  # non-empty: shown folded under this title


@dataclass
class Paragraph:
    text: str
    kind: str = ""  # "note" draws attention (missing ESDs, no head)


Block = Union[Paragraph, KeyValues, Table, FigureBlock, FigureGrid]


@dataclass
class Section:
    id: str
    title: str
    blocks: list[Block] = field(default_factory=list)


@dataclass
class Report:
    title: str
    subtitle: str
    sections: list[Section] = field(default_factory=list)
