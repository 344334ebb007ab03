"""Cost of wbfe's WeightWatcher-parity options against WeightWatcher 0.7.7's on the same small model.

One seeded torch model (two convolutions, three linear layers), one BLAS thread, in this process;
each timing is the median of ``--repeats`` runs of the analysis call alone:

- groups ``vectors`` and ``detx``: ``wbfe.score(model, metrics="htsr,<group>")`` (default and
  ``ww_compatible``) against ``WeightWatcher.analyze(vectors=True)`` / ``(detX=True)``; the cost of a
  group is its run's time less the ``htsr``-only run's (WeightWatcher: less its plain ``analyze()``).
- ``fix_fingers`` / ``fit``: the ``htsr`` group's compute on the model's spectra with each option
  (the eigen-solves are shared and left out), against WeightWatcher's ``fix_fingers="clip_xmax"``
  (the one of these it runs; the others go through the ``powerlaw`` package, whose 2.0 makes them
  fail) and, for ``xmin_peak`` and ``e_tpl``, the ``powerlaw`` package's own ``Fit`` on the same
  tails (what WeightWatcher would call), that one on the smallest layers only (it is slow).
- ``intra`` and ``conv fft``: ``wbfe.score(model, metrics="htsr", intra=True)`` / ``conv="fft"``
  (default and ``ww_compatible``) against ``analyze(intra=True)`` / ``analyze(conv2d_fft=True)``,
  each as its whole run's time and as that less the plain run's. WeightWatcher's ``intra`` run
  scores the products only (its layers' own rows are not made), and it also multiplies the two
  convolutions' first slices; wbfe's adds the products' rows to every matrix's (a conv kernel ends
  its chain): the row counts are saved beside the times.

    python benchmarks/bench_ww_groups.py [--repeats 3] [--scale 1]

Results: benchmarks/results/ww_groups.json (and printed).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import platform
import statistics
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "ww_groups.json"


def build_model(scale: int) -> Any:
    import torch

    def heavy(shape: tuple[int, ...], df: float, seed: int) -> "torch.Tensor":
        return torch.from_numpy(np.random.default_rng(seed).standard_t(df, size=shape).astype(np.float32))

    m = torch.nn.Sequential()
    m.add_module("conv1", torch.nn.Conv2d(32 * scale, 64 * scale, 3))
    m.add_module("conv2", torch.nn.Conv2d(64 * scale, 64 * scale, 3))
    m.add_module("fc1", torch.nn.Linear(512 * scale, 256 * scale))
    m.add_module("fc2", torch.nn.Linear(256 * scale, 256 * scale))
    m.add_module("head", torch.nn.Linear(256 * scale, 100))
    with torch.no_grad():
        for k, p in enumerate(p for name, p in m.named_parameters() if name.endswith("weight")):
            p.copy_(heavy(tuple(p.shape), 2.5 + 0.5 * (k % 3), k))
    return m


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def quiet(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            return fn()
    return run


def ww_spectra(model: Any) -> list[Any]:
    """The spectra wbfe's WeightWatcher-compatible mode scores (the ×½ conv slices), for the fit timings."""
    from wbfe._ww_compat import ww_conv2d_matrices
    from wbfe.metrics._group import Spectrum

    specs = []
    for _, module in model.named_children():
        w = module.weight.detach().numpy()
        mats = ww_conv2d_matrices(w) if w.ndim == 4 else [w.astype(np.float64)]
        e = np.sort(np.concatenate([np.linalg.svd(x, compute_uv=False) ** 2 for x in mats]))
        specs.append(Spectrum(eigs=e, rows=mats[0].shape[0], cols=mats[0].shape[1], n_slices=len(mats)))
    return specs


