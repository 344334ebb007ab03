"""Streaming a safetensors checkpoint over HTTP range requests against reading the local file.

A checkpoint of ``--mb`` megabytes (float32 matrices of 2048 columns; seeded) is written to a temp
folder and served by a loopback HTTP server (in this process, reading ranges from the file, so the
server holds no copy). Each reading runs in a fresh process that loads every tensor once, one at a
time, and drops it, as the engine does, and reports its peak RSS and time:

- ``local``: the file itself (mapped where it can be);
- ``stream``: the URL, ``stream=True`` (one range request a tensor, nothing on disk);
- ``store``: the file as an object-store URI (``file://``, through fsspec), ``stream=True``: one
  ranged ``cat_file`` a tensor and, the local store having no versions, one ``fs.info`` check after
  each (:mod:`wbfe.sources.store_range`), saved under ``object_store``;
- ``baseline``: the same process importing torch and wbfe and opening nothing, for the RSS floor.

Printed and saved to benchmarks/results/bench_stream.json: bytes fetched / file size, requests,
the resident set's growth while reading against the largest tensor, peak RSS (imports included)
and throughput (MB/s) of both. Median of ``--runs`` runs each.

    python benchmarks/bench_stream.py [--mb 256] [--runs 3] [--modes store]

``--modes`` runs only the named readings (``baseline,local,stream,store``) and updates only their
figures in the saved results; a reading not run keeps its saved figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results" / "bench_stream.json"
COLUMNS = 2048
MODES = ("baseline", "local", "stream", "store")

_CHILD = r"""
import json, os, sys, threading, time
import torch
import wbfe
from wbfe.sources import open_source

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


ref, mode = sys.argv[1], sys.argv[2]
before = rss()
peak = [before]
done = threading.Event()


def sample():
    while not done.wait(0.002):
        peak[0] = max(peak[0], rss())


sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
start = time.perf_counter()
nbytes = 0
fetched = None
if mode != "baseline":
    with open_source(ref, stream=True if mode in ("stream", "store") else None) as source:
        for entry in source.entries():
            tensor = entry.load()
            float(tensor.sum())  # every byte touched, as a score would
            nbytes += int(tensor.nbytes)  # torch tensors and numpy arrays (streamed tensors) alike
            peak[0] = max(peak[0], rss())
            del tensor
        if mode in ("stream", "store"):
            fetched = source.fetched()
elapsed = time.perf_counter() - start
done.set()
sampler.join()
with open("/proc/self/status") as fh:  # VmHWM: this image's peak (ru_maxrss keeps the forking parent's)
    hwm_kb = int(next(line for line in fh if line.startswith("VmHWM:")).split()[1])
print(json.dumps({"seconds": elapsed, "bytes": nbytes, "rss_growth_mb": (peak[0] - before) / 1e6,
                  "peak_rss_mb": hwm_kb / 1024, "fetched": fetched}))
