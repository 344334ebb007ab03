"""Tensor -> matrix planning: conventions, roles, skip reasons, head identification."""

from __future__ import annotations

import pytest
import torch

from wbfe.engine.matrices import MatrixPlan, Skip, as_matrices, find_head, plan_matrix, role_of
from wbfe.errors import InvalidOptionError


def test_dense_and_conv_conventions() -> None:
    dense = plan_matrix("fc.weight", (10, 64), "float32")
    assert isinstance(dense, MatrixPlan)
    assert (dense.rows, dense.cols, dense.n_slices, dense.convention) == (10, 64, 1, "dense")
    flat = plan_matrix("conv.weight", (16, 8, 3, 3), "float32", conv="flatten")
    assert isinstance(flat, MatrixPlan) and (flat.rows, flat.cols, flat.n_slices) == (16, 72, 1)
    sl = plan_matrix("conv.weight", (16, 8, 3, 3), "float32", conv="slices")
    assert isinstance(sl, MatrixPlan) and (sl.rows, sl.cols, sl.n_slices, sl.n_eigs) == (16, 8, 9, 72)
    w = torch.randn(16, 8, 3, 3)
    mats = as_matrices(w, sl)
    assert len(mats) == 9 and torch.equal(mats[4], w[:, :, 1, 1])
    assert torch.equal(as_matrices(w, flat)[0], w.reshape(16, 72))


@pytest.mark.parametrize(
    "shape,dtype,reason",
    [
        ((10,), "float32", "1-D tensor"),
        ((), "float32", "0-D tensor"),
        ((10, 64), "int8", "integer tensor (int8)"),
        ((), "int64", "integer tensor (int64)"),
        ((10, 64), "float8_e4m3fn", "unsupported dtype float8_e4m3fn"),
        ((1, 64), "float32", "too small: 1 eigenvalue(s) < BFE-W needs at least 2"),
        ((1, 1, 768), "float32", "3-D parameter with one row"),
        ((0, 64), "float32", "empty tensor"),
    ],
)
def test_skip_reasons(shape: tuple[int, ...], dtype: str, reason: str) -> None:
    out = plan_matrix("t", shape, dtype)
    assert isinstance(out, Skip) and out.reason.startswith(reason)


def test_bad_convention() -> None:
    with pytest.raises(InvalidOptionError, match="conv convention"):
        plan_matrix("t", (4, 4, 3, 3), "float32", conv="rows")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "name,ndim,role",
    [
        ("bert.encoder.layer.0.attention.self.query.weight", 2, "attention"),
        ("bert.encoder.layer.0.attention.output.dense.weight", 2, "attention"),
        ("bert.encoder.layer.0.intermediate.dense.weight", 2, "mlp"),
        ("bert.encoder.layer.0.output.dense.weight", 2, "mlp"),
        ("model.layers.3.mlp.down_proj.weight", 2, "mlp"),
        ("transformer.wte.weight", 2, "embedding"),
        ("layer1.0.conv1.weight", 4, "conv"),
        ("pooler.dense.weight", 2, "other"),
    ],
)
def test_roles(name: str, ndim: int, role: str) -> None:
    assert role_of(name, ndim) == role


@pytest.mark.parametrize(
    "names,head",
    [
        (["conv1.weight", "linear.weight"], "linear.weight"),  # CIFAR ResNets
        (["features.0.weight", "classifier.0.weight", "classifier.3.weight", "classifier.6.weight"], "classifier.6.weight"),
        (["classifier.10.weight", "classifier.9.weight"], "classifier.10.weight"),  # natural order
        (["model.embed_tokens.weight", "model.layers.0.mlp.fc.weight", "lm_head.weight"], "lm_head.weight"),
        (["gpt_neox.embed_in.weight", "embed_out.weight"], "embed_out.weight"),
        (["head.fc.weight", "stages.0.conv.weight"], "head.fc.weight"),
        (["encoder.layer.0.output.dense.weight", "pooler.dense.weight"], None),
    ],
)
def test_find_head(names: list[str], head: str | None) -> None:
    assert find_head(names) == head


def test_head_override() -> None:
    names = ["a.weight", "b.weight"]
    assert find_head(names, "a") == "a.weight"
    assert find_head(names, "b.weight") == "b.weight"
    with pytest.raises(InvalidOptionError, match=r"--head 'a.weigh' is not an analysed matrix; did you mean 'a.weight'"):
        find_head(names, "a.weigh")
