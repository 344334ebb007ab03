"""``wbfe report``: the pages are parsed back and checked against the score / rank JSON they show.

Every layer and skipped tensor has its row, every number in a cell equals the JSON's (exactly: the
page keeps the full value in ``data-v``), every figure decodes, nothing in the page points outside
it, hostile tensor names stay text, and the ESD fits drawn are the table's parameters.
"""

from __future__ import annotations

import base64
import io
import json
import math
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

import wbfe
from wbfe.errors import CorruptCheckpointError, InvalidOptionError, OutputError
from wbfe.reporting import load_saved, rank_report, score_report, write_report
from wbfe.reporting.figures import esd_figure
from wbfe.reporting.markdown import render_markdown
from wbfe.reporting.model import read_eigenvalues, unusual_layers
from wbfe.reporting.page import render_html
from wbfe.reporting.text import visible
from wbfe_cli.main import app

runner = CliRunner()
HOSTILE = 'blocks.1.<script>alert("x")</script>\x1b[31m\u0007.weight'


# ----------------------------------------------------------------------------- parsing the page


class Page(HTMLParser):
    """Tables (cells with their text and attributes), images, every attribute, script/style bodies."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, dict[str, Any]] = {}
        self.images: list[dict[str, str]] = []
        self.attributes: list[tuple[str, str, str]] = []
        self.tags: list[str] = []
        self.scripts: list[str] = []
        self.text: list[str] = []
        self._table: Optional[dict[str, Any]] = None
        self._cell: Optional[dict[str, Any]] = None
        self._in_head = False
        self._script = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, Optional[str]]]) -> None:
        a = {k: (v or "") for k, v in attrs}
        self.tags.append(tag)
        self.attributes += [(tag, k, v) for k, v in a.items()]
        if tag == "table":
            self._table = {"header": [], "rows": [], "attrs": a}
            self.tables[a.get("id", "")] = self._table
        elif tag == "thead":
            self._in_head = True
        elif tag == "tbody":
            self._in_head = False
        elif tag == "tr" and self._table is not None and not self._in_head:
            self._table["rows"].append({"attrs": a, "cells": []})
        elif tag in ("td", "th") and self._table is not None:
            self._cell = {"attrs": a, "text": ""}
        elif tag == "img":
            self.images.append(a)
        elif tag == "script":
            self._script = True
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._table is not None:
            if tag == "th" and self._in_head:
                self._table["header"].append(self._cell)
            else:
                self._table["rows"][-1]["cells"].append(self._cell)
            self._cell = None
        elif tag == "table":
            self._table = None
        elif tag == "script":
            self._script = False

    def handle_data(self, data: str) -> None:
        if self._script:
            self.scripts[-1] += data
        elif self._cell is not None:
            self._cell["text"] += data
        self.text.append(data)

    def column(self, table: str, key: str) -> list[dict[str, Any]]:
        t = self.tables[table]
        keys = [h["attrs"].get("data-key") for h in t["header"]]
        i = keys.index(key)
        return [row["cells"][i] for row in t["rows"]]


def decode_image(src: str) -> str:
    """Decode a data: URI image; returns its kind. Fails the test when it does not decode."""
    match = re.fullmatch(r"data:(image/svg\+xml|image/png);base64,([A-Za-z0-9+/=]+)", src)
    assert match, src[:80]
    data = base64.b64decode(match.group(2), validate=True)
    if match.group(1) == "image/png":
        from PIL import Image

        with Image.open(io.BytesIO(data)) as im:
            im.verify()
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            assert im.size[0] > 100 and im.size[1] > 100
        return "png"
    root = ET.fromstring(data)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    # Inside the figure, too, nothing refers outside it (links are to its own #ids only).
    for element in root.iter():
        for name, value in element.attrib.items():
            if name.endswith("href"):
                assert value.startswith("#"), value
    assert len(list(root.iter())) > 20  # something is drawn
    return "svg"


def assert_self_contained(text: str, page: Page) -> None:
    """No address of any kind: no absolute URL anywhere in the source (an address in the provenance is
    text with its colon written as an entity), every src/href is a data: URI or an in-page anchor
    (so no scheme-relative one either); no <link>, <iframe>, <object>, <base>, no CSS url()/@import."""
    assert "://" not in text
    assert not re.search(r"(?i)\b(?:https?|ftp|wss?|file):", text)
    for tag, name, value in page.attributes:
        if name in ("src", "href", "action", "srcset", "poster", "data"):
            assert value.startswith("data:") or value.startswith("#"), (tag, name, value[:60])
    assert not {"link", "iframe", "object", "embed", "base", "frame", "audio", "video"} & set(page.tags)
    assert "url(" not in text.replace("data:", "") and "@import" not in text
    assert "default-src 'none'" in text  # the page's CSP forbids any fetch in a browser


# ----------------------------------------------------------------------------- a model's page


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for i in range(6):
        state[f"blocks.{i}.fc.weight"] = torch.randn(48, 96, generator=g) / 10
        state[f"blocks.{i}.fc.bias"] = torch.zeros(48)
    state["blocks.3.fc.weight"] = state["blocks.3.fc.weight"] * 25.0  # the planted outlier
    state[HOSTILE] = torch.randn(40, 64, generator=g) / 8
    state["conv.weight"] = torch.randn(16, 8, 3, 3, generator=g) / 5
    state["proj.weight"] = torch.randn(40, 40, generator=g) / 7  # square: HTMP columns null, with a reason
    state["steps"] = torch.tensor([3, 4], dtype=torch.int64)
    state["classifier.weight"] = torch.randn(10, 48, generator=g) / 6
    return state


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / "model.safetensors"
    # An address in the metadata reaches the provenance: it must stay text, not a URL of the page.
    save_file(_state(), str(path), metadata={"source_repo": "https://example.org/org/model", "note": "<b>x</b>"})
    return path


@pytest.fixture(scope="module")
def scored(model_file: Path) -> dict[str, Any]:
    return wbfe.score(model_file, metrics=("bfe", "htsr", "htmp")).to_dict()


@pytest.fixture(scope="module")
def page_text(model_file: Path, scored: dict[str, Any]) -> str:
    return render_html(score_report(scored, spectra_from=model_file))


def test_every_layer_row_and_number_equals_the_json(scored: dict[str, Any], page_text: str) -> None:
    page = Page(page_text)
    layers = scored["layers"]
    names = [c["text"] for c in page.column("t-layers", "name")]
    assert names == [visible(layer["name"]) for layer in layers]
    keys = [h["attrs"]["data-key"] for h in page.tables["t-layers"]["header"]]
    numeric = 0
    for column in keys:
        if column in ("#", "note", "shape") or not any(column in layer for layer in layers):
            continue
        for cell, layer in zip(page.column("t-layers", column), layers):
            want = layer.get(column)
            if want is None:
                assert "data-null" in cell["attrs"], (layer["name"], column)
            elif isinstance(want, (int, float)) and not isinstance(want, bool):
                assert float(cell["attrs"]["data-v"]) == want, (layer["name"], column)  # exact, not rounded
                numeric += 1
            else:
                assert cell["text"] == visible(want if not isinstance(want, bool) else json.dumps(want))
    assert numeric >= 30 * len(layers)  # every metric column is in the page (the extra ones hidden)
    shapes = [c["text"] for c in page.column("t-layers", "shape")]
    assert shapes == ["x".join(map(str, layer["shape"])) for layer in layers]
    # the null cells' reasons are in the row's note
    notes = [c["text"] for c in page.column("t-layers", "note")]
    assert sum(len(layer["reasons"]) for layer in layers) >= 8
    for note, layer in zip(notes, layers):
        for column, reason in layer["reasons"].items():
            named = [part for part in note.split("; ") if part.endswith(": " + visible(reason))]
            assert len(named) == 1 and column in named[0].split(": ")[0].split(", ")
    # the summary: head, each metric's head value and mean, and its expected sign
    summary = scored["summary"]
    assert f"Head: {summary['head']}" in "".join(page.text) and summary["head_source"] == "name"
    metrics = [c["text"] for c in page.column("t-summary", "metric")]
    assert metrics[:2] == ["bfe", "alpha"] and "htmp_kappa" in metrics
    for cell, metric in zip(page.column("t-summary", "head"), metrics):
        assert float(cell["attrs"]["data-v"]) == summary[f"{metric}_head"]
    for cell, metric in zip(page.column("t-summary", "mean"), metrics):
        assert float(cell["attrs"]["data-v"]) == summary[f"{metric}_mean"]
    signs = dict(zip(metrics, [c["text"] for c in page.column("t-summary", "sign")]))
    assert signs["bfe"].startswith("lower is better") and signs["entropy"] == "no expected direction"


def test_every_skipped_tensor_with_its_reason(scored: dict[str, Any], page_text: str) -> None:
    page = Page(page_text)
    names = [c["text"] for c in page.column("t-skipped", "name")]
    reasons = [c["text"] for c in page.column("t-skipped", "reason")]
    assert len(scored["skipped"]) == 7  # six biases and one integer tensor, all listed
    assert list(zip(names, reasons)) == [(s["name"], s["reason"]) for s in scored["skipped"]]


def test_every_image_decodes_and_nothing_points_outside(page_text: str) -> None:
    page = Page(page_text)
    kinds = [decode_image(img["src"]) for img in page.images]
    assert kinds == ["svg"] * len(kinds) and len(kinds) == 1 + 1 + 5  # depth, head, five unusual layers
    assert_self_contained(page_text, page)
    assert len(page.scripts) == 1 and "data-wbfe-ready" in page.scripts[0]
    assert "https://example.org/org/model" in "".join(page.text)  # shown, as text


def test_hostile_tensor_name_stays_text(scored: dict[str, Any], page_text: str) -> None:
    assert HOSTILE in [layer["name"] for layer in scored["layers"]]
    assert "<script>alert" not in page_text and "\x1b" not in page_text and "\x07" not in page_text
    page = Page(page_text)
    assert page.tags.count("script") == 1
    shown = visible(HOSTILE)
    assert shown == 'blocks.1.<script>alert("x")</script>\\x1b[31m\\x07.weight'
    assert shown in [c["text"] for c in page.column("t-layers", "name")]
    text, _ = render_markdown(score_report(scored))
    assert "<script>" not in text and "\x1b" not in text
    assert "&lt;script&gt;alert" in text


def test_the_planted_outlier_is_the_most_unusual_layer(scored: dict[str, Any]) -> None:
    layers = scored["layers"]
    metrics = ["bfe", "log_norm", "alpha"]
    picked = unusual_layers(layers, metrics, 3)
    assert picked[0][0] == "blocks.3.fc.weight"

    # its robust z by hand: max over the metrics of |x - median| / (1.4826 * MAD)
    def z(metric: str, name: str) -> float:
        values = np.array([layer[metric] for layer in layers])
        x = [layer[metric] for layer in layers if layer["name"] == name][0]
        med = np.median(values)
        return float(abs(x - med) / (1.4826 * np.median(np.abs(values - med))))

    best = max(metrics, key=lambda m: z(m, "blocks.3.fc.weight"))
    assert picked[0][1].startswith(f"{best} = ") and picked[0][1].endswith(f"robust z = {z(best, 'blocks.3.fc.weight'):.1f})")
    order = sorted({layer["name"] for layer in layers}, key=lambda n: -max(z(m, n) for m in metrics))
    assert [name for name, _ in picked] == order[:3]


def test_eigenvalues_reread_equal_numpy(model_file: Path, scored: dict[str, Any]) -> None:
    state = _state()
    got = read_eigenvalues(model_file, ["blocks.0.fc.weight", "conv.weight", "nope"], scored["model"]["options"])
    assert set(got) == {"blocks.0.fc.weight", "conv.weight"}
    for name, (eigs, k) in got.items():
        assert k == 0  # weights near 1: stored true
        w = state[name].double().reshape(state[name].shape[0], -1).numpy()
        small = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
        want = np.sort(np.linalg.eigvalsh(small))
        np.testing.assert_allclose(np.sort(eigs), want, rtol=1e-9, atol=1e-9 * want.max())


def test_esd_fits_drawn_are_the_tables_parameters(model_file: Path, scored: dict[str, Any]) -> None:
    """The power-law line is powerlaw's Power_Law pdf (an independent implementation) at the table's
    alpha and xmin, scaled to the tail's share; the HTMP line is the HTMP density at the table's κ, β, τ."""
    import powerlaw as reference
    from wbfe.metrics import htmp

    row = [layer for layer in scored["layers"] if layer["name"] == "blocks.0.fc.weight"][0]
    eigs, k = read_eigenvalues(model_file, [row["name"]], scored["model"]["options"])[row["name"]]
    assert k == 0
    fig = esd_figure(eigs, row, title="t")
    lines = {line.get_label(): line for line in fig.axes[0].get_lines()}
    x, y = lines["power law"].get_data()
    share = np.count_nonzero(eigs >= row["xmin"]) / np.count_nonzero(eigs > 0)
    dist = reference.Power_Law(xmin=row["xmin"], parameters=[row["alpha"]], discrete=False)
    np.testing.assert_allclose(y, share * dist.pdf(x), rtol=1e-10)
    assert x.min() >= row["xmin"]
    x, y = lines["HTMP"].get_data()
    np.testing.assert_allclose(y, htmp.pdf(x, row["htmp_kappa"], row["gamma"], row["htmp_beta"], row["htmp_tau"]),
                               rtol=1e-12)
    # and the histogram integrates to 1 over the positive eigenvalues
    hx, hy = lines[f"ESD (n = {eigs.size})"].get_data()
    assert 0 < hy.max() and np.all(np.isfinite(hy)) and len(hx) == len(hy)


def test_same_input_same_page(model_file: Path, scored: dict[str, Any], page_text: str) -> None:
    assert render_html(score_report(scored, spectra_from=model_file)) == page_text


def test_markdown_folder_has_the_same_content(tmp_path: Path, model_file: Path, scored: dict[str, Any]) -> None:
    out = tmp_path / "card"
    written = write_report(score_report(scored, spectra_from=model_file), out, fmt="md")
    text = (out / "report.md").read_text(encoding="utf-8")
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(links) == 7 and sorted(links) == sorted(p.name for p in written[1:])
    from PIL import Image

    for link in links:
        with Image.open(out / link) as im:
            im.verify()
    assert "://" not in text
    for layer in scored["layers"]:
        assert f"| {layer['name'].replace('_', chr(92) + '_')} |" in text or "script" in layer["name"]
    for skip in scored["skipped"]:
        assert skip["reason"].split(" (")[0] in text.replace("\\", "")
    assert f"{scored['summary']['bfe_head']:.4f}" in text


# ----------------------------------------------------------------------------- CLI and saved JSON


def test_cli_from_checkpoint_and_from_saved_json(tmp_path: Path, model_file: Path) -> None:
    saved = tmp_path / "score.json"
    assert runner.invoke(app, ["score", str(model_file), "--format", "json", "-o", str(saved)]).exit_code == 0
    result = runner.invoke(app, ["report", str(model_file), "-o", str(tmp_path / "a.html")])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["report", str(saved), "-o", str(tmp_path / "b.html")])
    assert result.exit_code == 0, result.output
    a, b = (tmp_path / "a.html").read_text(), (tmp_path / "b.html").read_text()
    assert "ESDs unavailable" in b and "--weights" in b and "ESDs unavailable" not in a
    assert len(Page(a).images) == 7 and len(Page(b).images) == 1
    result = runner.invoke(app, ["report", str(saved), "--weights", str(model_file), "-o", str(tmp_path / "c.html")])
    assert result.exit_code == 0 and (tmp_path / "c.html").read_text() == a


def test_cli_bad_input_exits_2_with_one_line(tmp_path: Path, model_file: Path) -> None:
    other = tmp_path / "other.safetensors"
    save_file(_state(seed=1), str(other))
    saved = tmp_path / "score.json"
    runner.invoke(app, ["score", str(model_file), "--format", "json", "-o", str(saved)])
    cases = [
        (["report", str(saved), "--weights", str(other)], "not the checkpoint it scored"),
        (["report", str(tmp_path / "missing.safetensors")], ""),
    ]
    broken = tmp_path / "broken.json"
    broken.write_text('{"model": {}, "layers": 3, "skipped": [], "summary": {}}')
    cases.append((["report", str(broken)], "malformed wbfe JSON"))
    other_json = tmp_path / "other.json"
    other_json.write_text("[1, 2]")
    cases.append((["report", str(other_json)], "neither a score, a rank nor a compare JSON"))
    both = tmp_path / "both.json"  # was drawn as a score page, the kind first in load_saved's table
    both.write_text(json.dumps({**json.loads(saved.read_text()), "model_a": {}, "model_b": {}, "unmatched": []}))
    cases.append((["report", str(both)], "holds the fields of a score and a compare JSON; wbfe writes one kind a file"))
    for args, message in cases:
        out = tmp_path / "never.html"
        result = runner.invoke(app, args + ["-o", str(out)])
        assert result.exit_code == 2, (args, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("wbfe: error:") and message in lines[0]
        assert not out.exists()


def test_cli_output_checked_before_work_and_stdout(tmp_path: Path, model_file: Path) -> None:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    result = runner.invoke(app, ["report", str(tmp_path / "missing.safetensors"), "-o", str(folder)])
    assert result.exit_code == 2 and "not a regular file" in result.stderr  # the output, not the missing input
    (tmp_path / "a-file").write_text("x")
    result = runner.invoke(app, ["report", str(model_file), "--format", "md", "-o", str(tmp_path / "a-file")])
    assert result.exit_code == 2 and "not a folder" in result.stderr
    result = runner.invoke(app, ["report", str(model_file), "-o", "-"])
    assert result.exit_code == 0 and result.stdout.startswith("<!DOCTYPE html>")
    assert len(Page(result.stdout).tables["t-layers"]["rows"]) == 10


@pytest.mark.parametrize("name,fmt,text", [
    ("r.md", "html", "--format html writes one HTML page: name the output *.html, not "),
    ("r.png", "html", "name the output *.html"),
    ("r.html", "md", "the results are several files; name a folder, not a .html file"),
    ("r.MD", "md", "name a folder, not a .md file"),
])
def test_the_library_refuses_an_output_named_for_another_format(name: str, fmt: str, text: str, tmp_path: Path,
                                                                 scored: dict[str, Any]) -> None:
    # only the command line refused these: write_report wrote an HTML page into r.md, a folder named r.html
    from wbfe.reporting.output import check_report_output

    with pytest.raises(OutputError, match=re.escape(text)) as caught:
        check_report_output(tmp_path / name, fmt)
    assert caught.value.path == str(tmp_path / name)  # type: ignore[attr-defined]
    assert "\n" not in str(caught.value)
    with pytest.raises(OutputError, match=re.escape(text)):
        write_report(score_report(scored), tmp_path / name, fmt=fmt)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name,text", [
    ("e.txt", "wbfe esd writes a PNG file: name the output *.png, not "),
    ("e.html", "name the output *.png"),
    ("-", "wbfe esd writes a PNG file; give --output a file name, not -"),
])
def test_the_library_refuses_an_esd_output_that_is_no_png_file(name: str, text: str, tmp_path: Path) -> None:
    # only `wbfe esd` refused these: plot_esd wrote a PNG into e.txt (write_esd is the library's checked writer)
    from wbfe.reporting import write_esd
    from wbfe.reporting.output import check_esd_output
    from wbfe.reporting.plots.esd import fit_esd

    out = name if name == "-" else tmp_path / name
    eigs = np.geomspace(0.1, 10.0, 80)
    with pytest.raises(OutputError, match=re.escape(text)):
        check_esd_output(out)
    with pytest.raises(OutputError, match=re.escape(text)):
        write_esd(eigs, fit_esd(eigs, 0.5), out)
    assert list(tmp_path.iterdir()) == []
    written = write_esd(eigs, fit_esd(eigs, 0.5), tmp_path / "E.PNG")
    assert written == tmp_path / "E.PNG" and written.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("bins", [0, 1, -3, 2.5, True])
def test_an_esd_with_fewer_than_two_bins_is_refused(bins: Any, tmp_path: Path) -> None:
    # bins=0 drew the default bins without a word, -3 and 2.5 raised from numpy
    from wbfe.reporting.plots.esd import esd_figure, fit_esd, plot_esd

    eigs = np.geomspace(0.1, 10.0, 50)
    with pytest.raises(InvalidOptionError, match=re.escape(f"bins must be an integer of at least 2, not {bins!r}")):
        plot_esd(eigs, fit_esd(eigs, 0.5), tmp_path / "e.png", bins=bins)
    assert list(tmp_path.iterdir()) == []
    assert esd_figure(eigs, {}, title="t", bins=2).axes[0].lines[0].get_xdata().size == 2  # two bins, both hit


def test_cli_ranks_a_zoo_file(tmp_path: Path) -> None:
    lines = ["model,acc"]
    for i, acc in enumerate([70.0, 80.0, 75.0, 90.0]):
        save_file(_state(seed=i + 10), str(tmp_path / f"m{i}.safetensors"))
        lines.append(f"m{i}.safetensors,{acc}")
    (tmp_path / "zoo.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "zoo.html"
    result = runner.invoke(app, ["report", str(tmp_path / "zoo.csv"), "--quality", "acc", "--no-cache",
                                 "--metrics", "bfe", "-o", str(out)])
    assert result.exit_code == 0, result.output
    page = Page(out.read_text())
    assert [c["text"] for c in page.column("t-models", "model")] == [f"m{i}.safetensors" for i in range(4)]
    bfe = [float(c["attrs"]["data-v"]) for c in page.column("t-models", "bfe_head")]
    want = [wbfe.score(tmp_path / f"m{i}.safetensors", metrics="bfe").summary["bfe_head"] for i in range(4)]
    assert bfe == want


def test_load_saved_refuses_garbage(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(CorruptCheckpointError):
        load_saved(bad)
    assert load_saved(tmp_path / "model.safetensors") is None


# ----------------------------------------------------------------------------- a zoo's page

QUALITY = [61.0, 64.5, 70.25, 71.0, 75.5, 80.0]


def _zoo(tmp_path: Path) -> Path:
    lines = ["model,test_accuracy,source"]
    for i, q in enumerate(QUALITY + [90.0]):
        (tmp_path / f"m{i}.txt").write_text(str(i))
        lines.append(f"m{i}.txt,{q},synthetic")
    spec = tmp_path / "zoo.csv"
    spec.write_text("\n".join(lines) + "\n")
    return spec


def _scorer(ref: str, options: Any) -> dict[str, Any]:
    i = int(Path(ref).read_text())
    if i == 6:
        raise CorruptCheckpointError("m6.txt: header truncated <b>")
    return {"summary": {"bfe_head": 3.0 - 0.1 * i + 0.05 * (i % 2), "bfe_mean": float(i % 3),
                        "alpha_mean": 2.0 + 0.5 * i, "h_head": math.nan},
            "model": {"sha256": f"{i:064x}"}}


def test_zoo_page_correlations_scatters_and_failures(tmp_path: Path) -> None:
    result = wbfe.rank(_zoo(tmp_path), quality="test_accuracy", cache_dir=False, scorer=_scorer,
                       hasher=lambda ref: ref, n_boot=300)
    data = result.to_dict()
    text = render_html(rank_report(result))
    page = Page(text)
    metrics = [c["text"] for c in page.column("t-correlations", "metric")]
    assert metrics == [m["metric"] for m in data["metrics"]]
    for key in ("rho", "ci_low", "ci_high", "p_value", "kendall_tau", "pearson_r", "n"):
        for cell, row in zip(page.column("t-correlations", key), data["metrics"]):
            if row[key] is None:
                assert "data-null" in cell["attrs"]
            else:
                assert float(cell["attrs"]["data-v"]) == row[key]
    agrees = dict(zip(metrics, [c["text"] for c in page.column("t-correlations", "agrees")]))
    assert agrees["bfe_head"] == "yes"  # ρ < 0 here, and BFE-W's expected sign is −1
    assert agrees["alpha_mean"] == "no (opposite sign)"
    models = [c["text"] for c in page.column("t-models", "model")]
    assert models == [m["model"] for m in data["models"]] and len(models) == 6
    for cell, m in zip(page.column("t-models", "quality"), data["models"]):
        assert float(cell["attrs"]["data-v"]) == m["quality"]
    failed = page.tables["t-failed"]["rows"]
    assert [[c["text"] for c in r["cells"]] for r in failed] == [["m6.txt", "CorruptCheckpointError: m6.txt: header truncated <b>"]]
    kinds = [decode_image(img["src"]) for img in page.images]
    assert len(kinds) == 1 + len(data["metrics"])  # the forest plot and one scatter per metric
    assert_self_contained(text, page)
    # the saved rank JSON gives the same page, byte for byte
    saved = tmp_path / "rank.json"
    saved.write_text(result.to_json())
    kind, loaded = load_saved(saved)  # type: ignore[misc]
    assert kind == "rank" and render_html(rank_report(loaded)) == text
    out = tmp_path / "zoo.html"
    assert runner.invoke(app, ["report", str(saved), "-o", str(out)]).exit_code == 0
    assert out.read_text() == text


def test_zoo_page_and_wbfe_rank_write_rho_and_its_interval_alike(tmp_path: Path, monkeypatch) -> None:
    """The scatter's caption on the zoo page and its title in `wbfe rank --output`: one text for ρ, its interval
    and p ("n/a" where not finite: h_head is NaN for every model here)."""
    from wbfe.reporting.plots import ranking

    result = wbfe.rank(_zoo(tmp_path), quality="test_accuracy", cache_dir=False, scorer=_scorer,
                       hasher=lambda ref: ref, n_boot=300)
    text = render_html(rank_report(result))
    figures: list = []

    def keep(fig, path):  # noqa: ANN001, ANN202
        figures.append(fig)
        return path

    monkeypatch.setattr(ranking, "save", keep)

    def two(value: float) -> str:
        return f"{value:+.2f}" if math.isfinite(value) else "n/a"

    assert any(not math.isfinite(row.rho) for row in result.metrics)
    for row in result.metrics:
        rho = f"ρ = {two(row.rho)} [{two(row.ci_low)}, {two(row.ci_high)}]"
        p = f"{row.p_value:.2g}" if math.isfinite(row.p_value) else "n/a"
        assert f"{row.metric}: {rho}, n = {row.n}, p = {p}" in text
        ranking.plot_metric(result, row.metric, tmp_path / "x.png")
        assert figures[-1].axes[0].get_title() == f"{result.zoo}: {rho}, p = {p}, n = {row.n}"


def test_zoo_scatter_labels_do_not_overlap(tmp_path: Path) -> None:
    from wbfe.reporting.figures import scatter_figure

    xs = list(np.linspace(0, 1, 30))
    ys = [x + 0.001 * i for i, x in enumerate(xs)]
    fig = scatter_figure(xs, ys, [f"model-number-{i}" for i in range(30)], metric="bfe_head", quality="acc",
                         title="t", max_labels=30)
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in fig.axes[0].texts]
    assert 2 <= len(boxes) < 30  # some fit, the crowded ones are left out
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b)


# ----------------------------------------------------------------------------- a comparison's page


@pytest.mark.parametrize("changed", [True, False])
def test_change_along_depth_draws_each_matrix_at_its_own_place(tmp_path: Path, monkeypatch, changed: bool) -> None:
    """Each panel's markers are the matrices with a value to draw, at their own x (the relative change only where
    positive, on a log scale). The role mask was an int array (~True is -2), which indexed x[0], x[1]: the changed
    matrix was never drawn and matplotlib warned "Data has no positive values". No matrix changed: the relative
    change is drawn on a linear scale, and the panel says so."""
    import warnings

    import wbfe.reporting.plots.compare as compare_plot

    state_a = _state()
    state_b = {k: v.clone() for k, v in state_a.items()}
    if changed:
        state_b["blocks.2.fc.weight"] += torch.randn(48, 96, generator=torch.Generator().manual_seed(5)) / 5
    result = wbfe.compare(state_a, state_b)
    figures: list[Any] = []

    def keep(fig: Any, path: Any, **kw: Any) -> Any:
        figures.append(fig)
        return path

    monkeypatch.setattr(compare_plot, "save", keep)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compare_plot.plot_change_along_depth(result, tmp_path / "p.png")
    top, bottom = figures[0].axes
    rows = result.layers
    with_depth = all(row.get("depth") is not None for row in rows)
    x = [row["depth"] if with_depth else i for i, row in enumerate(rows)]

    def drawn(ax: Any) -> list[tuple[float, float]]:
        return sorted((float(a), float(b)) for c in ax.collections for a, b in c.get_offsets())

    frob = [(x[i], row["rel_frobenius"]) for i, row in enumerate(rows)]
    if changed:
        assert top.get_yscale() == "log" and not top.texts
        assert drawn(top) == sorted((a, b) for a, b in frob if b > 0) and len(drawn(top)) == 1
    else:
        assert top.get_yscale() == "linear"
        assert [t.get_text() for t in top.texts] == ["no positive values: drawn on a linear scale"]
        assert drawn(top) == sorted(frob) and {b for _, b in frob} == {0.0}
    assert drawn(bottom) == sorted((x[i], row["w1_log_eigs"]) for i, row in enumerate(rows))


def test_comparison_page_rows_numbers_and_unmatched(tmp_path: Path) -> None:
    state_a = _state()
    state_b = {k: v.clone() for k, v in state_a.items()}
    g = torch.Generator().manual_seed(5)
    state_b["blocks.2.fc.weight"] += torch.randn(48, 96, generator=g) / 5  # the changed one
    state_b["extra.weight"] = torch.randn(12, 30, generator=g)  # only in B
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file(state_a, str(a))
    save_file(state_b, str(b))
    folder = tmp_path / "cmp"
    result = runner.invoke(app, ["compare", str(a), str(b), "--format", "json", "-o", str(folder)])
    assert result.exit_code == 0, result.output
    saved = folder / "compare.json"
    data = json.loads(saved.read_text())
    assert load_saved(saved)[0] == "compare"  # type: ignore[index]
    out = tmp_path / "c.html"
    assert runner.invoke(app, ["report", str(saved), "-o", str(out)]).exit_code == 0
    text = out.read_text()
    page = Page(text)
    names = [c["text"] for c in page.column("t-layers", "name")]
    assert names == [visible(row["name"]) for row in data["layers"]]
    for key in ("rel_frobenius", "w1_log_eigs", "overlap_in", "d_bfe", "d_alpha"):
        for cell, row in zip(page.column("t-layers", key), data["layers"]):
            if row.get(key) is None:
                assert "data-null" in cell["attrs"]
            else:
                assert float(cell["attrs"]["data-v"]) == row[key]
    changed = [c for c, n in zip(page.column("t-layers", "rel_frobenius"), names) if n == "blocks.2.fc.weight"]
    assert float(changed[0]["attrs"]["data-v"]) > 0.1
    assert [c["text"] for c in page.column("t-unmatched", "name")] == [u["name"] for u in data["unmatched"]]
    assert "extra.weight" in [u["name"] for u in data["unmatched"]]
    assert [c["text"] for c in page.column("t-skipped", "reason")] == [s["reason"] for s in data["skipped"]]
    top = page.tables["t-summary-most_changed"]["rows"][0]["cells"]
    assert top[0]["text"] == "blocks.2.fc.weight" == data["summary"]["most_changed"][0]["name"]
    assert [decode_image(img["src"]) for img in page.images] == ["svg"]
    assert_self_contained(text, page)
    # straight from the two checkpoints: the same page
    direct = tmp_path / "d.html"
    result = runner.invoke(app, ["report", str(a), str(b), "-o", str(direct)])
    assert result.exit_code == 0, result.output
    assert direct.read_text() == text
    # `wbfe compare --output DIR` writes the same page as DIR/report.html
    assert (folder / "report.html").read_text() == text


def test_a_comparison_page_reads_as_wbfe_compare_does(tmp_path: Path) -> None:
    # --stream went nowhere: `wbfe report A B --stream` read two local files (and downloaded a hub id) without a word
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    save_file({"fc.weight": torch.randn(24, 16)}, str(a))
    save_file({"fc.weight": torch.randn(24, 16)}, str(b))
    said = runner.invoke(app, ["compare", str(a), str(b), "--stream", "-q"])
    result = runner.invoke(app, ["report", str(a), str(b), "--stream", "-o", str(tmp_path / "r.html")])
    assert result.exit_code == said.exit_code == 2
    assert result.stderr == said.stderr and "--stream reads hub ids" in said.stderr
    assert not (tmp_path / "r.html").exists()


def test_one_colour_per_metric_everywhere(scored: dict[str, Any], page_text: str) -> None:
    """The depth panel, the zoo scatter, the forest plot, the table swatch and a comparison's d_<metric>
    all draw a metric in the same colour (and different metrics in different colours)."""
    from matplotlib.colors import to_hex

    from wbfe.reporting.figures import correlation_figure, depth_figure, scatter_figure
    from wbfe.reporting.metrics_info import colour

    metrics = ["bfe", "alpha", "log_norm", "htmp_kappa", "h", "f_inf", "entropy", "stable_rank"]
    assert len({colour(m) for m in metrics}) == len(metrics)
    fig = depth_figure(scored["layers"], metrics, head=None)
    drawn = [to_hex(ax.get_lines()[0].get_color()) for ax in fig.axes if ax.get_visible()]
    assert drawn == [colour(m) for m in metrics]
    for metric in ("bfe_head", "alpha_mean"):
        fig = scatter_figure([1.0, 2.0, 3.0], [3.0, 1.0, 2.0], ["a", "b", "c"], metric=metric, quality="q", title="t")
        assert to_hex(fig.axes[0].collections[0].get_facecolor()[0]) == colour(metric.rsplit("_", 1)[0])
    fig = correlation_figure([{"metric": "bfe_head", "rho": -0.5, "ci_low": -0.8, "ci_high": -0.1, "expected_sign": -1}])
    assert {to_hex(line.get_color()) for line in fig.axes[0].get_lines()[:2]} == {colour("bfe")}
    assert colour("d_alpha") == colour("alpha") == colour("alpha_mean")
    header = Page(page_text).tables["t-layers"]["header"]
    swatch = [h for h in header if h["attrs"].get("data-key") == "alpha"][0]
    assert f'data-key="alpha" title="{meaning_of("alpha")}"><span class="sw" style="background:{colour("alpha")}">' \
        in page_text and swatch["text"] == "alpha"


def meaning_of(metric: str) -> str:
    from wbfe.reporting.metrics_info import meaning
    from wbfe.reporting.page import esc

    return esc(meaning(metric))


@pytest.mark.parametrize("options", [{"conv": "flatten"}, {"conv": "slices"}, {"ww_compatible": True}])
def test_reread_spectra_are_the_scored_ones(model_file: Path, options: dict[str, Any]) -> None:
    """Under each convention the thumbnails' eigenvalues are the score's: same count, and their sum
    is the score's own `norm` column (Σ e)."""
    result = wbfe.score(model_file, metrics="htsr", layers="conv|blocks.0", **options).to_dict()
    names = [layer["name"] for layer in result["layers"]]
    got = read_eigenvalues(model_file, names, result["model"]["options"])
    for layer in result["layers"]:
        e, k = got[layer["name"]]
        assert e.size == layer["n_eigs"] and k == 0
        assert math.isclose(float(e.sum()), layer["norm"], rel_tol=1e-9)


