"""SVD smoothing and sharpening of a checkpoint (WeightWatcher 0.7.7's ``SVDSmoothing`` and ``SVDSharpness``),
streamed tensor by tensor into a safetensors file replaced atomically. docs/editing.md says how the components
kept or removed are counted and what ``ww_compatible=True`` reproduces."""

from __future__ import annotations

import json
import math
import re
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import numpy as np

from wbfe._deps import require_torch
from wbfe.engine.heads import UNSELECTED
from wbfe.engine.ties import full_digest
from wbfe.errors import (CorruptCheckpointError, InvalidOptionError, NoUsableMatrixError, OutputError,
    UnsupportedDtypeError)
from wbfe.linalg.arrays import to_torch
from wbfe.linalg.spectra import DegenerateMatrixError, near_one
from wbfe.metrics.detx import detx_tail
from wbfe.metrics.mp import mp_fit
from wbfe.metrics.ww_compat import (pooled_eigenvalues, ww_edit_matrix, ww_float32, ww_layer_dims,
    ww_layer_eigenvalues, ww_permuted_eigenvalues, ww_skip_reason, ww_slice_count, ww_svd_count)
from wbfe.options import EditOptions, compile_layers, field_defaults
from wbfe.quant import dequantised
from wbfe.quant.grouping import COMPOSED
from wbfe.render.files import check_output, local_files, local_reads, open_atomic, refuse_overlap
from wbfe.sources import open_source, stored_bytes
from wbfe.sources.peft_adapter import AdapterSource
from wbfe.sources.safetensors_files import SAFETENSORS_DTYPES

if TYPE_CHECKING:
    import torch

__all__ = ["EditSummary", "smooth_matrix", "remove_top", "smoothing_rank", "sharpening_count", "edit_weight",
           "check_editable", "edit_checkpoint", "smooth_checkpoint", "sharpen_checkpoint"]

_FLOAT_DTYPES = ("float64", "float32", "float16", "bfloat16")
# The safetensors code of each dtype written back byte for byte (not the sub-byte floats, nor e8m0).
_CODES = {name: code for code, (name, size) in SAFETENSORS_DTYPES.items() if size >= 1 and code != "F8_E8M0"}


@dataclass(frozen=True)
class EditSummary:
    """What an edit did.

    Attributes:
        edited: ``{tensor name: components kept (smoothing) or removed (sharpening) per slice}``
            for every matrix changed.
        unchanged: ``{tensor name: why}`` for every weight matrix left as it was; every other tensor
            (vectors, integer tensors) is copied byte for byte and not listed.
    """

    output: Path
    edited: dict[str, int]
    unchanged: dict[str, str]

    @property
    def n_matrices(self) -> int:
        """The weight matrices in the checkpoint: every float tensor of two or more dimensions."""
        return len(self.edited) + len(self.unchanged)


def smooth_matrix(w: np.ndarray, keep: int) -> np.ndarray:
    """The best rank-``keep`` approximation of ``w`` (its ``keep`` largest singular components)."""
    u, s, vt = np.linalg.svd(np.asarray(w, dtype=np.float64), full_matrices=False)
    return (u[:, :keep] * s[:keep]) @ vt[:keep]


def remove_top(w: np.ndarray, count: int) -> np.ndarray:
    """``w`` without its ``count`` largest singular components."""
    u, s, vt = np.linalg.svd(np.asarray(w, dtype=np.float64), full_matrices=False)
    return (u[:, count:] * s[count:]) @ vt[count:]


def _slices(w: np.ndarray) -> list[np.ndarray]:
    """The matrices of a weight: itself (2-D) or its kernel positions' out × in slices (4-D)."""
    if w.ndim == 2:
        return [w]
    return [w[:, :, i, j] for i in range(w.shape[2]) for j in range(w.shape[3])]