def views(model: Any, ww: Any, ww_base: float, groups: dict[str, float], repeats: int) -> dict[str, Any]:
    """Time of ``intra`` and ``conv fft`` (whole runs, and less the plain run), wbfe against WeightWatcher."""
    import wbfe

    out: dict[str, Any] = {}
    for mode, compat in (("default", False), ("ww_compatible", True)):
        base = groups[f"htsr_{mode}_s"]
        for label, keywords in (("intra", {"intra": True}), ("conv_fft", {"conv": "fft"})):
            t = median_time(lambda: wbfe.score(model, metrics="htsr", ww_compatible=compat, **keywords),  # noqa: B023
                            repeats)
            out[f"{label}_{mode}_s"], out[f"{label}_{mode}_added_s"] = t, t - base
    rows = [r for r in wbfe.score(model, metrics="htsr", intra=True).layers if r["role"] == "intra"]
    out["intra_wbfe_products"] = [r["name"] for r in rows]
    for label, flag in (("intra", "intra"), ("conv_fft", "conv2d_fft")):
        np.random.seed(0)
        t = median_time(quiet(lambda: ww.analyze(randomize=False, mp_fit=False, plot=False, **{flag: True})),  # noqa: B023
                        repeats)
        out[f"{label}_ww_s"], out[f"{label}_ww_added_s"] = t, t - ww_base
    details = quiet(lambda: ww.analyze(randomize=False, mp_fit=False, plot=False, intra=True))()
    out["intra_ww_products"] = [str(name).strip() for name in details["name"]]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scale", type=int, default=1, help="multiplies the layer widths")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    import torch
    import weightwatcher
    from threadpoolctl import threadpool_limits

    import wbfe
    from wbfe.metrics import get_group
    from wbfe.metrics._group import MetricOptions
    from wbfe.metrics.fingers import peak_range

    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    model = build_model(args.scale)
    out: dict[str, Any] = {"model": {name: list(m.weight.shape) for name, m in model.named_children()},
                           "repeats": args.repeats, "threads": 1, "machine": platform.processor() or platform.machine(),
                           "groups": {}, "tail_fits": {}}
    with threadpool_limits(1):
        ww = weightwatcher.WeightWatcher(model=model)
        ww_base = median_time(quiet(lambda: ww.analyze(randomize=False, mp_fit=False, plot=False)), args.repeats)
        for mode, compat in (("default", False), ("ww_compatible", True)):
            base = median_time(lambda: wbfe.score(model, metrics="htsr", ww_compatible=compat), args.repeats)
            out["groups"][f"htsr_{mode}_s"] = base
            for group in ("vectors", "detx"):
                t = median_time(lambda: wbfe.score(model, metrics=f"htsr,{group}", ww_compatible=compat), args.repeats)
                out["groups"][f"{group}_{mode}_added_s"] = t - base
        out["groups"]["ww_analyze_s"] = ww_base
        for group, flag in (("vectors", "vectors"), ("detx", "detX")):
            t = median_time(quiet(lambda: ww.analyze(randomize=False, mp_fit=False, plot=False, **{flag: True})),  # noqa: B023 - called at once
                            args.repeats)
            out["groups"][f"{group}_ww_added_s"] = t - ww_base
        t = median_time(quiet(lambda: ww.analyze(randomize=False, mp_fit=False, plot=False, fix_fingers="clip_xmax")),
                        args.repeats)
        out["tail_fits"]["clip_xmax_ww_added_s"] = t - ww_base
        out["views"] = views(model, ww, ww_base, out["groups"], args.repeats)

        specs = ww_spectra(model)
        htsr = get_group("htsr")
        compute_many = htsr.compute_many
        assert compute_many is not None  # htsr fits its spectra together
        for compat in (False, True):
            plain = median_time(lambda: compute_many(specs, MetricOptions(ww_compatible=compat)), args.repeats)
            mode = "ww_compatible" if compat else "default"
            out["tail_fits"][f"plain_{mode}_s"] = plain
            for label, options in (("clip_xmax", MetricOptions(ww_compatible=compat, fix_fingers="clip_xmax")),
                                   ("xmin_peak", MetricOptions(ww_compatible=compat, fix_fingers="xmin_peak")),
                                   ("tpl", MetricOptions(ww_compatible=compat, fit="tpl")),
                                   ("e_tpl", MetricOptions(ww_compatible=compat, fit="e_tpl"))):
                t = median_time(lambda: compute_many(specs, options), args.repeats)  # noqa: B023 - called at once
                out["tail_fits"][f"{label}_{mode}_added_s"] = t - plain

        import powerlaw

        tails = [s.eigs[s.eigs > 1e-5] for s in specs]
        out["tail_fits"]["xmin_peak_powerlaw_package_s"] = median_time(quiet(lambda: [
            powerlaw.Fit(x, xmin=peak_range(x, ww_compatible=False), parameter_ranges={"alpha": [1, None]}, verbose=False)
            for x in tails]), 1)
        small = [x for x in tails if x.size <= 100]
        options = MetricOptions(fit="e_tpl")
        out["tail_fits"]["e_tpl_small_layers"] = [int(x.size) for x in small]
        out["tail_fits"]["e_tpl_small_wbfe_s"] = median_time(lambda: [
            htsr.compute(s, options) for s in specs if s.eigs[s.eigs > 1e-5].size <= 100], args.repeats)
        out["tail_fits"]["e_tpl_small_powerlaw_package_s"] = median_time(quiet(lambda: [
            powerlaw.Fit(x, xmin=peak_range(x, ww_compatible=False), xmin_distribution="truncated_power_law",
                         parameter_ranges={"alpha": [-20, 20], "Lambda": [0, None]}, verbose=False).truncated_power_law.alpha
            for x in small]), 1)
    out["versions"] = {"wbfe": wbfe.__version__, "weightwatcher": weightwatcher.__version__,
                       "powerlaw": powerlaw.__version__, "numpy": np.__version__}
    text = json.dumps(out, indent=2)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