def test_every_head_source_is_said_in_words_once(scored: dict[str, Any]) -> None:
    from wbfe.engine import heads
    from wbfe.reporting.metrics_info import HEAD_SOURCES

    # Every step the head finder records (its HeadChoice(..., "<source>") calls) has its sentence.
    written = set(re.findall(r'HeadChoice\([^"\n]*?,\s*"([a-z]+)"', Path(heads.__file__).read_text()))
    assert written == {"option", "framework", "config", "name", "structure", "tied"}
    assert written <= set(HEAD_SOURCES)
    for source in sorted(written) + ["something-new"]:
        summary = {**scored["summary"], "head_source": source}
        text, _ = render_markdown(score_report({**scored, "summary": summary}))
        line = next(line for line in text.splitlines() if line.startswith("Head: "))
        # Named once, at the end (Markdown escapes the underscore), never "head_source = x (head_source: x)".
        assert line.endswith(f"source: {source}).") and "source =" not in line, line
        assert line.count(f"source: {source}") == 1, line
        if source in HEAD_SOURCES:
            assert HEAD_SOURCES[source].replace("_", "\\_") in line


def test_a_constant_metric_marks_no_layer_unusual() -> None:
    # every layer alike (MAD and standard deviation 0): no robust z, so no layer is unusual by it
    layers = [{"name": f"l{i}", "bfe": 1.5, "alpha": float(i)} for i in range(5)]
    assert unusual_layers(layers, ["bfe"], 3) == []
    assert [name for name, _ in unusual_layers(layers, ["bfe", "alpha"], 1)] == ["l0"]  # |0 - 2| first of the two


