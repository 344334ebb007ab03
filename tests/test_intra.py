"""wbfe.metrics.intra (products of consecutive layers): against WeightWatcher 0.7.7's ``intra=True``
and the definition written out with numpy."""

from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings

import numpy as np
import pytest
import torch

from wbfe.engine import IntraChain, score_intra
from wbfe.engine.matrices import plan_matrix
from wbfe.errors import InvalidOptionError, NoUsableMatrixError
from wbfe.metrics.intra import align_pair, intra_matrix

COLUMNS = ("alpha", "xmin", "num_pl_spikes", "log_norm", "log_spectral_norm", "stable_rank", "matrix_rank", "entropy",
           "lambda_max", "sv_min", "rank_loss", "num_spikes", "bulk_max", "mp_softrank")


def heavy(shape: tuple[int, ...], df: float, seed: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).standard_t(df, size=shape).astype(np.float32))


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.ReLU(), torch.nn.Linear(200, 150),
                            torch.nn.Linear(150, 100), torch.nn.Linear(100, 40))
    with torch.no_grad():
        for k, layer in enumerate([m[0], m[2], m[3], m[4]]):
            layer.weight.copy_(heavy(tuple(layer.weight.shape), 3.0, k))
    return m


def chain_products(weights: list[tuple[str, np.ndarray]]) -> list:
    """The engine's products of consecutive matrices of ``weights``, in stream order, without masks."""
    chain = IntraChain(0, sparsify=False)
    return [p for name, w in weights for p in chain.follow(plan_matrix(name, w.shape, "float64"), [w])]


@pytest.mark.parametrize("sparsify", [False, True])
def test_equals_weightwatcher_intra(sparsify: bool) -> None:
    ww = pytest.importorskip("weightwatcher")
    model = _model()
    np.random.seed(5)  # WeightWatcher's sparsify masks come from NumPy's global generator
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            details = ww.WeightWatcher(model=model).analyze(randomize=False, plot=False, intra=True, mp_fit=True,
                                                            sparsify=sparsify)
    finally:
        logging.disable(logging.NOTSET)
    rows = score_intra(model, metrics="htsr", ww_compatible=True, sparsify=sparsify, seed=5)
    assert [r["name"] for r in rows] == ["0.weight X 2.weight", "2.weight X 3.weight", "3.weight X 4.weight"]
    assert len(details) == 3
    for row, (_, ref) in zip(rows, details.iterrows()):
        assert (row["rows"], row["cols"]) == (ref["N"], ref["M"])
        for column in COLUMNS:
            assert row[column] == pytest.approx(float(ref[column]), rel=1e-6), (row["name"], column)


def test_definition_with_numpy() -> None:
    w0, w1 = heavy((80, 100), 3.0, 1).double().numpy(), heavy((60, 80), 3.0, 2).double().numpy()
    x = intra_matrix(w0, w1)
    want = w0.T @ w1.T / (np.linalg.norm(w0) * np.linalg.norm(w1))  # shared side 80
    assert x.shape == (100, 60) and np.allclose(x, want, rtol=1e-12, atol=0)
    pair = chain_products([("a", w0), ("b", w1)])[0]
    assert pair.job().eigs == pytest.approx(np.sort(np.linalg.svd(want, compute_uv=False)), rel=1e-12)
    rng = np.random.RandomState(3)
    s = np.random.RandomState(3).randint(2, size=80 * 80).reshape(80, 80)
    masked = intra_matrix(w0, w1, rng=rng)
    assert np.allclose(masked, w0.T @ s @ w1.T / (np.linalg.norm(w0) * np.linalg.norm(w1) + np.sqrt(np.linalg.norm(s))),
                       rtol=1e-12, atol=0)


def test_alignment_and_chains() -> None:
    a, b = np.zeros((5, 7)), np.zeros((7, 3))
    assert [m.shape for m in align_pair(a, b)] == [(5, 7), (7, 3)]
    assert [m.shape for m in align_pair(a.T, b.T)] == [(5, 7), (7, 3)]
    assert align_pair(np.zeros((5, 6)), np.zeros((7, 8))) is None  # no shared side: skipped
    chain = [("a", np.ones((4, 6))), ("conv", np.ones((4, 4, 3, 3))), ("b", np.ones((6, 4))), ("c", np.ones((6, 2)))]
    assert [p.plan.name for p in chain_products(chain)] == ["b X c"]  # a convolution ends the chain


def test_errors() -> None:
    with pytest.raises(InvalidOptionError, match="needs the matrices themselves"):
        score_intra(_model(), metrics="vectors")
    with pytest.raises(NoUsableMatrixError):
        score_intra({"only.weight": torch.ones(4, 5)})


NO_PRODUCT = ("--intra: no product of consecutive weight matrices was scored (no two consecutive ones share a side, a "
              "factor is non-finite or all zero, or the sparsify product is below float64's range)")


def test_a_score_with_intra_and_no_product_says_so() -> None:
    # score(..., intra=True) of matrices no two of which share a side added no row and said nothing.
    import wbfe

    g = torch.Generator().manual_seed(0)
    state = {"a.weight": torch.randn(20, 30, generator=g), "b.weight": torch.randn(40, 50, generator=g)}
    summary = wbfe.score(state, metrics="bfe", intra=True).summary
    assert summary["intra"] == {"n": 0, "note": NO_PRODUCT}
    assert "intra" not in wbfe.score(state, metrics="bfe").summary


