"""Two speed paths whose removal changes the last digits, end to end: the worker pool and BFE-W
from a factor's diagonal.

Run:  python benchmarks/bench_speed_paths.py [--repeats 3] [--moe-layers 2] [--experts 128] [--dense-layers 1]

Each case is scored in fresh processes, the variants alternating, median of ``--repeats``
(benchmarks/_score_ab.py):

- ``moe_experts`` (default metrics): ``shipped`` against ``no_workers``: wbfe.engine.pipeline's
  ``worker_count`` bound to 1, so there is no worker pool and no thread pinning, and every matrix is
  scored on the calling thread with all BLAS threads;
- ``llama7b_layers`` (``--metrics bfe``): ``shipped`` (BFE-W's mean(log e) from a Cholesky factor's
  diagonal, or an LU's for a square W, where no group needs eigenvalues) against ``eig_bfe``
  (wbfe.engine.jobs's ``planned_spectrum`` always asked for the eigenvalues, BFE-W from them).

Neither switch keeps every number bit for bit (another summation order, another factorisation), so
each case records the largest relative difference of the ``bfe`` column from the shipped code's
first run, over every run, beside ``same_numbers``. ``end_to_end_speedup`` = the variant's median over shipped's; ``decision``
per case: "kept" at ``threshold`` or more, else "delete".

Results: ``benchmarks/results/speed_paths.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is a folder, not a package
from benchmarks._score_ab import (  # noqa: E402
    LLAMA_MATRICES, alternate, case_arguments, header, llama7b_layers, moe_experts, ratio)

OUT = Path(__file__).resolve().parent / "results" / "speed_paths.json"
THRESHOLD = 1.2
# case -> (what the switch removes, the switch)
PATHS = {"moe_experts": ("the worker pool and thread pinning (wbfe/engine/pipeline.py)", "no_workers"),
         "llama7b_layers": ("BFE-W from a Cholesky/LU factor's diagonal when only bfe is asked "
                            "(wbfe/linalg/spectra.py log_moments, wbfe/engine/jobs.py need_eigs)", "eig_bfe")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    case_arguments(parser)
    parser.set_defaults(moe_layers=2, dense_layers=1)
    parser.add_argument("--dense-matrices", default=",".join(LLAMA_MATRICES),
                        help="which of each LLaMA layer's matrices (q,k,v,o,gate,up,down)")
    parser.add_argument("--cases", default="moe,llama7b")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/wbfe-ab-cases"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    cases = args.cases.split(",")
    report = header() | {
        "args": {k: str(v) for k, v in vars(args).items()}, "threshold": THRESHOLD,
        "note": "measured on a 2-core machine shared with other jobs (each run's 1-minute load average is kept "
                "beside it): compare the medians and per-round ratios, not the absolute times",
        "cases": {}}

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")

    work = args.work_dir
    plans = []
    if "moe" in cases:
        plans.append(("moe_experts", moe_experts(work / f"moe-{args.moe_layers}x{args.experts}", args.moe_layers,
                                                 args.experts), ""))
    if "llama7b" in cases:
        chosen = tuple(args.dense_matrices.split(","))
        plans.append(("llama7b_layers", llama7b_layers(work / f"llama-{args.dense_layers}-{'-'.join(chosen)}",
                                                       args.dense_layers, chosen), "bfe"))
    for name, info, metrics in plans:
        removes, switch = PATHS[name]
        print(f"{name}: {info['what']}", flush=True)
        case = {"checkpoint": info["what"], "path_measured": removes} | alternate(
            Path(info["path"]), metrics, {"shipped": "", switch: switch}, args.repeats, column="bfe")
        case.update(ratio(case, switch, "shipped"))
        case["decision"] = "kept" if case["end_to_end_speedup"] >= THRESHOLD else "delete"
        report["cases"][name] = case
        print(json.dumps({k: case[k] for k in ("end_to_end_speedup", "same_numbers", "max_relative_difference_bfe",
                                               "decision")}), flush=True)
        save()
    report["load_average_end"] = header()["load_average_start"]
    report["decision"] = "; ".join(f"{name} ({PATHS[name][1]} {case['end_to_end_speedup']}x): {case['decision']}"
                                   for name, case in report["cases"].items())
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
