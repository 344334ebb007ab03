"""The object-copy bound applied as each new copy lands (issue #33 §8): least recently used copies
beyond ``$WBFE_CACHE_MAX_SIZE`` go, the copy just fetched never does."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from wbfe.errors import InvalidOptionError
from wbfe.sources.object_bound import DEFAULT_MAX_SIZE, object_cache_bound
from wbfe.sources.object_store import fetch_uri

fsspec = pytest.importorskip("fsspec", reason="the fsspec extra is not installed")


@pytest.fixture()
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    monkeypatch.setenv("WBFE_CACHE_DIR", str(tmp_path / "cache"))
    fs = fsspec.filesystem("memory")
    yield fs
    fs.rm("/bound-test", recursive=True)


def _put(fs: object, name: str, size: int) -> str:
    fs.pipe(f"/bound-test/{name}", bytes([len(name)]) * size)  # type: ignore[attr-defined]
    return f"memory://bound-test/{name}"


def _age(copy: Path, when: float) -> None:
    # Last use is the latest access/modification of a copy's files and folder: set all of them.
    for path in [*copy.rglob("*"), copy]:
        os.utime(path, (when, when))


def _held(tmp_path: Path) -> set[str]:
    return {p.name for p in (tmp_path / "cache" / "objects").glob("*/*/*") if p.is_file()}


def test_a_new_copy_evicts_the_least_recently_used_beyond_the_bound(
        tmp_path: Path, store: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WBFE_CACHE_MAX_SIZE", "2500")
    a = fetch_uri(_put(store, "a.bin", 1000))
    b = fetch_uri(_put(store, "b.bin", 1000))
    _age(a.parent, 1_000_000.0)
    _age(b.parent, 2_000_000.0)
    assert _held(tmp_path) == {"a.bin", "b.bin"}  # 2000 bytes: within the bound
    # A hit marks a copy used: a is now the more recent of the two.
    assert fetch_uri("memory://bound-test/a.bin") == a
    fetch_uri(_put(store, "c.bin", 1000))  # 3000 bytes > 2500: the least recently used (b) goes
    assert _held(tmp_path) == {"a.bin", "c.bin"}
    assert a.read_bytes() == bytes([5]) * 1000


def test_the_copy_just_fetched_stays_even_when_it_alone_exceeds_the_bound(
        tmp_path: Path, store: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WBFE_CACHE_MAX_SIZE", "1K")
    fetch_uri(_put(store, "small.bin", 600))
    big = fetch_uri(_put(store, "large.bin", 4000))
    assert _held(tmp_path) == {"large.bin"} and big.stat().st_size == 4000


def test_no_bound_keeps_every_copy(tmp_path: Path, store: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WBFE_CACHE_MAX_SIZE", "none")
    for name in ("x.bin", "y.bin", "z.bin"):
        fetch_uri(_put(store, name, 2000))
    assert _held(tmp_path) == {"x.bin", "y.bin", "z.bin"}


def test_the_bound_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WBFE_CACHE_MAX_SIZE", raising=False)
    assert object_cache_bound() == DEFAULT_MAX_SIZE == 20 * 2**30
    monkeypatch.setenv("WBFE_CACHE_MAX_SIZE", "1.5G")
    assert object_cache_bound() == 3 * 2**29
    monkeypatch.setenv("WBFE_CACHE_MAX_SIZE", " None ")
    assert object_cache_bound() is None
    for word in ("lots", "off", "unbounded"):  # one word for no bound, as `wbfe cache prune --max-size` takes
        monkeypatch.setenv("WBFE_CACHE_MAX_SIZE", word)
        with pytest.raises(InvalidOptionError, match="WBFE_CACHE_MAX_SIZE"):
            object_cache_bound()


def test_a_bad_bound_is_refused_before_anything_is_fetched(
        tmp_path: Path, store: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable is read as the fetch starts: a typo costs no download and leaves no copy."""
    uri = _put(store, "big.bin", 1000)
    for bad in ("20 gigs", "-1", "1e3"):
        monkeypatch.setenv("WBFE_CACHE_MAX_SIZE", bad)
        with pytest.raises(InvalidOptionError, match="WBFE_CACHE_MAX_SIZE"):
            fetch_uri(uri)
        assert not (tmp_path / "cache" / "objects").exists() or _held(tmp_path) == set()
