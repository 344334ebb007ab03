"""HMC check of docs/math.md §6: Gibbs error/2 of posterior samples against the fixed point's ε.

Usage: python benchmarks/theory/hmc_check.py [--d 60] [--k 30] [--r 0.5,1.5,2.5,3.5,5] [--seeds 0,1,2]
Writes benchmarks/theory/results/hmc_d{d}{tag}.json (and a PNG in the folder of that name).
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch

from wbfe.theory.json_io import dumps
from wbfe.theory.reports import write_hmc
from wbfe.theory.settings import HmcSettings

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--d", type=int, default=60)
    ap.add_argument("--k", type=int, default=30)
    ap.add_argument("--delta", type=float, default=0.04)
    ap.add_argument("--beta", type=float, default=0.3)
    ap.add_argument("--r", default="0.5,1.5,2.5,3.5,5")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--warmup", type=int, default=600)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tag", default="", help="suffix of the result names (to split a run over processes)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    start = time.time()
    out = RESULTS / f"hmc_d{args.d}{args.tag}"
    settings = HmcSettings(r_values=tuple(float(x) for x in args.r.split(",")), d=args.d, k=args.k, delta=args.delta,
                           beta=args.beta, seeds=tuple(int(s) for s in args.seeds.split(",")), warmup=args.warmup,
                           samples=args.samples, device=args.device)
    data = write_hmc(settings, out)
    data.update(seconds=time.time() - start, warmup=args.warmup, samples=args.samples, leapfrog=10,
                torch=torch.__version__, machine=platform.machine(), threads=args.threads, device=args.device)
    path = RESULTS / f"hmc_d{args.d}{args.tag}.json"
    path.write_text(dumps(data))
    for p in data["points"]:
        print(f"r={p['r']:<5} n={p['n']:<6} k_c={p['k_c']:<3} eps={p['eps_theory']:.5f} "
              f"gibbs/2={p['gibbs_half']:.5f} ± {p['sem']:.5f} z={p['z']:+.2f} acc={p['accept_rate']:.2f}")
    print(f"wrote {path} in {data['seconds']:.0f} s")


if __name__ == "__main__":
    main()
