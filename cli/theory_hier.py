"""``wbfe theory hierarchical``: the sequential feature-recovery simulator (docs/math.md §7)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from ._output import shown
from ._options import Format, fields_as_flags, path_option


def _num(x: Any) -> str:
    return "nan" if x is None else f"{x:.4g}" if isinstance(x, float) and math.isfinite(x) else str(x)


def _print_table(data: dict) -> None:
    s, pred = data["settings"], data["prediction"]
    typer.echo(f"{s['features']} features  d={s['d']}  D={s['D']}  p={s['p']}  gamma={s['gamma']}  "
               f"g*={s['activation']}  seeds={s['seeds']}")
    typer.echo(f"{'alpha':>6} {'n':>9} {'nmse':>8} {'kernel':>8} {'recovered':>9} {'m(n)':>5}")
    for pt, m in zip(data["points"], pred["recovered_count"]):
        typer.echo(f"{pt['alpha']:>6.3f} {pt['n']:>9d} {_num(pt['nmse']):>8} {_num(pt['nmse_kernel']):>8} "
                   f"{pt['recovered']:>9.2f} {m:>5d}")
    typer.echo("thresholds (log_d n): i, predicted 2+2*gamma*log_d i, finite-d, measured")
    rows = zip(pred["alpha_thresholds"], pred["alpha_thresholds_finite_d"], pred["alpha_thresholds_measured"])
    for i, (lead, bbp, meas) in enumerate(rows, start=1):
        typer.echo(f"  {i:>3}  {_num(lead):>7}  {_num(bbp):>7}  {_num(meas):>7}")
    typer.echo(f"NMSE slope {_num(pred['fitted_slope'])} (tail sum {_num(pred['tail_slope'])}, "
               f"finite-d {_num(pred['finite_d_slope'])}, "
               f"asymptotic {_num(pred['exponent'])}) over alpha in "
               f"[{', '.join(_num(a) for a in pred['slope_alpha_range'])}]; "
               f"tail constant {_num(pred['tail_constant'])}")
    if pred["slope_reason"]:
        typer.echo(f"  why: {pred['slope_reason']}")
    typer.echo(f"kernel floor for d^2 << n << d^4: {_num(pred['kernel_floor'])}")


def hierarchical_cmd(
    d: int = typer.Option(60, help="input dimension (features live in D = d(d+1)/2)"),
    p: Optional[int] = typer.Option(None, help="latent features (default round(d^eps))"),
    gamma: float = typer.Option(1.0, help="decay exponent of |b_i| = i^-gamma (> 1/2)"),
    alpha_min: float = typer.Option(2.0, help="smallest log_d n"),
    alpha_max: float = typer.Option(3.6, help="largest log_d n"),
    points: int = typer.Option(9, help="number of alpha values (evenly spaced)"),
    seeds: int = typer.Option(3, help="independent repetitions"),
    eps: float = typer.Option(0.5, help="exponent of the default p"),
    activation: str = typer.Option("identity", help="g*: identity or tanh"),
    features: str = typer.Option("hermite", help="hermite, or gaussian (Gaussian-equivalent)"),
    n_test: int = typer.Option(2000, help="test samples per seed"),
    kernel_max_n: int = typer.Option(2000, help="largest kernel-ridge training set (0: no baseline)"),
    solver: str = typer.Option("auto", help="eigensolver: auto, eigsh (matrix-free) or dense"),
    seed: int = typer.Option(0, help="master seed of the simulation (teachers and data sets; not a scoring seed)"),
    fmt: Format = typer.Option(Format.table, "--format", help="table or json"),
    output: Annotated[Optional[Path], path_option(
        "--output", "-o", help="folder for hierarchical.json and the PNGs")] = None,
) -> None:
    """Sweep n = d^alpha: per-feature overlaps, spectral vs kernel NMSE, and the predictions."""
    from wbfe.render.files import check_output_dir
    from wbfe.theory.hierarchical import HierarchicalSettings, simulate_hierarchical
    from wbfe.theory.json_io import dumps

    with fields_as_flags("alpha_min", "alpha_max", "points", "n_test", "kernel_max_n"):
        settings = HierarchicalSettings(d=d, p=p, gamma=gamma, alpha_min=alpha_min, alpha_max=alpha_max,
                                        points=points, seeds=seeds, eps=eps, activation=activation,
                                        features=features, n_test=n_test, kernel_max_n=kernel_max_n,
                                        solver=solver, seed=seed)
    folder = check_output_dir(output) if output is not None else None  # before the simulation
    result = simulate_hierarchical(settings)
    data = result.to_dict()
    if folder is not None:
        from wbfe.theory.reports import write_hierarchical

        for path in write_hierarchical(result, folder):
            typer.echo(f"wrote {shown(path)}", err=True)
    if fmt is Format.json:
        typer.echo(dumps(data))
    else:
        _print_table(data)
