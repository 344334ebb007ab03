"""wbfe/linalg/blas.py (GIL-free ctypes calls into scipy's OpenBLAS, OpenBLAS's own thread calls, LAPACK's
two-stage eigen-solver) against scipy.linalg's public wrappers under threadpoolctl, end to end.

Run:  python benchmarks/bench_blas_layer.py [--repeats 3] [--moe-layers 27] [--dense-layers 2]

The default ``wbfe.score`` of the three generated checkpoints of bench_fit_batching.py (a CIFAR
ResNet-56, 10,368 MoE experts of 256 × 1024, LLaMA-7B-shaped layers), each in fresh processes,
the variants alternating, median of ``--repeats``:

- ``blas_layer``: as shipped;
- ``scipy``: ``scipy.linalg.blas.dsyrk``, ``scipy.linalg.lapack.dpotrf``/``dgetrf`` and
  ``scipy.linalg.eigh(driver="evr")`` in place of wbfe.linalg.blas's calls (the same LAPACK routines, so
  the same numbers, but holding the GIL), no two-stage solver, and thread limits through
  threadpoolctl's controller in place of OpenBLAS's own calls;
- ``scipy_keep_two_stage`` (7B case only, where p ≥ 2,560 takes the two-stage solver): the same
  but the two-stage solver kept, to tell its share from the rest.

Results: ``benchmarks/results/blas_layer.json``, ``end_to_end_speedup`` = scipy over blas_layer.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is a folder, not a package
from benchmarks._score_ab import (  # noqa: E402
    alternate, case_arguments, header, llama7b_layers, moe_experts, ratio, resnet56)

OUT = Path(__file__).resolve().parent / "results" / "blas_layer.json"
VARIANTS = {"blas_layer": "", "scipy": "scipy_blas"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    case_arguments(parser)
    parser.add_argument("--cases", default="resnet56,moe,llama7b")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    cases = args.cases.split(",")
    report = header() | {"args": {k: str(v) for k, v in vars(args).items()}, "cases": {}}

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")

    with tempfile.TemporaryDirectory(prefix="wbfe-blas-layer-") as tmp:
        plans = []
        if "resnet56" in cases:
            plans.append(("resnet56", resnet56(Path(tmp) / "resnet56"), VARIANTS))
        if "moe" in cases:
            plans.append(("moe_experts", moe_experts(Path(tmp) / "moe", args.moe_layers, args.experts), VARIANTS))
        if "llama7b" in cases:
            plans.append(("llama7b_layers", llama7b_layers(Path(tmp) / "llama", args.dense_layers),
                          VARIANTS | {"scipy_keep_two_stage": "scipy_blas,keep_two_stage"}))
        for name, info, variants in plans:
            print(f"{name}: {info['what']}", flush=True)
            case = {"checkpoint": info["what"]} | alternate(Path(info["path"]), "", variants, args.repeats)
            case.update(ratio(case, "scipy", "blas_layer"))
            if "scipy_keep_two_stage" in variants:
                case["two_stage_share"] = ratio(case, "scipy", "scipy_keep_two_stage")
                case["rest_of_blas_layer"] = ratio(case, "scipy_keep_two_stage", "blas_layer")
            report["cases"][name] = case
            print(json.dumps({k: case[k] for k in ("end_to_end_speedup", "same_numbers")}), flush=True)
            save()
    report["load_average_end"] = header()["load_average_start"]
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
