"""Checkpoints shipped with wbfe (the repository's ``fixtures/`` folder, installed as ``wbfe._fixtures``)."""

from __future__ import annotations

from pathlib import Path

from wbfe.errors import SourceNotFoundError

__all__ = ["fixtures_dir", "default_checkpoint"]

DEFAULT_CHECKPOINT = "fmnist-cnn/model.safetensors"


def fixtures_dir() -> Path:
    """The shipped fixtures: the installed package data, or a source checkout's ``fixtures/`` folder."""
    from importlib import resources

    try:
        return Path(str(resources.files("wbfe._fixtures")))
    except ModuleNotFoundError:
        # a checkout, where fixtures/ is the sibling of wbfe/ rather than a subpackage
        return Path(__file__).resolve().parents[1] / "fixtures"


def default_checkpoint() -> Path:
    """The checkpoint ``wbfe score`` scores when given no reference: a small Fashion-MNIST CNN
    (SourceNotFoundError where the fixtures were not installed)."""
    path = fixtures_dir() / DEFAULT_CHECKPOINT
    if not path.is_file():
        raise SourceNotFoundError(f"the default checkpoint {DEFAULT_CHECKPOINT} is not installed", path=str(path))
    return path
