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
