"""The settings of each wbfe entry point: frozen dataclasses, each field checked when built against the class's
``CONSTRAINTS`` (:mod:`wbfe.options.constraints`), each default written once, in the dataclass; a result's recorded
options replay its run (``XOptions.from_dict(options.to_dict()) == options``). docs/cli.md lists them."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Iterable, Literal, Mapping, Optional, Union, get_args

from wbfe.errors import InvalidOptionError, unknown_name
from wbfe.options.constraints import Choice, Constraint, Custom, Flag, Integer, Real, Text, Validated
from wbfe.options.conventions import Conventions, conventions_for
from wbfe.options.safe_regex import unsafe_reason

__all__ = [
    "ScoreOptions", "StatsOptions", "CompareOptions", "RankOptions", "ReportOptions", "WatchOptions", "EditOptions",
    "PruneOptions", "OPTIONS_CLASSES", "CONV_VIEWS", "check_conv", "ConvView", "check_device", "parse_lambda",
    "positive_lambda", "LAMBDA_MIN", "LAMBDA_MAX", "parse_metrics", "check_tail_options", "check_tail_pair",
    "METRIC_GROUPS", "DEFAULT_GROUPS", "MATRIX_GROUPS", "check_name_map", "compile_layers", "split_keywords",
    "field_defaults", "refuse_keywords", "MAX_EXACT_N", "MAX_RESAMPLES", "FIX_FINGERS", "TAIL_MODEL", "FingerFix",
    "TailModel", "PageFormat", "WATCH_LAYERS", "READ_BY",
]

ConvView = Literal["flatten", "slices", "fft"]
CONV_VIEWS: tuple[str, ...] = get_args(ConvView)
"""How a conv kernel is viewed as matrices: ``flatten`` = out × in·k…, ``slices`` = k pooled out × in matrices,
``fft`` = WeightWatcher's ``conv2d_fft`` view of a 4-D kernel (:mod:`wbfe.linalg.conv_fft`)."""

MAX_EXACT_N = 10
"""Largest zoo for which every ordering may be enumerated (10! = 3.6 million orderings)."""

MAX_RESAMPLES = 10**7
"""Most bootstrap resamples or random orderings: scipy keeps each one's ρ (80 MB here), and more take hours."""


def _or(values: tuple[str, ...]) -> str:
    return ", ".join(map(repr, values[:-1])) + f" or {values[-1]!r}"


def check_conv(conv: object) -> ConvView:
    """``conv`` itself when it is a known conv-kernel view (:data:`CONV_VIEWS`); else InvalidOptionError."""
    if conv not in CONV_VIEWS:
        raise InvalidOptionError(f"conv convention must be {_or(CONV_VIEWS)}, not {conv!r}")
    return conv  # type: ignore[return-value]


def check_device(device: object) -> str:
    """``device`` when this machine has it (``auto``, ``cpu``, ``cuda``, ``cuda:N``); else InvalidOptionError."""
    if device not in ("auto", "cpu"):
        from wbfe.linalg.spectra import resolve_device

        resolve_device(device)  # type: ignore[arg-type]  # raises for any other name or a missing CUDA device
    return device  # type: ignore[return-value]


# A fixed λ must keep ½·log(2π/λ) and λ ordinary floats (below ~3.5e-308 2π/λ overflows); any λ a
# prior can mean lies far inside, λ* = 1/mean(e) being about 1/(fan-in variance of the weights).
LAMBDA_MIN = 1e-300
LAMBDA_MAX = 1e300


def positive_lambda(lam: object) -> float:
    """A positive finite prior precision in [:data:`LAMBDA_MIN`, :data:`LAMBDA_MAX`], from a string or a number;
    InvalidOptionError for anything else (``"opt"`` included: :func:`parse_lambda` allows it)."""
    try:
        value = float(lam)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        value = math.nan
    if isinstance(lam, bool) or not (math.isfinite(value) and value > 0.0):
        raise InvalidOptionError(f"lambda must be a positive number, not {lam!r}")
    if not LAMBDA_MIN <= value <= LAMBDA_MAX:
        raise InvalidOptionError(
            f"lambda must lie in [{LAMBDA_MIN:g}, {LAMBDA_MAX:g}], not {lam!r}: outside it ½·log(2π/λ) "
            "or λ itself is not an ordinary float and BFE-W would be infinite for every matrix"
        )
    return value