def smoothing_rank(w: np.ndarray, *, percent: float, method: str) -> int:
    """Components kept per matrix (per slice of a convolution), before the k = 0 / k ≥ M rule.

    Raises:
        InvalidOptionError: ``percent`` outside [0, 1] (method ``svd``), or an unknown method.
        DegenerateMatrixError: method ``detx`` of a matrix with non-finite entries or none but zeros (no
            eigenvalue tail).
    """
    mats = _slices(w)
    rf = len(mats)
    if method == "svd":
        total = int(EditOptions.CONSTRAINTS["percent"]("percent", percent) * min(mats[0].shape) * rf)
    elif method == "detx":
        problem = ("has non-finite values (NaN or Inf)" if not np.isfinite(w).all()
                   else "is all zero" if not np.any(w) else None)
        if problem is not None:  # else the eigen-solve fails, or detx_tail refuses its all-zero eigenvalues
            raise DegenerateMatrixError(f"smoothing method detx keeps the det X = 1 tail of a weight's eigenvalues, "
                                        f"and this {'x'.join(map(str, np.shape(w)))} weight {problem}: it has no "
                                        "such tail; leave it as it is")
        total = detx_tail(pooled_eigenvalues(mats))[0]
    else:
        raise InvalidOptionError(f"smoothing method must be svd or detx, not {method!r}")
    return total if rf == 1 else int(math.ceil(total / rf))


def sharpening_count(w: np.ndarray, *, seed: int = 0, name: str = "") -> int:
    """Components removed per matrix (per slice): the MP spikes of the spectrum of the weight with its entries
    permuted, seeded from ``seed`` and ``name`` (WeightWatcher permutes each slice with NumPy's global generator)."""
    mats = _slices(w)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), zlib.crc32(name.encode())]))
    fit = mp_fit(pooled_eigenvalues([rng.permutation(m.ravel()).reshape(m.shape) for m in mats]), max(w.shape[:2]),
                 min(w.shape[:2]))
    spikes = int(fit.num_spikes) if fit.reason is None else 0
    return spikes if len(mats) == 1 else -int(math.ceil(-spikes / len(mats)))


def edit_weight(w: np.ndarray, operation: Callable[[np.ndarray, int], np.ndarray], count: int,
                dtype: type = np.float64) -> np.ndarray:
    """``operation(slice, count)`` on every matrix of ``w`` (2-D, or each kernel position of a 4-D kernel), in
    ``dtype``."""
    w = np.asarray(w, dtype=dtype)
    if w.ndim == 2:
        return operation(w, count)
    return np.stack([operation(m, count) for m in _slices(w)], axis=-1).reshape(w.shape).astype(w.dtype)


def _is_weight(shape: tuple[int, ...], dtype: str, pattern: Optional["re.Pattern[str]"], name: str,
               only: Optional[frozenset[str]] = None) -> Optional[str]:
    """None for a weight matrix to edit, ``""`` for no weight matrix, else why the matrix is left as it is.
    ``only``: exactly the floating-point tensors of these names are edited (whatever their shape)."""
    if only is not None:
        return None if name in only and dtype in _FLOAT_DTYPES else ""
    if len(shape) < 2 or not dtype.startswith(("float", "bfloat")):
        return ""
    if dtype not in _FLOAT_DTYPES:  # FP8 / FP4: a weight matrix too, copied as it is and listed
        return f"stored as {dtype}: only float64, float32, float16 and bfloat16 weights are edited"
    if pattern is not None and not pattern.search(name):
        return UNSELECTED
    if len(shape) not in (2, 4):
        return f"a {len(shape)}-D weight: only matrices and 4-D convolution kernels are edited"
    if min(shape[:2]) < 2:
        if len(shape) == 4 and shape[1] == 1:
            return (f"one input channel (a depthwise convolution, or a first layer on one channel): its "
                    f"{shape[0]}×1 slices have one singular value each, nothing to edit")
        return f"too small: {shape[0]}×{shape[1]} has one singular value, nothing to edit"
    return None


