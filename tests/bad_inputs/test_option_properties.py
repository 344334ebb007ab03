"""Property-based checks (hypothesis) of the zoo CSV/YAML reader and of the rank cache's entries.

The invariant of issue #16: whatever the bytes, a typed ``WbfeError`` or a correct result, never
another exception. Derandomised, so every run tries the same examples.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wbfe.errors import WbfeError
from wbfe.ranking.cache import ScoreCache, cache_key
from wbfe.ranking.zoo import read_zoo_file
from wbfe.render.text import json_ready

yaml = pytest.importorskip("yaml")

FAST = settings(derandomize=True, max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])


def _read(data: bytes, suffix: str) -> Any:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"zoo{suffix}"
        path.write_bytes(data)
        try:
            return read_zoo_file(path)
        except WbfeError as exc:
            assert "\n" not in str(exc)
            return exc


@FAST
@given(st.binary(max_size=400), st.sampled_from([".csv", ".yaml"]))
def test_any_bytes_give_a_zoo_or_a_typed_error(data: bytes, suffix: str) -> None:
    _read(data, suffix)


_CELL = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)


@FAST
@given(st.lists(st.lists(_CELL, min_size=1, max_size=4), min_size=1, max_size=6))
def test_any_csv_cells_give_a_zoo_or_a_typed_error(rows: list[list[str]]) -> None:
    import csv
    import io

    buffer = io.StringIO()
    csv.writer(buffer).writerows([["model", "acc", *rows[0][2:]], *rows[1:]])
    _read(buffer.getvalue().encode("utf-8"), ".csv")


_NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-", min_size=1, max_size=10)
_FLOAT = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@FAST
@given(st.dictionaries(_NAME, _FLOAT, min_size=1, max_size=8), st.booleans())
def test_a_valid_table_is_read_exactly(models: dict[str, float], bom: bool) -> None:
    text = "model,acc\n" + "".join(f"hub-{name},{value!r}\n" for name, value in models.items())
    zoo = _read(("\ufeff" if bom else "").encode() + text.encode(), ".csv")
    assert not isinstance(zoo, WbfeError), zoo
    assert [e.name for e in zoo.entries] == [f"hub-{name}" for name in models]
    assert [e.quality["acc"] for e in zoo.entries] == list(models.values())
    as_yaml = yaml.safe_dump({"models": [{"model": f"hub-{n}", "acc": v} for n, v in models.items()]})
    assert [e.quality["acc"] for e in _read(as_yaml.encode(), ".yaml").entries] == list(models.values())


_JSON = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers(min_value=-10**6, max_value=10**6) | _CELL,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_CELL, inner, max_size=4),
    max_leaves=20,
)


@FAST
@given(_JSON)
def test_any_yaml_document_gives_a_zoo_or_a_typed_error(document: Any) -> None:
    for data in (document, {"models": document}, {"models": [document]}, [document]):
        _read(yaml.safe_dump(data, allow_unicode=True).encode("utf-8"), ".yaml")


def _refuse(token: str) -> None:
    raise AssertionError(f"non-standard JSON token {token}")


@FAST
@given(st.dictionaries(_CELL, _JSON, max_size=5))
def test_cache_payload_round_trips_as_standard_json(payload: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        cache = ScoreCache(folder)
        key = cache_key("content", {"metrics": ["bfe"]})
        path = cache.put(key, payload)
        json.loads(path.read_text(), parse_constant=_refuse)  # standard JSON: no NaN/Infinity tokens
        assert cache.get(key) == json_ready(payload)


@FAST
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode), st.booleans())
def test_any_bytes_in_a_cache_file_are_never_served_nor_raised(data: bytes, index: bool) -> None:
    with tempfile.TemporaryDirectory() as folder:
        cache = ScoreCache(Path(folder) / "cache")
        model = Path(folder) / "model.bin"
        model.write_bytes(b"weights")
        key = cache_key("content", {})
        if index:
            calls: list[str] = []
            assert cache.content_hash(str(model), lambda ref: calls.append(ref) or "h1") == "h1"
            (target,) = (cache.directory / "hashes").glob("*.json")
        else:
            target = cache.put(key, {"summary": {"bfe_head": 1.0}})
        target.write_bytes(data)
        if index:
            # A damaged index is never trusted: the checkpoint is hashed again.
            assert cache.content_hash(str(model), lambda ref: calls.append(ref) or "h1") == "h1"
            assert len(calls) == 2
        else:
            assert cache.get(key) is None
            assert not target.exists() and cache.corrupted == [key]
