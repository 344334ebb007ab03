"""Run a theory sweep from its settings, then draw its figures and write its JSON in one folder (the plots only
draw). Each ``write_*`` returns the data it wrote, non-finite values still as floats; its JSON holds ``null``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

import numpy as np

from wbfe.render.files import write_json
from wbfe.theory.settings import CurveSettings, HmcSettings, StudentSettings

if TYPE_CHECKING:
    from wbfe.theory.hierarchical import HierarchicalResult

__all__ = ["write_curve", "write_hmc", "write_student", "write_hierarchical"]

PathLike = Union[str, Path]


def write_curve(settings: CurveSettings, out_dir: PathLike) -> dict[str, Any]:
    """Sweep the fixed point over r, fit the regime exponents, save three PNGs and ``curve.json``; return
    the JSON written, with ``files`` listing the paths."""
    from wbfe.reporting.plots.theory import plot_eps, plot_kc, plot_staircase
    from wbfe.theory.teacher_student import fit_regimes, readout, sweep

    s = settings
    out = Path(out_dir)
    v = readout(s.readout, s.k, beta=s.beta, rate=s.rate, nonzeros=s.nonzeros)
    sw = sweep(v, delta=s.delta, d=s.d, r_values=np.geomspace(s.r_min, s.r_max, s.points), activation=s.activation)
    fit = fit_regimes(sw, beta=s.beta) if s.readout == "power" else None
    files = [plot_staircase(sw, out / "staircase.png"), plot_eps(sw, fit, out / "eps.png"), plot_kc(sw, out / "kc.png"),
             out / "curve.json"]
    data = {"settings": s.to_dict(), "sweep": sw.to_dict(), "fit": fit.to_dict() if fit is not None else None,
            "readout": s.readout, "beta": s.beta, "files": [str(f) for f in files]}
    write_json(out / "curve.json", data, indent=1)
    return data


def write_hmc(settings: HmcSettings, out_dir: Optional[PathLike] = None) -> dict[str, Any]:
    """Run :func:`~wbfe.theory.hmc.hmc_check`; with ``out_dir``, save ``hmc.png`` and ``hmc.json``."""
    from wbfe.theory.hmc import hmc_check
    from wbfe.theory.teacher_student import readout, sweep

    s = settings
    pts = hmc_check(r_values=s.r_values, d=s.d, k=s.k, delta=s.delta, beta=s.beta, activation=s.activation,
                    seeds=s.seeds, warmup=s.warmup, samples=s.samples, device=s.device)
    data: dict[str, Any] = {"settings": s.to_dict(), "points": [p.to_dict() for p in pts], "d": s.d, "k": s.k,
                            "delta": s.delta, "beta": s.beta, "files": []}
    if out_dir is not None:
        from wbfe.reporting.plots.theory import plot_hmc

        out = Path(out_dir)
        # The theory curve spans the simulated r values with a factor 2 of margin on each side.
        r_grid = np.geomspace(min(s.r_values) / 2, max(s.r_values) * 2, 120)
        sw = sweep(readout("power", s.k, beta=s.beta), delta=s.delta, d=s.d, r_values=r_grid, activation=s.activation)
        data["files"] = [str(plot_hmc(pts, sw.r, sw.eps, out / "hmc.png")), str(out / "hmc.json")]
        write_json(out / "hmc.json", data, indent=1)
    return data


def write_student(settings: StudentSettings, out_dir: Optional[PathLike] = None) -> dict[str, Any]:
    """Run :func:`~wbfe.theory.student.student_sweep`; with ``out_dir``, save ``student.png`` and ``student.json``."""
    from wbfe.theory.student import student_sweep

    s = settings
    res = student_sweep(widths=s.widths, d=s.d, k=s.k, n=s.n, delta=s.delta, beta=s.beta, activation=s.activation,
                        seeds=s.seeds, epochs=s.epochs, lr=s.lr, device=s.device)
    data: dict[str, Any] = {"settings": s.to_dict(), **res.to_dict(), "files": []}
    if out_dir is not None:
        from wbfe.reporting.plots.theory import plot_student

        out = Path(out_dir)
        data["files"] = [str(plot_student(res, out / "student.png")), str(out / "student.json")]
        write_json(out / "student.json", data, indent=1)
    return data


def write_hierarchical(result: "HierarchicalResult", out_dir: PathLike) -> list[Path]:
    """Save ``hierarchical.json`` and the two figures of a hierarchical sweep; return the paths."""
    from wbfe.reporting.plots.hierarchical import write_figures

    out = Path(out_dir)
    data = result.to_dict()
    write_json(out / "hierarchical.json", data, indent=1)
    return [out / "hierarchical.json", *write_figures(data, out)]

