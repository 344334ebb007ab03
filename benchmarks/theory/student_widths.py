"""Adam students of several widths against the theory's effective width k_c (docs/math.md §6).

Usage: python benchmarks/theory/student_widths.py [--n 1000,2000,4000] [--seeds 0,1] [--epochs 2000]
Writes benchmarks/theory/results/student_widths.json (and one PNG per n).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from wbfe.theory.json_io import dumps
from wbfe.theory.reports import write_student
from wbfe.theory.settings import StudentSettings

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", default="1000,2000,4000")
    ap.add_argument("--d", type=int, default=30)
    ap.add_argument("--k", type=int, default=30)
    ap.add_argument("--delta", type=float, default=0.05)
    ap.add_argument("--beta", type=float, default=1.0)
    ap.add_argument("--widths", default="1,2,3,4,6,8,12,16,24,32,48")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--epochs", type=int, default=2000)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(1)
    start = time.time()
    runs = []
    for n in [int(x) for x in args.n.split(",")]:
        settings = StudentSettings(widths=tuple(int(w) for w in args.widths.split(",")), d=args.d, k=args.k, n=n,
                                   delta=args.delta, beta=args.beta, seeds=tuple(int(s) for s in args.seeds.split(",")),
                                   epochs=args.epochs, device=args.device)
        data = write_student(settings, RESULTS / f"student_n{n}")
        runs.append(data)
        errs = ", ".join(f"{w}:{e:.4f}" for w, e in zip(data["widths"], data["test_error"]))
        print(f"n={n}: k_c={data['k_c']} best width={data['best_width']} eps^BO={data['eps_theory']:.4f}  [{errs}]")
    out = {"runs": runs, "epochs": args.epochs, "lr": 0.01, "seconds": time.time() - start,
           "torch": torch.__version__, "device": args.device}
    path = RESULTS / "student_widths.json"
    path.write_text(dumps(out))
    print(f"wrote {path} in {out['seconds']:.0f} s")


if __name__ == "__main__":
    main()
