"""The small text tables a user names (a zoo spec, a run or calibration CSV): read whole from a regular file of
at most 16 MiB, and refused in one line when they are not UTF-8 text or a well-formed CSV."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from wbfe.errors import CorruptCheckpointError, InvalidOptionError
from wbfe.sources._base import open_regular

__all__ = ["MAX_TABLE_BYTES", "read_table_text", "read_csv_table"]

MAX_TABLE_BYTES = 16 * 2**20  # a zoo table of thousands of models, or a run's metrics, is a few hundred KB

_EXTRA = "\x00extra"  # DictReader's key for cells beyond the header (a NUL is refused before the CSV is parsed)


def read_table_text(path: Path, what: str, table: str) -> str:
    """The text of the ``what`` (``"zoo spec"``) at ``path``, which should be ``table`` (``"a CSV table"``): a
    regular UTF-8 file of at most :data:`MAX_TABLE_BYTES` (a leading byte-order mark dropped: Excel writes one).

    Raises:
        SourceNotFoundError: the file does not exist or cannot be read.
        InvalidOptionError: not a regular file (a FIFO would block the read), too large, binary or not UTF-8.
    """
    try:
        with open_regular(path) as handle:
            raw = handle.read(MAX_TABLE_BYTES + 1)
    except CorruptCheckpointError as exc:  # not a regular file: its message speaks of checkpoints
        raise InvalidOptionError(f"{what} {path} is {exc.fields['kind']}, not a file", path=str(path)) from None
    if len(raw) > MAX_TABLE_BYTES:
        raise InvalidOptionError(f"{what} {path} is larger than {MAX_TABLE_BYTES // 2**20} MiB: not {table}",
                                 path=str(path))
    if b"\x00" in raw:
        raise InvalidOptionError(f"{what} {path} is a binary file, not {table}", path=str(path))
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InvalidOptionError(
            f"{what} {path} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
            "save it as UTF-8", path=str(path)) from None


def read_csv_table(path: Path, what: str, table: str = "a CSV table") -> tuple[list[str], list[dict[str, str]]]:
    """The header and the rows of the CSV ``what`` at ``path`` (read as :func:`read_table_text`), names and cells
    stripped of surrounding blanks, a missing cell as ``""``.

    Raises:
        SourceNotFoundError: the file does not exist or cannot be read.
        InvalidOptionError: as :func:`read_table_text`; a malformed CSV, a column named twice in the header, a row
            with more cells than the header.
    """
    reader = csv.DictReader(io.StringIO(read_table_text(path, what, table), newline=""), restkey=_EXTRA)
    try:
        fields = [name.strip() for name in reader.fieldnames or []]
        rows = list(reader)
    except csv.Error as exc:
        raise InvalidOptionError(f"{path}: not a valid CSV table ({exc})", path=str(path)) from None
    named = [name for name in fields if name]  # unnamed columns (a trailing comma in the header) are never read
    twice = sorted({name for name in named if named.count(name) > 1})
    if twice:  # the last of the two would win without a word
        raise InvalidOptionError(f"{path}: column {twice[0]!r} appears twice in the header", path=str(path))
    for number, row in enumerate(rows, start=2):
        if _EXTRA in row:
            raise InvalidOptionError(f"{path}: line {number} has more cells than the header", path=str(path))
    return fields, [{key.strip(): (value or "").strip() for key, value in row.items()} for row in rows]
