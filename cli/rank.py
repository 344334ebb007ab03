"""``wbfe rank``: how well each metric orders a zoo by its quality (the Fashion-MNIST zoo by default)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from ._output import shown
from ._options import Format, executor_group, rank_group, score_group, stats_group, with_groups

if TYPE_CHECKING:
    from wbfe.executors import ExecutorOptions
    from wbfe.options import RankOptions, ScoreOptions, StatsOptions
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
    ]
    if result.applicability:
        lines.append("BFE-W applicability: " + ", ".join(f"{k} {v}" for k, v in result.applicability.items())
                     + " (holds: rho on the models where it holds)")
    lines.append("")
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
        sub = m.applicable or {}
        if sub.get("n"):  # rho on the models where BFE-W's conditions hold
            line += (f"  holds: {_num(sub.get('rho'))} [{_num(sub.get('ci_low'), 2)}, {_num(sub.get('ci_high'), 2)}]"
                     f" n={sub['n']}")
        lines.append(line)
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


def rank_command(
    ctx: typer.Context,
    zoo: Annotated[Optional[str], typer.Argument(
        help="Zoo spec (CSV/YAML) or built-in zoo name (see --list). Default: the Fashion-MNIST zoo.")] = None,
    output: Annotated[Optional[str], typer.Option(
        "--output", "-o", help="Folder for rank.json and one PNG per metric.")] = None,
    fmt: Annotated[Format, typer.Option("--format", "-f", help="Output format on stdout.")] = Format.table,
    list_zoos: Annotated[bool, typer.Option("--list", help="List the built-in zoos and exit.")] = False,
    quiet: Annotated[bool, typer.Option(
        "--quiet", help="Nothing on stderr but errors: no per-model progress, no 'wrote FILE' (-q is "
                        "--quality).")] = False,
    *,
    run: "RankOptions",
    score: "ScoreOptions",
    stats: "StatsOptions",
    where: "ExecutorOptions",
) -> None:
    """Rank a zoo: Spearman rho (95% bootstrap CI, permutation p), Kendall tau and Pearson r per metric."""
    if list_zoos:
        given = [p.opts[0] for p in ctx.command.params if p.name != "list_zoos" and p.name in ctx.params
                 and getattr(ctx.get_parameter_source(p.name), "name", None) == "COMMANDLINE"]
        if given:
            from wbfe.errors import InvalidOptionError

            raise InvalidOptionError("--list prints the built-in zoos as a table and ranks none: leave out "
                                     + ", ".join("the zoo" if name == "zoo" else name for name in given))
        typer.echo(zoo_list(), nl=False)
        return
    from wbfe.render.files import check_output_dir, refuse_overlap, write_atomic
    from wbfe.ranking import rank

    # Every option was checked when its options object was built, before the first model is scored.
    cache = run.cache_dir if isinstance(run.cache_dir, (str, Path)) else None
    if output is not None:
        check_output_dir(output)  # what the output is, before what the zoo reads is resolved
    reads = (zoo_reads(zoo if zoo is not None else DEFAULT_ZOO, run.lower_is_better)
             if output is not None or cache is not None else [])
    folder = check_output_dir(output, reads=reads) if output is not None else None
    if cache is not None:  # the score cache writes its entries there
        refuse_overlap(cache, reads)
    result = rank(
        zoo if zoo is not None else DEFAULT_ZOO,
        run.quality,
        score=score,
        stats=stats,
        workers=run.workers,
        cache_dir=run.cache_dir,
        lower_is_better=run.lower_is_better,
        progress=None if quiet else (lambda line: typer.echo(line, err=True)),
        executor=where.executor,
        ray_address=where.address,
    )
    if folder is not None:
        from wbfe.reporting.plots.ranking import earlier_figures, plot_ranking

        earlier = earlier_figures(folder)
        write_atomic(folder / "rank.json", result.to_json() + "\n", reads=reads)
        pngs = plot_ranking(result, folder)
        stale = [p for p in earlier if p not in pngs]  # an earlier ranking's figures of metrics not ranked now
        for path in stale:
            path.unlink(missing_ok=True)
        if not quiet:
            gone = f" (removed {len(stale)} of an earlier ranking's figures)" if stale else ""
            typer.echo(f"wrote {shown(folder / 'rank.json')} and {len(pngs)} plots{gone}", err=True)
    typer.echo(result.to_json() + "\n" if fmt is Format.json else rank_table(result), nl=False)


def zoo_reads(spec: str, lower_is_better: tuple[str, ...]) -> list[Path]:
    """The local files a zoo run reads: its spec file and every local model it lists."""
    from wbfe.render.files import local_reads
    from wbfe.ranking import load_zoo

    zoo = load_zoo(spec, lower_is_better=lower_is_better)
    return [*local_reads(spec), *(p for entry in zoo.entries for p in local_reads(entry.ref))]


rank_command = with_groups(rank_group(), score_group(), stats_group(), executor_group())(rank_command)
