"""Replay the fuzzers' corpus (issue #33 §1) in the default run, without atheris.

For every reader harness of ``benchmarks/fuzz/``: its seeds (valid files written by the format's
own writers) must be read in full, and every file of ``tests/fuzz_corpus/<reader>/`` (an input a
fuzzing run found to break the reader, since fixed) must end in success or a ``WbfeError``: the
harness raises on any other exception and on a broken invariant (every tensor read or skipped
with a reason, of the shape and dtype its entry declares, holding its own bytes; every tensor
accounted for by the engine). ``benchmarks/fuzz_readers.py`` runs the harnesses under libFuzzer.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is a folder of the repository, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks.fuzz import HARNESSES  # noqa: E402
from benchmarks.fuzz.common import REFUSALS  # noqa: E402

CORPUS = Path(__file__).resolve().parent / "fuzz_corpus"


def _harness(reader: str) -> Any:
    return importlib.import_module(f"benchmarks.fuzz.harness_{reader}")


def _corpus() -> list[Any]:
    return [pytest.param(path.parent.name, path, id=f"{path.parent.name}/{path.name}")
            for path in sorted(CORPUS.glob("*/*")) if path.is_file() and path.parent.name in HARNESSES]


@pytest.mark.parametrize("reader", HARNESSES)
def test_seeds_replay(reader: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERAS_BACKEND", "torch")
    harness = _harness(reader)
    seeds = harness.seeds()
    assert seeds, f"{reader}: no seeds"
    for name, data in seeds.items():
        REFUSALS.clear()
        harness.fuzz_one(data)
        assert not REFUSALS, f"{reader}: the valid seed {name} was refused: {REFUSALS}"


@pytest.mark.parametrize(("reader", "path"), _corpus())
def test_finding_replays(reader: str, path: Path) -> None:
    # (The Keras harness walks an input's HDF5 index in its own child, bounded by its own
    # WALK_TIMEOUT_S: an hdf5-* input that hangs libhdf5 costs that.)
    _harness(reader).fuzz_one(path.read_bytes())


def test_every_corpus_folder_is_a_harness() -> None:
    folders = {p.name for p in CORPUS.iterdir() if p.is_dir()} if CORPUS.is_dir() else set()
    assert folders <= set(HARNESSES), f"corpus folders without a harness: {folders - set(HARNESSES)}"
