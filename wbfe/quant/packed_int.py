"""GPTQ and AWQ: 4- or 8-bit integers packed into int32 words, with per-group scales and zeros.

GPTQ (AutoGPTQ / GPTQModel ``gptq`` format): ``qweight`` int32 ``[in·bits/32, out]`` packs input rows
(row ``8i + k`` in bits ``4k…4k+3`` of word ``i`` for 4 bits); ``qzeros`` int32 ``[groups, out·bits/32]``
packs output columns the same way, stored minus one (``checkpoint_format`` ``gptq``; ``gptq_v2``
stores them as they are); ``scales`` ``[groups, out]``; ``g_idx`` int32 ``[in]`` gives each input
row's group (act-order), else ``row // group_size``. W[r, c] = scales[g, c] · (q[r, c] − z[g, c]).

AWQ (AutoAWQ ``gemm`` version): ``qweight`` int32 ``[in, out·bits/32]`` packs output columns in the
order 0, 2, 4, 6, 1, 3, 5, 7 (word slot ``k`` holds column ``8j + order[k]``); ``qzeros`` likewise
``[groups, out·bits/32]``; ``scales`` ``[groups, out]``; group of row r is ``r // group_size``.

Both return ``[out, in]`` float64, PyTorch's orientation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from wbfe.errors import CorruptCheckpointError

if TYPE_CHECKING:  # torch is imported where a tensor is dequantised: planning needs none
    import torch

__all__ = ["dequantize_gptq", "dequantize_awq", "unpack_int32", "AWQ_ORDER"]

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def unpack_int32(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """The ``32 // bits`` unsigned fields of each int32 word, lowest bits first, laid out along ``dim``
    (word ``i`` gives entries ``i·n … i·n + n − 1``)."""
    import torch

    if bits not in (2, 4, 8):
        raise CorruptCheckpointError(f"{bits}-bit packing is not supported (2, 4 or 8 bits)")
    n = 32 // bits
    words = packed.to(torch.int64) & 0xFFFFFFFF  # int32 read as unsigned
    shifts = torch.arange(n, dtype=torch.int64) * bits
    fields = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # [..., n] along a new last dim
    fields = fields.movedim(-1, dim + 1 if dim >= 0 else dim)
    shape = list(packed.shape)
    shape[dim] *= n
    return fields.reshape(shape)


def _check(what: str, got: tuple[int, ...], want: tuple[int, ...]) -> None:
    if got != want:
        raise CorruptCheckpointError(f"{what} has shape {list(got)}, expected {list(want)}")


def dequantize_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, *, bits: int = 4,
                    group_size: int = 128, g_idx: Optional[torch.Tensor] = None, zero_offset: int = 1) -> torch.Tensor:
    """GPTQ's packed int weight -> float64 ``[out, in]`` (see the module docstring).

    Raises:
        CorruptCheckpointError: shapes that do not fit together, or a group index out of range.
    """
    import torch

    q = unpack_int32(qweight, bits, 0)  # [in, out]
    n_in, n_out = q.shape
    groups = scales.shape[0]
    _check("GPTQ scales", tuple(scales.shape), (groups, n_out))
    z = unpack_int32(qzeros, bits, 1) + zero_offset  # [groups, out]
    _check("GPTQ qzeros (unpacked)", tuple(z.shape), (groups, n_out))
    if g_idx is None:
        size = n_in if group_size in (-1, 0) else group_size
        g = torch.arange(n_in) // size
    else:
        _check("GPTQ g_idx", tuple(g_idx.shape), (n_in,))
        g = g_idx.to(torch.int64)
    if int(g.min()) < 0 or int(g.max()) >= groups:
        raise CorruptCheckpointError(f"GPTQ group index out of range (0..{groups - 1})")
    w = scales.to(torch.float64)[g] * (q - z[g]).to(torch.float64)
    return w.T.contiguous()


def dequantize_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, *, bits: int = 4,
                   group_size: int = 128) -> torch.Tensor:
    """AWQ's packed int weight -> float64 ``[out, in]`` (see the module docstring).

    Raises:
        CorruptCheckpointError: shapes that do not fit together.
    """
    import torch

    n = 32 // bits
    order = torch.tensor(AWQ_ORDER[:n] if n == 8 else range(n))
    inverse = torch.argsort(order)

    def unpack(packed: torch.Tensor) -> torch.Tensor:
        fields = unpack_int32(packed, bits, 1)  # slot order within each word
        words = fields.reshape(fields.shape[0], -1, n)
        return words[:, :, inverse].reshape(fields.shape[0], -1)  # column 8j + c from slot inverse[c]

    q = unpack(qweight)  # [in, out]
    n_in, n_out = q.shape
    groups = scales.shape[0]
    _check("AWQ scales", tuple(scales.shape), (groups, n_out))
    z = unpack(qzeros)
    _check("AWQ qzeros (unpacked)", tuple(z.shape), (groups, n_out))
    size = n_in if group_size in (-1, 0) else group_size
    g = torch.arange(n_in) // size
    if int(g.max()) >= groups:
        raise CorruptCheckpointError(f"AWQ: {n_in} input rows need more than {groups} groups of {size}")
    w = scales.to(torch.float64)[g] * (q - z[g]).to(torch.float64)
    return w.T.contiguous()
