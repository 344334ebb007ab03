"""Time of ``wbfe describe`` on the headers of a Llama-3-70B-shaped checkpoint.

The checkpoint is generated in the real layout (30 safetensors shards of bfloat16 tensors with a
``model.safetensors.index.json`` and a config.json), each shard a sparse file: its header is real
and its size is the real one (140 GB in all), while its data pages are holes that take no disk.
``describe`` reads the headers only, so it cannot tell. Each run is a fresh process; the time is
the ``describe`` call (``import wbfe`` included), and the whole process's, median of the runs.

Three cases: beside the config.json (the config rules decide, transformers' modeling_llama.py is
read as text, nothing is imported: ``with_config``), without it (``without_config``), and, for
comparison, what a score pays for the same config: transformers' own description, the model
built on the meta device, which imports torch and transformers (``framework_description``).

    python benchmarks/bench_describe.py [--runs 5] [--layers 80]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "describe.json"

HIDDEN, INTERMEDIATE, KV, VOCAB = 8192, 28672, 1024, 128256


def llama70b_tensors(layers: int) -> list[tuple[str, list[int]]]:
    """Name and shape of every tensor of Llama-3-70B, in the order transformers saves them."""
    out: list[tuple[str, list[int]]] = [("model.embed_tokens.weight", [VOCAB, HIDDEN])]
    for k in range(layers):
        p = f"model.layers.{k}"
        out += [(f"{p}.self_attn.q_proj.weight", [HIDDEN, HIDDEN]), (f"{p}.self_attn.k_proj.weight", [KV, HIDDEN]),
                (f"{p}.self_attn.v_proj.weight", [KV, HIDDEN]), (f"{p}.self_attn.o_proj.weight", [HIDDEN, HIDDEN]),
                (f"{p}.mlp.gate_proj.weight", [INTERMEDIATE, HIDDEN]), (f"{p}.mlp.up_proj.weight", [INTERMEDIATE, HIDDEN]),
                (f"{p}.mlp.down_proj.weight", [HIDDEN, INTERMEDIATE]), (f"{p}.input_layernorm.weight", [HIDDEN]),
                (f"{p}.post_attention_layernorm.weight", [HIDDEN])]
    return out + [("model.norm.weight", [HIDDEN]), ("lm_head.weight", [VOCAB, HIDDEN])]


def write_sparse_checkpoint(folder: Path, layers: int, shards: int = 30) -> int:
    """The shards (real headers, sparse data), the index and the config; returns the bytes of data."""
    tensors = llama70b_tensors(layers)
    per_shard = -(-len(tensors) // shards)
    weight_map: dict[str, str] = {}
    total = 0
    for s in range(shards):
        part = tensors[s * per_shard:(s + 1) * per_shard]
        if not part:
            break
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        header: dict[str, object] = {}
        offset = 0
        for tensor, shape in part:
            size = 2
            for d in shape:
                size *= d
            header[tensor] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
            weight_map[tensor] = name
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with open(folder / name, "wb") as fh:
            fh.write(struct.pack("<Q", len(raw)) + raw)
            fh.truncate(8 + len(raw) + offset)  # a hole: no data pages written
        total += offset
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                     "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE, "num_hidden_layers": layers, "num_attention_heads": 64,
        "num_key_value_heads": 8, "vocab_size": VOCAB, "tie_word_embeddings": False}))
    return total


_CODE = """
import sys, time, json
start, cpu = time.perf_counter(), time.process_time()
import wbfe
d = wbfe.describe(sys.argv[1])
print(json.dumps({"describe_s": time.perf_counter() - start, "describe_cpu_s": time.process_time() - cpu, "matrices": len(d.matrices), "head": d.head,
                  "framework": d.model.get("framework", {}).get("used"),
                  "transformers_imported": "transformers" in sys.modules}))
"""

_FRAMEWORK_CODE = """
import sys, time, json
start, cpu = time.perf_counter(), time.process_time()
from wbfe.framework import describe_config
d = describe_config(json.load(open(sys.argv[1] + "/config.json")))
print(json.dumps({"describe_s": time.perf_counter() - start, "describe_cpu_s": time.process_time() - cpu, "matrices": len(d.order), "head": d.head,
                  "framework": d.framework, "transformers_imported": "transformers" in sys.modules}))
"""


def _runs(folder: Path, runs: int, code: str = _CODE) -> dict[str, object]:
    """Median and max of ``describe`` (import included) over fresh processes, and the process time."""
    calls, wall = [], []
    for _ in range(runs):
        start = time.perf_counter()
        run = subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, text=True, check=True)
        wall.append(time.perf_counter() - start)
        calls.append(json.loads(run.stdout.strip().splitlines()[-1]))
    return {"matrices": calls[0]["matrices"], "head": calls[0]["head"], "framework": calls[0]["framework"],
            "transformers_imported": calls[0]["transformers_imported"],
            "describe_s_median": statistics.median(c["describe_s"] for c in calls),
            "describe_s_max": max(c["describe_s"] for c in calls), "process_s_median": statistics.median(wall),
            # CPU time of the same span: what the call costs, less the waiting for a core of a shared machine
            "describe_cpu_s_median": statistics.median(c["describe_cpu_s"] for c in calls)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--layers", type=int, default=80)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        nbytes = write_sparse_checkpoint(folder, args.layers)
        # With config.json the config rules decide (transformers' source read as text, not imported);
        # a score builds transformers' meta skeleton instead (framework); without it, the name rules.
        with_config = _runs(folder, args.runs)
        framework = _runs(folder, args.runs, _FRAMEWORK_CODE)
        (folder / "config.json").unlink()
        headers_only = _runs(folder, args.runs)
    result = {
        "checkpoint": f"Llama-3-70B shapes, {args.layers} layers, 30 sparse bfloat16 shards",
        "bytes": nbytes,
        "matrices": with_config["matrices"],
        "head": with_config["head"],
        "with_config": with_config,
        "without_config": headers_only,
        "framework_description": framework,
        "runs": args.runs,
        "load_average": os.getloadavg(),  # over the last 1, 5 and 15 minutes, at the end
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
