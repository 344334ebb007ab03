"""The randomised control (``--metrics rand``): seeded shuffles, correlation traps, spectrum distance."""

from __future__ import annotations

import json
import math
import zlib

import numpy as np
import pytest
import torch
from scipy.stats import wasserstein_distance

import wbfe
from wbfe.metrics import DEFAULT_GROUPS, resolve_groups
from wbfe.metrics.rand import count_traps, log_spectrum_distance, mp_edge, shuffle_matrix


def _gauss(rows: int, cols: int, seed: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).standard_normal((rows, cols)))


def _row(result: wbfe.ModelScore, name: str) -> dict:
    return next(layer for layer in result.layers if layer["name"] == name)


def test_rand_is_opt_in() -> None:
    assert "rand" not in DEFAULT_GROUPS
    assert resolve_groups("rand")[0].name == "rand"
    plain = wbfe.score({"fc.weight": _gauss(40, 60, 0)}, metrics=None)
    assert "rand_traps" not in plain.layers[0]


def test_shuffle_is_a_permutation_in_the_stored_dtype() -> None:
    w = _gauss(30, 50, 1).to(torch.bfloat16)
    s = shuffle_matrix(w, np.random.default_rng(0))
    assert s.dtype == torch.bfloat16 and s.shape == w.shape
    assert torch.equal(torch.sort(s.reshape(-1).float()).values, torch.sort(w.reshape(-1).float()).values)
    assert not torch.equal(s, w)
    assert torch.equal(shuffle_matrix(w, np.random.default_rng(0)), s)


def test_shuffled_spectrum_matches_numpy_on_the_same_permutation() -> None:
    w = _gauss(48, 80, 2).float()
    result = wbfe.score({"fc.weight": w}, metrics="rand", seed=7)
    row = result.layers[0]
    # The permutation the group documents: SeedSequence([seed, crc32(name), slice index]) shuffling
    # the elements' bits; reproduced here independently with numpy.
    bits = w.numpy().copy().view(np.int32).reshape(-1)
    np.random.default_rng(np.random.SeedSequence([7, zlib.crc32(b"fc.weight"), 0])).shuffle(bits)
    shuffled = bits.view(np.float32).reshape(w.shape).astype(np.float64)
    e_s = np.sort(np.linalg.svd(shuffled, compute_uv=False) ** 2)
    e_w = np.sort(np.linalg.svd(w.numpy().astype(np.float64), compute_uv=False) ** 2)
    assert row["rand_lambda_max"] == pytest.approx(e_s[-1], rel=1e-10)
    assert row["rand_max_ratio"] == pytest.approx(e_s[-1] / e_w[-1], rel=1e-10)
    assert row["rand_distance"] == pytest.approx(wasserstein_distance(np.log(e_w), np.log(e_s)), rel=1e-8)
    sigma2 = float(np.var(w.numpy().astype(np.float64)))
    assert row["rand_bulk_max"] == pytest.approx(sigma2 * (math.sqrt(48) + math.sqrt(80)) ** 2, rel=1e-9)
    assert result.model["options"]["seed"] == 7


def test_seeded_and_reproducible() -> None:
    state = {"a.weight": _gauss(40, 70, 3), "b.weight": _gauss(64, 32, 4)}
    first = wbfe.score(state, metrics="rand", seed=0)
    again = wbfe.score(state, metrics="rand", seed=0)
    other = wbfe.score(state, metrics="rand", seed=1)
    assert first.to_json() == again.to_json()
    assert _row(first, "a.weight")["rand_lambda_max"] != _row(other, "a.weight")["rand_lambda_max"]
    assert first.model["options"]["seed"] == 0


def test_gaussian_matrix_unchanged_by_shuffling_beyond_sampling_error() -> None:
    w = _gauss(200, 400, 5)
    row = wbfe.score({"fc.weight": w}, metrics="rand,htsr").layers[0]
    assert row["rand_traps"] == 0
    # Sampling error: the same distance between two independent Gaussian matrices' spectra.
    e1 = np.linalg.svd(w.numpy(), compute_uv=False) ** 2
    e2 = np.linalg.svd(_gauss(200, 400, 6).numpy(), compute_uv=False) ** 2
    sampling = log_spectrum_distance(e1, e2)
    assert row["rand_distance"] < 3 * sampling + 1e-3
    assert abs(row["rand_max_ratio"] - 1.0) < 0.05
    # ... while a matrix with structure (rank 5 on top of the noise) is far from its shuffle.
    u, v = _gauss(200, 5, 7), _gauss(5, 400, 8)
    structured = wbfe.score({"fc.weight": w + 3.0 * u @ v}, metrics="rand").layers[0]
    assert structured["rand_distance"] > 10 * row["rand_distance"]
    assert structured["rand_max_ratio"] < 0.2


