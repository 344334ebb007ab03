"""``wbfe rank``: how well each metric orders a zoo by its quality (the Fashion-MNIST zoo by default)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Union

import typer

from ._options import Conv, Format
from .main import app

if TYPE_CHECKING:
    from wbfe.ranking import RankResult

DEFAULT_ZOO = "fmnist"
SMALL_N = 8


def _num(value: Optional[float], digits: int = 3) -> str:
    return f"{value:+.{digits}f}" if value is not None and math.isfinite(value) else "n/a"


def _p(value: Optional[float]) -> str:
    return f"{value:.4f}" if value is not None and math.isfinite(value) else "n/a"


def rank_table(result: "RankResult") -> str:
    """The text table: metrics sorted by |ρ|, then the models that failed."""
    from wbfe.errors import printable

    direction = "lower is better" if result.lower_is_better else "higher is better"
    lines = [
        f"zoo {printable(result.zoo)}: {len(result.models)} models ranked by {result.quality} ({direction}); "
        f"{result.n_scored} scored, {result.n_cached} from cache",
        "rho: Spearman of metric vs quality (quality oriented so higher = better); "
        "expected sign -1 = lower metric should mean better model",
        "",
    ]
    width = max([len("metric")] + [len(m.metric) for m in result.metrics])
    header = f"{'metric':<{width}}  {'rho':>7}  {'95% CI':>17}  {'p':>7}  {'tau':>7}  {'r':>7}  {'n':>4}  exp"
    lines += [header, "-" * len(header)]
    for m in result.metrics:
        ci = f"[{_num(m.ci_low, 2)}, {_num(m.ci_high, 2)}]"
        expected = {-1: "-", 1: "+"}.get(m.expected_sign or 0, "")
        line = (f"{printable(m.metric):<{width}}  {_num(m.rho):>7}  {ci:>17}  {_p(m.p_value):>7}  "
                f"{_num(m.kendall_tau):>7}  {_num(m.pearson_r):>7}  {m.n:>4}  {expected:>3}")
        if m.reason:
            line += f"  ({printable(m.reason)})"
        lines.append(line)
    if not result.metrics:
        lines.append("(no metric: no model could be scored)")
    if any(0 < m.n < SMALL_N for m in result.metrics):
        lines += ["", f"note: with fewer than {SMALL_N} models the bootstrap interval is coarse (resamples repeat "
                  "models; a perfect order gives [rho, rho]); rely on the exact permutation p"]
    if result.failed:
        lines += ["", f"failed ({len(result.failed)}):"]
        lines += [f"  {printable(f.model)}: {printable(f.reason)}" for f in result.failed]
    return "\n".join(lines) + "\n"


def zoo_list() -> str:
    """One line per built-in zoo: name, default quality, availability, description."""
    from wbfe.ranking.zoo import list_zoos

    zoos = list_zoos()
    width = max(len(z.name) for z in zoos)
    lines = []
    for zoo in zoos:
        where = "offline" if zoo.offline else "needs network"
        lines.append(f"{zoo.name:<{width}}  quality={zoo.default_quality:<14} {where:<13}  {zoo.description}")
    return "\n".join(lines) + "\n"


@app.command("rank")
def rank_command(
    zoo: Optional[str] = typer.Argument(
        None, help="Zoo spec (CSV/YAML) or built-in zoo name (see --list). Default: the Fashion-MNIST zoo."
    ),
    quality: Optional[str] = typer.Option(None, "--quality", "-q", help="Quality column (default: the zoo's)."),
    metrics: Optional[str] = typer.Option(None, "--metrics", help="Comma list of metric groups (bfe, htsr, htmp)."),
    workers: int = typer.Option(1, "--workers", "-j", help="Models scored in parallel."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Folder for rank.json and one PNG per metric."),
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="Output format on stdout."),
    lower_is_better: Optional[List[str]] = typer.Option(
        None, "--lower-is-better", help="A quality column for which lower is better (repeatable)."
    ),
    list_zoos: bool = typer.Option(False, "--list", help="List the built-in zoos and exit."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Score cache folder (default: ~/.cache/wbfe/scores)."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Score every model, read and write no cache."),
    lam: str = typer.Option("opt", "--lambda", help="Prior precision: 'opt' (lambda* per matrix) or a number."),
    conv: Conv = typer.Option(Conv.flatten, "--conv", help="Conv kernels: flatten or slices."),
    head: Optional[str] = typer.Option(None, "--head", help="Tensor or module name of the classifier / LM head."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    n_boot: int = typer.Option(2000, "--n-boot", help="Bootstrap resamples for the 95% interval."),
    seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap and permutation draws."),
    quiet: bool = typer.Option(False, "--quiet", help="No per-model progress on stderr."),
    executor: str = typer.Option("local", "--executor", help="local, or ray: one Ray task per model (pip install 'wbfe[ray]')."),
    address: Optional[str] = typer.Option(None, "--address", help="With --executor ray: auto, ray://host:port or host:port (default: a Ray instance on this machine)."),
) -> None:
    """Rank a zoo: Spearman rho (95% bootstrap CI, permutation p), Kendall tau and Pearson r per metric."""
    if list_zoos:
        typer.echo(zoo_list(), nl=False)
        return
    from wbfe.executors import ExecutorOptions
    from wbfe.options import ScoreOptions, StatsOptions
    from wbfe.output import check_output_dir, write_atomic
    from wbfe.ranking import rank

    # Every option is checked here, before the first model is scored.
    score = ScoreOptions(metrics=() if metrics is None else metrics, lam=lam, conv=conv.value,  # type: ignore[arg-type]
                         head=head, device=device)
    stats = StatsOptions(n_boot=n_boot, seed=seed)
    where = ExecutorOptions(executor, address)  # type: ignore[arg-type]
    folder = check_output_dir(output) if output is not None else None
    result = rank(
        zoo if zoo is not None else DEFAULT_ZOO,
        quality,
        score=score,
        stats=stats,
        workers=workers,
        cache_dir=False if no_cache else cache_dir,
        lower_is_better=tuple(lower_is_better or ()),
        progress=None if quiet else (lambda line: typer.echo(line, err=True)),
        executor=where.executor,
        ray_address=where.address,
    )
    if folder is not None:
        from wbfe.plots.ranking import plot_ranking

        write_atomic(folder / "rank.json", result.to_json() + "\n")
        pngs = plot_ranking(result, folder)
        typer.echo(f"wrote {folder / 'rank.json'} and {len(pngs)} plots", err=True)
    typer.echo(result.to_json() + "\n" if fmt is Format.json else rank_table(result), nl=False)
