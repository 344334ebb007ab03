"""Start-up time of the ``wbfe`` command, and the heavy modules each command imports.

Runs each command in a fresh interpreter N times (subprocess) and records the median wall time:
``wbfe --version``, ``wbfe --help`` and ``wbfe score`` on the shipped fixture (the embedded
Fashion-MNIST CNN, ``--metrics bfe`` and the default metrics, output to /dev/null), against a bare
interpreter and one that imports torch alone (the cost a float safetensors score no longer pays). A probe run of each lists the heavy
top-level packages (torch, numpy, scipy, matplotlib, pandas, ...) in ``sys.modules`` when the command
exits: --version and --help must import none (tests/test_cli_startup.py checks that too).

Where torch and transformers are installed, also ``wbfe score`` of a tiny GPT-2 folder (a ~550 KB
``save_pretrained`` folder with its config.json): the first score in an empty cache folder (it builds
the model's description on the meta device) and the second (the description remembered on disk), with
each run's peak resident memory. Targets (issue 44): the second at most 3x the fixture's time, measured
in this run, and at most 500 MB.

    python benchmarks/bench_startup.py [--n 5]

Writes benchmarks/results/startup.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

RESULTS = Path(__file__).parent / "results" / "startup.json"
HEAVY = ("torch", "numpy", "scipy", "matplotlib", "pandas", "safetensors", "transformers", "timm", "rich",
         "pydantic")
COMMANDS = {
    "wbfe --version": ["--version"],
    "wbfe --help": ["--help"],
    "wbfe score (fixture, bfe)": ["score", "--metrics", "bfe", "--format", "json", "-o", "/dev/null"],
    "wbfe score (fixture, default metrics)": ["score", "--format", "json", "-o", "/dev/null"],
}
PROBE = """
import json, sys
argv, heavy_names = json.loads(sys.argv[1]), set(json.loads(sys.argv[2]))
sys.argv = ["wbfe", *argv]
from wbfe_cli.main import main
try:
    main()
except SystemExit:
    pass
sys.stderr.write("HEAVY " + json.dumps(sorted({n.split(".")[0] for n in sys.modules} & heavy_names)) + "\\n")
"""


GPT2_WRITER = """
import sys, torch, transformers
torch.manual_seed(0)
config = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=64, vocab_size=512)
transformers.GPT2LMHeadModel(config).save_pretrained(sys.argv[1])
"""


def run_once(argv: list[str], env: Optional[dict[str, str]] = None) -> float:
    return run_measured(argv, env)[0]


def run_measured(argv: list[str], env: Optional[dict[str, str]] = None) -> tuple[float, float]:
    """(wall seconds, peak resident MB) of one fresh ``python -m wbfe_cli.main ARGV``."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "wbfe_cli.main", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"wbfe {' '.join(argv)} failed")
    return wall, usage.ru_maxrss / 1024  # Linux: KiB


def gpt2_rows(n: int, fixture_s: float) -> Optional[dict[str, Any]]:
    """The tiny GPT-2 folder's first and second score (medians of n, fresh cache folder per first run)."""
    import importlib.util

    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None:
        return None
    work = Path(tempfile.mkdtemp(prefix="wbfe-bench-gpt2-"))
    try:
        folder = work / "gpt2"
        # Written by a child process: a parent holding torch would lend the scores' children its memory
        # (a forked child's peak RSS counts the pages it shares before exec).
        subprocess.run([sys.executable, "-c", GPT2_WRITER, str(folder)], check=True, capture_output=True)
        size_kb = sum(p.stat().st_size for p in folder.iterdir()) / 1024
        argv = ["score", str(folder), "--metrics", "bfe", "--format", "json", "-o", os.devnull]
        first, second = [], []
        for k in range(n):
            env = {**os.environ, "WBFE_CACHE_DIR": str(work / f"cache-{k}")}
            first.append(run_measured(argv, env))
            second.append(run_measured(argv, env))
        heavy = {"first": heavy_modules(argv, {**os.environ, "WBFE_CACHE_DIR": str(work / "probe")})}
        heavy["second"] = heavy_modules(argv, {**os.environ, "WBFE_CACHE_DIR": str(work / "probe")})
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def row(runs: list[tuple[float, float]], which: str) -> dict[str, Any]:
        return {"median_s": round(statistics.median(t for t, _ in runs), 3), "min_s": round(min(t for t, _ in runs), 3),
                "peak_rss_mb": round(max(m for _, m in runs), 1), "runs": n, "heavy_modules": heavy[which]}

    out: dict[str, Any] = {"folder_kb": round(size_kb), "first": row(first, "first"), "second": row(second, "second")}
    out["second_over_fixture"] = round(out["second"]["median_s"] / fixture_s, 2)
    out["targets"] = {"second_over_fixture_max": 3.0, "second_peak_rss_mb_max": 500,
                      "met": out["second_over_fixture"] <= 3.0 and out["second"]["peak_rss_mb"] <= 500}
    return out


def heavy_modules(argv: list[str], env: Optional[dict[str, str]] = None) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv), json.dumps(HEAVY)], capture_output=True,
                         text=True, check=True, env=env)
    line = next(x for x in out.stderr.splitlines() if x.startswith("HEAVY "))
    return json.loads(line[len("HEAVY "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5, help="runs per command (the median is kept)")
    args = parser.parse_args()
    rows = {}
    bare = [run_once_python("pass") for _ in range(args.n)]
    # The peer: what importing torch alone costs, which a float safetensors score no longer pays.
    torch_alone = [run_once_python("import torch") for _ in range(args.n)]
    for name, argv in COMMANDS.items():
        times = [run_once(argv) for _ in range(args.n)]
        rows[name] = {"median_s": round(statistics.median(times), 3), "min_s": round(min(times), 3),
                      "runs": args.n, "heavy_modules": heavy_modules(argv)}
        print(f"{name:<28} median {rows[name]['median_s']:.3f} s  heavy: {', '.join(rows[name]['heavy_modules']) or '-'}")
    gpt2 = gpt2_rows(args.n, rows["wbfe score (fixture, bfe)"]["median_s"])
    if gpt2 is not None:
        for which in ("first", "second"):
            print(f"{'wbfe score (GPT-2 folder, ' + which + ')':<28} median {gpt2[which]['median_s']:.3f} s  "
                  f"peak {gpt2[which]['peak_rss_mb']:.0f} MB  heavy: {', '.join(gpt2[which]['heavy_modules']) or '-'}")
        print(f"second / fixture: {gpt2['second_over_fixture']}x (target <= 3x, <= 500 MB): "
              f"{'met' if gpt2['targets']['met'] else 'NOT met'}")
    result = {
        "what": "wall time of a fresh `python -m wbfe_cli.main ARGS` (median of runs), and the heavy "
                "packages in sys.modules when it exits",
        "interpreter_alone_median_s": round(statistics.median(bare), 3),
        "import_torch_alone_median_s": round(statistics.median(torch_alone), 3),
        "commands": rows,
        "gpt2_folder": gpt2 if gpt2 is not None else "not measured: torch and transformers are not installed",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
    }
    print(f"{'python -c pass':<28} median {result['interpreter_alone_median_s']:.3f} s")
    print(f"{'python -c import torch':<28} median {result['import_torch_alone_median_s']:.3f} s")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {RESULTS}")


def run_once_python(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
