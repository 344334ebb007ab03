"""Group a quantized weight with its scales as the entries stream past, and dequantise it on load; likewise compose
a weight torch stores as parts (weight norm's g and v, spectral norm's weight and u, v) into the weight the model uses.

A weight and its companions share a module prefix (``x.qweight``, ``x.scales``; ``x.weight_g``, ``x.weight_v``) and
lie next to each other in any stored order wbfe meets, so a group is held (its metadata only) until the stream moves
past its prefix."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Iterable, Iterator, Mapping, Optional

import numpy as np

from wbfe._deps import require_torch
from wbfe.errors import CorruptCheckpointError, UnsupportedDtypeError
from wbfe.framework import IN_OUT, OUT_IN
from wbfe.linalg.arrays import to_numpy, to_torch
from wbfe.quant.compressed import compressed_weight, config_block, dequantize_compressed
from wbfe.quant.fp8 import FP8_FORMATS, config_whole, fp8_scheme
from wbfe.quant.mxfp4 import dequantize_mxfp4
from wbfe.quant.packed_int import dequantize_awq, dequantize_gptq
from wbfe.sources import TensorEntry

__all__ = ["dequantised", "COMPOSED"]

# Suffix -> part of a quantized weight; MXFP4's parts end in `_blocks` / `_scales` instead.
_PARTS = {"weight_scale_inv": "scale", "weight_scale": "scale", "input_scale": "input_scale",
          "qweight": "qweight", "qzeros": "qzeros", "scales": "scales", "g_idx": "g_idx",
          "weight_packed": "packed", "weight_shape": "shape", "weight_zero_point": "zero_point",
          "weight_g_idx": "g_idx", "weight_global_scale": "global_scale", "input_zero_point": "input_zero_point",
          "input_global_scale": "input_global_scale", "scale_packed": "scale"}
# compressed-tensors' sparse layouts keep a weight's nonzero values and code their positions in a bitmask (2:4 or
# unstructured): parts of `<prefix>.weight`, never decompressed.
_SPARSE = {".weight.compressed": "kept", ".weight.bitmask": "bitmask", ".weight.row_offsets": "row_offsets",
           ".weight.shape": "shape"}
_WHAT = {"scale": "scale", "input_scale": "activation scale", "qweight": "packed data", "qzeros": "zero points",
         "scales": "scales", "g_idx": "group index", "mx_scales": "E8M0 scales", "blocks": "FP4 blocks",
         "packed": "packed data", "shape": "shape", "zero_point": "zero points", "int_weight": "integer values",
         "global_scale": "global scale", "input_zero_point": "activation zero point",
         "input_global_scale": "activation global scale", "kept": "kept values", "bitmask": "bitmask",
         "row_offsets": "row offsets"}

# torch's normalised weights: weight norm's magnitude g and direction v (torch.nn.utils.weight_norm's weight_g and
# weight_v; parametrizations.weight_norm's original0 and original1) and spectral norm's weight before its division by σ
# with its power-iteration vectors (weight_orig, weight_u, weight_v; parametrizations' original, 0._u and 0._v).
_NEW = re.compile(r"((?:.*\.)?)parametrizations\.([^.]+)\.(.+)")
_OLD = re.compile(r"((?:.*\.)?weight)_(g|v|orig|u)")
_NEW_ROLES = {"original0": "g", "original1": "v", "original": "orig", "0._u": "u", "0._v": "v"}
_KINDS = {("g", "v"): "weight-norm", ("orig", "u", "v"): "spectral-norm"}
COMPOSED = tuple(_KINDS.values())  # the `quant` of a composed weight begins so: no storage an edit can write back
_ROLE_WHAT = {"g": "magnitude g", "v": "direction v", "orig": "weight before its division by σ",
              "u": "power-iteration vector u"}

# The parts that make a quantized weight whole, one set a layout (FP8, GPTQ/AWQ, MXFP4, compressed-tensors' three).
_WHOLE = ({"weight", "scale"}, {"qweight", "qzeros", "scales"}, {"blocks", "mx_scales"}, {"packed", "scale"},
          {"int_weight", "scale"}, {"kept", "bitmask"})

Item = tuple[TensorEntry, Optional[str]]
_WORDS = ("int32", "uint32")


def _split(entry: TensorEntry) -> Optional[tuple[str, str]]:
    """``(prefix, part)`` of a tensor that belongs to a quantized weight (or ``(weight, its own name)`` of a part of
    a normalised weight), else None."""
    name = entry.name
    if (norm := _norm_part(name)) is not None:
        return norm[0], name
    mxfp4 = {"_blocks": "blocks", "_scales": "mx_scales"} if entry.dtype == "uint8" else {}
    for suffix, part in {**mxfp4, **_SPARSE}.items():
        if name.endswith(suffix):
            return name[: -len(suffix)], part
    prefix, _, last = name.rpartition(".")
    if last == "weight" and entry.dtype in FP8_FORMATS:
        return prefix, "weight"
    if last == "weight" and entry.dtype.startswith(("int", "uint")):
        return prefix, "int_weight"
    return (prefix, _PARTS[last]) if last in _PARTS else None


def _norm_part(name: str) -> Optional[tuple[str, str]]:
    """``(the weight's name, the part's role: g, v, orig, u, or "" for another parametrization's)`` of a tensor torch
    stores for a normalised weight, else None."""
    if (new := _NEW.fullmatch(name)) is not None:
        return new[1] + new[2], _NEW_ROLES.get(new[3], "")
    old = _OLD.fullmatch(name)
    return (old[1], old[2]) if old is not None else None


def _roles(parts: dict[str, TensorEntry]) -> dict[str, str]:
    """Each part's role (:func:`_norm_part`) where ``parts``, keyed by their names, are a normalised weight's."""
    return {name: part[1] for name in parts if (part := _norm_part(name)) is not None}


def _complete(parts: dict[str, TensorEntry]) -> bool:
    return tuple(sorted(_roles(parts).values())) in _KINDS or any(whole <= parts.keys() for whole in _WHOLE)


def dequantised(entries: Iterable[TensorEntry], config: Optional[dict[str, Any]] = None,
                layouts: Optional[Mapping[str, str]] = None) -> Iterator[Item]:
    """``(entry, None)`` for a tensor to plan as usual (a dequantised weight among them) and
    ``(entry, reason)`` for one consumed by a quantized weight or unusable without its parts. ``layouts``: the
    checkpoint's description's (None where there is none), which says which weights are transposed convolutions."""
    qconfig = config.get("quantization_config") if isinstance(config, dict) else None
    qconfig = qconfig if isinstance(qconfig, dict) else {}
    pending: dict[str, dict[str, TensorEntry]] = {}
    emitted: dict[str, str] = {}
    for entry in entries:
        split = _split(entry)
        prefix = split[0] if split is not None else None
        for done in [p for p, parts in pending.items() if p != prefix and _complete(parts)]:
            yield from _emit(done, pending.pop(done), qconfig, emitted, layouts)
        if split is None:
            yield entry, None
        elif prefix in emitted and split[1] in _WHAT:  # a late companion (an activation scale)
            yield entry, f"consumed: {_WHAT[split[1]]} of {emitted[prefix]}"
        else:
            pending.setdefault(split[0], {})[split[1]] = entry
    for prefix, parts in pending.items():
        yield from _emit(prefix, parts, qconfig, emitted, layouts)


def _emit(prefix: str, parts: dict[str, TensorEntry], qconfig: dict[str, Any], emitted: dict[str, str],
          layouts: Optional[Mapping[str, str]]) -> Iterator[Item]:
    if roles := _roles(parts):
        yield from _compose(prefix, parts, roles, layouts)
        return
    if parts.keys() == {"int_weight"}:  # an integer tensor named weight, no scale beside it: planned as any other
        yield parts["int_weight"], None
        return
    if not _complete(parts):
        # Not a quantized weight after all (a float parameter named `scales`), or one missing a part: an integer
        # part (packed words, zero points, a group index) says which, and its float scales are no matrix then.
        quantised = any(not e.dtype.startswith(("float", "bfloat")) for e in parts.values())
        for part, entry in parts.items():
            if part == "weight":
                yield entry, f"FP8 weight without its scale ({prefix}.weight_scale_inv or .weight_scale)"
            elif entry.dtype.startswith(("float", "bfloat")) and not quantised:
                yield entry, None
            else:
                yield entry, f"{_WHAT[part]} of a quantized weight whose other parts are missing"
        return
    try:
        weight = _build(prefix, parts, qconfig)
    except UnsupportedDtypeError as exc:  # a layout wbfe cannot dequantise exactly: marked quantised, so an edit refuses it
        for part, entry in parts.items():
            yield dataclasses.replace(entry, quant=str(exc.fields["scheme"])), (
                f"{_WHAT[part]} of {prefix}.weight, stored as {exc}: not scored")
        return
    except CorruptCheckpointError as exc:
        for entry in parts.values():
            yield entry, f"quantized weight {prefix} unreadable: {exc}"
        return
    emitted[prefix] = weight.name
    yield weight, None
    for part, entry in parts.items():
        if part not in ("weight", "qweight", "blocks", "packed", "int_weight"):  # int_weight: the name it replaces
            yield entry, f"consumed: {_WHAT[part]} of {weight.name}"
    if (main := parts.get("qweight") or parts.get("blocks") or parts.get("packed")) is not None:
        yield main, f"consumed: packed data of {weight.name} (scored dequantised)"


def _entry(name: str, shape: tuple[int, ...], quant: str, load: Any, layout: str = OUT_IN) -> TensorEntry:
    return TensorEntry(name=name, shape=tuple(int(s) for s in shape), dtype="float64", load=load, quant=quant,
                       layout=layout)


def _build(prefix: str, parts: dict[str, TensorEntry], qconfig: dict[str, Any]) -> TensorEntry:
    # Asked when the weight is planned, so that a missing torch stops the run before any work.
    require_torch(f"dequantising {prefix} (FP8, MXFP4, GPTQ, AWQ and compressed-tensors weights)")
    if "bitmask" in parts:
        raise UnsupportedDtypeError("compressed-tensors' sparse bitmask layout (the nonzero values, their positions "
                                    "in a bitmask), which wbfe does not decompress", scheme="compressed-tensors-sparse")
    if "packed" in parts or "int_weight" in parts:
        return compressed_weight(prefix, parts, qconfig)
    if "weight" in parts:
        w, s = parts["weight"], parts["scale"]
        z = parts.get("zero_point")  # compressed-tensors' asymmetric FP8: (w − z)·s
        if z is not None and tuple(z.shape) != tuple(s.shape):
            raise CorruptCheckpointError(f"FP8 zero point {list(z.shape)} and scale {list(s.shape)} differ in shape")
        block = config_block(qconfig, prefix) if "config_groups" in qconfig else qconfig.get("weight_block_size")
        scheme = fp8_scheme(w.dtype, w.shape, s.shape, block)
        return _entry(w.name, w.shape, scheme, lambda: dequantize_compressed(
            to_torch(w.load()), to_torch(s.load()), None if z is None else to_torch(z.load()), block))
    if "blocks" in parts:
        b, s = parts["blocks"], parts["mx_scales"]
        if len(b.shape) < 3 or b.shape[-1] != 16 or tuple(b.shape[:-1]) != tuple(s.shape):
            raise CorruptCheckpointError(f"MXFP4 blocks {list(b.shape)} and scales {list(s.shape)} do not match")
        shape = (*b.shape[:-3], b.shape[-2] * 32, b.shape[-3])
        return _entry(prefix, shape, "mxfp4", lambda: dequantize_mxfp4(to_torch(b.load()), to_torch(s.load())))
    q, z, s = parts["qweight"], parts["qzeros"], parts["scales"]
    g = parts.get("g_idx")
    if q.dtype not in _WORDS or z.dtype not in _WORDS:  # a float's value read as bits would be garbage
        raise CorruptCheckpointError(f"qweight of {q.dtype} and qzeros of {z.dtype}: GPTQ and AWQ pack int32 words")
    if len(q.shape) != 2 or len(z.shape) != 2 or len(s.shape) != 2 or z.shape[0] != s.shape[0] or 0 in s.shape:
        raise CorruptCheckpointError(f"qweight {list(q.shape)}, qzeros {list(z.shape)}, scales {list(s.shape)}")
    groups, n_out = s.shape
    method = str(qconfig.get("quant_method", "")).lower()
    awq = method == "awq" or (method != "gptq" and q.shape[1] != n_out)
    bits_f = 32 * z.shape[1] / n_out
    if bits_f not in (2, 4, 8) or (32 * q.shape[1] / n_out != bits_f if awq else q.shape[1] != n_out):
        raise CorruptCheckpointError(f"packing of qweight {list(q.shape)} / qzeros {list(z.shape)} for "
                                     f"{n_out} outputs is no 2-, 4- or 8-bit layout")
    bits = int(bits_f)
    declared = qconfig.get("bits", qconfig.get("w_bit"))
    if declared is not None and config_whole(declared) != bits:
        raise CorruptCheckpointError(f"config says {declared} bits, the tensors hold {bits}")
    n_in = q.shape[0] if awq else q.shape[0] * 32 // bits
    group_size = -1 if groups == 1 else math.ceil(n_in / groups)
    declared = qconfig.get("group_size", qconfig.get("q_group_size"))
    if declared is not None and config_whole(declared) != group_size:
        raise CorruptCheckpointError(f"config's group size {declared} does not fit {groups} groups of {n_in} inputs")
    if g is not None and not awq:
        if tuple(g.shape) != (n_in,) or not g.dtype.startswith(("int", "uint")):
            raise CorruptCheckpointError(f"GPTQ g_idx of {g.dtype} {list(g.shape)}: expected whole group indexes "
                                         f"[{n_in}]")
        # Read now (one integer an input): a group its scales do not have would leave an input without a scale, and
        # the weight is skipped saying so before any work.
        g_idx = to_numpy(g.load())
        outside = (g_idx < 0) | (g_idx >= groups)
        if outside.any():
            first = int(outside.argmax())
            raise CorruptCheckpointError(
                f"GPTQ g_idx gives {int(outside.sum())} of its {g_idx.size} inputs a group outside the {groups} of its "
                f"scales (input {first}: group {int(g_idx[first])}, expected 0 to {groups - 1})")
    label = f"g{group_size}" if group_size > 0 else "channel"
    name = f"{prefix}.weight"
    if awq:
        return _entry(name, (n_out, n_in), f"awq-int{bits}-{label}", lambda: dequantize_awq(
            to_torch(q.load()), to_torch(z.load()), to_torch(s.load()), bits=bits, group_size=group_size))
    offset = 0 if str(qconfig.get("checkpoint_format", "gptq")).lower() == "gptq_v2" else 1
    return _entry(name, (n_out, n_in), f"gptq-int{bits}-{label}", lambda: dequantize_gptq(
        to_torch(q.load()), to_torch(z.load()), to_torch(s.load()), bits=bits, group_size=group_size,
        g_idx=to_torch(g.load()) if g is not None else None, zero_offset=offset))


def _compose(name: str, parts: dict[str, TensorEntry], roles: dict[str, str],
             layouts: Optional[Mapping[str, str]]) -> Iterator[Item]:
    """The weight ``name`` that torch composes from ``parts`` (scored as the model uses it, in float64), and
    its parts consumed; parts that compose no weight wbfe knows are skipped saying so (never one scored alone)."""
    if all(_OLD.fullmatch(n) for n in parts) and not {"g", "orig"} & {*roles.values()}:  # weight_u, weight_v only:
        yield from ((entry, None) for entry in parts.values())  # not torch's names for parts (low-rank factors?)
        return
    kind = _KINDS.get(tuple(sorted(roles.values())))
    by_role = {role: parts[n] for n, role in roles.items()}
    try:
        if kind is None:
            raise CorruptCheckpointError(f"its stored parts ({', '.join(sorted(parts))}) are neither weight norm's "
                                         "(g, v) nor spectral norm's (weight, u, v)")
        if not all(e.dtype.startswith(("float", "bfloat")) and e.dtype not in FP8_FORMATS for e in parts.values()):
            raise CorruptCheckpointError(f"parts of {', '.join(sorted({e.dtype for e in parts.values()}))}: "
                                         "expected floats")
        compose = _weight_norm if kind == "weight-norm" else _spectral_norm
        weight = compose(name, layouts, **by_role)
    except CorruptCheckpointError as exc:
        for entry in parts.values():
            yield entry, f"part of {name}, which wbfe cannot compose: {exc}; not scored"
        return
    yield weight, None
    for part, role in roles.items():
        what = "power-iteration vector v" if role == "v" and kind == "spectral-norm" else _ROLE_WHAT[role]
        yield parts[part], f"consumed: {what} of {name} ({kind.replace('-', ' ')}, scored composed)"


def _weight_norm(name: str, layouts: Optional[Mapping[str, str]], g: TensorEntry, v: TensorEntry) -> TensorEntry:
    """W = g·v/‖v‖, the norm over every dim of v but the one g is not 1 along (over all of v where g is one value)."""
    dims = [d for d, size in enumerate(g.shape) if size != 1]
    if len(g.shape) not in (0, len(v.shape)) or len(dims) > 1 or any(g.shape[d] != v.shape[d] for d in dims):
        raise CorruptCheckpointError(f"magnitude g {list(g.shape)} fits no dim of direction v {list(v.shape)}")
    kept = dims[0] if dims else None

    def load() -> Any:
        direction = _float64(v)
        norm = np.sqrt(np.square(direction).sum(axis=tuple(d for d in range(direction.ndim) if d != kept),
                                                keepdims=True))
        with np.errstate(divide="ignore", invalid="ignore"):  # a zero v is NaN in the model too: skipped as such
            return direction * (_float64(g) / norm)

    return _entry(name, v.shape, f"weight-norm-dim{kept}" if kept is not None else "weight-norm-whole", load,
                  (layouts or {}).get(name, v.layout))


def _spectral_norm(name: str, layouts: Optional[Mapping[str, str]], orig: TensorEntry, u: TensorEntry,
                   v: TensorEntry) -> TensorEntry:
    """W / σ, σ = uᵀ·W·v with W as a matrix of its dim ``u`` spans by the rest, as torch computes it in eval mode. Of
    two dims ``u`` spans, torch's default: the output's (0 for a matrix or a convolution, 1 for a transposed one,
    which only a description of the checkpoint tells from a convolution of as many inputs as outputs)."""
    layout = (layouts or {}).get(name, orig.layout)
    dims = [d for d, size in enumerate(orig.shape) if (size,) == tuple(u.shape)]
    if len(dims) > 1 and len(orig.shape) > 2 and layouts is None and layout != IN_OUT:
        raise CorruptCheckpointError(f"vector u [{u.shape[0]}] fits dims {dims} of the weight {list(orig.shape)}: "
                                     "torch takes 0 for a convolution, 1 for a transposed one, and the checkpoint "
                                     "does not say which it is")
    if len(dims) > 1:
        dims = [d for d in dims if d == (1 if layout == IN_OUT else 0)]
    if len(dims) != 1 or math.prod(orig.shape) != math.prod(u.shape) * math.prod(v.shape) or len(v.shape) != 1:
        raise CorruptCheckpointError(f"vectors u {list(u.shape)} and v {list(v.shape)} fit no one dim of the weight "
                                     f"{list(orig.shape)}")

    def load() -> Any:
        w, left = _float64(orig), _float64(u)
        with np.errstate(divide="ignore", invalid="ignore"):  # σ = 0 makes it non-finite, in the model too
            return w / (left @ np.moveaxis(w, dims[0], 0).reshape(left.size, -1) @ _float64(v))

    return _entry(name, orig.shape, f"spectral-norm-dim{dims[0]}", load, layout)


def _float64(entry: TensorEntry) -> Any:
    return to_numpy(entry.load()).astype(np.float64)
