"""GB of weights per second scored on a GPU (or the CPU, for comparison) on a generated checkpoint.

Generates a transformer-shaped sharded safetensors checkpoint (bfloat16 by default, as LLMs ship)
of about ``--params`` parameters, scores it with ``--metrics`` on ``--device``, checks BFE-W against
the CPU on a few layers (relative difference reported), and saves the figures with the date and device.

    python benchmarks/bench_gpu.py --params 1.2e9 --device cuda
    python benchmarks/bench_gpu.py --params 5e7 --device cpu        # a quick CPU run of the same path

Results: benchmarks/results/gpu_<device>.json
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def write_checkpoint(folder: Path, params: float, dtype: str, hidden: int) -> int:
    """Sharded checkpoint of ``params`` parameters: layers of (qkv, o, up, down) plus an LM head."""
    import torch
    from safetensors.torch import save_file

    torch_dtype = getattr(torch, dtype)
    g = torch.Generator().manual_seed(0)
    per_layer = 3 * hidden * hidden + hidden * hidden + 2 * 4 * hidden * hidden
    vocab = 32000
    n_layers = max(1, round((params - vocab * hidden) / per_layer))
    weight_map: dict[str, str] = {}
    total = 0
    for i in range(n_layers):
        shard = f"model-{i + 1:05d}-of-{n_layers + 1:05d}.safetensors"
        p = f"model.layers.{i}."
        tensors = {
            p + "self_attn.qkv_proj.weight": torch.randn(3 * hidden, hidden, generator=g),
            p + "self_attn.o_proj.weight": torch.randn(hidden, hidden, generator=g),
            p + "mlp.up_proj.weight": torch.randn(4 * hidden, hidden, generator=g),
            p + "mlp.down_proj.weight": torch.randn(hidden, 4 * hidden, generator=g),
        }
        tensors = {k: (v / math.sqrt(v.shape[1])).to(torch_dtype) for k, v in tensors.items()}
        save_file(tensors, str(folder / shard))
        weight_map.update({k: shard for k in tensors})
        total += sum(t.numel() for t in tensors.values())
    shard = f"model-{n_layers + 1:05d}-of-{n_layers + 1:05d}.safetensors"
    save_file({"lm_head.weight": (torch.randn(vocab, hidden, generator=g) / hidden**0.5).to(torch_dtype)},
              str(folder / shard))
    weight_map["lm_head.weight"] = shard
    total += vocab * hidden
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=1.2e9)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--metrics", default="bfe")
    args = parser.parse_args()

    import torch

    import wbfe

    folder = Path(tempfile.mkdtemp(prefix="wbfe-gpu-"))
    try:
        n_params = write_checkpoint(folder, args.params, args.dtype, args.hidden)
        nbytes = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        result = wbfe.score(folder, metrics=args.metrics, device=args.device)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        check = [layer["name"] for layer in result.layers[:3]] + ["lm_head.weight"]
        pattern = "^(" + "|".join(n.replace(".", r"\.") for n in check) + ")$"
        cpu = {x["name"]: x["bfe"] for x in wbfe.score(folder, metrics="bfe", device="cpu", layers=pattern).layers}
        max_rel = max(abs(x["bfe"] - cpu[x["name"]]) / abs(cpu[x["name"]]) for x in result.layers if x["name"] in cpu)
        device_name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
        report = {
            "date": time.strftime("%Y-%m-%d"),
            "device": device_name,
            "torch": torch.__version__,
            "params": n_params,
            "dtype": args.dtype,
            "checkpoint_gb": round(nbytes / 1e9, 3),
            "metrics": args.metrics,
            "seconds": round(seconds, 2),
            "gb_per_second": round(nbytes / 1e9 / seconds, 3),
            "layers": len(result.layers),
            "max_rel_diff_bfe_vs_cpu": max_rel,
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(json.dumps(report, indent=2))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"gpu_{args.device.split(':')[0]}.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
