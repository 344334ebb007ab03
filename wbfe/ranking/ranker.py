"""Rank a zoo: score every model (cached), then correlate each metric with the quality column oriented so that
higher is better."""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping, Optional, Union

from wbfe._config import wbfe_cache_dir
from wbfe._deps import require
from wbfe._provenance import installed_versions, source_digest
from wbfe.framework.applicability import STATUSES
from wbfe.errors import InvalidOptionError, NothingRankedError, unknown_name
from wbfe.executors import Executor, ExecutorOptions, Outcome, Task, executor_for, failure_reason
from wbfe.options import RankOptions, ScoreOptions, StatsOptions, field_defaults, split_keywords
from wbfe.ranking.availability import unavailable_models
from wbfe.ranking.cache import ScoreCache, cache_key, score_claimed
from wbfe.ranking.stats import MIN_MODELS, Correlation, correlate
from wbfe.ranking.zoo import Zoo, ZooEntry, load_zoo
from wbfe.render.text import ToJson, as_float, json_ready

__all__ = ["rank", "RankResult", "ModelResult", "Failure", "expected_sign"]

Scorer = Callable[[str, ScoreOptions], Mapping[str, Any]]
"""``scorer(ref, options) -> {"summary": {...}, "model": {...}}``, scoring ``ref`` with ``options``."""

_DEFAULTS = field_defaults(RankOptions)  # the keywords' defaults are the options' own
_WHERE = field_defaults(ExecutorOptions)

# Lower is better: BFE-W (docs/math.md §2, the paper reports negative ρ with accuracy) and the HT-SR
# capacity metrics, for which WeightWatcher's papers report smaller values for better models.
_EXPECTED_SIGN = dict.fromkeys(("bfe", "alpha", "alpha_weighted", "log_alpha_norm", "log_norm", "log_spectral_norm"),
                               -1)


# Words that name a quality for which lower is better: such a column ranked as higher-is-better flips every ρ.
_LOWER_WORDS = frozenset({"loss", "nll", "error", "err", "perplexity", "ppl", "wer", "cer", "mse", "mae", "rmse",
                          "bpb", "bpc", "bpd"})


def _named_like_lower(column: str) -> bool:
    words = re.findall(r"[A-Z]{2,}(?![a-z])|[A-Z]?[a-z]+", column)  # test_loss, valLoss, TOP1_ERR
    return any(word.lower() in _LOWER_WORDS for word in words)


def expected_sign(metric: str) -> Optional[int]:
    """−1 when a lower value of ``metric`` (``<column>_head`` / ``<column>_mean``) predicts a better model."""
    base = metric.rsplit("_", 1)[0] if metric.endswith(("_head", "_mean")) else metric
    return _EXPECTED_SIGN.get(base)


@dataclass(frozen=True)
class ModelResult:
    """One scored model: its quality value and its summary metrics."""

    model: str
    ref: str
    quality: float
    scores: dict[str, Optional[float]]
    source: Optional[str] = None
    sha256: Optional[str] = None
    cached: bool = False
    applicability: str = "unknown"


@dataclass(frozen=True)
class Failure:
    """A model that could not be ranked, and why."""

    model: str
    reason: str


