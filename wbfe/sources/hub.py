"""Hugging Face hub ids ``org/name[@revision]``: the local cache first, a download when allowed.

Safetensors are preferred over PyTorch pickles. ``HF_HUB_OFFLINE=1`` is honoured (read at call
time); a model missing from the cache then raises :class:`ModelNotFoundError` without any network.
"""

from __future__ import annotations

import re
from pathlib import Path

from wbfe._config import hf_cache_dir, hf_offline
from wbfe.errors import ModelNotFoundError, SourceNotFoundError
from wbfe.sources._base import TensorSource
from wbfe.sources.local import open_path, pick_weight_files, read_model_config

__all__ = ["HUB_ID", "parse_hub_id", "open_hub", "download_weight_files"]

HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[\w./-]+))?$")


def parse_hub_id(ref: str) -> tuple[str, str | None]:
    """Split ``org/name@revision`` into ``(repo_id, revision)``; revision None means ``main``."""
    match = HUB_ID.match(ref)
    if not match:
        raise ModelNotFoundError(f"not a Hugging Face model id: {ref!r} (expected org/name[@revision])", ref=ref)
    return match.group("repo"), match.group("rev")


def _cached_snapshot(repo_id: str, revision: str | None, cache_dir: Path) -> Path | None:
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(repo_id, revision=revision, cache_dir=str(cache_dir), local_files_only=True)
    except Exception:  # noqa: BLE001 - any miss (not cached, revision unknown) means "not in cache"
        return None
    return Path(str(folder))


def download_weight_files(repo_id: str, revision: str | None, cache_dir: Path) -> Path:
    """Download the weight files of a hub repo into the cache; return the chosen local file.

    Raises:
        ModelNotFoundError: unknown repo or revision, no weight files, or the hub unreachable.
    """
    from huggingface_hub import HfApi, hf_hub_download

    try:
        names = HfApi().list_repo_files(repo_id, revision=revision)
        chosen = pick_weight_files(names)
        if not chosen:
            raise ModelNotFoundError(f"{repo_id}: the repository holds no weight files", ref=repo_id)
        local = Path(hf_hub_download(repo_id, chosen[0], revision=revision, cache_dir=str(cache_dir)))
        if local.name.endswith(".index.json"):
            import json

            shards = sorted(set(json.loads(local.read_text())["weight_map"].values()))
            for shard in shards:
                hf_hub_download(repo_id, shard, revision=revision, cache_dir=str(cache_dir))
        return local
    except ModelNotFoundError:
        raise
    except Exception as exc:  # noqa: BLE001 - hub and network errors all mean "cannot resolve"
        kind = exc.__class__.__name__
        what = "unknown model or revision" if "NotFound" in kind else "the hub could not be reached"
        raise ModelNotFoundError(
            f"{repo_id}{'@' + revision if revision else ''}: {what} and it is not in the local cache "
            f"{cache_dir} ({kind})",
            ref=repo_id,
        ) from None


def open_hub(ref: str, *, fmt: str = "hf-hub") -> TensorSource:
    """Open ``org/name[@revision]`` from the cache, downloading it first unless offline.

    Raises:
        ModelNotFoundError: not cached and offline, unknown, or unreachable.
    """
    repo_id, revision = parse_hub_id(ref)
    cache_dir = hf_cache_dir()
    snapshot = _cached_snapshot(repo_id, revision, cache_dir)
    if snapshot is not None:
        try:
            chosen = pick_weight_files([p.name for p in snapshot.iterdir()])
        except OSError:
            chosen = []
        if chosen:
            try:
                source = open_path(snapshot / chosen[0], ref=ref, fmt=fmt)
            except SourceNotFoundError:
                source = None  # an index whose shards are not all cached: complete it online
            if source is not None:
                source.config = read_model_config(snapshot)
                source.provenance.extra.update({"repo_id": repo_id, "revision": revision or "main",
                                                "commit": snapshot.name})
                return source
    if hf_offline():
        raise ModelNotFoundError(
            f"{ref}: not in the local Hugging Face cache {cache_dir} and HF_HUB_OFFLINE is set", ref=ref
        )
    local = download_weight_files(repo_id, revision, cache_dir)
    source = open_path(local, ref=ref, fmt=fmt)
    source.config = read_model_config(local.parent)
    source.provenance.extra.update({"repo_id": repo_id, "revision": revision or "main",
                                    "commit": local.parent.name})
    return source
