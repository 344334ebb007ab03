"""Write a random Qwen3-MoE-style checkpoint with fused experts (bf16) for timing `wbfe score`.

    python benchmarks/fused_moe_checkpoint.py /tmp/moe-1b --layers 18   # ~1.04 B parameters, 2.1 GB
    /usr/bin/time -v wbfe score /tmp/moe-1b --metrics bfe --format json --output /tmp/moe-1b.json

Layout as transformers 5 holds Qwen3-MoE in memory and other loaders read it: per layer
`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I], a router `mlp.gate` [E, H],
attention q/k/v/o and norms; embeddings and an untied `lm_head`. Written one layer at a time.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=18)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--intermediate", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    h, e, i = args.hidden, args.experts, args.intermediate
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) / math.sqrt(shape[-1])).bfloat16()

    args.out.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    params = 0
    shards = [{"model.embed_tokens.weight": rand(args.vocab, h), "lm_head.weight": rand(args.vocab, h),
               "model.norm.weight": torch.ones(h).bfloat16()}]
    for layer in range(args.layers):
        p = f"model.layers.{layer}"
        shards.append({f"{p}.self_attn.{n}.weight": rand(h, h) for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
                      | {f"{p}.mlp.gate.weight": rand(e, h), f"{p}.mlp.experts.gate_up_proj": rand(e, 2 * i, h),
                         f"{p}.mlp.experts.down_proj": rand(e, h, i), f"{p}.input_layernorm.weight": torch.ones(h).bfloat16()})
    for n, shard in enumerate(shards):
        name = f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(args.out / name))
        weight_map.update({k: name for k in shard})
        params += sum(t.numel() for t in shard.values())
    (args.out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": h,
              "num_experts": e, "moe_intermediate_size": i, "num_hidden_layers": args.layers,
              "vocab_size": args.vocab, "tie_word_embeddings": False}
    (args.out / "config.json").write_text(json.dumps(config))
    print(f"{args.out}: {params / 1e9:.3f} B parameters in {len(shards)} shards")


if __name__ == "__main__":
    main()
