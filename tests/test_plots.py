"""Every plot draws on its own Figure with an Agg canvas: the caller's backend and pyplot are left alone."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

PNG = b"\x89PNG\r\n\x1a\n"

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    import matplotlib
    import numpy as np

    matplotlib.use("pdf")  # the caller's choice, which no plot may switch
    out = Path(sys.argv[1])

    from wbfe.reporting.plots.esd import fit_esd, plot_esd
    from wbfe.reporting.plots.hierarchical import write_figures
    from wbfe.reporting.plots.ranking import plot_metric
    from wbfe.reporting.plots.theory import plot_kc
    from wbfe.reporting.plots.watch import plot_watch
    from wbfe.theory.hierarchical import simulate_hierarchical
    from wbfe.theory.teacher_student import readout, sweep
    from wbfe.watch import CheckpointPoint, LayerPoint, Trajectory, result_at

    rng = np.random.default_rng(0)
    w = rng.standard_normal((60, 120))
    eigs = np.linalg.eigvalsh(w @ w.T / 120)
    written = [plot_esd(eigs, fit_esd(eigs, 0.5), out / "esd.png")]
    written.append(plot_kc(sweep(readout("power", 8, beta=1.0), delta=0.04, d=20, r_values=[0.5, 1.0, 4.0]),
                           out / "kc.png"))
    result = simulate_hierarchical(d=6, p=2, alpha_min=1.5, alpha_max=2.0, points=2, seeds=1, features="gaussian",
                                   kernel_max_n=0, n_test=50)
    written += write_figures(result, out)
    traj = Trajectory("run")
    for t, beta in enumerate((1.0, 2.0, 4.0)):
        layer = LayerPoint("classifier.weight", "head", 0.25, 2.0, beta, 0.0, 0.01, 1.5, 1.0, 3.0)
        traj.points.append(CheckpointPoint(t, f"s{t}", (layer,), test_loss=[0.5, 0.3, 0.4][t]))
    written.append(plot_watch(result_at(traj, 0.5), out / "watch.png"))
    row = SimpleNamespace(rho=-0.5, ci_low=-0.9, ci_high=0.1, p_value=0.2, n=3)
    models = [SimpleNamespace(scores={"bfe_head": float(i)}, quality=float(-i), model=f"m{i}") for i in range(3)]
    ranked = SimpleNamespace(metric=lambda name: row, models=models, lower_is_better=False, quality="acc", zoo="z")
    written.append(plot_metric(ranked, "bfe_head", out / "rank.png"))
    print(matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules, len(written))
    """
)


