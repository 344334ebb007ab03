"""The type checker over the whole package and the benchmark scripts, in the default test run: the
public API is typed (``py.typed`` ships), so the annotations must hold. mypy runs on the source tree
as it is (``wbfe``, ``cli``, which installs as ``wbfe_cli``, and ``benchmarks``: pyproject's
``files``), with the settings in ``pyproject.toml``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_finds_no_errors(tmp_path: Path) -> None:
    pytest.importorskip("mypy", reason="mypy is in the test extras: pip install -e '.[test]'")
    command = [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
               "--cache-dir", str(tmp_path / "cache")]
    env = {k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")}
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Success: no issues found" in run.stdout
