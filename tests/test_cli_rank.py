"""``wbfe rank`` through CliRunner: the real CIFAR-10 ResNets, the Fashion-MNIST zoo, files, errors."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from scipy import stats as sps
from typer.testing import CliRunner

from wbfe.ranking.zoo import fixtures_dir, list_zoos
from tests.conftest import SHARED_ZOO
from wbfe_cli.main import app

CIFAR = SHARED_ZOO / "cifar10-resnet"
FMNIST = fixtures_dir() / "fmnist-zoo" / "zoo.csv"
METRIC_KEYS = ["metric", "rho", "ci_low", "ci_high", "p_value", "kendall_tau", "pearson_r", "n"]

needs_cifar = pytest.mark.skipif(not (CIFAR / "accuracy.csv").is_file(),
                                 reason=f"the shared CIFAR-10 ResNets are not at {CIFAR}")
needs_fmnist = pytest.mark.skipif(not FMNIST.is_file(),
                                  reason=f"the Fashion-MNIST zoo is not built yet ({FMNIST})")


def invoke(*args: str):  # noqa: ANN201
    result = CliRunner().invoke(app, list(args))
    return result


@pytest.fixture(scope="module")
def cifar_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One score cache shared by the CIFAR tests of this module (scoring the ResNets once)."""
    return tmp_path_factory.mktemp("cifar-cache")


def test_list_shows_every_builtin_zoo() -> None:
    result = invoke("rank", "--list")
    assert result.exit_code == 0, result.output
    names = [line.split()[0] for line in result.stdout.splitlines()]
    assert names == [z.name for z in list_zoos()]


def test_unknown_zoo_exits_2_with_suggestion() -> None:
    result = invoke("rank", "cifar10", "--no-cache")
    assert result.exit_code == 2
    assert "wbfe: error: unknown zoo 'cifar10'; did you mean 'cifar10-resnet'?" in result.stderr


def test_several_quality_columns_need_a_choice(tmp_path: Path) -> None:
    spec = tmp_path / "z.csv"
    spec.write_text("model,a,b\norg/m,1,2\n")
    result = invoke("rank", str(spec), "--no-cache")
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"wbfe: error: zoo '{tmp_path.name}/z.csv' has several quality columns; choose one with --quality (a, b)"
    )


def test_a_checkpoint_listed_twice_is_one_line(tmp_path: Path) -> None:
    spec = tmp_path / "z.csv"
    spec.write_text("model,checkpoint,acc\na,org/m,1\nb,org/n,2\nc,org/m,3\n")
    result = invoke("rank", str(spec), "--no-cache")
    assert result.exit_code == 2
    assert result.stderr.strip() == (f"wbfe: error: zoo '{tmp_path.name}/z.csv': models 'a' and 'c' are the same "
                                     "checkpoint (org/m); list each checkpoint once")


def _accuracy() -> dict[str, float]:
    with (CIFAR / "accuracy.csv").open(newline="") as handle:
        return {row["model"]: float(row["test_accuracy"]) for row in csv.DictReader(handle)}


@pytest.mark.zoo
@needs_cifar
def test_cifar_resnets_json_and_files(tmp_path: Path, cifar_cache: Path) -> None:
    out = tmp_path / "out"
    cache = cifar_cache
    result = invoke("rank", str(CIFAR / "accuracy.csv"), "--quality", "test_accuracy", "--metrics", "bfe",
                    "--format", "json", "--output", str(out), "--cache-dir", str(cache), "--device", "cpu")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert list(data)[:5] == ["zoo", "quality", "metrics", "models", "failed"]
    assert data["quality"] == "test_accuracy" and data["failed"] == []
    assert [m["metric"] for m in data["metrics"]] == sorted(
        [m["metric"] for m in data["metrics"]], key=lambda name: -abs(
            next(x["rho"] for x in data["metrics"] if x["metric"] == name)))
    assert {m["metric"] for m in data["metrics"]} == {"bfe_head", "bfe_mean"}
    for m in data["metrics"]:
        assert list(m)[:8] == METRIC_KEYS
        assert m["n"] == 4 and m["p_value"] is not None

    # Two paths: the CLI's rho equals scipy's on the per-model values it reports ...
    accuracy = _accuracy()
    models = {m["model"]: m for m in data["models"]}
    assert set(models) == set(accuracy)
    for metric in data["metrics"]:
        xs = [models[name]["scores"][metric["metric"]] for name in accuracy]
        assert metric["rho"] == pytest.approx(sps.spearmanr(xs, list(accuracy.values())).statistic, abs=1e-12)
    # ... and those values equal the library's wbfe.score on the same file.
    import wbfe

    direct = wbfe.score(str(CIFAR / "resnet20.safetensors"), metrics="bfe", device="cpu")
    assert models["resnet20"]["scores"]["bfe_head"] == pytest.approx(direct.summary["bfe_head"], rel=1e-12)

    assert json.loads((out / "rank.json").read_text()) == data
    for metric in data["metrics"]:
        png = out / f"{metric['metric']}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary files left

    again = invoke("rank", "cifar10-resnet", "--metrics", "bfe", "--cache-dir", str(cache), "--device", "cpu")
    assert again.exit_code == 0, again.output
    assert "4 models ranked by test_accuracy (higher is better); 0 scored, 4 from cache" in again.stdout
    assert again.stderr.count(": cached") == 4


