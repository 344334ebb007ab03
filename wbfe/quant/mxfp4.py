"""MXFP4 (OCP Microscaling): blocks of 32 FP4 (e2m1) values sharing one E8M0 power-of-two scale.

The layout is in docs/checkpoints.md; the result is ``[E, in, out]``, the layout of gpt-oss's bfloat16
checkpoints, so both are read alike. Every value is exact in float64."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a tensor is dequantised: planning needs none
    import torch

__all__ = ["FP4_E2M1", "dequantize_mxfp4"]

# The 16 e2m1 codes: sign bit 3, exponent bits 2-1, mantissa bit 0 (OCP MX spec, table 5).
FP4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``[..., out, G, 16]`` bytes and ``[..., out, G]`` E8M0 scales (shapes the planner checked) -> float64
    ``[..., G·32, out]``; a block under the E8M0 NaN code (255) is NaN, as the format defines it, so the weight is
    skipped for its non-finite values as a NaN scale of any other format is."""
    import torch

    codes = scales.to(torch.int32)
    scale = torch.exp2((codes - 127).to(torch.float64)).masked_fill(codes == 255, torch.nan)
    lut = torch.tensor(FP4_E2M1, dtype=torch.float64)
    values = torch.stack((lut[(blocks & 0x0F).long()], lut[(blocks >> 4).long()]), dim=-1)  # [..., G, 16, 2]
    values = values.reshape(*blocks.shape[:-1], 32) * scale.unsqueeze(-1)
    return values.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32).transpose(-1, -2)
