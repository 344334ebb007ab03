"""One zero rule, per matrix and per slice, on the matrix's own scale (issue 45 item 2).

Every BFE-W here is checked against an independent truth: numpy's SVD of W itself in float64 (no
Gram matrix), through ``wbfe.score`` on a safetensors file, with the default metrics and with
``bfe`` alone, so that the eigenvalue path, the Cholesky path, the LU path (square p >= 256) and the
batched path all meet the same truth."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

import wbfe
from wbfe.linalg import spectra
from wbfe.metrics.bfe import LOG_2PI_E
from wbfe.linalg.spectra import spectrum

CPU = spectra.Device("cpu")
METRIC_SETS = (None, "bfe")  # None: the default bfe,htsr


def _truth(slices: list[np.ndarray]) -> float:
    """BFE-W at λ* of the pooled squared singular values, from an SVD of each matrix itself."""
    e = np.concatenate([np.linalg.svd(s.astype(np.float64), compute_uv=False) ** 2 for s in slices])
    if np.any(e == 0.0):
        return math.inf
    return 0.5 * LOG_2PI_E + 0.5 * (math.log(np.mean(e)) - float(np.mean(np.log(e))))


def _with_singular_values(rng: np.random.Generator, sv: np.ndarray, rows: int, cols: int) -> np.ndarray:
    p = min(rows, cols)
    u, _ = np.linalg.qr(rng.standard_normal((rows, p)))
    v, _ = np.linalg.qr(rng.standard_normal((cols, p)))
    return (u * sv) @ v.T


def _profile(kind: str, p: int, cond: float) -> np.ndarray:
    if kind == "one_small":  # the matrix: 1, 1e-2 (p - 2 times), and 1/cond
        return np.array([1.0] + [1e-2] * (p - 2) + [1.0 / cond])
    return np.logspace(0.0, -math.log10(cond), p)


def _score(tmp_path: Path, tensors: dict[str, np.ndarray], **kwargs) -> dict[str, dict]:
    path = tmp_path / "m.safetensors"
    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path))
    result = wbfe.score(path, device="cpu", **kwargs)
    return {row["name"]: row for row in result.layers}


CONDS = [10.0**k for k in range(2, 13)]


@pytest.mark.parametrize("kind", ["one_small", "geometric"])
@pytest.mark.parametrize("shape", [(64, 256), (256, 256)])  # 256² takes the LU path with bfe alone
def test_conditioning_sweep_dense(tmp_path: Path, kind: str, shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(45)
    rows, cols = shape
    tensors = {f"l{k}.weight": _with_singular_values(rng, _profile(kind, min(shape), c), rows, cols)
               for k, c in enumerate(CONDS)}
    got = {m: _score(tmp_path, tensors, metrics=m) for m in METRIC_SETS}
    for name, w in tensors.items():
        truth = _truth([w])
        for m in METRIC_SETS:
            row = got[m][name]
            assert row["bfe"] == pytest.approx(truth, rel=1e-6), (name, m, row["reasons"])
            assert row["dead_rows"] == row["dead_cols"] == 0
        assert got[None][name]["bfe"] == pytest.approx(got["bfe"][name]["bfe"], rel=1e-9), name


@pytest.mark.parametrize("conv", ["flatten", "slices"])
def test_conditioning_sweep_conv(tmp_path: Path, conv: str) -> None:
    """Each kernel position is its own ill-conditioned 32×96 matrix; flattened they form another."""
    rng = np.random.default_rng(7)
    tensors = {}
    for k, c in enumerate(CONDS):
        kernel = np.empty((32, 96, 2, 2))
        for i in range(2):
            for j in range(2):
                kernel[:, :, i, j] = _with_singular_values(rng, _profile("geometric", 32, c * (1 + i + 2 * j)), 32, 96)
        tensors[f"c{k}.weight"] = kernel
    got = {m: _score(tmp_path, tensors, metrics=m, conv=conv) for m in METRIC_SETS}
    for name, kernel in tensors.items():
        parts = ([kernel.reshape(32, -1)] if conv == "flatten"
                 else [kernel[:, :, i, j] for i in range(2) for j in range(2)])
        truth = _truth(parts)
        for m in METRIC_SETS:
            assert got[m][name]["bfe"] == pytest.approx(truth, rel=1e-6), (name, m, got[m][name]["reasons"])
        assert got[None][name]["bfe"] == pytest.approx(got["bfe"][name]["bfe"], rel=1e-9), name


@pytest.mark.parametrize("ww_compatible", [False, True])
def test_slices_with_one_near_zero_position(tmp_path: Path, ww_compatible: bool) -> None:
    """One kernel position scaled by 1e-9 is a full-rank slice on its own scale, not +inf against the
    other slices' largest eigenvalue (``--ww-compatible`` implies slices)."""
    rng = np.random.default_rng(3)
    kernel = rng.standard_normal((48, 64, 3, 3)).astype(np.float32)
    kernel[:, :, 1, 1] *= np.float32(1e-9)
    truth = _truth([kernel[:, :, i, j] for i in range(3) for j in range(3)])
    assert math.isfinite(truth)
    for m in METRIC_SETS:
        row = _score(tmp_path, {"conv.weight": kernel}, metrics=m, conv="slices", ww_compatible=ww_compatible)["conv.weight"]
        assert row["bfe"] == pytest.approx(truth, rel=1e-6), (m, row["reasons"])