@pytest.mark.zoo
@needs_cifar
def test_table_lists_failed_models_and_still_ranks(tmp_path: Path, cifar_cache: Path) -> None:
    spec = tmp_path / "zoo.csv"
    rows = ["model,test_accuracy"]
    rows += [f"{CIFAR / name}.safetensors,{acc}" for name, acc in _accuracy().items()]
    rows.append("missing.safetensors,50.0")
    spec.write_text("\n".join(rows) + "\n")
    result = invoke("rank", str(spec), "--metrics", "bfe", "--cache-dir", str(cifar_cache), "--quiet",
                    "--device", "cpu")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"zoo {tmp_path.name}/zoo.csv: 4 models ranked by test_accuracy")
    body = [line for line in lines if line.startswith(("bfe_head", "bfe_mean"))]
    rhos = [abs(float(line.split()[1])) for line in body]
    assert len(body) == 2 and rhos == sorted(rhos, reverse=True)
    assert "failed (1):" in lines
    assert any(line.startswith("  missing.safetensors: ") for line in lines)
    assert result.stderr == ""


@pytest.mark.zoo
@needs_cifar
def test_lower_is_better_flag_flips_the_sign(cifar_cache: Path) -> None:
    common = ["rank", "cifar10-resnet", "--quality", "params", "--metrics", "bfe", "--format", "json",
              "--cache-dir", str(cifar_cache), "--quiet", "--device", "cpu"]
    plain = json.loads(invoke(*common).stdout)
    flipped = json.loads(invoke(*common, "--lower-is-better", "params").stdout)
    assert not plain["lower_is_better"] and flipped["lower_is_better"]
    rho = {m["metric"]: m["rho"] for m in plain["metrics"]}
    for m in flipped["metrics"]:
        assert m["rho"] == pytest.approx(-rho[m["metric"]])


@pytest.mark.zoo
@needs_fmnist
def test_default_ranks_the_fashion_mnist_zoo(tmp_path: Path) -> None:
    with FMNIST.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    result = invoke("rank", "--metrics", "bfe", "--format", "json", "--cache-dir", str(tmp_path), "--quiet",
                    "--device", "cpu")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["zoo"] == "fmnist" and data["quality"] == "test_accuracy"
    assert len(data["models"]) + len(data["failed"]) == len(rows)
    head = next(m for m in data["metrics"] if m["metric"] == "bfe_head")
    assert head["n"] == len(data["models"]) >= 24 - len(data["failed"])
    assert head["ci_low"] <= head["rho"] <= head["ci_high"]
    assert head["p_method"] == "monte-carlo"


@needs_fmnist
def test_a_rerun_into_the_folder_removes_the_earlier_figures_only(tmp_path: Path) -> None:
    """A second ranking into one folder left the first one's figures of metrics it no longer ranks beside its own
    rank.json (14 of 16 PNGs stale); files the earlier rank.json does not name stay."""
    out, cache = tmp_path / "out", tmp_path / "cache"
    first = invoke("rank", "--metrics", "bfe,htsr", "-o", str(out), "--cache-dir", str(cache), "--quiet")
    assert first.exit_code == 0, first.output
    (out / "notes.png").write_bytes(b"mine")
    earlier = json.loads((out / "rank.json").read_text())["metrics"]
    second = invoke("rank", "--metrics", "bfe", "-o", str(out), "--cache-dir", str(cache))
    assert second.exit_code == 0, second.output
    metrics = [m["metric"] for m in json.loads((out / "rank.json").read_text())["metrics"]]
    assert sorted(p.name for p in out.iterdir()) == sorted(["rank.json", "notes.png", *(f"{m}.png" for m in metrics)])
    assert f"(removed {len(earlier) - len(metrics)} of an earlier ranking's figures)" in second.stderr


@pytest.mark.slow
@pytest.mark.zoo
@needs_cifar
def test_cifar_resnets_all_metric_groups(tmp_path: Path) -> None:
    result = invoke("rank", "cifar10-resnet", "--format", "json", "--cache-dir", str(tmp_path), "--quiet")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["failed"] == []
    names = {m["metric"] for m in data["metrics"]}
    assert {"bfe_head", "bfe_mean", "alpha_head", "alpha_mean"} <= names
    for m in data["metrics"]:
        assert m["rho"] is None or -1.0 <= m["rho"] <= 1.0
        assert m["rho"] is not None or m["reason"]
        if m["rho"] is not None:
            assert not math.isnan(m["rho"])
