"""Small expert matrices eigen-solved in batches (wbfe.linalg.spectra.spectra_batch) against one at a time.

Run:  python benchmarks/bench_expert_batches.py [--layers 8] [--experts 128] [--hidden 64] [--inter 128] [--repeats 3]

A generated fused-MoE checkpoint (Qwen3-MoE layout: per layer ``experts.gate_up_proj [E, 2I, H]``
and ``experts.down_proj [E, H, I]`` in bfloat16, split into 3·E matrices of I×H and H×I) is scored
by ``wbfe.score`` in fresh processes, batched (the default) and with batching turned off
(``scoring.batchable`` patched to False), alternately, for ``--metrics bfe,htsr`` and ``bfe`` (a
control: BFE-W alone takes no eigen-solve and is not batched, so its ratio shows the noise).
Results: ``benchmarks/results/expert_batches.json`` (median seconds and the ratio per metric set).
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

OUT = Path(__file__).resolve().parent / "results" / "expert_batches.json"

_CHILD = r"""
import json, sys, time
import wbfe, wbfe.scoring, wbfe.metrics.htsr
if sys.argv[3] == "off":
    wbfe.scoring.batchable = lambda *a: False
start = time.perf_counter()
result = wbfe.score(sys.argv[1], metrics=tuple(sys.argv[2].split(",")), device="cpu")
print(json.dumps({"seconds": time.perf_counter() - start, "matrices": len(result.layers),
                  "bfe": [row["bfe"] for row in result.layers]}))
"""


def _score(path: Path, metrics: str, batching: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(path), metrics, batching],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--inter", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    report: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu_count": os.cpu_count(),
                    "load_average_start": os.getloadavg(), "args": vars(args), "runs": {}}
    with tempfile.TemporaryDirectory(prefix="wbfe-experts-") as tmp:
        H, I, E = args.hidden, args.inter, args.experts
        tensors = {}
        for layer in range(args.layers):
            p = f"model.layers.{layer}.mlp.experts."
            tensors[p + "gate_up_proj"] = (torch.randn(E, 2 * I, H, generator=g) * 0.02).to(torch.bfloat16)
            tensors[p + "down_proj"] = (torch.randn(E, H, I, generator=g) * 0.02).to(torch.bfloat16)
        save_file(tensors, str(Path(tmp) / "model.safetensors"))
        (Path(tmp) / "config.json").write_text(json.dumps(
            {"model_type": "qwen3_moe", "hidden_size": H, "num_experts": E, "moe_intermediate_size": I}))
        for metrics in ("bfe", "bfe,htsr"):
            times: dict[str, list[float]] = {"on": [], "off": []}
            values = {}
            for _ in range(args.repeats):
                for batching in ("off", "on"):
                    run = _score(Path(tmp), metrics, batching)
                    times[batching].append(run["seconds"])
                    values[batching] = run["bfe"]
            diff = max(abs(a - b) for a, b in zip(values["on"], values["off"]))
            entry = {"matrices": len(values["on"]), "seconds_batched": [round(t, 3) for t in times["on"]],
                     "seconds_one_at_a_time": [round(t, 3) for t in times["off"]],
                     "median_ratio": round(statistics.median(times["off"]) / statistics.median(times["on"]), 2),
                     "max_abs_bfe_difference": diff}
            report["runs"][metrics] = entry
            print(metrics, json.dumps(entry), flush=True)
    report["load_average_end"] = os.getloadavg()
    OUT.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
