"""Scaling exponents of the fixed point (docs/math.md §6): ε(n) per regime and k_c(d), ε(d) per readout family.

Usage: python benchmarks/theory/exponents.py
Writes benchmarks/theory/results/exponents.json.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from wbfe.theory.json_io import dumps
from wbfe.theory.hermite import kernel
from wbfe.theory.teacher_student import fit_regimes, readout, scaling_table, sweep

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    start = time.time()
    kern = kernel("tanh2")
    out: dict = {"activation": "tanh2", "lambda_sigma": kern.lambda_sigma, "q_sigma": kern.q_sigma, "g1": kern.g1,
                 "mu1": kern.mu[1], "delta": 0.04, "n_exponents": [], "d_scaling": {}}
    for beta in (0.75, 1.0, 1.5, 2.0):
        # Feature learning: k = 20000 features so that 8 <= k_c <= k/50 spans decades of n while
        # k_c/k stays small (the finite-k correction goes like (k_c/k)^(2β−1), slow for β near ½).
        fl = sweep(readout("power", 20000, beta=beta), delta=0.04, d=1000,
                   r_values=np.geomspace(1e-4, 1e7, 150), kern=kern)
        # Refinement: a narrower teacher, so that every feature is on well inside the range.
        rf = sweep(readout("power", 50, beta=beta), delta=0.04, d=100, r_values=np.geomspace(1e-1, 1e12, 160),
                   kern=kern)
        f1, f2 = fit_regimes(fl, beta=beta, kc_max_frac=0.02), fit_regimes(rf, beta=beta)
        row = {"beta": beta, "feature_learning": f1.feature_learning,
               "feature_learning_predicted": f1.feature_learning_predicted,
               "feature_learning_window_n": list(f1.feature_learning_window), "k_feature_learning": 20000,
               "kc_window": [8, 400],
               "refinement": f2.refinement, "refinement_predicted": -1.0,
               "refinement_window_n": list(f2.refinement_window), "k_refinement": 50,
               "max_roots": int(max(fl.n_roots.max(), rf.n_roots.max()))}
        out["n_exponents"].append(row)
        print(f"beta={beta}: feature-learning {f1.feature_learning:+.3f} (pred {f1.feature_learning_predicted:+.3f}, "
              f"n in [{f1.feature_learning_window[0]:.3g}, {f1.feature_learning_window[1]:.3g}]); "
              f"refinement {f2.refinement:+.4f} (pred -1)")
    d_values = [100, 200, 400, 800, 1600, 3200, 6400, 12800]
    for r in (2.0, 4.0):
        rows = scaling_table(d_values, r=r, gamma=0.5, delta=0.04)
        out["d_scaling"][f"r={r}"] = [scaling.to_dict() for scaling in rows]
        print(f"r = {r}, gamma = 0.5, d = {d_values}")
        for scaling in rows:
            print(f"  {scaling.family:<16} k_c ({scaling.kc_axis}) {scaling.kc_slope:+.3f} pred {scaling.kc_predicted:+.2f}   "
                  f"eps {scaling.eps_slope:+.3f} pred {scaling.eps_predicted:+.2f}   k_c={list(scaling.k_c)}")
    out["seconds"] = time.time() - start
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "exponents.json"
    path.write_text(dumps(out))
    print(f"wrote {path} in {out['seconds']:.0f} s")


if __name__ == "__main__":
    main()