@dataclass
class RankResult(ToJson):
    """Every metric's correlation with one quality column of one zoo.

    Attributes:
        metrics: one :class:`Correlation` per metric, sorted by |ρ| (ties by |τ|, then |r|;
            undefined ρ last).
        models, failed: the models scored with a quality value, and those left out with the reason.
        options: the scoring options and the versions of the code that computed the scores (the cache key).
        n_scored, n_cached: models scored in this run vs. taken from the cache (neither counts a model in
            ``failed``).
        applicability: how many ranked models have each ``summary.bfe_applicability`` status.
    """

    zoo: str
    quality: str
    metrics: list[Correlation]
    models: list[ModelResult]
    failed: list[Failure]
    lower_is_better: bool
    options: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    n_scored: int = 0
    n_cached: int = 0
    applicability: dict[str, int] = field(default_factory=dict)

    def metric(self, name: str) -> Correlation:
        """The correlation of metric ``name``.

        Raises:
            UnknownNameError: no such metric in this result.
        """
        for row in self.metrics:
            if row.metric == name:
                return row
        raise unknown_name("metric", name, [m.metric for m in self.metrics])

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape: zoo, quality, metrics, models, failed (then lower_is_better, options, run counts)."""
        return json_ready(asdict(self))

    def to_pandas(self) -> Any:
        """One row per metric, in the order of :attr:`metrics` (requires pandas)."""
        pd = require("pandas", "RankResult.to_pandas needs pandas (pip install pandas)")
        return pd.DataFrame([asdict(m) for m in self.metrics])


def _score_with_wbfe(ref: str, options: ScoreOptions) -> dict[str, Any]:
    """:func:`wbfe.score`, reduced to what ranking and the cache need."""
    from wbfe.scoring import score

    plain = score(ref, options=options).to_dict()
    return {"summary": plain["summary"], "model": plain["model"],
            "n_layers": len(plain["layers"]), "n_skipped": len(plain["skipped"])}


def _content_hash(ref: str) -> str:
    from wbfe.sources import content_hash
    from wbfe.sources.object_store import is_uri, uri_signature

    # An object-store model is keyed on what the store says of it (no download on the driver:
    # the task that scores it fetches it where it runs).
    return uri_signature(ref) if is_uri(ref) else content_hash(ref)


def _sort_key(row: Correlation) -> tuple[Any, ...]:  # as RankResult.metrics says; ties at last by name
    magnitudes = [-abs(v) if math.isfinite(v) else 0.0 for v in (row.rho, row.kendall_tau, row.pearson_r)]
    return (not math.isfinite(row.rho), *magnitudes, row.metric)


def rank(zoo: Union[str, Path, Zoo], quality: Optional[str] = _DEFAULTS["quality"], *,
         score: Optional[ScoreOptions] = None, stats: Optional[StatsOptions] = None,
         workers: int = _DEFAULTS["workers"],
         cache_dir: Union[str, Path, None, Literal[False]] = _DEFAULTS["cache_dir"],
         lower_is_better: Iterable[str] = _DEFAULTS["lower_is_better"],
         progress: Optional[Callable[[str], None]] = None, scorer: Optional[Scorer] = None,
         hasher: Optional[Callable[[str], str]] = None, executor: Literal["local", "ray"] = _WHERE["executor"],
         ray_address: Optional[str] = _WHERE["address"], **settings: Any) -> RankResult:
    """Score every model of a zoo and correlate each summary metric with a quality column (docs/ranking.md).

    Every option is checked before the first model is scored. A model whose quality value is missing, or
    whose hashing or scoring raises, is listed in ``failed`` with the reason; the others are ranked.

    Args:
        zoo: a built-in zoo name, a CSV/YAML spec path, or a :class:`~wbfe.ranking.zoo.Zoo`.
        quality: the quality column (default: the zoo's default, or its only numeric column).
        workers: models scored in parallel (separate processes when > 1).
        cache_dir: score cache folder; None = ``$WBFE_CACHE_DIR`` (docs/cache.md), False = no cache.
        progress: called with one line per model (for a progress display).
        scorer: replaces :func:`wbfe.score` (must be picklable when ``workers`` > 1).
        hasher: replaces :func:`wbfe.sources.content_hash` for the cache key.
        executor, ray_address: ``local`` (this process, or ``workers`` processes) or ``ray`` (one task per
            model at ``ray_address``, docs/ray.md; the result is the same).
        **settings: single fields of :class:`~wbfe.options.ScoreOptions` or
            :class:`~wbfe.options.StatsOptions` (``metrics="bfe"``, ``n_boot=500``, ...), applied
            over ``score`` and ``stats``.

    Raises:
        InvalidOptionError: a bad setting, ``workers`` < 1, an unknown quality column or metric
            group, a quality named like a loss or an error (``test_loss``, ``ppl``, ``top1_err``) not declared
            lower-is-better, an unusable cache folder.
        SourceNotFoundError: the zoo spec does not exist.
        NothingRankedError: no model could be scored (every one failed).
    """
    RankOptions(quality=quality, workers=workers, cache_dir=cache_dir,  # type: ignore[arg-type]  # checks only
                lower_is_better=lower_is_better)  # type: ignore[arg-type]
    score_kw, stats_kw = split_keywords(settings)
    score_options = score.replace(**score_kw) if score is not None else ScoreOptions(**score_kw)
    stats_options = stats.replace(**stats_kw) if stats is not None else StatsOptions(**stats_kw)
    where = ExecutorOptions(executor, ray_address, workers=workers)
    the_zoo = load_zoo(zoo, lower_is_better=lower_is_better)
    column = the_zoo.resolve_quality(quality)
    lower = column in the_zoo.lower_is_better
    if not lower and _named_like_lower(column):
        raise InvalidOptionError(f"zoo {the_zoo.name}: quality {column!r} is named like a loss or an error, for which "
                                 f"lower is better: declare it (--lower-is-better {column}; lower_is_better in the "
                                 "library or a YAML zoo), or rename the column if higher is better for it")
    given = [e.quality[column] for e in the_zoo.entries if math.isfinite(e.quality[column])]
    if len(given) < MIN_MODELS:  # no correlation could be defined: refused before any model is scored
        raise InvalidOptionError(f"zoo {the_zoo.name}: {len(given)} of {len(the_zoo.entries)} models have a value "
                                 f"of {column!r}; a ranking needs at least {MIN_MODELS}")
    if len(set(given)) == 1:
        raise InvalidOptionError(f"zoo {the_zoo.name}: every model has {column} = {given[0]:g}, which ranks nothing; "
                                 "choose another column with --quality")
    cache = None if cache_dir is False else ScoreCache(cache_dir if cache_dir is not None else wbfe_cache_dir())
    if cache is not None:
        cache.check_writable()
    # What computed the numbers, wbfe's source digest included: a development install keeps
    # its version string across edits, and a cached score must come from the same code.
    options: dict[str, Any] = {**score_options.to_dict(),
                               "versions": {**installed_versions(), "wbfe_source": source_digest()}}

    # The device only says where the eigen-solves run (CPU and CUDA agree to rounding): either serves both.
    run = _Run(cache=cache, key_options={k: v for k, v in options.items() if k != "device"},
               say=progress or (lambda _line: None), total=len(the_zoo.entries))
    runner = executor_for(where)
    # Models neither cached nor downloadable here fail at once, and when that is every model
    # the ranking stops with one error instead of trying each (cluster nodes have their own caches).
    blocked = unavailable_models(the_zoo) if scorer is None and hasher is None and runner.runs_here else {}
    pending = run.lookup(the_zoo.entries, column, hasher or _content_hash, blocked)
    run.score(runner, pending, scorer or _score_with_wbfe, score_options)

    models = [_model_result(e, column, *run.payloads[e.name]) for e in the_zoo.entries if e.name in run.payloads]
    rows = _correlations(models, lower=lower, stats=stats_options)
    order = {e.name: k for k, e in enumerate(the_zoo.entries)}
    run.failed.sort(key=lambda f: order.get(f.model, len(order)))
    result = RankResult(
        the_zoo.name, column, rows, models, run.failed, lower,
        # Where it ran is provenance, not part of the cache key (the numbers are the same).
        options=options if runner.runs_here else {**options, "executor": runner.name},
        # Scored means a score came back: a model whose scoring failed is in ``failed``, not counted here.
        stats=stats_options.to_dict(), n_scored=sum(1 for _, cached in run.payloads.values() if not cached),
        n_cached=sum(1 for _, cached in run.payloads.values() if cached),
        applicability={status: sum(m.applicability == status for m in models) for status in STATUSES})
    if not rows:
        first = f"; first: {result.failed[0].model}: {result.failed[0].reason}" if result.failed else ""
        raise NothingRankedError(f"zoo {the_zoo.name}: no metric could be ranked: {len(result.failed)} of "
                                 f"{len(the_zoo.entries)} models failed{first}", result=result)
    return result


_Pending = tuple[int, ZooEntry, Optional[str]]  # (position in the zoo, entry, cache key)


@dataclass
class _Run:
    """The mutable state of one ranking run: cache look-ups, scoring, failures, progress lines."""

    cache: Optional[ScoreCache]
    key_options: Mapping[str, Any]
    say: Callable[[str], None]
    total: int
    failed: list[Failure] = field(default_factory=list)
    payloads: dict[str, tuple[Mapping[str, Any], bool]] = field(default_factory=dict)

    def _log(self, i: int, name: str, what: str) -> None:
        self.say(f"[{i + 1}/{self.total}] {name}: {what}")

    def lookup(self, entries: Iterable[ZooEntry], column: str, hash_fn: Callable[[str], str],
               blocked: Mapping[str, str]) -> list[_Pending]:
        """Models still to score; cache hits go to :attr:`payloads`, unusable rows and ``blocked`` models (name: why
        they cannot be had) to :attr:`failed`."""
        pending: list[_Pending] = []
        for i, entry in enumerate(entries):  # i: the model's place in the zoo, which the progress lines count
            if entry.name in blocked:
                self.failed.append(Failure(entry.name, blocked[entry.name]))
                continue
            if not math.isfinite(entry.quality.get(column, math.nan)):
                self.failed.append(Failure(entry.name, f"no {column} value in the zoo"))
                continue
            key = None
            if self.cache is not None:
                try:
                    key = cache_key(self.cache.content_hash(entry.ref, hash_fn), self.key_options)
                except Exception as exc:  # noqa: BLE001 - recorded as this model's failure, run continues
                    self.failed.append(Failure(entry.name, failure_reason(exc)))
                    self._log(i, entry.name, f"failed ({failure_reason(exc)})")
                    continue
                if (hit := self.cache.get(key)) is not None:
                    self.payloads[entry.name] = (hit, True)
                    self._log(i, entry.name, "cached")
                    continue
            pending.append((i, entry, key))
        return pending

    def score(self, runner: Executor, pending: list[_Pending], score_fn: Scorer, options: ScoreOptions) -> None:
        """Score ``pending`` on ``runner``, each outcome recorded (and cached) as it arrives; with a cache each
        model is claimed first, and those another driver holds go to :func:`~wbfe.ranking.cache.score_claimed`."""
        def run_tasks(items: list[_Pending]) -> None:
            started = lambda k: self._log(items[k][0], items[k][1].name, "scoring")  # noqa: E731
            tasks = [Task(e.name, score_fn, (e.ref, options), device=options.device, sized_by=e.ref)
                     for _, e, _ in items]
            for outcome in runner.map(tasks, started=started):
                item = items[outcome.index]
                self.finish(item, outcome)
                if item[0] in claims:  # released as soon as its entry is stored
                    claims.pop(item[0]).release()

        claims: dict[int, Any] = {}
        mine, theirs = [], []
        with contextlib.ExitStack() as held:  # every claim released whatever happens
            for item in pending:
                if self.cache is None or item[2] is None:
                    mine.append(item)
                elif (claim := self.cache.claim(item[2])) is None:
                    theirs.append(item)
                else:
                    claims[item[0]] = held.enter_context(claim)
                    mine.append(item)
            run_tasks(mine)
        if self.cache is not None:  # ``theirs`` is empty without a cache
            score_claimed(self.cache, theirs, key_of=lambda item: item[2], score=lambda item: run_tasks([item]),
                          shared=self.shared)

    def shared(self, item: _Pending, payload: Mapping[str, Any]) -> None:
        """Record a model another driver on the same cache scored while this one waited."""
        self.payloads[item[1].name] = (payload, True)
        self._log(item[0], item[1].name, "cached (scored by another driver)")

    def finish(self, item: _Pending, outcome: Outcome) -> None:
        """Record one model's payload (cached at once, so an interrupted run resumes) or failure."""
        i, entry, key = item
        if outcome.error is not None:
            self.failed.append(Failure(entry.name, outcome.error))
            self._log(i, entry.name, f"failed{outcome.note} ({outcome.error})")
            return
        payload = json_ready(dict(outcome.value))
        if self.cache is not None and key is not None:
            self.cache.put(key, payload)
        self.payloads[entry.name] = (payload, False)
        self._log(i, entry.name, f"scored{outcome.note}")


def _model_result(entry: ZooEntry, column: str, payload: Mapping[str, Any], cached: bool) -> ModelResult:
    summary = payload.get("summary") or {}
    scores = {k: (None if v is None else as_float(v)) for k, v in summary.items()
              if k.endswith(("_head", "_mean")) and not isinstance(v, (str, bool))}
    verdict = summary.get("bfe_applicability")
    status = verdict.get("status") if isinstance(verdict, Mapping) else None  # None: a summary without one
    return ModelResult(entry.name, entry.ref, entry.quality[column], scores, entry.source,
                       (payload.get("model") or {}).get("sha256"), cached, status if status in STATUSES else "unknown")


def _correlations(models: list[ModelResult], *, lower: bool, stats: StatsOptions) -> list[Correlation]:
    """One row per metric column, against the quality oriented so that higher is better."""
    oriented = [-m.quality if lower else m.quality for m in models]
    keep = [k for k, m in enumerate(models) if m.applicability == "holds"]  # where BFE-W's conditions hold
    rows: list[Correlation] = []
    for name in dict.fromkeys(k for m in models for k in m.scores):
        values = [as_float(m.scores.get(name)) for m in models]
        c = correlate(values, oriented, options=stats)
        sub = correlate([values[k] for k in keep], [oriented[k] for k in keep], options=stats)  # the paper's setting
        rows.append(replace(c, metric=name, expected_sign=expected_sign(name),
                            applicable={"n": sub.n, "rho": sub.rho, "ci_low": sub.ci_low, "ci_high": sub.ci_high}))
    return sorted(rows, key=_sort_key)
