"""Time and accuracy of the HTMP fit on 1,000-eigenvalue spectra drawn from known laws.

Run:  python benchmarks/bench_htmp_fit.py   (single-threaded; prints a table, writes JSON)

For each law the script draws 1,000 eigenvalues (seeded), then times ``fit`` with the default τ
(one spacing below min(e), as the ``htmp`` metric group does) and with τ fixed at the true 0, on
one core (CPU time of this process, best of ``REPEATS``), and reports the recovered κ and β.
Requirement (issue #19 item 3): <= 20 ms median per fit.

Then the batch (an MoE layer's experts): ``BATCH`` spectra of one γ (different draws of one law),
``fit_many`` of all of them against ``fit`` of each, in the same run, CPU time per fit and the
ratio; and the largest difference between the two fits of a spectrum (log κ, log β).
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import TypedDict

# One core: keep BLAS/OpenMP pools to a single thread before numpy is imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from wbfe.metrics import htmp  # noqa: E402

N = 1000
REPEATS = 3
BATCH = 64
BATCH_LAW = (2.0, 0.5, 1.0)  # (κ, γ, β)
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


class BatchTiming(TypedDict):
    """``fit_many`` against one ``fit`` per spectrum: CPU seconds per fit and the fits' largest difference."""

    law: list[float]
    spectra: int
    n_eigenvalues: int
    single_seconds_per_fit: float
    batch_seconds_per_fit: float
    ratio_single_over_batch: float
    max_abs_dlog_kappa: float
    max_abs_dlog_beta: float


def _time_fit(eigs: np.ndarray, gamma: float, tau: float | None) -> tuple[float, htmp.HTMPFit]:
    best = float("inf")
    result = None
    for _ in range(REPEATS):
        start = time.process_time()
        result = htmp.fit(eigs, gamma, tau=tau)
        best = min(best, time.process_time() - start)
    assert result is not None
    return best, result


def _batch() -> BatchTiming:
    kappa, gamma, beta = BATCH_LAW
    spectra = [htmp.sample(N, kappa, gamma, beta, seed=1000 + i) for i in range(BATCH)]
    start = time.process_time()
    single = [htmp.fit(eigs, gamma) for eigs in spectra]
    single_s = time.process_time() - start
    start = time.process_time()
    many = htmp.fit_many(spectra, gamma)
    many_s = time.process_time() - start
    pairs = [(a, b) for a, b in zip(single, many) if isinstance(b, htmp.HTMPFit)]
    assert len(pairs) == BATCH
    return {
        "law": list(BATCH_LAW),
        "spectra": BATCH,
        "n_eigenvalues": N,
        "single_seconds_per_fit": single_s / BATCH,
        "batch_seconds_per_fit": many_s / BATCH,
        "ratio_single_over_batch": single_s / many_s,
        "max_abs_dlog_kappa": max(abs(math.log(a.kappa / b.kappa)) for a, b in pairs),
        "max_abs_dlog_beta": max(abs(math.log(a.beta / b.beta)) for a, b in pairs),
    }


def main() -> int:
    rows = []
    times: list[float] = []  # the rows' "seconds"
    for kappa, gamma, beta in LAWS:
        eigs = htmp.sample(N, kappa, gamma, beta, seed=7)
        for label, tau in (("default_tau", None), ("tau=0", 0.0)):
            seconds, fit = _time_fit(eigs, gamma, tau)
            times.append(round(seconds, 4))
            rows.append(
                {
                    "kappa": kappa,
                    "gamma": gamma,
                    "beta": beta,
                    "tau_mode": label,
                    "seconds": times[-1],
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
    summary = {
        "n_eigenvalues": N,
        "median_seconds": statistics.median(times),
        "max_seconds": max(times),
        "within_0.5s": sum(t <= 0.5 for t in times),
        "within_0.02s": sum(t <= 0.02 for t in times),
        "fits": len(times),
    }
    print(json.dumps(summary))
    batch = _batch()
    print(json.dumps(batch))
    print(f"batch of {BATCH}: {batch['batch_seconds_per_fit'] * 1e3:.1f} ms per fit against "
          f"{batch['single_seconds_per_fit'] * 1e3:.1f} ms alone: {batch['ratio_single_over_batch']:.1f}x")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps(
            {
                "summary": summary,
                "batch": batch,
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
