"""compressed-tensors' integer layouts (llm-compressor's W4A16, W8A16 and W8A8 checkpoints, as vLLM loads them):
W = (q − z)·s as the package's own ``dequantize`` computes it, here in float64, where every product is exact. The
layouts (``pack-quantized``, ``int-quantized``): docs/checkpoints.md."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from wbfe.errors import CorruptCheckpointError, UnsupportedDtypeError
from wbfe.linalg.arrays import to_numpy, to_torch
from wbfe.quant.fp8 import config_whole, scale_grid, scale_layout
from wbfe.quant.packed_int import unpack_int32
from wbfe.render.text import shape_text
from wbfe.sources import TensorEntry

if TYPE_CHECKING:  # torch is imported where a tensor is dequantised: planning needs none
    import torch

__all__ = ["compressed_weight", "config_block", "dequantize_compressed", "unpack_values"]

# The widths whose packing every compressed-tensors version shares (32/b values a word); 0.20 packs 3, 5, 6 and 7 bits
# across word boundaries, earlier versions left the spare bits of each word empty.
_WIDTHS = (1, 2, 4, 8)
_WHAT = "compressed-tensors"


def _weight_args(qconfig: dict[str, Any], prefix: str) -> list[dict[str, Any]]:
    """The ``weights`` arguments of the config groups that may quantise ``prefix``: the groups naming it among their
    targets, else every group (a target that is a class name or a ``re:`` pattern is not matched: the tensors decide,
    and the config only where every group agrees)."""
    groups = qconfig.get("config_groups") if qconfig.get("quant_method") == "compressed-tensors" else None
    if not isinstance(groups, dict):
        return []
    found = [g for g in groups.values() if isinstance(g, dict) and isinstance(g.get("weights"), dict)]
    named = [g for g in found if isinstance(g.get("targets"), list) and prefix in g["targets"]]
    return [g["weights"] for g in (named or found)]


def _agreed(args: list[dict[str, Any]], key: str) -> Any:
    """The value every group gives ``key``, else None."""
    values = [a.get(key) for a in args]
    return values[0] if values and all(v == values[0] for v in values) else None


def config_block(qconfig: dict[str, Any], prefix: str) -> Optional[list[Any]]:
    """The block of ``prefix``'s scale by its compressed-tensors config: ``block_structure`` under the block strategy,
    ``[1, group_size]`` under the group strategy, else None (the scale's grid decides). The grid alone is ambiguous
    where a block does not divide the matrix: 100 rows in one block of 128 look like one block of 100."""
    args = _weight_args(qconfig, prefix)
    strategy, group = _agreed(args, "strategy"), _agreed(args, "group_size")
    if strategy == "block":
        return _agreed(args, "block_structure")
    return [1, group] if strategy == "group" and group is not None else None


def compressed_weight(prefix: str, parts: dict[str, TensorEntry], qconfig: dict[str, Any]) -> TensorEntry:
    """The float64 ``<prefix>.weight`` of a compressed-tensors integer layer from its parts (``packed`` or
    ``int_weight``, ``scale``, perhaps ``shape``, ``zero_point``, ``g_idx``). The small parts (the shape, a group
    index) are read now, so that a weight wbfe cannot read is skipped before any work.

    Raises:
        CorruptCheckpointError: parts whose shapes or dtypes contradict each other or the config.
        UnsupportedDtypeError: a layout wbfe does not dequantise exactly; its ``scheme`` names the layout.
    """
    args = _weight_args(qconfig, prefix)
    s, z, g = parts["scale"], parts.get("zero_point"), parts.get("g_idx")
    packed = parts.get("packed")
    if packed is not None and packed.dtype != "int32":  # nvfp4- or mxfp4-pack-quantized: two FP4 values a byte
        fp4 = str(qconfig.get("format") or "fp4-pack-quantized")
        raise UnsupportedDtypeError(f"{packed.dtype} packed FP4 values ({fp4}), which wbfe does not dequantise",
                                    scheme=f"compressed-tensors-{fp4}")
    if packed is not None:
        shape = _stored_shape(parts.get("shape"), packed)
        bits = _packed_bits(shape[-1], int(packed.shape[-1]), _agreed(args, "num_bits"))
    else:
        q = parts["int_weight"]
        if q.dtype != "int8":
            raise CorruptCheckpointError(f"an integer weight of {q.dtype} beside a scale: compressed-tensors stores int8")
        shape = tuple(q.shape)
        bits = config_whole(_agreed(args, "num_bits")) or 8  # the name's width: int8 holds any up to 8 bits
    if not s.dtype.startswith(("float", "bfloat")):
        raise CorruptCheckpointError(f"weight_scale of {s.dtype}: expected floats")
    block = config_block(qconfig, prefix)
    kind, size = scale_layout(shape, s.shape, block, _WHAT)
    zero_shape = tuple(s.shape)
    if z is not None and packed is not None and len(s.shape) >= 2 and tuple(z.shape) != zero_shape:
        zero_shape = (*s.shape[:-2], math.ceil(s.shape[-2] * bits / 32), s.shape[-1])  # packed down the columns
    if z is not None and (tuple(z.shape) != zero_shape or not z.dtype.startswith("int")):
        raise CorruptCheckpointError(f"weight_zero_point of {z.dtype} {list(z.shape)} fits neither the scale "
                                     f"{list(s.shape)} nor its packing")
    if g is not None:
        group_size = size[1] if kind == "block" and size is not None else None
        scheme = f"compressed-tensors-{'pack' if packed is not None else 'int'}-quantized"
        _check_input_order(to_numpy(g.load()), shape[-1], group_size, scheme)
    label = kind
    if kind == "block":
        assert size is not None
        label = f"g{size[1]}" if size[0] == 1 else f"block{size[0] if size[0] == size[1] else shape_text(size)}"

    def load() -> torch.Tensor:
        if packed is not None:
            values = unpack_values(to_torch(packed.load()), bits, shape[-1], -1)
        else:
            values = to_torch(parts["int_weight"].load())
        zero = None if z is None else to_torch(z.load())
        if zero is not None and zero_shape != tuple(s.shape):  # packed down the columns: the scale has 2 dims
            zero = unpack_values(zero, bits, int(s.shape[-2]), -2)
        return dequantize_compressed(values, to_torch(s.load()), zero, block)

    return TensorEntry(name=f"{prefix}.weight", shape=shape, dtype="float64", load=load,
                       quant=f"compressed-tensors-int{bits}-{label}")


def _stored_shape(entry: Optional[TensorEntry], packed: TensorEntry) -> tuple[int, ...]:
    if entry is None:
        raise CorruptCheckpointError("weight_packed without its weight_shape: the number of inputs is unknown")
    if not entry.dtype.startswith(("int", "uint")) or tuple(entry.shape) != (len(packed.shape),):
        raise CorruptCheckpointError(f"weight_shape of {entry.dtype} {list(entry.shape)} for packed words "
                                     f"{list(packed.shape)}: expected {len(packed.shape)} whole numbers")
    shape = tuple(int(v) for v in to_numpy(entry.load()))
    if shape[:-1] != tuple(packed.shape[:-1]) or shape[-1] < 1:
        raise CorruptCheckpointError(f"weight_shape {list(shape)} does not fit packed words {list(packed.shape)}")
    return shape


def _packed_bits(n_in: int, words: int, declared: object) -> int:
    """The width of the values packed ``words`` int32 words a row for ``n_in`` inputs: the config's, checked against
    the words, else the only width that fills them."""
    fits = [b for b in range(1, 9) if math.ceil(n_in * b / 32) == words]
    if declared is not None and config_whole(declared) not in fits:
        raise CorruptCheckpointError(f"config's num_bits {declared} does not fit {words} int32 words a row for "
                                     f"{n_in} inputs")
    if declared is None and len(fits) != 1:
        raise CorruptCheckpointError(f"{words} int32 words a row for {n_in} inputs fit widths {fits} of 1 to 8 bits, "
                                     "and the config names none")
    bits = config_whole(declared) if declared is not None else fits[0]
    assert bits is not None
    if bits not in _WIDTHS:
        raise UnsupportedDtypeError(f"{bits}-bit packed values, whose packing differs between compressed-tensors "
                                    "versions (wbfe reads 1, 2, 4 and 8 bits)", scheme="compressed-tensors-pack-quantized")
    return bits


def _check_input_order(g_idx: Any, n_in: int, group_size: Optional[int], scheme: str) -> None:
    """Refuse a ``weight_g_idx`` that is not the inputs in group order (activation ordering): compressed-tensors 0.20
    decompresses such a weight as if its groups were contiguous, as its earlier versions and vLLM do not, so no
    dequantisation is the package's own."""
    if g_idx.shape != (n_in,) or g_idx.dtype.kind not in "iu":
        raise CorruptCheckpointError(f"weight_g_idx of {g_idx.dtype} {list(g_idx.shape)}: expected [{n_in}] group "
                                     "indexes")
    if not (g_idx == np.arange(n_in) // (group_size or n_in)).all():
        raise UnsupportedDtypeError("an activation-ordered weight_g_idx (inputs out of group order), which "
                                    "compressed-tensors' own decompression no longer applies", scheme=scheme)


def unpack_values(packed: torch.Tensor, bits: int, count: int, dim: int) -> torch.Tensor:
    """The first ``count`` signed ``bits``-bit values packed along ``dim`` of compressed-tensors' int32 words."""
    return unpack_int32(packed, bits, dim).narrow(dim, 0, count) - (1 << (bits - 1))


def dequantize_compressed(q: torch.Tensor, scale: torch.Tensor, zero_point: Optional[torch.Tensor],
                          block: Optional[Sequence[Any]] = None) -> torch.Tensor:
    """W = (q − z)·s in float64, the scale and zero point (of the scale's shape) per tensor, channel, group or block;
    CorruptCheckpointError where the scale's shape fits no layout."""
    import torch

    values = q.to(torch.float64)
    if zero_point is not None:
        values = values - scale_grid(zero_point, q.shape, block, _WHAT)
    return values * scale_grid(scale, q.shape, block, _WHAT)
