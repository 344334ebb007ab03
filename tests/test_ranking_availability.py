"""wbfe.ranking.availability: a zoo whose models are neither cached nor downloadable fails at once with one
error (HF_HUB_OFFLINE, or a hub endpoint on a closed local port); never the network."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from wbfe.errors import ModelNotFoundError
from wbfe.ranking import availability
from wbfe.ranking.zoo import load_zoo, zoo_from_rows
from wbfe.sources import hub
from wbfe.sources.zoo_libraries import library_weights, url_cache_path

FIX = "run once with a network to cache the weights, or point TORCH_HOME / HF_HUB_CACHE at a cache that holds them"


def closed_port() -> int:
    """A local TCP port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def unreachable_hub(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Online mode, the hub endpoint on a closed local port; returns the hosts connected to (each check)."""
    from huggingface_hub import HfApi, constants

    endpoint = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(HfApi, "model_info", lambda *a, **k: pytest.fail("the hub client was called"))
    calls: list[str] = []
    real = hub.host_unreachable

    def counted(url: str, **kwargs: object) -> object:
        calls.append(url)
        return real(url, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(hub, "host_unreachable", counted)
    return calls


def _zoo(refs: list[str]):  # noqa: ANN202
    return zoo_from_rows([{"model": f"m{i}", "checkpoint": ref, "acc": 0.5 + i / 10} for i, ref in enumerate(refs)],
                         name="t")


def test_torchvision_offline_fails_once_with_one_error() -> None:
    pytest.importorskip("torchvision")
    zoo = load_zoo("torchvision-imagenet")  # conftest: HF_HUB_OFFLINE=1 and an empty TORCH_HOME
    with pytest.raises(ModelNotFoundError) as err:
        availability.unavailable_models(zoo)
    assert str(err.value) == (f"zoo torchvision-imagenet: none of its {len(zoo.entries)} models can be scored here: "
                              f"not cached, and HF_HUB_OFFLINE is set (every one); {FIX}")


def test_a_cached_torchvision_weight_is_available() -> None:
    models = pytest.importorskip("torchvision.models")
    weights = models.ResNet18_Weights.IMAGENET1K_V1
    ref = "torchvision:ResNet18_Weights.IMAGENET1K_V1"
    assert library_weights(ref) == (False, weights.url)
    target = url_cache_path(weights.url)
    assert target.name == Path(weights.url).name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"")  # only its presence is looked at
    try:
        assert library_weights(ref) == (True, weights.url)
        blocked = availability.unavailable_models(_zoo([ref, "torchvision:AlexNet_Weights.IMAGENET1K_V1"]))
        assert blocked == {"m1": "not cached, and HF_HUB_OFFLINE is set"}
    finally:
        target.unlink()


def test_closed_hub_endpoint_is_checked_once(unreachable_hub: list[str], tmp_path: Path) -> None:
    refs = ["nobody/model-a", "nobody/model-b@main", "hf:nobody/model-c"]
    with pytest.raises(ModelNotFoundError) as err:
        availability.unavailable_models(_zoo(refs))
    assert str(err.value) == ("zoo t: none of its 3 models can be scored here: not cached, and the Hugging Face hub "
                              f"could not be reached (127.0.0.1: Connection refused) (every one); {FIX}")
    assert len(unreachable_hub) == 1  # one connection for the whole zoo
    local = tmp_path / "here.safetensors"
    local.write_bytes(b"")
    blocked = availability.unavailable_models(_zoo([str(local), *refs]))
    assert sorted(blocked) == ["m1", "m2", "m3"] and len(unreachable_hub) == 2


def test_a_listening_host_is_left_to_the_scorer(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert availability.unavailable_models(_zoo(["nobody/model-a"])) == {}


def test_unknown_names_and_uris_are_not_judged() -> None:
    assert availability.unavailable_models(_zoo(["s3://bucket/model/", "torchvision:NoSuch_Weights.X"])) == {}


def test_timm_weights_on_the_hub_name_the_endpoint_set_now(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """HF_ENDPOINT set after huggingface_hub was imported (a mirror chosen in the process) is the address a timm
    reference reports, as for hub ids (huggingface_hub itself reads the variable once, at import)."""
    pytest.importorskip("timm", reason="needs the timm extra: pip install -e '.[test,timm]'")
    import huggingface_hub  # noqa: F401 - imported before the variable is set

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.invalid/")
    assert library_weights("timm:resnet18") == (False, "http://mirror.invalid")
