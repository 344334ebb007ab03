"""Time and accuracy of the HTMP fit on 1,000-eigenvalue spectra drawn from known laws.

Run:  python benchmarks/bench_htmp_fit.py   (single-threaded; prints a table, writes JSON)

For each law the script draws 1,000 eigenvalues (seeded), then times ``fit`` with the default τ
(one spacing below min(e), as the ``htmp`` metric group does) and with τ fixed at the true 0, on
one core (CPU time of this process, best of ``REPEATS``), and reports the recovered κ and β.
Requirement (task h1): <= 0.5 s per fit.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

# One core: keep BLAS/OpenMP pools to a single thread before numpy is imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from wbfe.metrics import htmp  # noqa: E402

N = 1000
REPEATS = 3
LAWS = [  # (κ, γ, β)
    (2.0, 0.5, 1.0),
    (0.3, 0.2, 3.0),
    (20.0, 0.1, 0.5),
    (1.0, 0.9, 2.0),
    (8.0, 0.25, 1.0),
    (60.0, 0.5, 4.0),
    (4.0, 0.05, 1.0),
    (0.5, 0.95, 1.0),  # nearly square: the longest contours for U
    (150.0, 0.3, 1.0),  # nearly Marchenko-Pastur: the likelihood is flat in kappa
]
OUT = Path(__file__).resolve().parent / "results" / "htmp_fit.json"


def _time_fit(eigs: np.ndarray, gamma: float, tau: float | None) -> tuple[float, htmp.HTMPFit]:
    best = float("inf")
    result = None
    for _ in range(REPEATS):
        start = time.process_time()
        result = htmp.fit(eigs, gamma, tau=tau)
        best = min(best, time.process_time() - start)
    assert result is not None
    return best, result


def main() -> int:
    rows = []
    for kappa, gamma, beta in LAWS:
        eigs = htmp.sample(N, kappa, gamma, beta, seed=7)
        for label, tau in (("default_tau", None), ("tau=0", 0.0)):
            seconds, fit = _time_fit(eigs, gamma, tau)
            rows.append(
                {
                    "kappa": kappa,
                    "gamma": gamma,
                    "beta": beta,
                    "tau_mode": label,
                    "seconds": round(seconds, 4),
                    "fit_kappa": fit.kappa,
                    "fit_beta": fit.beta,
                    "fit_tau": fit.tau,
                    "ks": fit.ks,
                    "converged": fit.converged,
                }
            )
            print(
                f"kappa={kappa:<6g} gamma={gamma:<5g} beta={beta:<4g} {label:<11s} "
                f"{seconds:6.3f} s  kappa^={fit.kappa:8.4g} beta^={fit.beta:8.4g} "
                f"tau^={fit.tau:8.3g} KS={fit.ks:.4f}"
            )
    times = [r["seconds"] for r in rows]
    summary = {
        "n_eigenvalues": N,
        "median_seconds": statistics.median(times),
        "max_seconds": max(times),
        "within_0.5s": sum(t <= 0.5 for t in times),
        "fits": len(times),
    }
    print(json.dumps(summary))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "summary": summary,
                "rows": rows,
                "python": sys.version.split()[0],
                "numpy": np.__version__,
                "machine": platform.machine(),
                "timer": "time.process_time, best of %d, one thread" % REPEATS,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
