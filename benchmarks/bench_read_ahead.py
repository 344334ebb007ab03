"""Does the engine's read-ahead thread pay where reading is slow: a safetensors checkpoint STREAMED over HTTP range
requests (``wbfe.score(url, stream=True)``), with and without it.

Two seeded checkpoints, written to a folder and served by a loopback HTTP server in this process (one file, range
requests only, an ETag; :mod:`benchmarks.bench_stream`'s server reads ranges from the file, so does this one):

- ``dense``: float32 matrices of 2048 columns, 512-2048 rows, about ``--mb`` MB (bench_stream's checkpoint);
- ``moe``: one layer of 128 experts x 3 bfloat16 256 x 1024 matrices in one file (384 tensors of 2^18 elements,
  the smallest the read-ahead takes), one range request each.

Each is served two ways: ``loopback`` (as fast as this machine serves it) and ``link`` (the server sends at most
``--link-mb-s`` MB/s, shared by all its connections, as one network link would be). Each round scores each case in
fresh processes, ``read_ahead`` (as shipped) and ``no_read_ahead`` (every tensor read in line, the switch below)
alternating; medians of ``--repeats`` rounds, each run's column digest (the numbers must agree).

    python benchmarks/bench_read_ahead.py [--mb 128] [--link-mb-s 100] [--repeats 3]
    (writes benchmarks/results/read_ahead.json)

The read-ahead gave below 1.2x in every case (the results file's ``decision``) and was deleted after this run: the
switch needs a revision that still has ``wbfe.engine.pipeline._READ_AHEAD_ELEMENTS`` (its child refuses others).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is a folder, not a package
from benchmarks._score_ab import ROOT, header  # noqa: E402
from benchmarks.bench_stream import write_checkpoint  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "read_ahead.json"
VARIANTS = {"read_ahead": "", "no_read_ahead": "no_read_ahead"}

_CHILD = r"""
import hashlib, json, sys, time
import wbfe, wbfe.engine.pipeline as pipeline
if not hasattr(pipeline, "_READ_AHEAD_ELEMENTS"):
    sys.exit("this wbfe has no read-ahead to switch off: run the benchmark at a revision before its deletion")
if sys.argv[2] == "no_read_ahead":  # no tensor is large enough: each is loaded in line (run._prepare's entry.load())
    pipeline._READ_AHEAD_ELEMENTS = 1 << 62
start = time.perf_counter()
result = wbfe.score(sys.argv[1], device="cpu", stream=True)
seconds = time.perf_counter() - start
digest = hashlib.sha256()
for row in result.layers:
    digest.update(json.dumps({k: v for k, v in row.items() if isinstance(v, (int, float, str)) or v is None},
                             sort_keys=True, default=str).encode())
print(json.dumps({"seconds": seconds, "matrices": len(result.layers), "skipped": len(result.skipped),
                  "digest": digest.hexdigest()[:16]}))
"""


class _Link:
    """One link's bandwidth, shared by every connection: each chunk waits for its turn on the wire."""

    def __init__(self, bytes_per_s: Optional[float]):
        self.rate = bytes_per_s
        self._free_at = 0.0
        self._lock = threading.Lock()

    def send(self, nbytes: int) -> None:
        if self.rate is None:
            return
        with self._lock:
            self._free_at = max(self._free_at, time.perf_counter()) + nbytes / self.rate
            until = self._free_at
        time.sleep(max(0.0, until - time.perf_counter()))


