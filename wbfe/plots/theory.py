"""Figures of the teacher–student theory and its simulation checks, and the reports that write them.

``plot_*`` draw one figure from computed values; ``write_*`` compute (sweep, HMC, Adam students),
draw, and save the figures and a JSON of the numbers in one folder — what ``wbfe theory curve``,
``hmc`` and ``student`` call.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional, Sequence, Union

import numpy as np

from wbfe.errors import InvalidOptionError

__all__ = [
    "plot_staircase",
    "plot_eps",
    "plot_kc",
    "plot_hmc",
    "plot_student",
    "write_curve",
    "write_hmc",
    "write_student",
]

PathLike = Union[str, Path]


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(6.0, 4.2))


def _save(fig: Any, path: PathLike) -> Path:
    import matplotlib.pyplot as plt

    from wbfe.report import save_figure

    fig.tight_layout()
    try:
        return save_figure(fig, Path(path), dpi=110)
    finally:
        plt.close(fig)


def plot_staircase(sw: Any, path: PathLike, *, max_features: int = 40) -> Path:
    """qᵢ against r for the first ``max_features`` features: the staircase of sharp transitions."""
    fig, ax = _figure()
    # Log-spaced feature indices: the early transitions are the informative ones.
    idx = np.unique(np.geomspace(1, sw.k, min(max_features, sw.k)).astype(int)) - 1
    for i in idx:
        ax.plot(sw.r, sw.q[:, i], lw=1.0)
    ax.set_xscale("log")
    ax.set_xlabel("r = n/(kd)")
    ax.set_ylabel("overlap q_i")
    ax.set_title(f"overlaps of {len(idx)} of k={sw.k} features (log-spaced i); q_sigma={sw.q_sigma:.3f}")
    return _save(fig, path)


def plot_eps(sw: Any, fit: Any, path: PathLike) -> Path:
    """ε against r (log-log) with the fitted and predicted slopes of the two regimes."""
    fig, ax = _figure()
    ax.loglog(sw.r, sw.eps, "k-", lw=1.2, label="eps^BO (fixed point)")
    if fit is not None:
        for name, color in (("feature_learning", "tab:blue"), ("refinement", "tab:red")):
            slope = getattr(fit, name)
            pred = getattr(fit, f"{name}_predicted")
            lo, hi = getattr(fit, f"{name}_window")
            if not math.isfinite(slope):
                continue
            mask = (sw.n >= lo) & (sw.n <= hi)
            r_win, e_win = sw.r[mask], sw.eps[mask]
            anchor_r, anchor_e = math.sqrt(r_win[0] * r_win[-1]), math.exp(np.mean(np.log(e_win)))
            xs = np.array([r_win[0], r_win[-1]])
            ax.loglog(xs, anchor_e * (xs / anchor_r) ** slope, "-", color=color, lw=2.5, alpha=0.6,
                      label=f"{name}: fitted {slope:.3f}")
            ax.loglog(xs, anchor_e * (xs / anchor_r) ** pred, "--", color=color, lw=1.2,
                      label=f"{name}: predicted {pred:.3f}")
    ax.set_xlabel("r = n/(kd)")
    ax.set_ylabel("eps")
    ax.legend(fontsize=7)
    return _save(fig, path)


def plot_kc(sw: Any, path: PathLike) -> Path:
    """The effective width k_c against r."""
    fig, ax = _figure()
    ax.step(sw.r, sw.k_c, where="post", color="k")
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_ylim(0, 1.5 * max(sw.k, 1))
    ax.axhline(sw.k, color="gray", ls=":", lw=1)
    ax.set_xlabel("r = n/(kd)")
    ax.set_ylabel(f"k_c (teacher width k = {sw.k})")
    return _save(fig, path)


def plot_hmc(points: Sequence[Any], r_theory: np.ndarray, eps_theory: np.ndarray, path: PathLike) -> Path:
    """HMC Gibbs error/2 (mean ± 2 s.e. over seeds) against the theory's ε(r)."""
    fig, ax = _figure()
    ax.plot(r_theory, eps_theory, "k-", label="eps^BO (theory)")
    ax.errorbar([p.r for p in points], [p.gibbs_half for p in points],
                yerr=[2 * p.sem if math.isfinite(p.sem) else 0.0 for p in points], fmt="o", color="tab:red",
                capsize=3, label="HMC Gibbs error / 2 (±2 s.e.)")
    ax.set_xlabel("r = n/(kd)")
    ax.set_ylabel("error")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_student(result: Any, path: PathLike) -> Path:
    """Adam student test error against width, with the theory's k_c marked."""
    fig, ax = _figure()
    sem = [2 * s if math.isfinite(s) else 0.0 for s in result.sem]
    ax.errorbar(result.widths, result.test_error, yerr=sem, fmt="o-", capsize=3, label="Adam student")
    ax.axvline(result.k_c, color="tab:red", ls="--", label=f"k_c = {result.k_c} (theory)")
    ax.axhline(result.eps_theory, color="gray", ls=":", label=f"eps^BO = {result.eps_theory:.3g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("student width k_s")
    ax.set_ylabel("test error")
    ax.set_title(f"n={result.n}, d={result.d}, k={result.k}, Delta={result.delta}")
    ax.legend(fontsize=8)
    return _save(fig, path)


def _write_json(data: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, allow_nan=True))
    return path


