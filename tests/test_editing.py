"""wbfe.editing (SVD smoothing and sharpening) and ``wbfe smooth`` / ``wbfe sharpen``: against the
Eckart–Young closed form, WeightWatcher 0.7.7's ``SVDSmoothing`` / ``SVDSharpness`` on the same
weights, and the safetensors package reading what was written."""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from safetensors import safe_open
from safetensors.torch import save_file
from typer.testing import CliRunner

from wbfe.editing import (
    edit_weight,
    remove_top,
    sharpen_checkpoint,
    sharpening_count,
    smooth_checkpoint,
    smooth_matrix,
    smoothing_rank,
)
from wbfe.errors import InvalidOptionError, OutputError
from wbfe.metrics.detx import detx_tail


def heavy(shape: tuple[int, ...], df: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_t(df, size=shape)


def trapped(rows: int, cols: int, seed: int) -> np.ndarray:
    """A Gaussian matrix with one entry 40 standard deviations large: one correlation trap."""
    w = np.random.default_rng(seed).standard_normal((rows, cols))
    w[3, 5] = 40.0
    return w


# ---------------------------------------------------------------- the matrix operations

def test_smooth_matrix_is_the_best_rank_k_approximation() -> None:
    w = heavy((70, 40), 3.0, 1)
    s = np.linalg.svd(w, compute_uv=False)
    for k in (1, 10, 39):
        a = smooth_matrix(w, k)
        assert np.linalg.matrix_rank(a) == k
        assert np.allclose(np.linalg.svd(a, compute_uv=False)[:k], s[:k], rtol=1e-12)
        # Eckart–Young: the residual is exactly the dropped components
        assert np.linalg.norm(w - a) ** 2 == pytest.approx(np.sum(s[k:] ** 2), rel=1e-10)
        assert np.linalg.svd(w - a, compute_uv=False)[: 40 - k] == pytest.approx(s[k:], rel=1e-10)


def test_remove_top_and_smooth_add_up() -> None:
    w = heavy((30, 50), 3.0, 2)
    assert np.allclose(smooth_matrix(w, 4) + remove_top(w, 4), w, atol=1e-12)


def test_ranks_follow_weightwatchers_rules() -> None:
    dense, conv = heavy((40, 60), 3.0, 3), heavy((16, 8, 3, 3), 3.0, 4)
    assert smoothing_rank(dense, percent=0.5, method="svd") == 20
    assert smoothing_rank(conv, percent=0.5, method="svd") == int(np.ceil(int(0.5 * 8 * 9) / 9))
    pooled = np.sort(np.concatenate([np.linalg.svd(conv[:, :, i, j], compute_uv=False) ** 2
                                     for i in range(3) for j in range(3)]))
    assert smoothing_rank(conv, percent=0.5, method="detx") == int(np.ceil(detx_tail(pooled)[0] / 9))
    assert sharpening_count(trapped(80, 50, 0), name="w") == 1
    assert sharpening_count(np.random.default_rng(5).standard_normal((80, 50)), name="w") == 0
    with pytest.raises(InvalidOptionError, match="^percent must be in \\[0, 1\\], not 1.5$"):
        smoothing_rank(dense, percent=1.5, method="svd")
    with pytest.raises(InvalidOptionError, match="^smoothing method must be svd or detx, not 'rmt'$"):
        smoothing_rank(dense, percent=0.5, method="rmt")  # type: ignore[arg-type]


@pytest.mark.parametrize(("w", "problem"), [(np.zeros((8, 8)), "8x8 weight is all zero"),
                                            (np.full((8, 8), np.nan), "8x8 weight has non-finite values (NaN or Inf)"),
                                            (np.zeros((4, 3, 2, 2)), "4x3x2x2 weight is all zero")])
def test_detx_of_a_weight_without_eigenvalues_says_so(w: np.ndarray, problem: str) -> None:
    """The all-zero weight was refused naming the internal ``detx_tail``, the NaN one with numpy's LinAlgError."""
    from wbfe.linalg.spectra import DegenerateMatrixError

    with pytest.raises(DegenerateMatrixError) as info:
        smoothing_rank(w, percent=0.5, method="detx")
    assert str(info.value) == ("smoothing method detx keeps the det X = 1 tail of a weight's eigenvalues, and this "
                               f"{problem}: it has no such tail; leave it as it is")


# ---------------------------------------------------------------- against WeightWatcher 0.7.7

def _ww_edit(model: torch.nn.Module, call: str, **kwargs) -> torch.nn.Module:
    ww = pytest.importorskip("weightwatcher")
    copy_ = copy.deepcopy(model)
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            getattr(ww.WeightWatcher(model=copy_), call)(**kwargs)
    finally:
        logging.disable(logging.NOTSET)
    return copy_


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(60, 40), torch.nn.Conv2d(8, 16, 3))
    with torch.no_grad():
        m[0].weight.copy_(torch.from_numpy(heavy((40, 60), 3.0, 1).astype(np.float32)))
    return m


