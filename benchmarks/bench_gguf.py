"""Time and peak RSS of `wbfe score --metrics bfe` on a generated ≥ 1 GB Q4_K GGUF file, against its
float16 original as safetensors, each in a fresh process under /usr/bin/time -v.

The model: N matrices 64 × 262,144 (llama.cpp's names, ``output.weight`` last): six Gaussian
bases (one seed each), matrix i being base i mod 6 with its rows rolled by i // 6, so that every
tensor's bytes differ (no tie is detected) while only six are generated and quantised (a row
permutation of a matrix permutes its Q4_K rows; tests/kquants.py's numpy Q4_K encoder takes
seconds a matrix, so this keeps generation to about a minute). Written to a temporary folder one
tensor at a time: the float original by a small safetensors writer, the GGUF file through
gguf.GGUFWriter's streaming calls, Q4_K blocks from tests/kquants.py. The matrices are thin on
purpose: the eigen-work of BFE-W grows with the smaller side, and this measures reading,
dequantising and streaming a GB, not a large Gram matrix.
Also reports the largest |ΔBFE-W| between the two files' rows (the quantisation's effect).

    python benchmarks/bench_gguf.py [--matrices 114] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "gguf.json"
ROWS, COLS = 64, 262_144  # GGUF's ne0 (= COLS) must be a multiple of Q4_K's 256


def names(matrices: int) -> list[str]:
    out = [f"blk.{i // 3}.ffn_{('up', 'gate', 'down')[i % 3]}.weight" for i in range(matrices - 1)]
    return out + ["output.weight"]


BASES = 6


def base(i: int) -> np.ndarray:
    rng = np.random.default_rng(i)
    return (rng.standard_normal((ROWS, COLS), dtype=np.float32) / np.float32(512)).astype(np.float16)


def derived(bases: list[np.ndarray], i: int) -> np.ndarray:
    """Matrix (or Q4_K rows) i: base i mod 6, rows rolled by i // 6."""
    return np.roll(bases[i % BASES], i // BASES, axis=0)


def write_safetensors(path: Path, tensor_names: list[str], bases: list[np.ndarray]) -> None:
    nbytes = ROWS * COLS * 2
    header = {n: {"dtype": "F16", "shape": [ROWS, COLS], "data_offsets": [i * nbytes, (i + 1) * nbytes]}
              for i, n in enumerate(tensor_names)}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for i in range(len(tensor_names)):
            derived(bases, i).tofile(fh)


def write_gguf(path: Path, tensor_names: list[str], bases: list[np.ndarray]) -> None:
    import gguf

    sys.path.insert(0, str(ROOT))
    from tests.kquants import quantize_q4_k

    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_name("bench-q4_k")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    row_bytes = COLS // 256 * 144
    for name in tensor_names:
        writer.add_tensor_info(name, (ROWS, row_bytes), np.dtype(np.uint8), ROWS * row_bytes,
                               raw_dtype=gguf.GGMLQuantizationType.Q4_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    quantised = [quantize_q4_k(b.astype(np.float32)) for b in bases]
    for i in range(len(tensor_names)):
        writer.write_tensor_data(derived(quantised, i))
    writer.close()


def timed_score(path: Path, out: Path) -> dict[str, float]:
    """``wbfe score --metrics bfe`` under /usr/bin/time -v: wall seconds and peak RSS in MB."""
    sys.path.insert(0, str(ROOT))
    from benchmarks.bench_compare import timed  # GNU time's figures, parsed once for every benchmark

    wbfe = Path(sys.executable).with_name("wbfe")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = timed([str(wbfe), "score", str(path), "--metrics", "bfe", "--format", "json", "--output", str(out)])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds as well: on a machine shared with other work the wall time measures the sharing too
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {**run, "cpu_s": round(cpu, 2), "file_bytes": path.stat().st_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matrices", type=int, default=114, help="114 × 64 × 262,144 Q4_K = 1.08 GB")
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="wbfe-gguf-"))
    try:
        tensor_names = names(args.matrices)
        start = time.perf_counter()
        bases = [base(i) for i in range(BASES)]
        write_safetensors(folder / "original-f16.safetensors", tensor_names, bases)
        write_gguf(folder / "model-q4_k.gguf", tensor_names, bases)
        del bases
        generate_s = time.perf_counter() - start
        gguf_run = timed_score(folder / "model-q4_k.gguf", folder / "q4_k.json")
        float_run = timed_score(folder / "original-f16.safetensors", folder / "f16.json")
        q = {r["name"]: r for r in json.loads((folder / "q4_k.json").read_text())["layers"]}
        f = {r["name"]: r for r in json.loads((folder / "f16.json").read_text())["layers"]}
        assert set(q) == set(f) == set(tensor_names) and all(r["quant"] == "gguf-q4_k" for r in q.values())
        delta = [abs(q[n]["bfe"] - f[n]["bfe"]) for n in tensor_names]
        result = {
            "date": time.strftime("%Y-%m-%d"),
            "matrices": args.matrices, "shape": [ROWS, COLS], "weights": args.matrices * ROWS * COLS,
            "generate_s": round(generate_s, 1),
            "gguf_q4_k": gguf_run, "safetensors_f16": float_run,
            "time_ratio_gguf_over_f16": round(gguf_run["wall_s"] / float_run["wall_s"], 2),
            "cpu_ratio_gguf_over_f16": round(gguf_run["cpu_s"] / float_run["cpu_s"], 2),
            "rss_ratio_gguf_over_f16": round(gguf_run["peak_rss_mb"] / float_run["peak_rss_mb"], 2),
            "max_abs_delta_bfe": max(delta), "mean_bfe_f16": float(np.mean([f[n]["bfe"] for n in tensor_names])),
            "cpu_count": os.cpu_count(), "load_average_1min_at_end": round(os.getloadavg()[0], 1),
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
    main()