def write_curve(out_dir: PathLike, *, beta: float = 0.3, delta: float = 0.04, d: int = 200, k: int = 100,
                r_min: float = 0.01, r_max: float = 100.0, points: int = 80, activation: Any = "tanh2",
                readout_kind: str = "power", rate: float = 0.2, nonzeros: int = 3) -> dict[str, Any]:
    """Sweep the fixed point over r, fit the regime exponents, and save three PNGs and ``curve.json``.

    Returns:
        The JSON written, with ``files`` listing the paths.

    Raises:
        InvalidOptionError: ``r_min``/``r_max``/``points`` out of range (and the solver's errors).
    """
    from wbfe.theory.teacher_student import fit_regimes, readout, sweep

    if not (0 < r_min < r_max and points >= 2):
        raise InvalidOptionError(f"need 0 < r_min < r_max and points >= 2 (got {r_min}, {r_max}, {points})")
    out = Path(out_dir)
    v = readout(readout_kind, k, beta=beta, rate=rate, nonzeros=nonzeros)
    sw = sweep(v, delta=delta, d=d, r_values=np.geomspace(r_min, r_max, points), activation=activation)
    fit = fit_regimes(sw, beta=beta) if readout_kind == "power" else None
    files = [
        plot_staircase(sw, out / "staircase.png"),
        plot_eps(sw, fit, out / "eps.png"),
        plot_kc(sw, out / "kc.png"),
    ]
    data = {"sweep": sw.to_dict(), "fit": fit.to_dict() if fit is not None else None,
            "readout": readout_kind, "beta": beta, "files": [str(f) for f in files]}
    files.append(_write_json(data, out / "curve.json"))
    data["files"] = [str(f) for f in files]
    return data


def write_hmc(out_dir: Optional[PathLike], *, r_values: Sequence[float], d: int = 40, k: int = 20,
              delta: float = 0.04, beta: float = 0.3, activation: Any = "tanh2", seeds: Sequence[int] = (0, 1, 2),
              warmup: int = 600, samples: int = 300, device: str = "cpu") -> dict[str, Any]:
    """Run :func:`~wbfe.theory.hmc.hmc_check` and save ``hmc.png`` and ``hmc.json`` (when ``out_dir``)."""
    from wbfe.theory.hmc import hmc_check
    from wbfe.theory.teacher_student import readout, sweep

    pts = hmc_check(r_values=r_values, d=d, k=k, delta=delta, beta=beta, activation=activation, seeds=seeds,
                    warmup=warmup, samples=samples, device=device)
    data: dict[str, Any] = {"points": [p.to_dict() for p in pts], "d": d, "k": k, "delta": delta, "beta": beta,
                            "files": []}
    if out_dir is not None:
        out = Path(out_dir)
        r_grid = np.geomspace(min(r_values) / 2, max(r_values) * 2, 120)
        sw = sweep(readout("power", k, beta=beta), delta=delta, d=d, r_values=r_grid, activation=activation)
        data["files"] = [str(plot_hmc(pts, sw.r, sw.eps, out / "hmc.png")), str(out / "hmc.json")]
        _write_json(data, out / "hmc.json")
    return data


def write_student(out_dir: Optional[PathLike], *, widths: Sequence[int], d: int = 30, k: int = 30, n: int = 2000,
                  delta: float = 0.05, beta: float = 1.0, activation: Any = "tanh2", seeds: Sequence[int] = (0,),
                  epochs: int = 1000, lr: float = 0.01, device: str = "cpu") -> dict[str, Any]:
    """Run :func:`~wbfe.theory.student.student_sweep` and save ``student.png`` and ``student.json``."""
    from wbfe.theory.student import student_sweep

    res = student_sweep(widths=widths, d=d, k=k, n=n, delta=delta, beta=beta, activation=activation, seeds=seeds,
                        epochs=epochs, lr=lr, device=device)
    data: dict[str, Any] = {**res.to_dict(), "files": []}
    if out_dir is not None:
        out = Path(out_dir)
        data["files"] = [str(plot_student(res, out / "student.png")), str(out / "student.json")]
        _write_json(data, out / "student.json")
    return data
