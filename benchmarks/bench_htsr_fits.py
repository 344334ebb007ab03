"""Per-matrix CPU cost of the ``htsr`` metric group and of its parts, by spectrum size.

Run:  python benchmarks/bench_htsr_fits.py [--label NAME] [--quick]
      (one BLAS thread; prints a table, writes benchmarks/results/htsr_fits.json)

For n = 16, 64, 256, 768, 1024 eigenvalues the script builds seeded spectra of three kinds (a
Gaussian n × 2n matrix: a Marchenko–Pastur bulk; a Student-t(2.5) n × 2n matrix: a heavy tail;
a Student-t(3) n × n matrix: the quarter-circle case Q = 1 of the MP fit) and times, per matrix,
``mp_fit``, ``fit_power_law``, ``fit_truncated_power_law`` on that tail, and the whole group
``htsr`` (``GROUP.compute``: all of the above plus norms, rank and entropy). Times are CPU time of
this process (``time.process_time``), the best of ``REPEATS`` rounds of enough calls to last
~20 ms, because the machine's cores are shared and wall time is noisy. The figures of one run
are saved under ``--label`` (default ``current``), beside the labels saved by earlier runs, so the
JSON keeps the "before" run next to the "after" one; ratios are printed against ``--base``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Callable

# One core: keep BLAS/OpenMP pools to a single thread before numpy is imported.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

from wbfe.linalg.spectra import Spectrum  # noqa: E402
from wbfe.metrics import MetricOptions  # noqa: E402
from wbfe.metrics.htsr import GROUP  # noqa: E402
from wbfe.metrics.mp import mp_fit  # noqa: E402
from wbfe.metrics.powerlaw import fit_power_law, fit_truncated_power_law  # noqa: E402

SIZES = (16, 64, 256, 768, 1024)
REPEATS = 5
TARGET_S = 0.02
OUT = Path(__file__).resolve().parent / "results" / "htsr_fits.json"


def spectrum(kind: str, n: int, seed: int) -> Spectrum:
    rng = np.random.default_rng(seed)
    if kind == "mp":
        w = rng.standard_normal((2 * n, n))
    elif kind == "heavy":
        w = rng.standard_t(2.5, size=(2 * n, n))
    else:  # "square"
        w = rng.standard_t(3.0, size=(n, n))
    e = np.linalg.eigvalsh(w.T @ w)
    e[e <= e[-1] * w.shape[0] * np.finfo(np.float64).eps * 10] = 0.0
    return Spectrum(eigs=np.sort(e), rows=w.shape[0], cols=w.shape[1])


def cpu_seconds(call: Callable[[], object]) -> float:
    """Best per-call CPU time over REPEATS rounds of enough calls to last about TARGET_S."""
    start = time.process_time()
    call()
    once = max(time.process_time() - start, 1e-6)
    calls = max(1, int(TARGET_S / once))
    best = float("inf")
    for _ in range(REPEATS):
        start = time.process_time()
        for _ in range(calls):
            call()
        best = min(best, (time.process_time() - start) / calls)
    return best


def measure(sizes: tuple[int, ...]) -> list[dict]:
    options = MetricOptions()
    rows = []
    for n in sizes:
        for kind in ("mp", "heavy", "square"):
            spec = spectrum(kind, n, seed=n)
            e = spec.eigs
            assert e is not None  # spectrum() always keeps the eigenvalues
            positive = e[e > 0.0]
            pl = fit_power_law(positive)
            parts = {
                "mp_fit": lambda: mp_fit(e, spec.P, spec.p),
                "power_law": lambda: fit_power_law(positive),
                "tpl": (lambda: fit_truncated_power_law(positive, xmin=pl.xmin)) if pl.ok else None,
                "htsr_total": lambda: GROUP.compute(spec, options),
            }
            row: dict = {"n": n, "kind": kind}
            for part, call in parts.items():
                row[part + "_ms"] = None if call is None else round(1e3 * cpu_seconds(call), 4)
            rows.append(row)
            print(
                f"n={n:<5d} {kind:<6s} "
                + "  ".join(f"{k[:-3]}={v if v is None else f'{v:8.3f}'} ms" for k, v in row.items() if k.endswith("_ms")),
                flush=True,
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="current", help="name of this run in the JSON")
    parser.add_argument("--base", default="before", help="label to print ratios against")
    parser.add_argument("--quick", action="store_true", help="n = 16 and 768 only")
    args = parser.parse_args()
    rows = measure((16, 768) if args.quick else SIZES)
    saved = json.loads(OUT.read_text()) if OUT.exists() else {}
    runs = saved.get("runs", {})
    runs[args.label] = {
        "rows": rows,
        "cpu": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    base = runs.get(args.base)
    if base is not None and args.label != args.base:
        ref = {(r["n"], r["kind"]): r for r in base["rows"]}
        print(f"\nspeed-up against '{args.base}' (its time / this run's):")
        for row in rows:
            old = ref.get((row["n"], row["kind"]))
            if old is None:
                continue
            ratios = [
                f"{k[:-3]} {old[k] / row[k]:6.1f}x"
                for k in row
                if k.endswith("_ms") and row[k] and old.get(k)
            ]
            print(f"n={row['n']:<5d} {row['kind']:<6s} " + "  ".join(ratios))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    print(f"saved {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
