"""Fuzz the safetensors reader: one ``model.safetensors`` file (header, offsets, data section).

Independent checks: each tensor's bytes are the file's bytes at the offsets its header declares,
parsed here with :mod:`json` alone (no number may come from outside the tensor's own range); and
the reader lists exactly the tensors the ``safetensors`` package's ``safe_open`` lists, each read
one holding the bytes ``safe_open`` reads for it. A file ``safetensors`` refuses that the reader
read is a finding.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from benchmarks.fuzz.common import check_source, put

NAME = "safetensors"

# Tokens for libFuzzer's -dict: the header's keys and dtype codes.
DICTIONARY = ('"dtype"', '"shape"', '"data_offsets"', '"__metadata__"', '"F32"', '"F16"', '"BF16"', '"I8"', '"BOOL"',
              '"F8_E4M3"', '"F8_E8M0"', '"F6_E2M3"', '"F4"', '"C64"', '"U64"', "18446744073709551615", "-1", "[]")


def fuzz_one(data: bytes) -> None:
    """Read ``data`` as a safetensors file; raise on a finding."""
    path = put("model.safetensors", data)
    check_source(path, compare=lambda entry, tensor: _same_bytes(data, entry, tensor),
                 reference=lambda: safetensors_parse(path) if read_as(path, "safetensors") else None)


def read_as(path: Path, fmt: str) -> bool:
    """Whether wbfe reads ``path`` as ``fmt``: a file whose first bytes are another format's magic
    (``GGUF``...) goes to that format's reader whatever its name (found by fuzzing: the reference of
    the named format refused what the GGUF reader read), and that format's harness checks it."""
    from wbfe.sources.registry import format_of

    found = format_of(path)
    return found is not None and found.name == fmt


def safetensors_parse(path: Path) -> dict[str, Any]:
    """The file's tensors as ``safetensors.safe_open`` reads them: {name: bytes of its values}.

    Raises:
        AssertionError: ``safetensors`` refuses the file (the caller's reader read it).
    """
    import torch
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: _tensor_bytes(torch, f.get_tensor(name)) for name in f.keys()}
    except Exception as exc:  # noqa: BLE001 - any refusal by safetensors of a file wbfe read
        raise AssertionError(f"safetensors refuses a file the reader read: {type(exc).__name__}: {exc}") from None


def _tensor_bytes(torch: Any, tensor: Any) -> bytes:
    flat = tensor.contiguous().reshape(-1)
    return bytes(flat.view(torch.uint8).numpy().tobytes()) if flat.numel() else b""


def _same_bytes(data: bytes, entry: Any, tensor: Any) -> None:
    from wbfe.linalg.arrays import flat_bytes

    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    start, end = header[entry.name]["data_offsets"]
    stored = data[8 + n + start:8 + n + end]
    got = flat_bytes(tensor).tobytes()
    assert got == stored, f"{entry.name!r}: the tensor's bytes are not the file's bytes at its offsets"


def seeds() -> dict[str, bytes]:
    """Valid files written by the ``safetensors`` package."""
    import torch
    from safetensors.torch import save

    g = torch.Generator().manual_seed(0)
    return {
        "mlp.safetensors": save({"fc1.weight": torch.randn(16, 8, generator=g),
                                 "fc1.bias": torch.randn(16, generator=g),
                                 "fc2.weight": torch.randn(4, 16, generator=g)}, metadata={"format": "pt"}),
        "dtypes.safetensors": save({
            "a.weight": torch.randn(12, 10, generator=g).half(),
            "b.weight": torch.randn(12, 10, generator=g).bfloat16(),
            "c.weight": torch.randint(-8, 8, (12, 10), generator=g, dtype=torch.int8),
            "d.weight": torch.randn(12, 10, generator=g).double(),
            "e.weight": torch.randn(12, 10, generator=g).to(torch.float8_e4m3fn),
            "empty": torch.zeros(0, 3), "scalar": torch.tensor(1.5), "mask": torch.ones(3, dtype=torch.bool),
        }),
        "conv.safetensors": save({"conv.weight": torch.randn(8, 3, 3, 3, generator=g),
                                  "lm_head.weight": torch.randn(20, 8, generator=g)}),
    }