@pytest.mark.parametrize("where", ["rows", "cols"])
@pytest.mark.parametrize("shape", [(64, 256), (256, 64), (300, 300)])
def test_dead_rows_and_columns_are_left_out(tmp_path: Path, where: str, shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(11)
    w = rng.standard_normal(shape)
    dead = [0, 5, 17, 40]
    if where == "rows":
        w[dead, :] = 0.0
        live = np.delete(w, dead, axis=0)
    else:
        w[:, dead] = 0.0
        live = np.delete(w, dead, axis=1)
    truth = _truth([live])
    for m in METRIC_SETS:
        row = _score(tmp_path, {"fc.weight": w}, metrics=m)["fc.weight"]
        assert row["bfe"] == pytest.approx(truth, rel=1e-9), (m, row["reasons"])
        assert (row["dead_rows"], row["dead_cols"]) == ((4, 0) if where == "rows" else (0, 4))
        assert (row["rows"], row["cols"]) == live.shape and row["shape"] == list(shape)
        assert row["n_eigs"] == min(live.shape) and row["gamma"] == min(live.shape) / max(live.shape)
        assert "4 all-zero" in row["reasons"]["dead_units"]
        assert row["reasons"]["dead_units"].endswith(f"of the live {live.shape[0]}x{live.shape[1]} part")


def test_dead_output_channel_of_a_conv_in_every_mode(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    kernel = rng.standard_normal((32, 48, 3, 3))
    kernel[[2, 9], :, :, :] = 0.0  # two dead output channels
    live = np.delete(kernel, [2, 9], axis=0)
    truths = {"flatten": _truth([live.reshape(30, -1)]),
              "slices": _truth([live[:, :, i, j] for i in range(3) for j in range(3)])}
    for conv, truth in truths.items():
        for m in METRIC_SETS:
            row = _score(tmp_path, {"conv.weight": kernel}, metrics=m, conv=conv)["conv.weight"]
            assert row["bfe"] == pytest.approx(truth, rel=1e-9), (conv, m)
            assert row["dead_rows"] == 2 and row["rows"] == 30


def test_singular_live_part_stays_infinite(tmp_path: Path) -> None:
    """Rank 40 of 64 with no zero row or column, and a matrix whose live part repeats a row: +inf."""
    rng = np.random.default_rng(2)
    low = rng.standard_normal((64, 40)) @ rng.standard_normal((40, 256))
    dup = rng.standard_normal((30, 100))
    dup[[3, 7], :] = 0.0
    dup[10] = dup[11]
    for m in METRIC_SETS:
        rows = _score(tmp_path, {"low.weight": low, "dup.weight": dup}, metrics=m)
        assert rows["low.weight"]["bfe"] == math.inf
        assert rows["low.weight"]["reasons"]["bfe"].startswith("rank-deficient: 24 zero")
        assert rows["dup.weight"]["bfe"] == math.inf and rows["dup.weight"]["dead_rows"] == 2
        assert rows["dup.weight"]["reasons"]["bfe"].startswith("rank-deficient: 1 zero")


@pytest.mark.parametrize("need_eigs", [True, False])
def test_gpu_code_path_follows_the_same_rule(monkeypatch: pytest.MonkeyPatch, need_eigs: bool) -> None:
    """The torch code path that serves CUDA, run on the CPU: the same BFE-W as the SVD truth."""
    monkeypatch.setattr(spectra, "_TORCH_ON_CPU", True)
    rng = np.random.default_rng(4)
    for cond in (1e3, 1e7, 1e11):
        w = _with_singular_values(rng, _profile("one_small", 64, cond), 64, 256)
        spec = spectrum([torch.from_numpy(w)], CPU, need_eigs=need_eigs)
        mean_e, mean_log_e, _, n_zero = spec.log_moments()
        got = 0.5 * LOG_2PI_E + 0.5 * (math.log(mean_e) - mean_log_e)
        assert n_zero == 0 and got == pytest.approx(_truth([w]), rel=1e-6), cond


def test_dead_units_are_named_in_the_summary_and_the_table(tmp_path: Path) -> None:
    from wbfe.render.text import score_table

    rng = np.random.default_rng(8)
    w = rng.standard_normal((20, 40))
    w[:, [0, 1]] = 0.0
    path = tmp_path / "m.safetensors"
    save_file({"a.weight": w, "b.weight": rng.standard_normal((20, 40))}, str(path))
    result = wbfe.score(path, device="cpu", metrics="bfe")
    assert result.summary["dead_units"]["n"] == 1
    assert "dead units: 1 matrix(es)" in score_table(result) and "a.weight (0 rows, 2 cols)" in score_table(result)
