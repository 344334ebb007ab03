"""``wbfe esd``: one layer's spectrum, its fits, and the figure."""

from __future__ import annotations

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


@pytest.mark.parametrize("exponent", [997, -997, 0])
def test_a_matrix_far_from_one_is_drawn_rescaled_and_says_so(tmp_path: Path, monkeypatch, exponent: int) -> None:
    # Weights near 1e±300: the eigenvalues were drawn rescaled by a power of two (near 1), with nothing saying so.
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
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _, spec = layer_spectrum(tmp_path / "w.safetensors", "fc")
    k, _ = esd_plot.esd_scale(spec.eigs, spec.log_scale)
    # the drawn eigenvalues are the true ones, σ(w)²·4^exponent, times 2^k
    true_log2 = np.log2(np.sort(np.linalg.svd(w, compute_uv=False) ** 2)) + 2 * exponent
    np.testing.assert_allclose(np.log2(spec.eigs) - k, true_log2, rtol=0, atol=1e-9)
    ax = figures[0].axes[0]
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
