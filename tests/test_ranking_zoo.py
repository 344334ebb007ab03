"""Zoo specs (CSV/YAML), reference resolution, the built-in zoo registry and the shipped tables."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from wbfe.errors import InvalidOptionError, SourceNotFoundError, UnknownNameError
from wbfe.ranking import zoo as zoo_mod
from wbfe.ranking.zoo import load_zoo, read_zoo_file, zoo_from_rows

from tests.conftest import SHARED_ZOO

TABLES = zoo_mod.fixtures_dir() / "tables"


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_csv_relative_paths_resolve_against_spec_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "zoo"
    _write(folder / "models" / "a.safetensors", "x")
    spec = _write(folder / "zoo.csv",
                  "model,test_accuracy,test_loss,notes,source\n"
                  "models/a.safetensors,0.9,0.3,first,paper A\n"
                  "org/name@v1,0.8,,hub model,\n"
                  "timm:resnet18,0.7,0.5,,\n"
                  "torchvision:ResNet18_Weights.IMAGENET1K_V1,0.6,0.6,,\n"
                  "./missing.bin,0.5,0.7,,\n")
    monkeypatch.chdir(tmp_path)  # the cwd must not matter
    z = read_zoo_file(spec, lower_is_better=["test_loss"])
    refs = [e.ref for e in z.entries]
    assert refs == [
        str((folder / "models" / "a.safetensors").resolve()),
        "org/name@v1",
        "timm:resnet18",
        "torchvision:ResNet18_Weights.IMAGENET1K_V1",
        str((folder / "missing.bin").resolve()),
    ]
    assert z.quality_columns == ("test_accuracy", "test_loss")  # 'notes' is text, 'source' reserved
    assert z.lower_is_better == frozenset({"test_loss"})
    assert math.isnan(z.entries[1].quality["test_loss"])
    assert z.entries[0].source == "paper A" and z.entries[1].source is None
    assert z.name == "zoo/zoo.csv"


def test_checkpoint_column_holds_the_reference(tmp_path: Path) -> None:
    _write(tmp_path / "r20.safetensors", "x")
    spec = _write(tmp_path / "accuracy.csv", "model,checkpoint,test_accuracy\nresnet20,r20.safetensors,91.7\n")
    (entry,) = read_zoo_file(spec).entries
    assert entry.name == "resnet20"
    assert entry.ref == str((tmp_path / "r20.safetensors").resolve())


def test_yaml_mapping_and_list_forms(tmp_path: Path) -> None:
    _write(tmp_path / "m1.safetensors", "x")
    spec = _write(tmp_path / "zoo.yaml",
                  "name: tiny\nquality: ppl\nlower_is_better: [ppl]\nmodels:\n"
                  "  - {model: m1.safetensors, ppl: 12.5, acc: 0.4, source: card}\n"
                  "  - {model: org/m2, ppl: 9.0, acc: 0.5}\n")
    z = read_zoo_file(spec)
    assert z.name == "tiny" and z.default_quality == "ppl"
    assert z.lower_is_better == frozenset({"ppl"})
    assert z.resolve_quality(None) == "ppl"
    assert [e.ref for e in z.entries] == [str((tmp_path / "m1.safetensors").resolve()), "org/m2"]
    plain = _write(tmp_path / "list.yml", "- {model: org/a, acc: 1}\n- {model: org/b, acc: 2}\n")
    assert [e.quality["acc"] for e in read_zoo_file(plain).entries] == [1.0, 2.0]


@pytest.mark.parametrize("text,message", [
    ("name,acc\na,1\n", "zoo 'z' has no 'model' column (columns: name, acc)"),
    ("model,acc\na,1\na,2\n", "zoo 'z': model 'a' appears twice"),
    ("model,acc\n,1\n", "zoo 'z': row 1 has an empty 'model' cell"),
    ("model,kind\na,cnn\n", "zoo 'z' has no numeric quality column"),
    ("model,acc\n", "zoo 'z' has no models"),
])
def test_invalid_specs_raise_one_line_errors(tmp_path: Path, text: str, message: str) -> None:
    spec = _write(tmp_path / "z.csv", text)
    with pytest.raises(InvalidOptionError) as info:
        read_zoo_file(spec, name="z")
    assert str(info.value) == message


def test_one_checkpoint_named_by_two_models_is_refused(tmp_path: Path) -> None:
    """Two rows naming one checkpoint (a copied row, a link to another row's file, a label and a checkpoint cell)
    were ranked as two models: its metric and quality counted twice (n = 6 for 5 models)."""
    _write(tmp_path / "m1.safetensors", "x")
    (tmp_path / "link.safetensors").symlink_to(tmp_path / "m1.safetensors")
    where = (tmp_path / "m1.safetensors").resolve()
    for second in ("b,m1.safetensors", "b,link.safetensors", "m1.safetensors,", "b,./m1.safetensors"):
        spec = _write(tmp_path / "z.csv", f"model,checkpoint,acc\na,m1.safetensors,1\n{second},2\nc,org/c,3\n")
        with pytest.raises(InvalidOptionError) as info:
            read_zoo_file(spec, name="z")
        label = second.split(",")[0]
        assert str(info.value) == (f"zoo 'z': models 'a' and '{label}' are the same checkpoint ({where}); "
                                   "list each checkpoint once")
    with pytest.raises(InvalidOptionError, match="models 'a' and 'b' are the same checkpoint \\(org/a\\)"):
        zoo_from_rows([{"model": "a", "checkpoint": "org/a", "acc": 1}, {"model": "b", "checkpoint": "org/a", "acc": 2}],
                      name="z")
    kept = zoo_from_rows([{"model": "org/a", "acc": 1}, {"model": "org/A", "acc": 2}], name="z")  # labels differ
    assert [e.ref for e in kept.entries] == ["org/a", "org/A"]


def test_unknown_lower_is_better_column_suggests(tmp_path: Path) -> None:
    spec = _write(tmp_path / "z.csv", "model,perplexity\norg/a,3\n")
    with pytest.raises(UnknownNameError, match=r"unknown quality column 'perplexty'; did you mean 'perplexity'\?"):
        read_zoo_file(spec, lower_is_better=["perplexty"])


def test_resolve_quality(tmp_path: Path) -> None:
    z = read_zoo_file(_write(tmp_path / "z.csv", "model,a,b\norg/m,1,2\n"), name="z")
    assert z.resolve_quality("b") == "b"
    with pytest.raises(InvalidOptionError) as info:
        z.resolve_quality(None)
    assert str(info.value) == "zoo 'z' has several quality columns; choose one with --quality (a, b)"
    with pytest.raises(UnknownNameError):
        z.resolve_quality("c")
    single = read_zoo_file(_write(tmp_path / "s.csv", "model,acc\norg/m,1\n"))
    assert single.resolve_quality(None) == "acc"


def test_missing_spec_and_unknown_name(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFoundError, match="zoo spec not found"):
        load_zoo(tmp_path / "nope.csv")
    with pytest.raises(UnknownNameError) as info:
        load_zoo("cifar10")
    assert str(info.value).startswith("unknown zoo 'cifar10'; did you mean 'cifar10-resnet'?")


def test_builtin_names_are_stable() -> None:
    assert zoo_mod.builtin_zoo_names() == (
        "fmnist", "cifar10-resnet", "torchvision-imagenet", "pythia-deduped-lambada", "qwen3.5",
    )


@pytest.mark.parametrize("builtin", zoo_mod.list_zoos(), ids=lambda z: z.name)
def test_every_builtin_zoo_loads_or_says_why(builtin: zoo_mod.BuiltinZoo) -> None:
    try:
        z = load_zoo(builtin.name)
    except SourceNotFoundError as exc:  # its checkpoints are not in this checkout
        assert builtin.offline and str(exc)
        pytest.skip(str(exc))
    assert z.name == builtin.name
    assert z.entries
    assert z.resolve_quality(None) == builtin.default_quality
    assert set(builtin.lower_is_better) <= z.lower_is_better
    assert all(math.isfinite(e.quality[builtin.default_quality]) for e in z.entries)


@pytest.mark.parametrize("table", sorted(TABLES.glob("*.csv")), ids=lambda p: p.name)
def test_published_tables_cite_every_row(table: Path) -> None:
    with table.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert rows
    for row in rows:
        assert row["source"].strip(), f"{table.name}: {row['model']} has no source"
        assert "http" in row["source"] or row["source"].startswith("torchvision ")


def test_shipped_torchvision_table_matches_live_metadata() -> None:
    pytest.importorskip("torchvision")
    live = {r["model"]: r for r in zoo_mod.torchvision_imagenet_rows()}
    shipped = read_zoo_file(TABLES / "torchvision-imagenet.csv")
    assert {e.name for e in shipped.entries} == set(live)
    for entry in shipped.entries:
        assert entry.quality["acc1"] == pytest.approx(float(live[entry.name]["acc1"]), abs=0)
        assert entry.quality["acc5"] == pytest.approx(float(live[entry.name]["acc5"]), abs=0)
    # Two published anchors (torchvision docs): ResNet-50 V1 76.13 %, V2 80.858 %.
    by_name = {e.name: e for e in shipped.entries}
    assert by_name["torchvision:ResNet50_Weights.IMAGENET1K_V1"].quality["acc1"] == 76.13
    assert by_name["torchvision:ResNet50_Weights.IMAGENET1K_V2"].quality["acc1"] == 80.858


def test_torchvision_zoo_falls_back_to_shipped_table(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> list:
        raise zoo_mod.MissingDependencyError("no torchvision")

    monkeypatch.setattr(zoo_mod, "torchvision_imagenet_rows", missing)
    z = load_zoo("torchvision-imagenet")
    assert len(z.entries) == len(read_zoo_file(TABLES / "torchvision-imagenet.csv").entries)


@pytest.mark.zoo
def test_cifar_table_matches_shared_accuracy_csv() -> None:
    source = SHARED_ZOO / "cifar10-resnet" / "accuracy.csv"
    if not source.is_file():
        pytest.skip(f"shared zoo not present at {source}")
    theirs = read_zoo_file(source)
    ours = load_zoo("cifar10-resnet")
    assert [(e.name, e.ref, e.quality["test_accuracy"]) for e in ours.entries] == [
        (e.name, e.ref, e.quality["test_accuracy"]) for e in theirs.entries
    ]
    assert all(Path(e.ref).is_file() for e in ours.entries)


def test_cifar_zoo_missing_checkpoints_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WBFE_SHARED_ZOO", str(tmp_path))
    with pytest.raises(SourceNotFoundError) as info:
        load_zoo("cifar10-resnet")
    assert str(info.value) == (
        f"the CIFAR-10 ResNet checkpoints are not at {tmp_path / 'cifar10-resnet'}; set WBFE_SHARED_ZOO "
        "to the folder that holds cifar10-resnet/"
    )


def test_a_quality_column_with_a_text_cell_is_named_not_dropped(tmp_path: Path) -> None:
    """A typo in the accuracy column once made it "not numeric": the zoo was silently ranked by the only numeric
    column left (params), and --quality acc said "unknown quality column"."""
    spec = _write(tmp_path / "zoo.csv", "model,acc,params\na,1,5\nb,87.5%,2\nc,3,7\nd,4,1\n")
    why = "column 'acc' is not numeric: model 'b' has '87.5%'"
    with pytest.raises(InvalidOptionError, match=f"{why}; fix it, or choose the quality column with --quality"):
        read_zoo_file(spec).resolve_quality(None)
    with pytest.raises(InvalidOptionError, match=why):
        read_zoo_file(spec).resolve_quality("acc")
    with pytest.raises(InvalidOptionError, match=why):
        read_zoo_file(spec, default_quality="acc")
    assert read_zoo_file(spec).resolve_quality("params") == "params"  # asked for: ranked as asked
    only = _write(tmp_path / "only.csv", "model,acc,notes\na,1,x\nb,2,3\nc,3,\n")  # a text column with a number
    with pytest.raises(InvalidOptionError, match="column 'notes' is not numeric: model 'a' has 'x'"):
        read_zoo_file(only).resolve_quality(None)
