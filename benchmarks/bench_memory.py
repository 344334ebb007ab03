"""Peak resident memory of `wbfe score` on a generated multi-GB safetensors checkpoint.

Writes a checkpoint of N float32 matrices (default 16 × 1024×16384 = 1 GiB), scores it with the BFE-W
group in a fresh process, and reports peak RSS against the checkpoint size and its largest tensor.
Also measures the same score of a one-matrix 64x64 checkpoint: the baseline the interpreter and the libraries a
score loads cost.

    python benchmarks/bench_memory.py [--matrices 16 --rows 1024 --cols 16384] [--keep]
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

RESULTS = Path(__file__).parent / "results" / "memory.json"


def write_checkpoint(path: Path, matrices: int, rows: int, cols: int) -> int:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    base = torch.randn(rows, cols, generator=g)
    tensors = {f"layers.{i}.mlp.fc.weight": base.roll(i, dims=1) for i in range(matrices)}
    save_file(tensors, str(path))
    return rows * cols * 4


_REPORT_PEAK = (
    "\nimport re; print('VmHWM', re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))"
)


def peak_rss_mb(code: str) -> tuple[float, float]:
    """Run ``code`` in a fresh interpreter; its own high-water RSS (VmHWM, reset by exec) and wall time."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code + _REPORT_PEAK], check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    kb = int(out.stdout.split("VmHWM")[-1].split()[0])
    return kb / 1024, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrices", type=int, default=16)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--cols", type=int, default=16384)
    parser.add_argument("--keep", action="store_true", help="keep the generated checkpoint")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="wbfe-mem-"))
    ckpt = folder / "big.safetensors"
    # written by a child so this process stays small
    subprocess.run([sys.executable, __file__, "--write", str(ckpt), str(args.matrices), str(args.rows),
                    str(args.cols)], check=True)
    largest = args.rows * args.cols * 4
    size = ckpt.stat().st_size
    tiny = folder / "tiny.safetensors"
    subprocess.run([sys.executable, __file__, "--write", str(tiny), "1", "64", "64"], check=True)

    def scored(path: Path) -> str:
        return f"import wbfe; r = wbfe.score({str(path)!r}, metrics='bfe', device='cpu'); print(len(r.layers))"

    # A fresh interpreter each (VmHWM is the process's own): what a score costs without the tensors, then with.
    baseline, _ = peak_rss_mb(scored(tiny))
    peak, wall = peak_rss_mb(scored(ckpt))
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "checkpoint_bytes": size,
        "largest_tensor_bytes": largest,
        "n_matrices": args.matrices,
        "baseline_rss_mb": round(baseline, 1),
        "peak_rss_mb": round(peak, 1),
        "peak_rss_over_checkpoint": round(peak * 2**20 / size, 3),
        "peak_minus_baseline_over_largest_tensor": round((peak - baseline) * 2**20 / largest, 3),
        "wall_s": round(wall, 2),
        "cpu_count": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    if not args.keep:
        ckpt.unlink()
        tiny.unlink()
        folder.rmdir()


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--write":
        write_checkpoint(Path(sys.argv[2]), *(int(a) for a in sys.argv[3:]))
    else:
        main()
