"""GPTQ and AWQ: 2-, 4- or 8-bit integers packed into int32 words, with per-group scales and zeros (the
layouts: docs/checkpoints.md). W[r, c] = scales[g, c] · (q[r, c] − z[g, c]), returned ``[out, in]`` float64."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # torch is imported where a tensor is dequantised: planning needs none
    import torch

__all__ = ["dequantize_gptq", "dequantize_awq", "unpack_int32", "AWQ_ORDER"]

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def unpack_int32(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """The ``32 // bits`` unsigned fields of each int32 word (2, 4 or 8 bits: the planner refuses any other width),
    lowest bits first, laid out along ``dim`` (word ``i`` gives entries ``i·n … i·n + n − 1``)."""
    import torch

    n = 32 // bits
    words = packed.to(torch.int64) & 0xFFFFFFFF  # int32 read as unsigned
    shifts = torch.arange(n, dtype=torch.int64) * bits
    fields = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # [..., n] along a new last dim
    fields = fields.movedim(-1, dim + 1 if dim >= 0 else dim)
    shape = list(packed.shape)
    shape[dim] *= n
    return fields.reshape(shape)


def dequantize_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, *, bits: int = 4,
                    group_size: int = 128, g_idx: Optional[torch.Tensor] = None, zero_offset: int = 1) -> torch.Tensor:
    """GPTQ's packed int weight -> float64 ``[out, in]`` (the shapes of its parts, ``g_idx``'s among them, checked
    by the planner). An input whose group index is out of range has no scale: its column is NaN (the planner reads the
    g_idx and skips such a weight first, saying which index is out of range)."""
    import torch

    q = unpack_int32(qweight, bits, 0)  # [in, out]
    z = unpack_int32(qzeros, bits, 1) + zero_offset  # [groups, out]
    groups, n_in = scales.shape[0], q.shape[0]
    g = g_idx.to(torch.int64) if g_idx is not None else torch.arange(n_in) // (n_in if group_size in (-1, 0) else group_size)
    outside = (g < 0) | (g >= groups)
    g = g.clamp(0, groups - 1)
    w = scales.to(torch.float64)[g] * (q - z[g]).to(torch.float64)
    return w.masked_fill(outside.unsqueeze(1), torch.nan).T.contiguous()


def dequantize_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, *, bits: int = 4,
                   group_size: int = 128) -> torch.Tensor:
    """AWQ's packed int weight -> float64 ``[out, in]`` (the shapes of its parts, and a group size that makes no more
    groups than ``scales`` holds, checked by the planner)."""
    import torch

    n = 32 // bits
    inverse = torch.argsort(torch.tensor(AWQ_ORDER[:n] if n == 8 else range(n)))

    def unpack(packed: torch.Tensor) -> torch.Tensor:
        fields = unpack_int32(packed, bits, 1)  # slot order within each word
        words = fields.reshape(fields.shape[0], -1, n)
        return words[:, :, inverse].reshape(fields.shape[0], -1)  # column 8j + c from slot inverse[c]

    q, z = unpack(qweight), unpack(qzeros)  # [in, out], [groups, out]
    n_in = q.shape[0]
    g = torch.arange(n_in) // (n_in if group_size in (-1, 0) else group_size)
    return (scales.to(torch.float64)[g] * (q - z[g]).to(torch.float64)).T.contiguous()
