"""``wbfe --version`` and ``wbfe --help`` import nothing heavy (issue 35 §2): no torch, numpy, scipy,
matplotlib or pandas, checked in a fresh interpreter's ``sys.modules``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "numpy", "scipy", "matplotlib", "pandas", "safetensors", "transformers")

PROBE = """
import json, sys
argv, heavy_names = json.loads(sys.argv[1]), set(json.loads(sys.argv[2]))
sys.argv = ["wbfe", *argv]
from wbfe_cli.main import main
try:
    main()
except SystemExit as exc:
    code = exc.code
heavy = sorted({name.split(".")[0] for name in sys.modules} & heavy_names)
sys.stderr.write("HEAVY " + json.dumps(heavy) + "\\n")
"""


def heavy_imports(*argv: str) -> list[str]:
    """The heavy top-level packages a fresh ``wbfe ARGV`` run has imported by the time it exits."""
    out = subprocess.run([sys.executable, "-c", PROBE, json.dumps(list(argv)), json.dumps(HEAVY)],
                         capture_output=True, text=True, timeout=120)
    line = next(x for x in out.stderr.splitlines() if x.startswith("HEAVY "))
    return json.loads(line[len("HEAVY "):])


@pytest.mark.parametrize("argv", [("--version",), ("--help",), ("score", "--help"), ("rank", "--help"),
                                  ("theory", "--help")], ids=" ".join)
def test_version_and_help_import_nothing_heavy(argv: tuple[str, ...]) -> None:
    assert heavy_imports(*argv) == []


def test_the_probe_sees_heavy_imports() -> None:
    """The same probe on a command that scores does see numpy and scipy (it is not blind), and no
    torch: the shipped float32 safetensors fixture is scored without it (tests/test_torch_free.py)."""
    found = heavy_imports("score", "--metrics", "bfe", "--device", "cpu", "--format", "json", "-o", "/dev/null")
    assert "numpy" in found and "scipy" in found and "torch" not in found
