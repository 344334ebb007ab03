"""``benchmarks/results/fuzz_readers.json`` tied to the harness registry and the corpus (issue #33 §5).

The record is the campaign's claim; these checks make it fail when a harness is added without a
run, a run is cut short of the issue's 600 s, a harness (or ``benchmarks/fuzz/common.py``) changed
after its latest run, or a finding is neither fixed (its input replayed from ``tests/fuzz_corpus``)
nor parked with its reason (``benchmarks/fuzz/upstream``).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.fuzz import HARNESSES  # noqa: E402
from benchmarks.fuzz_readers import harness_digest  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "fuzz_readers.json"
# A path a resolution names: a corpus glob (``.../name-*``) or one parked upstream input.
_PATH = re.compile(r"(?:tests/fuzz_corpus|benchmarks/fuzz/upstream)/[\w./*-]*[\w*]")


def _record() -> dict[str, Any]:
    return json.loads(RESULTS.read_text())  # type: ignore[no-any-return]


def _runs(entry: dict[str, Any]) -> list[dict[str, Any]]:
    return [entry, *entry.get("earlier_runs", [])]


def test_the_record_lists_exactly_the_registered_harnesses() -> None:
    readers = set(_record()) - {"run"}  # "run" holds the campaign's settings and versions
    assert readers == set(HARNESSES)


def test_the_latest_run_of_every_reader_is_full_length_and_of_its_current_harness() -> None:
    # A run records the digest of its harness and common.py (fuzz_readers.harness_digest) when it
    # starts: a harness changed since (a new check, a new seed) has not been fuzzed for 600 s.
    stale = {reader: {"seconds": entry["seconds"], "digest": entry.get("harness_sha256")}
             for reader, entry in _record().items()
             if reader != "run" and (entry["seconds"] < 600 or entry.get("harness_sha256") != harness_digest(reader))}
    assert stale == {}, f"fuzz these readers again (python benchmarks/fuzz_readers.py --readers ...): {stale}"


def test_every_finding_is_resolved_against_the_corpus() -> None:
    for reader, entry in _record().items():
        if reader == "run":
            continue
        for run in _runs(entry):
            signatures = run["finding_signatures"]
            assert run["findings"] == len(signatures) == len(set(signatures)), (reader, run["date"])
            resolutions = run.get("resolutions", {})
            assert set(resolutions) == set(signatures), (reader, run["date"])
            for signature, text in resolutions.items():
                paths = [m.group(0) for m in _PATH.finditer(text)]
                for path in paths:
                    assert list(ROOT.glob(path)), f"{reader} {signature}: {path} names no file"
                # A finding without an input of its own is a repeat of one named before it in the
                # run ("same"), or the harness's own mistake, corrected.
                assert paths or text.startswith("same") or "harness false positive" in text, \
                    f"{reader} {signature}: resolved without an input: {text}"
