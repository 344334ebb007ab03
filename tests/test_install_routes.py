"""The README's install routes do what they say: resolving the test extra over an installed CPU torch
keeps that torch (pip's own resolver, ``pip install --dry-run --report``), where timm's torchvision,
pinned to one torch release, would replace it by pip's default (CUDA) build."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

ROOT = Path(__file__).resolve().parents[1]
# An older CPU torch than the newest torchvision is built for: the case the README's CPU route meets
# whenever the CPU index lags behind PyPI (torchvision 0.29 requires torch==2.14.x).
INSTALLED_TORCH = "2.13.0+cpu"
_OFFLINE = re.compile(r"NewConnectionError|Network is unreachable|Failed to establish|Temporary failure in name "
                      r"resolution|ConnectTimeout|ReadTimeout|No matching distribution found|Could not find a version")


def _fake_torch(venv: Path, version: str) -> None:
    """Make ``venv``'s pip see torch ``version`` installed (its metadata only: nothing is imported)."""
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = Path(subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                                  check=True).stdout.strip())
    info = purelib / f"torch-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    (info / "INSTALLER").write_text("pip\n")
    (info / "RECORD").write_text("")
    (purelib / "torch").mkdir()


def _resolve(venv: Path, requirement: str, tmp_path: Path) -> list[tuple[str, str]]:
    report = tmp_path / "report.json"
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--dry-run", "--quiet",
                           "--disable-pip-version-check", "--report", str(report), requirement],
                          capture_output=True, text=True, timeout=1500, cwd=ROOT)
    if done.returncode != 0 and _OFFLINE.search(done.stderr):
        pytest.skip(f"the package index is not reachable from here: {_OFFLINE.search(done.stderr).group(0)}")
    assert done.returncode == 0, done.stderr[-3000:]
    return [(item["metadata"]["name"].lower(), item["metadata"]["version"])
            for item in json.loads(report.read_text())["install"]]


@pytest.mark.slow
def test_the_test_extra_keeps_an_installed_cpu_torch(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=300)
    _fake_torch(venv, INSTALLED_TORCH)
    installs = _resolve(venv, f"{ROOT}[test]", tmp_path)
    assert "wbfe" in {name for name, _ in installs}  # the resolution ran through the whole extra
    assert [(n, v) for n, v in installs if n in ("torch", "torchvision", "timm")] == []


def test_the_test_extra_leaves_out_what_pins_torch() -> None:
    """Only timm (through torchvision, one torch release each) pins torch among the test extra's
    packages; it is its own extra, and the tests that need it name it when skipped."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names = {re.split(r"[ ;<>=!~\[]", r)[0].lower() for r in project["test"]}
    assert not names & {"timm", "torchvision"}
    assert {re.split(r"[ ;<>=!~\[]", r)[0].lower() for r in project["timm"]} == {"timm", "torchvision"}
    skips = [line for path in (ROOT / "tests").rglob("*.py") if path.name != Path(__file__).name
             for line in path.read_text().splitlines() if 'importorskip("timm"' in line]
    assert skips and all("timm extra" in line for line in skips), skips
