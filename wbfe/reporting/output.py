"""Read a saved score or rank JSON, and write a report as one HTML file or a Markdown folder."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Optional, Union

from wbfe.errors import CorruptCheckpointError, OutputError, printable
from wbfe.options import ReportOptions
from wbfe.render.files import check_output, check_output_dir, is_devnull, write_atomic, write_output

__all__ = ["load_saved", "write_report", "check_report_output", "write_esd", "check_esd_output", "MARKDOWN_NAME"]

MARKDOWN_NAME = "report.md"
# The top-level fields of each saved JSON, with their types (the first kind whose fields are all there wins).
_FIELDS: dict[str, dict[str, type]] = {
    "score": {"layers": list, "summary": dict, "model": dict, "skipped": list},
    "rank": {"zoo": object, "quality": object, "metrics": list, "models": list, "failed": object},
    "compare": {"layers": list, "summary": dict, "model_a": dict, "model_b": dict, "unmatched": list, "skipped": list},
}


def load_saved(path: Union[str, Path]) -> Optional[tuple[str, dict[str, Any]]]:
    """``("score", data)``, ``("rank", data)`` or ``("compare", data)`` when ``path`` is a ``.json`` file
    that ``wbfe score``, ``wbfe rank`` or ``wbfe compare`` wrote; None when it is not a JSON file at
    all (it may be a checkpoint reference).

    Raises:
        CorruptCheckpointError: a ``.json`` file that does not parse, or is neither kind.
    """
    p = Path(path)
    if p.suffix.lower() != ".json" or not p.is_file():
        return None
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptCheckpointError(f"{p}: not valid JSON ({exc})") from None
    kinds = [kind for kind, fields in _FIELDS.items() if isinstance(data, dict) and fields.keys() <= data.keys()]
    if len(kinds) > 1:  # an edited or merged file: which one it is would be decided by the order of a table
        raise CorruptCheckpointError(f"{p}: holds the fields of a {' and a '.join(kinds)} JSON; wbfe writes one kind "
                                     "a file")
    for kind in kinds:
        if not (all(isinstance(data[k], t) for k, t in _FIELDS[kind].items()) and _rows_ok(kind, data)):
            raise CorruptCheckpointError(f"{p}: malformed wbfe JSON (a field has the wrong type)")
        return kind, data
    raise CorruptCheckpointError(f"{p}: neither a score, a rank nor a compare JSON (wbfe score / rank / compare "
                                 "--format json)")


def _rows_ok(kind: str, data: dict[str, Any]) -> bool:
    if kind == "rank":
        return (all(isinstance(m, dict) and "metric" in m for m in data["metrics"])
                and all(isinstance(m, dict) and isinstance(m.get("scores"), dict) for m in data["models"]))
    return all(isinstance(x, dict) and isinstance(x.get("name"), str) for x in data["layers"])


def check_report_output(output: Union[str, Path], fmt: str, *, reads: Iterable[Union[str, Path]] = ()) -> None:
    """Refuse, before any work, an output the report cannot be written to (HTML: a file or ``-``; Markdown: a
    folder), or one over or inside what the report ``reads``.

    Raises:
        OutputError: as :func:`wbfe.render.files.check_output` / :func:`~wbfe.render.files.check_output_dir`,
            an HTML page named for another format (x.md), or a Markdown folder named as a file (x.html).
        InvalidOptionError: an unknown format.
    """
    ReportOptions(fmt=fmt)  # type: ignore[arg-type]  # checks only
    if fmt == "md":  # a folder named as a file (x.html) is refused there
        check_output_dir(output, reads=reads)
        return
    name = os.fspath(output)
    if (check_output(output, reads=reads) is not None and name != os.devnull
            and Path(name).suffix.lower() not in (".html", ".htm")):  # the page was written into x.md or x.png
        raise OutputError(f"--format html writes one HTML page: name the output *.html, not {name} "
                          "(--format md writes a folder)", path=name)


def write_report(report: Any, output: Union[str, Path], *, fmt: str = "html",
                 reads: Iterable[Union[str, Path]] = ()) -> list[Path]:
    """Write ``report`` as one HTML file at ``output`` (``-``: standard output), or (``fmt="md"``) into the folder
    ``output`` as ``report.md`` and its PNG figures, all rendered before anything is written; returns the files
    written. ``reads``: what the report was made from, which no output may overwrite or lie inside."""
    reads = list(reads)
    check_report_output(output, fmt, reads=reads)
    if fmt == "html":
        from wbfe.reporting.page import render_html

        written = write_output(output, render_html(report), reads=reads)
        return [written] if written is not None else []
    from wbfe.reporting.markdown import render_markdown

    text, figures = render_markdown(report)
    folder = check_output_dir(output, reads=reads)
    files = [write_atomic(folder / name, data, reads=reads) for name, data in figures.items()]
    return [write_atomic(folder / MARKDOWN_NAME, text, reads=reads)] + files


def check_esd_output(output: Union[str, Path], *, reads: Iterable[Union[str, Path]] = ()) -> Path:
    """The PNG file an ESD is written to, checked before any work: a ``*.png`` file or the null device, never over
    or inside ``reads``.

    Raises:
        OutputError: as :func:`wbfe.render.files.check_output`, a stream, or another name (a PNG in x.txt).
    """
    written = check_output(output, reads=reads)
    shown = printable(os.fspath(output))  # a control character in the name is written out, not obeyed
    if written is None:
        raise OutputError(f"wbfe esd writes a PNG file; give --output a file name, not {shown}", path=str(output))
    if written.suffix.lower() != ".png" and not (written.exists() and is_devnull(written.stat())):  # not a PNG's name
        raise OutputError(f"wbfe esd writes a PNG file: name the output *.png, not {shown}", path=str(output))
    return written


def write_esd(eigs: Any, fits: Any, output: Union[str, Path], *, title: str = "", bins: int = 60,
              scale_exp2: int = 0, reads: Iterable[Union[str, Path]] = ()) -> Path:
    """Draw the ESD of ``eigs`` with ``fits`` (:func:`wbfe.reporting.plots.esd.fit_esd`) into the PNG ``output``
    (:func:`wbfe.reporting.plots.esd.plot_esd`), checked first (:func:`check_esd_output`); returns the file."""
    from wbfe.reporting.plots.esd import plot_esd

    check_esd_output(output, reads=reads)
    return plot_esd(eigs, fits, Path(output), title=title, bins=bins, scale_exp2=scale_exp2)