def _header(described: list[tuple[str, tuple[int, ...], str]], metadata: dict[str, str]) -> bytes:
    """The safetensors header (length prefix included) of tensors ``(name, shape, dtype)`` in order."""
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, shape, dtype in described:
        code = _CODES.get(dtype)
        if code is None:
            raise UnsupportedDtypeError(f"{name}: dtype {dtype} cannot be written to safetensors here", name=name)
        if name in header:
            raise UnsupportedDtypeError(f"{name}: two tensors of this name", name=name)
        nbytes = stored_bytes(shape, dtype)
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as the safetensors writer pads it
    return len(raw).to_bytes(8, "little") + raw


#: ``editor(name, weight) -> (edited weight or None, count, why it is left as it is)``
Editor = Callable[[str, "torch.Tensor"], tuple[Optional[np.ndarray], int, str]]


def edited_output(out: Union[str, Path], reads: Any, what: str) -> Path:
    """Where an edited checkpoint goes: a file named ``*.safetensors`` (what it is written as, and what any reader,
    wbfe's re-score of a pruned model among them, takes it for), never over or into what is read."""
    target = check_output(out, reads=reads)
    if target is None:
        raise OutputError(f"the {what} checkpoint needs a file path, not standard output")
    if not str(out).lower().endswith(".safetensors"):  # the name given (a hub file resolves to a blob)
        raise OutputError(f"cannot write {out}: the {what} checkpoint is a safetensors file; name it *.safetensors")
    return target


def check_editable(ref: Any) -> dict[str, list[int]]:
    """Refuse ``ref`` before any work as :func:`edit_checkpoint` would (CorruptCheckpointError for a second copy of
    a tensor, UnsupportedDtypeError for a quantised one); else each stored tensor's shape, by name."""
    with open_source(ref) as source:
        listed = list(source.entries())
        _left_out(source, listed)
        return {e.name: list(e.shape) for e in listed}


def _left_out(source: Any, listed: list[Any]) -> dict[str, str]:
    """What a score of ``source`` leaves out (name: reason), to be copied unedited; refused: a second copy of a
    tensor in another shard, a quantised weight."""
    ref = source.provenance.source
    if isinstance(source, AdapterSource):  # its factors were smoothed one by one (B₃·A₃ is no rank-3 ΔW of B·A)
        raise InvalidOptionError(f"{ref}: a PEFT LoRA adapter: what a score of it reads is each module's ΔW = B·A, "
                                 "which no edit of lora_A and lora_B one by one gives; merge it into its base model "
                                 "(PEFT's merge_and_unload), save that, and edit the merged checkpoint")
    for entry in listed:
        if entry.copy_of is not None:  # copied, it would be a key the input never had; neither copy is surely meant
            raise CorruptCheckpointError(
                f"{ref}: cannot edit it: shard {entry.name[:-len(entry.copy_of) - 1]} holds {entry.skip}; keep one "
                "copy (delete the other from its shard, and point the index at the shard kept), then edit again",
                ref=ref, name=entry.copy_of)
    left_out = {e.name: e.skip for e in listed if e.skip}
    # A weight stored as packed integers with scales (GPTQ, AWQ, FP8 blocks) is several plain tensors in the file:
    # grouped as a score groups them, lest its scales be edited as a matrix of their own.
    for entry, why in dequantised(listed, source.config):
        if entry.quant is not None:  # composed: an edit of v alone would change another weight
            stored, lost = (("as the parts torch composes it from", "write it back as its parts")
                            if entry.quant.startswith(COMPOSED) else ("quantised", "copy it byte for byte"))
            raise UnsupportedDtypeError(f"{entry.name}: stored {stored} ({entry.quant}); editing writes plain tensors "
                                        f"and would not {lost}", name=entry.name)
        if why is not None:
            left_out[entry.name] = why
    return left_out


