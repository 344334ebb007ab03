"""Size of a fresh virtual environment for each install route (issue 35 §3), and a torch-free check.

Each route is a fresh ``python -m venv`` into which the checkout is installed as a regular package
(``pip install <checkout>[extra]``), its size what ``du -sm`` reports. Routes:

- ``base``: ``pip install <checkout>``; then, in that venv, ``wbfe score`` on the fixture must work
  and ``import torch`` must fail (the base install has no torch);
- ``cpu-torch``: the base venv plus ``pip install torch==<--cpu-torch>`` (a CPU wheel; all that the
  ``torch`` extra adds), then ``cpu-torch+test``: ``pip install '<checkout>[test]'`` with nothing pinned
  (the test extra leaves out timm, whose torchvision pins a torch release: the installed CPU torch must
  stay, which the ``checks`` record), then ``cpu-torch+test+timm``: ``pip install -c pin '<checkout>[timm]'``
  with that torch pinned, since torchvision would otherwise replace it by a CUDA build;
- ``default-torch``: a fresh venv with ``pip install '<checkout>[torch]'`` (pip's default torch, the
  CUDA build on Linux), then ``default-torch+test``: ``'<checkout>[test,timm]'`` in it (CI's route).

The package index is whatever pip is configured with; nothing is cached (``--no-cache-dir``). The
results file is rewritten after each route, so an interrupted run keeps what it measured; routes not
measured in this run keep their earlier entry (each carries its own date).

    python benchmarks/bench_install_size.py [--cpu-torch 2.13.0] [--routes base,cpu-torch,...]

Writes benchmarks/results/install_size.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results" / "install_size.json"
ROUTES = ("base", "cpu-torch", "cpu-torch+test", "cpu-torch+test+timm", "default-torch", "default-torch+test")


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=3600)


def _pip(venv: Path, *args: str) -> None:
    done = _run(str(venv / "bin" / "pip"), "install", "-q", "--no-cache-dir", *args)
    if done.returncode != 0:
        raise SystemExit(f"pip install {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def _size_mib(venv: Path) -> int:
    return int(_run("du", "-sm", str(venv)).stdout.split()[0])


def _torch_version(venv: Path) -> str | None:
    done = _run(str(venv / "bin" / "python"), "-c", "import torch; print(torch.__version__)")
    return done.stdout.strip() if done.returncode == 0 else None


def _largest(venv: Path, n: int = 8) -> dict[str, int]:
    """The ``n`` largest entries of the venv's site-packages, MiB each (what the size is made of)."""
    site = next((venv / "lib").glob("python*/site-packages"))
    sizes = [line.split("\t") for line in _run("du", "-sm", *map(str, site.iterdir())).stdout.splitlines()]
    top = sorted(((int(mb), Path(path).name) for mb, path in sizes), reverse=True)[:n]
    return {name: mb for mb, name in top}


def _pip_version(venv: Path) -> str:
    return _run(str(venv / "bin" / "python"), "-m", "pip", "--version").stdout.split()[1]


def _write(results: dict[str, dict[str, object]], checks: dict[str, object]) -> None:
    """Rewrite the results file with ``results`` over the earlier file's routes (only those still in ROUTES)."""
    earlier: dict[str, dict[str, object]] = {}
    old_checks: dict[str, object] = {}
    if RESULTS.exists():
        old = json.loads(RESULTS.read_text())
        earlier, old_checks = old.get("routes", {}), old.get("checks", {})
    routes = {r: results.get(r, earlier.get(r)) for r in ROUTES if r in results or r in earlier}
    out = {"python": platform.python_version(), "platform": platform.platform(), "routes": routes,
           "checks": {**old_checks, **checks}}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")


def _record(results: dict[str, dict[str, object]], checks: dict[str, object], route: str, venv: Path,
            command: str) -> None:
    results[route] = {"command": command, "venv_mib": _size_mib(venv), "torch": _torch_version(venv),
                      "pip": _pip_version(venv), "largest_mib": _largest(venv),
                      "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    print(f"{route:<20} {results[route]['venv_mib']:>6} MiB  torch {results[route]['torch']}", flush=True)
    _write(results, checks)


def _fresh(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-torch", default="2.13.0", help="the CPU torch release the cpu-torch route installs")
    parser.add_argument("--routes", default=",".join(ROUTES))
    args = parser.parse_args()
    wanted = set(args.routes.split(","))
    results: dict[str, dict[str, object]] = {}
    checks: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="wbfe-install-") as tmp:
        if wanted & {"base", "cpu-torch", "cpu-torch+test"}:
            venv = _fresh(Path(tmp) / "cpu")
            _pip(venv, str(ROOT))
            score = _run(str(venv / "bin" / "wbfe"), "score", "--format", "json", "-o", "/dev/null")
            checks["base: wbfe score (fixture) exit code"] = score.returncode
            checks["base: import torch fails"] = _torch_version(venv) is None
            _record(results, checks, "base", venv, "pip install <checkout>")
            if wanted & {"cpu-torch", "cpu-torch+test", "cpu-torch+test+timm"}:
                _pip(venv, f"torch=={args.cpu_torch}")
                _record(results, checks, "cpu-torch", venv, f"pip install torch=={args.cpu_torch} (in the base venv)")
                cpu_torch = _torch_version(venv)
            if wanted & {"cpu-torch+test", "cpu-torch+test+timm"}:
                _pip(venv, f"{ROOT}[test]")
                checks["cpu-torch+test: the installed CPU torch stays"] = _torch_version(venv) == cpu_torch
                _record(results, checks, "cpu-torch+test", venv, "pip install '<checkout>[test]' (nothing pinned)")
            if "cpu-torch+test+timm" in wanted:
                pin = Path(tmp) / "pin.txt"
                pin.write_text(f"torch=={args.cpu_torch}\n")
                _pip(venv, "-c", str(pin), f"{ROOT}[test,timm]")
                _record(results, checks, "cpu-torch+test+timm", venv,
                        "pip install -c pin.txt '<checkout>[test,timm]' (torch pinned)")
            shutil.rmtree(venv)
        if wanted & {"default-torch", "default-torch+test"}:
            venv = _fresh(Path(tmp) / "default")
            _pip(venv, f"{ROOT}[torch]")
            _record(results, checks, "default-torch", venv, "pip install '<checkout>[torch]'")
            if "default-torch+test" in wanted:
                _pip(venv, f"{ROOT}[test,timm]")
                _record(results, checks, "default-torch+test", venv,
                        "pip install '<checkout>[test,timm]' (in that venv)")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