@pytest.mark.parametrize(("method", "percent"), [("svd", 0.5), ("detx", 0.8)])
def test_smoothing_equals_weightwatcher(method: str, percent: float) -> None:
    model = _model()
    theirs = _ww_edit(model, "SVDSmoothing", percent=percent, method={"svd": "svd", "detx": "detX"}[method],
                      svd_method="accurate")
    for ours_layer, their_layer in zip(model, theirs):
        w = ours_layer.weight.detach().double().numpy()
        ours = edit_weight(w, smooth_matrix, smoothing_rank(w, percent=percent, method=method))  # type: ignore[arg-type]
        # WeightWatcher's randomised TruncatedSVD (and float32 storage) agrees to ~1e-5 of the
        # largest weight; one component more or less would differ by ~1e-1.
        their = their_layer.weight.detach().double().numpy()
        assert np.abs(ours - their).max() <= 1e-4 * np.abs(w).max()
        assert not np.allclose(their, w)


def test_sharpening_equals_weightwatcher() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(50, 80))
    with torch.no_grad():
        model[0].weight.copy_(torch.from_numpy(trapped(80, 50, 0).astype(np.float32)))
    np.random.seed(0)  # WeightWatcher permutes with NumPy's global generator
    theirs = _ww_edit(model, "SVDSharpness")[0].weight.detach().double().numpy()
    w = model[0].weight.detach().double().numpy()
    ours = edit_weight(w, remove_top, sharpening_count(w, name="0.weight"))
    assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(w).max()
    assert abs(ours[3, 5]) < 10.0  # the trap's component is gone


# ---------------------------------------------------------------- checkpoints

