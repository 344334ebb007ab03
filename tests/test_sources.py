"""Checkpoint readers: every format gives the same tensors; bad files give typed one-line errors."""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

import wbfe
from tests.conftest import fake_hub_snapshot, small_state_dict, write_shards_with_a_copy, write_sharded
from wbfe.errors import (
    CorruptCheckpointError,
    ModelNotFoundError,
    SourceNotFoundError,
    TruncatedCheckpointError,
    UnsafePickleError,
)
from wbfe.linalg.arrays import to_torch
from wbfe.sources import content_hash, open_source


def _tensors(ref: object) -> dict[str, torch.Tensor]:
    with open_source(ref) as source:
        out = {e.name: to_torch(e.load()).clone() for e in source.entries()}
        assert len(source) == len(out)
        return out


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_all_formats_stream_identical_tensors(tmp_path: Path, state_dict: dict, st_file: Path) -> None:
    index = write_sharded(tmp_path / "sharded", state_dict)
    torch.save(state_dict, tmp_path / "pytorch_model.bin")
    wrapped = {"state_dict": {f"module.{k}": v for k, v in state_dict.items()}, "best_prec1": 91.2, "epoch": 3}
    torch.save(wrapped, tmp_path / "ckpt.th")
    reference = {k: v for k, v in state_dict.items()}
    for ref in (st_file, index, index.parent, tmp_path / "pytorch_model.bin", tmp_path / "ckpt.th", state_dict):
        _assert_same(_tensors(ref), reference)


