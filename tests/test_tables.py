"""The one reader of a user's CSV table (wbfe.sources.tables), through both of its callers: a zoo spec
(wbfe.ranking.zoo) and a watch's calibration or run CSV (wbfe.watch.runs). The watch's own reader had no size
bound, opened a FIFO's path with open() (or called it "no such file") and accepted nothing the zoo refused;
the zoo's took the last of two columns of one name without a word."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pytest

from wbfe.errors import InvalidOptionError, SourceNotFoundError
from wbfe.ranking.zoo import read_zoo_file
from wbfe.sources._base import open_regular
from wbfe.sources.tables import MAX_TABLE_BYTES
from wbfe.watch import read_runs_csv
from wbfe.watch.runs import discover_run, read_csv

# (caller, file name, how it names the file, what the file should be)
CALLERS: dict[str, tuple[Callable[[Path], object], str, str, str]] = {
    "zoo": (read_zoo_file, "zoo.csv", "zoo spec", "a CSV or YAML table"),
    "watch": (read_runs_csv, "runs.csv", "runs CSV", "a CSV table"),
}

LARGE = b"model,run\n" + b"a,b\n" * (MAX_TABLE_BYTES // 4)  # every line well-formed: only the size is wrong

CASES: dict[str, tuple[object, str]] = {
    "latin-1 byte": (b"model,run\ncaf\xe9,1\n",
                     "{what} {p} is not UTF-8 text (byte 0xe9 at offset 13); save it as UTF-8"),
    "binary": (b"model,run\na,\x00\n", "{what} {p} is a binary file, not {table}"),
    "larger than the bound": (LARGE, "{what} {p} is larger than 16 MiB: not {table}"),
    "a FIFO": (os.mkfifo, "{what} {p} is a FIFO, not a file"),
    "a folder": (Path.mkdir, "{what} {p} is a folder, not a file"),
    "more cells than the header": (b"model,run\na,1,2\n", "{p}: line 2 has more cells than the header"),
    "a column twice": (b"model,run, run\na,1,2\n", "{p}: column 'run' appears twice in the header"),
    "a field past csv's limit": (b"model,run\na," + b"x" * 200_000 + b"\n",
                                 "{p}: not a valid CSV table (field larger than field limit (131072))"),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("caller", CALLERS)
def test_a_bad_table_is_refused_in_one_line_by_both_callers(tmp_path: Path, caller: str, case: str) -> None:
    read, name, what, table = CALLERS[caller]
    content, message = CASES[case]
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        content(path)  # type: ignore[operator]
    with pytest.raises(InvalidOptionError) as info:
        read(path)
    assert str(info.value) == message.format(what=what, p=path, table=table)


@pytest.mark.parametrize("caller", CALLERS)
def test_a_fifo_removed_once_refused_is_still_named_a_fifo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           caller: str) -> None:
    """What the file is comes from the one look that refused it: a second stat of a path removed in between raised
    a bare FileNotFoundError."""
    from wbfe.sources import tables

    read, name, what, _ = CALLERS[caller]
    path = tmp_path / name
    os.mkfifo(path)

    def open_then_remove(p: Path) -> object:
        try:
            return open_regular(p)
        finally:
            p.unlink()

    monkeypatch.setattr(tables, "open_regular", open_then_remove)
    with pytest.raises(InvalidOptionError) as info:
        read(path)
    assert str(info.value) == f"{what} {path} is a FIFO, not a file"


def test_a_metrics_csv_past_the_bound_is_refused(tmp_path: Path) -> None:
    """A run folder's metrics.csv is read by the same reader (it was read whole, whatever its size)."""
    for step in (1, 2):
        (tmp_path / f"epoch_{step}.safetensors").write_bytes(b"")
    (tmp_path / "metrics.csv").write_bytes(b"step,test_loss\n" + b"1,0.5\n" * (MAX_TABLE_BYTES // 6 + 1))
    with pytest.raises(InvalidOptionError) as info:
        discover_run(tmp_path)
    assert str(info.value) == f"run CSV {tmp_path / 'metrics.csv'} is larger than 16 MiB: not a CSV table"


def test_a_missing_table_is_not_found_by_both_callers(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFoundError, match="zoo spec not found"):
        read_zoo_file(tmp_path / "zoo.csv")
    with pytest.raises(SourceNotFoundError) as info:
        read_runs_csv(tmp_path / "runs.csv")
    assert str(info.value) == f"no such file or folder: {tmp_path / 'runs.csv'}"


def test_a_byte_order_mark_and_blanks_are_dropped_by_both_callers(tmp_path: Path) -> None:
    """Excel's "CSV UTF-8" starts with a byte-order mark: the first column is still found by its name."""
    path = tmp_path / "table.csv"
    path.write_bytes("\ufeffmodel , run,acc\n a.pt , r1 ,0.5\nb.pt,r2\n".encode())
    assert read_csv(path, required="model", kind="runs") == [{"model": "a.pt", "run": "r1", "acc": "0.5"},
                                                             {"model": "b.pt", "run": "r2", "acc": ""}]
    zoo = read_zoo_file(path)
    assert [(e.name, e.quality["acc"]) for e in zoo.entries][0] == ("a.pt", 0.5)
    assert zoo.quality_columns == ("acc",)


def test_an_unnamed_trailing_column_is_not_a_column_twice(tmp_path: Path) -> None:
    """Spreadsheets save trailing empty columns as a header of trailing commas; no column of that name is read."""
    path = tmp_path / "table.csv"
    path.write_bytes(b"model,run,acc,,\na.pt,r1,0.5,,\n")
    assert read_csv(path, required="run", kind="runs") == [{"model": "a.pt", "run": "r1", "acc": "0.5", "": ""}]
    assert read_zoo_file(path).quality_columns == ("acc",)
