"""A generated zoo of small safetensors models for the Ray tests and benchmarks/bench_ray.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def make_zoo(folder: Path, n: int, *, width: int = 48, unusable: bool = False) -> Path:
    """``n`` three-layer models (noise of growing scale plus a rank-one spike), a zoo.csv listing
    them, and with ``unusable`` a last model that wbfe refuses when scoring it (no weight matrix)."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(1234)
    rows = ["model,checkpoint,accuracy"]
    for k in range(n):
        def layer(rows_: int, cols: int) -> torch.Tensor:
            noise = torch.randn(rows_, cols, generator=gen) * (1.0 + 0.15 * k) / cols**0.5
            u, v = torch.randn(rows_, 1, generator=gen), torch.randn(1, cols, generator=gen)
            return (noise + (0.2 + 0.1 * k) * u @ v / (rows_ * cols) ** 0.5).contiguous()

        tensors = {"l1.weight": layer(width, width), "l1.bias": torch.zeros(width),
                   "l2.weight": layer(width // 2, width), "head.weight": layer(10, width // 2)}
        save_file(tensors, str(folder / f"m{k}.safetensors"))
        rows.append(f"m{k},m{k}.safetensors,{0.5 + 0.37 * ((k * 7) % n) / n:.4f}")
    if unusable:
        save_file({"bias": torch.ones(4)}, str(folder / "broken.safetensors"))
        rows.append("broken,broken.safetensors,0.7")
    spec = folder / "zoo.csv"
    spec.write_text("\n".join(rows) + "\n")
    return spec


def without_run_details(result: dict[str, Any]) -> dict[str, Any]:
    """A ranking's JSON less what may differ between equal runs: where it ran and what was cached."""
    out = dict(result)
    out["options"] = {k: v for k, v in out["options"].items() if k != "executor"}
    out["models"] = [{k: v for k, v in m.items() if k != "cached"} for m in out["models"]]
    for key in ("n_scored", "n_cached"):
        out.pop(key)
    return out


def make_sharded(folder: Path, n_shards: int = 3, *, width: int = 40) -> Path:
    """A safetensors checkpoint in ``n_shards`` shards with an index, in the Hugging Face layout,
    with what a merge must get right: a tensor in shard 0 repeated in two later shards (ties across
    shards, named after the first copy), biases (skipped), an all-zero matrix (degenerate) and the
    LM head in the last shard."""
    import json

    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(99)
    shared = torch.randn(width, width, generator=gen) / width**0.5
    weight_map: dict[str, str] = {}
    for s in range(n_shards):
        tensors: dict[str, torch.Tensor] = {}
        for layer in range(2):
            prefix = f"model.layers.{2 * s + layer}"
            tensors[f"{prefix}.mlp.up_proj.weight"] = torch.randn(2 * width, width, generator=gen) * (1 + s) / width**0.5
            tensors[f"{prefix}.mlp.down_proj.weight"] = torch.randn(width, 2 * width, generator=gen) / width**0.5
            tensors[f"{prefix}.mlp.down_proj.bias"] = torch.randn(width, generator=gen)
        tensors[f"model.layers.{2 * s}.self_attn.q_proj.weight"] = shared.clone()
        if s == 1:
            tensors["model.layers.2.self_attn.o_proj.weight"] = torch.zeros(width, width)
        if s == n_shards - 1:
            tensors["lm_head.weight"] = torch.randn(64, width, generator=gen) / width**0.5
        name = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        save_file(tensors, str(folder / name), metadata={"format": "pt"})
        weight_map.update({t: name for t in tensors})
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "tie_word_embeddings": False}))
    return folder
