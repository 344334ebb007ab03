"""Time and peak RSS of `wbfe compare` on two generated ~1 GB safetensors checkpoints.

Writes checkpoint A (float32, transformer-shaped: per block q, k, v, o of d×d and up/down of d×4d,
default d = 1024 and 21 blocks = 1.06 GB) and B = A + a small dense change + a rank-8 change per
matrix, into a temporary folder (not kept), then runs, each in a fresh process under
``/usr/bin/time -v``: ``wbfe compare A B --metrics bfe`` and, as the peer measured in the same run,
``wbfe score A --metrics bfe`` and ``wbfe score B --metrics bfe`` (what scoring the two alone costs),
and a bare ``import wbfe, torch`` (the interpreter's own RSS).

    python benchmarks/bench_compare.py [--blocks 21 --width 1024] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "compare.json"
BIN = Path(sys.executable).parent


def write_pair(folder: Path, blocks: int, width: int) -> None:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    shapes = {"q_proj": (width, width), "k_proj": (width, width), "v_proj": (width, width),
              "o_proj": (width, width), "up_proj": (4 * width, width), "down_proj": (width, 4 * width)}
    a, b = {}, {}
    for i in range(blocks):
        for name, shape in shapes.items():
            key = f"model.layers.{i}.{'self_attn' if name.endswith(('q_proj', 'k_proj', 'v_proj', 'o_proj')) else 'mlp'}.{name}.weight"
            w = torch.randn(shape, generator=g) / shape[1] ** 0.5
            low = torch.randn(shape[0], 8, generator=g) @ torch.randn(8, shape[1], generator=g)
            a[key] = w
            b[key] = w + 1e-3 * torch.randn(shape, generator=g) / shape[1] ** 0.5 + (i + 1) * 1e-4 * low / shape[1] ** 0.5
    save_file(a, str(folder / "a.safetensors"))
    save_file(b, str(folder / "b.safetensors"))


def timed(argv: list[str]) -> dict[str, float]:
    """Wall seconds and peak RSS (MB) of one command in a fresh process, from GNU time -v."""
    out = subprocess.run(["/usr/bin/time", "-v", *argv], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{argv} failed: {out.stderr[-2000:]}")
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", out.stderr).group(1))  # type: ignore[union-attr]
    clock = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", out.stderr).group(1)  # type: ignore[union-attr]
    seconds = 0.0
    for part in clock.split(":"):
        seconds = 60 * seconds + float(part)
    return {"wall_s": round(seconds, 2), "peak_rss_mb": round(rss / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=21)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--keep", action="store_true", help="keep the generated checkpoints")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="wbfe-compare-"))
    try:
        subprocess.run([sys.executable, __file__, "--write", str(folder), str(args.blocks), str(args.width)], check=True)
        a, b = folder / "a.safetensors", folder / "b.safetensors"
        baseline = timed([sys.executable, "-c", "import torch, wbfe, numpy, scipy.linalg"])
        compare = timed([str(BIN / "wbfe"), "compare", str(a), str(b), "--metrics", "bfe", "--device", "cpu",
                         "--format", "json", "--output", str(folder / "out")])
        score_a = timed([str(BIN / "wbfe"), "score", str(a), "--metrics", "bfe", "--device", "cpu", "--format", "json",
                         "--output", str(folder / "score_a.json")])
        score_b = timed([str(BIN / "wbfe"), "score", str(b), "--metrics", "bfe", "--device", "cpu", "--format", "json",
                         "--output", str(folder / "score_b.json")])
        summary = json.loads((folder / "out" / "compare.json").read_text())["summary"]
        result = {
            "date": time.strftime("%Y-%m-%d"),
            "command": "wbfe compare A B --metrics bfe --device cpu --format json --output DIR",
            "checkpoint_bytes_each": a.stat().st_size,
            "n_matrices": 6 * args.blocks,
            "largest_tensor_bytes": 4 * 4 * args.width * args.width,
            "baseline": baseline,
            "compare": compare,
            "score_a": score_a,
            "score_b": score_b,
            "compare_over_two_scores": round(compare["wall_s"] / (score_a["wall_s"] + score_b["wall_s"]), 2),
            "n_matched": summary["n_matched"],
            "rel_frobenius_max": summary["rel_frobenius_max"],
            "cpu_count": os.cpu_count(),
        }
        print(json.dumps(result, indent=2))
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        if args.keep:
            print(f"kept {folder}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--write":
        write_pair(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
