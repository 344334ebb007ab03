"""A generated zoo of small safetensors models for the Ray tests and benchmarks/bench_ray.py."""

from __future__ import annotations

from pathlib import Path


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


def without_run_details(result: dict) -> dict:  # type: ignore[type-arg]
    """A ranking's JSON less what may differ between equal runs: where it ran and what was cached."""
    out = dict(result)
    out["options"] = {k: v for k, v in out["options"].items() if k != "executor"}
    out["models"] = [{k: v for k, v in m.items() if k != "cached"} for m in out["models"]]
    for key in ("n_scored", "n_cached"):
        out.pop(key)
    return out
