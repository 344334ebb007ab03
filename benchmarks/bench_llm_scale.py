"""LLM-scale scoring: a generated MoE checkpoint of many small expert matrices and a few 7B-shaped
dense layers; time per metric group, fraction of the float64 GEMM limit, peak RSS, extrapolated.

Run:  python benchmarks/bench_llm_scale.py [--moe-layers 27] [--experts 128] [--dense-layers 1]

- MoE: ``--moe-layers`` × ``--experts`` × 3 matrices (gate, up: 1024 × 256 as PyTorch stores
  them, out × in; down: 256 × 1024), bfloat16, each expert stored as its own 2-D tensor
  (``model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight``), as Mixtral/Qwen-MoE checkpoints do.
- Dense: ``--dense-layers`` layers of a 7B Llama: q, k, v, o 4096 × 4096 and gate, up 11008 × 4096,
  down 4096 × 11008, bfloat16.

Each (checkpoint, metric set) is scored in a fresh process (``wbfe.score(..., device="cpu")``,
default threads); ``htmp`` on the first MoE layer only (its shard scored as a file of its own) and
per matrix extrapolated. The GEMM limit is the time the unavoidable float64 work would take at
the measured GEMM rate (Gram products p²P as rank-k updates, 4/3·p³ for a tridiagonal reduction,
p³/3 for a Cholesky factor, 2/3·p³ for an LU factor). Extrapolations, per matrix shape, to a whole
7B (32 such layers) and a 30B-A3B MoE (48 layers × 128 experts × 3 matrices of 768 × 2048, plus
48 attention blocks of 4096 × 2048 ×2 and 512 × 2048 ×2) are printed and saved with the measured
figures in ``results/llm_scale.json``. The defaults write 5.4 GB of checkpoints (one shard per MoE
layer) into a temporary folder and take a few minutes on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks/ is a folder, not a package
from benchmarks.bench_vs_weightwatcher import cpu_model, gemm_gflops  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "llm_scale.json"
METRIC_SETS = {"bfe": ("bfe",), "bfe,htsr": ("bfe", "htsr"), "htmp": ("htmp",)}

_CHILD = r"""
import json, re, sys, time
import wbfe, wbfe.scoring, wbfe.metrics.htsr, wbfe.metrics.htmp
path, metrics, layers = sys.argv[1], tuple(sys.argv[2].split(",")), (sys.argv[3] or None)
start = time.perf_counter()
result = wbfe.score(path, metrics=metrics, layers=layers, device="cpu")
elapsed = time.perf_counter() - start
hwm = int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1))
print(json.dumps({"seconds": elapsed, "peak_rss_mb": hwm / 1024, "matrices": len(result.layers),
                  "skipped": len(result.skipped)}))
