"""Every error a user can cause, in one place: each a :class:`WbfeError` and, where one fits, the
matching built-in; one-line messages, structured fields (``ref``, ``path``...) kept on the instance.
"""

from __future__ import annotations

import re
from typing import Iterable, TypeVar

__all__ = [
    "printable", "clip", "WbfeError", "SourceNotFoundError", "ModelNotFoundError", "CorruptCheckpointError",
    "TruncatedCheckpointError", "RemoteReadError", "RemoteChangedError", "RangeNotSupportedError", "UnsafePickleError",
    "UnsupportedDtypeError", "NoUsableMatrixError", "InvalidOptionError", "UnknownNameError", "MissingDependencyError",
    "NothingRankedError", "OutputError", "OverwriteError", "did_you_mean", "unknown_name", "hub_name_hint",
]


def printable(text: str) -> str:
    """``text`` with control and bidirectional-override characters written as escapes (``\\x1b``): a
    checkpoint's names go to a terminal, where an escape sequence could move the cursor or hide text."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode("ascii") for ch in text)


def clip(text: str, limit: int) -> str:
    """``text`` on one line, cut to at most ``limit`` characters at a word boundary, with "…" where cut.

    Example:
        >>> clip("unpack_from requires a buffer of at least 4 bytes (actual 2)", 40)
        'unpack_from requires a buffer of at…'
    """
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0] if " " in text[:limit] else text[:limit - 1]
    return cut.rstrip(" ,;:(") + "…"


_E = TypeVar("_E", bound="WbfeError")


class WbfeError(Exception):
    """Base class of every error wbfe raises on purpose."""

    def __init__(self, message: str, **fields: object) -> None:
        # One line, as the CLI prints it; control characters (a tensor name's) escaped, never sent to a terminal.
        super().__init__(printable(" ".join(str(message).split())))
        self.fields = fields
        for key, value in fields.items():
            setattr(self, key, value)

    @classmethod
    def at(cls: type[_E], path: object, why: str, **fields: object) -> _E:
        """The error ``"<path>: <why>"`` about one file or URL, with ``path`` kept (as text) on the instance."""
        return cls(f"{path}: {why}", path=str(path), **fields)


class SourceNotFoundError(WbfeError, FileNotFoundError):
    """A path does not exist, or a folder holds no weights wbfe can read."""


class ModelNotFoundError(WbfeError, LookupError):
    """A hub id or timm name that cannot be resolved (unknown, not cached while offline, no weights)."""


class CorruptCheckpointError(WbfeError, ValueError):
    """A checkpoint file that cannot be parsed: bad header, bad archive, inconsistent index."""


class TruncatedCheckpointError(CorruptCheckpointError):
    """A checkpoint file or shard that is shorter than its header says."""


class RemoteReadError(SourceNotFoundError):
    """A remote file that cannot be read: refused (404, 401), no range requests, or retries spent."""


class RangeNotSupportedError(RemoteReadError):
    """A server that ignores HTTP range requests: the file can be downloaded, not streamed."""


class RemoteChangedError(CorruptCheckpointError):
    """A remote file that changed while it was read (another ETag or commit): its bytes are never mixed."""


class UnsafePickleError(WbfeError, ValueError):
    """A PyTorch pickle that would need to import or run code to load; it is never executed."""


class UnsupportedDtypeError(WbfeError, TypeError):
    """A tensor dtype wbfe cannot turn into a real matrix."""


class NoUsableMatrixError(WbfeError, ValueError):
    """A checkpoint in which every weight matrix was skipped (non-finite, all zero, too small, ...)."""


class InvalidOptionError(WbfeError, ValueError):
    """An option value outside its allowed set or range."""


class UnknownNameError(InvalidOptionError, KeyError):
    """A name looked up in a registry (metric group, zoo, activation, ...) that is not there."""

    def __str__(self) -> str:  # KeyError would quote the message
        return Exception.__str__(self)


class NothingRankedError(WbfeError, ValueError):
    """A ranking in which no model could be scored, so no metric was ranked (``result`` holds the failures)."""


class OutputError(InvalidOptionError):
    """An output path that cannot be written: not a regular file, a folder, unwritable, or empty."""


class OverwriteError(OutputError):
    """An output that is, or lies inside, what the command reads (``path``: the output, ``input``: what
    it would overwrite or write into)."""


class MissingDependencyError(WbfeError, ImportError):
    """An optional package needed for the requested feature is not installed."""


_LISTED = 10  # known names shown in full; a registry of thousands (timm) must not fill the terminal


def did_you_mean(name: str, known: "Iterable[str]") -> str:
    """``"; did you mean 'a', 'b'?"`` with up to three close matches of ``name``, or ``""``."""
    import difflib

    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
    return f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""


def name_hint(name: str, known: "Iterable[str]", ref: object = "<checkpoint>") -> str:
    """The close names of ``name`` (``"; did you mean ...?"``), else a few known names and where to see them all."""
    names = list(known)
    if not names:
        return f" (no names to match; see wbfe describe {ref})"
    more = f" of {len(names)}" if len(names) > 3 else ""
    return did_you_mean(name, names) or (f"; nothing close: known names include {', '.join(map(repr, names[:3]))}"
                                         f"{more} (wbfe describe {ref} lists them)")


def unknown_name(kind: str, name: str, known: "Iterable[str]") -> UnknownNameError:
    """An :class:`UnknownNameError` suggesting the closest known names, listing them all up to
    ``_LISTED`` (a longer registry is only counted; ``.known`` keeps them all)."""
    names = tuple(known)
    listing = (f"known: {', '.join(sorted(names))}" if len(names) <= _LISTED
               else f"{len(names)} known names, not listed")
    return UnknownNameError(f"unknown {kind} {name[:200]!r}{did_you_mean(name, names)} ({listing})", name=name,
                            known=names)


# Models the Hugging Face Hub once served under a bare name and now keeps under an organisation
# (transformers still redirects the bare name; huggingface_hub does not, offline or in the cache).
_MOVED_HUB_MODELS = {
    **{n: f"openai-community/{n}" for n in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "openai-gpt")},
    **{n: f"google-bert/{n}" for n in ("bert-base-uncased", "bert-base-cased", "bert-large-uncased",
                                      "bert-large-cased", "bert-base-multilingual-cased",
                                      "bert-base-multilingual-uncased", "bert-base-chinese")},
    **{n: f"distilbert/{n}" for n in ("distilgpt2", "distilbert-base-uncased", "distilbert-base-cased",
                                     "distilroberta-base")},
    **{n: f"FacebookAI/{n}" for n in ("roberta-base", "roberta-large", "xlm-roberta-base", "xlm-roberta-large")},
    **{n: f"google-t5/{n}" for n in ("t5-small", "t5-base", "t5-large")},
    **{n: f"albert/{n}" for n in ("albert-base-v2", "albert-large-v2")},
}


def hub_name_hint(ref: object) -> str:
    """``"; it looks like a Hugging Face model name: ..."`` (the full id of a well-known model, or what to
    write) for a reference that is no file but looks like a bare model name (``gpt2``); else ``""``."""
    text = str(ref)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}", text) or re.search(
            r"\.(safetensors|bin|pt|pth|ckpt|gguf|onnx|h5|keras|npz|json|csv|ya?ml|tflite)$", text, re.I):
        return ""
    full = _MOVED_HUB_MODELS.get(text) or _MOVED_HUB_MODELS.get(text.lower())
    if full is not None:
        return f"; it looks like a Hugging Face model name: use its full id, {full} (or a local path)"
    return ("; if it is a Hugging Face model, give its full id org/name (e.g. openai-community/gpt2), "
            "or a local path")
