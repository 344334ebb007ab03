"""Fuzz the PyTorch checkpoint reader (zip and legacy pickles): one ``pytorch_model.bin``.

Independent check: where ``torch.load(weights_only=True)`` gives a flat ``{name: tensor}`` state
dict, the reader lists exactly its names and reads each tensor's bytes; a file torch refuses that
the reader read is a finding. (A nested checkpoint, unwrapped by wbfe's own rules, is checked by
the invariants alone.)
"""

from __future__ import annotations

import io
from collections import OrderedDict

from pathlib import Path
from typing import Any, Optional

from benchmarks.fuzz.common import check_source, put
from benchmarks.fuzz.harness_safetensors import read_as  # another format's magic goes to that reader

NAME = "torch"


def fuzz_one(data: bytes) -> None:
    """Read ``data`` as a PyTorch checkpoint; raise on a finding."""
    path = put("pytorch_model.bin", data)
    check_source(path, reference=lambda: _torch_parse(path) if read_as(path, "torch") else None)


def _torch_parse(path: Path) -> Optional[dict[str, Any]]:
    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any refusal by torch of a file wbfe read
        raise AssertionError(f"torch.load refuses a file the reader read: {type(exc).__name__}: {exc}") from None
    if not isinstance(state, dict) or not state or not all(
            isinstance(k, str) and type(v) is torch.Tensor for k, v in state.items()):
        return None
    # The stored values as laid out in memory, row-major: the reader's flat bytes of each tensor.
    return {k: v.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() for k, v in state.items()}


def seeds() -> dict[str, bytes]:
    """Files written by ``torch.save``: zip and legacy formats, nested, tied, several dtypes."""
    import torch

    g = torch.Generator().manual_seed(2)
    shared = torch.randn(10, 6, generator=g)
    state = OrderedDict([("fc1.weight", torch.randn(12, 6, generator=g)), ("fc1.bias", torch.zeros(12)),
                         ("fc2.weight", torch.randn(3, 12, generator=g).half()),
                         ("bn.num_batches_tracked", torch.tensor(3))])
    out = {}
    for name, obj, zipped in (
        ("zip.bin", state, True),
        ("legacy.bin", state, False),
        ("nested.bin", {"epoch": 3, "state_dict": {"module.emb.weight": shared, "module.head.weight": shared,
                                                  "module.q": torch.randint(-5, 5, (6, 6), dtype=torch.int8,
                                                                            generator=g)}}, True),
        ("views.bin", {"w": torch.randn(8, 8, generator=g)[::2], "v": torch.randn(6, 4, generator=g).t(),
                       "b": torch.randn(5, 5, generator=g).bfloat16()}, True),
    ):
        buffer = io.BytesIO()
        torch.save(obj, buffer, _use_new_zipfile_serialization=zipped)
        out[name] = buffer.getvalue()
    return out
