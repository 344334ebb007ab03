"""Where the progress callback's ticks fall in a run: 60 same-shaped 64×64×3×3 convolutions, the
default metrics.

Run:  python benchmarks/bench_progress_ticks.py [--repeats 3]

Each run is a fresh process timing ``wbfe.score(path, device="cpu", progress=...)`` twice (``wbfe.score``
resolved first: importing wbfe.scoring is the program's start, as in the CLI): ``cold``, the process's
first score, which includes the imports made at first use (scipy.linalg, the metric groups: about
half of it on this shared machine, before the first matrix), and ``warm``, the same score again,
the work alone. Every tick (done > 0) is placed at (tick time − start) / (end − start). A bar that tracks the work has its
median tick near the middle (0.5 for evenly spread work); ticks bunched at the end (rows held back
and fitted together, spectra finished in batches) push it towards 1. Results:
``benchmarks/results/progress_ticks.json``: per run the median tick position, the first and last,
the ticks counted and the totals the callback was given; the median over runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "results" / "progress_ticks.json"

_CHILD = r"""
import json, statistics, sys, time
import wbfe
score = wbfe.score  # imports wbfe.scoring, as the CLI does before it scores: program start, not the run's


def timed(path):
    ticks, totals = [], set()

    def progress(done, total, name):
        totals.add(total)
        if done > 0:
            ticks.append(time.perf_counter())

    start = time.perf_counter()
    result = score(path, device="cpu", progress=progress)
    end = time.perf_counter()
    where = [(t - start) / (end - start) for t in ticks]
    return {"seconds": round(end - start, 4), "ticks": len(ticks), "totals": sorted(totals, key=str),
            "matrices": len(result.layers), "median_tick": round(statistics.median(where), 4),
            "first_tick": round(where[0], 4), "last_tick": round(where[-1], 4)}


cold = timed(sys.argv[1])  # the process's first score: its one-time imports (scipy.linalg, ...) included
warm = timed(sys.argv[1])
print(json.dumps({"cold": cold, "warm": warm}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "cpu_count": os.cpu_count(),
                    "load_average_start": [round(x, 2) for x in os.getloadavg()],
                    "checkpoint": "60 float32 convolutions 64x64x3x3 (randn/24, seed 0), one safetensors file",
                    "runs": []}
    with tempfile.TemporaryDirectory(prefix="wbfe-ticks-") as tmp:
        path = Path(tmp) / "model.safetensors"
        save_file({f"layers.{i}.conv.weight": torch.randn(64, 64, 3, 3, generator=g) / 24 for i in range(60)},
                  str(path))
        root = str(Path(__file__).resolve().parents[1])
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        for _ in range(args.repeats):
            out = subprocess.run([sys.executable, "-c", _CHILD, str(path)], check=True, capture_output=True,
                                 text=True, env=env)
            run = json.loads(out.stdout.strip().splitlines()[-1])
            run["load_average_1min"] = round(os.getloadavg()[0], 2)
            report["runs"].append(run)
            print(json.dumps(run), flush=True)
    for when in ("warm", "cold"):
        report[f"median_tick_position_{when}"] = round(statistics.median(r[when]["median_tick"] for r in report["runs"]), 3)
    report["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print("median tick position: warm", report["median_tick_position_warm"], "cold", report["median_tick_position_cold"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
