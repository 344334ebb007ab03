"""The registries of checkpoint file formats, folder kinds and reference kinds ("locations"): each registers itself (as
timm's ``register_model`` does) with :func:`register_format`, :func:`register_folder` or :func:`register_location`, and
the lookups here replace if-chains in :func:`wbfe.sources.open_source` and :mod:`wbfe.sources.local`."""

from __future__ import annotations

import contextlib
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from wbfe.errors import CorruptCheckpointError, unknown_name
from wbfe.sources._base import TensorSource

__all__ = ["FileFormat", "Location", "FolderKind", "register_format", "register_location", "register_folder",
    "file_formats", "locations", "folder_kinds", "format_of", "format_named", "checkpoint_suffixes",
    "pick_files", "other_formats", "zip_members", "open_zip", "Opener", "ZIP_ERRORS"]

# Opens one file: (path, the reference as the user gave it, a provenance format label or None).
Opener = Callable[[Path, str, Optional[str]], TensorSource]
# Bytes read from the start of a file for the sniffers (every magic number registered fits).
HEAD_BYTES = 16
# How transformers' save_pretrained names a shard: model-00002-of-00003.safetensors
_SHARD_NAME = re.compile(r"-(\d+)-of-(\d+)\.[^/]+$")


@dataclass(frozen=True)
class FileFormat:
    """How wbfe recognises and opens one checkpoint file format.

    Attributes:
        suffixes: file name endings of its files (lower case; matched in any case).
        sniff: tells the format's files from their first :data:`HEAD_BYTES` bytes (and the path, for
            a zip's members); None for a format told only by its suffix.
        index_suffixes: endings of a shard index (a JSON file naming the shards), if it has one.
        named_suffixes: endings opened when the user names such a file, which do not mark one of its
            files in a folder (a PyTorch index ``weights.index.json``).
        preferred: the file name chosen first among several in a folder (``model.safetensors``).
        group: formats of one group compete in a folder (several files and no index is an error);
            groups are preferred by ``rank``, lower first.
        in_folder: whether a file named so counts in a folder listing (only a GGUF set's first split).
    """

    name: str
    suffixes: tuple[str, ...]
    open: Opener
    sniff: Optional[Callable[[bytes, Path], bool]] = None
    index_suffixes: tuple[str, ...] = ()
    named_suffixes: tuple[str, ...] = ()
    preferred: Optional[str] = None
    group: str = "other"
    rank: int = 50
    in_folder: Optional[Callable[[str], bool]] = None

    def lists(self, name: str) -> bool:
        """Whether ``name`` counts as this format's file (not index) in a folder."""
        return name.lower().endswith(self.suffixes) and (self.in_folder is None or self.in_folder(name))

    def holds(self, name: str) -> bool:
        """Whether ``name`` counts as this format's file or shard index in a folder."""
        return self.lists(name) or bool(self.index_suffixes) and name.lower().endswith(self.index_suffixes)


@dataclass(frozen=True)
class Location:
    """A kind of reference, tried by ascending ``order``: the first whose ``claims(ref)`` holds opens it;
    ``streams``: it reads remote files and takes ``open(ref, stream=...)``."""

    name: str
    order: int
    claims: Callable[[Any], bool]
    open: Callable[..., TensorSource]
    streams: bool = False


@dataclass(frozen=True)
class FolderKind:
    """A folder that is a checkpoint of its own kind: ``claims(folder)``, ``open(folder, ref)``."""

    name: str
    claims: Callable[[Path], bool]
    open: Callable[[Path, str], TensorSource]


_FORMATS: dict[str, FileFormat] = {}
_LOCATIONS: dict[str, Location] = {}
_FOLDERS: dict[str, FolderKind] = {}


def register_format(fmt: FileFormat) -> FileFormat:
    """Add ``fmt`` to the table of file formats (replacing one of the same name); returns ``fmt``."""
    _FORMATS[fmt.name] = fmt
    return fmt


def register_location(name: str, *, order: int, claims: Callable[[Any], bool],
                      streams: bool = False) -> Callable[[Any], Any]:
    """Decorator: register the decorated opener of the references ``claims`` accepts (see :class:`Location`)."""

    def wrap(opener: Callable[..., TensorSource]) -> Callable[..., TensorSource]:
        _LOCATIONS[name] = Location(name, order, claims, opener, streams)
        return opener

    return wrap


def register_folder(name: str, *, claims: Callable[[Path], bool]) -> Callable[[Any], Any]:
    """Decorator: register the decorated ``open(folder, ref)`` for folders that ``claims`` accepts."""

    def wrap(opener: Callable[[Path, str], TensorSource]) -> Callable[[Path, str], TensorSource]:
        _FOLDERS[name] = FolderKind(name, claims, opener)
        return opener

    return wrap


def file_formats() -> list[FileFormat]:
    """The registered file formats, by folder preference (rank), then registration order (a stable sort)."""
    return sorted(_FORMATS.values(), key=lambda f: f.rank)


def format_named(name: str) -> FileFormat:
    """The registered format called ``name`` (``UnknownNameError`` if none)."""
    if name not in _FORMATS:
        raise unknown_name("checkpoint format", name, list(_FORMATS))
    return _FORMATS[name]


