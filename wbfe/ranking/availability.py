"""Before scoring a zoo: which models cannot be had here, neither on disk nor in the torch hub or Hugging Face
cache, with ``HF_HUB_OFFLINE`` set or the host refusing one TCP connection. Nothing is downloaded; object-store URIs
and other references are left to the scorer."""

from __future__ import annotations

import os
from collections import Counter
from typing import Optional
from urllib.parse import urlparse

from wbfe._config import hf_offline, user_path
from wbfe.errors import ModelNotFoundError, WbfeError
from wbfe.ranking.zoo import TORCHVISION_DOWNLOADS, Zoo, torchvision_weight_not_cached

__all__ = ["unavailable_models"]

_FIX = ("run once with a network to cache the weights, or point TORCH_HOME / HF_HUB_CACHE at a cache "
        "that holds them")


def _where(ref: str) -> Optional[tuple[bool, str]]:
    """(cached, download URL) of a downloadable reference; None for anything else."""
    from wbfe.sources.hub import HUB_ID, hub_cached
    from wbfe.sources.object_store import is_uri

    if is_uri(ref) or os.path.lexists(user_path(ref)):
        return None
    if torchvision_weight_not_cached(ref):
        return False, TORCHVISION_DOWNLOADS
    if ref.startswith(("timm:", "torchvision:")):
        from wbfe.sources.zoo_libraries import library_weights

        return library_weights(ref)
    text = ref.split(":", 1)[1] if ref.startswith(("hf:", "hf-hub:")) else ref
    if HUB_ID.match(text) and not text.startswith((".", "/", "~")):
        from huggingface_hub import constants

        return hub_cached(text), str(constants.ENDPOINT)
    return None


def _host_name(url: str) -> str:
    from huggingface_hub import constants

    hub = urlparse(url).netloc == urlparse(str(constants.ENDPOINT)).netloc
    return "the Hugging Face hub" if hub else f"the download host {urlparse(url).hostname}"


def unavailable_models(zoo: Zoo, *, timeout: float = 3.0) -> dict[str, str]:
    """Model name → why it cannot be had here (e.g. ``not cached, and HF_HUB_OFFLINE is set``); ``timeout``:
    seconds for each host's one connection.

    Raises:
        ModelNotFoundError: no model of the zoo can be had (one line: how many, why, what to do).
    """
    from wbfe.sources.hub import host_unreachable

    hosts: dict[str, Optional[str]] = {}
    blocked: dict[str, str] = {}
    for entry in zoo.entries:
        try:
            where = _where(entry.ref)
        except WbfeError:
            continue  # an unknown name or a missing library: the scorer reports it for this model
        if where is None or where[0]:
            continue
        if hf_offline():
            blocked[entry.name] = "not cached, and HF_HUB_OFFLINE is set"
            continue
        host = urlparse(where[1]).netloc
        if host not in hosts:  # one connection per host for the whole zoo
            hosts[host] = host_unreachable(where[1], what=_host_name(where[1]), timeout=timeout)
        if hosts[host] is not None:
            blocked[entry.name] = f"not cached, and {hosts[host]}"
    if zoo.entries and len(blocked) == len(zoo.entries):
        reason, count = Counter(blocked.values()).most_common(1)[0]
        share = "every one" if count == len(blocked) else f"{count} of them"
        raise ModelNotFoundError(f"zoo {zoo.name}: none of its {len(zoo.entries)} models can be scored here: {reason} "
                                 f"({share}); {_FIX}", ref=zoo.name)
    return blocked
