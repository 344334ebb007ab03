"""Figures on the pages come from benchmarks/results (issue 43 item 5, issue 44 item 3).

- The template of docs/performance.md (the prose in benchmarks/make_performance_doc.py) holds no
  measured figure: every time, ratio, percentage, size, range or rate on the page is formatted from
  a results file. (That the committed page is the generator's output is tests/test_docs.py's
  ``test_performance_doc_is_the_generators_output``.)
- The code's settings the page names (``SETTINGS``) equal the constants under wbfe/ they name.
- Every file under benchmarks/results is cited by a page (README.md, docs/, benchmarks/**/*.md).
- The README's install-size table is benchmarks/results/install_size.json's figures.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import json
import operator
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GENERATOR = ROOT / "benchmarks" / "make_performance_doc.py"
RESULTS = ROOT / "benchmarks" / "results"

_NUM = r"\d[\d,]*(?:\.\d+)?"
# What a measured figure looks like in prose: a number with a unit of time, size or rate, a ratio, a
# percentage, a decimal, a range, a pair "a / b", or an approximation. Shapes (64×64), counts and
# names (ResNet-56, float64) are not figures; code spans are not prose.
_FIGURE = re.compile("|".join([
    rf"{_NUM}\s*(?:ms|µs|us|s|min|h|MB|MiB|GB|GiB|KB|KiB|kB|TB|GFLOP/s|GB/s|MB/s)(?![A-Za-z])",
    rf"{_NUM}\s*[×x](?!\s*\d)(?![\w])",
    rf"{_NUM}\s*%",
    r"(?<![\w.])\d+\.\d+(?![\w.])",
    rf"{_NUM}\s*–\s*{_NUM}",
    rf"{_NUM}\s*/\s*{_NUM}",
    rf"(?:[~≈]|\babout|\bnearly|\baround)\s*{_NUM}",
]))
# Digit-bearing phrases of the template that are not figures (a formula's constant).
_NOT_FIGURES = ("4/3·p³",)


def _template_texts(source: str) -> list[str]:
    """The prose of a generator: its string literals that hold whitespace, an f-string's parts
    joined with a NUL where a value goes in; docstrings and format specs left out."""
    tree = ast.parse(source)
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            skip.add(id(body[0].value))
        if isinstance(node, ast.FormattedValue) and node.format_spec is not None:
            skip.update(id(n) for n in ast.walk(node.format_spec))
    texts = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "\0" for v in node.values)
            skip.update(id(v) for v in node.values)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            continue
        if re.search(r"\s", text):
            texts.append(text)
    return texts


def literal_figures(source: str) -> list[str]:
    """Every measured-looking figure written into a generator's prose."""
    found = []
    for text in _template_texts(source):
        prose = re.sub(r"`[^`\0]*`", " ", text)  # code spans: commands, paths, options
        prose = re.sub(r"\]\([^)]*\)", "]", prose)  # link targets
        for phrase in _NOT_FIGURES:
            prose = prose.replace(phrase, " ")
        found += [m.group(0) for m in _FIGURE.finditer(prose)]
    return found


def test_the_performance_template_holds_no_figure() -> None:
    figures = literal_figures(GENERATOR.read_text(encoding="utf-8"))
    assert figures == [], f"figures written into the template instead of read from benchmarks/results: {figures}"


def test_the_figure_check_finds_figures() -> None:
    """The check itself: each kind of literal figure is caught, names, shapes and code are not."""
    for figure in ("took 3.2 s", "1.75× as fast", "2.5× 64", "5.4 GB", "by 10 %", "measured 63 / 121", "0.1–7 ms",
                   "about 10 ms", "~150 knots", "it was 0.99 then", "8 MiB blocks", "70 µs"):
        assert literal_figures(f'X = f"""{{a}} {figure} here"""\n'), figure
    for name in ("a ResNet-56", "`bench.py --sizes 512,1024 --repeats 2`", "64×64×3×3 convolutions",
                 "WeightWatcher 0.7.7", "float64 and bfloat16", "3×Linear 1024²", "10,368 experts", "4/3·p³ flops",
                 "a 7B model", "256 × 1024 matrices", "[link](docs/a-1.5.md)"):
        assert literal_figures(f'X = f"""{{a}} {name} here"""\n') == [], name
    # docstrings and format specs are not prose
    assert literal_figures('"""Took 3.2 s."""\nX = f"{a:.2f} s"\n') == []


_OPS = {ast.LShift: operator.lshift, ast.Mult: operator.mul, ast.Pow: operator.pow, ast.Add: operator.add,
        ast.Sub: operator.sub}


def _value(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left), _value(node.right))
    raise ValueError(ast.dump(node))


def _assignments(path: Path, name: str) -> list[Any]:
    values = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else \
            node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == name and node.value is not None:
            values.append(_value(node.value))
    return values


def _generator() -> Any:
    spec = importlib.util.spec_from_file_location("make_performance_doc", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_settings_the_page_names_are_the_codes() -> None:
    for key, (module, name, value) in _generator().SETTINGS.items():
        path = ROOT / module
        if path.exists() and _assignments(path, name):
            values = _assignments(path, name)
        else:  # the module moved: the one module under wbfe/ that defines the name
            defining = [p for p in (ROOT / "wbfe").rglob("*.py") if _assignments(p, name)]
            assert len(defining) == 1, f"{key}: {name} is defined in {defining}, not once under wbfe/"
            values = _assignments(defining[0], name)
        assert values == [value], f"SETTINGS[{key!r}] = {value}, but {name} = {values} in the code"


def _pages() -> str:
    paths = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "benchmarks").rglob("*.md")]
    return "\n".join(p.read_text(encoding="utf-8") for p in paths)