def locations() -> list[Location]:
    return sorted(_LOCATIONS.values(), key=lambda loc: loc.order)


def folder_kinds() -> list[FolderKind]:
    return list(_FOLDERS.values())


def checkpoint_suffixes() -> tuple[str, ...]:
    """Every suffix a checkpoint file of a registered format may have (shard indexes excluded)."""
    return tuple(dict.fromkeys(s for fmt in file_formats() for s in fmt.suffixes))


# What Python's zipfile raises on a damaged archive (found by fuzzing the readers): an unimplemented
# version, an encrypted flag, a non-UTF-8 name, a header cut short, a bad deflate stream, a seek before
# the start. A reader catches these after re-raising its own WbfeErrors (some are ValueErrors or OSErrors).
ZIP_ERRORS: tuple[type[BaseException], ...] = (
    zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError, ValueError, EOFError, struct.error,
    zlib.error, OSError)


def open_zip(path: Path, fh: Any, what: str) -> zipfile.ZipFile:
    """The zip archive in ``fh``; a damaged one is a ``CorruptCheckpointError`` naming ``what`` it should be."""
    try:
        return zipfile.ZipFile(fh)
    except ZIP_ERRORS as exc:
        raise CorruptCheckpointError.at(
            path, f"not a readable {what} (a damaged zip: {exc.__class__.__name__})") from None


def zip_members(path: Path) -> set[str]:
    """The member names of the zip archive ``path`` (empty when it is none or cannot be read)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return set(archive.namelist())
    except ZIP_ERRORS:
        return set()


def format_of(path: Path) -> Optional[FileFormat]:
    """The format that reads ``path``: the first whose sniffer recognises its first bytes, else the one
    with the longest suffix the name ends with; None when no format takes it."""
    formats = file_formats()
    name = path.name.lower()
    matched = [(len(suffix), fmt, suffix in fmt.index_suffixes) for fmt in formats
               for suffix in fmt.suffixes + fmt.index_suffixes + fmt.named_suffixes if name.endswith(suffix)]
    _, best, index = max(matched, key=lambda m: m[0], default=(0, None, False))  # the first of the longest
    if index:  # a shard index is JSON: bytes that look like another format do not make it one (found by fuzzing)
        return best
    head = b""
    if path.is_file():
        with contextlib.suppress(OSError), open(path, "rb") as fh:
            head = fh.read(HEAD_BYTES)
    return next((fmt for fmt in formats if fmt.sniff is not None and head and fmt.sniff(head, path)), best)


def pick_files(names: Iterable[str], where: object = None) -> list[str]:
    """``[index]`` or ``[file]``: which of a folder's top-level files hold the weights (``[]``: none); errors name
    the folder ``where`` (a path, a URI, a hub id) when given.

    Groups are tried by rank; within one, the ``preferred`` file wins (transformers loads ``model.safetensors``
    before ``model.safetensors.index.json`` when both are there), then a single shard index, then a single file
    of the group's formats.

    Raises:
        CorruptCheckpointError: several files of the first group that has any, and no single index; or one shard
            of several (``model-00001-of-00002.safetensors``) without its index.
    """
    top = sorted(n for n in names if "/" not in n)
    groups: dict[str, list[FileFormat]] = {}
    for fmt in file_formats():
        groups.setdefault(fmt.group, []).append(fmt)
    for group, members in groups.items():
        index_suffixes = tuple(s for f in members for s in f.index_suffixes)
        preferred = [f.preferred for f in members if f.preferred in top]
        if preferred:
            return [str(preferred[0])]
        indexes = [n for n in top if index_suffixes and n.lower().endswith(index_suffixes)]
        if len(indexes) == 1:
            return indexes
        files = [n for n in top if any(f.lists(n) for f in members)]
        shard = _SHARD_NAME.search(files[0]) if len(files) == 1 and index_suffixes else None
        if shard is not None and int(shard.group(2)) > 1:  # the rest of the checkpoint is not there
            raise _refused(
                where, f"{files[0]} is shard {int(shard.group(1))} of {int(shard.group(2))} and no shard index is beside it "
                "(a partial download?); name the file to score that shard alone")
        if len(files) == 1:
            return files
        if len(files) > 1 or len(indexes) > 1:
            found = indexes or files
            listed = ", ".join(found[:4])
            raise _refused(
                where, f"several {group} weight files and no single index ({listed}, ...); pass one file explicitly"
                if index_suffixes else
                f"several weight files ({listed}{', ...' if len(found) > 4 else ''}); pass one file explicitly")
    return []


def _refused(where: object, why: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(why) if where is None else CorruptCheckpointError.at(where, why)


def other_formats(names: Iterable[str], chosen: str) -> list[str]:
    """The top-level files in ``names`` that are checkpoints of another group of formats than ``chosen``."""
    formats = file_formats()
    own = {f.group for f in formats if f.holds(chosen)}
    return sorted(n for n in names if "/" not in n and n != chosen
                  and any(f.holds(n) and f.group not in own for f in formats))

