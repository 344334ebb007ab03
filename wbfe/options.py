"""The settings of a scoring run and of a ranking's statistics, each validated once, when built.

:class:`ScoreOptions` is the only path from a keyword, the CLI or a ranking to :func:`wbfe.score`;
:class:`StatsOptions` holds what :func:`wbfe.rank` needs to turn scores into correlations. Both are
frozen dataclasses whose constructor checks every field (the scikit-learn habit of one constraints
table, here one checking function per field), so a bad value is refused before a byte is read or a
model is scored, and the same message is given whichever way the value came in.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any, Iterable, Literal, Optional, Union

from wbfe.errors import InvalidOptionError

__all__ = [
    "ScoreOptions",
    "StatsOptions",
    "CONVENTIONS",
    "check_conv",
    "check_device",
    "compile_layers",
    "MAX_EXACT_N",
]

CONVENTIONS = ("flatten", "slices")
"""Conv-kernel conventions (docs: ``flatten`` = out × in·k…, ``slices`` = k pooled out × in matrices)."""

MAX_EXACT_N = 10
"""Largest zoo for which every ordering may be enumerated (10! = 3.6 million orderings)."""


def check_conv(conv: object) -> Literal["flatten", "slices"]:
    """``conv`` itself when it is a known conv-kernel convention.

    Raises:
        InvalidOptionError: anything else.
    """
    if conv not in CONVENTIONS:
        raise InvalidOptionError(f"conv convention must be 'flatten' or 'slices', not {conv!r}")
    return conv  # type: ignore[return-value]


def check_device(device: object) -> str:
    """``device`` when it names a device this machine has (``auto``, ``cpu``, ``cuda``, ``cuda:N``).

    Raises:
        InvalidOptionError: an unknown device, or CUDA asked for on a machine without it.
    """
    if not isinstance(device, str):
        raise InvalidOptionError(f"device must be auto, cpu or cuda, not {device!r}")
    if device in ("auto", "cpu"):
        return device
    from wbfe.spectra import resolve_device

    resolve_device(device)  # raises for an unknown name or a missing CUDA device
    return device


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: object, low: int, high: Optional[int] = None) -> int:
    if not _is_int(value) or value < low or (high is not None and value > high):  # type: ignore[operator]
        kind = ({0: "a non-negative integer", 1: "a positive integer"}.get(low, f"an integer of at least {low}")
                if high is None else f"an integer between {low} and {high}")
        raise InvalidOptionError(f"{name} must be {kind}, not {value!r}")
    return int(value)  # type: ignore[call-overload]


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidOptionError(f"{name} must be True or False, not {value!r}")
    return value


def _nested_unbounded_repeat(tree: Any, inside: bool = False) -> bool:
    """Whether a parsed pattern repeats, without bound, a sub-pattern that itself repeats without bound."""
    from re import _constants as c  # type: ignore[attr-defined]  # noqa: PLC0415
    from re import _parser as p  # type: ignore[attr-defined]  # noqa: PLC0415

    for op, arg in tree:
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            low, high, body = arg
            unbounded = high == c.MAXREPEAT
            if unbounded and inside and op != c.POSSESSIVE_REPEAT:
                return True
            # A possessive repeat never backtracks into its body: it cannot blow up.
            if op != c.POSSESSIVE_REPEAT and _nested_unbounded_repeat(body, inside or unbounded):
                return True
        elif op == c.SUBPATTERN:
            if _nested_unbounded_repeat(arg[-1], inside):
                return True
        elif op == c.BRANCH:
            if any(_nested_unbounded_repeat(branch, inside) for branch in arg[1]):
                return True
        elif op in (c.ASSERT, c.ASSERT_NOT):
            if _nested_unbounded_repeat(arg[1], inside):
                return True
        elif op == c.ATOMIC_GROUP:
            continue  # no backtracking into an atomic group
        elif isinstance(arg, p.SubPattern):
            if _nested_unbounded_repeat(arg, inside):
                return True
    return False


def compile_layers(pattern: Optional[str]) -> Optional[re.Pattern[str]]:
    """The compiled ``--layers`` expression (None selects every tensor).

    A pattern that repeats a repeated group without bound, such as ``(a+)+$`` or ``(\\w*\\.)*x``,
    is refused: Python's backtracking matcher can take time exponential in the name's length on it
    (``(a+)+$`` on 30 a's and a b takes minutes), and one such name stalls the whole run. Rejecting
    the shape is cheap and certain, where a time limit on ``re.search`` is impossible (the matcher
    holds the interpreter until it returns). Write the group once (``[\\w.]*``), bound the inner
    repeat (``\\d{1,4}``) or make it possessive (``a++``).

    Raises:
        InvalidOptionError: not a valid expression, or a nested unbounded repeat.
    """
    if pattern is None:
        return None
    if not isinstance(pattern, str) or not pattern:
        raise InvalidOptionError(f"--layers must be a non-empty regular expression, not {pattern!r}")
    try:
        from re import _parser as p  # type: ignore[attr-defined]  # noqa: PLC0415

        compiled = re.compile(pattern)
        nested = _nested_unbounded_repeat(p.parse(pattern))
    except re.error as exc:
        raise InvalidOptionError(f"--layers is not a valid regular expression: {exc}") from None
    if nested:
        raise InvalidOptionError(
            f"--layers {pattern!r} repeats a repeated group without bound, which can take exponential "
            "time to match; write the group once (e.g. [\\w.]*), bound the inner repeat or make it possessive"
        )
    return compiled


def _metric_names(metrics: Union[str, Iterable[str], None]) -> tuple[str, ...]:
    from wbfe.metrics import resolve_groups

    return tuple(group.name for group in resolve_groups(metrics))


@dataclass(frozen=True)
class ScoreOptions:
    """Every setting of one scoring run (also recorded in the result's provenance and the rank cache key).

    Each field is checked when the object is built; raw values are normalised on the way in
    (``metrics="bfe,htsr"`` becomes ``("bfe", "htsr")``, ``lam="0.5"`` becomes ``0.5``,
    ``ww_compatible=True`` forces ``conv="slices"``).

    Attributes:
        metrics: metric group names (None: the default groups).
        lam: ``"opt"`` (λ* per matrix) or a fixed prior precision in
            [:data:`~wbfe.metrics.bfe.LAMBDA_MIN`, :data:`~wbfe.metrics.bfe.LAMBDA_MAX`].
        conv: conv-kernel convention, ``flatten`` or ``slices``.
        layers: a regular expression; only tensors whose name it matches are analysed.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` for the eigen-solves.
        head: tensor (or module) name of the classifier / LM head.
        min_eigs: the tail fits of matrices with fewer eigenvalues are NaN (≥ 1).
        ww_compatible: reproduce WeightWatcher 0.7.7's choices.
        seed: seed of the random steps (the ``rand`` group's shuffles), a non-negative integer.
        fix_fingers: WeightWatcher's ``fix_fingers`` for the HT-SR power-law fit: None,
            ``xmin_peak`` or ``clip_xmax`` (:mod:`wbfe.metrics.fingers`).
        fit: tail model of the HT-SR ``alpha``: ``pl``, ``tpl`` or ``e_tpl``.

    Raises:
        InvalidOptionError: a field outside its allowed set or range (UnknownNameError for a metric).
    """

    metrics: tuple[str, ...] = ()
    lam: Union[Literal["opt"], float] = "opt"
    conv: Literal["flatten", "slices"] = "flatten"
    layers: Optional[str] = None
    device: str = "auto"
    head: Optional[str] = None
    min_eigs: int = 10
    ww_compatible: bool = False
    seed: int = 0
    fix_fingers: Optional[str] = None
    fit: str = "pl"

    def __post_init__(self) -> None:
        from wbfe.metrics.bfe import parse_lambda
        from wbfe.metrics.fingers import check_tail_options

        check_tail_options(self.fix_fingers, self.fit)  # type: ignore[arg-type]

        set_ = object.__setattr__  # frozen: normalised values are set once, here
        set_(self, "metrics", _metric_names(self.metrics if self.metrics != () else None))
        set_(self, "min_eigs", _check_int("min_eigs", self.min_eigs, 1))
        set_(self, "conv", check_conv(self.conv))
        set_(self, "lam", parse_lambda(self.lam))
        compile_layers(self.layers)
        if self.head is not None and not (isinstance(self.head, str) and self.head):
            raise InvalidOptionError(f"head must be a tensor or module name, not {self.head!r}")
        set_(self, "ww_compatible", _check_bool("ww_compatible", self.ww_compatible))
        if self.ww_compatible:
            set_(self, "conv", "slices")
        set_(self, "seed", _check_int("seed", self.seed, 0))
        set_(self, "device", check_device(self.device))

    @property
    def pattern(self) -> Optional[re.Pattern[str]]:
        """The compiled :attr:`layers` expression (``re`` caches it), None when every tensor is selected."""
        return compile_layers(self.layers)

    def to_dict(self) -> dict[str, Any]:
        """The provenance form (``lambda`` for :attr:`lam`); also the rank cache key's options."""
        return {
            "metrics": list(self.metrics),
            "lambda": self.lam,
            "conv": self.conv,
            "layers": self.layers,
            "device": self.device,
            "head": self.head,
            "min_eigs": self.min_eigs,
            "ww_compatible": self.ww_compatible,
            "seed": self.seed,
            # only when set, so that the provenance and rank cache keys of plain runs do not change
            **({"fix_fingers": self.fix_fingers} if self.fix_fingers is not None else {}),
            **({"fit": self.fit} if self.fit != "pl" else {}),
        }


@dataclass(frozen=True)
class StatsOptions:
    """How a ranking turns scores into correlations (see :func:`wbfe.ranking.stats.correlate`).

    Attributes:
        n_boot: bootstrap resamples of the interval (≥ 1).
        level: coverage of the interval, in (0, 1).
        n_perm: random orderings of the Monte-Carlo permutation p-value (≥ 1).
        exact_max_n: zoos up to this size get the exact p-value over all n! orderings
            (0 … :data:`MAX_EXACT_N`).
        seed: seed of the bootstrap and permutation draws (a non-negative integer, as NumPy's
            generators require).

    Raises:
        InvalidOptionError: a field outside its range.
    """

    n_boot: int = 2000
    level: float = 0.95
    n_perm: int = 10_000
    exact_max_n: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "n_boot", _check_int("n_boot", self.n_boot, 1))
        set_(self, "n_perm", _check_int("n_perm", self.n_perm, 1))
        set_(self, "exact_max_n", _check_int("exact_max_n", self.exact_max_n, 0, MAX_EXACT_N))
        set_(self, "seed", _check_int("seed", self.seed, 0))
        level = self.level
        if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0.0 < level < 1.0 \
                or not math.isfinite(level):
            raise InvalidOptionError(f"level must be in (0, 1), not {level!r}")
        set_(self, "level", float(level))

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields (recorded in the ranking's JSON)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def split_keywords(keywords: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keywords of :class:`ScoreOptions` and of :class:`StatsOptions`, for callers that take both loose.

    Raises:
        TypeError: a keyword that is neither (as for any unknown keyword argument).
    """
    # ``seed`` alone means the statistics' seed, as it always has for rank(); the scoring seed (the
    # rand group's shuffles, part of the cache key) is set through ScoreOptions.
    stats_names = {f.name for f in fields(StatsOptions)}
    score_names = {f.name for f in fields(ScoreOptions)} - stats_names
    unknown = sorted(set(keywords) - score_names - stats_names)
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")
    return ({k: v for k, v in keywords.items() if k in score_names},
            {k: v for k, v in keywords.items() if k in stats_names})
