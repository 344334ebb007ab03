"""Fuzz the PyTorch checkpoint reader (zip and legacy pickles): one ``pytorch_model.bin``."""

from __future__ import annotations

import io
from collections import OrderedDict

from benchmarks.fuzz.common import check_source, put

NAME = "torch"


def fuzz_one(data: bytes) -> None:
    """Read ``data`` as a PyTorch checkpoint; raise on a finding."""
    check_source(put("pytorch_model.bin", data))


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