def test_plots_never_switch_the_backend_nor_touch_pyplot(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["pdf", "False", "6"]
    names = ["esd.png", "kc.png", "hierarchical_overlaps.png", "hierarchical_nmse.png", "watch.png", "rank.png"]
    for name in names:
        assert (tmp_path / name).read_bytes()[:8] == PNG, name


ZOO_PATHS = ["/data/zoo/gpt2/model.safetensors", "/data/zoo/llama/model.safetensors", "/srv/runs/a/ckpt.pt",
             "/srv/other/a/ckpt.pt", "mlp-w16-d1.safetensors", "openai-community/gpt2"]
ZOO_LABELS = ["gpt2/model", "llama/model", "runs/a/ckpt", "other/a/ckpt", "mlp-w16-d1", "openai-community/gpt2"]


def test_rank_plots_label_points_with_model_names_not_paths(tmp_path: Path, monkeypatch) -> None:
    from types import SimpleNamespace

    from wbfe.reporting.figures import scatter_figure
    from wbfe.reporting.plots import ranking
    from wbfe.reporting.plots.ranking import checkpoint_labels, plot_metric

    # As few trailing parts as name the model and keep the labels apart; names and hub ids as they are.
    assert checkpoint_labels(ZOO_PATHS) == ZOO_LABELS
    assert checkpoint_labels(["https://host/m/model.safetensors.index.json", "s3://bucket/llama/"]) == ["m/model", "llama"]
    figures: list = []
    monkeypatch.setattr(ranking, "save", lambda fig, path: figures.append(fig) or path)
    row = SimpleNamespace(rho=-0.5, ci_low=-0.9, ci_high=0.1, p_value=0.2, n=len(ZOO_PATHS))
    models = [SimpleNamespace(scores={"bfe_head": float(i)}, quality=float(-i), model=m) for i, m in enumerate(ZOO_PATHS)]
    ranked = SimpleNamespace(metric=lambda name: row, models=models, lower_is_better=False, quality="acc", zoo="z")
    plot_metric(ranked, "bfe_head", tmp_path / "rank.png")
    (ax,) = figures[0].axes
    assert sorted(text.get_text() for text in ax.texts) == sorted(ZOO_LABELS)
    # The report's scatter uses the same rule (it draws the best and worst few).
    fig = scatter_figure(list(range(6)), list(range(6)), ZOO_PATHS, metric="bfe_head", quality="acc", title="t",
                         max_labels=6)
    drawn = {text.get_text() for ax in fig.axes for text in ax.texts}
    assert drawn and drawn <= set(ZOO_LABELS) and not any("/data/" in label or "/srv/" in label for label in drawn)


def test_wbfe_esd_and_the_report_draw_one_esd_figure(tmp_path: Path, monkeypatch) -> None:
    """`wbfe esd` (plot_esd) and the report's thumbnail (esd_figure) are one figure in one style: log-log axes, one
    grey point per nonempty log-spaced bin (counted here with numpy), the fits in their columns' colours."""
    import numpy as np
    from matplotlib.colors import to_hex

    from wbfe.reporting.figures import esd_figure
    from wbfe.reporting.metrics_info import colour
    from wbfe.reporting.plots import esd as esd_plot

    rng = np.random.default_rng(0)
    w = rng.standard_t(3, (100, 200))
    eigs = np.sort(np.linalg.eigvalsh(w @ w.T / 200))
    fits = esd_plot.fit_esd(eigs, 0.5)
    figures: list = []
    monkeypatch.setattr(esd_plot, "save", lambda fig, path, **kw: figures.append(fig) or path)
    esd_plot.plot_esd(eigs, fits, tmp_path / "esd.png", bins=40)
    pl, tpl, ht = fits.power_law, fits.truncated, fits.htmp
    row = {"alpha": pl.alpha, "xmin": pl.xmin, "tpl_alpha": tpl.alpha, "tpl_lambda": tpl.lam, "htmp_kappa": ht.kappa,
           "gamma": ht.gamma, "htmp_beta": ht.beta, "htmp_tau": ht.tau}  # the score's columns
    drawn = {"wbfe esd": (figures[0], 40), "report": (esd_figure(eigs, row, title="t"), 20)}  # 2·√100
    for caller, (fig, bins) in drawn.items():
        ax = fig.axes[0]
        assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log"), caller
        assert (ax.get_xlabel(), ax.get_ylabel()) == ("eigenvalue of the smaller Gram matrix", "density"), caller
        counts, edges = np.histogram(eigs, bins=np.geomspace(eigs[0], eigs[-1] * (1 + 1e-12), bins + 1))
        points = ax.lines[0]
        assert points.get_label() == "ESD (n = 100)" and to_hex(points.get_color()) == to_hex("0.35"), caller
        np.testing.assert_allclose(points.get_ydata(), (counts / (100 * np.diff(edges)))[counts > 0], rtol=1e-12)
        lines = {line.get_label().split(":")[0]: to_hex(line.get_color()) for line in ax.lines[1:]}
        assert lines == {"power law": colour("alpha"), "truncated PL": colour("tpl_alpha"),
                         "HTMP": colour("htmp_kappa")}, caller


def test_wbfe_rank_and_the_report_draw_one_scatter_figure(tmp_path: Path, monkeypatch) -> None:
    """`wbfe rank --output` (plot_metric) and the zoo page (scatter_figure) draw one scatter in one style: a point
    per model with a finite value (None and NaN left out), in the metric's colour, metric against quality."""
    from types import SimpleNamespace

    from matplotlib.colors import to_hex

    from wbfe.reporting.figures import scatter_figure
    from wbfe.reporting.metrics_info import colour
    from wbfe.reporting.plots import ranking

    scores = [0.5, float("nan"), 1.5, 2.0, None, 3.0]
    row = SimpleNamespace(rho=-0.5, ci_low=-0.9, ci_high=0.1, p_value=0.2, n=4)
    models = [SimpleNamespace(scores={"alpha_mean": s}, quality=float(i), model=f"m{i}") for i, s in enumerate(scores)]
    ranked = SimpleNamespace(metric=lambda name: row, models=models, lower_is_better=True, quality="loss", zoo="z")
    figures: list = []
    monkeypatch.setattr(ranking, "save", lambda fig, path: figures.append(fig) or path)
    ranking.plot_metric(ranked, "alpha_mean", tmp_path / "rank.png")
    report = scatter_figure(scores, [float(i) for i in range(6)], [f"m{i}" for i in range(6)], metric="alpha_mean",
                            quality="loss (lower is better)", title="t")  # the zoo page passes its JSON's values
    for caller, fig in {"wbfe rank": figures[0], "report": report}.items():
        (ax,) = fig.axes
        (points,) = ax.collections
        assert points.get_offsets().tolist() == [[0.5, 0.0], [1.5, 2.0], [2.0, 3.0], [3.0, 5.0]], caller
        assert to_hex(points.get_facecolor()[0]) == colour("alpha") and points.get_sizes().tolist() == [16], caller
        assert (ax.get_xlabel(), ax.get_ylabel()) == ("alpha_mean", "loss (lower is better)"), caller
        assert sorted(text.get_text() for text in ax.texts) == ["m0", "m2", "m3", "m5"], caller


def test_hierarchical_nmse_figure_draws_each_prediction_it_is_given(tmp_path: Path, monkeypatch) -> None:
    """The kernel floor (inside (0, 1)), the tail sum where a feature is known, and the asymptotic power law over
    the slope's range, anchored at the measured NMSE nearest d^lo; a missing tail constant reads n/a."""
    import numpy as np

    from wbfe.reporting.plots import hierarchical

    figures: list = []
    monkeypatch.setattr(hierarchical, "save", lambda fig, path, **kw: figures.append(fig) or path)
    n = [16.0, 64.0, 256.0, 1024.0]
    result = {"settings": {"d": 4},
              "points": [{"n": v, "nmse": 1.0 / (i + 1), "nmse_kernel": None} for i, v in enumerate(n)],
              "prediction": {"nmse_tail": [0.9, 0.5, 0.3, 0.2], "recovered_count": [0, 1, 2, 2], "kernel_floor": 0.4,
                             "tail_constant": None, "nmse_finite_d": [0.8, 0.45, 0.3, 0.2],
                             "slope_alpha_range": [2.0, 4.0], "exponent": -0.5, "fitted_slope": -0.45}}
    hierarchical.plot_nmse(result, tmp_path / "nmse.png")
    (ax,) = figures[0].axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["kernel floor, d^2 << n << d^4"].get_ydata()) == [0.4, 0.4]
    assert lines["tail sum x n/a"].get_xdata().tolist() == [64.0, 256.0, 1024.0]  # where a feature is known
    power = lines["n^-0.50 (slope fit -0.45)"]
    assert power.get_xdata().tolist() == [16.0, 256.0]  # d^2 to d^4
    np.testing.assert_allclose(power.get_ydata(), [1.0, 1.0 * (256.0 / 16.0) ** -0.5])  # anchored at n = 16
