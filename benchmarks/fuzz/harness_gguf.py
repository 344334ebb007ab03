"""Fuzz the GGUF reader: one ``model.gguf`` (header, metadata, tensor infos, data, quant blocks).

Independent check: a plain float tensor's bytes are those the ``gguf`` package's own reader finds
for it, where that reader can parse the file.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks.fuzz.common import check_source, put

NAME = "gguf"


def fuzz_one(data: bytes) -> None:
    """Read ``data`` as a GGUF file; raise on a finding."""
    path = put("model.gguf", data)
    reference: dict[str, Any] = {}
    check_source(path, compare=lambda entry, tensor: _same_bytes(path, reference, entry, tensor))


def _same_bytes(path: Path, reference: dict[str, Any], entry: Any, tensor: Any) -> None:
    import numpy as np

    from wbfe.arrays import flat_bytes

    if entry.quant is not None:
        return
    if "tensors" not in reference:  # the gguf package's reading of the file, once an input
        from gguf import GGUFReader

        try:
            reference["tensors"] = {info.name: info for info in GGUFReader(path).tensors
                                    if info.tensor_type.name in ("F32", "F16", "F64")}
        except Exception:  # noqa: BLE001 - the package refuses what wbfe read: no reference to compare with
            reference["tensors"] = {}
    info = reference["tensors"].get(entry.name)
    if info is not None:
        stored = np.asarray(info.data).tobytes()
        got = flat_bytes(tensor).tobytes()
        assert got == stored, f"{entry.name!r}: not the bytes the gguf package reads for it"


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