def test_no_head_and_spectra_of_another_checkpoint_are_said(tmp_path: Path, scored: dict[str, Any]) -> None:
    """A score with no head says why; ESDs re-read from a checkpoint that lacks a layer, or holds another shape
    under its name, are not drawn and the page says which and why."""
    other = _state(seed=1)
    del other["blocks.3.fc.weight"]  # the planted outlier: an unusual layer the report wants
    other["classifier.weight"] = other["classifier.weight"][:8].contiguous()  # the head, with 8 rows for 10
    save_file(other, str(tmp_path / "other.safetensors"))
    summary = {**scored["summary"], "head": "classifier.weight"}
    text, _ = render_markdown(score_report({**scored, "summary": summary}, spectra_from=tmp_path / "other.safetensors"))
    note = next(line for line in text.splitlines() if "Not drawn" in line)
    assert "blocks.3.fc.weight (not found)" in note and "classifier.weight (8 eigenvalues, the score had 10)" in note
    no_head = {**scored["summary"], "head": None, "head_note": "no tensor is named like a classifier"}
    text, _ = render_markdown(score_report({**scored, "summary": no_head}))
    assert "No head: no tensor is named like a classifier." in text


def test_infinite_eigenvalues_are_said_not_drawn_as_one_value() -> None:
    """Eigenvalues past float64's range given as inf (the report once re-read them so, for weights near 2^600) were
    drawn as "fewer than 2 distinct positive eigenvalues" (inf == inf)."""
    eigs = np.full(10, np.inf)
    fig = esd_figure(eigs, {"name": "classifier.weight"}, title="t")
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.texts] == ["eigenvalues beyond float64's range:\n`wbfe esd` draws them × 2^k"]
    assert not ax.lines


