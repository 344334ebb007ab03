"""Fuzz the GGUF reader: one ``model.gguf`` (header, metadata, tensor infos, data, quant blocks).

Independent check: the reader lists exactly the tensors the ``gguf`` package's own ``GGUFReader``
finds in the same bytes; a plain tensor read holds the bytes ``GGUFReader`` maps for it, and a
quantised one the float32s ``gguf.quants.dequantize`` makes of the package's own block bytes (a
type the package cannot dequantise is one the reader must not read either). A file the package
refuses that the reader read is a finding.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks.fuzz.common import RefusedTensor, check_source, put

NAME = "gguf"
# The types wbfe holds as they are stored (wbfe.sources.gguf_files' plain and integer types).
_STORED = {"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"}


def fuzz_one(data: bytes) -> None:
    """Read ``data`` as a GGUF file; raise on a finding."""
    path = put("model.gguf", data)
    check_source(path, reference=lambda: _gguf_parse(path))


def _gguf_parse(path: Path) -> dict[str, Any]:
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    try:
        tensors = GGUFReader(path).tensors
    except Exception as exc:  # noqa: BLE001 - any refusal by the gguf package of a file wbfe read
        raise AssertionError(f"gguf refuses a file the reader read: {type(exc).__name__}: {exc}") from None
    out: dict[str, Any] = {}
    for info in tensors:
        kind = info.tensor_type.name
        if kind in _STORED or int(info.n_elements) == 0:  # (dequantize cannot reshape an empty block array)
            out[info.name] = np.ascontiguousarray(info.data).tobytes()
            continue
        try:
            out[info.name] = np.ascontiguousarray(dequantize(info.data, info.tensor_type), np.float32).tobytes()
        except Exception as exc:  # noqa: BLE001 - the package cannot dequantise it: the reader must not read it
            out[info.name] = RefusedTensor(f"{kind}: {type(exc).__name__}: {exc}")
    return out


def seeds() -> dict[str, bytes]:
    """Files written by ``gguf.GGUFWriter``: a tiny llama with F32, F16, Q8_0 and Q4_0 tensors."""
    import numpy as np
    from gguf import GGMLQuantizationType, GGUFWriter
    from gguf.quants import quantize

    rng = np.random.default_rng(4)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, types in (("f32.gguf", ("F32",)), ("mixed.gguf", ("F16", "Q8_0", "Q4_0"))):
            path = Path(tmp) / name
            writer = GGUFWriter(str(path), "llama")
            writer.add_block_count(1)
            writer.add_embedding_length(32)
            writer.add_string("general.name", "fuzz-seed")
            writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
            writer.add_tensor("token_embd.weight", rng.standard_normal((8, 32)).astype(np.float32))
            for i, kind in enumerate(types):
                matrix = rng.standard_normal((32, 32)).astype(np.float32)
                tensor_name = f"blk.0.attn_{'qkv'[i]}.weight"
                if kind == "F32":
                    writer.add_tensor(tensor_name, matrix)
                elif kind == "F16":
                    writer.add_tensor(tensor_name, matrix.astype(np.float16))
                else:
                    qtype = GGMLQuantizationType[kind]
                    writer.add_tensor(tensor_name, quantize(matrix, qtype), raw_dtype=qtype)
            writer.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.close()
            out[name] = path.read_bytes()
    return out
