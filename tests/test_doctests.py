"""The examples in the docstrings run: every module of wbfe/ and cli/ with a ``>>>`` is doctested.

Modules are found by reading the source, so a new example is tested without being listed here.
Examples that need a real checkpoint or a network carry ``# doctest: +SKIP``.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"wbfe": ROOT / "wbfe", "wbfe_cli": ROOT / "cli"}


def _modules_with_examples() -> list[str]:
    names = []
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            if ">>>" in path.read_text(encoding="utf-8"):
                parts = path.relative_to(folder).with_suffix("").parts
                parts = parts[:-1] if parts[-1] == "__init__" else parts
                names.append(".".join((package, *parts)))
    return names


MODULES = _modules_with_examples()


def test_examples_exist() -> None:
    # The runnable ones: BFE-W of a module (scoring), Tricomi U (special), theory settings and JSON, watch.
    assert {"wbfe.scoring", "wbfe.metrics.special", "wbfe.theory.settings", "wbfe.watch.guidance", "wbfe.description"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed (output above)"