def edit_checkpoint(ref: Any, out: Union[str, Path], *, editor: Editor, only: Optional[frozenset[str]] = None,
                    extra_metadata: Optional[dict[str, str]] = None, layers: Optional[str] = None) -> EditSummary:
    """Write ``ref`` to the safetensors file ``out`` with each selected weight matrix passed through ``editor``.

    Streamed one tensor at a time: ``editor`` is called on the floating-point tensors named in ``only``
    (None: every weight matrix ``layers`` selects), every other tensor copied byte for byte, the input's
    metadata kept and ``extra_metadata`` added to it (its keys replace the input's). Raises as
    :func:`smooth_checkpoint`."""
    torch = require_torch("smoothing or sharpening a checkpoint")

    pattern = compile_layers(layers)
    reads = local_reads(ref)
    target = edited_output(out, reads, "edited")  # before the checkpoint is opened
    edited: dict[str, int] = {}
    unchanged: dict[str, str] = {}
    with open_source(ref) as source:
        # the files the reader resolved (an index's shards) are known only now
        reads = (*reads, *local_files(source.provenance.files))
        refuse_overlap(target, reads)
        # Pass 1 reads no data (the header comes first in the file); pass 2 streams the tensors in the same order.
        listed = list(source.entries())
        described = [(e.name, tuple(e.shape), e.dtype) for e in listed]
        # What the reader leaves out of a score (optimizer moments, a second state dict) is copied, never edited.
        left_out = _left_out(source, listed)
        if only is None and not any(dtype in _FLOAT_DTYPES and len(shape) >= 2 and name not in left_out
                                    and (pattern is None or pattern.search(name)) for name, shape, dtype in described):
            raise NoUsableMatrixError(f"{source.provenance.source}: "
                                      + (f"--layers {layers!r} selects none of its" if pattern else "it holds no")
                                      + " weight matrices: nothing to edit", ref=source.provenance.source)
        del listed  # a pickle's entries hold its tensors: not kept through the second pass
        ties = _ties(source.entries(), described)
        tied_out: dict[str, bytes] = {name: b"" for name in ties.values()}  # each first copy's bytes, as written
        raw = source.provenance.extra.get("metadata") or {}
        metadata = {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in dict(raw).items()}
        metadata.update(extra_metadata or {})
        with open_atomic(target, reads=reads) as fh:
            fh.write(_header(described, metadata))
            for k, entry in enumerate(source.entries()):
                if k >= len(described) or described[k] != (entry.name, tuple(entry.shape), entry.dtype):
                    raise UnsupportedDtypeError(f"{entry.name}: the checkpoint changed between two reads", name=entry.name)
                tensor = to_torch(entry.load())
                if tensor.is_meta or tensor.layout != torch.strided:
                    raise UnsupportedDtypeError(f"{entry.name}: {entry.skip or 'no dense values'}; it cannot be "
                                                "written to safetensors", name=entry.name)
                if tuple(tensor.shape) != tuple(entry.shape) or str(tensor.dtype).removeprefix("torch.") != entry.dtype:
                    raise UnsupportedDtypeError(f"{entry.name}: the reader gives {tuple(tensor.shape)} {tensor.dtype}, "
                                                f"not the {entry.shape} {entry.dtype} it declared", name=entry.name)
                earlier = ties.get(entry.name)
                if earlier is not None:  # written as its first copy was, or the edit would untie them
                    if only is not None and entry.name in only and earlier not in only:
                        raise InvalidOptionError(f"{entry.name} is tied to {earlier} (the same values), which is "
                                                 "left as it is: editing one alone unties them; select both or "
                                                 "neither", name=entry.name)
                    if earlier in edited:
                        edited[entry.name] = edited[earlier]
                    elif earlier in unchanged:
                        unchanged[entry.name] = f"tied to {earlier} (the same values), written as it is: " + (
                            unchanged[earlier])
                    fh.write(tied_out[earlier])
                    continue
                why = _is_weight(tuple(entry.shape), entry.dtype, pattern, entry.name, only)
                if (why is None or why and entry.dtype not in _FLOAT_DTYPES) and only is None and entry.name in left_out:
                    why = f"not a weight the score reads ({left_out[entry.name]})"
                if why is None:
                    new, count, why = editor(entry.name, tensor)
                    cast = None if new is None else torch.from_numpy(new).to(tensor.dtype)
                    if cast is not None and bool(torch.isfinite(cast).all()):
                        tensor = cast
                        edited[entry.name] = count
                        why = ""
                    elif new is not None:
                        why = (f"the edited entries (up to {float(np.max(np.abs(new))):.4g}) overflow {entry.dtype}: "
                               "left as it is")
                if why:
                    unchanged[entry.name] = why
                data = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                if entry.name in tied_out:
                    tied_out[entry.name] = data
                fh.write(data)
    return EditSummary(output=target, edited=edited, unchanged=unchanged)