"""


def _score(path: Path, metrics: tuple[str, ...], layers: str = "") -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), ",".join(metrics), layers],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _flops(shapes: list[tuple[int, int]], eig: bool) -> float:
    total = 0.0
    for rows, cols in shapes:
        p, big = min(rows, cols), max(rows, cols)
        if eig:
            total += p * p * big + 4 / 3 * p**3
        elif rows == cols and p >= 256:
            total += 2 / 3 * p**3
        else:
            total += p * p * big + p**3 / 3
    return total


def _write(folder: Path, tensors: dict) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model.safetensors"
    save_file(tensors, str(path))
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--moe-layers", type=int, default=27)  # 27 x 128 x 3 = 10,368 matrices
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--dense-layers", type=int, default=1)
    args = parser.parse_args()
    import torch

    g = torch.Generator().manual_seed(0)
    rate = gemm_gflops(None) * 1e9
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
                    "gemm_gflops_f64_default_threads": round(rate / 1e9, 2), "load_average_start": os.getloadavg(),
                    "runs": {}}
    with tempfile.TemporaryDirectory(prefix="wbfe-llm-") as tmp:
        # One shard per layer (model-XXXXX-of-XXXXX.safetensors + index), as hub MoE checkpoints
        # are: 10,000 expert matrices are 5 GB in bfloat16, never all in memory here.
        from safetensors.torch import save_file

        moe_path = Path(tmp) / "moe"
        moe_path.mkdir()
        weight_map: dict[str, str] = {}
        moe_shapes: list[tuple[int, int]] = []
        for layer in range(args.moe_layers):
            shard: dict = {}
            for e in range(args.experts):
                p = f"model.layers.{layer}.mlp.experts.{e}."
                shard[p + "gate_proj.weight"] = (torch.randn(1024, 256, generator=g) * 0.02).to(torch.bfloat16)
                shard[p + "up_proj.weight"] = (torch.randn(1024, 256, generator=g) * 0.02).to(torch.bfloat16)
                shard[p + "down_proj.weight"] = (torch.randn(256, 1024, generator=g) * 0.02).to(torch.bfloat16)
            name = f"model-{layer + 1:05d}-of-{args.moe_layers:05d}.safetensors"
            save_file(shard, str(moe_path / name))
            weight_map.update(dict.fromkeys(shard, name))
            moe_shapes += [tuple(t.shape) for t in shard.values()]
            del shard
        (moe_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
        dense: dict = {}
        for layer in range(args.dense_layers):
            p = f"model.layers.{layer}."
            for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"):
                dense[p + name + ".weight"] = (torch.randn(4096, 4096, generator=g) * 0.02).to(torch.bfloat16)
            for name in ("mlp.gate_proj", "mlp.up_proj"):
                dense[p + name + ".weight"] = (torch.randn(11008, 4096, generator=g) * 0.02).to(torch.bfloat16)
            dense[p + "mlp.down_proj.weight"] = (torch.randn(4096, 11008, generator=g) * 0.02).to(torch.bfloat16)
        dense_path = _write(Path(tmp) / "dense", dense)
        dense_shapes = [tuple(t.shape) for t in dense.values()]
        del dense
        # htmp on one whole MoE layer, its shard scored as a file of its own: its experts are fitted
        # in batches as in a full run, and the fixed costs (start, hashing the files) are those of
        # one shard, not of all (selecting matrices by --layers would still hash every shard).
        first_shard = moe_path / f"model-00001-of-{args.moe_layers:05d}.safetensors"
        plans = [("moe", moe_path, moe_shapes, "bfe", ""), ("moe", moe_path, moe_shapes, "bfe,htsr", ""),
                 ("moe", first_shard, moe_shapes[: 3 * args.experts], "htmp", ""),
                 ("dense", dense_path, dense_shapes, "bfe", ""), ("dense", dense_path, dense_shapes, "bfe,htsr", "")]
        for kind, path, shapes, metric_set, regex in plans:
            run = _score(path, METRIC_SETS[metric_set], regex)
            eig = metric_set != "bfe"
            limit = _flops(shapes, eig) / rate
            run.update({"checkpoint": kind, "metrics": metric_set, "limit_seconds": round(limit, 3),
                        "fraction_of_gemm_limit": round(limit / run["seconds"], 3),
                        "seconds_per_matrix": run["seconds"] / max(1, run["matrices"])})
            report["runs"][f"{kind}:{metric_set}"] = run
            print(json.dumps(run), flush=True)
    runs = report["runs"]
    per = {k: v["seconds_per_matrix"] for k, v in runs.items()}
    dense_per_layer = {m: runs[f"dense:{m}"]["seconds"] / args.dense_layers for m in ("bfe", "bfe,htsr")}
    report["moe_matrices"] = len(moe_shapes)
    # 30B-A3B experts (768 x 2048) against the measured 256 x 1024 ones: scaled by the flop ratio
    # of their float64 work (p²P + 4/3 p³ or + p³/3), the honest first-order estimate.
    scale_eig = _flops([(768, 2048)], True) / _flops([(256, 1024)], True)
    scale_bfe = _flops([(768, 2048)], False) / _flops([(256, 1024)], False)
    n_experts_30b = 48 * 128 * 3
    report["extrapolated_seconds"] = {
        "llama7b_32_layers": {m: round(32 * s, 1) for m, s in dense_per_layer.items()},
        "moe_10368_experts_256x1024": {m: round(10368 * per[f"moe:{m}"], 1) for m in ("bfe", "bfe,htsr", "htmp")},
        "qwen30b_a3b_experts_only": {"bfe": round(n_experts_30b * per["moe:bfe"] * scale_bfe, 1),
                                     "bfe,htsr": round(n_experts_30b * per["moe:bfe,htsr"] * scale_eig, 1),
                                     "htmp_extra": round(n_experts_30b * per["moe:htmp"], 1)},
    }
    report["load_average_end"] = os.getloadavg()
    print(json.dumps(report["extrapolated_seconds"], indent=2))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
