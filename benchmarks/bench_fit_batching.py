"""Batched HT-SR/MP fits and batched eigen-solves against one at a time, end to end.

Run:  python benchmarks/bench_fit_batching.py [--repeats 3] [--moe-layers 27] [--dense-layers 2] [--per-fit]
      [--with-blas-layer]

The default ``wbfe.score`` (metrics bfe,htsr) of three generated checkpoints (benchmarks/_score_ab.py:
a CIFAR ResNet-56, 10,368 MoE experts of 256 × 1024, LLaMA-7B-shaped layers), each in fresh
processes, the variants alternating, median of ``--repeats``:

- ``batched``: as shipped (rows held back and fitted together: ``compute_many``, the ``*_many``
  fits; equal-shaped small matrices eigen-solved by ``spectra_batch``);
- ``single_fits``: every power-law, truncated power-law and MP fit one at a time and no rows held
  back (``compute_many`` off, the ``*_many`` names in wbfe.metrics.htsr bound to loops of the
  single fits);
- ``single_spectra`` (ResNet-56, the only case with matrices small enough for ``spectra_batch``):
  every eigen-solve per matrix; ``single_all``: both.

``htmp`` (not a default group) is measured the same way on the ResNet-56 and on one MoE layer's
shard (384 experts), and so is ``fit="tpl"`` (``--cases fit_tpl``: the truncated power law whose xmin
scan in wbfe.metrics.fingers fits every candidate as one batch) against ``single_tpl``. Results: ``benchmarks/results/fit_batching.json``: per case the medians, each
round's times and ratios, the load average, which batched paths ran, and ``end_to_end_speedup``
(one at a time over batched).

``benchmarks/results/fit_batching.json`` was measured on the tree before the deletions it decided
(commit f8ddf4d): since then only the MP fits and ``htmp``'s are batched, so ``single_pl``,
``single_tpl`` and ``single_spectra`` no longer change anything.

``--with-blas-layer`` adds bench_blas_layer.py's variants (``scipy``, and ``scipy_keep_two_stage``
on the 7B case) to the same rounds of the three default cases and writes
``benchmarks/results/blas_layer.json`` too: one alternating run for both questions, ``batched``
being the shipped code in both. The checkpoints are kept in ``--work-dir`` for a rerun.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is a folder, not a package
from benchmarks._score_ab import (  # noqa: E402
    alternate, case_arguments, header, llama7b_layers, moe_experts, ratio, resnet56)

OUT = Path(__file__).resolve().parent / "results" / "fit_batching.json"
BLAS_OUT = Path(__file__).resolve().parent / "results" / "blas_layer.json"
FITS = {"batched": "", "single_fits": "single_fits"}
BLAS = {"scipy": "scipy_blas"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    case_arguments(parser)
    parser.add_argument("--dense-matrices", default="q,k,v,o,gate,up,down",
                        help="which of each LLaMA layer's matrices (q,k,v,o,gate,up,down)")
    parser.add_argument("--two-stage-share", action="store_true",
                        help="the 7B case also with scipy but LAPACK's two-stage solver kept")
    parser.add_argument("--dense-without-fits", action="store_true",
                        help="the 7B case with the BLAS-layer variants only (no single_fits run)")
    parser.add_argument("--cases", default="resnet56,llama7b,moe,htmp")
    parser.add_argument("--with-blas-layer", action="store_true")
    parser.add_argument("--per-fit", action="store_true",
                        help="on the ResNet-56 and MoE cases also each fit one at a time alone (single_pl, "
                             "single_tpl, single_mp), the others batched")
    parser.add_argument("--merge", action="store_true", help="keep the cases already in --out (and --blas-out)")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/wbfe-ab-cases"))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--blas-out", type=Path, default=BLAS_OUT)
    args = parser.parse_args()
    cases = args.cases.split(",")
    report = header() | {"args": {k: str(v) for k, v in vars(args).items()}, "cases": {}}
    blas_report = header() | {"args": report["args"], "note": "the same rounds as fit_batching.json (one run, "
                              "the variants alternating); blas_layer = the shipped code", "cases": {}}
    if args.merge:  # the cases of an earlier run stay, unless measured again now
        for rep, path in ((report, args.out), (blas_report, args.blas_out)):
            if path.exists():
                old = json.loads(path.read_text())
                rep["earlier_runs"] = old.pop("earlier_runs", []) + [{k: v for k, v in old.items() if k != "cases"}]
                rep["cases"] = old["cases"]
    blas = BLAS if args.with_blas_layer else {}
    per_fit = {f"single_{fit}": f"single_{fit}" for fit in ("pl", "tpl", "mp")} if args.per_fit else {}

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        if blas or args.merge and blas_report["cases"]:
            args.blas_out.write_text(json.dumps(blas_report, indent=2) + "\n")

    work = args.work_dir
    plans = []
    for name in cases:
        if name == "resnet56":
            plans.append(("resnet56", resnet56(work / "resnet56"), "",
                          FITS | {"single_spectra": "single_spectra", "single_all": "single_fits,single_spectra"} | per_fit
                          | blas))
        elif name == "llama7b":
            two_stage = {"scipy_keep_two_stage": "scipy_blas,keep_two_stage"} if blas and args.two_stage_share else {}
            chosen = tuple(args.dense_matrices.split(","))
            plans.append(("llama7b_layers", llama7b_layers(work / f"llama-{args.dense_layers}-{'-'.join(chosen)}",
                                                           args.dense_layers, chosen), "",
                          ({"batched": ""} if args.dense_without_fits else FITS) | blas | two_stage))
        elif name == "moe":
            plans.append(("moe_experts", moe_experts(work / f"moe-{args.moe_layers}x{args.experts}", args.moe_layers,
                                                     args.experts), "", FITS | per_fit | blas))
        elif name == "fit_tpl":  # the non-default --fit tpl: wbfe.metrics.fingers scans xmin with batched fits
            plans.append(("resnet56_fit_tpl", resnet56(work / "resnet56"), "", {"batched": "", "single_tpl": "single_tpl"}))
            info = moe_experts(work / f"moe-1x{args.experts}", 1, args.experts)
            plans.append(("moe_layer_fit_tpl", dict(info, what=f"one MoE layer's shard ({3 * args.experts} matrices "
                                                              "of 256x1024)"), "", {"batched": "", "single_tpl": "single_tpl"}))
        elif name == "htmp":
            plans.append(("resnet56_htmp", resnet56(work / "resnet56"), "htmp", FITS))
            info = moe_experts(work / f"moe-1x{args.experts}", 1, args.experts)
            plans.append(("moe_layer_htmp", dict(info, what=f"one MoE layer's shard ({3 * args.experts} matrices "
                                                           "of 256x1024)"), "htmp", FITS))
    for name, info, metrics, variants in plans:
        print(f"{name}: {info['what']}", flush=True)
        options = {"fit": "tpl"} if name.endswith("_fit_tpl") else None
        case = {"checkpoint": info["what"]} | alternate(Path(info["path"]), metrics, variants, args.repeats,
                                                        options=options)
        if len(variants.keys() & {"single_fits", "single_tpl"}):
            case["fits"] = ratio(case, "single_tpl" if options else "single_fits", "batched")
            case["end_to_end_speedup"] = case["fits"]["end_to_end_speedup"]
            report["cases"][name] = case
        if "single_spectra" in variants:
            case["spectra_batch"] = ratio(case, "single_spectra", "batched")
            case["all_batching"] = ratio(case, "single_all", "batched")
        for fit in ("pl", "tpl", "mp"):
            if f"single_{fit}" in variants:
                case[f"{fit}_alone"] = ratio(case, f"single_{fit}", "batched")
        print(json.dumps({k: case.get(k) for k in ("end_to_end_speedup", "same_numbers")}), flush=True)
        if "scipy" in variants:
            blas_case = {k: v for k, v in case.items() if k not in ("fits", "end_to_end_speedup", "spectra_batch",
                                                                    "all_batching", "pl_alone", "tpl_alone", "mp_alone")}
            blas_case["variants"] = {("blas_layer" if k == "batched" else k): v for k, v in case["variants"].items()
                                     if k == "batched" or k.startswith("scipy")}
            blas_case["same_numbers"] = len({d for v in blas_case["variants"].values() for d in v["digests"]}) == 1
            blas_case.update(ratio(blas_case, "scipy", "blas_layer"))
            if "scipy_keep_two_stage" in variants:
                blas_case["two_stage_share"] = ratio(blas_case, "scipy", "scipy_keep_two_stage")
                blas_case["rest_of_blas_layer"] = ratio(blas_case, "scipy_keep_two_stage", "blas_layer")
            blas_report["cases"][name] = blas_case
            print("blas layer", json.dumps({k: blas_case[k] for k in ("end_to_end_speedup", "same_numbers")}), flush=True)
        save()
    report["load_average_end"] = blas_report["load_average_end"] = header()["load_average_start"]
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
