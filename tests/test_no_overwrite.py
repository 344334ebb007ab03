"""No command writes over what it reads (issue 45, item 1): every writer refuses, with one line and
exit 2 (the library: ``OverwriteError``), an output that is the input under another spelling, a link
to it, or a file inside a folder it reads, and the input's bytes and mtime stay as they were."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from tests.conftest import fake_hub_snapshot, write_sharded
from wbfe.errors import OutputError, OverwriteError
from wbfe_cli.main import app


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"fc1.weight": torch.randn(30, 20, generator=g), "fc2.weight": torch.randn(12, 30, generator=g)}


def _fingerprint(*paths: Path) -> dict[str, tuple[str, int]]:
    """SHA-256 and mtime of every file under ``paths`` (a file or a folder)."""
    files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*")))]
    return {str(f): (hashlib.sha256(f.read_bytes()).hexdigest(), f.stat().st_mtime_ns)
            for f in files if f.is_file() and not f.is_symlink()}


def _refused(args: list[str], *protected: Path, cwd: Path | None = None) -> str:
    """Run the CLI; require exit 2, one line, and every protected file untouched; return the line."""
    before = _fingerprint(*protected)
    old = Path.cwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, [str(a) for a in args])
    finally:
        os.chdir(old)
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert _fingerprint(*protected) == before
    return lines[0]


@pytest.fixture()
def model(tmp_path: Path) -> Path:
    path = tmp_path / "m.safetensors"
    save_file(_state(), str(path))
    return path


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    path = tmp_path / "ckpt"
    path.mkdir()
    save_file(_state(1), str(path / "model.safetensors"))
    return path


SAME = "it is the input"
LINK = "it is a hard link to the input"
INSIDE = "write the output outside the checkpoint folder"


# ---------------------------------------------------------------- smooth and sharpen

@pytest.mark.parametrize("command", ["smooth", "sharpen"])
def test_edit_refuses_its_own_input(command: str, model: Path, tmp_path: Path) -> None:
    assert SAME in _refused([command, model, model], model)
    assert SAME in _refused([command, "m.safetensors", "./m.safetensors"], model, cwd=tmp_path)
    (tmp_path / "sub").mkdir()
    assert SAME in _refused([command, model, tmp_path / "sub" / ".." / "m.safetensors"], model)
    link = tmp_path / "link.safetensors"
    link.symlink_to(model)
    assert SAME in _refused([command, model, link], model)
    (tmp_path / "dir-link").symlink_to(tmp_path, target_is_directory=True)
    assert SAME in _refused([command, tmp_path / "dir-link" / "m.safetensors", model], model)
    hard = tmp_path / "hard.safetensors"
    os.link(model, hard)
    line = _refused([command, model, hard], model)
    assert line == f"wbfe: error: cannot write {hard}: {LINK} {model}; wbfe never writes over what it reads: " \
                   "name another output file"


@pytest.mark.parametrize("command", ["smooth", "sharpen"])
def test_edit_refuses_a_file_inside_the_input_folder(command: str, folder: Path) -> None:
    weights = folder / "model.safetensors"
    line = _refused([command, folder, weights], folder)
    assert line == (f"wbfe: error: cannot write {weights}: it is inside {folder}, a folder this command reads; "
                    f"{INSIDE}")
    assert INSIDE in _refused([command, str(folder) + "/", folder / "smoothed.safetensors"], folder)
    assert not (folder / "smoothed.safetensors").exists()


def test_edit_refuses_an_index_shard(tmp_path: Path) -> None:
    index = write_sharded(tmp_path / "sharded", _state(2), n_shards=2)
    shard = tmp_path / "sharded" / "model-00001-of-00002.safetensors"
    assert INSIDE in _refused(["smooth", index, shard], index.parent)


def test_edit_to_a_new_file_beside_the_input_still_works(model: Path, tmp_path: Path) -> None:
    before = _fingerprint(model)
    result = CliRunner().invoke(app, ["smooth", str(model), str(tmp_path / "out.safetensors")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out.safetensors").stat().st_size > 0 and _fingerprint(model) == before


# ---------------------------------------------------------------- the library

def test_library_raises_the_typed_error(model: Path, folder: Path, tmp_path: Path) -> None:
    from wbfe.editing import sharpen_checkpoint, smooth_checkpoint
    from wbfe.render.files import check_output, check_output_dir, local_reads, write_atomic

    before = _fingerprint(model, folder)
    for edit in (smooth_checkpoint, sharpen_checkpoint):
        with pytest.raises(OverwriteError) as caught:
            edit(model, model)
        assert isinstance(caught.value, OutputError) and caught.value.input == str(model)
        with pytest.raises(OverwriteError):
            edit(folder, folder / "model.safetensors")
    with pytest.raises(OverwriteError):
        check_output(tmp_path / "." / "m.safetensors", reads=local_reads(model))
    with pytest.raises(OverwriteError):
        check_output_dir(folder / "plots", reads=local_reads(folder))
    with pytest.raises(OverwriteError):
        write_atomic(folder / "x.json", "{}", reads=[folder])
    assert _fingerprint(model, folder) == before and not (folder / "x.json").exists()
    assert check_output(tmp_path / "other.json", reads=local_reads(model)) == tmp_path / "other.json"


def test_files_resolved_while_reading_are_checked_before_writing(tmp_path: Path, monkeypatch) -> None:
    """A hub id names no local path; its cached files are known only once the reader resolves them."""
    from wbfe.editing import smooth_checkpoint

    data = (tmp_path / "x.safetensors")
    save_file(_state(3), str(data))
    snap = fake_hub_snapshot(tmp_path / "hub", "someone/tiny", {"model.safetensors": data.read_bytes()})
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    blob = next((tmp_path / "hub").rglob("blobs/*"))
    before = _fingerprint(blob)
    with pytest.raises(OverwriteError):
        smooth_checkpoint("someone/tiny", snap / "model.safetensors")
    assert _fingerprint(blob) == before
    assert [p.name for p in snap.parent.parent.rglob(".*")] == []  # nothing half-written
    assert SAME in _refused(["score", "someone/tiny", "--metrics", "bfe", "-o", snap / "model.safetensors"], blob)
    # report and esd refuse a name for another format before resolving (wave 11): an output named as theirs
    # reaches the resolved files, here as a hard link to the blob
    os.link(blob, tmp_path / "page.html")
    os.link(blob, tmp_path / "e.png")
    assert LINK in _refused(["report", "someone/tiny", "-o", tmp_path / "page.html"], blob)
    assert LINK in _refused(["esd", "someone/tiny", "--layer", "fc1.weight", "-o", tmp_path / "e.png"], blob)
    assert "name the output *.html" in _refused(["report", "someone/tiny", "-o", snap / "model.safetensors"], blob)
    assert "name the output *.png" in _refused(["esd", "someone/tiny", "--layer", "fc1.weight", "-o",
                                                snap / "model.safetensors"], blob)


# ---------------------------------------------------------------- score, compare, esd, report

def test_score(model: Path, folder: Path, tmp_path: Path) -> None:
    assert SAME in _refused(["score", model, "-o", model], model)
    assert SAME in _refused(["score", "m.safetensors", "-o", "./m.safetensors", "--metrics", "bfe"], model,
                            cwd=tmp_path)
    line = _refused(["score", folder, "-o", folder / "score.json"], folder)
    assert line.endswith(INSIDE) and not (folder / "score.json").exists()
    index = write_sharded(tmp_path / "sharded", _state(2), n_shards=2)
    assert INSIDE in _refused(["score", index, "-o", index.parent / "model-00002-of-00002.safetensors"],
                              index.parent)


def test_score_protects_an_adapters_base(tmp_path: Path) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 4, "lora_alpha": 8}')
    g = torch.Generator().manual_seed(4)
    save_file({"base_model.model.fc1.lora_A.weight": torch.randn(4, 20, generator=g),
               "base_model.model.fc1.lora_B.weight": torch.randn(30, 4, generator=g)},
              str(adapter / "adapter_model.safetensors"))
    base = tmp_path / "base"
    base.mkdir()
    save_file(_state(), str(base / "model.safetensors"))
    assert INSIDE in _refused(["score", adapter, "--base", base, "-o", base / "merged.json"], adapter, base)
    assert SAME in _refused(["score", adapter, "--base", base / "model.safetensors", "-o",
                             base / "model.safetensors"], adapter, base)
    assert INSIDE in _refused(["score", adapter, "--base", base, "-o", adapter / "score.json"], adapter, base)


def test_compare(model: Path, folder: Path) -> None:
    assert INSIDE in _refused(["compare", model, folder, "-o", folder / "diff"], model, folder)
    assert "it is " + str(folder) + ", a folder" in _refused(["compare", model, folder, "-o", folder], model, folder)


def test_esd(model: Path) -> None:
    assert SAME in _refused(["esd", model, "--layer", "fc1.weight", "-o", model], model)


def test_report(model: Path, folder: Path, tmp_path: Path) -> None:
    assert SAME in _refused(["report", model, "-o", model], model)
    assert INSIDE in _refused(["report", folder, "-o", folder / "report.html"], folder)
    assert INSIDE in _refused(["report", folder, "--format", "md", "-o", folder / "page"], folder)
    saved = tmp_path / "score.json"
    saved.write_text("{}")
    assert SAME in _refused(["report", saved, "-o", saved], saved)


# ---------------------------------------------------------------- rank and watch: the folders they read

def test_rank_protects_the_zoo_and_its_models(folder: Path, tmp_path: Path) -> None:
    spec = tmp_path / "zoo.csv"
    spec.write_text(f"model,acc\n{folder},0.5\n")
    assert INSIDE in _refused(["rank", spec, "-o", folder / "rank", "--no-cache"], folder, spec)
    assert INSIDE in _refused(["rank", spec, "--cache-dir", folder / "cache"], folder, spec)
    assert INSIDE in _refused(["report", spec, "--quality", "acc", "-o", folder / "r.html", "--no-cache"],
                              folder, spec)


def test_watch_protects_the_run_folder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for step in (1, 2, 3):
        save_file(_state(step), str(run / f"step_{step}.safetensors"))
    line = _refused(["watch", run, "--lambda", "1", "-o", run / "plots"], run)
    assert line == f"wbfe: error: cannot write {run / 'plots'}: it is inside {run}, a folder this command reads; {INSIDE}"
    assert not (run / "plots").exists()
    (tmp_path / "run-link").symlink_to(run, target_is_directory=True)
    assert INSIDE in _refused(["watch", run, "--lambda", "1", "-o", tmp_path / "run-link"], run)