def _word_or_lambda(word: str, lam: object, refusal: str, *, keep_range: bool = False) -> Any:
    """``word`` (written in any case) or :func:`positive_lambda`'s value; else ``"{refusal}, not {lam!r}"`` (with
    ``keep_range``, the range's own message for a number outside it)."""
    if isinstance(lam, str) and lam.strip().lower() == word:
        return word
    try:
        return positive_lambda(lam)
    except InvalidOptionError as exc:
        if keep_range and "must lie in" in str(exc):
            raise
        raise InvalidOptionError(f"{refusal}, not {lam!r}") from None


def parse_lambda(lam: object) -> Union[Literal["opt"], float]:
    """``"opt"`` (any case) or a positive finite prior precision; InvalidOptionError for anything else."""
    return _word_or_lambda("opt", lam, "lambda must be 'opt' or a positive number", keep_range=True)


METRIC_GROUPS: tuple[str, ...] = ("bfe", "htsr", "htmp", "rand", "vectors", "detx", "fingers")
"""The metric groups' names, in :mod:`wbfe.metrics`' registry order (a test checks they are the registry's)."""

DEFAULT_GROUPS: tuple[str, ...] = ("bfe", "htsr")
"""The groups a run computes when none are named (htmp's fit costs milliseconds per matrix whatever its size)."""

MATRIX_GROUPS: tuple[str, ...] = ("rand", "vectors")
"""The groups that need the matrices themselves, not a product's or an FFT view's spectrum (htsr reads them too,
for WeightWatcher's slice SVDs, but does without)."""


READ_BY: Mapping[str, tuple[str, ...]] = {"lam": ("bfe", "htmp"), "fit": ("htsr", "fingers", "vectors", "detx"),
                                         "fix_fingers": ("htsr", "fingers", "vectors", "detx"), "seed": ("rand",),
                                         "min_eigs": ("htsr", "htmp", "fingers", "vectors")}
"""The metric groups that read each of these options (:mod:`wbfe.metrics`); a run with none of them would drop
a value the caller set."""


def _refuse_unread(options: Any, names: Iterable[str], *, also: Optional[Mapping[str, str]] = None) -> None:
    """InvalidOptionError when one of ``names`` is set but no group that reads it (:data:`READ_BY`) is in
    ``options.metrics``; ``also``: per option, the flag that reads it besides (the caller checks it is off)."""
    unset, also = field_defaults(type(options)), also or {}
    for name in names:
        value, readers = getattr(options, name), READ_BY[name]
        if value == unset[name] or set(readers) & set(options.metrics):
            continue
        flag = "--lambda" if name == "lam" else "--" + name.replace("_", "-")
        shown = f"{value:g}" if isinstance(value, float) else value
        extra = f" and {also[name]}" if name in also else ""
        groups = " and ".join([", ".join(readers[:-1]), readers[-1]] if len(readers) > 1 else readers)
        raise InvalidOptionError(f"{flag} {shown} is read by the {groups} metrics{extra}, "
                                 f"which --metrics {','.join(options.metrics)} leaves out: add {readers[0]} to "
                                 f"--metrics" + (f" (or give {also[name]})" if name in also else "")
                                 + f" or drop {flag}")


def parse_metrics(metrics: Union[str, Iterable[str], None]) -> tuple[str, ...]:
    """``"bfe,htsr"`` (or an iterable of names, or None for :data:`DEFAULT_GROUPS`) as group names, each once.

    Raises:
        UnknownNameError: a name that is not a metric group (close names suggested).
        InvalidOptionError: an empty list.
    """
    if metrics is None:
        names: list[str] = list(DEFAULT_GROUPS)
    elif isinstance(metrics, str):
        names = [part.strip() for part in metrics.split(",") if part.strip()]
    else:  # a lone non-string (True, 3) is one unknown name
        names = [str(part).strip() for part in (metrics if isinstance(metrics, Iterable) else [metrics])]
    if not names:
        raise InvalidOptionError("no metric group given (choose from: " + ", ".join(METRIC_GROUPS) + ")")
    for name in names:
        if name not in METRIC_GROUPS:
            raise unknown_name("metric group", name, METRIC_GROUPS)
    return tuple(dict.fromkeys(names))


