"""Fuzz the safetensors shard index: ``model.safetensors.index.json`` beside two fixed shards.

The folder is opened as a whole, so the index is what picks the files; every tensor the shards
hold must then be read or listed as skipped with its reason.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from benchmarks.fuzz.common import check_source, fresh_folder, put

NAME = "safetensors_index"

# Tokens for libFuzzer's -dict: the index's keys and shard names that must be refused.
DICTIONARY = ('"weight_map"', '"metadata"', '"model-00001-of-00002.safetensors"', '"model-00002-of-00002.safetensors"',
              '"../"', '"/etc/passwd"', '"model.safetensors.index.json"', '"."', '"a.weight"', '"extra.weight"', "null")
INDEX = "model.safetensors.index.json"
_FOLDER: Optional[Path] = None


def _shards() -> dict[str, bytes]:
    import torch
    from safetensors.torch import save

    g = torch.Generator().manual_seed(1)
    return {
        "model-00001-of-00002.safetensors": save({"a.weight": torch.randn(8, 6, generator=g),
                                                  "b.weight": torch.randn(8, 6, generator=g)}),
        "model-00002-of-00002.safetensors": save({"c.weight": torch.randn(4, 8, generator=g),
                                                  "extra.weight": torch.randn(4, 4, generator=g)}),
    }


def _folder() -> Path:
    global _FOLDER
    if _FOLDER is None:
        _FOLDER = fresh_folder("index")
        for name, data in _shards().items():
            put(name, data, _FOLDER)
    return _FOLDER


def fuzz_one(data: bytes) -> None:
    """Read the folder with ``data`` as its shard index; raise on a finding."""
    folder = _folder()
    put(INDEX, data, folder)
    check_source(folder)


def seeds() -> dict[str, bytes]:
    """Valid indexes of the two shards (one lists a tensor twice, one leaves ``extra`` out)."""
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    full = {"a.weight": first, "b.weight": first, "c.weight": second, "extra.weight": second}
    return {
        "full.json": json.dumps({"metadata": {"total_size": 544}, "weight_map": full}).encode(),
        "partial.json": json.dumps({"weight_map": {"a.weight": first, "c.weight": "./" + second}}).encode(),
        "one.json": json.dumps({"weight_map": {"b.weight": first}}, indent=2).encode(),
    }
