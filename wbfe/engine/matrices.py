"""Tensor -> weight matrices: which tensors are analysed, in what role and convention, and why not.

Decisions here use only a tensor's name, shape, dtype and layout (read from the checkpoint header and the checkpoint's
own description), so tensors that will be skipped are never read. A matrix is oriented out x in whatever its stored
layout: an ``in_out`` weight (GPT-2's Conv1D) is analysed as its transpose, so ``rows`` is its output dimension and
``form`` (``primal`` when out <= in) is true."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Union

from wbfe.engine.heads import HEAD_NAMES, find_head
from wbfe.framework import IN_OUT, OUT_IN, check_layout, out_in
from wbfe.linalg.arrays import is_torch
from wbfe.linalg.conv_fft import conv2d_fft_dims
from wbfe.options import ConvView, check_conv

__all__ = [
    "ConvView", "MatrixPlan", "Skip", "Plan", "FLOAT_DTYPES", "MIN_BFE_EIGS", "HEAD_NAMES", "plan_matrix", "role_of",
    "component_of", "COMPONENTS", "as_matrices", "find_head",
]

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
# BFE-W is defined for any matrix with at least two eigenvalues (docs/math.md §2).
MIN_BFE_EIGS = 2

_ROLE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("shared_expert", re.compile(r"shared_expert")),
    ("expert", re.compile(r"(\.experts[.\[]|block_sparse_moe\.(input|output)_linear|_exps(\.weight)?(\[|$))")),
    # GraniteMoE's router is a module holding a Linear: block_sparse_moe.router.layer.weight
    ("router", re.compile(r"((^|\.)(gate|router)(\.layer)?(\.weight)?$|ffn_gate_inp)")),
    ("embedding", re.compile(r"(embed(?!_out)|token_embd|wte|wpe|word_embeddings|position_embeddings|token_type|tok_embeddings|patch_embed|(^|\.)shared\.weight$)")),
    ("attention", re.compile(r"(attn|attention|self_attn|q_proj|k_proj|v_proj|o_proj|qkv|query|key|value|c_attn|in_proj|out_proj)")),
    ("mlp", re.compile(r"(mlp|ffn|feed_forward|feedforward|intermediate|fc1|fc2|c_fc|c_proj|gate_proj|up_proj|down_proj|w1|w2|w3|\.output\.dense)")),
)


@dataclass(frozen=True)
class MatrixPlan:
    """A tensor that will be analysed; ``role`` and ``convention`` as the rows report them (docs/metrics.md).

    Attributes:
        rows, cols: shape of one matrix (of one slice for ``slices``; N ≥ M as WeightWatcher
            reports them for ``fft``); ``rows`` is the output dimension whatever the ``layout``.
        n_slices: number of matrices whose spectra are pooled.
        kept: for a view that keeps only its largest values (``fft``, ``intra``), how many; None: all.
    """

    name: str
    role: str
    shape: tuple[int, ...]
    dtype: str
    convention: str
    rows: int
    cols: int
    n_slices: int
    layout: str = OUT_IN
    kept: int | None = None

    @property
    def n_eigs(self) -> int:
        return min(self.rows, self.cols) * self.n_slices if self.kept is None else self.kept


@dataclass(frozen=True)
class Skip:
    """A tensor that is not analysed, and why."""

    name: str
    reason: str
    shape: tuple[int, ...] = ()
    dtype: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "reason": self.reason, "shape": list(self.shape), "dtype": self.dtype}


Plan = Union[Skip, MatrixPlan]  # an entry's plan: analysed how, or skipped why (wbfe.engine.plan.plan_entry)


# Top-level parts of a multimodal model, reported as each row's ``component``.
COMPONENTS = ("visual", "vision_tower", "vision_model", "vision_encoder", "image_encoder", "language_model",
              "text_model", "text_encoder", "audio_tower", "audio_model", "audio_encoder", "multi_modal_projector",
              "mm_projector", "connector")


def component_of(name: str) -> str | None:
    """The multimodal component a tensor belongs to (``visual``, ``language_model``, ...), else None."""
    return next((part for part in name.split(".")[:-1] if part in COMPONENTS), None)


def role_of(name: str, ndim: int) -> str:
    """Role of a tensor from its name and rank (the head is identified separately)."""
    lowered = name.lower()
    for role, pattern in _ROLE_PATTERNS:
        if role == "embedding" and ndim > 2 and "patch_embed" not in lowered:
            continue
        if pattern.search(lowered):
            return role
    return "conv" if ndim >= 3 else "other"


def plan_matrix(
    name: str, shape: tuple[int, ...], dtype: str, *, conv: ConvView = "flatten", min_eigs: int = MIN_BFE_EIGS,
    layout: str = OUT_IN,
) -> Plan:
    """Decide, from metadata alone, whether and how a tensor becomes matrices.

    An ``in_out`` tensor [in, out, k...] is planned as [out, in, k...]. Fewer eigenvalues than ``min_eigs`` (never fewer
    than :data:`MIN_BFE_EIGS`) skip the tensor."""
    check_conv(conv)
    check_layout(layout)
    if dtype not in FLOAT_DTYPES:
        if dtype.startswith(("int", "uint", "qint", "quint")) or dtype == "bool":
            return Skip(name, f"integer tensor ({dtype}): quantized/packed weights or a counter", shape, dtype)
        return Skip(name, f"unsupported dtype {dtype}", shape, dtype)
    if len(shape) < 2:
        return Skip(name, f"{len(shape)}-D tensor (bias, norm scale or buffer)", shape, dtype)
    if re.search(r"(^|[._])bias$", name):  # BART's final_logits_bias [1, vocab], bias stacks [E, out]
        return Skip(name, f"bias ({len(shape)}-D)", shape, dtype)
    if 0 in shape:
        return Skip(name, "empty tensor", shape, dtype)
    out, inp = out_in(shape, layout)
    if len(shape) == 2:
        rows, cols, n_slices, convention = out, inp, 1, "dense"
    elif conv == "flatten":
        rows, cols, n_slices, convention = out, inp * math.prod(shape[2:]), 1, "flatten"
    elif conv == "fft" and len(shape) == 4:  # WeightWatcher's FFT view is of 2-D convolutions only
        rows, cols, kept = conv2d_fft_dims((out, inp, *shape[2:]))
        # No size check: WeightWatcher applies no min_evals to the FFT view, and it keeps rf·N·M ≥ 1 values.
        return MatrixPlan(name, role_of(name, len(shape)), tuple(shape), dtype, "fft", rows, cols, 1, layout, kept)
    else:  # slices (and the other conv kernels under fft)
        rows, cols, n_slices, convention = out, inp, math.prod(shape[2:]), "slices"
    plan = MatrixPlan(name, role_of(name, len(shape)), tuple(shape), dtype, convention, rows, cols, n_slices, layout)
    if len(shape) == 3 and shape[0] == 1:
        return Skip(name, "3-D parameter with one row (a token or position table, not a kernel)", shape, dtype)
    if plan.n_eigs < max(min_eigs, MIN_BFE_EIGS):
        needs = f"min_eigs={min_eigs}" if min_eigs > MIN_BFE_EIGS else f"BFE-W needs at least {MIN_BFE_EIGS}"
        return Skip(name, f"too small: {plan.n_eigs} eigenvalue(s) < {needs}", shape, dtype)
    return plan


def as_matrices(tensor: Any, plan: MatrixPlan) -> list[Any]:
    """The out x in views of ``tensor`` that ``plan`` describes (no copies for dense and flatten
    ``out_in`` tensors; an ``in_out`` one is transposed first, a view for a dense matrix), of the
    tensor's kind: numpy arrays or torch tensors (:mod:`wbfe.linalg.arrays`). For the ``fft`` view, the
    (out, in, kh, kw) kernel itself: its 32 × 32 grids are made with its spectrum."""
    if plan.layout == IN_OUT:
        tensor = tensor.swapaxes(0, 1)
        if plan.convention not in ("dense", "fft"):  # the reshape below needs the transposed axes in memory order
            tensor = tensor.contiguous() if is_torch(tensor) else tensor.copy()
    if plan.convention == "fft":
        return [tensor]
    if plan.convention in ("dense", "flatten"):
        return [tensor.reshape(plan.rows, plan.cols)]
    kernel = tensor.reshape(plan.rows, plan.cols, plan.n_slices)
    return [kernel[:, :, i] for i in range(plan.n_slices)]