FingerFix = Literal["xmin_peak", "clip_xmax"]
"""WeightWatcher's ``fix_fingers``: how the HT-SR power-law fit treats the spectrum's fingers (None: the plain fit)."""

TailModel = Literal["pl", "tpl", "e_tpl"]
"""WeightWatcher's ``fit``: the HT-SR tail model (power law, truncated power law, truncated with ``xmin_peak``)."""

# The one check of each choice: every options table holds it, and fit_tail (which has none) calls it.
FIX_FINGERS = Choice(get_args(FingerFix), optional=True)
TAIL_MODEL = Choice(get_args(TailModel))


def check_tail_pair(fix_fingers: Optional[str], fit: str) -> None:
    """The rule that ties ``fix_fingers`` and ``fit`` (each already checked): WeightWatcher clips power laws only."""
    if fit != "pl" and fix_fingers == "clip_xmax":
        raise InvalidOptionError(f"fit={fit} cannot be combined with fix_fingers=clip_xmax (it clips power-law fits only)")


def check_tail_options(fix_fingers: object, fit: object) -> None:
    """Validate ``fix_fingers`` and ``fit`` as the options tables do, then together (for callers without one)."""
    check_tail_pair(FIX_FINGERS("fix_fingers", fix_fingers), TAIL_MODEL("fit", fit))


