"""Fuzz the rank score cache: an entry file and a hash-index file of :class:`wbfe.ranking.cache.ScoreCache`.

The cache must serve a payload only from an intact entry, and treat anything else as corrupt:
removed and reported missing, never an exception. The bytes are read three ways: as an entry file,
as the payload of an entry with a valid checksum, and as a hash-index file.

Independent check: :mod:`json` and :mod:`hashlib` on the same bytes decide whether the entry is
intact by the cache's documented layout (a JSON object of this ``format`` and ``key`` whose
``checksum`` is the SHA-256 of its ``payload`` object as canonical JSON: sorted keys, no spaces,
non-finite numbers as null); the cache must serve exactly the intact ones, each with the parse's
payload.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from benchmarks.fuzz.common import fresh_folder, put, time_bound

NAME = "rank_cache"

# Tokens for libFuzzer's -dict: the entry's keys and JSON's edge cases.
DICTIONARY = ('"format"', '"key"', '"checksum"', '"payload"', '"wbfe-score-cache/2"', '"wbfe-hash-index/2"',
              '"signature"', '"sha256"', '"ref"', "NaN", "Infinity", "1e309", "null", "[[[[[[[[", "\\ud800")
_KEY = hashlib.sha256(b"fuzz").hexdigest()


def fuzz_one(data: bytes) -> None:
    """Read ``data`` as cache files; raise on a finding."""
    from wbfe.ranking.cache import CACHE_FORMAT, ScoreCache

    root = fresh_folder("cache")
    cache = ScoreCache(root)
    entry = root / "entries" / _KEY[:2] / f"{_KEY}.json"
    entry.parent.mkdir(parents=True)
    with time_bound():
        _check_get(cache, entry, data)
        try:
            payload = json.loads(data)
        except (ValueError, RecursionError):
            payload = None
        if isinstance(payload, dict):  # a well-formed entry around the bytes: served back as stored
            try:
                cache.put(_KEY, payload)
            except (ValueError, TypeError, RecursionError):  # not JSON-serialisable as the cache writes: no entry
                return
            got = cache.get(_KEY)
            assert got is not None, "an entry the cache itself wrote was not served"
            assert entry.exists()
            raw = json.loads(entry.read_text())
            assert raw["format"] == CACHE_FORMAT and got == raw["payload"], "the cache served another payload"
        ref = put("weights.bin", b"weights", root)
        index = _index_file(cache, ref)
        index.parent.mkdir(parents=True, exist_ok=True)
        index.write_bytes(data)
        digest = cache.content_hash(str(ref), lambda r: hashlib.sha256(Path(r).read_bytes()).hexdigest())
        assert digest == hashlib.sha256(b"weights").hexdigest(), f"content hash {digest!r} from a stale index"


def _check_get(cache: Any, entry: Path, data: bytes) -> None:
    entry.write_bytes(data)
    got = cache.get(_KEY)
    want = _intact_payload(data)
    if got is None:
        assert not entry.exists(), "a corrupt entry was left in place"
        assert want is None, "an intact entry was not served"
    else:
        assert isinstance(got, dict), f"the cache served a {type(got).__name__}"
        assert want is not None, "a corrupt entry was served"
        assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True), "not the entry's payload"


def _intact_payload(data: bytes) -> Any:
    """The payload of an intact entry file ``data``, parsed by :mod:`json`; None when it is not intact."""
    from wbfe.ranking.cache import CACHE_FORMAT

    if len(data) > 16 << 20:  # the cache's bound on an entry file (16 MiB, wbfe.ranking.cache): refused unread
        return None
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    if not (isinstance(parsed, dict) and parsed.get("format") == CACHE_FORMAT and parsed.get("key") == _KEY
            and isinstance(parsed.get("payload"), dict)):
        return None
    try:
        canonical = json.dumps(_finite(parsed["payload"]), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (ValueError, RecursionError):
        return None
    return parsed["payload"] if parsed.get("checksum") == hashlib.sha256(canonical.encode()).hexdigest() else None


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _index_file(cache: Any, ref: Path) -> Path:
    """Where the cache keeps the hash index of ``ref`` (its documented layout: hashes/<sha256 of the path>.json)."""
    return Path(cache.directory) / "hashes" / f"{hashlib.sha256(str(ref.resolve()).encode()).hexdigest()}.json"


def seeds() -> dict[str, bytes]:
    """An entry and an index written by the cache itself, and a score payload as ``wbfe rank`` stores it."""
    from wbfe.ranking.cache import ScoreCache

    root = fresh_folder("cache-seed")
    cache = ScoreCache(root)
    payload = {"summary": {"bfe_head": 1.41, "alpha_mean": 3.2, "h_head": None}, "n_layers": 3,
               "applicability": {"verdict": "ok"}, "model": {"sha256": _KEY, "format": "safetensors"}}
    entry = cache.put(_KEY, payload)
    ref = put("w.bin", b"w", root)
    cache.content_hash(str(ref), lambda r: "0" * 64)
    index = next((root / "hashes").glob("*.json"))
    return {"entry.json": entry.read_bytes(), "index.json": index.read_bytes(),
            "payload.json": json.dumps(payload).encode()}