"""


def write_checkpoint(path: Path, megabytes: int) -> dict[str, int]:
    """Matrices of growing row counts adding up to about ``megabytes`` MB; returns their byte counts."""
    import torch
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(0)
    tensors: dict[str, torch.Tensor] = {}
    total, k = 0, 0
    while total < megabytes * 1_000_000:
        rows = 512 * (1 + k % 4)
        tensors[f"layers.{k}.weight"] = torch.randn(rows, COLUMNS, generator=gen) / COLUMNS**0.5
        total += rows * COLUMNS * 4
        k += 1
    save_file(tensors, str(path))
    return {name: t.numel() * 4 for name, t in tensors.items()}


class _Ranges(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    path_on_disk: Path

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - the http.server name
        size = self.path_on_disk.stat().st_size
        match = re.match(r"^bytes=(\d+)-(\d+)$", self.headers.get("Range") or "")
        if match is None:
            self.send_response(416)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        first, last = int(match.group(1)), min(int(match.group(2)), size - 1)
        self.send_response(206)
        self.send_header("ETag", f'"{size}-{int(self.path_on_disk.stat().st_mtime_ns)}"')
        self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
        self.send_header("Content-Length", str(last - first + 1))
        self.end_headers()
        with open(self.path_on_disk, "rb") as fh:
            fh.seek(first)
            left = last - first + 1
            while left:
                chunk = fh.read(min(left, 1 << 20))
                self.wfile.write(chunk)
                left -= len(chunk)


def run_child(ref: str, mode: str) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _CHILD, ref, mode], capture_output=True, text=True, env=env,
                         check=True, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default=",".join(MODES), help="readings to run (the others keep their saved figures)")
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes: a comma-separated subset of {','.join(MODES)}")
    http = set(modes) & set(MODES[:3])
    if http and http != set(MODES[:3]):
        parser.error("--modes: baseline, local and stream go together (their figures are compared)")
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        sizes = write_checkpoint(path, args.mb)
        handler = type("Handler", (_Ranges,), {"path_on_disk": path})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/model.safetensors"
        refs = {"baseline": url, "local": str(path), "stream": url, "store": path.as_uri()}
        runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES if mode in modes}
        try:
            for _ in range(args.runs):
                for mode in runs:
                    runs[mode].append(run_child(refs[mode], mode))
        finally:
            server.shutdown()
            server.server_close()
        file_size = path.stat().st_size

    def median(mode: str, key: str) -> float:
        return float(statistics.median(r[key] for r in runs[mode]))

    if http:
        result = _http_figures(runs, median, file_size, sizes, args.runs)
        # the conditions of this run (a shared machine: throughput follows its load), each run's own
        # throughput, and the saved run it replaces, kept beside it
        result["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        result["load_average_1min"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]
        result["throughput_mb_s_per_run"] = {mode: [round(file_size / 1e6 / r["seconds"], 1) for r in runs[mode]]
                                             for mode in ("local", "stream")}
        if RESULTS.exists():
            saved = json.loads(RESULTS.read_text())
            earlier = saved.pop("earlier_runs", [])
            saved.pop("object_store", None)
            result["earlier_runs"] = [saved, *earlier]
    else:  # the saved HTTP figures stay as they are
        result = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if "store" in runs:
        fetched = runs["store"][0]["fetched"]
        result["object_store"] = {
            "uri": "file:// (fsspec LocalFileSystem), stream=True",
            "checkpoint_file_bytes": file_size, "runs": args.runs,
            "bytes_fetched_over_file_size": fetched["bytes"] / file_size, "requests": fetched["requests"],
            "peak_rss_mb": median("store", "peak_rss_mb"),
            "rss_growth_while_reading_mb": median("store", "rss_growth_mb"),
            "seconds": median("store", "seconds"),
            "throughput_mb_s": file_size / 1e6 / median("store", "seconds"),
            "note": "the store reader's own cost (a ranged cat_file and an fs.info check per tensor), no network",
        }
    print(json.dumps(result, indent=2))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


def _http_figures(runs: dict[str, list[dict[str, Any]]], median: Any, file_size: int, sizes: dict[str, int],
                  n_runs: int) -> dict[str, Any]:
    fetched = runs["stream"][0]["fetched"]
    floor = median("baseline", "peak_rss_mb")
    return {
        "checkpoint": {"file_bytes": file_size, "tensors": len(sizes), "largest_tensor_mb": max(sizes.values()) / 1e6,
                       "dtype": "float32", "columns": COLUMNS},
        "runs": n_runs,
        "bytes_fetched_over_file_size": fetched["bytes"] / file_size,
        "requests": fetched["requests"],
        "peak_rss_mb": {"baseline": floor, "local": median("local", "peak_rss_mb"),
                        "stream": median("stream", "peak_rss_mb")},
        # The resident set's largest growth while reading, sampled every 2 ms and after each tensor,
        # over what the process held before opening (imports): about one tensor when streaming.
        "rss_growth_while_reading_mb": {"local": median("local", "rss_growth_mb"),
                                        "stream": median("stream", "rss_growth_mb")},
        "seconds": {"local": median("local", "seconds"), "stream": median("stream", "seconds")},
        "throughput_mb_s": {"local": file_size / 1e6 / median("local", "seconds"),
                            "stream": file_size / 1e6 / median("stream", "seconds")},
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "note": ("loopback HTTP on one machine: the stream figure is the reader's own cost (requests, checks, "
                 "copies), not a network's; local reads are from the page cache after the first run"),
    }


if __name__ == "__main__":
    main()