def test_planted_huge_element_is_a_trap() -> None:
    w = _gauss(200, 400, 9)
    w[17, 123] = 60.0
    row = wbfe.score({"fc.weight": w}, metrics="rand").layers[0]
    assert row["rand_traps"] == 1
    assert row["rand_lambda_max"] > 3500.0  # ≈ 60² plus the bulk


def test_the_mean_of_the_entries_is_not_a_trap() -> None:
    w = _gauss(200, 400, 10) + 0.5  # the rank-one mean leaves the bulk: θ² = 0.25·80,000 ≫ σ²·√(pP)
    row = wbfe.score({"fc.weight": w}, metrics="rand").layers[0]
    assert row["rand_lambda_max"] > 2 * row["rand_bulk_max"]  # the mean's outlier is there
    assert row["rand_traps"] == 0
    w[3, 5] = 80.0
    assert wbfe.score({"fc.weight": w}, metrics="rand").layers[0]["rand_traps"] == 1


def test_count_traps_closed_form() -> None:
    edge = mp_edge(1.0, 100, 400)
    assert edge == pytest.approx(900.0)
    eigs = np.array([1.0, 800.0, 900.0, 1000.0, 5000.0])
    # threshold = 900 + 4·(10 + 20)·(1/10 + 1/20)^(1/3) = 900 + 63.9...
    assert count_traps(eigs, 100, 400, 0.0, 1.0) == (2, edge)


def test_cli_seed_and_bad_seed(tmp_path) -> None:
    from safetensors.torch import save_file
    from typer.testing import CliRunner

    from wbfe_cli.main import app

    path = tmp_path / "m.safetensors"
    save_file({"fc.weight": _gauss(30, 40, 11).float().contiguous()}, str(path))
    runner = CliRunner()
    out = runner.invoke(app, ["score", str(path), "--metrics", "rand", "--seed", "3", "--format", "json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["model"]["options"]["seed"] == 3 and "rand_traps" in data["layers"][0]
    bad = runner.invoke(app, ["score", str(path), "--metrics", "rand", "--seed", "-1"])
    assert bad.exit_code == 2
    with pytest.raises(wbfe.InvalidOptionError):
        wbfe.score(str(path), metrics="rand", seed=-1)


def test_extreme_scale_matrix_gets_the_same_control() -> None:
    # A matrix at 1e-200 has its Gram matrix scaled into float64's range (Spectrum.log_scale): the
    # control must be the same as for the matrix at scale 1, with the absolute columns rescaled.
    w = _gauss(60, 90, 12)
    w[5, 7] = 40.0
    one = wbfe.score({"fc.weight": w}, metrics="rand").layers[0]
    tiny = wbfe.score({"fc.weight": w * 1e-200}, metrics="rand").layers[0]
    for column in ("rand_distance", "rand_traps", "rand_max_ratio"):
        assert tiny[column] == pytest.approx(one[column], rel=1e-9), column
    assert tiny["rand_traps"] == 1
    # 1e-400 times the value at scale 1 is below float64's range: NaN and why, as every other absolute column
    # (it was 0.0, and +inf above the range, with no reason)
    for huge, far in ((False, tiny), (True, wbfe.score({"fc.weight": w * 1e200}, metrics="rand").layers[0])):
        for column in ("rand_lambda_max", "rand_bulk_max"):
            assert math.isnan(far[column]), (huge, column)
            assert far["reasons"][column].startswith("outside float64's range: the eigenvalues are of order 1e"), column
    big = wbfe.score({"fc.weight": w * 1e100}, metrics="rand").layers[0]
    assert big["rand_lambda_max"] == pytest.approx(one["rand_lambda_max"] * 1e200, rel=1e-9)


def test_shuffle_matrix_refuses_entries_it_cannot_permute_and_keeps_an_empty_one() -> None:
    from wbfe.errors import UnsupportedDtypeError
    from wbfe.metrics.rand import shuffle_matrix

    # complex128 (16 bytes) and objects were a KeyError and numpy's TypeError; complex64 is 8 bytes, permuted whole.
    for matrix in (np.ones((2, 3), np.complex128), np.array([[1.0, None]], dtype=object),
                   torch.ones(2, 2, dtype=torch.complex128)):
        with pytest.raises(UnsupportedDtypeError, match=r"^shuffle_matrix permutes numbers of 1, 2, 4 or 8 bytes, not"):
            shuffle_matrix(matrix, np.random.default_rng(0))
    c = np.arange(6).reshape(2, 3) * (1 + 2j)
    got = shuffle_matrix(c.astype(np.complex64), np.random.default_rng(0))
    assert sorted(got.ravel().tolist(), key=abs) == sorted(c.ravel().tolist(), key=abs)
    empty = shuffle_matrix(np.zeros((0, 3)), np.random.default_rng(0))  # was KeyError: 0 (its width from 0 bytes)
    assert empty.shape == (0, 3) and empty.dtype == np.float64
