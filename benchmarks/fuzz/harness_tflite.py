"""Fuzz the TFLite reader: one ``model.tflite`` (a flatbuffer of the graph, its tensors, their
buffers and quantisation parameters, and buffers appended after it).

The invariants are the common ones (every tensor read or skipped with a reason, of its declared
shape and dtype; every tensor accounted for by the engine); the reader itself refuses a buffer that
does not hold exactly its tensor's bytes before any is read.

Independent check: the ``tflite`` package's generated accessors walk the same bytes (every
subgraph's tensors, each one's buffer: ``Data`` in the flatbuffer, or ``Offset``/``Size`` after
it); the reader lists exactly the constants (a tensor whose buffer holds bytes), and each float
tensor read holds its buffer's values as stored or in one of the layouts PyTorch holds a weight in
(the permutations of ``wbfe.sources.tflite_files.to_torch_layout``); a dequantised tensor is a
transform, not compared. A model the package cannot walk that the reader read is a finding.
"""

from __future__ import annotations

import importlib
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from benchmarks.fuzz.common import check_source, put
from benchmarks.fuzz.harness_safetensors import read_as

NAME = "tflite"
# TensorType codes of schema.fbs: float32, float16, float64, bfloat16 (the stored floats).
_FLOATS = {0: "<f4", 1: "<f2", 10: "<f8", 18: "<u2"}
_QUANTISED = {3, 7, 9}  # uint8, int16, int8: dequantised by the reader when quantisation is given
_LAYOUTS = {4: ((0, 3, 1, 2), (3, 0, 1, 2)), 5: ((4, 3, 0, 1, 2),)}


def fuzz_one(data: bytes) -> None:
    """Read ``data`` as a TFLite model; raise on a finding."""
    path = put("model.tflite", data)
    check_source(path, reference=lambda: _tflite_parse(data) if read_as(path, "tflite") else None)


def _tflite_parse(data: bytes) -> Optional[dict[str, Any]]:
    import numpy as np
    from tflite.Model import Model

    out: dict[str, Any] = {}
    try:
        model = Model.GetRootAsModel(data, 0)
        for s in range(model.SubgraphsLength()):
            subgraph = model.Subgraphs(s)
            for t in range(subgraph.TensorsLength()):
                tensor = subgraph.Tensors(t)
                index = tensor.Buffer()
                if index <= 0:  # buffer 0 is the schema's empty sentinel
                    continue
                buffer = model.Buffers(index)
                offset, size = int(buffer.Offset()), int(buffer.Size())
                raw = data[offset:offset + size] if offset > 1 else (
                    b"" if buffer.DataIsNone() else buffer.DataAsNumpy().tobytes())
                if not raw:
                    continue
                name = (tensor.Name() or b"").decode() or f"tensor_{t}"
                if name in out:
                    # Tensor names need not be unique; the reader qualifies a repeated one by its own
                    # rule (subgraph name, tensor index), which is no part of the file: no list to compare.
                    return None
                shape = tuple(int(d) for d in tensor.ShapeAsNumpy()) if tensor.ShapeLength() else ()
                out[name] = _layouts(np, raw, tensor.Type(), shape, tensor.Quantization())
    except Exception as exc:  # noqa: BLE001 - any refusal by the tflite package of a model wbfe read
        raise AssertionError(f"the tflite package cannot walk a model the reader read: {type(exc).__name__}: {exc}"
                             ) from None
    return out


def _layouts(np: Any, raw: bytes, code: int, shape: tuple[int, ...], quant: Any) -> Any:
    """The float32 (float64, bfloat16 bits) bytes of a float tensor in each layout the reader may
    give; None for a dequantised one or one of another type (not read as its values)."""
    if code in _QUANTISED and quant is not None and quant.ScaleLength():
        return None
    if code not in _FLOATS:
        return None
    values = np.frombuffer(raw, np.dtype(_FLOATS[code]))
    if values.size != int(np.prod(shape, dtype=np.int64)):
        return None  # the reader refuses it (its buffer against its shape): nothing to compare
    array = values.reshape(shape)
    if code == 1:  # float16 weights are read as float32
        array = array.astype("<f4")
    forms = [array] + [np.transpose(array, axes) for axes in _LAYOUTS.get(array.ndim, ())]
    if array.ndim == 2:
        forms.append(array.T)
    return tuple(np.ascontiguousarray(f).tobytes() for f in forms)


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
