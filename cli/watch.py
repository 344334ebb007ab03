"""``wbfe watch``: h_t against h* over a run's checkpoints, and the checkpoint to keep (no data needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

import typer

from ._options import Format
from .main import app


def _parse_lambda(text: Optional[str]) -> Union[None, str, float]:
    from wbfe.errors import InvalidOptionError

    if text is None:
        return None
    if text.strip().lower() == "calibrated":
        return "calibrated"
    from wbfe.metrics.bfe import positive_lambda

    try:
        return positive_lambda(text)  # the one parser of a fixed lambda (finite, in its range)
    except InvalidOptionError:
        raise InvalidOptionError(f"--lambda must be a positive number or 'calibrated', not {text!r}") from None


def _write(folder: Path, name: str, text: str) -> Path:
    from wbfe.output import write_atomic

    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / name, text)
    return folder / name


@app.command("watch")
def watch_command(
    run: Optional[str] = typer.Argument(
        None, help="A run: folder of checkpoints (steps in the names), CSV with a step column, or org/name@rev1,org/name@rev2."
    ),
    layers: str = typer.Option("head", "--layers", help="head, all, fittable (the matrices with enough eigenvalues "
                               "for the HTMP fit), or a regular expression on tensor names."),
    lam: Optional[str] = typer.Option(
        None, "--lambda", help="Prior precision of h*(lambda) = h*(1)/lambda: a number, or 'calibrated' (with --calibrate)."
    ),
    calibrate_csv: Optional[Path] = typer.Option(
        None, "--calibrate", help="CSV of runs with test losses: choose lambda by leave-one-run-out."
    ),
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="Output format."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Folder for the JSON result and the PNG plots."),
    head: Optional[str] = typer.Option(None, "--head", help="Tensor or module name of the classifier / LM head."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
) -> None:
    """Score every checkpoint of a run; recommend the first where h_t <= h*(lambda) (under-fit before, over-fit after)."""
    from wbfe.errors import InvalidOptionError
    from wbfe.watch import calibrate, result_at, trajectory

    lam_value = _parse_lambda(lam)
    if run is None and calibrate_csv is None:
        raise InvalidOptionError("give a RUN to watch, or --calibrate RUNS.csv")
    if lam_value == "calibrated" and calibrate_csv is None:
        raise InvalidOptionError("--lambda calibrated needs --calibrate RUNS.csv")
    if isinstance(lam_value, float) and calibrate_csv is not None and run is not None:
        raise InvalidOptionError("give either --lambda FLOAT or --calibrate RUNS.csv for a run, not both")

    report = None
    if calibrate_csv is not None:
        report = calibrate(calibrate_csv, layers=layers, head=head, device=device)
        if output is not None:
            from wbfe.plots.watch import plot_calibration

            typer.echo(f"wrote {_write(output, 'calibration.json', report.to_json() + chr(10))}", err=True)
            typer.echo(f"wrote {plot_calibration(report, output / 'calibration.png')}", err=True)
        if run is None:
            typer.echo(report.to_json() + "\n" if fmt is Format.json else report.table(), nl=False)
            return
        lam_value = report.calibration.lam_all

    traj = trajectory(run, layers=layers, head=head, device=device)  # type: ignore[arg-type]
    result = result_at(traj, lam_value, lam_source="calibrated" if report is not None else "given",  # type: ignore[arg-type]
                       layers=layers)
    if output is not None:
        from wbfe.plots.watch import plot_watch

        typer.echo(f"wrote {_write(output, 'watch.json', result.to_json() + chr(10))}", err=True)
        typer.echo(f"wrote {plot_watch(result, output / 'watch.png')}", err=True)
    typer.echo(result.to_json() + "\n" if fmt is Format.json else result.table(), nl=False)