def compile_layers(pattern: Optional[str], *, option: str = "--layers") -> Optional[re.Pattern[str]]:
    """The compiled ``--layers`` expression (None selects every tensor); ``option`` names it in messages.

    Raises:
        InvalidOptionError: an empty pattern, not a valid expression, or one that can take exponential time
            to match (:mod:`wbfe.options.safe_regex`; docs/cli.md, "--layers patterns").
    """
    if pattern is None:
        return None
    if not isinstance(pattern, str):
        raise InvalidOptionError(f"{option} must be a regular expression, not {pattern!r}")
    if not pattern:  # it would match every name: a slip (an unset variable) more often than a wish
        instead = " for every tensor" if option == "--layers" else ""
        raise InvalidOptionError(f"{option} is empty: leave {option} out{instead}")
    try:
        compiled = re.compile(pattern)
        reason = unsafe_reason(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise InvalidOptionError(f"{option} is not a valid regular expression: {exc}") from None
    if reason:
        raise InvalidOptionError(
            f"{option} {pattern!r} is refused: {reason}, which can take exponential time to match; write the group once "
            "(e.g. [\\w.]*), end each repeated part with a character it cannot match or make the inner "
            "repeat possessive (a++)", option=option, pattern=pattern)
    return compiled


def check_layers(pattern: Optional[str]) -> Optional[str]:
    """``pattern`` when :func:`compile_layers` accepts it."""
    compile_layers(pattern)
    return pattern


def check_name_map(pairs: Union[None, str, Iterable[Union[str, tuple[str, str]]]]) -> tuple[tuple[str, str], ...]:
    """``["REGEX=REPL", (regex, repl), ...]`` as (regex, repl) pairs (a string is split at its last ``=``), each
    regex checked as ``--layers`` is (:func:`compile_layers`).

    Raises:
        InvalidOptionError: no ``=``, an empty pattern, an invalid or unsafe regular expression.
    """
    if pairs is None:
        return ()
    items = list(pairs) if isinstance(pairs, Iterable) and not isinstance(pairs, str) else [pairs]
    out = []
    for item in items:
        if isinstance(item, str):
            pattern, sep, repl = item.rpartition("=")
            if not sep:
                raise InvalidOptionError(f"--map must be REGEX=REPLACEMENT, not {item!r}")
        elif isinstance(item, tuple) and len(item) == 2 and all(isinstance(x, str) for x in item):
            pattern, repl = item
        else:
            raise InvalidOptionError(f"--map must be REGEX=REPLACEMENT or a (regex, replacement) pair, not {item!r}")
        if not pattern:
            raise InvalidOptionError(f"--map {item!r} has an empty pattern")
        compile_layers(pattern, option="--map")
        out.append((pattern, repl))
    return tuple(out)


# The declarations shared by several tables: one wording, one list of refused examples.
METRICS = Custom(lambda m: parse_metrics(None if m == () else m), f"metric group names ({', '.join(METRIC_GROUPS)})",
                 bad=("nope", "bfe,nope", True))
LAMBDA = Custom(parse_lambda, "'opt' or a positive number", bad=("nan", "-1", -1.0, "inf", "5e-324", "x"))
CONV = Custom(check_conv, f"{_or(CONV_VIEWS)} (None: the conventions')", bad=("rows", 3), optional=True)
LAYERS = Custom(check_layers, "a regular expression that matches in linear time",
                bad=("(a+)+$", "(", "(a|a)*$", "(a{1,9}){1,9}$"), optional=True)
DEVICE = Custom(check_device, "auto, cpu, cuda or cuda:N", bad=("tpu", 3))
HEAD = Text("a tensor or module name", optional=True)
# WeightWatcher's draws (intra masks, sharpen's shuffles) use numpy's legacy RandomState, which takes 32 bits.
SEED = Integer(0, 2**32 - 1, words="a non-negative integer below 2**32")
RESAMPLES = Integer(1, MAX_RESAMPLES, words=f"a positive integer of at most {MAX_RESAMPLES:,} (each draw's ρ is kept)")


class _Filled(str):
    """A value the conventions filled: equal to the plain string, and handed back as unset by every copy
    (``dataclasses.replace``, :meth:`~Validated.replace`, pickle), whose own conventions fill it again."""


@dataclass(frozen=True)
class ScoreOptions(Validated):
    """Every setting of one scoring run, as :func:`wbfe.score`'s keywords (recorded in the result's provenance
    and the rank cache key). A value the caller gave is never rewritten: ``conv`` left unset (None) is filled
    from the run's :attr:`conventions` and :attr:`filled` records it; ``ww_compatible=True, conv="flatten"``
    flattens, as asked. ``stream`` says how the bytes travel, not what is computed: it is not in :meth:`to_dict`,
    nor compared by ``==``."""

    CONSTRAINTS: ClassVar[Mapping[str, Constraint]] = {
        "metrics": METRICS, "min_eigs": Integer(1), "conv": CONV, "lam": LAMBDA, "layers": LAYERS, "head": HEAD,
        "ww_compatible": Flag(), "seed": SEED, "device": DEVICE, "fix_fingers": FIX_FINGERS, "fit": TAIL_MODEL,
        "intra": Flag(), "stream": Flag(optional=True),
    }

    metrics: tuple[str, ...] = ()
    lam: Union[Literal["opt"], float] = "opt"
    conv: Optional[ConvView] = None
    layers: Optional[str] = None
    device: str = "auto"
    head: Optional[str] = None
    min_eigs: int = 10
    ww_compatible: bool = False
    seed: int = 0
    fix_fingers: Optional[str] = None
    fit: str = "pl"
    intra: bool = False
    stream: Optional[bool] = field(default=None, compare=False)

    def _cross_check(self) -> None:
        check_tail_pair(self.fix_fingers, self.fit)
        if self.conv is None or isinstance(self.conv, _Filled):  # unset, or filled for the options copied
            object.__setattr__(self, "conv", _Filled(self.conventions.conv))
        # A product's or an FFT view's spectrum has no matrices of its own to shuffle or take vectors of
        # (WeightWatcher refuses intra with randomize or vectors too).
        views = [v for v, on in (("--intra", self.intra), ("--conv fft", self.conv == "fft")) if on]
        needy = [name for name in parse_metrics(self.metrics or None) if name in MATRIX_GROUPS]
        if views and needy:
            raise InvalidOptionError(f"{' and '.join(views)}: metric group {', '.join(needy)} needs the matrices "
                                     "themselves, not a product's or an FFT view's spectrum")
        # --ww-compatible plans with min_eigs too: every matrix with fewer eigenvalues is skipped
        _refuse_unread(self, ("fit", "fix_fingers", "lam") + (() if self.intra else ("seed",))
                       + (() if self.ww_compatible else ("min_eigs",)),
                       also={"seed": "--intra", "min_eigs": "--ww-compatible"})

    @property
    def pattern(self) -> Optional[re.Pattern[str]]:
        """The compiled :attr:`layers` expression, None when every tensor is selected."""
        return compile_layers(self.layers)

    @property
    def conventions(self) -> Conventions:
        """The run's conventions: WeightWatcher 0.7.7's with :attr:`ww_compatible`, else wbfe's."""
        return conventions_for(self.ww_compatible)

    @property
    def filled(self) -> tuple[str, ...]:
        """The options the conventions filled because the caller left them unset: ``("conv",)`` or ``()``;
        :meth:`to_dict` records it under WeightWatcher's conventions (wbfe's fill their own defaults)."""
        return ("conv",) if isinstance(self.conv, _Filled) else ()

    RENAMED: ClassVar[Mapping[str, str]] = {"lambda": "lam"}
    BESIDE: ClassVar[tuple[str, ...]] = ("base",)  # a LoRA adapter's score records its base= here

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ScoreOptions":
        """The options of a score's provenance (``model["options"]``, or :meth:`to_dict`); InvalidOptionError
        also for a ``filled`` record the conventions do not give."""
        if not isinstance(data, Mapping):
            return super().from_dict(data)  # which refuses it
        filled = data.get("filled", [])
        if not isinstance(filled, list) or not all(name == "conv" for name in filled):
            raise InvalidOptionError(f"options.filled must list options a convention fills (conv), not {filled!r}")
        options: ScoreOptions = super().from_dict({k: v for k, v in data.items() if k not in [*filled, "filled"]})
        for name in filled:
            if name in data and data[name] != getattr(options, name):
                raise InvalidOptionError(f"options.filled says {name} was filled with {data[name]!r}, but these "
                                         f"conventions fill {getattr(options, name)!r}")
        return options

    def to_dict(self) -> dict[str, Any]:
        """The provenance form (``lambda`` for :attr:`lam`); also the rank cache key's options. fix_fingers, fit
        and intra only when set, so that the provenance and rank cache keys of plain runs do not change."""
        unset = {k: v for k, v in field_defaults(ScoreOptions).items() if k in ("fix_fingers", "fit", "intra")}
        plain = {k: v for k, v in super().to_dict().items() if k not in unset or v != unset[k]}
        return plain | ({"filled": list(self.filled)} if self.filled and self.ww_compatible else {})


@dataclass(frozen=True)
class StatsOptions(Validated):
    """How a ranking turns scores into correlations (:func:`wbfe.ranking.stats.correlate`): ``n_boot`` bootstrap
    resamples of the interval at coverage ``level``; ``n_perm`` random orderings of the Monte-Carlo permutation
    p-value, zoos up to ``exact_max_n`` models getting the exact one over all n! orderings; ``seed`` (CLI
    ``--stats-seed``) seeds both draws."""

    CONSTRAINTS: ClassVar[Mapping[str, Constraint]] = {
        "n_boot": RESAMPLES, "n_perm": RESAMPLES, "exact_max_n": Integer(0, MAX_EXACT_N), "seed": Integer(0),
        "level": Real(0.0, 1.0),
    }

    n_boot: int = 2000
    level: float = 0.95
    n_perm: int = 10_000
    exact_max_n: int = 8
    seed: int = 0


@dataclass(frozen=True)
class CompareOptions(Validated):
    """Every setting of :func:`wbfe.compare`, as its keywords (recorded as the comparison's ``options``)."""

    CONSTRAINTS: ClassVar[Mapping[str, Constraint]] = {
        "metrics": METRICS, "stream": Flag(optional=True),
        "name_map": Custom(check_name_map, "REGEX=REPLACEMENT strings or (regex, replacement) pairs",
                           bad=("no-equals-sign", "(a+)+=x", "=x", [3], 1.5)),
        "top_k": Integer(1), "min_eigs": Integer(1), "seed": SEED, "layers": LAYERS, "lam": LAMBDA,
        "device": DEVICE,
    }

    metrics: tuple[str, ...] = ()
    name_map: tuple[tuple[str, str], ...] = ()
    top_k: int = 10
    layers: Optional[str] = None
    lam: Union[Literal["opt"], float] = "opt"
    device: str = "auto"
    min_eigs: int = 10
    seed: int = 0
    stream: Optional[bool] = field(default=None, compare=False)  # how the bytes travel: not recorded

    def _cross_check(self) -> None:
        _refuse_unread(self, ("lam", "seed", "min_eigs"))

    RENAMED: ClassVar[Mapping[str, str]] = {"lambda": "lam", "map": "name_map"}
    CONSTANT: ClassVar[Mapping[str, Any]] = {"conv": "flatten"}
    BESIDE: ClassVar[tuple[str, ...]] = ("versions",)  # a comparison records the packages' versions here

    @property
    def pattern(self) -> Optional[re.Pattern[str]]:
        """The compiled :attr:`layers` expression, None when every tensor is selected."""
        return compile_layers(self.layers)

    @property
    def renames(self) -> list[tuple[re.Pattern[str], str]]:
        """:attr:`name_map` compiled, in order."""
        return [(re.compile(pattern), repl) for pattern, repl in self.name_map]

    def keywords(self) -> dict[str, Any]:
        """The fields as :func:`wbfe.compare` keywords."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _check_cache_dir(value: Union[str, Path, None, bool]) -> Union[Path, None, Literal[False]]:
    if value is None or value is False:
        return value
    if isinstance(value, bool) or not isinstance(value, (str, Path)) or not str(value).strip():
        raise InvalidOptionError(f"cache_dir must be a folder, None (the default) or False (no cache), not {value!r}")
    return Path(value)


def _check_columns(value: Union[str, Iterable[str]]) -> tuple[str, ...]:
    items = tuple(value) if isinstance(value, Iterable) and not isinstance(value, str) else (value,)
    if not all(isinstance(x, str) and x for x in items):
        raise InvalidOptionError(f"lower_is_better must be quality column names, not {value!r}")
    return items


@dataclass(frozen=True)
class RankOptions(Validated):
    """How a zoo is run through :func:`wbfe.rank` (what is scored how is :class:`ScoreOptions`): the ``quality``
    column (None: the zoo's default), ``workers`` (separate processes when > 1), the ``cache_dir`` (None: the
    default folder; False: no cache) and extra ``lower_is_better`` quality columns."""

    CONSTRAINTS: ClassVar[Mapping[str, Constraint]] = {
        "quality": Text("a quality column name", optional=True),
        "workers": Integer(1, words="at least 1"),
        "cache_dir": Custom(_check_cache_dir, "a folder, None or False", bad=("", True, 3)),
        "lower_is_better": Custom(_check_columns, "quality column names", bad=(3, [""], [1])),
    }

    quality: Optional[str] = None
    workers: int = 1
    cache_dir: Union[Path, None, Literal[False]] = None
    lower_is_better: tuple[str, ...] = ()


PageFormat = Literal["html", "md"]


@dataclass(frozen=True)
class ReportOptions(Validated):
    """What a report page shows and how it is written (:mod:`wbfe.reporting`): ``fmt`` ``html`` (one
    self-contained page) or ``md`` (a folder with report.md and PNGs), ``n_unusual`` ESD thumbnails of the most
    unusual layers besides the head."""

    CONSTRAINTS: ClassVar[Mapping[str, Constraint]] = {"fmt": Choice(get_args(PageFormat)), "n_unusual": Integer(0)}

    fmt: PageFormat = "html"
    n_unusual: int = 5


WATCH_LAYERS = ("head", "all", "fittable")
"""The named layer selections of :class:`WatchOptions` (anything else is a regular expression on tensor names)."""
_WATCH_LAYERS_WORDS = f"{', '.join(map(repr, WATCH_LAYERS))} or a regular expression"
_WATCH_LAMBDA_WORDS = "a positive number or 'calibrated'"


def _check_watch_layers(layers: object) -> str:
    if layers in WATCH_LAYERS:
        return str(layers)
    if not isinstance(layers, str) or not layers:
        raise InvalidOptionError(f"layers must be {_WATCH_LAYERS_WORDS}, not {layers!r}")
    compile_layers(layers)
    return layers


@dataclass(frozen=True)
class WatchOptions(Validated):
    """How :func:`wbfe.watch.watch` scores a run's checkpoints: ``layers`` ``head``, ``all``, ``fittable`` (the
    matrices with enough eigenvalues for the HTMP fit) or a regular expression on tensor names; ``lam`` the prior
    precision of h*(λ) = h*(1)/λ, a positive number, ``"calibrated"`` (from a calibration CSV) or None (no
    recommendation); ``head`` and ``device`` as for :class:`ScoreOptions`."""

    CONSTRAINTS: ClassVar[Mapping[str, Constraint]] = {
        "layers": Custom(_check_watch_layers, _WATCH_LAYERS_WORDS, bad=("", "(a+)+$", 3)),
        "lam": Custom(lambda lam: _word_or_lambda("calibrated", lam, f"--lambda must be {_WATCH_LAMBDA_WORDS}"),
                      _WATCH_LAMBDA_WORDS, bad=("opt", -1.0, "nan"), optional=True),
        "head": HEAD, "device": DEVICE,
    }

    layers: str = "head"
    lam: Union[None, Literal["calibrated"], float] = None
    head: Optional[str] = None
    device: str = "auto"


@dataclass(frozen=True)
class EditOptions(Validated):
    """The settings of ``wbfe smooth`` / ``wbfe sharpen`` (:mod:`wbfe.editing`), as the keywords of
    :func:`~wbfe.editing.smooth_checkpoint` and :func:`~wbfe.editing.sharpen_checkpoint`."""

    CONSTRAINTS: ClassVar[Mapping[str, Constraint]] = {
        "percent": Real(0.0, 1.0, open=False), "method": Choice(("svd", "detx")), "layers": LAYERS,
        "seed": SEED, "ww_compatible": Flag(),
    }

    percent: float = 0.8
    method: str = "svd"
    layers: Optional[str] = None
    seed: int = 0
    ww_compatible: bool = False

    def _cross_check(self) -> None:
        if self.method == "detx" and self.percent != field_defaults(EditOptions)["percent"]:
            raise InvalidOptionError(f"--percent {self.percent:g} is read by --method svd only (detx keeps the "
                                     "det X = 1 tail, whatever its size): drop --percent or use --method svd")

    @property
    def conventions(self) -> Conventions:
        """WeightWatcher 0.7.7's conventions with :attr:`ww_compatible` (its edit: ``ww_edit``), else wbfe's."""
        return conventions_for(self.ww_compatible)


PRUNE_METRICS = {"alpha": "htsr", "bfe": "bfe", "h": "htmp", "stable_rank": "htsr", "uniform": "bfe"}
"""What ``wbfe sparsity`` / ``wbfe prune`` allocate by (a per-matrix score column, or the same sparsity everywhere),
and the metric group that computes it (``uniform`` only needs the list of matrices)."""

PRUNE_ROLES = ("head", "attention", "mlp", "expert", "shared_expert", "router", "conv", "embedding", "other")
"""Row roles (docs/metrics.md) a pruning can leave out."""


def check_exclude(value: Union[str, Iterable[str], None]) -> tuple[str, ...]:
    """Roles left unpruned: ``"head,embedding"``, an iterable of role names, or ``""`` / ``()`` for none.

    Raises:
        InvalidOptionError: something other than role names (UnknownNameError for an unknown role).
    """
    if isinstance(value, str):
        items: list[Any] = [v.strip() for v in value.split(",") if v.strip() and v.strip() != "none"]
    else:
        items = list(value) if isinstance(value, Iterable) else [value]  # a non-string item is refused below
    for item in items:
        if not isinstance(item, str):
            raise InvalidOptionError(f"exclude must be role names such as 'head,embedding', not {value!r}")
        if item not in PRUNE_ROLES:
            raise unknown_name("role", item, PRUNE_ROLES)
    return tuple(dict.fromkeys(items))


@dataclass(frozen=True)
class PruneOptions(Validated):
    """The settings of ``wbfe sparsity`` / ``wbfe prune`` (:mod:`wbfe.pruning`).

    Attributes:
        target: overall sparsity of the pruned matrices, weighted by their parameter counts.
        by: the score column the allocation follows (:data:`PRUNE_METRICS`), or ``uniform``.
        spread: half-width ε of the range [target − ε, target + ε] the metric is mapped to.
        mapping: ``value`` (linear in the metric's value) or ``rank`` (linear in its rank).
        reverse: prune the matrices with the *smaller* metric value more (the opposite of the default).
        exclude: roles left unpruned.
        method: how a matrix is pruned to its sparsity: ``magnitude`` (its smallest |w| set to zero).
        layers, head, device, min_eigs: as for :class:`ScoreOptions` (only matching tensors are pruned).
    """

    CONSTRAINTS: ClassVar[Mapping[str, Constraint]] = {
        "target": Real(0.0, 1.0), "by": Choice(tuple(PRUNE_METRICS)), "spread": Real(0.0, 1.0, open=False),
        "mapping": Choice(("value", "rank")), "reverse": Flag(),
        "exclude": Custom(check_exclude, "role names such as 'head,embedding'", bad=("nope", 3, ["head", 1])),
        "layers": LAYERS, "head": HEAD, "method": Choice(("magnitude",)), "device": DEVICE, "min_eigs": Integer(1),
    }

    target: float = 0.5
    by: str = "stable_rank"
    spread: float = 0.2
    mapping: str = "value"
    reverse: bool = False
    exclude: tuple[str, ...] = ("head", "embedding")
    layers: Optional[str] = None
    head: Optional[str] = None
    method: str = "magnitude"
    device: str = "auto"
    min_eigs: int = 10

    def _cross_check(self) -> None:
        if self.by == "uniform":  # the same sparsity everywhere: no metric to map
            unset = field_defaults(PruneOptions)
            given = [f"--{name} {getattr(self, name)}".replace(" True", "") for name in ("spread", "mapping", "reverse")
                     if getattr(self, name) != unset[name]]
            if given:
                raise InvalidOptionError(f"{', '.join(given)}: --by uniform prunes every matrix to the target, "
                                         "mapping no metric: drop them or allocate by a metric (e.g. --by stable_rank)")


def field_defaults(cls: type) -> dict[str, Any]:
    """Each settable field's default: what :func:`wbfe.score`'s, :func:`wbfe.compare`'s and the CLI's take."""
    return {f.name: f.default for f in fields(cls) if f.init}


def refuse_keywords(cls: type, given: Mapping[str, Any], *, defaults: Optional[Mapping[str, Any]] = None,
                    why: Optional[str] = None) -> None:
    """InvalidOptionError ``"NAMES: WHY"`` when a keyword of ``given`` is set beside an options object: not its
    default in ``defaults`` (``cls``' own by default), an equal value of another type (``min_eigs=10.0``) counting
    as set (``==`` alone would raise for an array)."""
    unset = field_defaults(cls) if defaults is None else defaults
    changed = [k for k, v in given.items() if not (v is unset[k] or type(v) is type(unset[k]) and v == unset[k])]
    if changed:
        name = cls.__name__
        raise InvalidOptionError(f"{', '.join(changed)}: "
                                 + (why or f"pass the settings either as options={name}(...) or as keywords, not both"))


OPTIONS_CLASSES: tuple[type, ...] = (ScoreOptions, StatsOptions, CompareOptions, RankOptions, ReportOptions,
                                     WatchOptions, EditOptions, PruneOptions)
"""Every options class with a constraints table (the generated validation tests walk this)."""


def split_keywords(keywords: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Keywords of :class:`ScoreOptions` and of :class:`StatsOptions`, their seeds named ``score_seed`` and
    ``stats_seed``; InvalidOptionError for a bare ``seed``, TypeError for a keyword that is neither."""
    if "seed" in keywords:
        raise InvalidOptionError("seed is ambiguous here: pass stats_seed= (the bootstrap and permutation draws) "
                                 "or score_seed= (the rand group's shuffles)")
    # No other field of either class starts with score_ or stats_: removeprefix renames only the seeds.
    score_names = {f.name for f in fields(ScoreOptions)} - {"seed"} | {"score_seed"}
    stats_names = {f.name for f in fields(StatsOptions)} - {"seed"} | {"stats_seed"}
    unknown = sorted(set(keywords) - score_names - stats_names)
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(unknown)}")
    return ({k.removeprefix("score_"): v for k, v in keywords.items() if k in score_names},
            {k.removeprefix("stats_"): v for k, v in keywords.items() if k in stats_names})
