"""``wbfe score``: score one checkpoint (the embedded Fashion-MNIST CNN when no reference is given)."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator, Optional

import typer

from ._options import Conv, ScoreFormat
from .main import app


@contextmanager
def progress_bar(enabled: bool) -> Iterator[Optional[object]]:
    """A transient progress bar on stderr when it is a terminal; None otherwise."""
    if not (enabled and sys.stderr.isatty()):
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("scoring", total=None)

        def update(done: int, total: Optional[int], name: str) -> None:
            bar.update(task, completed=done, total=total, description=f"scoring {name[:40]:<40}")

        yield update


@app.command("score")
def score_command(
    ref: Optional[str] = typer.Argument(
        None, help="Checkpoint: file, folder, org/name[@rev], timm:NAME, torchvision:WEIGHTS. Default: the embedded demo CNN."
    ),
    fmt: ScoreFormat = typer.Option(ScoreFormat.table, "--format", "-f", help="Output format."),
    output: Optional[str] = typer.Option(None, "--output", "-o", help="Write the result to this file instead of stdout ('-': stdout)."),
    layers: Optional[str] = typer.Option(None, "--layers", help="Only tensors whose name matches this regular expression."),
    conv: Conv = typer.Option(Conv.flatten, "--conv", help="Conv kernels: flatten (out x in*k*k) or slices (pooled k*k matrices)."),
    lam: str = typer.Option("opt", "--lambda", help="Prior precision: 'opt' (lambda* per matrix) or a number."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    head: Optional[str] = typer.Option(None, "--head", help="Tensor or module name of the classifier / LM head."),
    metrics: Optional[str] = typer.Option(None, "--metrics", help="Comma list of metric groups (bfe, htsr; opt-in: htmp, rand, vectors, detx, fingers). Default: bfe,htsr."),
    min_eigs: int = typer.Option(10, "--min-eigs", help="Tail fits (HT-SR, HTMP) need this many eigenvalues; BFE-W needs 2."),
    ww_compatible: bool = typer.Option(False, "--ww-compatible", help="Reproduce WeightWatcher 0.7.7's choices."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random steps (the rand group's shuffles)."),
    fix_fingers: Optional[str] = typer.Option(None, "--fix-fingers", help="HT-SR power-law fit: xmin_peak or clip_xmax (WeightWatcher's fix_fingers)."),
    fit: str = typer.Option("pl", "--fit", help="HT-SR tail model: pl, tpl or e_tpl (WeightWatcher's fit)."),
    base: Optional[str] = typer.Option(None, "--base", help="For a PEFT LoRA adapter: its base model; also score each merged W0 + dW."),
    executor: str = typer.Option("local", "--executor", help="local, or ray: one Ray task per shard (pip install 'wbfe[ray]')."),
    address: Optional[str] = typer.Option(None, "--address", help="With --executor ray: auto, ray://host:port or host:port (default: a Ray instance on this machine)."),
) -> None:
    """Score every weight matrix of a checkpoint with BFE-W (and the other metric groups)."""
    import wbfe
    from wbfe.executors import ExecutorOptions
    from wbfe.options import ScoreOptions
    from wbfe.output import check_output, write_output
    from wbfe.report import score_csv, score_table

    options = ScoreOptions(metrics=() if metrics is None else metrics, lam=lam, conv=conv.value,  # type: ignore[arg-type]
                           layers=layers, device=device, head=head, min_eigs=min_eigs, ww_compatible=ww_compatible,
                           seed=seed, fix_fingers=fix_fingers, fit=fit)
    where = ExecutorOptions(executor, address)  # type: ignore[arg-type]
    written = check_output(output) if output is not None else None  # before any work
    target = ref if ref is not None else wbfe.default_checkpoint()
    if where.is_ray:  # one line per finished shard on stderr: node, shards done/total, ETA
        result = wbfe.score(target, options=options, base=base, executor="ray", ray_address=where.address,
                            progress=lambda _done, _total, line: typer.echo(line, err=True))
    else:
        with progress_bar(enabled=True) as update:
            result = wbfe.score(target, options=options, base=base, progress=update)  # type: ignore[arg-type]
    text = {ScoreFormat.json: lambda: result.to_json() + "\n", ScoreFormat.csv: lambda: score_csv(result),
            ScoreFormat.table: lambda: score_table(result)}[fmt]()
    if written is not None:
        write_output(written, text)
        typer.echo(f"wrote {output}", err=True)
    else:
        typer.echo(text, nl=False)