def _ties(entries: Any, described: list[tuple[str, tuple[int, ...], str]]) -> dict[str, str]:
    """``{name: the first tensor with its values}`` for each weight matrix that repeats an earlier one (tied weights:
    one storage under two names, or saved twice), as a score reads them once. Only the matrices that share a shape
    and dtype with another are read for it."""
    kinds = Counter((shape, dtype) for _, shape, dtype in described if dtype in _FLOAT_DTYPES and len(shape) >= 2)
    first: dict[tuple[Any, ...], str] = {}
    ties: dict[str, str] = {}
    for entry in entries:
        kind = (tuple(entry.shape), entry.dtype)
        if kinds[kind] < 2 or entry.skip:
            continue
        name = first.setdefault((*kind, full_digest(to_torch(entry.load()))), entry.name)
        if name != entry.name:
            ties[entry.name] = name
    return ties


def _ww_apply(w32: np.ndarray, num_smooth: int) -> tuple[Optional[np.ndarray], int, str]:
    """WeightWatcher's edit of one layer, or why it leaves the layer as it is."""
    per_slice = ww_slice_count(w32.shape, num_smooth)
    if per_slice == 0:
        return None, 0, "count 0: WeightWatcher does not edit it"
    if per_slice > min(w32.shape[:2]):
        return None, per_slice, (f"keeps {per_slice} > {min(w32.shape[:2])} components: WeightWatcher's TruncatedSVD "
                                 "refuses it (its SVDSmoothing fails)")
    return edit_weight(w32, ww_edit_matrix, per_slice, np.float32), abs(per_slice), ""


def _edit(ref: Any, out: Union[str, Path], options: EditOptions, ww_count: Callable[[np.ndarray], int],
          count: Callable[[str, np.ndarray], tuple[int, str]],
          operation: Callable[[np.ndarray, int], np.ndarray]) -> EditSummary:
    """:func:`edit_checkpoint` with WeightWatcher's edit (``ww_count``: its count for the float32 weight) or
    wbfe's (``count``: components per slice in float64, and why the weight is left as it is, or ``""``)."""
    def editor(name: str, tensor: "torch.Tensor") -> tuple[Optional[np.ndarray], int, str]:
        if not bool(tensor.isfinite().all()):  # no SVD of it converges
            return None, 0, "non-finite values (NaN or Inf): left as it is"
        zero = "" if bool(tensor.any()) else "all zero: no singular component to keep or remove; left as it is"
        if options.conventions.ww_edit:  # the weight as WeightWatcher reads it, tensor.float().numpy()
            skip = ww_skip_reason(tuple(tensor.shape))
            if skip is not None:
                return None, 0, skip
            stored = tensor.detach().cpu()
            try:  # a finite float64 tensor float32 cannot hold: WeightWatcher would edit infinities or zeros
                w32 = ww_float32(stored.numpy() if str(stored.dtype) == "torch.float64" else stored.float().numpy(),
                                 "edit")
            except DegenerateMatrixError as exc:
                return None, 0, f"{exc}: left as it is"
            ww_k = ww_count(w32)  # also for an all-zero weight: sharpening draws from the one generator as WW does
            return (None, 0, zero) if zero else _ww_apply(w32, ww_k)
        if zero:
            return None, 0, zero
        # The counts do not depend on the scale and the edits scale with w: where its Gram matrix would leave
        # float64's range, w is brought near 1 by a power of two (exact), and scaled back.
        w, f = near_one(np.asarray(tensor.detach().cpu().double().numpy()))
        k, why = count(name, w)
        return (None, k, why) if why else (edit_weight(w, operation, k) / f, k, "")

    return edit_checkpoint(ref, out, layers=options.layers, editor=editor)