def test_a_compiled_models_weights_are_named_as_the_models(tmp_path: Path) -> None:
    """torch.compile wraps a model as ``_orig_mod``: its state dict, saved or in memory, was scored under names
    (``_orig_mod.2.weight``) no plain checkpoint of the model has, so a compare of the two matched nothing."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(30, 40), torch.nn.ReLU(), torch.nn.Linear(40, 10))
    compiled = torch.compile(model)
    assert next(iter(compiled.state_dict())).startswith("_orig_mod.")
    plain = wbfe.score(model, metrics="bfe")
    torch.save(compiled.state_dict(), tmp_path / "compiled.pt")
    torch.save({"model": {f"module.{k}": v for k, v in compiled.state_dict().items()}}, tmp_path / "both.pt")
    for ref in (compiled, tmp_path / "compiled.pt", tmp_path / "both.pt"):
        got = wbfe.score(ref, metrics="bfe")
        assert (got.layers, got.skipped) == (plain.layers, plain.skipped)
        assert got.summary["head"] == plain.summary["head"] == "2.weight"


def test_a_checkpoint_with_two_state_dicts_scores_one_and_lists_the_other(tmp_path: Path) -> None:
    """{"state_dict": ..., "model": ...}: ``state_dict`` is scored (first of the usual keys), and the other's tensors
    are listed as skipped saying so; the scored numbers are those of ``state_dict`` alone."""
    g = torch.Generator().manual_seed(4)
    scored = {"fc.weight": torch.randn(20, 30, generator=g), "head.weight": torch.randn(10, 20, generator=g)}
    other = {"fc.weight": torch.randn(20, 30, generator=g), "fc.bias": torch.randn(20, generator=g)}
    torch.save({"state_dict": scored, "model": other, "epoch": 3}, tmp_path / "both.pt")
    why = "in 'model', not the state dict scored ('state_dict'); score checkpoint['model'] for it"
    alone = wbfe.score(scored, metrics="bfe")
    for ref in (tmp_path / "both.pt", {"state_dict": scored, "model": other}):
        result = wbfe.score(ref, metrics="bfe")
        assert [(r["name"], r["bfe"]) for r in result.layers] == [(r["name"], r["bfe"]) for r in alone.layers]
        assert result.summary == alone.summary
        assert [(s["name"], s["reason"], s["shape"]) for s in result.skipped] == [
            ("model/fc.weight", why, [20, 30]), ("model/fc.bias", why, [20])]
    # The same mapping under both keys, or a "model" of settings only: nothing else to list.
    assert not wbfe.score({"state_dict": scored, "model": scored}, metrics="bfe").skipped
    assert not wbfe.score({"state_dict": scored, "model": {"arch": "mlp"}}, metrics="bfe").skipped
    # An empty "state_dict" beside a "model" of tensors: "model" is scored (was: refused, no state dict found).
    assert [r["name"] for r in wbfe.score({"state_dict": {}, "model": other}, metrics="bfe").layers] == ["fc.weight"]


def test_sharded_order_follows_the_index(tmp_path: Path, state_dict: dict) -> None:
    index = write_sharded(tmp_path, state_dict, n_shards=2)
    with open_source(index) as source:
        names = [e.name for e in source.entries()]
        assert source.provenance.format == "safetensors-sharded"
    shard_of = {k: i % 2 for i, k in enumerate(state_dict)}
    assert names == [k for k in state_dict if shard_of[k] == 0] + [k for k in state_dict if shard_of[k] == 1]


def test_tensors_a_shard_holds_but_the_index_does_not_list_are_skipped_with_the_reason(tmp_path: Path, state_dict: dict) -> None:
    # wbfe scores what the index lists; the rest is accounted for, never scored.
    import json

    index = write_sharded(tmp_path, state_dict, n_shards=2)
    weight_map = json.loads(index.read_text())["weight_map"]
    dropped = [name for name in state_dict if state_dict[name].ndim == 2][:2]
    for name in dropped:
        del weight_map[name]
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    result = wbfe.score(index, metrics="bfe")
    skipped = {s["name"]: s["reason"] for s in result.skipped}
    for name in dropped:
        assert "not listed in model.safetensors.index.json" in skipped[name]
        assert name not in {layer["name"] for layer in result.layers}
    assert len(result.layers) + len(result.skipped) == len(state_dict)


def test_tensors_a_pickle_shard_holds_but_the_index_does_not_list_are_skipped_with_the_reason(tmp_path: Path) -> None:
    import json

    g = torch.Generator().manual_seed(0)
    torch.save({"a.weight": torch.randn(20, 30, generator=g), "stale.weight": torch.randn(20, 30, generator=g)},
               tmp_path / "pytorch_model-00001-of-00002.bin")
    torch.save({"b.weight": torch.randn(20, 30, generator=g)}, tmp_path / "pytorch_model-00002-of-00002.bin")
    weight_map = {"a.weight": "pytorch_model-00001-of-00002.bin", "b.weight": "pytorch_model-00002-of-00002.bin"}
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    result = wbfe.score(tmp_path, metrics="bfe")
    assert [layer["name"] for layer in result.layers] == ["a.weight", "b.weight"]
    assert [s["name"] for s in result.skipped] == ["stale.weight"]
    assert "not listed in pytorch_model.bin.index.json" in result.skipped[0]["reason"]


def test_a_models_ema_beside_it_is_listed_as_skipped_in_a_file_a_mapping_and_every_shard(tmp_path: Path) -> None:
    """{"model": ..., "model_ema": ...} (timm's, torchvision's and DeiT's training checkpoints): "model" is scored and
    the moving average listed as skipped, saying so, as for a second state dict. "model_ema" was passed over without a
    word, and the shards of an index were unwrapped without listing any other state dict (a "model" beside a
    "state_dict" too); an EMA beside an optimizer alone was refused as no state dict."""
    import json

    g = torch.Generator().manual_seed(5)
    parts = [{"a.weight": torch.randn(20, 30, generator=g)}, {"b.weight": torch.randn(10, 20, generator=g)}]
    emas = [{name: 0.5 * t for name, t in part.items()} for part in parts]
    merged, merged_ema = parts[0] | parts[1], emas[0] | emas[1]
    alone = wbfe.score(merged, metrics="bfe")
    for key, other in (("model", "model_ema"), ("state_dict", "model")):
        why = f"in {other!r}, not the state dict scored ({key!r}); score checkpoint[{other!r}] for it"
        folder = tmp_path / other
        folder.mkdir()
        shards = [f"pytorch_model-0000{i + 1}-of-00002.bin" for i in range(2)]
        for shard, part, ema in zip(shards, parts, emas):
            torch.save({key: part, other: ema, "epoch": 3}, folder / shard)
        weight_map = {name: shard for shard, part in zip(shards, parts) for name in part}
        (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
        torch.save({key: merged, other: merged_ema}, tmp_path / f"{other}.pt")
        for ref in (folder, tmp_path / f"{other}.pt", {key: merged, other: merged_ema}):
            result = wbfe.score(ref, metrics="bfe")
            assert [(r["name"], r["bfe"]) for r in result.layers] == [(r["name"], r["bfe"]) for r in alone.layers]
            assert result.summary == alone.summary
            assert [(s["name"], s["reason"], s["shape"]) for s in result.skipped] == [
                (f"{other}/a.weight", why, [20, 30]), (f"{other}/b.weight", why, [10, 20])], (key, ref)
    # An EMA alone beside the optimizer's state is the state dict there is.
    only = wbfe.score({"model_ema": merged_ema, "optimizer": {"state": {}, "param_groups": []}}, metrics="bfe")
    assert [r["name"] for r in only.layers] == ["a.weight", "b.weight"] and not only.skipped


def test_scores_equal_across_formats(tmp_path: Path, state_dict: dict, st_file: Path) -> None:
    index = write_sharded(tmp_path / "sharded", state_dict)
    torch.save(state_dict, tmp_path / "model.bin")
    results = [wbfe.score(ref, metrics="bfe").layers for ref in (st_file, index, tmp_path / "model.bin")]
    for other in results[1:]:
        assert {r["name"]: r["bfe"] for r in other} == {r["name"]: r["bfe"] for r in results[0]}


def test_provenance_and_content_hash(st_file: Path) -> None:
    import hashlib

    digest = hashlib.sha256(st_file.read_bytes()).hexdigest()
    assert content_hash(st_file) == digest
    with open_source(st_file) as source:
        assert source.provenance.to_dict()["sha256"] == digest
        assert source.provenance.format == "safetensors"


# --- bad input -----------------------------------------------------------------------------------


def test_missing_path() -> None:
    with pytest.raises(SourceNotFoundError, match="no such file or folder: /no/such/model.safetensors"):
        open_source("/no/such/model.safetensors")


def test_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFoundError, match="no weight files"):
        open_source(tmp_path)


def test_corrupt_header(tmp_path: Path) -> None:
    bad = tmp_path / "bad.safetensors"
    payload = b"{not json" + b" " * 7
    bad.write_bytes(struct.pack("<Q", len(payload)) + payload + b"\0" * 64)
    with pytest.raises(CorruptCheckpointError, match=r"bad.safetensors: corrupt safetensors header \(JSONDecodeError"):
        open_source(bad)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\xff" * 100)
    with pytest.raises(CorruptCheckpointError, match="not a safetensors file"):
        open_source(garbage)


def test_truncated_file(st_file: Path, tmp_path: Path) -> None:
    data = st_file.read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[:-100])
    with pytest.raises(TruncatedCheckpointError, match="cut.safetensors: truncated safetensors file"):
        open_source(cut)
    tiny = tmp_path / "tiny.safetensors"
    tiny.write_bytes(data[:5])
    with pytest.raises(TruncatedCheckpointError, match="no header") as caught:
        open_source(tiny)
    # Built by TruncatedCheckpointError.at: "<path>: <why>", the path kept on the error.
    assert str(caught.value) == f"{tiny}: truncated safetensors file (5 bytes, no header)"
    assert caught.value.path == str(tiny)  # type: ignore[attr-defined]


def test_truncated_and_missing_shard(tmp_path: Path, state_dict: dict) -> None:
    index = write_sharded(tmp_path, state_dict)
    shard = tmp_path / "model-00002-of-00003.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(TruncatedCheckpointError, match="model-00002-of-00003.safetensors: truncated"):
        open_source(index)
    shard.unlink()
    with pytest.raises(SourceNotFoundError, match="shard 'model-00002-of-00003.safetensors' listed in the index is missing"):
        open_source(index)


def _unaligned_safetensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """A valid safetensors file whose header length is odd, so tensor data starts at odd offsets
    (the format does not promise alignment; the official writer pads to 8)."""
    header, blobs, at = {}, [], 0
    for name, t in tensors.items():
        raw = t.contiguous().view(torch.uint8).reshape(-1).numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (1 - len(text) % 2)  # odd length
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def test_aligned_and_unaligned_tensors_are_read_as_stored(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(3)
    tensors = {"a.weight": torch.randn(40, 24, generator=g), "b.weight": torch.randn(3, 50, 7, generator=g),
               "small.weight": torch.randn(4, 4, generator=g)}
    aligned = tmp_path / "aligned.safetensors"
    save_file(tensors, str(aligned))
    odd = tmp_path / "odd.safetensors"
    _unaligned_safetensors(odd, tensors)
    assert (8 + struct.unpack("<Q", odd.read_bytes()[:8])[0]) % 4 != 0
    _assert_same(_tensors(aligned), tensors)
    _assert_same(_tensors(odd), tensors)  # read into buffers of their own


def test_file_cut_short_after_opening(tmp_path: Path) -> None:
    path = tmp_path / "cut.safetensors"
    save_file({"w": torch.ones(64, 64)}, str(path))
    data = path.read_bytes()
    with open_source(path) as source:
        entry = next(iter(source.entries()))
        path.write_bytes(data[:-100])
        with pytest.raises(TruncatedCheckpointError, match="cut.safetensors: truncated safetensors file .it changed"):
            entry.load()


def test_pickle_with_code_is_refused_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self) -> tuple:
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(3, 3), "payload": Evil()}, path)
    with pytest.raises(UnsafePickleError, match=r"evil.pt: refused to load a pickle that needs code \((posix|nt)\.system\)"):
        open_source(path)
    assert not marker.exists()


def test_garbage_and_truncated_pickles(tmp_path: Path, state_dict: dict) -> None:
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"definitely not a checkpoint" * 10)
    with pytest.raises(CorruptCheckpointError, match="garbage.pt: not a readable PyTorch checkpoint"):
        open_source(garbage)
    good = tmp_path / "good.bin"
    torch.save(state_dict, good)
    cut = tmp_path / "cut.bin"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(CorruptCheckpointError, match="cut.bin: not a readable PyTorch checkpoint"):
        open_source(cut)


def test_pickle_without_tensors(tmp_path: Path) -> None:
    path = tmp_path / "meta.pt"
    torch.save({"epoch": 3, "lr": 0.1}, path)
    with pytest.raises(CorruptCheckpointError, match="no state dict of tensors found"):
        open_source(path)


# --- hub, timm, torchvision: resolved offline from caches laid out as the libraries lay them ----------


def _st_bytes(tmp_path: Path, state: dict) -> bytes:
    path = tmp_path / "tmp.safetensors"
    save_file(state, str(path))
    return path.read_bytes()


def test_hub_id_from_fake_cache(tmp_path: Path, state_dict: dict) -> None:
    cache = Path(os.environ["HF_HUB_CACHE"])
    data = _st_bytes(tmp_path, state_dict)
    fake_hub_snapshot(cache, "acme/tiny-model", {"model.safetensors": data, "config.json": b"{}",
                                                "pytorch_model.bin": b"ignored: safetensors preferred"})
    # the layout is huggingface_hub's own: its cache lookup finds the file
    from huggingface_hub import try_to_load_from_cache

    assert try_to_load_from_cache("acme/tiny-model", "model.safetensors", cache_dir=cache)
    _assert_same(_tensors("acme/tiny-model"), state_dict)
    with open_source("acme/tiny-model") as source:
        prov = source.provenance.to_dict()
    assert prov["repo_id"] == "acme/tiny-model" and prov["commit"].startswith("0123456789")
    import hashlib

    assert prov["sha256"] == hashlib.sha256(data).hexdigest()


def test_hub_revision_and_sharded(tmp_path: Path, state_dict: dict) -> None:
    cache = Path(os.environ["HF_HUB_CACHE"])
    folder = tmp_path / "shards"
    write_sharded(folder, state_dict)
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    fake_hub_snapshot(cache, "acme/big", files, revision="step1000", commit="f" * 40)
    _assert_same(_tensors("acme/big@step1000"), state_dict)
    with pytest.raises(ModelNotFoundError, match="acme/big@main: no such file or folder, and no such model in the local Hugging Face cache"):
        open_source("acme/big@main")


def test_unknown_hub_id_offline() -> None:
    with pytest.raises(ModelNotFoundError, match="nobody/nothing: no such file or folder, and no such model in the local Hugging Face cache .* .HF_HUB_OFFLINE is set"):
        open_source("nobody/nothing")


def test_a_lone_shard_is_not_taken_for_the_whole_checkpoint(tmp_path: Path, state_dict: dict) -> None:
    """``model-00001-of-00002.safetensors`` alone (its index and the other shard never downloaded: ``hf download
    org/m model-00001-of-00002.safetensors``) is half a model: a folder holding it is refused, a hub snapshot holding
    it is not cached (completed online; offline, an error that says so). Named alone, the file is read alone.
    Before the fix the lone shard was scored as the whole model, in the folder and from the hub cache."""
    folder = tmp_path / "shards"
    write_sharded(folder, state_dict, n_shards=2)
    first = folder / "model-00001-of-00002.safetensors"
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / first.name).write_bytes(first.read_bytes())
    with pytest.raises(CorruptCheckpointError, match=rf"^{re.escape(str(lone))}: model-00001-of-00002.safetensors is "
                       r"shard 1 of 2 and no shard index is beside it \(a partial download\?\); name the file to "
                       r"score that shard alone$"):
        open_source(lone)
    from safetensors import safe_open

    with safe_open(str(first), "pt") as handle:
        assert set(_tensors(lone / first.name)) == set(handle.keys())
    cache = Path(os.environ["HF_HUB_CACHE"])
    snapshot = fake_hub_snapshot(cache, "acme/half", {first.name: first.read_bytes(), "config.json": b"{}"})
    with pytest.raises(ModelNotFoundError, match=rf"^acme/half: no such file or folder, and its files in the local "
                       rf"Hugging Face cache \({re.escape(str(snapshot))}\) are not a whole checkpoint \(a partial "
                       r"download\) \(HF_HUB_OFFLINE is set\)$"):
        open_source("acme/half")
    whole = fake_hub_snapshot(cache, "acme/whole", {p.name: p.read_bytes() for p in folder.iterdir()})
    (whole / "model-00002-of-00002.safetensors").resolve().unlink()  # a shard's blob gone: not whole either
    with pytest.raises(ModelNotFoundError, match=r"^acme/whole: no such file or folder, and its files in the local "):
        open_source("acme/whole")


def test_timm_name_from_hub_cache(tmp_path: Path) -> None:
    timm = pytest.importorskip("timm", reason="needs the timm extra: pip install -e '.[test,timm]'")
    cfg = timm.models.get_pretrained_cfg("resnet18")
    state = small_state_dict(1)
    fake_hub_snapshot(Path(os.environ["HF_HUB_CACHE"]), cfg.hf_hub_id, {"model.safetensors": _st_bytes(tmp_path, state)})
    _assert_same(_tensors("timm:resnet18"), state)
    with pytest.raises(wbfe.UnknownNameError, match="unknown timm pretrained model 'resnet18x'"):
        open_source("timm:resnet18x")


def test_torchvision_weights_from_torch_hub_cache(tmp_path: Path) -> None:
    models = pytest.importorskip("torchvision.models")
    weights = models.get_weight("ResNet18_Weights.IMAGENET1K_V1")
    target = Path(os.environ["TORCH_HOME"]) / "hub" / "checkpoints" / weights.url.rsplit("/", 1)[1]
    target.parent.mkdir(parents=True)
    state = small_state_dict(2)
    torch.save(state, target)
    _assert_same(_tensors("torchvision:ResNet18_Weights.IMAGENET1K_V1"), state)
    _assert_same(_tensors("torchvision:resnet18"), state)  # resnet18's default weights are the same file
    with pytest.raises(ModelNotFoundError, match="is not cached and HF_HUB_OFFLINE is set"):
        open_source("torchvision:ResNet18_Weights.IMAGENET1K_V1".replace("18", "34"))


def test_module_with_tied_weights() -> None:
    emb = torch.nn.Embedding(50, 16)
    head = torch.nn.Linear(16, 50, bias=False)
    head.weight = emb.weight
    model = torch.nn.ModuleDict({"embed": emb, "lm_head": head})
    result = wbfe.score(model, metrics="bfe")
    assert [layer["name"] for layer in result.layers] == ["embed.weight"]
    assert result.skipped == [{"name": "lm_head.weight", "reason": "tied: shares storage with embed.weight",
                               "shape": [50, 16], "dtype": "float32"}]


def test_duplicate_content_is_reported_as_tied(tmp_path: Path) -> None:
    w = torch.randn(20, 30)
    path = tmp_path / "dup.safetensors"
    save_file({"a.weight": w, "b.weight": w.clone()}, str(path))
    result = wbfe.score(path, metrics="bfe")
    assert [s["reason"] for s in result.skipped] == ["tied: identical to a.weight"]


def test_duplicate_content_across_shards_and_formats(tmp_path: Path) -> None:
    """Candidates come from a hash of a sample of the elements; only equal bytes make a tie."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(100, 100, generator=g)  # 10,000 elements: the sample takes every second one
    near = w.clone()
    near.view(-1)[1] += 1.0  # same sample, different bytes
    state = {"a.weight": w, "b.weight": near, "c.weight": torch.randn(100, 100, generator=g), "d.weight": w.clone()}
    index = write_sharded(tmp_path / "st", state, n_shards=4)  # d's shard comes after a's is closed
    write_sharded_pickles(tmp_path / "pt", state)
    torch.save(state, tmp_path / "one.bin")
    for ref in (index, tmp_path / "pt", tmp_path / "one.bin", state):
        result = wbfe.score(ref, metrics="bfe")
        assert [layer["name"] for layer in result.layers] == ["a.weight", "b.weight", "c.weight"], ref
        assert [s["reason"] for s in result.skipped] == ["tied: identical to a.weight"], ref
        assert result.layers[0]["bfe"] != result.layers[1]["bfe"]


def write_sharded_pickles(folder: Path, state: dict) -> None:
    import json

    folder.mkdir()
    weight_map = {}
    for i, name in enumerate(state):
        shard = f"pytorch_model-{i + 1:05d}-of-{len(state):05d}.bin"
        torch.save({name: state[name].clone()}, folder / shard)
        weight_map[name] = shard
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_file_digest_of_shards_is_hashlib_over_the_sorted_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The digest of several files is hashlib's over their sorted ``name:digest`` lines, whatever order they are
    given in; a missing shard among many is the error."""
    import hashlib

    from wbfe.sources import _base
    from wbfe.sources._base import FileDigest

    monkeypatch.setattr(_base, "HASH_CHUNK", 1000)  # many reads per file
    rng = np.random.default_rng(0)
    paths = []
    for i in range(7):
        paths.append(tmp_path / f"model-{i:05d}.safetensors")
        paths[-1].write_bytes(rng.bytes(int(rng.integers(1, 50_000))))
    lines = "".join(f"{p.name}:{hashlib.sha256(p.read_bytes()).hexdigest()}\n" for p in sorted(paths))
    expected = hashlib.sha256(lines.encode()).hexdigest()
    assert FileDigest(paths[::-1]).result() == expected
    broken = FileDigest(paths[:3] + [tmp_path / "gone.safetensors"] + paths[3:])
    with pytest.raises(FileNotFoundError):
        broken.result()


def test_file_digest_reports_errors(tmp_path: Path) -> None:
    import hashlib

    from wbfe.sources._base import FileDigest

    data = os.urandom(3 << 20)
    (tmp_path / "a.bin").write_bytes(data)
    (tmp_path / "b.bin").write_bytes(data[:100])
    assert FileDigest([tmp_path / "a.bin"]).result() == hashlib.sha256(data).hexdigest()
    lines = f"a.bin:{hashlib.sha256(data).hexdigest()}\nb.bin:{hashlib.sha256(data[:100]).hexdigest()}\n"
    assert FileDigest([tmp_path / "b.bin", tmp_path / "a.bin"]).result() == hashlib.sha256(lines.encode()).hexdigest()
    with pytest.raises(FileNotFoundError):
        FileDigest([tmp_path / "gone.bin"]).result()


@pytest.mark.parametrize("suffix", [".safetensors", ".bin"])
def test_the_digest_asked_for_after_close_is_the_files_sha256(tmp_path: Path, suffix: str) -> None:
    """Closing a checkpoint cancelled its digest: asked for afterwards, it was a plain RuntimeError. It is hashlib's
    SHA-256 of the file, as before close; a file removed since is SourceNotFoundError naming it."""
    import hashlib

    path = tmp_path / f"model{suffix}"
    state = {"fc.weight": torch.arange(12.0).reshape(3, 4)}
    if suffix == ".safetensors":
        save_file(state, str(path))
    else:
        torch.save(state, path)
    with open_source(path) as source:
        pass
    assert source.provenance.digest() == hashlib.sha256(path.read_bytes()).hexdigest()
    with open_source(path) as source:
        pass
    assert source.provenance.to_dict()["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    with open_source(path) as source:
        pass
    path.unlink()
    with pytest.raises(SourceNotFoundError, match=f"^no such file or folder: {re.escape(str(path))}$"):
        source.provenance.digest()


def test_a_weight_file_removed_before_it_is_hashed_is_a_typed_error(tmp_path: Path) -> None:
    """The digest of a file removed after the checkpoint was opened is SourceNotFoundError naming it,
    never a bare OSError."""
    from wbfe.sources._base import FileDigest

    gone = tmp_path / "model.safetensors"
    with pytest.raises(SourceNotFoundError, match=f"no such file or folder: {re.escape(str(gone))}"):
        FileDigest([gone]).result()
    folder = tmp_path / "shard.safetensors"
    folder.mkdir()
    with pytest.raises(SourceNotFoundError, match="shard.safetensors: cannot be read"):
        FileDigest([folder]).result()


def test_a_safetensors_file_replaced_or_rewritten_while_read_is_refused(tmp_path: Path) -> None:
    """A tensor read after its file was closed (a second pass over the entries) from a file replaced since it
    was opened, or read from a file rewritten in place, is CorruptCheckpointError, never the new bytes."""
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.ones(8, 4), "b": torch.zeros(8, 4)}, str(path))
    with open_source(path) as source:
        entries = list(source.entries())  # the stream is done: the shard is closed
        assert torch.equal(to_torch(entries[0].load()), torch.ones(8, 4))
        save_file({"a": torch.full((8, 4), 7.0), "b": torch.zeros(8, 4)}, str(tmp_path / "new.safetensors"))
        os.replace(tmp_path / "new.safetensors", path)
        with pytest.raises(CorruptCheckpointError, match="model.safetensors: changed while being read"):
            entries[0].load()
    with open_source(path) as source:
        stream = source.entries()
        entry = next(stream)  # read through the shard's open handle
        before = path.stat().st_mtime_ns
        path.write_bytes(path.read_bytes().replace(np.float32(7).tobytes(), np.float32(5).tobytes()))
        os.utime(path, ns=(before, before + 10**9))  # the rewrite's mtime, past the clock's granularity
        with pytest.raises(CorruptCheckpointError, match="model.safetensors: changed while being read"):
            entry.load()


def test_a_shard_re_saved_after_its_header_was_read_is_refused(tmp_path: Path) -> None:
    """The headers are read when the checkpoint is opened, each shard's file when the scoring reaches it: a shard
    re-saved in place meanwhile (a training job writing its next checkpoint, here a float16 tensor of the same
    byte size) is CorruptCheckpointError, never the new bytes read with the old header's dtypes and offsets.
    Before the fix the second shard's float32 tensor was read from the float16 bytes (32.06, 7.0, ...)."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_file({"a": torch.ones(8, 4)}, str(folder / "s1.safetensors"))
    save_file({"b": torch.ones(8, 4), "c": torch.zeros(8, 4)}, str(folder / "s2.safetensors"))
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors", "c": "s2.safetensors"}}))
    with open_source(folder) as source:
        stream = source.entries()
        first = next(stream)
        assert first.name == "a" and torch.equal(to_torch(first.load()), torch.ones(8, 4))
        save_file({"b": torch.full((16, 4), 3.0, dtype=torch.float16), "c": torch.full((8, 4), 7.0)},
                  str(folder / "new.safetensors"))
        os.replace(folder / "new.safetensors", folder / "s2.safetensors")
        with pytest.raises(CorruptCheckpointError, match=r"s2\.safetensors: changed while being read \(replaced or "
                           r"rewritten since its header was read\); score it again$"):
            next(stream)
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.ones(8, 4)}, str(path))
    with open_source(path) as source:  # a file named alone: replaced between the opening and the first read
        save_file({"a": torch.full((8, 4), 2.0)}, str(tmp_path / "new.safetensors"))
        os.replace(tmp_path / "new.safetensors", path)
        with pytest.raises(CorruptCheckpointError, match="model.safetensors: changed while being read"):
            list(source.entries())


