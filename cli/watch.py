"""``wbfe watch``: h_t against h* over a run's checkpoints, and the checkpoint to keep (no data needed)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from ._options import Format, path_option, watch_group, with_groups
from ._progress import progress_bar

if TYPE_CHECKING:
    from wbfe.options import WatchOptions


def _write(folder: Path, name: str, text: str, reads: list[Path]) -> Path:
    from wbfe.render.files import write_atomic

    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / name, text, reads=reads)
    return folder / name


def _watch_reads(run: Optional[str], calibrate_csv: Optional[Path], step_pattern: Optional[str]) -> list[Path]:
    """The local files and folders a watch reads: the run (folder or CSV) and its checkpoints, the
    calibration CSV and its runs."""
    from wbfe.render.files import local_reads
    from wbfe.watch import read_runs_csv
    from wbfe.watch.runs import discover_run

    runs = [discover_run(run, step_pattern=step_pattern)] if run is not None else []
    if calibrate_csv is not None:
        runs += read_runs_csv(calibrate_csv, step_pattern=step_pattern)
    listed = [str(run)] if run is not None else []
    listed += [str(calibrate_csv)] if calibrate_csv is not None else []
    listed += [c.ref for r in runs for c in r.checkpoints if isinstance(c.ref, str)]
    return [p for ref in listed for p in local_reads(ref)]


def watch_command(
    run: Annotated[Optional[str], typer.Argument(
        help="A run: folder of checkpoints (steps in the names), CSV with a step column, or "
             "org/name@rev1,org/name@rev2.")] = None,
    calibrate_csv: Annotated[Optional[Path], path_option(
        "--calibrate", help="CSV of runs with test losses: choose lambda by leave-one-run-out.")] = None,
    fmt: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = Format.table,
    output: Annotated[Optional[Path], path_option(
        "--output", "-o", help="Folder for the JSON result and the PNG plots.")] = None,
    rule: Annotated[Optional[str], typer.Option(
        "--rule", help="Data-free stopping rule (default: the one with the lowest measured held-out regret; "
                       "docs/early_stopping.md lists them).")] = None,
    step_pattern: Annotated[Optional[str], typer.Option(
        "--step-pattern", help="Regular expression on checkpoint names whose first group is the step.")] = None,
    *,
    options: "WatchOptions",
) -> None:
    """Score every checkpoint of a run and recommend the one to keep, by the measured data-free stopping rule
    (or the first where h_t <= h*(lambda) with --lambda)."""
    from wbfe.errors import InvalidOptionError
    from wbfe.watch import calibrate, result_at, trajectory
    from wbfe.options import compile_layers
    from wbfe.watch.runs import discover_run

    lam_value = options.lam
    if run is None and calibrate_csv is None:
        raise InvalidOptionError("give a RUN to watch, or --calibrate RUNS.csv")
    if lam_value == "calibrated" and calibrate_csv is None:
        raise InvalidOptionError("--lambda calibrated needs --calibrate RUNS.csv")
    if isinstance(lam_value, float) and calibrate_csv is not None:  # without a RUN, the λ was ignored
        raise InvalidOptionError("give either --lambda FLOAT or --calibrate RUNS.csv (which chooses λ), not both")
    reads: list[Path] = []
    if rule is not None and (lam_value is not None or calibrate_csv is not None):
        raise InvalidOptionError("give either --rule NAME or --lambda / --calibrate (the h* rule at a λ), not both")
    compile_layers(step_pattern, option="--step-pattern")
    metrics = None
    if lam_value is None and calibrate_csv is None:
        from wbfe.watch.decide import rule_metrics

        metrics = rule_metrics(rule)  # an unknown rule is refused before any checkpoint is read
    if output is not None:
        from wbfe.render.files import check_output_dir

        reads = _watch_reads(run, calibrate_csv, step_pattern)
        check_output_dir(output, reads=reads)  # before any work

    # a RUN that cannot be read is refused before the calibration runs are scored
    found = discover_run(run, step_pattern=step_pattern) if run is not None else None
    report = None
    if calibrate_csv is not None:
        report = calibrate(calibrate_csv, layers=options.layers, head=options.head, device=options.device,
                           step_pattern=step_pattern)
        if output is not None:
            from wbfe.reporting.plots.watch import plot_calibration

            typer.echo(f"wrote {_write(output, 'calibration.json', report.to_json() + chr(10), reads)}", err=True)
            typer.echo(f"wrote {plot_calibration(report, output / 'calibration.png')}", err=True)
        if run is None:
            typer.echo(report.to_json() + "\n" if fmt is Format.json else report.table(), nl=False)
            return
        lam_value = report.calibration.lam_all

    assert found is not None  # refused above when neither a run nor --calibrate was given
    # RUN among the calibration runs was scored there (with the same options and metrics): not a second time
    traj = None if report is None else report.scored(found, layers=options.layers, head=options.head,
                                                       device=options.device)
    if traj is None:
        with progress_bar(enabled=True, what="watching", unit="checkpoints") as update:
            traj = trajectory(found, layers=options.layers, head=options.head, device=options.device,
                              progress=update, **({} if metrics is None else {"metrics": metrics}))
    if metrics is not None:
        from wbfe.watch.decide import result_by_rule

        result = result_by_rule(traj, rule, layers=options.layers)
    else:
        result = result_at(traj, lam_value, lam_source="calibrated" if report is not None else "given",  # type: ignore[arg-type]
                           layers=options.layers)
    if output is not None:
        from wbfe.reporting.plots.watch import plot_watch

        typer.echo(f"wrote {_write(output, 'watch.json', result.to_json() + chr(10), reads)}", err=True)
        typer.echo(f"wrote {plot_watch(result, output / 'watch.png')}", err=True)
    typer.echo(result.to_json() + "\n" if fmt is Format.json else result.table(), nl=False)


watch_command = with_groups(watch_group())(watch_command)