def _server(path: Path, link: _Link) -> ThreadingHTTPServer:
    class Ranges(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - the http.server name
            match = re.match(r"^bytes=(\d+)-(\d+)$", self.headers.get("Range") or "")
            if self.path.rsplit("/", 1)[-1] != path.name or match is None:
                self.send_response(404 if match else 416)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            size = path.stat().st_size
            first, last = int(match.group(1)), min(int(match.group(2)), size - 1)
            self.send_response(206)
            self.send_header("ETag", f'"{size}-{path.stat().st_mtime_ns}"')
            self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
            self.send_header("Content-Length", str(last - first + 1))
            self.end_headers()
            with open(path, "rb") as fh:
                fh.seek(first)
                left = last - first + 1
                while left:
                    chunk = fh.read(min(left, 1 << 16))
                    link.send(len(chunk))
                    self.wfile.write(chunk)
                    left -= len(chunk)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Ranges)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _moe(path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    shard = {}
    for e in range(128):
        p = f"model.layers.0.mlp.experts.{e}."
        shard[p + "gate_proj.weight"] = (torch.randn(1024, 256, generator=g) * 0.02).to(torch.bfloat16)
        shard[p + "up_proj.weight"] = (torch.randn(1024, 256, generator=g) * 0.02).to(torch.bfloat16)
        shard[p + "down_proj.weight"] = (torch.randn(256, 1024, generator=g) * 0.02).to(torch.bfloat16)
    save_file(shard, str(path))


def _score(url: str, variant: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", _CHILD, url, variant], check=True, capture_output=True, text=True,
                         env=env, timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=128, help="the dense checkpoint's size")
    parser.add_argument("--link-mb-s", type=float, default=100.0, help="the link's bandwidth (100 MB/s: ~1 Gbit/s)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/wbfe-read-ahead"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    files = {"dense": args.work_dir / f"dense-{args.mb}mb.safetensors", "moe": args.work_dir / "moe.safetensors"}
    if not files["dense"].exists():
        write_checkpoint(files["dense"], args.mb)
    if not files["moe"].exists():
        _moe(files["moe"])
    report = header() | {"args": {k: str(v) for k, v in vars(args).items()},
                         "checkpoints": {"dense": f"float32 2048-column matrices, {args.mb} MB, one file",
                                         "moe": "128 experts x 3 bfloat16 256x1024 matrices (384), one file"},
                         "cases": {}}
    for serving, rate in (("loopback", None), ("link", args.link_mb_s * 1e6)):
        for name, path in files.items():
            server = _server(path, _Link(rate))
            url = f"http://127.0.0.1:{server.server_address[1]}/{path.name}"
            runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
            try:
                for r in range(args.repeats):
                    for variant in list(VARIANTS)[r % 2:] + list(VARIANTS)[:r % 2]:  # alternating, first one rotates
                        run = _score(url, VARIANTS[variant])
                        run["load_average_1min"] = round(os.getloadavg()[0], 2)
                        runs[variant].append(run)
                        print(f"{serving} {name} round {r + 1} {variant}: {run['seconds']:.2f} s "
                              f"(load {run['load_average_1min']})", flush=True)
            finally:
                server.shutdown()
                server.server_close()
            with_, without = ([x["seconds"] for x in runs[v]] for v in VARIANTS)
            case = {"serving": "loopback, unthrottled" if rate is None else f"loopback, link of {args.link_mb_s} MB/s",
                    "file_mb": round(path.stat().st_size / 1e6, 1), "matrices": runs["read_ahead"][0]["matrices"],
                    "variants": {v: {"seconds": [round(x["seconds"], 3) for x in runs[v]],
                                     "median_seconds": round(statistics.median(x["seconds"] for x in runs[v]), 3),
                                     "load_average_1min": [x["load_average_1min"] for x in runs[v]],
                                     "digests": sorted({x["digest"] for x in runs[v]})} for v in VARIANTS},
                    # > 1: the read-ahead saves time
                    "end_to_end_speedup": round(statistics.median(without) / statistics.median(with_), 3),
                    "per_round": [round(b / a, 3) for a, b in zip(with_, without)]}
            case["same_numbers"] = len({d for v in case["variants"].values() for d in v["digests"]}) == 1
            report["cases"][f"{serving}/{name}"] = case
            print(json.dumps({k: case[k] for k in ("end_to_end_speedup", "same_numbers")}), flush=True)
    report["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.out.exists():  # a decision written by hand after an earlier run stays
        report["decision"] = json.loads(args.out.read_text()).get("decision")
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