def uncited(results: Path, pages: str) -> list[str]:
    """Files under ``results`` no page names: by name, by a glob under benchmarks/results/, or by their folder."""
    cited_paths = re.findall(r"benchmarks/results/([^\s`)'\"]*)", pages)
    missing = []
    for path in sorted(p for p in results.rglob("*") if p.is_file()):
        rel = path.relative_to(results).as_posix()
        if path.name in pages:
            continue
        if any(fnmatch.fnmatch(rel, c) or (c.endswith("/") and rel.startswith(c)) for c in cited_paths if c):
            continue
        missing.append(rel)
    return missing


def test_every_results_file_is_cited(tmp_path: Path) -> None:
    assert uncited(RESULTS, _pages()) == []
    # and the check can fail: a file no page names is found
    (tmp_path / "dynamics").mkdir()
    (tmp_path / "orphan_bench.json").write_text("{}")
    (tmp_path / "dynamics" / "a.png").write_text("")
    assert uncited(tmp_path, "see `benchmarks/results/dynamics/`") == ["orphan_bench.json"]


def _install_doc() -> Any:
    spec = importlib.util.spec_from_file_location("make_install_doc", ROOT / "benchmarks" / "make_install_doc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _size_cells(page: Path) -> list[str]:
    """The last cell of each row of the page's install-size table (the venv sizes)."""
    text = page.read_text(encoding="utf-8")
    gen = _install_doc()
    block = text[text.index(gen.BEGIN):text.index(gen.END)]
    rows = [line for line in block.splitlines() if line.startswith("| ") and "MiB |" in line]
    return [[c.strip() for c in row.strip("|").split("|")][-1 if page.name == "README.md" else -2] for row in rows]


def test_the_install_tables_are_the_results_file() -> None:
    """README.md's and docs/install.md's size tables are generated from install_size.json, and their
    figures (read back from the pages) are the file's venv sizes, route for route."""
    gen = _install_doc()
    data = json.loads((RESULTS / "install_size.json").read_text(encoding="utf-8"))
    for page, path in gen.PAGES.items():
        text = path.read_text(encoding="utf-8")
        assert gen.render(page, text, data) == text, f"{path} is out of date: run python benchmarks/make_install_doc.py"
    sizes = sorted(r["venv_mib"] for r in data["routes"].values())
    for path in gen.PAGES.values():
        stated = [int(n.replace(",", "")) for cell in _size_cells(path) for n in re.findall(r"\d[\d,]*", cell)]
        assert sorted(stated) == sizes, (path.name, stated, sizes)


def test_the_install_check_finds_a_changed_figure(tmp_path: Path) -> None:
    gen = _install_doc()
    data = json.loads((RESULTS / "install_size.json").read_text(encoding="utf-8"))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    data["routes"]["base"]["venv_mib"] += 1
    assert gen.render("readme", readme, data) != readme


def _extras_table() -> dict[str, str]:
    text = (ROOT / "docs" / "install.md").read_text(encoding="utf-8")
    return {m.group(1): m.group(0) for m in re.finditer(r"^\| `\.\[(\w+)\]` \|.*$", text, flags=re.M)}


def test_install_md_names_every_extra_and_the_one_each_reader_asks_for() -> None:
    """docs/install.md's extras table holds pyproject's extras, and each reader's missing-package
    error names an extra whose row there names that reader's format."""
    tomllib = __import__("pytest").importorskip("tomllib")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    table = _extras_table()
    assert set(table) == set(extras)
    for extra, requirements in extras.items():
        for requirement in requirements:
            name = re.split(r"[ ;<>=!~\[]", requirement)[0]
            assert name in table[extra] or extra in ("test",), (extra, name)
    formats = {"gguf_files.py": "GGUF", "keras_files.py": "Keras", "onnx_files.py": "ONNX",
               "tflite_files.py": "TFLite", "flax_files.py": "Flax"}
    for module, fmt in formats.items():
        path = next((ROOT / "wbfe").rglob(module))  # wherever the reader lives
        found = re.findall(r"wbfe\[(\w+)\]", path.read_text(encoding="utf-8"))
        assert found, module
        for extra in found:
            assert fmt in table[extra], (module, extra, table[extra])


def test_the_readmes_other_figures_come_from_files() -> None:
    """Beyond the install table, the README's one measured figure is the fixture's test accuracy,
    which the fixture's own training record holds; no timing is written into it."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    record = json.loads((ROOT / "fixtures" / "fmnist-cnn" / "model.json").read_text(encoding="utf-8"))
    assert f"test accuracy\n{record['test_accuracy']} %" in readme or f"test accuracy {record['test_accuracy']} %" in readme
    prose = re.sub(r"```.*?```", " ", readme, flags=re.S)  # console output and commands
    gen = _install_doc()
    prose = prose[:prose.index(gen.BEGIN)] + prose[prose.index(gen.END):]
    timings = re.findall(rf"{_NUM}\s*(?:ms|µs|s|min)(?![A-Za-z])|{_NUM}\s*[×x](?!\s*\d)(?![\w])", prose)
    assert timings == [], timings
