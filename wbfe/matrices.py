"""Tensor -> weight matrices: which tensors are analysed, in what role and convention, and why not.

Decisions here use only a tensor's name, shape and dtype (read from the checkpoint header), so
tensors that will be skipped are never read.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Union

from wbfe.errors import InvalidOptionError

if TYPE_CHECKING:
    import torch

__all__ = [
    "ConvConvention",
    "MatrixPlan",
    "Skip",
    "FLOAT_DTYPES",
    "HEAD_NAMES",
    "plan_matrix",
    "role_of",
    "as_matrices",
    "find_head",
]

ConvConvention = Literal["flatten", "slices"]
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
# Module names that hold a classifier / LM head, in order of preference (MATH.md §2).
HEAD_NAMES = (("lm_head", "embed_out"), ("classifier", "head", "fc", "linear", "logits", "output_layer"))

_ROLE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("embedding", re.compile(r"(embed|wte|wpe|word_embeddings|position_embeddings|token_type|tok_embeddings|patch_embed)")),
    ("attention", re.compile(r"(attn|attention|self_attn|q_proj|k_proj|v_proj|o_proj|qkv|query|key|value|c_attn|in_proj|out_proj)")),
    ("mlp", re.compile(r"(mlp|ffn|feed_forward|feedforward|intermediate|fc1|fc2|c_fc|c_proj|gate_proj|up_proj|down_proj|w1|w2|w3|\.output\.dense)")),
)


@dataclass(frozen=True)
class MatrixPlan:
    """A tensor that will be analysed.

    Attributes:
        name: tensor name as stored.
        role: ``head`` (set later by :func:`find_head`), ``attention``, ``mlp``, ``conv``, ``embedding`` or ``other``.
        shape: tensor shape as stored.
        dtype: stored dtype name.
        convention: ``dense`` for 2-D tensors, else the conv convention used (``flatten``/``slices``).
        rows, cols: shape of one matrix (of one slice for ``slices``).
        n_slices: number of matrices whose spectra are pooled.
    """

    name: str
    role: str
    shape: tuple[int, ...]
    dtype: str
    convention: str
    rows: int
    cols: int
    n_slices: int

    @property
    def n_eigs(self) -> int:
        return min(self.rows, self.cols) * self.n_slices


@dataclass(frozen=True)
class Skip:
    """A tensor that is not analysed, and why."""

    name: str
    reason: str
    shape: tuple[int, ...] = ()
    dtype: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "reason": self.reason, "shape": list(self.shape), "dtype": self.dtype}


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
    name: str, shape: tuple[int, ...], dtype: str, *, conv: ConvConvention = "flatten", min_eigs: int = 10
) -> Union[MatrixPlan, Skip]:
    """Decide, from metadata alone, whether and how a tensor becomes matrices."""
    if conv not in ("flatten", "slices"):
        raise InvalidOptionError(f"conv convention must be 'flatten' or 'slices', not {conv!r}")
    if dtype not in FLOAT_DTYPES:
        if dtype.startswith(("int", "uint", "qint", "quint")) or dtype == "bool":
            return Skip(name, f"integer tensor ({dtype}): quantized/packed weights or a counter", shape, dtype)
        return Skip(name, f"unsupported dtype {dtype}", shape, dtype)
    if len(shape) < 2:
        return Skip(name, f"{len(shape)}-D tensor (bias, norm scale or buffer)", shape, dtype)
    if 0 in shape:
        return Skip(name, "empty tensor", shape, dtype)
    if len(shape) == 2:
        rows, cols, n_slices, convention = shape[0], shape[1], 1, "dense"
    elif conv == "flatten":
        rows, cols, n_slices, convention = shape[0], math.prod(shape[1:]), 1, "flatten"
    else:
        rows, cols, n_slices, convention = shape[0], shape[1], math.prod(shape[2:]), "slices"
    plan = MatrixPlan(name, role_of(name, len(shape)), tuple(shape), dtype, convention, rows, cols, n_slices)
    if plan.n_eigs < min_eigs:
        return Skip(name, f"too small: {plan.n_eigs} eigenvalues < min_eigs={min_eigs}", shape, dtype)
    return plan


def as_matrices(tensor: "torch.Tensor", plan: MatrixPlan) -> list["torch.Tensor"]:
    """The 2-D views of ``tensor`` that ``plan`` describes (no copies for dense and flatten)."""
    if plan.convention in ("dense", "flatten"):
        return [tensor.reshape(plan.rows, plan.cols)]
    kernel = tensor.reshape(plan.rows, plan.cols, plan.n_slices)
    return [kernel[:, :, i] for i in range(plan.n_slices)]


def _head_rank(name: str) -> int | None:
    parts = [p for p in re.sub(r"\.weight$", "", name).split(".") if not p.isdigit()]
    if not parts:
        return None
    for rank, names in enumerate(HEAD_NAMES):
        if parts[-1] in names:
            return rank
    return None


def _natural_key(name: str) -> list[object]:
    return [int(tok) if tok.isdigit() else tok for tok in re.split(r"(\d+)", name)]


def find_head(names: list[str], override: str | None = None) -> str | None:
    """Name of the classifier / LM-head matrix among analysed ``names``.

    Rule: ``override`` if given (exact tensor name, or module name without ``.weight``); otherwise
    the matrices whose module name, ignoring numeric indices, ends in ``lm_head``/``embed_out``, or
    failing those in ``classifier``/``head``/``fc``/``linear``/``logits``/``output_layer``; among
    several, the last in natural order (``classifier.6`` after ``classifier.0``). None if none match.

    Raises:
        InvalidOptionError: ``override`` names no analysed matrix.
    """
    if override is not None:
        for candidate in (override, f"{override}.weight"):
            if candidate in names:
                return candidate
        import difflib

        close = difflib.get_close_matches(override, names, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise InvalidOptionError(f"--head {override!r} is not an analysed matrix{hint}")
    ranked = [(rank, name) for name in names if (rank := _head_rank(name)) is not None]
    if not ranked:
        return None
    best = min(rank for rank, _ in ranked)
    return max((name for rank, name in ranked if rank == best), key=_natural_key)
