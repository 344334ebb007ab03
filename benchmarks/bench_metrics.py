"""Time of the HT-SR column set per matrix against the eigendecomposition it starts from.

For each size n, a seeded Student-t (ν = 3) matrix W of shape (n, 2n): times the float64 Gram
matrix + ``numpy.linalg.eigvalsh`` (what the spectra stage does), then the full ``htsr`` group in
both modes, and its parts (power-law scan, truncated power law, MP fit). Optionally also times
``weightwatcher.WeightWatcher.analyze`` on a one-layer model of the same matrix (mp_fit off), and
checks its α against the WW-compatible mode. One BLAS/OpenMP thread; best of ``--repeats``.

    python benchmarks/bench_metrics.py [--sizes 256 512 1024 2048] [--repeats 3] [--ww-max 1024]
"""

from __future__ import annotations

import os

# Single-threaded, so the numbers compare like with like on a shared machine (set before numpy loads).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable, TypeVar  # noqa: E402

import numpy as np  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "metrics_time.json"
T = TypeVar("T")


def best_of(fn: Callable[[], T], repeats: int) -> tuple[float, T]:
    """Smallest wall time over ``repeats`` (at least one) calls, and the last result."""
    best = float("inf")
    out: T
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def eigenvalues(w: np.ndarray) -> np.ndarray:
    w = w.astype(np.float64)
    gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
    return np.linalg.eigvalsh(gram)


def ww_analyze_time(w: np.ndarray) -> tuple[float, float]:
    """Seconds WW 0.7.7 needs for one Linear layer (mp_fit off), and the α it reports."""
    import torch
    import weightwatcher

    torch.set_num_threads(1)
    layer = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(w))
    model = torch.nn.Sequential(layer)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        details = weightwatcher.WeightWatcher(model=model).analyze(randomize=False, mp_fit=False, plot=False)
        elapsed = time.perf_counter() - start
    return elapsed, float(details["alpha"].iloc[0])


def run(sizes: list[int], repeats: int, ww_max: int) -> dict:
    from wbfe.metrics import MetricOptions, Spectrum
    from wbfe.options.conventions import WEIGHTWATCHER
    from wbfe.metrics.htsr import GROUP
    from wbfe.metrics.mp import mp_fit
    from wbfe.metrics.powerlaw import fit_power_law, fit_truncated_power_law

    GROUP.compute(Spectrum(np.linspace(1.0, 50.0, 64), 64, 128), MetricOptions())  # warm imports
    rows = []
    for n in sizes:
        w = np.random.default_rng(n).standard_t(3.0, size=(n, 2 * n)).astype(np.float32)
        t_eig, e = best_of(lambda: eigenvalues(w), repeats)
        e = np.sort(np.clip(e, 0.0, None))
        spec = Spectrum(e, n, 2 * n)
        t_plain, plain = best_of(lambda: GROUP.compute(spec, MetricOptions()), repeats)
        t_ww, ww_mode = best_of(lambda: GROUP.compute(spec, MetricOptions(conventions=WEIGHTWATCHER)), repeats)
        t_pl, pl = best_of(lambda: fit_power_law(e[e > 0]), repeats)
        t_tpl, _ = best_of(lambda: fit_truncated_power_law(e[e > 0], xmin=pl.xmin), repeats)
        t_mp, _ = best_of(lambda: mp_fit(e, 2 * n, n), repeats)
        row = {
            "n": n,
            "shape": [n, 2 * n],
            "eig_s": t_eig,
            "htsr_s": t_plain,
            "htsr_ww_compatible_s": t_ww,
            "htsr_over_eig": t_plain / t_eig,
            "power_law_s": t_pl,
            "truncated_power_law_s": t_tpl,
            "mp_fit_s": t_mp,
            "alpha": plain.values["alpha"],
            "alpha_ww_compatible": ww_mode.values["alpha"],
        }
        if n <= ww_max:
            try:
                row["weightwatcher_analyze_s"], row["weightwatcher_alpha"] = ww_analyze_time(w)
            except ImportError as exc:
                row["weightwatcher_skipped"] = str(exc)
        rows.append(row)
        line = (
            f"n={n:5d}  eig {t_eig * 1e3:8.1f} ms  htsr {t_plain * 1e3:8.1f} ms ({t_plain / t_eig:5.2f}x)"
            f"  ww-mode {t_ww * 1e3:8.1f} ms"
            f"  [PL {t_pl * 1e3:.1f}, TPL {t_tpl * 1e3:.1f}, MP {t_mp * 1e3:.1f} ms]"
        )
        if "weightwatcher_analyze_s" in row:
            line += f"  WW analyze {row['weightwatcher_analyze_s']:.2f} s"
        print(line, flush=True)
    return {
        "description": "best-of wall time per matrix: float64 Gram + eigvalsh vs the full htsr column set",
        "matrix": "Student-t (df=3) entries, float32, shape (n, 2n), seed n",
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "repeats": repeats,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024, 2048])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--ww-max", type=int, default=1024, help="largest n also timed with weightwatcher (0: none)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    load_start = os.getloadavg()
    result = run(args.sizes, args.repeats, args.ww_max)
    # the machine's load over the run (a shared machine: best-of times still vary with it)
    result["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    result["load_average_1min"] = [round(load_start[0], 2), round(os.getloadavg()[0], 2)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
