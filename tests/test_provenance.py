"""Provenance: the versions that computed the numbers and the digest of wbfe's own source."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import scipy
import torch

import wbfe
from wbfe._provenance import installed_versions, source_digest, tree_digest


def test_versions_are_the_running_libraries() -> None:
    versions = installed_versions()
    assert (versions["torch"], versions["numpy"], versions["scipy"]) == (torch.__version__, np.__version__, scipy.__version__)
    assert source_digest() == tree_digest(Path(wbfe.__file__).parent)
    assert wbfe.score({"fc.weight": torch.eye(12)}, metrics="bfe").model["versions"] == versions


def test_tree_digest_follows_every_source_file_and_its_path(tmp_path: Path) -> None:
    tree = tmp_path / "pkg"
    (tree / "sub").mkdir(parents=True)
    (tree / "a.py").write_text("x = 1\n")
    (tree / "sub" / "b.py").write_text("y = 2\n")
    first = tree_digest(tree)
    # Independently: SHA-256 over (path NUL bytes NUL) in path order.
    h = hashlib.sha256(b"a.py\0x = 1\n\0sub/b.py\0y = 2\n\0")
    assert first == h.hexdigest()[:16]
    (tree / "notes.txt").write_text("not code")
    (tree / "sub" / "__pycache__").mkdir()
    (tree / "sub" / "__pycache__" / "b.cpython-311.pyc").write_bytes(b"\0\1")
    assert tree_digest(tree) == first  # only the .py files count
    shutil.copytree(tree, tmp_path / "copy")
    assert tree_digest(tmp_path / "copy") == first  # where the tree lies does not count
    (tree / "sub" / "b.py").write_text("y = 3\n")
    edited = tree_digest(tree)
    (tree / "sub" / "b.py").rename(tree / "sub" / "c.py")
    assert len({first, edited, tree_digest(tree)}) == 3