@pytest.mark.parametrize("where", ["local", "streamed"])
def test_a_copy_in_a_subfolder_shard_of_the_same_file_name_is_a_row_of_its_own(tmp_path: Path, where: str,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Shards ``a/x.safetensors`` and ``b/x.safetensors`` are two shards, named as the index names them: the copy
    of ``t`` that ``b/x`` holds although the index gives ``t`` to ``a/x`` is a skipped row of its own. Before the
    fix both were named ``x.safetensors``, so the copy was taken for the owner's own and dropped without a row."""
    fsspec = pytest.importorskip("fsspec")
    folder = tmp_path / "m"
    g = torch.Generator().manual_seed(3)
    for sub, other in (("a", "u"), ("b", "v")):
        (folder / sub).mkdir(parents=True)
        save_file({"t": torch.randn(20, 30, generator=g), other: torch.randn(20, 30, generator=g)},
                  str(folder / sub / "x.safetensors"))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "t": "a/x.safetensors", "u": "a/x.safetensors", "v": "b/x.safetensors"}}))
    ref: object = folder
    if where == "streamed":
        monkeypatch.setenv("WBFE_CACHE_DIR", str(tmp_path / "cache"))
        store = fsspec.filesystem("memory")
        for path in folder.rglob("*.*"):
            store.pipe_file(f"/w13sub/{path.relative_to(folder).as_posix()}", path.read_bytes())
        ref = "memory://w13sub/model.safetensors.index.json"
    with open_source(ref, stream=True if where == "streamed" else None) as source:
        rows = [(e.name, e.copy_of, e.skip) for e in source.entries()]
    assert rows == [("t", None, None), ("u", None, None), ("v", None, None),
                    ("b/x.safetensors/t", "t", "a second copy of 't': model.safetensors.index.json gives it to "
                     "a/x.safetensors, whose copy is scored (transformers' loader takes this one instead: it reads "
                     "every shard's tensors in file name order, the last copy winning)")]


