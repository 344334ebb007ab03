"""Start-up time of the ``wbfe`` command, and the heavy modules each command imports.

Runs each command in a fresh interpreter N times (subprocess) and records the median wall time:
``wbfe --version``, ``wbfe --help`` and ``wbfe score`` on the shipped fixture (the embedded
Fashion-MNIST CNN, ``--metrics bfe`` and the default metrics, output to /dev/null), against a bare
interpreter and one that imports torch alone (the cost a float safetensors score no longer pays). A probe run of each lists the heavy
top-level packages (torch, numpy, scipy, matplotlib, pandas, ...) in ``sys.modules`` when the command
exits: --version and --help must import none (tests/test_cli_startup.py checks that too).

    python benchmarks/bench_startup.py [--n 5]

Writes benchmarks/results/startup.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

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


def run_once(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "wbfe_cli.main", *argv], check=True, capture_output=True)
    return time.perf_counter() - start


def heavy_modules(argv: list[str]) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv), json.dumps(HEAVY)], capture_output=True,
                         text=True, check=True)
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
    result = {
        "what": "wall time of a fresh `python -m wbfe_cli.main ARGS` (median of runs), and the heavy "
                "packages in sys.modules when it exits",
        "interpreter_alone_median_s": round(statistics.median(bare), 3),
        "import_torch_alone_median_s": round(statistics.median(torch_alone), 3),
        "commands": rows,
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
