"""Hugging Face hub ids ``org/name[@revision]``: the local cache first, else streamed or downloaded.

``HF_HUB_OFFLINE=1`` is honoured (read at call time): a model missing from the cache is then a
:class:`ModelNotFoundError` without any network.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from wbfe._config import hf_cache_dir, hf_offline
from wbfe.errors import CorruptCheckpointError, InvalidOptionError, ModelNotFoundError, SourceNotFoundError, WbfeError
from wbfe.sources._base import TensorSource
from wbfe.sources.http_range import RemoteFile
from wbfe.sources.local import MODEL_CONFIGS, open_path, pick_weight_files, read_model_config
from wbfe.sources.registry import checkpoint_suffixes, folder_kinds, register_location
from wbfe.sources.remote import is_safetensors_name, stream_safetensors
from wbfe.sources.resay import resaying, said_of
from wbfe.sources.safetensors_files import index_weight_map

__all__ = ["HUB_ID", "parse_hub_id", "open_hub", "download_weight_files", "hub_cached", "host_unreachable",
           "is_hub_id", "open_hub_ref", "stream_hub", "hub_endpoint"]

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


def _weight_file(snapshot: Path) -> str | None:
    """The weight file of a cached snapshot; None where there is none, or what is cached is part of a checkpoint
    (a lone shard, shards without their index: a partial download, completed online)."""
    try:
        return next(iter(pick_weight_files([p.name for p in snapshot.iterdir()])), None)
    except (OSError, CorruptCheckpointError):
        return None


def download_weight_files(repo_id: str, revision: str | None, cache_dir: Path) -> Path:
    """Download the weight files of a hub repo into the cache, all at one commit (:func:`_pinned`); return the
    chosen local file.

    Raises:
        ModelNotFoundError: unknown repo or revision, no weight files, no commit named, or the hub unreachable.
    """
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.file_download import repo_folder_name

    name = _reachable_hub(repo_id, revision)
    try:
        endpoint = hub_endpoint()
        info = HfApi(endpoint=endpoint).model_info(repo_id, revision=revision)
        names = [s.rfilename for s in info.siblings or []]
        chosen = pick_weight_files(names, name)
        if not chosen:  # refused before anything is fetched: a lone file in the cache would answer the next run
            raise ModelNotFoundError(f"{repo_id}: the repository holds no weight files", ref=repo_id)
        commit = _pinned(name, repo_id, revision, info.sha, chosen[0], endpoint)
        download = functools.partial(hf_hub_download, repo_id, revision=commit, cache_dir=str(cache_dir),
                                     endpoint=endpoint)
        if "adapter_config.json" in names:  # a PEFT LoRA adapter: its config goes beside its weights
            download("adapter_config.json")
        local = Path(download(chosen[0]))
        for config_name in MODEL_CONFIGS:  # the head, experts and quantization
            if config_name in names:
                download(config_name)
        if local.name.endswith(".index.json"):
            for shard in index_weight_map(local):
                download(shard)
        if commit != revision:  # as huggingface_hub's read of a branch or tag does: the cache answers it offline
            ref = cache_dir / repo_folder_name(repo_id=repo_id, repo_type="model") / "refs" / (revision or "main")
            with contextlib.suppress(OSError):  # best effort, as there: a read-only cache still scores
                ref.parent.mkdir(parents=True, exist_ok=True)
                ref.write_text(commit)
        return local
    except WbfeError:
        raise
    except Exception as exc:  # noqa: BLE001 - every hub and network failure means "cannot resolve"
        raise ModelNotFoundError(f"{name}: {hub_failure(exc)}", ref=repo_id) from None


def _pinned(name: str, repo_id: str, revision: str | None, sha: str | None, first: str, endpoint: str) -> str:
    """The one commit every file is read at (a push between two reads would mix commits unseen): the model info's
    ``sha``, else (a mirror's answer) the commit the hub serves ``first`` from; none is ``ModelNotFoundError``."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    if sha is not None:
        return sha
    try:
        commit = get_hf_file_metadata(hf_hub_url(repo_id, first, revision=revision, endpoint=endpoint),
                                      endpoint=endpoint).commit_hash
    except Exception as exc:  # noqa: BLE001 - as model_info's failures
        raise ModelNotFoundError(f"{name}: {hub_failure(exc)}", ref=repo_id) from None
    if commit is None:
        raise ModelNotFoundError(f"{name}: the hub names no commit for it, so its files could change between "
                                 f"two reads unseen; name a commit: {repo_id}@<commit>", ref=repo_id)
    return commit


_HUB_FAILURES = (
    ("GatedRepoError", "a gated model: accept its terms on the hub and log in (hf auth login) to download it"),
    ("RepositoryNotFoundError", "no such model on the Hugging Face hub (or a private one)"),
    ("RevisionNotFoundError", "no such revision of this model on the Hugging Face hub"),
    ("EntryNotFoundError", "a weight file it lists is missing from the hub"),  # the local and the remote kinds alike
    ("OfflineModeIsEnabled", "not in the local Hugging Face cache, and huggingface_hub is in offline mode"),
    ("HFValidationError", "not a valid Hugging Face model id"))


def hub_failure(exc: BaseException) -> str:
    """What a ``huggingface_hub`` (or network) exception means, by its type."""
    from huggingface_hub import errors

    for kind, reason in _HUB_FAILURES:  # in order: a GatedRepoError is a RepositoryNotFoundError too
        if isinstance(exc, getattr(errors, kind)):
            return reason
    if isinstance(exc, errors.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        return f"the Hugging Face hub refused the request (HTTP {status})"
    return f"the Hugging Face hub could not be reached ({exc.__class__.__name__})"


def host_unreachable(url: str, *, what: str, timeout: float = 3.0) -> str | None:
    """Why the host of ``url`` cannot be reached, from one TCP connection with a short timeout; None if it
    can, or behind a proxy (which decides). ``what`` names the host in the message."""
    if any(os.environ.get(f"{p}_PROXY") or os.environ.get(f"{p.lower()}_proxy") for p in ("HTTPS", "HTTP", "ALL")):
        return None
    parsed = urlparse(url)
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
    except ValueError:  # a port out of range
        return f"{what} could not be reached ({url}: not a valid address)"
    try:
        with socket.create_connection((parsed.hostname or "", port), timeout=timeout):
            return None
    except (OSError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc.__class__.__name__
        return f"{what} could not be reached ({parsed.hostname}: {reason})"


def _reachable_hub(repo_id: str, revision: str | None) -> str:
    """``org/name[@revision]``, or ``ModelNotFoundError`` where the hub cannot be reached within 3 s (huggingface_hub
    itself retries for long)."""
    name = f"{repo_id}{'@' + revision if revision else ''}"
    unreachable = host_unreachable(hub_endpoint(), what="the Hugging Face hub")
    if unreachable is not None:
        raise ModelNotFoundError(f"{name}: {unreachable}", ref=repo_id)
    return name


def hub_cached(ref: str) -> bool:
    """Whether the hub model ``org/name[@revision]`` has weight files in the local cache (no network)."""
    repo_id, revision = parse_hub_id(ref)
    snapshot = _cached_snapshot(repo_id, revision, hf_cache_dir())
    return snapshot is not None and ((snapshot / "adapter_config.json").is_file() or _weight_file(snapshot) is not None)


def open_hub(ref: str, *, fmt: str = "hf-hub", could_be_path: bool = False, stream: bool | None = None) -> TensorSource:
    """Open ``org/name[@revision]`` from the cache, else stream or download it (as ``stream`` says) unless
    offline. ``could_be_path``: errors say that no such folder exists either.

    Raises:
        ModelNotFoundError: not cached and offline, unknown, or unreachable.
    """
    repo_id, revision = parse_hub_id(ref)
    cache_dir = hf_cache_dir()
    snapshot = _cached_snapshot(repo_id, revision, cache_dir)
    if snapshot is not None:
        source = _open_snapshot(snapshot, _weight_file(snapshot), ref, fmt, repo_id, revision, cached=True)
        if source is not None:
            return source
    prefix = f"{ref}: no such file or folder, and " if could_be_path else f"{ref}: "
    if hf_offline():
        cached = (f"its files in the local Hugging Face cache ({snapshot}) are not a whole checkpoint (a partial "
                  "download)" if snapshot is not None else f"no such model in the local Hugging Face cache {cache_dir}")
        raise ModelNotFoundError(f"{prefix}{cached} (HF_HUB_OFFLINE is set)", ref=ref)
    try:
        streamed = stream_hub(ref, repo_id, revision, stream=stream, fmt=fmt) if stream is not False else None
        if streamed is not None:
            return streamed
        local = download_weight_files(repo_id, revision, cache_dir)
    except ModelNotFoundError as exc:
        if not could_be_path:
            raise
        reason = str(exc).split(": ", 1)[-1]
        raise ModelNotFoundError(f"{prefix}no such model in the local Hugging Face cache {cache_dir}; {reason}",
                                 ref=ref) from None
    source = _open_snapshot(local.parent, local.name, ref, fmt, repo_id, revision, cached=False)
    assert source is not None
    return source


def _open_snapshot(snapshot: Path, chosen: str | None, ref: str, fmt: str, repo_id: str, revision: str | None, *,
                   cached: bool) -> TensorSource | None:
    """The ``snapshot`` as the folder kind that claims it (a PEFT adapter), else its file ``chosen``, its errors
    naming ``ref``, not the cache; None where there is none (``cached``: or its index's shards are not all there)."""
    kind = next((kind for kind in folder_kinds() if kind.claims(snapshot)), None)
    if kind is not None:
        source = kind.open(snapshot, ref)
    elif chosen is None:
        return None
    else:
        path = snapshot / chosen
        try:
            source = resaying(said_of(snapshot, ref, lambda: open_path(path, ref=ref, fmt=fmt)), snapshot, ref)
        except SourceNotFoundError:
            if not cached:
                raise
            return None  # an index whose shards are not all cached: completed online
        source.config = read_model_config(snapshot)
    source.provenance.extra.update({"repo_id": repo_id, "revision": revision or "main", "commit": snapshot.name})
    return source


def is_hub_id(ref: Any) -> bool:
    """Whether ``ref`` reads as a hub id: not a path, nor a name ending like a checkpoint file."""
    if not isinstance(ref, (str, Path)):
        return False
    text = str(ref)
    return (HUB_ID.match(text) is not None and not text.startswith((".", "/", "~"))
            and not text.endswith(checkpoint_suffixes() + (".json",)))


@register_location("hub", order=50, claims=is_hub_id, streams=True)
def open_hub_ref(ref: Any, *, stream: bool | None = None) -> TensorSource:
    return open_hub(str(ref), could_be_path=True, stream=stream)


def hub_endpoint() -> str:
    """The hub's address: ``HF_ENDPOINT`` as set now (huggingface_hub reads it once, when imported)."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or str(constants.ENDPOINT)).rstrip("/")


def stream_hub(ref: str, repo_id: str, revision: str | None, *, stream: bool | None,
               fmt: str = "hf-hub") -> TensorSource | None:
    """The hub model's safetensors opened for streaming at the commit ``HfApi.model_info`` names, or None
    where it is to be downloaded instead (``stream`` None and enough free disk, or not safetensors).

    Raises:
        ModelNotFoundError: unknown model or revision, no weight files, the hub unreachable.
        InvalidOptionError: ``stream=True`` for weights that are not safetensors (or an adapter).
    """
    from huggingface_hub import HfApi, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    name = _reachable_hub(repo_id, revision)
    endpoint = hub_endpoint()
    try:
        info = HfApi(endpoint=endpoint).model_info(repo_id, revision=revision, files_metadata=True)
    except Exception as exc:  # noqa: BLE001 - every hub and network failure means "cannot resolve"
        raise ModelNotFoundError(f"{name}: {hub_failure(exc)}", ref=repo_id) from None
    siblings = {s.rfilename: s for s in info.siblings or []}
    chosen = pick_weight_files(list(siblings), name)
    if not chosen:
        raise ModelNotFoundError(f"{repo_id}: the repository holds no weight files", ref=repo_id)
    if "adapter_config.json" in siblings or not is_safetensors_name(chosen[0]):
        if stream:
            what = "a PEFT adapter" if "adapter_config.json" in siblings else chosen[0]
            raise InvalidOptionError(f"{name}: --stream reads safetensors weights; this repository holds {what}: "
                                     "drop --stream to download it")
        return None
    commit = _pinned(name, repo_id, revision, info.sha, chosen[0], endpoint)
    headers = build_hf_headers()

    def open_file(file_name: str) -> RemoteFile:
        return RemoteFile(hf_hub_url(repo_id, file_name, revision=commit, endpoint=endpoint), headers=headers, hub=True)

    sizes = {n: int(s.size) for n, s in siblings.items() if s.size is not None}
    digests = {n: str(s.lfs.sha256) for n, s in siblings.items() if s.lfs and s.lfs.sha256}  # chosen[0] is top-level
    return stream_safetensors(ref, chosen[0], open_file, stream=stream, cache_dir=hf_cache_dir(), sizes=sizes,
                              digests=digests, commit=commit, fmt=fmt,
                              configs=[c for c in MODEL_CONFIGS if c in siblings],
                              extra={"repo_id": repo_id, "revision": revision or "main", "commit": commit})
