"""Shared fixtures: small synthetic checkpoints written to tmp_path, and the real checkpoints nearby."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The project's real checkpoints: $WBFE_SHARED_ZOO (as for wbfe itself), else ../shared/zoo beside the checkout.
SHARED_ZOO = Path(os.environ["WBFE_SHARED_ZOO"]).expanduser() if os.environ.get("WBFE_SHARED_ZOO") \
    else ROOT.parent / "shared" / "zoo"
CIFAR_ZOO = SHARED_ZOO / "cifar10-resnet"


def cifar_zoo() -> Path:
    """The CIFAR-10 ResNets of the shared zoo, or skip with the reason."""
    if not (CIFAR_ZOO / "accuracy.csv").is_file():
        pytest.skip(f"real CIFAR-10 ResNets not found at {CIFAR_ZOO} (set WBFE_SHARED_ZOO, or put them in "
                    "../shared/zoo beside the checkout)")
    return CIFAR_ZOO


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """wbfe's cache folder for what module- and session-scoped fixtures score (before ``_offline`` runs):
    never the user's own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WBFE_CACHE_DIR", str(tmp_path_factory.mktemp("wbfe-cache-session")))
        yield


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """No test may reach a network: hub lookups are offline and caches point at empty folders.

    wbfe is pointed at the same shared zoo as the tests, also when it is installed rather than
    imported from this checkout (its own default is relative to where it is installed).
    """
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path_factory.mktemp("hf-cache")))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path_factory.mktemp("torch-home")))
    monkeypatch.setenv("WBFE_SHARED_ZOO", str(SHARED_ZOO))
    # wbfe's own cache (remembered framework descriptions, score entries): one empty folder a test
    monkeypatch.setenv("WBFE_CACHE_DIR", str(tmp_path_factory.mktemp("wbfe-cache")))


@pytest.fixture(scope="module")
def one_blas_thread() -> Iterator[None]:
    """BLAS held at one thread for a module: spin-waiting threads on shared cores are many times slower."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        yield


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """torch held at one intra-op thread for a test, restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def small_state_dict(seed: int = 0) -> dict:
    """A tiny CNN-plus-MLP state dict with every kind of tensor wbfe meets."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return {
        "features.0.weight": torch.randn(16, 3, 3, 3, generator=g),
        "features.0.bias": torch.randn(16, generator=g),
        "features.1.running_mean": torch.zeros(16),
        "features.1.num_batches_tracked": torch.tensor(7),
        "blocks.0.attn.qkv.weight": torch.randn(96, 32, generator=g) / 6,
        "blocks.0.mlp.fc1.weight": torch.randn(64, 32, generator=g) / 6,
        "blocks.0.mlp.fc2.weight": torch.randn(32, 64, generator=g) / 8,
        "embed.weight": torch.randn(100, 32, generator=g),
        "classifier.weight": torch.randn(10, 32, generator=g) / 6,
        "classifier.bias": torch.zeros(10),
    }


@pytest.fixture
def state_dict() -> dict:
    return small_state_dict()


@pytest.fixture
def st_file(tmp_path: Path, state_dict: dict) -> Path:
    from safetensors.torch import save_file

    path = tmp_path / "model.safetensors"
    save_file(state_dict, str(path))
    return path


def write_sharded(folder: Path, state: dict, n_shards: int = 3) -> Path:
    """Write ``state`` as safetensors shards with a ``model.safetensors.index.json``."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    names = list(state)
    weight_map = {}
    for i in range(n_shards):
        part = names[i::n_shards]
        shard = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        save_file({k: state[k].contiguous() for k in part}, str(folder / shard))
        weight_map.update({k: shard for k in part})
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {}, "weight_map": {k: weight_map[k] for k in names}}))
    return index


def write_shards_with_a_copy(folder: Path, fmt: str, owner: int, seed: int) -> dict[str, Any]:
    """Two shards (safetensors, or torch pickles with ``fmt="pickle"``) and their index, where shard ``owner`` holds
    ``a.weight`` as the index says and the other shard a second copy of it: the file names, the index's name and
    weight map, and both copies (``listed``: the index's, ``copy``: the other)."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    ext, index = ((".safetensors", "model.safetensors.index.json") if fmt == "safetensors"
                  else (".bin", "pytorch_model.bin.index.json"))
    listed, copy = torch.randn(20, 30, generator=g), torch.randn(20, 30, generator=g)
    first, second = f"model-00001-of-00002{ext}", f"model-00002-of-00002{ext}"
    shards = {first: {"a.weight": listed if owner == 1 else copy, "c.weight": torch.randn(20, 30, generator=g)},
              second: {"a.weight": copy if owner == 1 else listed, "b.weight": torch.randn(20, 30, generator=g)}}
    folder.mkdir(parents=True, exist_ok=True)
    for shard, tensors in shards.items():
        if fmt == "safetensors":
            save_file(tensors, str(folder / shard))
        else:
            torch.save(tensors, folder / shard)
    weight_map = {"a.weight": first if owner == 1 else second, "b.weight": second, "c.weight": first}
    (folder / index).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return {"first": first, "second": second, "index": index, "weight_map": weight_map, "listed": listed,
            "copy": copy}


def fake_hub_snapshot(cache: Path, repo_id: str, files: dict[str, bytes], *, revision: str = "main",
                      commit: str = "0123456789abcdef0123456789abcdef01234567") -> Path:
    """Lay files out exactly as huggingface_hub's cache does: blobs, refs/<rev>, snapshots/<commit>/ symlinks."""
    import hashlib

    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / digest).write_bytes(data)
        (snap / name).symlink_to(Path("..") / ".." / "blobs" / digest)
    return snap


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Tests skipped for want of an extra are named with it, so a partial install is never silent."""
    wanted = sorted({m.group(1) for report in terminalreporter.stats.get("skipped", [])
                     if (m := re.search(r"needs the (\w+) extra", str(report.longrepr)))})
    if wanted:
        extras = ",".join(wanted)
        terminalreporter.write_line(f"tests skipped for want of the {extras} extra: pip install -e '.[test,{extras}]'",
                                    yellow=True)