_DEFAULTS = field_defaults(EditOptions)  # the keywords' defaults are the options' own


def smooth_checkpoint(ref: Any, out: Union[str, Path], *, percent: float = _DEFAULTS["percent"],
                      method: str = _DEFAULTS["method"], layers: Optional[str] = _DEFAULTS["layers"],
                      ww_compatible: bool = _DEFAULTS["ww_compatible"]) -> EditSummary:
    """Write ``ref`` with every weight matrix replaced by its SVD smoothing (docs/editing.md).

    Args:
        ref: any checkpoint :func:`wbfe.sources.open_source` reads.
        out: the safetensors file to write (replaced atomically).
        percent: fraction of the components kept, method ``svd`` (WeightWatcher's default 0.8).
        method: ``svd`` (a fixed fraction) or ``detx`` (the det X = 1 tail).
        layers: a regular expression; only matching tensors are edited (the rest are copied).
        ww_compatible: WeightWatcher 0.7.7's edit exactly (:mod:`wbfe.metrics.ww_compat`): its layers,
            counts and randomised truncated SVD, in float32.

    Raises:
        InvalidOptionError: a bad option, a ``percent`` with ``method="detx"``, or a PEFT LoRA adapter (merge it
            first); NoUsableMatrixError: no weight matrix selected; OutputError: ``out`` cannot be written
            (OverwriteError: it is, or lies in, what is read); UnsupportedDtypeError: a tensor that cannot be copied
            exactly; CorruptCheckpointError: a shard holds a second copy of a tensor; the errors of
            :func:`wbfe.sources.open_source`.
    """
    options = EditOptions(percent=percent, method=method, layers=layers, ww_compatible=ww_compatible)

    def ww_count(w32: np.ndarray) -> int:
        if options.method == "svd":
            return ww_svd_count(w32.shape, options.percent)
        eigs = ww_layer_eigenvalues(w32)
        return detx_tail(eigs)[0] if eigs[-1] > 0.0 else 0  # an all-zero layer: WW's detX count is 0

    def count(name: str, w: np.ndarray) -> tuple[int, str]:
        keep = smoothing_rank(w, percent=options.percent, method=options.method)
        if keep <= 0:
            return keep, "keeps 0 components: left as it is (WeightWatcher does not smooth it)"
        return keep, f"keeps all {min(w.shape[:2])} components" if keep >= min(w.shape[:2]) else ""

    return _edit(ref, out, options, ww_count, count, smooth_matrix)


def sharpen_checkpoint(ref: Any, out: Union[str, Path], *, layers: Optional[str] = _DEFAULTS["layers"],
                       seed: int = _DEFAULTS["seed"], ww_compatible: bool = _DEFAULTS["ww_compatible"]) -> EditSummary:
    """Write ``ref`` with the correlation-trap components removed from every weight matrix.

    Args:
        ref, out, layers, ww_compatible: as for :func:`smooth_checkpoint`, which also lists the errors raised.
        seed: seed of the permutations (with each tensor's name; with ``ww_compatible``, the seed
            of one NumPy ``RandomState`` drawn from tensor after tensor in the checkpoint's order,
            as WeightWatcher draws from NumPy's global generator after ``np.random.seed(seed)``).
    """
    options = EditOptions(layers=layers, seed=seed, ww_compatible=ww_compatible)
    generator = np.random.RandomState(options.seed)

    def ww_count(w32: np.ndarray) -> int:
        n, m, _ = ww_layer_dims(w32.shape)
        fit = mp_fit(ww_permuted_eigenvalues(w32, generator), n, m)
        # WW's fit cannot fail on a matrix with a non-zero entry; an all-zero one is left as it is
        return -int(fit.num_spikes) if fit.reason is None else 0

    def count(name: str, w: np.ndarray) -> tuple[int, str]:
        removed = sharpening_count(w, seed=options.seed, name=name)
        return removed, "" if removed > 0 else "no correlation trap (no MP spike in the permuted spectrum)"

    return _edit(ref, out, options, ww_count, count, remove_top)
