"""What asking the checkpoint's framework costs (wbfe.framework).

1. A 70B Llama ``config.json`` (Llama-3-70B's sizes: 80 layers, width 8,192, MLP 28,672, 64 heads,
   8 KV heads, vocabulary 128,256) described by transformers: the model class built on the meta
   device and read (order, head, ties, layouts). Timed in a fresh process: importing transformers,
   the first description (which imports the model's module too), then descriptions of configs not
   seen before (the build alone; the cache is keyed by the config), then a cached one. The build
   must stay under 1 s.
2. Scoring a plain safetensors file with no config.json beside it must not import transformers
   (nor timm): checked in a fresh process.

    python benchmarks/bench_framework.py [--repeats 5]

Results: benchmarks/results/framework.json (and printed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "framework.json"

LLAMA_70B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
             "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
             "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
             "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}

_SKELETON = """
import json, statistics, sys, time
t = time.perf_counter()
import transformers
imported = time.perf_counter() - t
from wbfe.framework.transformers_model import describe_transformers
config, repeats = json.loads(sys.argv[1]), int(sys.argv[2])
t = time.perf_counter(); first = describe_transformers(config); first_s = time.perf_counter() - t
builds = []
for i in range(repeats):  # a config not seen before each time: the build, not the cache
    fresh = dict(config, rope_theta=config["rope_theta"] + i + 1)
    t = time.perf_counter(); d = describe_transformers(fresh); builds.append(time.perf_counter() - t)
t = time.perf_counter(); describe_transformers(config); cached = time.perf_counter() - t
print(json.dumps({"transformers": transformers.__version__, "import_transformers_s": imported,
                  "first_describe_s": first_s, "build_s": builds, "cached_s": cached,
                  "parameters": len(first.order), "head": first.head, "tied": dict(first.tied)}))
"""

_PLAIN = """
import sys, time, wbfe
t = time.perf_counter()
r = wbfe.score(sys.argv[1], metrics="bfe")
print(r.summary["head"], r.summary["head_source"], "transformers" in sys.modules, "timm" in sys.modules,
      time.perf_counter() - t)
"""


def skeleton(repeats: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _SKELETON, json.dumps(LLAMA_70B), str(repeats)], capture_output=True,
                         text=True, check=True, cwd=ROOT, timeout=600)
    found = json.loads(out.stdout.strip().splitlines()[-1])
    found["build_median_s"] = statistics.median(found["build_s"])
    return found


def plain_file() -> dict:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "plain.safetensors"
        save_file({"fc1.weight": torch.randn(256, 784, generator=g), "fc2.weight": torch.randn(10, 256, generator=g)},
                  str(path))
        out = subprocess.run([sys.executable, "-c", _PLAIN, str(path)], capture_output=True, text=True, check=True,
                             cwd=ROOT, timeout=300).stdout.split()
    return {"head": out[0], "head_source": out[1], "imports_transformers": out[2] == "True",
            "imports_timm": out[3] == "True", "score_s": float(out[4])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    result = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
        "llama_70b_meta_skeleton": skeleton(args.repeats),
        "plain_safetensors_without_config": plain_file(),
    }
    build = result["llama_70b_meta_skeleton"]["build_median_s"]
    plain = result["plain_safetensors_without_config"]
    result["checks"] = {"build_under_1s": build < 1.0,
                        "plain_file_imports_no_framework": not plain["imports_transformers"] and not plain["imports_timm"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    if not all(result["checks"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