def test_dtype_torch_cannot_hold_is_a_typed_error(tmp_path: Path) -> None:
    """A 6-bit float tensor (valid safetensors; torch has no such dtype) is skipped when scored and
    raises UnsupportedDtypeError, not AttributeError, when a caller loads it."""
    path = tmp_path / "f6.safetensors"
    header = json.dumps({"a": {"dtype": "F6_E2M3", "shape": [4, 4], "data_offsets": [0, 12]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(12))
    with open_source(path) as source:
        entry = next(iter(source.entries()))
        assert entry.dtype == "float6_e2m3"
        with pytest.raises(wbfe.UnsupportedDtypeError, match="has no F6_E2M3 tensors"):
            entry.load()


@pytest.mark.parametrize("fmt", ["safetensors", "pickle"])
def test_a_name_two_shards_hold_unlisted_is_one_skipped_row(tmp_path: Path, fmt: str) -> None:
    import json

    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(1)
    ext, index = (".safetensors", "model.safetensors.index.json") if fmt == "safetensors" else (".bin", "pytorch_model.bin.index.json")
    weight_map = {}
    for i in (1, 2):
        shard = f"model-0000{i}-of-00002{ext}"
        tensors = {f"w{i}.weight": torch.randn(20, 30, generator=g), "stale.weight": torch.randn(20, 30, generator=g)}
        save_file(tensors, str(tmp_path / shard)) if fmt == "safetensors" else torch.save(tensors, tmp_path / shard)
        weight_map[f"w{i}.weight"] = shard
    (tmp_path / index).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    result = wbfe.score(tmp_path, metrics="bfe")
    assert sorted(layer["name"] for layer in result.layers) == ["w1.weight", "w2.weight"]
    assert [s["name"] for s in result.skipped] == ["stale.weight"]


@pytest.mark.parametrize("fmt", ["safetensors", "pickle"])
@pytest.mark.parametrize("owner", [1, 2])
def test_a_name_the_index_gives_to_another_shard_is_read_from_that_shard_alone(tmp_path: Path, fmt: str,
                                                                               owner: int) -> None:
    """A shard that also holds a copy of a tensor the index places in another shard: the index's copy is read, and the
    other copy is a skipped row of its own (``shard/name``) saying which copy transformers' loader takes (it merges
    the shards in file name order, the last copy winning, whatever the index says). The pickle shards scored both, two
    rows of one name; the safetensors shards, then both, dropped the other copy without a row."""
    made = write_shards_with_a_copy(tmp_path, fmt, owner, seed=2)
    first, second, index, weight_map = made["first"], made["second"], made["index"], made["weight_map"]
    result = wbfe.score(tmp_path, metrics="bfe")
    want = wbfe.score({"a.weight": made["listed"]}, metrics="bfe").layers[0]["bfe"]
    assert sorted(layer["name"] for layer in result.layers) == ["a.weight", "b.weight", "c.weight"]
    assert next(layer["bfe"] for layer in result.layers if layer["name"] == "a.weight") == want
    taken = ("transformers' loader takes this one instead: it reads every shard's tensors in file name order, the "
             "last copy winning" if owner == 1 else "transformers' loader takes that one too")
    holder = second if owner == 1 else first
    assert [(s["name"], s["reason"], s["shape"]) for s in result.skipped] == [
        (f"{holder}/a.weight", f"a second copy of 'a.weight': {index} gives it to {weight_map['a.weight']}, whose copy "
         f"is scored ({taken})", [20, 30])]


def test_shards_whose_metadata_disagree_keep_each_shards_value(tmp_path: Path) -> None:
    """The shards' __metadata__ were merged with the last shard winning: the score JSON and an edited file said
    note = 'two' of a checkpoint whose first shard says 'one'."""
    from safetensors import safe_open

    from wbfe.editing import smooth_checkpoint

    g = torch.Generator().manual_seed(0)
    folder = tmp_path / "sharded"
    folder.mkdir()
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    for name, tensor, note in zip(names, ("a.weight", "b.weight"), ("one", "two")):
        save_file({tensor: torch.randn(8, 8, generator=g)}, str(folder / name), metadata={"format": "pt", "note": note})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a.weight": names[0], "b.weight": names[1]}}))
    expected = {"format": "pt", "note": {names[0]: "one", names[1]: "two"}}
    assert wbfe.score(folder, metrics="bfe").model["metadata"] == expected
    out = tmp_path / "edited" / "out.safetensors"
    smooth_checkpoint(folder, out, percent=0.5)
    with safe_open(str(out), "pt") as f:
        written = f.metadata()
    assert written == {"format": "pt", "note": json.dumps(expected["note"])}