@pytest.mark.filterwarnings("error::RuntimeWarning")  # the norm's overflow is the rescale's signal, not a warning
@pytest.mark.parametrize(("s0", "s1"), [(1.0, 1e300), (1e200, 1e200), (1e-200, 1e-200)])
def test_intra_product_of_extreme_weights_is_the_product_of_their_directions(s0: float, s1: float) -> None:
    # ‖W₀‖·‖W₁‖ overflowed to inf (or underflowed to 0): X was all zeros (or NaN), scored as an all-zero product
    from wbfe.metrics.intra import intra_matrix

    rng = np.random.default_rng(0)
    w0, w1 = rng.standard_normal((20, 30)), rng.standard_normal((40, 20))
    np.testing.assert_allclose(intra_matrix(w0 * s0, w1 * s1), intra_matrix(w0, w1), rtol=1e-12)


def test_a_seed_past_32_bits_is_refused_before_any_work() -> None:
    # WeightWatcher's masks use numpy's legacy RandomState: seed 2**32 passed the options, then numpy raised ValueError.
    import wbfe
    from wbfe.errors import InvalidOptionError

    g = torch.Generator().manual_seed(0)
    state = {"a.weight": torch.randn(20, 30, generator=g), "b.weight": torch.randn(40, 20, generator=g)}
    with pytest.raises(InvalidOptionError, match=r"^seed must be a non-negative integer below 2\*\*32, not 4294967296$"):
        wbfe.score(state, metrics="bfe", intra=True, seed=2**32)
    assert any(row["role"] == "intra" for row in wbfe.score(state, metrics="bfe", intra=True, seed=2**32 - 1).layers)


@pytest.mark.parametrize("m", [0, -1, 2.5, True])
def test_intra_mask_refuses_a_shared_side_below_one(m: object) -> None:
    from wbfe.metrics.intra import intra_mask

    # 0 gave an empty mask, -1 and 2.5 numpy's ValueError and TypeError.
    with pytest.raises(InvalidOptionError, match=r"^the sparsify mask needs a shared side m, a whole number >= 1"):
        intra_mask(np.random.RandomState(0), m)  # type: ignore[arg-type]
    mask = intra_mask(np.random.RandomState(0), 3)
    assert (mask == np.random.RandomState(0).randint(2, size=9).reshape(3, 3)).all()


def _masked_product_mpmath(w0: np.ndarray, s: np.ndarray, w1: np.ndarray) -> np.ndarray:
    """W₀·S·W₁/(‖W₀‖·‖W₁‖ + √‖S‖) at 40 digits from the float64 entries (exact in mpmath), rounded once."""
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workdps(40):
        a, m, b = (mpmath.matrix(x.tolist()) for x in (w0, s, w1))
        den = mpmath.mnorm(a, "f") * mpmath.mnorm(b, "f") + mpmath.sqrt(mpmath.mnorm(m, "f"))
        x = a * m * b / den
        return np.array([[float(x[i, j]) for j in range(x.cols)] for i in range(x.rows)])


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize(("s0", "s1"), [(1e300, 1e300), (1e300, 1.0), (1e-130, 1e-130), (1e-300, 1e300), (1.0, 1.0)])
def test_sparsify_product_of_extreme_weights_against_mpmath(s0: float, s1: float) -> None:
    # With the mask, ‖W₀‖·‖W₁‖ overflowed: X was NaN (1e300) and the SVD failed, ending the whole score.
    rng = np.random.default_rng(1)
    w0, w1 = rng.standard_normal((6, 8)) * s0, rng.standard_normal((10, 6)) * s1  # shared side 6: W₀ᵀ·S·W₁ᵀ
    s = np.random.RandomState(4).randint(2, size=36).reshape(6, 6)
    x = intra_matrix(w0, w1, mask=s)
    assert x is not None and x.shape == (8, 10)
    np.testing.assert_allclose(x, _masked_product_mpmath(w0.T, s, w1.T), rtol=1e-13, atol=0)


def test_sparsify_product_below_float64_is_refused_and_the_score_says_why() -> None:
    # Weights around 1e-200 keep X about 1e-400: it was all zeros, scored as an "all-zero spectrum".
    from wbfe.linalg.spectra import DegenerateMatrixError

    import wbfe

    rng = np.random.default_rng(1)
    w0, w1 = rng.standard_normal((20, 30)) * 1e-200, rng.standard_normal((40, 20)) * 1e-200
    want = (r"^the sparsify product of two consecutive matrices is below float64's range \(largest entry about "
            r"1e-39\d\): WeightWatcher's .* keeps the weights' scale; rescale them$")
    with pytest.raises(DegenerateMatrixError, match=want):
        intra_matrix(w0, w1, rng=np.random.RandomState(0))
    result = wbfe.score({"a.weight": torch.from_numpy(w0), "b.weight": torch.from_numpy(w1)}, metrics="htsr",
                        intra=True)
    assert [row["name"] for row in result.layers] == ["a.weight", "b.weight"]
    assert [s["name"] for s in result.skipped] == ["a.weight X b.weight"]
    assert re.match(want, result.skipped[0]["reason"])
    assert result.summary["intra"] == {"n": 0, "note": NO_PRODUCT}  # the note named only the other reasons
