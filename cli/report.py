"""``wbfe report``: one self-contained audit page (HTML, or Markdown with its figures) per model or zoo."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from wbfe.errors import InvalidOptionError

from ._output import shown
from ._options import rank_group, report_group, score_group, stats_group, with_groups

if TYPE_CHECKING:
    from wbfe.options import CompareOptions, RankOptions, ReportOptions, ScoreOptions, StatsOptions


def _is_zoo(ref: str, quality: Optional[str]) -> bool:
    from wbfe.ranking.zoo import builtin_zoo_names

    if quality is not None or Path(ref).suffix.lower() in (".csv", ".yaml", ".yml"):
        return True
    return ref in builtin_zoo_names() and not Path(ref).exists()


def report_command(
    ref: Annotated[Optional[str], typer.Argument(
        help="Checkpoint (as for `wbfe score`), a saved score or rank JSON, or a zoo (CSV/YAML or built-in name, "
             "with --quality). Default: the embedded demo CNN.")] = None,
    ref_b: Annotated[Optional[str], typer.Argument(
        help="A second checkpoint: the page compares it against REF (as `wbfe compare REF REF_B`).")] = None,
    *,
    output: Annotated[str, typer.Option(
        "--output", "-o", help="HTML file to write ('-': stdout; --format md: a folder).")],
    weights: Annotated[Optional[str], typer.Option(
        "--weights", help="For a saved score JSON: the checkpoint it scored, to draw ESDs from (its sha256 must "
                          "match).")] = None,
    quiet: Annotated[bool, typer.Option(
        "--quiet", help="Nothing on stderr but errors: no progress, no 'wrote FILE' (-q is --quality).")] = False,
    page: "ReportOptions",
    score: "ScoreOptions",
    run: "RankOptions",
    stats: "StatsOptions",
) -> None:
    """Write one self-contained audit page: provenance, summary, per-layer table, depth plots, ESDs, skips.

    What is drawn decides which options apply: the scoring options (--metrics ... --seed) to a
    checkpoint, a comparison and a zoo; the zoo options (--quality ... --stats-seed) to a zoo only.
    An option that does not apply to what is drawn is refused, never silently dropped.
    """
    import wbfe
    from wbfe.reporting import compare_report, load_saved, rank_report, score_report, write_report
    from wbfe.reporting.output import check_report_output

    from wbfe.render.files import local_files, local_reads

    reads = [p for r in (ref, ref_b, weights) for p in local_reads(r)]
    check_report_output(output, page.fmt, reads=reads)  # before any work
    target = ref if ref is not None else str(wbfe.default_checkpoint())
    saved = load_saved(target) if ref is not None else None
    is_zoo = ref_b is None and saved is None and _is_zoo(target, run.quality)
    if is_zoo:  # and not over a model the zoo lists
        from .rank import zoo_reads

        reads += zoo_reads(target, run.lower_is_better)
        check_report_output(output, page.fmt, reads=reads)
    elif saved is None:  # a hub id's snapshot files are known once resolved: never over them, before any work
        from wbfe.sources import remote_ref

        from .esd import refuse_resolved

        for remote in (r for r in (target, ref_b) if r is not None and remote_ref(r)):
            refuse_resolved(remote, output)
    _refuse_unused(score, run, stats, weights, saved=saved[0] if saved is not None else None, pair=ref_b is not None,
                   zoo=is_zoo, unusual=page.n_unusual)
    if score.intra or score.conv == "fft":
        raise InvalidOptionError("a report draws the ESDs of stored matrices: --intra and --conv fft do not apply; "
                                 "use wbfe score --intra / --conv fft")
    report: Any
    if ref_b is not None:
        if saved is not None:  # REF_B comes only after REF: a saved JSON as REF is what is wrong here
            raise InvalidOptionError("a second reference compares two checkpoints: give both as checkpoints")
        compared = wbfe.compare(target, ref_b, **compare_options(score).keywords())
        reads += [*local_files(compared.model_a.get("files")), *local_files(compared.model_b.get("files"))]
        report = compare_report(compared)
    elif saved is not None and saved[0] == "rank":
        report = rank_report(saved[1])
    elif saved is not None and saved[0] == "compare":
        report = compare_report(saved[1])
    elif saved is not None:
        data = saved[1]
        if weights is None:
            why = ("this page was made from a saved score JSON, which holds no weights; pass --weights "
                   "CHECKPOINT (the file it scored) to draw them")
            report = score_report(data, esd_unavailable=why, n_unusual=page.n_unusual)
        else:
            _same_checkpoint(weights, data)
            report = score_report(data, spectra_from=weights, n_unusual=page.n_unusual)
    elif is_zoo:
        from wbfe.ranking import rank

        result = rank(target, quality=run.quality, score=score, stats=stats, workers=run.workers,
                      cache_dir=run.cache_dir, lower_is_better=run.lower_is_better,
                      progress=None if quiet else (lambda line: typer.echo(line, err=True)))
        report = rank_report(result)
    else:
        from ._progress import progress_bar

        with progress_bar(enabled=not quiet) as update:
            scored = wbfe.score(target, options=score, progress=update)
        reads += local_files(scored.model.get("files"))  # the files the reader resolved (a hub snapshot's)
        report = score_report(scored, spectra_from=target, n_unusual=page.n_unusual)
    written = write_report(report, output, fmt=page.fmt, reads=reads)
    if written and not quiet:
        figures = f" and {len(written) - 1} figures" if len(written) > 1 else ""
        typer.echo(f"wrote {shown(written[0])}{figures}", err=True)


report_command = with_groups(report_group(), score_group(), rank_group(), stats_group())(report_command)


def compare_options(score: "ScoreOptions") -> "CompareOptions":
    """The comparison settings a report of two checkpoints uses: the scoring options a comparison has.

    Raises:
        InvalidOptionError: --conv slices, --head or --ww-compatible (a comparison flattens conv
            kernels and has no head rule).
    """
    from wbfe.options import CompareOptions

    if score.conv != "flatten" or score.head is not None or score.ww_compatible:
        raise InvalidOptionError("a comparison of two checkpoints flattens conv kernels and has no head rule: "
                                 "drop --conv, --head and --ww-compatible")
    return CompareOptions(metrics=score.metrics, layers=score.layers, lam=score.lam, device=score.device,
                          min_eigs=score.min_eigs, seed=score.seed, stream=score.stream)  # --stream was dropped


def _refuse_unused(score: "ScoreOptions", run: "RankOptions", stats: "StatsOptions", weights: Optional[str], *,
                   saved: Optional[str], pair: bool, zoo: bool, unusual: int) -> None:
    """Refuse options that do not apply to what the page draws (they used to be dropped silently); ``saved``: the
    kind of saved JSON drawn (score, rank, compare), if one is."""
    from wbfe.options import RankOptions, ReportOptions, ScoreOptions, StatsOptions

    if saved and (score != ScoreOptions() or score.stream is not None):  # == leaves out how bytes travel
        raise InvalidOptionError("a saved JSON is drawn as it was scored: the scoring options (--metrics, --lambda, "
                                 "--conv, --layers, --device, --head, --min-eigs, --ww-compatible, --seed) do not "
                                 "apply; score the checkpoint again instead")
    if not zoo and (run != RankOptions() or stats != StatsOptions()):
        raise InvalidOptionError("--quality, --workers, --lower-is-better, --cache-dir, --no-cache, --n-boot and "
                                 "--stats-seed apply to a zoo only")
    if weights is not None and saved != "score":  # a saved rank or comparison page draws no ESD either
        raise InvalidOptionError("--weights goes with a saved score JSON (the checkpoint it scored)")
    if unusual != ReportOptions().n_unusual and (pair or zoo or saved in ("rank", "compare")):
        raise InvalidOptionError("--unusual applies to the page of one model's scores: a comparison or a zoo page "
                                 "draws no unusual layers")


def _same_checkpoint(weights: str, data: dict[str, Any]) -> None:
    """Refuse --weights whose sha256 differs from the one the saved score recorded."""
    from wbfe.sources import open_source

    with open_source(weights) as source:
        digest = source.provenance.digest()
    recorded = (data.get("model") or {}).get("sha256")
    if recorded is None or digest != recorded:
        raise InvalidOptionError(f"--weights {weights} has sha256 {str(digest)[:12]}…, the saved score was of "
                                 f"{str(recorded)[:12]}…: not the checkpoint it scored")
