"""Time and peak RSS of scoring a rank-64 LoRA adapter on a 4096-wide model (`wbfe score ADAPTER`).

Writes a PEFT adapter folder (adapter_config.json + adapter_model.safetensors) for 32 layers × q, k,
v, o projections of 4096 × 4096, r = 64, α = 128, float32 factors (128 modules, 268 MB) into a
temporary folder (not kept), and runs, in fresh processes under ``/usr/bin/time -v``:
``wbfe score ADAPTER --metrics bfe`` (each ΔW from its 64 × 64 core), a bare ``import wbfe, torch``
(the interpreter's own RSS), and, as the peer measured in the same run, the dense route for a few
modules: ΔW = s·B·A formed as a 4096 × 4096 float64 matrix and its eigenvalues taken the way
``wbfe score`` takes a dense matrix's (what a tool that multiplies the factors out must do),
extrapolated to all modules.

    python benchmarks/bench_adapter.py [--layers 32 --width 4096 --rank 64 --dense-modules 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks/ is a folder, not a package
from benchmarks.bench_compare import BIN, timed  # noqa: E402 - one /usr/bin/time parser for both benchmarks

RESULTS = Path(__file__).parent / "results" / "adapter.json"
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def write_adapter(folder: Path, layers: int, width: int, rank: int) -> None:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    tensors = {}
    for i in range(layers):
        for proj in PROJECTIONS:
            key = f"base_model.model.model.layers.{i}.self_attn.{proj}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, width, generator=g) / width ** 0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(width, rank, generator=g) * 1e-3
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": list(PROJECTIONS),
        "base_model_name_or_path": f"synthetic-{width}x{layers}"}))


_DENSE = """
import sys, time, torch
from safetensors import safe_open
from wbfe.linalg.spectra import eigenvalues, resolve_device
folder, n, rank = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
scale = 2.0
with safe_open(folder + "/adapter_model.safetensors", "pt") as f:
    keys = sorted(k for k in f.keys() if k.endswith("lora_A.weight"))[:n]
    start = time.perf_counter()
    for key in keys:
        a = f.get_tensor(key).double()
        b = f.get_tensor(key.replace("lora_A", "lora_B")).double()
        eigenvalues([scale * b @ a], resolve_device("cpu"))
    print("SECONDS", (time.perf_counter() - start) / n)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--rank", type=int, default=64)
    parser.add_argument("--dense-modules", type=int, default=2)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="wbfe-adapter-"))
    try:
        subprocess.run([sys.executable, __file__, "--write", str(folder), str(args.layers), str(args.width),
                        str(args.rank)], check=True)
        modules = len(PROJECTIONS) * args.layers
        baseline = timed([sys.executable, "-c", "import torch, wbfe, numpy, scipy.linalg"])
        adapter = timed([str(BIN / "wbfe"), "score", str(folder), "--metrics", "bfe", "--device", "cpu",
                         "--format", "json", "--output", str(folder / "score.json")])
        rows = json.loads((folder / "score.json").read_text())["layers"]
        dense = subprocess.run([sys.executable, "-c", _DENSE, str(folder), str(args.dense_modules), str(args.rank)],
                               check=True, capture_output=True, text=True)
        per_module = float(dense.stdout.split("SECONDS")[-1])
        result = {
            "date": time.strftime("%Y-%m-%d"),
            "command": "wbfe score ADAPTER --metrics bfe --device cpu --format json --output FILE",
            "modules": modules,
            "shape": [args.width, args.width],
            "rank": args.rank,
            "adapter_bytes": (folder / "adapter_model.safetensors").stat().st_size,
            "baseline": baseline,
            "adapter": adapter,
            "n_rows": len(rows),
            "dense_seconds_per_module": round(per_module, 3),
            "dense_modules_timed": args.dense_modules,
            "dense_seconds_all_modules_extrapolated": round(per_module * modules, 1),
            "dense_over_core_wall": round(per_module * modules / max(adapter["wall_s"] - baseline["wall_s"], 1e-3), 1),
            "cpu_count": os.cpu_count(),
        }
        print(json.dumps(result, indent=2))
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--write":
        write_adapter(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
