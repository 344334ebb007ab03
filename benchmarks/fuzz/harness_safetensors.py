"""Fuzz the safetensors reader: one ``model.safetensors`` file (header, offsets, data section).

Independent check: each tensor's bytes are the file's bytes at the offsets its header declares,
parsed here with :mod:`json` alone (no number may come from outside the tensor's own range).
"""

from __future__ import annotations

import json
import struct
from typing import Any

from benchmarks.fuzz.common import check_source, put

NAME = "safetensors"

# Tokens for libFuzzer's -dict: the header's keys and dtype codes.
DICTIONARY = ('"dtype"', '"shape"', '"data_offsets"', '"__metadata__"', '"F32"', '"F16"', '"BF16"', '"I8"', '"BOOL"',
              '"F8_E4M3"', '"F8_E8M0"', '"F6_E2M3"', '"F4"', '"C64"', '"U64"', "18446744073709551615", "-1", "[]")


def fuzz_one(data: bytes) -> None:
    """Read ``data`` as a safetensors file; raise on a finding."""
    path = put("model.safetensors", data)
    check_source(path, compare=lambda entry, tensor: _same_bytes(data, entry, tensor))


def _same_bytes(data: bytes, entry: Any, tensor: Any) -> None:
    from wbfe.arrays import flat_bytes

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
