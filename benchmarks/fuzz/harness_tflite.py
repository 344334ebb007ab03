"""Fuzz the TFLite reader: one ``model.tflite`` (a flatbuffer of the graph, its tensors, their
buffers and quantisation parameters, and buffers appended after it).

The invariants are the common ones (every tensor read or skipped with a reason, of its declared
shape and dtype; every tensor accounted for by the engine); the reader itself refuses a buffer that
does not hold exactly its tensor's bytes before any is read.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.fuzz.common import check_source, put

NAME = "tflite"


def fuzz_one(data: bytes) -> None:
    """Read ``data`` as a TFLite model; raise on a finding."""
    check_source(put("model.tflite", data))


def seeds() -> dict[str, bytes]:
    """Models written from the flatbuffer schema by the tests' writer (no converter exists here):
    float32, int8 per channel, uint8 per tensor, int16, float16 behind DEQUANTIZE, and int8 with
    its buffers after the flatbuffer."""
    root = Path(__file__).resolve().parents[2]
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    # The tests' writer, imported by name: it is test code, outside what the type checker covers.
    tw: Any = importlib.import_module("tests.tflite_writer")

    weights = tw.random_weights(seed=5, channels=2, hidden=8, classes=4)
    out: dict[str, bytes] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in ("float32", "int8", "uint8", "int16", "float16"):
            out[f"{variant}.tflite"] = tw.write(Path(tmp) / f"{variant}.tflite", tw.twin_graph(weights, variant)).read_bytes()
        external = tw.write(Path(tmp) / "external.tflite", tw.twin_graph(weights, "int8"), external=True)
        out["int8-external.tflite"] = external.read_bytes()
    return out
