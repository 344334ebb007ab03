"""``wbfe theory solve|curve|hmc|student|scaling``: the Bayes-optimal teacher–student model (docs/math.md §6)."""

from __future__ import annotations

import math
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from wbfe.errors import InvalidOptionError
from wbfe.options import field_defaults
from wbfe.theory.settings import CurveSettings, HmcSettings, StudentSettings

from ._output import shown
from ._options import Format, fields_as_flags, path_option

# Every default is the settings class's own (solve's are a curve's at one r).
_CURVE, _HMC, _STUDENT = (field_defaults(cls) for cls in (CurveSettings, HmcSettings, StudentSettings))


def _listed(values: tuple[Any, ...]) -> str:
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


class Readout(str, Enum):
    power = "power"
    dense = "dense"
    exp = "exp"
    sparse = "sparse"


def _floats(text: str, name: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InvalidOptionError(f"{name} must be comma-separated numbers, got {text!r}") from None
    if not values:
        raise InvalidOptionError(f"{name} must not be empty")
    return values


def _ints(text: str, name: str) -> list[int]:
    _floats(text, name)  # no numbers, or none: refused as such
    try:  # int(), not float(): "3.0" is refused as the library refuses a float seed or width, not read as 3
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InvalidOptionError(f"{name} must be comma-separated integers, got {text!r}") from None


def _num(x: Any) -> str:
    return f"{x:.6g}" if isinstance(x, float) and math.isfinite(x) else str(x)


# The readout option each family reads; the others ignore it.
_READOUT_OPTION = {"beta": Readout.power, "rate": Readout.exp, "nonzeros": Readout.sparse}


def _refuse_unread(ctx: typer.Context, readout: Readout) -> None:
    """Refuse a readout option given on the command line that the chosen family does not read (``--rate`` with
    the power readout was ignored without a word)."""
    for name, family in _READOUT_OPTION.items():
        source = ctx.get_parameter_source(name) if name in ctx.params else None
        if source is not None and source.name == "COMMANDLINE" and readout is not family:
            raise InvalidOptionError(f"--{name} shapes the {family.value} readout only; this is the "
                                     f"{readout.value} readout: give --readout {family.value}, or leave --{name} out")


def _print_json(data: Any) -> None:
    from wbfe.theory.json_io import dumps

    typer.echo(dumps(data))


def _print_pairs(pairs: list[tuple[str, Any]]) -> None:
    width = max(len(k) for k, _ in pairs)
    for key, value in pairs:
        typer.echo(f"{key:<{width}}  {_num(value)}")


def solve_cmd(
    ctx: typer.Context,
    beta: float = typer.Option(_CURVE["beta"], help="power-law exponent of the readout"),
    delta: float = typer.Option(_CURVE["delta"], help="noise variance Delta"),
    d: int = typer.Option(_CURVE["d"], help="input dimension"),
    k: int = typer.Option(_CURVE["k"], help="teacher width"),
    r: Optional[float] = typer.Option(None, help="n/(kd) (default 0.5 unless --n is given)"),
    n: Optional[float] = typer.Option(None, help="number of samples (instead of --r)"),
    activation: str = typer.Option(_CURVE["activation"], help="tanh2, tanh, erf or relu"),
    readout: Readout = typer.Option(Readout(_CURVE["readout"]), help="readout family"),
    rate: float = typer.Option(_CURVE["rate"], help="decay rate of the exp readout"),
    nonzeros: int = typer.Option(_CURVE["nonzeros"], help="non-zeros of the sparse readout"),
    fmt: Format = typer.Option(Format.table, "--format", help="table or json"),
) -> None:
    """Solve the fixed point: eps^BO, every crossing, q_i, snr_i, k_c."""
    from wbfe.theory.teacher_student import readout as make_readout
    from wbfe.theory.teacher_student import solve

    _refuse_unread(ctx, readout)
    if r is None and n is None:
        r = 0.5
    sol = solve(make_readout(readout.value, k, beta=beta, rate=rate, nonzeros=nonzeros), delta=delta, d=d, n=n, r=r,
                activation=activation)
    if fmt is Format.json:
        _print_json(sol.to_dict())
        return
    _print_pairs([("eps", sol.eps), ("eps_all", ", ".join(_num(e) for e in sol.eps_all)), ("k_c", sol.k_c),
                  ("n", sol.n), ("r", sol.r), ("lambda_sigma", sol.lambda_sigma), ("q_sigma", sol.q_sigma),
                  ("g1", sol.g1), ("q[:10]", " ".join(f"{x:.4f}" for x in sol.q[:10]))])


def curve_cmd(
    ctx: typer.Context,
    output: Annotated[Path, path_option("--output", "-o", help="folder for the PNGs and curve.json")],
    beta: float = typer.Option(_CURVE["beta"], help="power-law exponent of the readout"),
    delta: float = typer.Option(_CURVE["delta"], help="noise variance Delta"),
    d: int = typer.Option(_CURVE["d"], help="input dimension"),
    k: int = typer.Option(_CURVE["k"], help="teacher width"),
    r_min: float = typer.Option(_CURVE["r_min"], help="smallest n/(kd)"),
    r_max: float = typer.Option(_CURVE["r_max"], help="largest n/(kd)"),
    points: int = typer.Option(_CURVE["points"], help="number of r values (log-spaced)"),
    activation: str = typer.Option(_CURVE["activation"], help="tanh2, tanh, erf or relu"),
    readout: Readout = typer.Option(Readout(_CURVE["readout"]), help="readout family"),
    fmt: Format = typer.Option(Format.table, "--format", help="table or json"),
) -> None:
    """Sweep eps, q_i and k_c over r; plot the staircase, eps with fitted slopes, and k_c."""
    from wbfe.render.files import check_output_dir
    from wbfe.theory.reports import write_curve
    from wbfe.theory.settings import CurveSettings

    _refuse_unread(ctx, readout)
    with fields_as_flags("r_min", "r_max", "points"):
        settings = CurveSettings(beta=beta, delta=delta, d=d, k=k, r_min=r_min, r_max=r_max, points=points,
                                 activation=activation, readout=readout.value)
    data = write_curve(settings, check_output_dir(output))  # the folder is checked before the sweep
    if fmt is Format.json:
        _print_json({"fit": data["fit"], "files": data["files"]})
        return
    fit = data["fit"] or {}
    why = fit.get("reasons") or {}  # a NaN slope comes with its reason
    _print_pairs([("feature-learning slope", fit.get("feature_learning", "n/a")),
                  ("  predicted", fit.get("feature_learning_predicted", "n/a"))]
                 + ([("  why", why["feature_learning"])] if "feature_learning" in why else [])
                 + [("refinement slope", fit.get("refinement", "n/a")),
                    ("  predicted", fit.get("refinement_predicted", "n/a"))]
                 + ([("  why", why["refinement"])] if "refinement" in why else []))
    for f in data["files"]:
        typer.echo(f"wrote {shown(f)}", err=True)


def hmc_cmd(
    r_values: str = typer.Option(_listed(_HMC["r_values"]), "--r-values", help="comma-separated n/(kd) values"),
    d: int = typer.Option(_HMC["d"], help="input dimension"),
    k: int = typer.Option(_HMC["k"], help="teacher width"),
    delta: float = typer.Option(_HMC["delta"], help="noise variance Delta"),
    beta: float = typer.Option(_HMC["beta"], help="power-law exponent of the readout"),
    seeds: str = typer.Option(_listed(_HMC["seeds"]), help="comma-separated seeds (one teacher and data set each)"),
    warmup: int = typer.Option(_HMC["warmup"], help="HMC iterations with step-size adaptation"),
    samples: int = typer.Option(_HMC["samples"], help="HMC iterations after warm-up"),
    device: str = typer.Option(_HMC["device"], help="cpu, cuda or auto"),
    output: Annotated[Optional[Path], path_option("--output", "-o", help="folder for hmc.png and hmc.json")] = None,
    fmt: Format = typer.Option(Format.table, "--format", help="table or json"),
) -> None:
    """HMC posterior sampling: Gibbs error/2 against the fixed point's eps."""
    from wbfe.render.files import check_output_dir
    from wbfe.theory.reports import write_hmc
    from wbfe.theory.settings import HmcSettings

    with fields_as_flags("r_values"):
        settings = HmcSettings(r_values=tuple(_floats(r_values, "--r-values")), d=d, k=k, delta=delta, beta=beta,
                               seeds=tuple(_ints(seeds, "--seeds")), warmup=warmup, samples=samples, device=device)
    data = write_hmc(settings, check_output_dir(output) if output is not None else None)
    if fmt is Format.json:
        _print_json(data)
        return
    typer.echo(f"{'r':>8} {'n':>7} {'k_c':>4} {'eps_theory':>11} {'gibbs/2':>11} {'s.e.':>9} {'z':>6} {'accept':>6}")
    for p in data["points"]:
        typer.echo(f"{p['r']:>8.3g} {p['n']:>7d} {p['k_c']:>4d} {p['eps_theory']:>11.5f} {p['gibbs_half']:>11.5f} "
                   f"{p['sem']:>9.2e} {p['z']:>6.2f} {p['accept_rate']:>6.2f}")
    if len(settings.seeds) < 2:
        typer.echo("s.e. and z are over seeds: one seed has none (give two or more, e.g. --seeds 0,1,2)")
    for f in data["files"]:
        typer.echo(f"wrote {shown(f)}", err=True)


def student_cmd(
    widths: str = typer.Option(_listed(_STUDENT["widths"]), help="comma-separated student widths"),
    n: int = typer.Option(_STUDENT["n"], help="number of samples"),
    d: int = typer.Option(_STUDENT["d"], help="input dimension"),
    k: int = typer.Option(_STUDENT["k"], help="teacher width"),
    delta: float = typer.Option(_STUDENT["delta"], help="noise variance Delta"),
    beta: float = typer.Option(_STUDENT["beta"], help="power-law exponent of the readout"),
    seeds: str = typer.Option(_listed(_STUDENT["seeds"]), help="comma-separated seeds"),
    epochs: int = typer.Option(_STUDENT["epochs"], help="full-batch Adam epochs"),
    lr: float = typer.Option(_STUDENT["lr"], help="Adam learning rate"),
    device: str = typer.Option(_STUDENT["device"], help="cpu, cuda or auto"),
    output: Annotated[Optional[Path], path_option(
        "--output", "-o", help="folder for student.png and student.json")] = None,
    fmt: Format = typer.Option(Format.table, "--format", help="table or json"),
) -> None:
    """Adam-trained students of several widths: test error against width, with k_c marked."""
    from wbfe.render.files import check_output_dir
    from wbfe.theory.reports import write_student
    from wbfe.theory.settings import StudentSettings

    settings = StudentSettings(widths=tuple(_ints(widths, "--widths")), n=n, d=d, k=k, delta=delta, beta=beta,
                               seeds=tuple(_ints(seeds, "--seeds")), epochs=epochs, lr=lr, device=device)
    data = write_student(settings, check_output_dir(output) if output is not None else None)
    if fmt is Format.json:
        _print_json(data)
        return
    typer.echo(f"k_c (theory) = {data['k_c']}, eps^BO = {data['eps_theory']:.5g}, best width = {data['best_width']}")
    typer.echo(f"{'width':>6} {'test error':>11}")
    for w, e in zip(data["widths"], data["test_error"]):
        typer.echo(f"{w:>6d} {e:>11.5f}")
    for f in data["files"]:
        typer.echo(f"wrote {shown(f)}", err=True)


def scaling_cmd(
    d_values: str = typer.Option("100,200,400,800,1600,3200,6400", "--d-values", help="comma-separated d"),
    r: float = typer.Option(4.0, help="n/(kd), held fixed"),
    gamma: float = typer.Option(0.5, help="k/d"),
    delta: float = typer.Option(0.04, help="noise variance Delta"),
    activation: str = typer.Option("tanh2", help="tanh2, tanh, erf or relu"),
    fmt: Format = typer.Option(Format.table, "--format", help="table or json"),
) -> None:
    """Table of the exponents of k_c(d) and eps(d) per readout family, fitted against predicted."""
    from wbfe.theory.teacher_student import scaling_table

    rows = scaling_table(_ints(d_values, "--d-values"), r=r, gamma=gamma, delta=delta, activation=activation)
    if fmt is Format.json:
        _print_json([row.to_dict() for row in rows])
        return
    typer.echo(f"{'family':<16} {'k_c fit':<12} {'k_c slope':>9} {'pred':>6} {'eps slope':>9} {'pred':>6}  note")
    for row in rows:
        typer.echo(f"{row.family:<16} {row.kc_axis:<12} {row.kc_slope:>9.3f} {row.kc_predicted:>6.2f} "
                   f"{row.eps_slope:>9.3f} {row.eps_predicted:>6.2f}  {row.note}" + (f"\n  off: {row.off}" if row.off else ""))
