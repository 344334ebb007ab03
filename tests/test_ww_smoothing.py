"""``wbfe smooth`` / ``wbfe sharpen`` with ``ww_compatible``: the edited safetensors checkpoint, read
back, against WeightWatcher 0.7.7's own ``SVDSmoothing`` / ``SVDSharpness`` of the same torch model
(its edited ``state_dict``), at rtol 1e-6; every other tensor byte for byte, the metadata kept."""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from typer.testing import CliRunner

from wbfe.editing import sharpen_checkpoint, smooth_checkpoint
from wbfe.errors import InvalidOptionError

ww = pytest.importorskip("weightwatcher")

# WeightWatcher picks its SVD and its weight precision at import: on a CUDA machine it reads layers
# in float16 and smooths with torch; ww_compatible reproduces its CPU path (SciPy, scikit-learn).
pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="WeightWatcher 0.7.7 edits with torch in float16 where CUDA is available")

META = {"format": "pt", "note": "kept"}


def _model() -> torch.nn.Module:
    """Linear layers (one heavy-tailed, one with a planted trap), Conv2d layers (out > in; out < in
    with an even kernel, where WW's M is the larger side), an Embedding and a layer WW skips."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(60, 40),        # 0: Student-t weights
        torch.nn.Conv2d(8, 16, 3),      # 1
        torch.nn.Linear(50, 80),        # 2: one entry 40 σ large (a correlation trap)
        torch.nn.Conv2d(16, 8, 2),      # 3: out < in, rf = 4: WW's (N, M) = (8, 16)
        torch.nn.Embedding(30, 12),     # 4
        torch.nn.Linear(3, 2),          # 5: 2 eigenvalues < min_evals 8: WW skips it
    )
    rng = np.random.default_rng(1)
    with torch.no_grad():
        m[0].weight.copy_(torch.from_numpy(rng.standard_t(3.0, size=(40, 60)).astype(np.float32)))
        trap = rng.standard_normal((80, 50))
        trap[3, 5] = 40.0
        m[2].weight.copy_(torch.from_numpy(trap.astype(np.float32)))
        conv = rng.standard_normal((16, 8, 3, 3))
        conv[2, 1] = 30.0  # a trap in every kernel position: 9 spikes, one per slice
        m[1].weight.copy_(torch.from_numpy(conv.astype(np.float32)))
    return m


def _quiet(call: Any) -> Any:
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            return call()
    finally:
        logging.disable(logging.NOTSET)


def _ww_edited(model: torch.nn.Module, call: str, **kwargs: Any) -> dict[str, torch.Tensor]:
    edited = copy.deepcopy(model)
    _quiet(lambda: getattr(ww.WeightWatcher(model=edited), call)(**kwargs))
    return edited.state_dict()


def _save(model: torch.nn.Module, path: Path) -> dict[str, torch.Tensor]:
    tensors = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(path), metadata=META)
    return tensors


def _read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    with safe_open(str(path), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()  # noqa: SIM118 - safe_open has no __iter__


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _check(ours: dict[str, torch.Tensor], meta: dict[str, str], theirs: dict[str, torch.Tensor],
           original: dict[str, torch.Tensor], edited: dict[str, int]) -> None:
    assert meta == META and set(ours) == set(original)
    for name, tensor in ours.items():
        assert tensor.dtype == original[name].dtype and tensor.shape == original[name].shape
        if name in edited:
            want = theirs[name].double().numpy()
            assert not np.allclose(want, original[name].double().numpy())  # WW did edit it
            np.testing.assert_allclose(tensor.double().numpy(), want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
        else:  # biases, skipped layers, layers WW leaves as they are: byte for byte, as WW leaves them
            assert _raw(tensor) == _raw(original[name])
            assert torch.equal(theirs[name].to(tensor.dtype), tensor)


@pytest.mark.parametrize(("method", "ww_method", "percent", "counts"), [
    ("svd", "svd", 0.5, {"0.weight": 20, "1.weight": 4, "2.weight": 25, "3.weight": 8, "4.weight": 6}),
    ("detx", "detX", 0.8, None),
])
def test_smoothing_equals_weightwatchers(tmp_path: Path, method: str, ww_method: str, percent: float,
                                         counts: Any) -> None:
    model = _model()
    original = _save(model, tmp_path / "model.safetensors")
    summary = smooth_checkpoint(tmp_path / "model.safetensors", tmp_path / "out.safetensors", percent=percent,
                                method=method, ww_compatible=True)  # type: ignore[arg-type]
    theirs = _ww_edited(model, "SVDSmoothing", percent=percent, method=ww_method)
    ours, meta = _read(tmp_path / "out.safetensors")
    if counts is not None:
        assert summary.edited == counts
    assert len(summary.edited) >= 4
    assert summary.unchanged["5.weight"] == "WeightWatcher skips it: 2 eigenvalues < min_evals 8"
    _check(ours, meta, theirs, original, summary.edited)


def test_sharpening_equals_weightwatchers(tmp_path: Path) -> None:
    model = _model()
    original = _save(model, tmp_path / "model.safetensors")
    summary = sharpen_checkpoint(tmp_path / "model.safetensors", tmp_path / "out.safetensors", seed=3,
                                 ww_compatible=True)
    np.random.seed(3)  # WeightWatcher permutes with NumPy's global generator
    theirs = _ww_edited(model, "SVDSharpness")
    ours, meta = _read(tmp_path / "out.safetensors")
    # the trap of the Linear (one spike), of the conv (9 spikes over 9 slices: one each) and the
    # largest Student-t entries (one spike)
    assert summary.edited == {"0.weight": 1, "1.weight": 1, "2.weight": 1}
    _check(ours, meta, theirs, original, summary.edited)
    assert abs(float(ours["2.weight"][3, 5])) < 10.0


def test_a_count_weightwatcher_fails_on_is_left_and_said(tmp_path: Path) -> None:
    # Conv2d(16, 8, 2) with percent 0.8: WW's count int(0.8·16·4) = 51, ⌈51/4⌉ = 13 components of
    # an 8 × 16 slice: scikit-learn's TruncatedSVD refuses it, and WW's SVDSmoothing fails.
    model = _model()
    _save(model, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="n_components"):
        _ww_edited(model, "SVDSmoothing", percent=0.8, method="svd")
    summary = smooth_checkpoint(tmp_path / "model.safetensors", tmp_path / "out.safetensors", percent=0.8,
                                ww_compatible=True)
    assert summary.unchanged["3.weight"].startswith("keeps 13 > 8 components: WeightWatcher's TruncatedSVD refuses")


def test_cli_and_validation(tmp_path: Path) -> None:
    from wbfe_cli.main import app

    model = _model()
    _save(model, tmp_path / "model.safetensors")
    ref, out, direct = (str(tmp_path / n) for n in ("model.safetensors", "cli.safetensors", "direct.safetensors"))
    runner = CliRunner()
    for command, call in (("smooth", lambda: smooth_checkpoint(ref, direct, percent=0.5, ww_compatible=True)),
                          ("sharpen", lambda: sharpen_checkpoint(ref, direct, seed=3, ww_compatible=True))):
        extra = ["--percent", "0.5"] if command == "smooth" else ["--seed", "3"]
        result = runner.invoke(app, [command, ref, out, *extra, "--ww-compatible"])
        assert result.exit_code == 0, result.stderr
        call()
        assert Path(out).read_bytes() == Path(direct).read_bytes()
    with pytest.raises(InvalidOptionError, match=r"^ww_compatible must be"):
        smooth_checkpoint(ref, direct, ww_compatible="yes")  # type: ignore[arg-type]
