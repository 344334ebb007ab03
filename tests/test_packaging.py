"""Packaging: what pyproject.toml declares matches the tree (packages, imports, version, fixtures)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
# Frameworks wbfe plugs into only when the caller already uses them (watch.lightning_callback
# tries Lightning 2's `lightning`, then `pytorch_lightning`, which the test extra installs).
CALLER_FRAMEWORKS = {"lightning", "pytorch_lightning"}


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.\-]+", requirement).group(0)).lower()


def _third_party_imports() -> set[str]:
    names: set[str] = set()
    for folder in (ROOT / "wbfe", ROOT / "cli"):
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
                elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "require"
                      and isinstance(node.args[0], ast.Constant)):  # an extra, imported when first used (wbfe._deps.require)
                    names.add(node.args[0].value.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("wbfe", "wbfe_cli", "__future__")}


def _distributions(module: str) -> set[str]:
    return {_name(d) for d in importlib.metadata.packages_distributions().get(module, [])}


def test_every_package_folder_is_listed() -> None:
    # A folder missing from `packages` works in an editable install and is absent from a wheel.
    listed = set(SETUPTOOLS["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "wbfe").rglob("__init__.py")}
    assert on_disk - listed == set()
    assert {"wbfe_cli", "wbfe._fixtures", "wbfe._fixtures.tables"} <= listed
    assert SETUPTOOLS["package-dir"] == {"wbfe": "wbfe", "wbfe_cli": "cli", "wbfe._fixtures": "fixtures"}


def test_dependencies_are_exactly_what_is_imported() -> None:
    project = PYPROJECT["project"]
    runtime = {_name(r) for r in project["dependencies"]}
    extras = {k: {_name(r) for r in v} for k, v in project["optional-dependencies"].items()
              if k not in ("test", "fuzz")}  # the tools that test wbfe, not what wbfe imports
    declared = runtime.union(*extras.values())
    imported: dict[str, str] = {}
    for module in sorted(_third_party_imports() - CALLER_FRAMEWORKS):
        dists = _distributions(module)
        assert dists, f"wbfe imports {module!r}, which no installed distribution provides"
        assert dists & declared, f"wbfe imports {module!r} ({sorted(dists)}) but pyproject.toml declares none of them"
        imported.update({d: module for d in dists})
    assert runtime - set(imported) == set(), "runtime dependencies that wbfe never imports"
    for extra, names in extras.items():
        assert names - set(imported) == set(), f"extra {extra!r} holds packages that wbfe never imports"


def test_one_version_source() -> None:
    import wbfe

    assert "version" not in PYPROJECT["project"] and "version" in PYPROJECT["project"]["dynamic"]
    assert SETUPTOOLS["dynamic"]["version"] == {"attr": "wbfe.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", wbfe.__version__)


def test_version_option() -> None:
    from typer.testing import CliRunner

    import wbfe
    from wbfe_cli.main import app

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout == f"wbfe {wbfe.__version__}\n"


@pytest.mark.slow
def test_wheel_ships_the_fixtures_without_warnings(tmp_path: Path) -> None:
    """Build a wheel offline with the installed setuptools (>= 77, as pyproject.toml requires)."""
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} < 77 here; pip's isolated build would fetch it")
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
                          "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    log = run.stdout + run.stderr
    assert "absent from the `packages` configuration" not in log and "SetuptoolsDeprecationWarning" not in log
    (wheel,) = tmp_path.glob("wbfe-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {"wbfe/py.typed", "wbfe_cli/main.py", "wbfe/_fixtures/fmnist-cnn/model.safetensors",
                "wbfe/_fixtures/fmnist-zoo/zoo.csv", "wbfe/_fixtures/tables/cifar10-resnet.csv"}
    assert expected <= names
    assert not any("__pycache__" in n for n in names)


def _module_level_imports(tree: ast.Module) -> set[str]:
    """Top-level names imported when the module is imported: its body, and the ``if``/``try`` blocks in
    it, but not functions, classes or ``if TYPE_CHECKING:`` blocks."""
    names: set[str] = set()
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.If):
            if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                stack.extend(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            stack.extend(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])
    return names


def test_torch_is_an_extra() -> None:
    """The base install has no torch (issue 35 §3): no module imports it when imported, and the
    `torch` and `test` extras bring it."""
    project = PYPROJECT["project"]
    assert "torch" not in {_name(r) for r in project["dependencies"]}
    extras = {k: {_name(r) for r in v} for k, v in project["optional-dependencies"].items()}
    assert "torch" in extras["torch"] and "torch" in extras["test"] and "torch" in extras["transformers"]
    at_import = {str(path.relative_to(ROOT)): _module_level_imports(ast.parse(path.read_text(encoding="utf-8")))
                 for folder in (ROOT / "wbfe", ROOT / "cli") for path in folder.rglob("*.py")}
    assert {path for path, names in at_import.items() if names & {"torch", "torchvision", "timm"}} == set()
