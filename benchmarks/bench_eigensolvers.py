"""Eigenvalue-only symmetric solvers on Gram matrices of p × 2p Gaussian matrices, alternating, median.

Run:  python benchmarks/bench_eigensolvers.py [--sizes 256,1024,2048,4096] [--threads 1]

Times scipy's ``eigvalsh`` with its drivers ``evr`` (the default, what wbfe used everywhere before),
``evd`` and ``ev``, LAPACK's two-stage ``dsyevd_2stage`` (``wbfe.linalg.blas.eigvalsh_two_stage``) and
torch's ``eigvalsh``, each on a fresh copy, in turn, ``--repeats`` rounds; reports the medians,
the ratio of ``evr`` to each, and the largest eigenvalue difference over λ_max. wbfe switches to
the two-stage solver from ``spectra.TWO_STAGE_P``. Writes ``results/eigensolvers.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "results" / "eigensolvers.json"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="256,1024,2048,3072,4096")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    import numpy as np
    import scipy.linalg
    import torch

    from wbfe.linalg import blas, spectra

    torch.set_num_threads(args.threads)
    solvers = {
        "evr": lambda g: scipy.linalg.eigvalsh(g, lower=True, check_finite=False, overwrite_a=True),
        "evd": lambda g: scipy.linalg.eigvalsh(g, lower=True, check_finite=False, overwrite_a=True, driver="evd"),
        "ev": lambda g: scipy.linalg.eigvalsh(g, lower=True, check_finite=False, overwrite_a=True, driver="ev"),
        "two_stage": blas.eigvalsh_two_stage,
        "torch": lambda g: torch.linalg.eigvalsh(torch.from_numpy(g), UPLO="L").numpy(),
    }
    rng = np.random.default_rng(0)
    rows = []
    for p in (int(s) for s in args.sizes.split(",")):
        w = rng.standard_normal((p, 2 * p))
        gram = np.asfortranarray(w @ w.T)
        times: dict[str, list[float]] = {name: [] for name in solvers}
        values: dict[str, np.ndarray] = {}
        for _ in range(args.repeats):
            for name, solve in solvers.items():
                g = gram.copy(order="F")
                start = time.perf_counter()
                values[name] = np.sort(solve(g))
                times[name].append(time.perf_counter() - start)
        top = float(values["evr"][-1])
        seconds = {k: statistics.median(v) for k, v in times.items()}
        max_diff = {k: float(np.max(np.abs(v - values["evr"]))) / top for k, v in values.items()}
        evr_over = {k: seconds["evr"] / v for k, v in seconds.items()}
        rows.append({"p": p, "seconds": seconds, "max_diff_over_lambda_max": max_diff, "evr_over": evr_over})
        print(f"p={p:5d}  " + "  ".join(f"{k} {v * 1e3:9.1f} ms ({evr_over[k]:.2f}x)" for k, v in seconds.items()),
              flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({
        "rows": rows, "threads": args.threads, "repeats": args.repeats, "two_stage_from_p": spectra.TWO_STAGE_P,
        "cpu": _cpu(), "python": sys.version.split()[0], "numpy": np.__version__, "scipy": scipy.__version__,
        "torch": torch.__version__, "machine": platform.machine(), "load_average": os.getloadavg(),
    }, indent=2))
    return 0


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    raise SystemExit(main())
