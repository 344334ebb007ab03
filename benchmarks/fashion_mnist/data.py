"""Read Fashion-MNIST from its IDX files into numpy arrays.

The files come from the Debian package ``dataset-fashion-mnist`` (installed under
``/usr/share/datasets/fashion-mnist``). Fashion-MNIST is MIT-licensed, (c) 2017 Zalando SE.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from wbfe.errors import CorruptCheckpointError, InvalidOptionError, SourceNotFoundError

__all__ = [
    "DEFAULT_ROOT",
    "MEAN",
    "STD",
    "SPLITS",
    "data_available",
    "idx_paths",
    "load_split",
    "normalize",
    "read_idx",
]

DEFAULT_ROOT = Path("/usr/share/datasets/fashion-mnist")
SPLITS = {"train": "train", "test": "t10k"}

# Pixel mean and standard deviation of the 60k training images after scaling to [0, 1]; fixed here
# (not recomputed per run) so every checkpoint sees exactly the same input transform.
MEAN = 0.2860
STD = 0.3530

# IDX magic: two zero bytes, a type code (0x08 = unsigned byte), then the number of dimensions.
_UBYTE = 0x08


def idx_paths(split: str, root: Path | str = DEFAULT_ROOT) -> tuple[Path, Path]:
    """Return the (images, labels) IDX file paths of one split.

    Args:
        split: ``"train"`` (60,000 images) or ``"test"`` (10,000 images).
        root: folder holding the ``*-ubyte.gz`` files.

    Returns:
        The paths of the image file and the label file (they may not exist).

    Raises:
        InvalidOptionError: ``split`` is not ``"train"`` or ``"test"``.
    """
    if split not in SPLITS:
        raise InvalidOptionError(
            f"split must be one of {sorted(SPLITS)}, got {split!r}", option="split", value=split
        )
    stem = SPLITS[split]
    root = Path(root)
    return root / f"{stem}-images-idx3-ubyte.gz", root / f"{stem}-labels-idx1-ubyte.gz"


def data_available(root: Path | str = DEFAULT_ROOT) -> bool:
    """Whether all four Fashion-MNIST IDX files are present under ``root``."""
    return all(p.is_file() for split in SPLITS for p in idx_paths(split, root))


def read_idx(path: Path | str) -> np.ndarray:
    """Read one (optionally gzip-compressed) IDX file of unsigned bytes.

    Args:
        path: an ``.idx*-ubyte`` file, gzip-compressed when its name ends in ``.gz``.

    Returns:
        A ``uint8`` array with the shape given in the file header.

    Raises:
        SourceNotFoundError: the file does not exist.
        CorruptCheckpointError: the header is not an unsigned-byte IDX header, or the payload is
            shorter or longer than the header says.
    """
    path = Path(path)
    if not path.is_file():
        raise SourceNotFoundError(f"IDX file not found: {path}", path=str(path))
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != _UBYTE:
        raise CorruptCheckpointError(f"not an unsigned-byte IDX file: {path}", path=str(path))
    ndim = raw[3]
    header = 4 + 4 * ndim
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = int(np.prod(shape, dtype=np.int64))
    if len(raw) - header != expected:
        raise CorruptCheckpointError(
            f"IDX payload of {path} has {len(raw) - header} bytes, header says {expected}",
            path=str(path),
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def load_split(split: str, root: Path | str = DEFAULT_ROOT) -> tuple[np.ndarray, np.ndarray]:
    """Load one split of Fashion-MNIST.

    Args:
        split: ``"train"`` or ``"test"``.
        root: folder holding the IDX files (default: where the Debian package installs them).

    Returns:
        ``(images, labels)``: ``uint8`` images of shape (n, 28, 28) and ``int64`` labels in 0..9.

    Raises:
        SourceNotFoundError: the files are missing; the message names the Debian package.
        CorruptCheckpointError: a file is not a valid IDX file, or images and labels disagree.
    """
    images_path, labels_path = idx_paths(split, root)
    missing = [str(p) for p in (images_path, labels_path) if not p.is_file()]
    if missing:
        raise SourceNotFoundError(
            f"Fashion-MNIST {split} files not found ({', '.join(missing)}); "
            "install the Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist)",
            path=missing[0],
        )
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.ndim != 3 or labels.ndim != 1 or images.shape[0] != labels.shape[0]:
        raise CorruptCheckpointError(
            f"Fashion-MNIST {split}: images {images.shape} and labels {labels.shape} do not match",
            path=str(images_path),
        )
    return images, labels.astype(np.int64)


def normalize(images: np.ndarray) -> np.ndarray:
    """Turn ``uint8`` images (n, 28, 28) into float32 network inputs (n, 1, 28, 28).

    Args:
        images: raw pixel values in 0..255.

    Returns:
        ``(images / 255 - MEAN) / STD`` as float32 with a channel axis added.
    """
    x = images.astype(np.float32) / np.float32(255.0)
    x = (x - np.float32(MEAN)) / np.float32(STD)
    return x[:, None, :, :]
