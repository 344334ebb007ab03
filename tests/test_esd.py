"""``wbfe esd``: one layer's spectrum, its fits, and the figure."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner
from wbfe_cli.main import app

from wbfe.errors import InvalidOptionError
from wbfe.metrics import htmp
from wbfe.metrics.powerlaw import fit_power_law
from wbfe.reporting.plots.esd import fit_esd
from wbfe.scoring import layer_spectrum


def test_layer_spectrum_is_the_layer(st_file: Path, state_dict: dict) -> None:
    plan, spec = layer_spectrum(st_file, "blocks.0.mlp.fc1")
    w = state_dict["blocks.0.mlp.fc1.weight"].to(torch.float64).numpy()
    np.testing.assert_allclose(spec.eigs, np.sort(np.linalg.svd(w, compute_uv=False) ** 2), rtol=1e-10)
    assert plan.name == "blocks.0.mlp.fc1.weight" and plan.role == "mlp"
    with pytest.raises(InvalidOptionError, match=r"no tensor named 'blocks.0.mlp.fc3' .* did you mean 'blocks.0.mlp.fc2.weight', 'blocks.0.mlp.fc1.weight'"):
        layer_spectrum(st_file, "blocks.0.mlp.fc3")
    with pytest.raises(InvalidOptionError, match=r"classifier.bias is not a weight matrix \(1-D tensor"):
        layer_spectrum(st_file, "classifier.bias")


def test_fits_are_the_library_fits() -> None:
    eigs = np.sort(htmp.sample(3000, 2.0, 0.5, 1.5, seed=3))
    fits = fit_esd(eigs, 0.5)
    assert fits.power_law == fit_power_law(eigs, min_tail=10)
    assert fits.htmp == htmp.fit(eigs, 0.5)
    assert fits.truncated is not None and fits.truncated.xmin == fits.power_law.xmin


def test_cli_writes_a_png(st_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "esd.png"
    result = CliRunner().invoke(app, ["esd", str(st_file), "--layer", "embed.weight", "--output", str(out)])
    assert result.exit_code == 0, result.stderr
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    bad = CliRunner().invoke(app, ["esd", str(st_file), "--layer", "nope", "--output", str(tmp_path / "x.png")])
    assert bad.exit_code == 2 and "no tensor named 'nope'" in bad.stderr and not (tmp_path / "x.png").exists()


def test_a_tensor_its_reader_skips_is_no_esd(tmp_path: Path) -> None:
    """A stride-0 (expanded) tensor is skipped by score() with its reason; `wbfe esd` names it and
    the reason rather than plotting the spectrum of a rank-one view."""
    path = tmp_path / "expanded.pt"
    torch.save({"w": torch.randn(1, 64).expand(64, 64), "fc.weight": torch.randn(10, 64)}, path)
    with pytest.raises(InvalidOptionError, match="stride-0"):
        layer_spectrum(path, "w")


def _esd_of_scaled(tmp_path: Path, monkeypatch, exponent: int):  # noqa: ANN001, ANN202
    """``wbfe esd`` of a heavy-tailed 64×32 matrix times 2^exponent: (w, the command's result, the PNG, the figure)."""
    import wbfe.reporting.plots.esd as esd_plot
    from safetensors.torch import save_file

    w = np.random.default_rng(0).standard_t(3, (64, 32))
    save_file({"fc.weight": torch.tensor(w * 2.0**exponent)}, str(tmp_path / "w.safetensors"))
    figures = []
    save = esd_plot.save
    monkeypatch.setattr(esd_plot, "save", lambda fig, path, **kw: figures.append(fig) or save(fig, path, **kw))
    out = tmp_path / "esd.png"
    result = CliRunner().invoke(app, ["esd", str(tmp_path / "w.safetensors"), "--layer", "fc", "--output", str(out)])
    assert result.exit_code == 0, result.stderr
    return w, result, out, figures[0]


@pytest.mark.parametrize("exponent", [997, -997, 0])
def test_a_matrix_far_from_one_is_drawn_rescaled_and_says_so(tmp_path: Path, monkeypatch, exponent: int) -> None:
    # Weights near 1e±300: the eigenvalues were drawn rescaled by a power of two (near 1), with nothing saying so.
    import wbfe.reporting.plots.esd as esd_plot

    w, result, out, figure = _esd_of_scaled(tmp_path, monkeypatch, exponent)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _, spec = layer_spectrum(tmp_path / "w.safetensors", "fc")
    k, _ = esd_plot.esd_scale(spec.eigs, spec.log_scale)
    # the drawn eigenvalues are the true ones, σ(w)²·4^exponent, times 2^k
    true_log2 = np.log2(np.sort(np.linalg.svd(w, compute_uv=False) ** 2)) + 2 * exponent
    np.testing.assert_allclose(np.log2(spec.eigs) - k, true_log2, rtol=0, atol=1e-9)
    ax = figure.axes[0]
    points = ax.lines[0].get_xdata()
    assert spec.eigs.min() <= points.min() and points.max() <= spec.eigs.max()
    if exponent == 0:
        assert k == 0 and ax.get_xlabel() == "eigenvalue of the smaller Gram matrix"
        assert result.stderr == f"wrote {out}\n"
        return
    assert k == -2 * (exponent + 5)  # w's largest entry, 24.2 = 0.76·2^5, times 2^(k/2) is in [1/2, 1)
    assert ax.get_xlabel() == f"eigenvalue of the smaller Gram matrix × 2^{k}"
    top = round(true_log2[-1] * np.log10(2.0))
    assert result.stderr == f"wrote {out} (eigenvalues drawn × 2^{k}: the true ones reach 1e{top:+d})\n"


@pytest.mark.parametrize("exponent", [430, -430])
def test_weights_float64_holds_the_eigenvalues_of_are_drawn_true(tmp_path: Path, monkeypatch, exponent: int) -> None:
    # Weights near 1e±130: the score scales them (their Gram matrix is computed near 1), but the true eigenvalues,
    # near 1e±260, are float64 numbers: the figure draws them, with no "× 2^k" on the axis nor in the line.
    import wbfe.reporting.plots.esd as esd_plot

    w, result, out, figure = _esd_of_scaled(tmp_path, monkeypatch, exponent)
    assert result.stderr == f"wrote {out}\n"
    _, spec = layer_spectrum(tmp_path / "w.safetensors", "fc")
    assert esd_plot.esd_scale(spec.eigs, spec.log_scale)[0] == -2 * (exponent + 5)  # stored scaled, drawn true
    ax = figure.axes[0]
    assert ax.get_xlabel() == "eigenvalue of the smaller Gram matrix"
    true = np.sort(np.linalg.svd(w, compute_uv=False) ** 2) * 4.0**exponent
    points = ax.lines[0].get_xdata()
    assert true.min() <= points.min() and points.max() <= true.max()


@pytest.mark.parametrize(("k", "drawn"), [(-1022, 0), (-1023, -1023), (1005, 0), (1006, 1006)])
def test_the_rescaling_label_only_where_float64_cannot_hold_the_eigenvalues(tmp_path: Path, monkeypatch, k: int,
                                                                            drawn: int) -> None:
    # Stored eigenvalues in [0.75, 1.5], the true ones × 2^k: the true largest, 1.5·2^-k, is below 2^1023 down to
    # k = -1022; the true smallest, 0.75·2^-k, at least 2^-1006 (room for the densities, ~1/e) up to k = 1005.
    import wbfe.reporting.plots.esd as esd_plot

    eigs = np.geomspace(0.75, 1.5, 80)
    got, note = esd_plot.esd_scale(eigs, -k * math.log(2.0))
    assert got == k and (note == "") == (drawn == 0)
    if drawn:
        assert note.startswith(f"eigenvalues drawn × 2^{k}: the true ones reach 1e")
    figures = []
    monkeypatch.setattr(esd_plot, "save", lambda fig, path, **kw: figures.append(fig) or path)
    fits = esd_plot.fit_esd(eigs, 0.5)
    esd_plot.plot_esd(eigs, fits, tmp_path / "esd.png", scale_exp2=k)
    esd_plot.plot_esd(eigs, fits, tmp_path / "esd.png")  # the same numbers taken as the true ones
    ax, stored = figures[0].axes[0], figures[1].axes[0]
    assert ax.get_xlabel() == "eigenvalue of the smaller Gram matrix" + (f" × 2^{k}" if drawn else "")
    # what is drawn is the true eigenvalues × 2^drawn (exactly: a power of two), the density its reciprocal
    x, y = (np.asarray(v) for v in ax.lines[0].get_data())
    x0, y0 = (np.asarray(v) for v in stored.lines[0].get_data())
    assert np.isfinite(x).all() and np.isfinite(y).all() and (y > 0).all()
    np.testing.assert_array_equal(x, np.ldexp(x0, drawn - k))
    np.testing.assert_array_equal(y, np.ldexp(y0, k - drawn))
    xmin = [line.get_label() for line in ax.lines if line.get_label().startswith("power law")][0]
    assert f"xmin = {np.ldexp(fits.power_law.xmin, drawn - k):.3g}," in xmin


def test_fit_esd_refuses_an_aspect_ratio_outside_0_1() -> None:
    # gamma = rows / cols of the smaller Gram matrix: a γ above 1 was fitted as a square matrix, with nothing said
    from wbfe.reporting.plots.esd import fit_esd

    eigs = np.sort(htmp.sample(500, 2.0, 0.5, 1.5, seed=3))
    for gamma in (0.0, 2.0, float("nan")):
        with pytest.raises(InvalidOptionError,
                           match=r"gamma \(the smaller over the larger side\) must lie in \(0, 1\]"):
            fit_esd(eigs, gamma)
    assert fit_esd(eigs, 1.0).htmp.gamma == 1.0 - 1e-9  # a square matrix: just below


def test_a_spectrum_of_one_value_is_drawn_as_such(tmp_path: Path, monkeypatch) -> None:
    # 2·I: every eigenvalue is 4; `wbfe esd` and the report's thumbnail say there is no density to draw
    import wbfe.reporting.plots.esd as esd_plot
    from safetensors.torch import save_file

    save_file({"fc.weight": 2 * torch.eye(8, dtype=torch.float64)}, str(tmp_path / "eye.safetensors"))
    figures = []
    monkeypatch.setattr(esd_plot, "save", lambda fig, path, **kw: figures.append(fig) or path)
    result = CliRunner().invoke(app, ["esd", str(tmp_path / "eye.safetensors"), "--layer", "fc", "-o",
                                      str(tmp_path / "esd.png")])
    assert result.exit_code == 0, result.stderr
    figures.append(esd_plot.esd_figure(np.full(8, 4.0), {"alpha": 2.0, "xmin": 4.0}, title="t"))
    for fig in figures:
        (ax,) = fig.axes
        assert [t.get_text() for t in ax.texts] == ["fewer than 2 distinct\npositive eigenvalues"] and not ax.lines
