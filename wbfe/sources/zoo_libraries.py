"""``timm:<name>`` and ``torchvision:<weights>``: weights of the two model libraries, from their caches (the
hub for timm's ``timm/<name>.<tag>``, else ``$TORCH_HOME/hub/checkpoints/<file name>``)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from wbfe._config import hf_offline, torch_hub_dir
from wbfe._deps import require_torch
from wbfe.errors import MissingDependencyError, ModelNotFoundError, unknown_name
from wbfe.framework import FrameworkDescription
from wbfe.framework.timm_model import describe_timm
from wbfe.sources._base import TensorSource
from wbfe.sources.hub import hub_cached, hub_endpoint, open_hub
from wbfe.sources.local import open_path
from wbfe.sources.registry import register_location

__all__ = ["open_timm", "open_torchvision", "open_url_checkpoint", "open_timm_ref", "open_torchvision_ref",
           "url_cache_path", "library_weights"]


def url_cache_path(url: str) -> Path:
    """Where torch and timm cache the checkpoint published at ``url``: ``$TORCH_HOME/hub/checkpoints/<file>``."""
    return torch_hub_dir() / "checkpoints" / Path(urlparse(url).path).name


def library_weights(ref: str) -> tuple[bool, str]:
    """``(cached, url)``: whether a ``timm:`` / ``torchvision:`` reference is cached here (no network), and the
    checkpoint's URL (the hub endpoint for weights on the hub); raises as opening ``ref`` would."""
    if ref.startswith("torchvision:"):
        weights = _torchvision_weights(ref[len("torchvision:"):], ref)
        return url_cache_path(weights.url).is_file(), str(weights.url)
    name = ref[len("timm:"):]
    cfg = _timm_cfg(name)
    if cfg is None:
        return hub_cached(f"timm/{name}"), hub_endpoint()
    hub_id, url = getattr(cfg, "hf_hub_id", None), getattr(cfg, "url", None)
    if (hub_id and hub_cached(str(hub_id))) or (url and url_cache_path(str(url)).is_file()):
        return True, str(url or hub_endpoint())
    if not hub_id and not url:
        raise ModelNotFoundError(f"{ref}: timm has no downloadable weights for {name!r}", ref=ref)
    return False, hub_endpoint() if hub_id else str(url)


def _torchvision_weights(name: str, ref: str) -> Any:
    try:
        from torchvision import models
    except ImportError:
        raise MissingDependencyError(f"{ref}: torchvision is not installed (pip install torchvision)") from None
    try:
        return models.get_weight(name) if "." in name else models.get_model_weights(name).DEFAULT
    except (ValueError, KeyError, AttributeError):
        raise unknown_name("torchvision model or weights", name, models.list_models()) from None


def _timm_cfg(name: str) -> Any:
    """timm's pretrained config of ``name`` (None without timm)."""
    try:
        import timm
    except ImportError:
        return None
    cfg = timm.models.get_pretrained_cfg(name)
    if cfg is None:
        raise unknown_name("timm pretrained model", name, timm.list_pretrained())
    return cfg


def open_url_checkpoint(url: str, *, ref: str, fmt: str) -> TensorSource:
    """Open a checkpoint published at ``url`` from the torch hub cache, downloading it if allowed."""
    target = url_cache_path(url)
    if not target.is_file():
        if hf_offline():
            raise ModelNotFoundError(f"{ref}: {target} is not cached and HF_HUB_OFFLINE is set", ref=ref)
        require_torch(f"{ref}: downloading the checkpoint (torch.hub)")
        import torch

        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            torch.hub.download_url_to_file(url, str(target), progress=False)
        except Exception as exc:  # noqa: BLE001 - any network failure means "cannot resolve"
            raise ModelNotFoundError(
                f"{ref}: download of {url} failed and it is not cached ({exc.__class__.__name__})", ref=ref) from None
    source = open_path(target, ref=ref, fmt=fmt)
    source.provenance.extra["url"] = url
    return source


def open_timm(name: str, *, ref: str) -> TensorSource:
    """Open the pretrained weights of timm model ``name`` (without timm: the hub repo ``timm/<name>``)."""
    cfg = _timm_cfg(name)
    if cfg is None:
        return open_hub(f"timm/{name}", fmt="timm")
    if getattr(cfg, "hf_hub_id", None):
        try:
            source = open_hub(str(cfg.hf_hub_id), fmt="timm")
        except ModelNotFoundError:
            if not getattr(cfg, "url", None):
                raise
        else:
            source.provenance.source = ref
            return source
    if getattr(cfg, "url", None):
        source = open_url_checkpoint(str(cfg.url), ref=ref, fmt="timm")
        # A bare .pth carries no config: timm itself describes the model it was made for.
        described = describe_timm(name)
        if isinstance(described, FrameworkDescription):
            source.own_description = described
        return source
    raise ModelNotFoundError(f"{ref}: timm has no downloadable weights for {name!r}", ref=ref)


def open_torchvision(name: str, *, ref: str) -> TensorSource:
    """Open torchvision weights by enum name (``ResNet18_Weights.IMAGENET1K_V1``) or model name (default weights)."""
    weights = _torchvision_weights(name, ref)
    source = open_url_checkpoint(weights.url, ref=ref, fmt="torchvision")
    source.provenance.extra["weights"] = str(weights)
    return source


def _prefixed(prefix: str, ref: Any) -> bool:
    return isinstance(ref, (str, Path)) and str(ref).startswith(prefix)


@register_location("timm", order=40, claims=functools.partial(_prefixed, "timm:"))
def open_timm_ref(ref: Any) -> TensorSource:
    return open_timm(str(ref)[len("timm:"):], ref=str(ref))


@register_location("torchvision", order=41, claims=functools.partial(_prefixed, "torchvision:"))
def open_torchvision_ref(ref: Any) -> TensorSource:
    return open_torchvision(str(ref)[len("torchvision:"):], ref=str(ref))