@pytest.fixture()
def checkpoint(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    tensors = {
        "fc.weight": torch.from_numpy(trapped(60, 40, 1).astype(np.float32)),
        "fc.bias": torch.randn(60, generator=torch.Generator().manual_seed(1)),
        "conv.weight": torch.from_numpy(heavy((16, 8, 3, 3), 3.0, 2)).to(torch.bfloat16),
        "emb.weight": torch.from_numpy(heavy((30, 12), 3.0, 3)).to(torch.float16),
        "step": torch.tensor(7),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt", "note": "kept"})
    return path, tensors


def test_a_fraction_that_keeps_no_component_leaves_the_matrix_as_it_is(checkpoint, tmp_path: Path) -> None:
    path, tensors = checkpoint
    # int(0.02 * 40) = int(0.02 * 12) = 0 components; the conv: ceil(int(0.02 * 8 * 9) / 9) = 1 per slice
    summary = smooth_checkpoint(path, tmp_path / "out.safetensors", percent=0.02)
    why = "keeps 0 components: left as it is (WeightWatcher does not smooth it)"
    assert summary.edited == {"conv.weight": 1} and summary.unchanged == {"fc.weight": why, "emb.weight": why}
    got, _ = _read(tmp_path / "out.safetensors")
    assert _raw(got["fc.weight"]) == _raw(tensors["fc.weight"])


def _read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()  # noqa: SIM118 - safe_open has no __iter__


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def test_smooth_checkpoint(checkpoint, tmp_path: Path) -> None:
    path, tensors = checkpoint
    out = tmp_path / "smooth.safetensors"
    summary = smooth_checkpoint(path, out, percent=0.5, layers=r"fc|conv")
    got, meta = _read(out)
    assert meta == {"format": "pt", "note": "kept"}
    assert set(got) == set(tensors) and summary.edited == {"fc.weight": 20, "conv.weight": 4}
    for name in ("fc.bias", "emb.weight", "step"):  # not selected or not a matrix: byte for byte
        assert got[name].dtype == tensors[name].dtype and _raw(got[name]) == _raw(tensors[name])
    for name in ("fc.weight", "conv.weight"):
        assert got[name].dtype == tensors[name].dtype and got[name].shape == tensors[name].shape
        w = tensors[name].double().numpy()
        want = torch.from_numpy(edit_weight(w, smooth_matrix, summary.edited[name])).to(tensors[name].dtype)
        assert _raw(got[name]) == _raw(want)
    assert summary.unchanged == {"emb.weight": "not selected by --layers"}
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_sharpen_checkpoint(checkpoint, tmp_path: Path) -> None:
    path, tensors = checkpoint
    out = tmp_path / "sharp.safetensors"
    summary = sharpen_checkpoint(path, out, layers=r"^fc\.")
    got, _ = _read(out)
    assert summary.edited == {"fc.weight": 1}
    s = np.linalg.svd(tensors["fc.weight"].double().numpy(), compute_uv=False)
    g = np.linalg.svd(got["fc.weight"].double().numpy(), compute_uv=False)
    assert g[:38] == pytest.approx(s[1:39], rel=1e-5) and g[-1] < 1e-4 * s[0]
    assert _raw(got["conv.weight"]) == _raw(tensors["conv.weight"])


def test_output_is_replaced_atomically(checkpoint, tmp_path: Path) -> None:
    path, _ = checkpoint
    out = tmp_path / "out.safetensors"
    out.write_bytes(b"old")
    with pytest.raises(InvalidOptionError):
        smooth_checkpoint(path, out, percent=0.5, layers="(a+)+$")  # refused before any write
    assert out.read_bytes() == b"old"
    smooth_checkpoint(path, out, percent=0.5)
    assert _read(out)[1]["note"] == "kept"
    with pytest.raises(OutputError):
        smooth_checkpoint(path, tmp_path, percent=0.5)  # a folder is never replaced


def test_cli(checkpoint, tmp_path: Path) -> None:
    from wbfe_cli.main import app

    runner = CliRunner()
    path, _ = checkpoint
    out = tmp_path / "cli.safetensors"
    result = runner.invoke(app, ["smooth", str(path), str(out), "--percent", "0.5", "--method", "svd"])
    assert result.exit_code == 0, result.stderr
    assert "3 of 3 weight matrices edited, 0 left as they were" in result.stderr and result.stdout == ""
    direct = tmp_path / "direct.safetensors"
    smooth_checkpoint(path, direct, percent=0.5)
    assert out.read_bytes() == direct.read_bytes()
    result = runner.invoke(app, ["sharpen", str(path), str(tmp_path / "s.safetensors"), "--seed", "3"])
    assert result.exit_code == 0
    result = runner.invoke(app, ["smooth", str(path), str(out), "--percent", "2"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "wbfe: error: --percent must be in [0, 1], not 2.0"


# ---------------------------------------------------------------- one matrix at a time

@pytest.mark.parametrize(("edit", "keywords"), [
    (smooth_checkpoint, {"percent": 0.5}), (smooth_checkpoint, {"percent": 0.05, "ww_compatible": True}),
    (sharpen_checkpoint, {}), (sharpen_checkpoint, {"ww_compatible": True}),
])
def test_the_edit_holds_one_matrix_at_a_time(tmp_path: Path, edit, keywords) -> None:
    import tracemalloc

    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(0)
    count, shape = 32, (256, 128)
    save_file({f"l{i}.weight": torch.from_numpy(rng.standard_normal(shape).astype(np.float32)) for i in range(count)},
              str(tmp_path / "many.safetensors"))
    one = shape[0] * shape[1] * 8  # one matrix in float64, the precision the edit computes in
    with threadpool_limits(1):  # one BLAS thread: on a busy machine many are far slower
        edit(tmp_path / "many.safetensors", tmp_path / "warm.safetensors", **keywords)  # imports, caches
        tracemalloc.start()  # NumPy's allocations are traced; a copy of every matrix would show
        try:
            summary = edit(tmp_path / "many.safetensors", tmp_path / "out.safetensors", **keywords)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert len(summary.edited) + len(summary.unchanged) == count
    # measured: 3.6–5 matrices' worth (the SVD's factors, the edited copy, its bytes); holding
    # every matrix would be 32 (16 in float32)
    assert peak < 8 * one, peak / one
    assert peak < count * one / 4


# ---------------------------------------------------------------- every matrix accounted for

@pytest.mark.parametrize(("edit", "keywords"), [
    (smooth_checkpoint, {}), (smooth_checkpoint, {"ww_compatible": True}), (sharpen_checkpoint, {}),
    (sharpen_checkpoint, {"ww_compatible": True}),
])
def test_every_weight_matrix_is_edited_or_listed_with_its_reason(tmp_path: Path, edit, keywords) -> None:
    """The fixture's four matrices (one a 16×1×3×3 first convolution, one input channel): every one is
    edited or listed as unchanged with a reason, and the counts add up to the matrices score analyses."""
    import wbfe
    from wbfe.fixtures import default_checkpoint

    ref = default_checkpoint()
    rng = np.random.default_rng(0)
    extra = tmp_path / "extra.safetensors"
    save_file({"conv1d.weight": torch.from_numpy(rng.standard_normal((8, 4, 3)).astype(np.float32)),
               "row.weight": torch.from_numpy(rng.standard_normal((1, 12)).astype(np.float32)),
               "bias": torch.zeros(4), "steps": torch.tensor([3], dtype=torch.int64)}, str(extra))
    summary = edit(ref, tmp_path / "out.safetensors", **keywords)
    analysed = {row["name"] for row in wbfe.score(ref, metrics="bfe").layers}
    assert set(summary.edited) | set(summary.unchanged) == analysed == {
        "classifier.weight", "fc1.weight", "features.0.weight", "features.3.weight"}
    assert summary.n_matrices == 4
    assert summary.unchanged["features.0.weight"].startswith("one input channel")
    assert all(summary.unchanged.values())
    other = edit(extra, tmp_path / "out2.safetensors")
    assert other.edited == {} and set(other.unchanged) == {"conv1d.weight", "row.weight"}
    assert other.unchanged["conv1d.weight"].startswith("a 3-D weight")
    assert other.unchanged["row.weight"].startswith("too small: 1×12")


@pytest.mark.parametrize("exponent", [-600, 600])
def test_edits_of_a_matrix_far_from_one_scale_with_it(tmp_path: Path, exponent: int) -> None:
    # The counts do not depend on the scale and the edits scale with the weight. At 2^±600 the Gram matrix left
    # float64: detx raised ZeroDivisionError, sharpen "argmax of an empty sequence" or removed the wrong components.
    from safetensors.torch import load_file

    rng = np.random.default_rng(0)
    state = {"a.weight": torch.tensor(rng.standard_t(3, (40, 80))),
             "c.weight": torch.tensor(rng.standard_t(3, (16, 8, 3, 3)))}
    save_file(state, str(tmp_path / "one.safetensors"))
    save_file({k: v * 2.0**exponent for k, v in state.items()}, str(tmp_path / "far.safetensors"))
    for edit, kwargs in ((smooth_checkpoint, {}), (smooth_checkpoint, {"method": "detx"}), (sharpen_checkpoint, {})):
        one = edit(tmp_path / "one.safetensors", tmp_path / "one-out.safetensors", **kwargs)
        far = edit(tmp_path / "far.safetensors", tmp_path / "far-out.safetensors", **kwargs)
        assert far.edited == one.edited and far.unchanged == one.unchanged, (edit.__name__, kwargs)
        a, b = load_file(str(tmp_path / "one-out.safetensors")), load_file(str(tmp_path / "far-out.safetensors"))
        for name in state:
            assert torch.allclose(b[name] * 2.0**-exponent, a[name], rtol=1e-12, atol=0.0), (edit.__name__, name)
    # WeightWatcher edits in float32, which cannot hold these: each weight is left as it is, and says why.
    ww = smooth_checkpoint(tmp_path / "far.safetensors", tmp_path / "ww.safetensors", ww_compatible=True)
    assert ww.edited == {} and sorted(ww.unchanged) == sorted(state)
    assert all(why.startswith("WeightWatcher's edit is float32: entries ") and why.endswith(": left as it is")
               for why in ww.unchanged.values())


@pytest.mark.parametrize(("edit", "keywords"), [
    (smooth_checkpoint, {}), (smooth_checkpoint, {"method": "detx"}), (smooth_checkpoint, {"ww_compatible": True}),
    (sharpen_checkpoint, {}), (sharpen_checkpoint, {"ww_compatible": True}),
])
def test_a_non_finite_weight_is_left_as_it_is_and_says_why(tmp_path: Path, edit, keywords) -> None:
    # An Inf or NaN entry made numpy's SVD raise LinAlgError (or asarray_chkfinite ValueError) from inside the edit.
    rng = np.random.default_rng(0)
    inf, nan = rng.standard_normal((40, 20)), rng.standard_normal((40, 20))
    inf[3, 4], nan[1, 1] = np.inf, np.nan
    tensors = {"inf.weight": torch.tensor(inf, dtype=torch.float32),
               "nan.weight": torch.tensor(nan, dtype=torch.float32)}
    save_file(tensors, str(tmp_path / "in.safetensors"))
    summary = edit(tmp_path / "in.safetensors", tmp_path / "out.safetensors", **keywords)
    assert summary.edited == {}
    assert summary.unchanged == dict.fromkeys(tensors, "non-finite values (NaN or Inf): left as it is")
    got, _ = _read(tmp_path / "out.safetensors")
    assert all(_raw(got[name]) == _raw(tensors[name]) for name in tensors)


@pytest.mark.parametrize(("edit", "keywords"), [
    (smooth_checkpoint, {"method": "svd"}), (smooth_checkpoint, {"method": "detx"}),
    (smooth_checkpoint, {"method": "svd", "ww_compatible": True}),
    (smooth_checkpoint, {"method": "detx", "ww_compatible": True}),
    (sharpen_checkpoint, {}), (sharpen_checkpoint, {"ww_compatible": True}),
])
def test_an_all_zero_weight_is_left_as_it_is_and_the_others_edited(tmp_path: Path, edit, keywords) -> None:
    # detx stopped the whole edit with InvalidOptionError (detx_tail of an all-zero spectrum); svd listed the zero
    # matrices as edited. The other matrix is edited exactly as in a checkpoint without them.
    alone = {"a.weight": torch.from_numpy(trapped(60, 40, 1).astype(np.float32))}
    zeros = {"z.weight": torch.zeros(30, 20), "zc.weight": torch.zeros(16, 8, 3, 3)}
    save_file(alone, str(tmp_path / "alone.safetensors"))
    save_file({**alone, **zeros}, str(tmp_path / "in.safetensors"))
    want = edit(tmp_path / "alone.safetensors", tmp_path / "want.safetensors", **keywords)
    summary = edit(tmp_path / "in.safetensors", tmp_path / "out.safetensors", **keywords)
    assert set(want.edited) == {"a.weight"} and summary.edited == want.edited
    assert summary.unchanged == dict.fromkeys(zeros, "all zero: no singular component to keep or remove; left as "
                                                     "it is")
    got = _read(tmp_path / "out.safetensors")[0]
    assert _raw(got["a.weight"]) == _raw(_read(tmp_path / "want.safetensors")[0]["a.weight"])
    assert all(_raw(got[name]) == _raw(zeros[name]) for name in zeros)


def test_cli_smooth_detx_lists_an_all_zero_weight(tmp_path: Path) -> None:
    from wbfe_cli.main import app

    save_file({"a.weight": torch.from_numpy(trapped(60, 40, 1).astype(np.float32)), "z.weight": torch.zeros(30, 20)},
              str(tmp_path / "in.safetensors"))
    result = CliRunner().invoke(app, ["smooth", str(tmp_path / "in.safetensors"), str(tmp_path / "out.safetensors"),
                                      "--method", "detx"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[1:] == [
        "  unchanged z.weight: all zero: no singular component to keep or remove; left as it is"]
    assert "1 of 2 weight matrices edited, 1 left as it was" in result.stderr


def test_an_edit_that_overflows_the_stored_dtype_is_left_as_it_is(tmp_path: Path) -> None:
    # float16 entries near its largest (65504): without the top component, entries pass it, and were written as inf.
    w = torch.full((32, 16), 60000.0)
    w[0, 0] = -60000.0
    save_file({"fc.weight": w.half()}, str(tmp_path / "in.safetensors"))
    out = tmp_path / "out.safetensors"
    summary = sharpen_checkpoint(tmp_path / "in.safetensors", out)
    new = remove_top(w.double().numpy(), 1)
    assert np.abs(new).max() > 65520  # rounds to inf in float16
    assert summary.edited == {}
    assert summary.unchanged == {"fc.weight": f"the edited entries (up to {np.abs(new).max():.4g}) overflow float16: "
                                              "left as it is"}
    assert _raw(_read(out)[0]["fc.weight"]) == _raw(w.half())


def test_a_tensor_without_values_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    from wbfe.errors import UnsupportedDtypeError

    out = tmp_path / "out.safetensors"
    state = {"a.weight": torch.randn(20, 30), "m.weight": torch.empty(20, 30, device="meta")}
    with pytest.raises(UnsupportedDtypeError, match=r"^m\.weight: meta-device tensor: .*cannot be written"):
        smooth_checkpoint(state, out)  # was NotImplementedError: Cannot copy out of meta tensor
    assert list(tmp_path.iterdir()) == []


_NOT_A_FILE = {None: "the output must be a file name, not None", 3: "the output must be a file name, not 3",
               b"o.safetensors": "the output must be a file name, not b'o.safetensors'",
               "": "the output path is empty ('')"}


@pytest.mark.parametrize("out", [*_NOT_A_FILE, "-"])
@pytest.mark.parametrize("edit", [smooth_checkpoint, sharpen_checkpoint])
def test_an_output_that_is_no_file_path_is_an_output_error(checkpoint, tmp_path: Path, monkeypatch, edit, out) -> None:
    # out=None, 3 or bytes raised TypeError from os.fspath; "-" (standard output) was a plain InvalidOptionError
    path, _ = checkpoint
    monkeypatch.chdir(tmp_path)
    why = _NOT_A_FILE.get(out, "the edited checkpoint needs a file path, not standard output")
    with pytest.raises(OutputError, match=f"^{re.escape(why)}$"):
        edit(path, out)
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # nothing written


@pytest.mark.parametrize("edit", [smooth_checkpoint, sharpen_checkpoint])
def test_layers_selecting_no_weight_matrix_is_refused_before_any_write(checkpoint, tmp_path: Path, edit) -> None:
    # It wrote a byte-for-byte copy, every matrix "not selected by --layers", and exited 0.
    from wbfe.errors import NoUsableMatrixError

    path, _ = checkpoint
    out = tmp_path / "out.safetensors"
    with pytest.raises(NoUsableMatrixError, match=r"--layers 'attn' selects none of its weight matrices: nothing to "
                                                  r"edit$"):
        edit(path, out, layers="attn")
    assert not out.exists()
    with pytest.raises(NoUsableMatrixError, match="it holds no weight matrices: nothing to edit$"):
        edit({"bias": torch.zeros(4), "step": torch.tensor([3])}, out)
    assert not out.exists()


@pytest.mark.parametrize("name", ["out.h5", "out.pt", "out.gguf", "out"])
def test_an_edited_checkpoint_is_named_safetensors(tmp_path: Path, name: str) -> None:
    """The editors write safetensors: a name that any reader (wbfe's own re-score of a pruned model among them)
    would take for another format, or for none, is refused before any work, and nothing is written."""
    import wbfe
    from wbfe_cli.main import app

    src = tmp_path / "in.safetensors"
    save_file({"fc.weight": torch.from_numpy(heavy((64, 32), 3.0, 0))}, str(src))
    out = tmp_path / name
    message = f"cannot write {out}: the {{}} checkpoint is a safetensors file; name it *.safetensors"
    for edit, what in ((lambda: smooth_checkpoint(src, out), "edited"),
                       (lambda: sharpen_checkpoint(src, out), "edited"),
                       (lambda: wbfe.prune(src, out, target=0.5, exclude=()), "pruned")):
        with pytest.raises(OutputError, match=f"^{re.escape(message.format(what))}$"):
            edit()
        assert not out.exists()
    done = CliRunner().invoke(app, ["prune", str(src), str(out), "--target", "0.5"])
    assert done.exit_code == 2 and done.stderr.strip() == f"wbfe: error: {message.format('pruned')}"


def test_a_keras2_model_with_its_optimizer_state_is_pruned(tmp_path: Path) -> None:
    """A Keras 2 ``model.save("m.h5")`` keeps the optimizer's 0-D step counter: it is copied as the 0-D tensor it is
    (the reader gave it as 1-D, and the editor refused the file), and the matrices are pruned."""
    import wbfe
    from tests.test_keras import torch_model, write_keras2_h5

    src = write_keras2_h5(tmp_path / "m.h5", torch_model())
    out = tmp_path / "pruned.safetensors"
    report = wbfe.prune(src, out, target=0.3)
    with safe_open(str(out), "np") as f:
        assert f.get_tensor("optimizer_weights/Adam/iter:0").shape == () and int(f.get_tensor(
            "optimizer_weights/Adam/iter:0")) == 100
        assert all(int(np.count_nonzero(f.get_tensor(r["name"]) == 0)) == r["zeros"] for r in report.rows)


@pytest.mark.parametrize("edit", ["smooth", "prune"])
def test_a_pytorch_pickle_is_edited_as_its_safetensors_twin(checkpoint, tmp_path: Path, edit: str) -> None:
    """An edit reads the entries three times; a single .pt file gave them once (AssertionError on the second pass),
    so no PyTorch pickle could be smoothed or pruned. Its output is the safetensors twin's, tensor for tensor."""
    import wbfe

    path, tensors = checkpoint
    pickle = tmp_path / "model.pt"
    torch.save(tensors, pickle)
    outputs = []
    for src in (path, pickle):
        out = tmp_path / f"{src.suffix[1:]}-edited.safetensors"
        if edit == "smooth":
            smooth_checkpoint(src, out, percent=0.5, layers=r"fc|conv")
        else:
            wbfe.prune(src, out, target=0.5, exclude=())
        outputs.append(_read(out)[0])
    assert list(outputs[1]) == list(outputs[0])
    for name, tensor in outputs[0].items():
        assert outputs[1][name].dtype == tensor.dtype and _raw(outputs[1][name]) == _raw(tensor), name


def test_a_second_state_dict_beside_the_model_is_copied_as_it_is(checkpoint, tmp_path: Path) -> None:
    """timm's training checkpoint {"model": ..., "model_ema": ...}: the model is edited, the moving average (listed
    as skipped when scored) copied byte for byte under its listed name, as a Keras optimizer's state is. Its entries
    loaded as None: TypeError, nothing written."""
    path, tensors = checkpoint
    ema = {name: t * 2 for name, t in tensors.items()}
    pickle = tmp_path / "train.pt"
    torch.save({"model": tensors, "model_ema": ema}, pickle)
    smooth_checkpoint(path, tmp_path / "twin.safetensors", percent=0.5, layers=r"^(fc|conv)\.")
    summary = smooth_checkpoint(pickle, tmp_path / "out.safetensors", percent=0.5, layers=r"^(fc|conv)\.")
    twin, got = _read(tmp_path / "twin.safetensors")[0], _read(tmp_path / "out.safetensors")[0]
    assert sorted(got) == sorted([*twin, *(f"model_ema/{name}" for name in ema)])
    assert summary.edited == {"fc.weight": 20, "conv.weight": 4}
    for name, tensor in twin.items():
        assert _raw(got[name]) == _raw(tensor), name
    for name, tensor in ema.items():
        assert got[f"model_ema/{name}"].dtype == tensor.dtype and _raw(got[f"model_ema/{name}"]) == _raw(tensor), name


def test_an_uninitialised_lazy_parameter_is_refused_saying_why(tmp_path: Path) -> None:
    """A LazyLinear never run has no values: the edit is refused in one line naming it (its entry loaded as None:
    TypeError)."""
    from wbfe.errors import UnsupportedDtypeError

    model = nn.Sequential(nn.LazyLinear(4), nn.Linear(4, 8), nn.Linear(8, 8))
    with pytest.raises(UnsupportedDtypeError) as info:
        smooth_checkpoint(model, tmp_path / "out.safetensors", percent=0.5)
    assert str(info.value) == ("0.weight: uninitialised lazy parameter: run the model once before scoring; it cannot "
                               "be written to safetensors")
    assert not (tmp_path / "out.safetensors").exists()


def test_what_the_score_leaves_out_is_copied_not_edited(tmp_path: Path) -> None:
    """A Keras 2 model keeps Adam's moments beside its weights: smoothing edits the weights the score reads, and
    copies the optimizer state byte for byte, each moment listed as left unchanged with the reader's reason."""
    import h5py

    import wbfe
    from tests.test_keras import torch_model, write_keras2_h5

    src = write_keras2_h5(tmp_path / "m.h5", torch_model())
    scored = {row["name"] for row in wbfe.score(src, metrics="bfe").layers}
    summary = smooth_checkpoint(src, tmp_path / "s.safetensors")
    assert set(summary.edited) <= scored and "dense/kernel:0" in summary.edited
    moments = [n for n in summary.unchanged if n.startswith("optimizer_weights/")]
    assert moments and all(summary.unchanged[n] == "not a weight the score reads (optimizer state (optimizer_weights/))"
                           for n in moments if n.endswith(("/m:0", "/v:0")) and "dense" in n)
    with h5py.File(src) as f, safe_open(str(tmp_path / "s.safetensors"), "np") as out:
        for name in ("optimizer_weights/Adam/dense/kernel/m:0", "optimizer_weights/Adam/dense_1/kernel/v:0"):
            assert np.array_equal(out.get_tensor(name), f[name][()])


@pytest.mark.parametrize("fmt", ["safetensors", "pickle"])
@pytest.mark.parametrize("owner", [1, 2])
def test_a_second_copy_of_a_tensor_in_another_shard_is_refused_before_anything_is_written(tmp_path: Path, fmt: str,
                                                                                         owner: int,
                                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard holding a copy of a tensor its index gives to another shard: a score lists that copy as a skipped row
    ``shard/name``. An edit copied it under that key, one the input never had (a strict load_state_dict refuses it),
    and edited the index's copy where transformers' loader may take the other: refused in one line naming the tensor,
    both shards and the copy transformers loads, before anything is written."""
    import wbfe
    from tests.conftest import write_shards_with_a_copy
    from wbfe.errors import CorruptCheckpointError
    from wbfe_cli.main import app

    src = tmp_path / "in"
    made = write_shards_with_a_copy(src, fmt, owner, seed=4)
    first, second, index, weight_map = made["first"], made["second"], made["index"], made["weight_map"]
    holder = second if owner == 1 else first
    taken = ("transformers' loader takes this one instead: it reads every shard's tensors in file name order, the "
             "last copy winning" if owner == 1 else "transformers' loader takes that one too")
    message = (f"{src}: cannot edit it: shard {holder} holds a second copy of 'a.weight': {index} gives it to "
               f"{weight_map['a.weight']}, whose copy is scored ({taken}); keep one copy (delete the other from its "
               "shard, and point the index at the shard kept), then edit again")
    out = tmp_path / "edits" / "out.safetensors"
    out.parent.mkdir()
    for edit in (lambda: smooth_checkpoint(src, out, percent=0.5), lambda: sharpen_checkpoint(src, out),
                 lambda: wbfe.prune(src, out, target=0.5, exclude=())):
        with pytest.raises(CorruptCheckpointError) as info:
            edit()
        assert str(info.value) == message and info.value.fields["name"] == "a.weight"
        assert list(out.parent.iterdir()) == []  # no output, no temporary file
    done = CliRunner().invoke(app, ["smooth", str(src), str(out)])
    assert done.exit_code == 2 and done.stderr.strip() == f"wbfe: error: {message}"
    assert list(out.parent.iterdir()) == []
    # a score still reads the index's copy and lists the other as a skipped row
    assert [s["name"] for s in wbfe.score(src, metrics="bfe").skipped] == [f"{holder}/a.weight"]
    # prune refuses it before its score, which on a large model takes minutes
    monkeypatch.setattr("wbfe.pruning._score", lambda *a, **k: pytest.fail("prune scored before refusing"))
    with pytest.raises(CorruptCheckpointError, match="cannot edit it"):
        wbfe.prune(src, out, target=0.5, exclude=())


@pytest.mark.parametrize("method", ["gptq", "awq", "fp8"])
def test_a_quantised_checkpoint_is_refused_before_anything_is_written_or_scored(tmp_path: Path, method: str,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A quantised layer is stored as several plain tensors (packed integers or FP8 values, scales, zero points): an
    edit writes plain tensors and could not copy it byte for byte, so smooth, sharpen and prune refuse it in one line
    naming the weight and its scheme, before anything is written (prune before its score). The edits used to read
    the raw tensors, smoothing the scales (4 × 256 float16) as a matrix of their own: a broken model, no error."""
    import wbfe
    from tests.test_quant import _awq, _folder, _gptq, _weights
    from wbfe.errors import UnsupportedDtypeError

    tensors = {"model.embed_tokens.weight": _weights(300, 128).half(), "lm_head.weight": _weights(300, 128, 1).half()}
    w = _weights(256, 128, 2)
    prefix = "model.layers.0.mlp.up_proj"
    if method == "fp8":
        tensors |= {f"{prefix}.weight": (w * 100).to(torch.float8_e4m3fn),
                    f"{prefix}.weight_scale_inv": torch.full((2, 1), 0.01)}
        qconfig: dict[str, object] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
        scheme = "fp8-e4m3-block128"
    else:
        packed = _gptq(w, 4, 32, act_order=False) if method == "gptq" else _awq(w, 4, 32)
        packed.pop("expected")
        tensors |= {f"{prefix}.{part}": v for part, v in packed.items()}
        qconfig = {"quant_method": method, "bits": 4, "group_size": 32, "desc_act": False, "sym": False}
        scheme = f"{method}-int4-g32"
    config = {"architectures": ["LlamaForCausalLM"], "vocab_size": 300, "tie_word_embeddings": False,
              "quantization_config": qconfig}
    src = _folder(tmp_path, method, tensors, config)
    assert next(r for r in wbfe.score(src, metrics="bfe").layers if r["name"] == f"{prefix}.weight")["quant"] == scheme
    message = (f"{prefix}.weight: stored quantised ({scheme}); editing writes plain tensors and would not copy it "
               "byte for byte")
    out = tmp_path / "edits" / "out.safetensors"
    out.parent.mkdir()
    monkeypatch.setattr("wbfe.pruning._score", lambda *a, **k: pytest.fail("prune scored before refusing"))
    for edit in (lambda: smooth_checkpoint(src, out, percent=0.5), lambda: sharpen_checkpoint(src, out),
                 lambda: wbfe.prune(src, out, target=0.5, exclude=())):
        with pytest.raises(UnsupportedDtypeError) as info:
            edit()
        assert str(info.value) == message
        assert list(out.parent.iterdir()) == []


def test_the_scales_of_a_quantised_weight_missing_a_part_are_copied_not_edited(tmp_path: Path) -> None:
    """A GPTQ group without its packed words is not scored (each part a skipped row): an edit copies its float scales
    byte for byte, saying why, where it used to smooth them as a 4 × 256 matrix."""
    from safetensors import safe_open

    from tests.test_quant import _folder, _gptq, _weights

    packed = _gptq(_weights(256, 128, 2), 4, 32, act_order=False)
    packed.pop("expected")
    packed.pop("qweight")
    tensors = {"lm_head.weight": _weights(300, 128, 1).half()}
    tensors |= {f"model.layers.0.mlp.up_proj.{part}": v for part, v in packed.items()}
    src = _folder(tmp_path, "gptq", tensors, {"quantization_config": {"quant_method": "gptq", "bits": 4}})
    summary = smooth_checkpoint(src, tmp_path / "out.safetensors", percent=0.5)
    assert list(summary.edited) == ["lm_head.weight"]
    assert summary.unchanged["model.layers.0.mlp.up_proj.scales"] == (
        "not a weight the score reads (scales of a quantized weight whose other parts are missing)")
    with safe_open(str(tmp_path / "out.safetensors"), "pt") as out:
        assert torch.equal(out.get_tensor("model.layers.0.mlp.up_proj.scales"), packed["scales"])


@pytest.mark.parametrize("fmt", ["pickle", "safetensors"])
def test_a_tied_weight_is_written_as_its_first_copy(tmp_path: Path, fmt: str) -> None:
    """A weight stored under two names (one storage in a pickle, or two equal copies) is read once by a score; an
    edit wrote each name on its own, so ``--layers emb`` smoothed the embedding and left its tied head as it was:
    the output untied them (transformers then loads two different matrices). Both names now get the first copy's
    edit, and a selection of the second copy alone leaves both as they are, saying why."""
    w = torch.from_numpy(heavy((30, 12), 3.0, 3))
    other = torch.from_numpy(heavy((30, 12), 3.0, 4))  # same shape, other values: not tied
    path = tmp_path / ("model.pt" if fmt == "pickle" else "model.safetensors")
    if fmt == "pickle":
        torch.save({"emb.weight": w, "fc.weight": other, "head.weight": w}, path)
    else:
        save_file({"emb.weight": w, "fc.weight": other, "head.weight": w.clone()}, str(path))
    summary = smooth_checkpoint(path, tmp_path / "first.safetensors", percent=0.5, layers="emb")
    got, _ = _read(tmp_path / "first.safetensors")
    want = torch.from_numpy(edit_weight(w.double().numpy(), smooth_matrix, 6)).to(w.dtype)
    assert summary.edited == {"emb.weight": 6, "head.weight": 6}
    assert summary.unchanged == {"fc.weight": "not selected by --layers"}
    assert _raw(got["emb.weight"]) == _raw(want) and _raw(got["head.weight"]) == _raw(want)
    assert _raw(got["fc.weight"]) == _raw(other)
    summary = smooth_checkpoint(path, tmp_path / "second.safetensors", percent=0.5, layers="head")
    got, _ = _read(tmp_path / "second.safetensors")
    assert summary.edited == {} and summary.unchanged["head.weight"] == (
        "tied to emb.weight (the same values), written as it is: not selected by --layers")
    assert _raw(got["emb.weight"]) == _raw(w) and _raw(got["head.weight"]) == _raw(w)


def test_an_fp8_matrix_is_copied_and_listed_with_the_score_s_reason(tmp_path: Path) -> None:
    """An FP8 weight stored without its scale is a weight matrix the score lists as skipped; an edit copied it byte
    for byte but listed it nowhere ('1 of 1 weight matrices edited' of a file holding three)."""
    g = torch.Generator().manual_seed(0)
    tensors = {"a.weight": torch.randn(40, 30, generator=g),
               "b.weight": torch.randn(40, 30, generator=g).to(torch.float8_e4m3fn),
               "c.weight": torch.randn(40, 30, generator=g).to(torch.float8_e5m2)}
    save_file(tensors, str(tmp_path / "fp8.safetensors"))
    summary = smooth_checkpoint(tmp_path / "fp8.safetensors", tmp_path / "out.safetensors", percent=0.5)
    assert summary.n_matrices == 3 and list(summary.edited) == ["a.weight"]
    assert summary.unchanged == {n: f"not a weight the score reads (FP8 weight without its scale ({n}_scale_inv or "
                                    ".weight_scale))" for n in ("b.weight", "c.weight")}
    got, _ = _read(tmp_path / "out.safetensors")
    assert all(_raw(got[n]) == _raw(tensors[n]) for n in ("b.weight", "c.weight"))


@pytest.mark.parametrize("edit", ["smooth", "sharpen", "prune"])
def test_a_lora_adapter_is_refused_before_anything_is_written(tmp_path: Path, edit: str) -> None:
    """A PEFT adapter is scored as each module's ΔW = B·A; smoothing smoothed lora_A and lora_B one by one (rank 3 of
    each factor, not ΔW's best rank 3) and wrote them without the adapter's config, exit 0; prune said a ΔW was
    'stored as no tensor'. All three now say what to do instead."""
    import wbfe
    from tests.test_adapters import _write_adapter

    g = torch.Generator().manual_seed(0)
    folder = _write_adapter(tmp_path / "ad", {"base_model.model.fc.lora_A.weight": torch.randn(4, 20, generator=g),
                                              "base_model.model.fc.lora_B.weight": torch.randn(30, 4, generator=g)},
                            r=4, lora_alpha=8)
    out = tmp_path / "out.safetensors"
    run = {"smooth": lambda: smooth_checkpoint(folder, out), "sharpen": lambda: sharpen_checkpoint(folder, out),
           "prune": lambda: wbfe.prune(folder, out, target=0.5, exclude=())}[edit]
    with pytest.raises(InvalidOptionError, match=r"a PEFT LoRA adapter: .* merge it into its base model"):
        run()
    assert not out.exists()
