"""``wbfe report``: one self-contained audit page (HTML, or Markdown with its figures) per model or zoo."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any, List, Optional

import typer

from ._options import Conv
from .main import app


class ReportFormat(str, Enum):
    html = "html"
    md = "md"


def _is_zoo(ref: str, quality: Optional[str]) -> bool:
    from wbfe.ranking.zoo import builtin_zoo_names

    if quality is not None or Path(ref).suffix.lower() in (".csv", ".yaml", ".yml"):
        return True
    return ref in builtin_zoo_names() and not Path(ref).exists()


@app.command("report")
def report_command(
    ref: Optional[str] = typer.Argument(
        None, help="Checkpoint (as for `wbfe score`), a saved score or rank JSON, or a zoo (CSV/YAML or "
                   "built-in name, with --quality). Default: the embedded demo CNN."),
    ref_b: Optional[str] = typer.Argument(None, help="A second checkpoint: the page compares it against REF "
                                          "(as `wbfe compare REF REF_B`)."),
    output: str = typer.Option(..., "--output", "-o", help="HTML file to write ('-': stdout; --format md: a folder)."),
    fmt: ReportFormat = typer.Option(ReportFormat.html, "--format", "-f",
                                     help="html: one self-contained page; md: a folder with report.md and PNGs."),
    quality: Optional[str] = typer.Option(None, "--quality", "-q", help="Rank REF as a zoo by this quality column."),
    weights: Optional[str] = typer.Option(None, "--weights", help="For a saved score JSON: the checkpoint it "
                                          "scored, to draw ESDs from (its sha256 must match)."),
    n_unusual: int = typer.Option(5, "--unusual", help="ESD thumbnails of the most unusual layers (besides the head)."),
    layers: Optional[str] = typer.Option(None, "--layers", help="Only tensors whose name matches this regular expression."),
    conv: Conv = typer.Option(Conv.flatten, "--conv", help="Conv kernels: flatten or slices."),
    lam: str = typer.Option("opt", "--lambda", help="Prior precision: 'opt' (lambda* per matrix) or a number."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    head: Optional[str] = typer.Option(None, "--head", help="Tensor or module name of the classifier / LM head."),
    metrics: Optional[str] = typer.Option(None, "--metrics", help="Comma list of metric groups (bfe, htsr, htmp)."),
    min_eigs: int = typer.Option(10, "--min-eigs", help="Skip matrices with fewer eigenvalues."),
    ww_compatible: bool = typer.Option(False, "--ww-compatible", help="Reproduce WeightWatcher 0.7.7's choices."),
    lower_is_better: Optional[List[str]] = typer.Option(
        None, "--lower-is-better", help="Zoo: a quality column for which lower is better (repeatable)."),
    workers: int = typer.Option(1, "--workers", "-j", help="Zoo: models scored in parallel."),
    cache_dir: Optional[Path] = typer.Option(None, "--cache-dir", help="Zoo: score cache folder."),
    no_cache: bool = typer.Option(False, "--no-cache", help="Zoo: score every model, read and write no cache."),
    seed: int = typer.Option(0, "--seed", help="Seed of the zoo's bootstrap and permutation draws, or of compare's random steps."),
) -> None:
    """Write one self-contained audit page: provenance, summary, per-layer table, depth plots, ESDs, skips."""
    import wbfe
    from wbfe.errors import InvalidOptionError
    from wbfe.reporting import compare_report, load_saved, rank_report, score_report, write_report
    from wbfe.reporting.output import check_report_output

    check_report_output(output, fmt.value)  # before any work
    if n_unusual < 0:
        raise InvalidOptionError(f"--unusual must be >= 0, not {n_unusual}")
    target = ref if ref is not None else str(wbfe.default_checkpoint())
    saved = load_saved(target) if ref is not None else None
    report: Any
    if ref_b is not None:
        if ref is None or saved is not None:
            raise InvalidOptionError("a second reference compares two checkpoints: give both as checkpoints")
        report = compare_report(wbfe.compare(target, ref_b, metrics=metrics, layers=layers, lam=lam, device=device,
                                             min_eigs=min_eigs, seed=seed))
    elif saved is not None and saved[0] == "rank":
        report = rank_report(saved[1])
    elif saved is not None and saved[0] == "compare":
        report = compare_report(saved[1])
    elif saved is not None:
        data = saved[1]
        if weights is None:
            why = ("this page was made from a saved score JSON, which holds no weights; pass --weights "
                   "CHECKPOINT (the file it scored) to draw them")
            report = score_report(data, esd_unavailable=why, n_unusual=n_unusual)
        else:
            _same_checkpoint(weights, data)
            report = score_report(data, spectra_from=weights, n_unusual=n_unusual)
    elif _is_zoo(target, quality):
        from wbfe.ranking import rank

        result = rank(target, quality=quality, metrics=metrics, workers=workers,
                      cache_dir=False if no_cache else cache_dir, lower_is_better=tuple(lower_is_better or ()),
                      lam=lam, conv=conv.value, head=head, device=device, seed=seed,
                      ww_compatible=ww_compatible, progress=lambda line: typer.echo(line, err=True))
        report = rank_report(result)
    else:
        from .score import progress_bar

        with progress_bar(enabled=True) as update:
            score = wbfe.score(target, metrics=metrics, lam=lam, conv=conv.value, layers=layers, device=device,
                               head=head, min_eigs=min_eigs, ww_compatible=ww_compatible, seed=seed,
                               progress=update)  # type: ignore[arg-type]
        report = score_report(score, spectra_from=target, n_unusual=n_unusual)
    written = write_report(report, output, fmt=fmt.value)
    if written:
        typer.echo(f"wrote {written[0]}" + (f" and {len(written) - 1} figures" if len(written) > 1 else ""), err=True)


def _same_checkpoint(weights: str, data: dict[str, Any]) -> None:
    """Refuse --weights whose sha256 differs from the one the saved score recorded."""
    from wbfe.errors import InvalidOptionError
    from wbfe.sources import open_source

    with open_source(weights) as source:
        digest = source.provenance.digest()
    recorded = (data.get("model") or {}).get("sha256")
    if recorded is None or digest != recorded:
        raise InvalidOptionError(f"--weights {weights} has sha256 {str(digest)[:12]}…, the saved score was of "
                                 f"{str(recorded)[:12]}…: not the checkpoint it scored")
