"""FP8 weights (e4m3 / e5m2) times their scales: per tensor, per output channel, or per block (docs/checkpoints.md;
DeepSeek-V3's ``weight_scale_inv`` is, despite its name, multiplied). Every FP8 value times a float32 scale is exact in
float64."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional, Sequence

from wbfe.errors import CorruptCheckpointError
from wbfe.render.text import shape_text

if TYPE_CHECKING:  # torch is imported where a tensor is dequantised: planning needs none
    import torch

__all__ = ["dequantize_fp8", "fp8_scheme", "config_whole", "scale_grid", "scale_layout", "FP8_FORMATS"]

FP8_FORMATS = {"float8_e4m3fn": "e4m3", "float8_e4m3fnuz": "e4m3", "float8_e5m2": "e5m2", "float8_e5m2fnuz": "e5m2"}


def scale_layout(weight_shape: Sequence[int], scale_shape: Sequence[int], block: Optional[Sequence[int]],
                 what: str = "FP8") -> tuple[str, Optional[tuple[int, int]]]:
    """``("tensor" | "channel" | "block", block size)`` of a scale over a weight (``what`` names it in the error)."""
    scale = tuple(int(s) for s in scale_shape)
    if math.prod(scale) == 1:
        return "tensor", None
    if len(weight_shape) >= 2:
        rows, cols = int(weight_shape[-2]), int(weight_shape[-1])
        lead = tuple(weight_shape[:-2])
        if scale in ((*lead, rows, 1), (*lead, rows)):
            return "channel", None
        if len(scale) == len(lead) + 2 and scale[:-2] == lead and min(scale[-2:]) > 0:
            # the config's block, else the one the scale grid implies
            b0, b1 = _block_size(block) if block is not None else (
                max(1, math.ceil(rows / scale[-2])), max(1, math.ceil(cols / scale[-1])))
            if (math.ceil(rows / b0), math.ceil(cols / b1)) == scale[-2:]:
                return "block", (b0, b1)
    raise CorruptCheckpointError(f"{what} scale of shape {list(scale)} fits no layout of a weight of shape "
                                 f"{list(weight_shape)} (per tensor, per channel or per block)")


def config_whole(value: object) -> Optional[int]:
    """A quantization config's whole number (``4``, ``4.0``, ``"4"``), else None (a bool, 4.5, NaN, inf, None, text).

    Example:
        >>> config_whole(128.0), config_whole("4"), config_whole(4.5), config_whole(True)
        (128, 4, None, None)
    """
    if isinstance(value, bool):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return int(number) if number.is_integer() else None


def _block_size(block: object) -> tuple[int, int]:
    sizes: list[Any] = list(block) if isinstance(block, (list, tuple)) else []
    whole = [w for w in map(config_whole, sizes) if w is not None and w >= 1]
    if len(sizes) != 2 or len(whole) != 2:
        raise CorruptCheckpointError(f"FP8 weight_block_size {block!r} is not two positive whole numbers")
    return whole[0], whole[1]


def fp8_scheme(dtype: str, weight_shape: Sequence[int], scale_shape: Sequence[int],
               block: Optional[Sequence[int]] = None) -> str:
    """The ``quant`` name, e.g. ``fp8-e4m3-block128``, ``fp8-e4m3-channel``, ``fp8-e5m2-tensor``;
    CorruptCheckpointError where the scale's shape fits no layout."""
    kind, size = scale_layout(weight_shape, scale_shape, block)
    if size is not None:
        kind += str(size[0]) if size[0] == size[1] else shape_text(size)
    return f"fp8-{FP8_FORMATS.get(dtype, dtype)}-{kind}"


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor, block: Optional[Sequence[int]] = None) -> torch.Tensor:
    """``weight`` (FP8, ``[..., out, in]``) times ``scale`` laid out per tensor, channel or block, in float64;
    CorruptCheckpointError where the scale's shape fits no layout."""
    import torch

    return weight.to(torch.float64) * scale_grid(scale, weight.shape, block)


def scale_grid(scale: torch.Tensor, weight_shape: Sequence[int], block: Optional[Sequence[int]] = None,
               what: str = "FP8") -> torch.Tensor:
    """``scale`` (or a zero point of its shape) as float64 that broadcasts over a weight of ``weight_shape``: one
    value, one a row, or one a block (``block``: the config's, else the one the grid implies); CorruptCheckpointError
    where the scale's shape fits no layout."""
    import torch

    kind, size = scale_layout(weight_shape, scale.shape, block, what)
    s = scale.to(torch.float64)
    if kind == "tensor":
        return s.reshape(())
    if kind == "channel":
        return s.reshape(*weight_shape[:-1], 1)
    assert size is not None
    rows, cols = weight_shape[-2:]
    return s.repeat_interleave(size[0], dim=-2)[..., :rows, :].repeat_interleave(size[1], dim=-1)[..., :cols]
