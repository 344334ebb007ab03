"""Every option shared by several commands, declared once (an ``Annotated`` alias: flag and help text), and
the groups that build an options object from their options (:func:`with_groups`), so that each value is
checked by the object's constraints table before a command does any work. Every default is the options
class's own (:func:`~wbfe.options.field_defaults`); only an option with no library counterpart (``--no-cache``, watch's
``--layers auto``) has its default here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, List, Optional

import typer

from wbfe.errors import InvalidOptionError
from wbfe.executors import ExecutorOptions
from wbfe.options import (DEFAULT_GROUPS, FIX_FINGERS, METRIC_GROUPS, TAIL_MODEL, CompareOptions, EditOptions,
                          PruneOptions, RankOptions, ReportOptions, ScoreOptions, StatsOptions, WatchOptions,
                          field_defaults)

__all__ = ["Format", "ScoreFormat", "Conv", "OptionGroup", "with_groups", "score_group", "compare_group",
           "stats_group", "rank_group", "executor_group", "watch_group", "report_group", "ReportFormat",
           "prune_group", "edit_group"]


class Format(str, Enum):
    """Output format of commands that print a table or JSON."""

    table = "table"
    json = "json"


class ScoreFormat(str, Enum):
    """Output format of ``wbfe score`` (adds CSV)."""

    table = "table"
    json = "json"
    csv = "csv"


class Conv(str, Enum):
    """Conv-kernel view (docs/math.md §1, :data:`wbfe.options.CONV_VIEWS`)."""

    flatten = "flatten"
    slices = "slices"
    fft = "fft"


# ---------------------------------------------------------------- shared declarations (one help text each)

REF_HELP = ("Checkpoint: file, folder, org/name[@rev] (a full Hugging Face id such as openai-community/gpt2), "
            "timm:NAME, torchvision:WEIGHTS. Default: the embedded demo CNN.")
RAY_INSTALL = "pip install 'wbfe[ray]'"

def path_value(text: str) -> Path:
    """A path option's value; an empty one is refused (``Path("")`` is the working folder, which would then be
    read or written without being named)."""
    if not text.strip():
        raise typer.BadParameter("is empty: name a file or folder, or leave the option out")
    return Path(text)


def path_option(*decls: str, help: str) -> Any:
    """A typer option (for ``Annotated``) whose value is a path, never an empty one (:func:`path_value`)."""
    return typer.Option(*decls, parser=path_value, metavar="<path>", help=help)


_OPT_IN = [name for name in METRIC_GROUPS if name not in DEFAULT_GROUPS]
Metrics = Annotated[Optional[str], typer.Option(
    "--metrics", help=f"Comma list of metric groups ({', '.join(DEFAULT_GROUPS)}; opt-in: {', '.join(_OPT_IN)}). "
                      f"Default: {','.join(DEFAULT_GROUPS)}.")]
Lambda = Annotated[str, typer.Option("--lambda", help="Prior precision: 'opt' (lambda* per matrix) or a number.")]
_CONV_VIEWS_HELP = ("Conv kernels: flatten (out x in*k*k), slices (pooled k*k matrices) or fft (WeightWatcher's "
                   "conv2d_fft view of 2-D convolutions). Default: flatten")
ConvOption = Annotated[Optional[Conv], typer.Option("--conv", help=_CONV_VIEWS_HELP + ".")]  # esd's: no --ww-compatible
ScoreConv = Annotated[Optional[Conv], typer.Option("--conv", help=_CONV_VIEWS_HELP + "; slices with --ww-compatible.")]
Intra = Annotated[bool, typer.Option(
    "--intra", help="Also score the products of consecutive weight matrices (WeightWatcher's intra=True), "
                    "one row each, role intra.")]
Layers = Annotated[Optional[str], typer.Option(
    "--layers", help="Only tensors whose name matches this regular expression (patterns that can take "
                     "exponential time, such as (a+)+ or (a|a)*, are refused).")]
Device = Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")]
Head = Annotated[Optional[str], typer.Option("--head", help="Tensor or module name of the classifier / LM head.")]
MinEigs = Annotated[int, typer.Option(
    "--min-eigs", help="Tail fits (HT-SR, HTMP) need this many eigenvalues; BFE-W needs 2.")]
CompareMinEigs = Annotated[int, typer.Option(
    "--min-eigs", help="Tail fits (HT-SR, HTMP) need this many eigenvalues: below it their columns are NaN with "
                       "the reason, as in wbfe score. No pair is dropped for it: every matrix score analyses "
                       "(2 eigenvalues or more) is paired, with BFE-W and the norms.")]
WwCompatible = Annotated[bool, typer.Option(
    "--ww-compatible", help="Reproduce WeightWatcher 0.7.7's choices (with --conv left out, its conv slices).")]
Seed = Annotated[int, typer.Option(
    "--seed", help="Seed of the scoring's random steps (the rand group's shuffles); recorded in options.seed.")]
FixFingers = Annotated[Optional[str], typer.Option(
    "--fix-fingers", help=f"HT-SR power-law fit: {' or '.join(FIX_FINGERS.values)} (WeightWatcher's fix_fingers).")]
Fit = Annotated[str, typer.Option(
    "--fit", help=f"HT-SR tail model: {', '.join(TAIL_MODEL.values[:-1])} or {TAIL_MODEL.values[-1]} "
                  "(WeightWatcher's fit).")]
Stream = Annotated[Optional[bool], typer.Option(
    "--stream/--no-stream", help="Hub ids, http(s) URLs and object-store URIs (s3://, gs://, ...) of "
                                 "safetensors: read each tensor with one range request, nothing on disk "
                                 "(--no-stream: download or copy first). Default: stream when the files are "
                                 "larger than the free disk.")]
StatsSeed = Annotated[int, typer.Option("--stats-seed", help="Seed of the ranking's bootstrap and permutation draws.")]
NBoot = Annotated[int, typer.Option("--n-boot", help="Bootstrap resamples for the 95% interval.")]
Executor = Annotated[str, typer.Option(
    "--executor", help=f"local, or ray: one Ray task per shard or model ({RAY_INSTALL}).")]
Address = Annotated[Optional[str], typer.Option(
    "--address", help="With --executor ray: auto, ray://host:port or host:port (default: a Ray instance on this machine).")]
Quality = Annotated[Optional[str], typer.Option("--quality", "-q", help="Quality column (default: the zoo's).")]
Workers = Annotated[int, typer.Option("--workers", "-j", help="Models scored in parallel.")]
LowerIsBetter = Annotated[Optional[List[str]], typer.Option(
    "--lower-is-better", help="A quality column for which lower is better (repeatable).")]
CacheDir = Annotated[Optional[Path], path_option(
    "--cache-dir", help="Score cache folder (default: ~/.cache/wbfe/scores).")]
NoCache = Annotated[bool, typer.Option("--no-cache", help="Score every model, read and write no cache.")]
NameMap = Annotated[Optional[List[str]], typer.Option(
    "--map", help="REGEX=REPL applied to A's names before matching (repeatable).")]
Quiet = Annotated[bool, typer.Option(
    "--quiet", "-q", help="Nothing on stderr but errors: no progress, no 'wrote FILE'.")]
TopK = Annotated[int, typer.Option("--top-k", help="Size of the singular subspaces whose overlap is reported.")]


# ---------------------------------------------------------------- option groups


def _cli_default(value: Any) -> Any:
    """A field's default as its option's: an empty tuple is the option left out, a tuple of names a comma list."""
    if value == ():
        return None
    return ",".join(value) if isinstance(value, tuple) else value


def _params(cls: type, aliases: dict[str, Any], renames: Optional[dict[str, str]] = None) -> dict[str, tuple[Any, Any]]:
    """Each option's (alias, default), the default the field's own (through ``renames``: option -> field)."""
    defaults = field_defaults(cls)
    return {name: (alias, _cli_default(defaults[(renames or {}).get(name, name)])) for name, alias in aliases.items()}


@dataclass(frozen=True)
class OptionGroup:
    """CLI parameters that together build one options object.

    Attributes:
        name: the keyword under which the command receives the built object.
        params: parameter name -> (``Annotated`` alias, default).
        build: ``build(**values)`` -> the options object (it validates).
        fields: parameter name -> the options field it sets, where they differ.
    """

    name: str
    params: dict[str, tuple[Any, Any]]
    build: Callable[..., Any]
    fields: dict[str, str] = dataclasses.field(default_factory=dict)

    def parameters(self) -> list[inspect.Parameter]:
        return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=alias)
                for name, (alias, default) in self.params.items()]

    def flagged(self, exc: InvalidOptionError) -> InvalidOptionError:
        """``exc`` naming each option by its flag where the library's message names its field or keyword
        (``top_k must be ...`` -> ``--top-k must be ...``, ``fit=tpl`` -> ``--fit tpl``)."""
        text = str(exc)
        for param, (alias, _) in self.params.items():
            info = alias.__metadata__[0]  # in an Annotated alias the first flag is typer's "default"
            flag = next(d for d in (info.default, *info.param_decls) if str(d).startswith("--")).split("/")[0]
            for key in {param, self.fields.get(param, param), flag[2:]}:
                text = re.sub(rf"^{re.escape(key)}(?= )|(?<![\w-]){re.escape(key)}=",
                              lambda m: flag + (" " if m.group().endswith("=") else ""), text)
        return type(exc)(text, **exc.fields)


@contextlib.contextmanager
def fields_as_flags(*fields: str) -> Iterator[None]:
    """An ``InvalidOptionError`` raised inside names each of ``fields`` (a settings class's ``r_min``) by the
    command's flag (``--r-min``): the user typed the flag, not the library's field."""
    try:
        yield
    except InvalidOptionError as exc:
        text = str(exc)
        for field in fields:
            text = re.sub(rf"(?<![\w-]){re.escape(field)}(?!\w)", "--" + field.replace("_", "-"), text)
        raise type(exc)(text, **exc.fields) from None


def _raw(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def with_groups(*groups: OptionGroup) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the groups' options in place of its group keywords (``score: ScoreOptions``), and hand
    it each group's built object (built in the order given, before the command runs)."""

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        own = inspect.signature(func)
        names = {g.name for g in groups}
        missing = names - set(own.parameters)
        if missing:
            raise TypeError(f"{func.__name__} lacks the group keyword(s) {sorted(missing)}")
        # The group keywords' annotations name library classes imported only for type checking;
        # the other annotations are resolved here, in the command module's namespace.
        keep = [p.replace(annotation=eval(p.annotation, func.__globals__))  # noqa: S307 - our own source text
                if isinstance(p.annotation, str) else p
                for p in own.parameters.values() if p.name not in names]
        added = [p for g in groups for p in g.parameters()]

        @functools.wraps(func)
        def command(**values: Any) -> Any:
            for group in groups:
                try:
                    values[group.name] = group.build(**{name: _raw(values.pop(name)) for name in group.params})
                except InvalidOptionError as exc:
                    raise group.flagged(exc) from None
            return func(**values)

        params = keep + [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in added]
        command.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
        command.option_groups = groups  # type: ignore[attr-defined]  # for tests and documentation
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return wrap


_SCORING = _params(ScoreOptions, {
    "metrics": Metrics, "lam": Lambda, "conv": ScoreConv, "layers": Layers, "device": Device, "head": Head,
    "min_eigs": MinEigs, "ww_compatible": WwCompatible, "seed": Seed, "fix_fingers": FixFingers, "fit": Fit,
    "intra": Intra, "stream": Stream,
})


def score_group(*names: str, name: str = "score", **fixed: Any) -> OptionGroup:
    """The :class:`~wbfe.options.ScoreOptions` options (all, or the ones named) of a command that scores;
    ``fixed`` settings are not options of the command (``wbfe describe`` plans as a ``bfe`` score does)."""
    chosen = names or tuple(_SCORING)
    return OptionGroup(name, {n: _SCORING[n] for n in chosen}, functools.partial(ScoreOptions, **fixed))


def compare_group() -> OptionGroup:
    """The :class:`~wbfe.options.CompareOptions` options of ``wbfe compare``."""
    # --min-eigs as score's, its help saying what it gates in a comparison
    params = _params(CompareOptions, {"metrics": Metrics, "layers": Layers, "lam": Lambda, "device": Device,
                                      "min_eigs": CompareMinEigs, "seed": Seed, "stream": Stream, "name_map": NameMap,
                                      "top_k": TopK})
    return OptionGroup("compare", params, CompareOptions)


def _stats_options(n_boot: int, stats_seed: int) -> Any:
    return StatsOptions(n_boot=n_boot, seed=stats_seed)


def stats_group() -> OptionGroup:
    """The :class:`~wbfe.options.StatsOptions` options of a command that ranks."""
    renames = {"stats_seed": "seed"}
    return OptionGroup("stats", _params(StatsOptions, {"n_boot": NBoot, "stats_seed": StatsSeed}, renames),
                       _stats_options, renames)


def _rank_options(quality: Optional[str], workers: int, lower_is_better: Optional[List[str]],
                  cache_dir: Optional[Path], no_cache: bool) -> Any:
    return RankOptions(quality=quality, workers=workers, lower_is_better=tuple(lower_is_better or ()),
                       cache_dir=False if no_cache else cache_dir)


def rank_group() -> OptionGroup:
    """The :class:`~wbfe.options.RankOptions` options of a command that runs a zoo."""
    params = _params(RankOptions, {"quality": Quality, "workers": Workers, "lower_is_better": LowerIsBetter,
                                   "cache_dir": CacheDir})
    return OptionGroup("run", {**params, "no_cache": (NoCache, False)}, _rank_options)


def _watch_options(**values: Any) -> Any:
    if values.get("layers") == "auto":  # the stopping rules were measured on the fittable matrices; h* at a λ on the head
        values["layers"] = "head" if values.get("lam") is not None else "fittable"
    return WatchOptions(**values)


WatchLayers = Annotated[str, typer.Option(
    "--layers", help="auto (fittable for the stopping rules, head with --lambda), head, all, fittable (the matrices "
                     "with enough eigenvalues for the HTMP fit), or a regular expression on tensor names.")]
WatchLambda = Annotated[Optional[str], typer.Option(
    "--lambda", help="Prior precision of h*(lambda) = h*(1)/lambda: a number, or 'calibrated' (with --calibrate).")]


def watch_group() -> OptionGroup:
    """The :class:`~wbfe.options.WatchOptions` options of ``wbfe watch``."""
    # --layers auto is the command line's own (the library's WatchOptions needs the choice made)
    params = _params(WatchOptions, {"lam": WatchLambda, "head": Head, "device": Device})
    return OptionGroup("options", {"layers": (WatchLayers, "auto"), **params}, _watch_options)


class ReportFormat(str, Enum):
    """Output format of ``wbfe report``."""

    html = "html"
    md = "md"


def report_group() -> OptionGroup:
    """The :class:`~wbfe.options.ReportOptions` options of ``wbfe report``."""
    return OptionGroup("page", _params(ReportOptions, {
        "fmt": Annotated[ReportFormat, typer.Option(
            "--format", "-f", help="html: one self-contained page; md: a folder with report.md and PNGs.")],
        "n_unusual": Annotated[int, typer.Option(
            "--unusual", help="ESD thumbnails of the most unusual layers (besides the head).")],
    }), ReportOptions)


def executor_group() -> OptionGroup:
    """Where the work runs (:class:`wbfe.executors.ExecutorOptions`)."""
    return OptionGroup("where", _params(ExecutorOptions, {"executor": Executor, "address": Address}), ExecutorOptions)


Target = Annotated[float, typer.Option(
    "--target", help="Overall sparsity of the pruned matrices, weighted by their weights, in (0, 1).")]
_PRUNING: dict[str, Any] = {
    "target": Target,
    "by": Annotated[str, typer.Option(
        "--by", help="Allocate by alpha, bfe, h (needs the htmp fit), stable_rank, or uniform (the same sparsity "
                     "everywhere). A larger value is pruned more (--reverse: less).")],
    "method": Annotated[str, typer.Option("--method", help="magnitude: each matrix's smallest |w| set to zero.")],
    "spread": Annotated[float, typer.Option(
        "--spread", help="Half-width e of the range [target - e, target + e] the metric is mapped to, in [0, 1].")],
    "mapping": Annotated[str, typer.Option(
        "--mapping", help="value: linear in the metric's value (AlphaPruning); rank: linear in its rank.")],
    "reverse": Annotated[bool, typer.Option("--reverse", help="Prune the matrices with the smaller metric value more.")],
    "exclude": Annotated[str, typer.Option(
        "--exclude", help="Roles left unpruned, comma-separated ('' or none: prune every matrix).")],
    "layers": Annotated[Optional[str], typer.Option(
        "--layers", help="Only tensors whose name matches this regular expression.")],
    "head": Head,
}


def prune_group(*names: str) -> OptionGroup:
    """The :class:`~wbfe.options.PruneOptions` options (all, or the ones named) of ``wbfe sparsity`` / ``prune``;
    ``--target`` has no default on the command line: a pruning says how much."""
    params = _params(PruneOptions, {n: _PRUNING[n] for n in (names or tuple(_PRUNING))})
    if "target" in params:
        params["target"] = (Target, ...)
    return OptionGroup("prune", params, PruneOptions)


class SmoothMethod(str, Enum):
    """How many singular components ``wbfe smooth`` keeps."""

    svd = "svd"
    detx = "detx"


_EDITING: dict[str, Any] = {
    "percent": Annotated[float, typer.Option("--percent", help="Fraction of the singular components kept (method svd).")],
    "method": Annotated[SmoothMethod, typer.Option("--method", help="svd: a fixed fraction; detx: the det X = 1 tail.")],
    "layers": Annotated[Optional[str], typer.Option(
        "--layers", help="Only tensors whose name matches this regular expression.")],
    "seed": Annotated[int, typer.Option("--seed", help="Seed of the permutations that find the correlation traps.")],
    "ww_compatible": Annotated[bool, typer.Option(
        "--ww-compatible", help="Reproduce WeightWatcher 0.7.7's edit exactly (its layers, counts and randomised "
                                "truncated SVD).")],
}


def edit_group(*names: str) -> OptionGroup:
    """The :class:`~wbfe.options.EditOptions` options (the ones named) of ``wbfe smooth`` / ``wbfe sharpen``."""
    return OptionGroup("edit", _params(EditOptions, {n: _EDITING[n] for n in names}), EditOptions)