@pytest.mark.parametrize("exponent", [0, 430, 600, -600])
def test_esd_thumbnails_of_weights_far_from_one_are_drawn(tmp_path: Path, monkeypatch, exponent: int) -> None:
    """The report re-reads the eigenvalues as the score stored them, with their power of two k: weights near 2^±600
    (true eigenvalues past float64's range: they were inf, "beyond float64's range") draw the ESD × 2^k; near 2^430
    (true ones near 1e260, float64 numbers: their histogram's bin centres overflowed) the true ones with the table's
    fits, as weights near 1 do. The caption's numbers are the table's."""
    import wbfe.reporting.model as model_page
    from wbfe.engine import layer_spectrum
    from wbfe.metrics import htmp

    w = np.random.default_rng(0).standard_t(3, (64, 32))
    path = tmp_path / "w.safetensors"
    save_file({"classifier.weight": torch.tensor(w * 2.0**exponent)}, str(path))
    figures: list[Any] = []
    draw = model_page.esd_figure

    def kept(*a: Any, **kw: Any) -> Any:
        figures.append(draw(*a, **kw))
        return figures[-1]

    monkeypatch.setattr(model_page, "esd_figure", kept)
    out = tmp_path / "card"
    result = runner.invoke(app, ["report", str(path), "--metrics", "htsr,htmp", "--format", "md", "-o", str(out),
                                 "--quiet"])
    assert result.exit_code == 0, result.stderr
    (ax,) = figures[0].axes
    assert not ax.texts  # drawn, not "beyond float64's range"
    _, spec = layer_spectrum(path, "classifier.weight")
    k = round(-spec.log_scale / math.log(2.0))
    drawn = k if abs(exponent) == 600 else 0  # float64 holds the true eigenvalues (× 2^0) only up to 2^±430
    assert (k != 0) == (exponent != 0)
    assert ax.get_xlabel() == "eigenvalue of the smaller Gram matrix" + (f" × 2^{drawn}" if drawn else "")
    # w·2^e's eigenvalues are w's × 4^e, drawn × 2^drawn: all between the smallest and largest
    low, high = np.ldexp(np.sort(np.linalg.svd(w, compute_uv=False) ** 2)[[0, -1]], 2 * exponent + drawn)
    x = ax.lines[0].get_xdata()
    assert np.isfinite(x).all() and low * (1 - 1e-12) <= x.min() and x.max() <= high * (1 + 1e-12)
    scored = json.loads(runner.invoke(app, ["score", str(path), "--metrics", "htsr,htmp", "--format", "json"]).stdout)
    row = scored["layers"][0]
    lines = {line.get_label(): line for line in ax.lines}
    if abs(exponent) == 600:  # xmin, β, τ (true) are null: outside float64's range, the fits are not drawn
        assert row["xmin"] is None and row["htmp_tau"] is None and list(lines) == ["ESD (n = 32)"]
    else:  # the table's fits, drawn true
        assert list(lines) == ["ESD (n = 32)", "power law", "truncated PL", "HTMP"]
        assert lines["power law"].get_xdata().min() >= row["xmin"]
        x, y = lines["HTMP"].get_data()
        np.testing.assert_allclose(y, htmp.pdf(x, row["htmp_kappa"], row["gamma"], row["htmp_beta"], row["htmp_tau"]),
                                   rtol=1e-9)
    assert f"power law α = {row['alpha']:.4g}" in (out / "report.md").read_text(encoding="utf-8")
