"""docs/ stays true to the code: every test math.md cites exists, its sections keep their numbers,
every module architecture.md names exists, and metrics.md documents every column wbfe writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _text(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def test_math_sections_keep_their_numbers() -> None:
    # Code and README cite "§N"; the numbering must not move.
    headings = re.findall(r"^## (\d+)\. ", _text("math.md"), flags=re.M)
    assert headings == [str(i) for i in range(1, 8)]


@pytest.mark.parametrize("page", ["math.md", "metrics.md", "architecture.md"])
def test_cited_tests_exist(page: str) -> None:
    cited = re.findall(r"`(tests/[\w/]+\.py)::(test_\w+)`", _text(page))
    if page == "math.md":
        assert len(cited) >= 80  # every formula names its check
    for path, name in cited:
        source = (ROOT / path).read_text(encoding="utf-8")
        assert re.search(rf"^def {name}\(", source, flags=re.M), f"{page} cites {path}::{name}, which does not exist"


@pytest.mark.parametrize("page", ["math.md", "architecture.md"])
def test_named_modules_exist(page: str) -> None:
    named = set(re.findall(r"`((?:wbfe|cli)/[\w/]+\.py)", _text(page)))
    assert named
    missing = sorted(p for p in named if not (ROOT / p).is_file())
    assert missing == []


def test_every_output_column_is_documented(tmp_path: Path) -> None:
    import wbfe

    result = wbfe.score(wbfe.default_checkpoint(), metrics="bfe,htsr,htmp,rand")
    data = json.loads(result.to_json())
    documented = set(re.findall(r"`([a-z_0-9]+)`", _text("metrics.md")))
    columns = {key for row in data["layers"] for key in row} | {key for row in data["skipped"] for key in row}
    columns |= set(data["model"])
    summary = set(data["summary"])
    for key in sorted(summary):
        base = re.sub(r"_(head|mean|n)$", "", key)
        if base != key and base not in ("bfe", "rand") and base not in documented:
            pytest.fail(f"summary key {key}: column {base} is not in docs/metrics.md")
    main = re.search(r"The main columns are (.*?)\.\n", _text("metrics.md"), flags=re.S)
    assert main is not None
    listed = set(re.findall(r"`([a-z_0-9]+)`", main.group(1))) - {"bfe", "htsr", "htmp", "rand"} | {"bfe"}
    summarised = {re.sub(r"_head$", "", k) for k in summary if k.endswith("_head") and k != "head"}
    assert summarised <= listed, f"main columns missing from docs/metrics.md: {sorted(summarised - listed)}"
    undocumented = sorted((columns | {k for k in summary if not re.search(r"_(head|mean|n)$", k)}) - documented)
    assert undocumented == []


def test_code_cites_the_repositorys_own_math_page() -> None:
    """Every "math.md §N" the code, README and docs cite names a section that docs/math.md has; none
    cites the design notes that live outside the repository (users never see them)."""
    sections = set(re.findall(r"^## (\d+)\. ", _text("math.md"), flags=re.M))
    files = [ROOT / "README.md", *DOCS.glob("*.md"), *(ROOT / "wbfe").rglob("*.py"), *(ROOT / "cli").rglob("*.py")]
    cited: set[str] = set()
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert "MATH.md" not in text and "shared/design" not in text, path
        cited.update(re.findall(r"math\.md §(\d+)", text))
    assert cited and cited <= sections


# --- The README front page and the links between the pages ------------------------------------------

README = ROOT / "README.md"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", flags=re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks (a bash comment is no heading, code holds no link)."""
    return FENCE.sub("", text)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text lowercased, punctuation and symbols
    dropped (letters, digits, marks, '-' and '_' kept), each space a hyphen."""
    import unicodedata

    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link renders as its text
    text = text.replace("\\", "").lower()
    kept = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LNM")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, duplicates numbered -1, -2, ... as GitHub does."""
    seen: dict[str, int] = {}
    out = set()
    for match in re.finditer(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", _prose(path.read_text(encoding="utf-8")), flags=re.M):
        slug = github_slug(match.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    prose = INLINE_CODE.sub("", _prose(path.read_text(encoding="utf-8")))
    return [t for t in LINK.findall(prose) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


def test_github_slug_rules() -> None:
    # Checked against the anchors github.com gives these headings.
    assert github_slug("Scoring a checkpoint: `wbfe score`") == "scoring-a-checkpoint-wbfe-score"
    assert github_slug("One layer's spectrum: `wbfe esd`") == "one-layers-spectrum-wbfe-esd"
    assert github_slug("Randomised control: `--metrics rand`") == "randomised-control---metrics-rand"
    assert github_slug("6. Theory I: the Bayes-optimal extensive-width teacher–student model") == (
        "6-theory-i-the-bayes-optimal-extensive-width-teacherstudent-model")
    assert github_slug("LoRA adapters (`wbfe/adapters.py`, reader `wbfe/sources/peft_adapter.py`)") == (
        "lora-adapters-wbfeadapterspy-reader-wbfesourcespeft_adapterpy")


def test_anchors_number_duplicates(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("# A\n\n```bash\n# not a heading\n```\n\n## Options\n\n## Options\n", encoding="utf-8")
    assert anchors(page) == {"a", "options", "options-1"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    """Every relative link points at a file that exists, and every #anchor at a heading it has."""
    broken = []
    for target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: {dest.name} has no heading with that anchor")
    assert broken == []


def test_links_are_checked() -> None:
    # The checker sees the README's links to docs/ and the anchors between the pages.
    readme_links = relative_links(README)
    assert "docs/scoring.md" in readme_links and "docs/performance.md" in readme_links
    assert any("#" in t for p in DOCS.glob("*.md") for t in relative_links(p))


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    linked = {(README.parent / t.partition("#")[0]).resolve() for t in relative_links(README)}
    unlinked = sorted(p.name for p in DOCS.glob("*.md") if p.resolve() not in linked)
    assert unlinked == []


def test_readme_is_a_front_page() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 250


def _block_after(text: str, marker: str) -> list[str]:
    """The lines of the first fenced block after marker (what .ci/run's awk reads)."""
    rest = text[text.index(marker) + len(marker):]
    block = re.search(r"^```[^\n]*\n(.*?)^```", rest, flags=re.M | re.S)
    assert block is not None
    return block.group(1).splitlines()


def test_quick_start_commands_are_what_ci_runs() -> None:
    text = README.read_text(encoding="utf-8")
    assert _block_after(text, "<!-- ci: demo -->")[0] == (
        "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/wbfe score")
    assert _block_after(text, "<!-- ci: test -->")[0] == (
        "python3 -m venv .venv && .venv/bin/pip install -e '.[test,timm]' && .venv/bin/python -m pytest")
    # The base install has no torch; the CPU-only route of torch comes right before the command that installs it.
    cpu = text.index("pip install torch --index-url https://download.pytorch.org/whl/cpu")
    assert text.index("<!-- ci: demo -->") < cpu < text.index("<!-- ci: test -->")
    assert "torch" not in _block_after(text, "<!-- ci: demo -->")[0]


def test_readme_library_example_runs() -> None:
    """The README's "In Python" block is a doctest: it scores the shipped CNN and checks BFE-W of a
    matrix with equal eigenvalues against ½·log(2πe)."""
    import doctest

    text = README.read_text(encoding="utf-8")
    section = text[text.index("## In Python"):]
    code = re.search(r"^```python\n(.*?)^```", section, flags=re.M | re.S)
    assert code is not None and ">>>" in code.group(1)
    test = doctest.DocTestParser().get_doctest(code.group(1), {}, "README", str(README), 0)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    assert runner.failures == 0 and runner.tries >= 5


def test_readme_sample_output_is_the_real_output() -> None:
    """The rows and summary shown under "What `wbfe score` prints" are what the CLI prints today."""
    from typer.testing import CliRunner

    from wbfe_cli.main import app

    shown = README.read_text(encoding="utf-8").split("$ wbfe score\n", 1)[1].split("```", 1)[0]
    printed = CliRunner().invoke(app, ["score"]).stdout
    body = lambda out: [ln.rstrip() for ln in out.splitlines()[1:] if ln.strip()]  # noqa: E731  (the model line has the path)
    assert body(shown) == body(printed)


# --- Stated defaults match the code --------------------------------------------------------------

OPTION_PAGES = {"scoring.md": "score", "compare.md": "compare", "ranking.md": "rank", "watch.md": "watch",
                "pruning.md": "prune"}


def _default_groups() -> str:
    from wbfe.metrics import resolve_groups

    return ",".join(group.name for group in resolve_groups(None))


def _cli_defaults(command: str) -> dict[str, str]:
    import enum

    import typer

    from wbfe_cli.main import app

    params = typer.main.get_command(app).commands[command].params  # type: ignore[attr-defined]
    out = {}
    for p in params:
        value = p.default.value if isinstance(p.default, enum.Enum) else p.default
        for opt in p.opts:
            out[opt] = _default_groups() if opt == "--metrics" and value is None else str(value)
    return out


@pytest.mark.parametrize("page", sorted(OPTION_PAGES))
def test_option_tables_state_the_cli_defaults(page: str) -> None:
    """Each row of an options table that names one option and says "default X" says what
    `wbfe <command> --help` has."""
    defaults = _cli_defaults(OPTION_PAGES[page])
    checked, wrong = 0, []
    for row in re.findall(r"^\| (`[^|]*?(?:\\\|[^|]*?)*) \| (.*) \|$", _text(page), flags=re.M):
        options = set(re.findall(r"(--[a-z][a-z-]*)", row[0]))
        stated = re.search(r"default `?([\w.-]+(?:,[\w.-]+)*)", row[1])
        if len(options) != 1 or stated is None:
            continue
        (option,) = options
        checked += 1
        if defaults.get(option) != stated.group(1):
            wrong.append(f"{option}: docs say {stated.group(1)}, --help says {defaults.get(option)}")
    assert checked >= 2 and wrong == []


def test_metrics_default_is_stated_right_everywhere() -> None:
    # Issue 35: compare's default was documented as bfe,htsr,htmp; it is the scoring default.
    assert _default_groups() == "bfe,htsr"
    for path in PAGES:
        for stated in re.findall(r"--metrics`?[^|\n]{0,20}?default `([a-z,]+)`", path.read_text(encoding="utf-8")):
            assert stated == _default_groups(), path.name


# --- docs/performance.md is generated from benchmarks/results/ ------------------------------------


def _benchmark_script(name: str):  # type: ignore[no-untyped-def]
    """A script of benchmarks/ loaded as a module (benchmarks/ is no package of the install)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _generator():  # type: ignore[no-untyped-def]
    return _benchmark_script("make_performance_doc")


def test_performance_doc_is_the_generators_output() -> None:
    gen = _generator()
    assert (DOCS / "performance.md").read_text(encoding="utf-8") == gen.render(ROOT / "benchmarks" / "results"), (
        "docs/performance.md is out of date: run python benchmarks/make_performance_doc.py")


def test_performance_doc_reads_its_figures_from_the_results(tmp_path: Path) -> None:
    """Changed measurements change the page: the figures come from the files, not the template."""
    import shutil

    gen = _generator()
    results = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", results)
    vs = json.loads((results / "vs_weightwatcher.json").read_text(encoding="utf-8"))
    vs["models"]["synthetic"]["threads_1"]["speedup_default_vs_ww"] = 7.77
    (results / "vs_weightwatcher.json").write_text(json.dumps(vs), encoding="utf-8")
    memory = json.loads((results / "memory.json").read_text(encoding="utf-8"))
    memory["peak_rss_mb"] = 999.4
    (results / "memory.json").write_text(json.dumps(memory), encoding="utf-8")
    text = gen.render(results)
    assert "**7.8× / 3.5×**" in text and "peaks at **999 MB RSS**" in text
    assert text != (DOCS / "performance.md").read_text(encoding="utf-8")
    # --check says so, and rewriting makes it current again.
    out = tmp_path / "performance.md"
    out.write_text("stale", encoding="utf-8")
    assert gen.main(["--check", "--results", str(results), "--output", str(out)]) == 1
    assert gen.main(["--results", str(results), "--output", str(out)]) == 0
    assert gen.main(["--check", "--results", str(results), "--output", str(out)]) == 0


# --- docs/evidence.md is generated from benchmarks/results/evidence.json ---------------------------


def _evidence():  # type: ignore[no-untyped-def]
    return _benchmark_script("evidence")


def test_evidence_doc_is_the_generators_output() -> None:
    gen = _evidence()
    assert (DOCS / "evidence.md").read_text(encoding="utf-8") == gen.render(ROOT / "benchmarks" / "results" / "evidence.json"), (
        "docs/evidence.md is out of date: run python benchmarks/evidence.py --render")


def test_evidence_doc_reads_its_figures_from_the_results(tmp_path: Path) -> None:
    """Changed measurements change the page, its tables and its reading alike."""
    gen = _evidence()
    data = json.loads((ROOT / "benchmarks" / "results" / "evidence.json").read_text(encoding="utf-8"))
    # The statuses the rules gave, as scored: every dropout twin fails, every other model holds.
    for model in data["zoos"]["fmnist-dropout"]["views"]["module"]["models"]:
        assert model["status"] == ("fails" if "-drop" in model["model"] else "holds"), model["model"]
    assert {m["status"] for m in data["zoos"]["fmnist-dropout"]["views"]["file"]["models"]} == {"unknown"}
    cell = data["zoos"]["fmnist-dropout"]["views"]["module"]["metrics"]["bfe_head"]["fails"]
    cell.update(rho=-0.93, ci_low=-0.99, ci_high=-0.81)
    results = tmp_path / "evidence.json"
    results.write_text(json.dumps(data), encoding="utf-8")
    text = gen.render(results)
    assert "| `bfe_head` | " in text and "-0.93 [-0.99, -0.81]" in text
    assert "the two intervals overlap" in gen.render(ROOT / "benchmarks" / "results" / "evidence.json")
    # With the holds interval moved clear of the fails one, the reading says they no longer overlap.
    data["zoos"]["fmnist-dropout"]["views"]["module"]["metrics"]["bfe_head"]["holds"].update(
        rho=0.1, ci_low=-0.5, ci_high=0.6)
    results.write_text(json.dumps(data), encoding="utf-8")
    text = gen.render(results)
    assert "the two intervals do not overlap" in text and "+0.10 [-0.50, +0.60]" in text
    out = tmp_path / "evidence.md"
    out.write_text("stale", encoding="utf-8")
    assert gen.main(["--check", "--results", str(results), "--output", str(out)]) == 1
    assert gen.main(["--render", "--results", str(results), "--output", str(out)]) == 0
    assert gen.main(["--check", "--results", str(results), "--output", str(out)]) == 0
