"""The layering contract, in the default test run: the import contracts in pyproject.toml
(import-linter: no import circles, private modules kept inside their package, the engine importing
no feature, the library never importing the CLI), no underscore name imported from another module,
and ruff's checks. (mypy over the package and the benchmarks is tests/test_typing.py.)"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Where the project's own code lives, and the dotted name each folder installs as.
PACKAGES = {"wbfe": "wbfe", "cli": "wbfe_cli", "benchmarks": "benchmarks"}


def _tool(name: str) -> str:
    """A console script installed beside this interpreter (the test extras bring it)."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return found


def _module_name(path: Path) -> str:
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    parts = [PACKAGES[folder], *rest]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_from(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute module an ``from X import ...`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_module(dotted: str) -> bool:
    folder = {v: k for k, v in PACKAGES.items()}.get(dotted.split(".")[0])
    if folder is None:
        return False
    path = ROOT / folder / Path(*dotted.split(".")[1:])
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def private_imports() -> list[str]:
    """Every ``from <project module> import _name`` in the project's code where the module is not
    the importer itself: an underscore name is private to its module, and taking it is a missing
    public seam."""
    found = []
    for folder in PACKAGES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            module = _module_name(path)
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if not isinstance(node, ast.ImportFrom):
                    continue
                source = _imported_from(node, module, path.name == "__init__.py")
                if source.split(".")[0] not in PACKAGES.values() or source == module:
                    continue
                for alias in node.names:
                    if not alias.name.startswith("_") or alias.name.startswith("__"):
                        continue
                    if _is_module(f"{source}.{alias.name}") and module.startswith(source + "."):
                        continue  # a private module taken by its own package (the import contract's rule)
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {source}.{alias.name}")
    return found


def test_no_private_name_is_imported_across_modules() -> None:
    assert private_imports() == []


def test_the_private_import_check_finds_one(tmp_path: Path) -> None:
    """The scan itself: a module taking another's underscore name is found, its own are not."""
    tree = ast.parse("from wbfe.scoring import _hidden\nfrom . import _own\n")
    node = tree.body[0]
    assert isinstance(node, ast.ImportFrom)
    assert _imported_from(node, "wbfe.engine.run", False) == "wbfe.scoring"
    relative = tree.body[1]
    assert isinstance(relative, ast.ImportFrom)
    assert _imported_from(relative, "wbfe.engine.run", False) == "wbfe.engine"
    assert _imported_from(relative, "wbfe.engine", True) == "wbfe.engine"


def test_import_contracts_hold() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([_tool("lint-imports"), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


def test_ruff_finds_nothing() -> None:
    run = subprocess.run([_tool("ruff"), "check", "--no-cache", "wbfe", "cli", "benchmarks", "tests"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]


def test_no_worker_pool_outside_the_engine_and_the_executors() -> None:
    """Issue 43.3: every feature's matrices run on the engine's pipeline (wbfe/engine) or on an
    executor (wbfe/executors); no other module starts a pool of workers of its own."""
    pools = {"ThreadPoolExecutor", "ProcessPoolExecutor", "Pool", "ThreadPool"}
    found = []
    for path in sorted((ROOT / "wbfe").rglob("*.py")):
        if path.relative_to(ROOT / "wbfe").parts[0] in ("engine", "executors"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.ImportFrom)
                     else [node.attr] if isinstance(node, ast.Attribute) else [])
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {name}" for name in names if name in pools]
    assert not found, found
