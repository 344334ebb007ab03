"""Cost of wbfe's WeightWatcher-parity options against WeightWatcher 0.7.7's on the same small model.

One seeded torch model (two convolutions, three linear layers, widths times ``--scale``), one BLAS
thread, in this process. Each figure is this process's CPU time (one thread: what the call costs,
whatever else the shared machine runs; wall time is saved beside it), and the runs being compared
are interleaved: round r runs each of them once, in an order rotated each round, so that a slow
phase of the machine falls on all alike. Every run is reported as its own total (``*_s``: the median
over the rounds, never a difference). A group's cost beside the run without it (``added``) is the
median over the rounds of that round's difference, given where the differences' 25th percentile is
above zero (``measurable``); otherwise ``s`` is null: the cost is within a run's noise (``detx``
reuses the eigenvalues the ``htsr`` fit has), and the median difference, kept beside it with the
25th and 75th percentiles, is noise whatever its sign.

- groups ``vectors`` and ``detx``: ``wbfe.score(model, metrics="htsr,<group>")`` (default and
  ``ww_compatible``) against ``WeightWatcher.analyze(vectors=True)`` / ``(detX=True)``, beside the
  ``htsr``-only run (WeightWatcher: its plain ``analyze()``).
- ``fix_fingers`` / ``fit``: the ``htsr`` group's compute on the model's spectra with each option
  (the eigen-solves are shared and left out), beside the plain fit; WeightWatcher's
  ``fix_fingers="clip_xmax"`` beside its plain ``analyze()`` (the one of these it runs; the others go
  through the ``powerlaw`` package, whose 2.0 makes them fail); and the ``powerlaw`` package's own
  ``Fit`` on the same tails with the same xmin choices (what WeightWatcher would call): the power
  law from the ESD peak's range (``xmin_peak``), the truncated power law with xmin over every
  candidate (``tpl``) and over the peak's range (``e_tpl``), on the layers of at most ``--tpl-max``
  eigenvalues (the package fits the truncated law at every candidate: seconds a layer, a minute
  for the four of the default model), each beside wbfe's on the same layers (one run of the package).
- ``intra`` and ``conv fft``: ``wbfe.score(model, metrics="htsr", intra=True)`` / ``conv="fft"``
  (default and ``ww_compatible``) against ``analyze(intra=True)`` / ``analyze(conv2d_fft=True)``,
  each as its whole run and beside the plain run. WeightWatcher's ``intra`` run scores the products
  only (its layers' own rows are not made: it costs less than its plain run, so it is given as its
  total only), and it also multiplies the two convolutions' first slices; wbfe's adds the products'
  rows to every matrix's (a conv kernel ends its chain): the row counts are saved beside the times.

    python benchmarks/bench_ww_groups.py [--repeats 7] [--scale 1] [--tpl-max 300]

Results: benchmarks/results/ww_groups.json (and printed).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import platform
import statistics
import time
import warnings
from functools import partial
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


def _clock() -> tuple[float, float]:
    return time.process_time(), time.perf_counter()


def interleaved(runs: dict[str, Callable[[], Any]], repeats: int) -> dict[str, dict[str, list[float]]]:
    """Each run's CPU and wall seconds in each of ``repeats`` rounds; round r runs every one once,
    starting at the r-th (rotated), after one untimed warm-up round (imports, caches)."""
    labels = list(runs)
    for label in labels:
        runs[label]()
    out: dict[str, dict[str, list[float]]] = {label: {"cpu": [], "wall": []} for label in labels}
    for r in range(repeats):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            cpu, wall = _clock()
            runs[label]()
            cpu_end, wall_end = _clock()
            out[label]["cpu"].append(cpu_end - cpu)
            out[label]["wall"].append(wall_end - wall)
    return out


def total(samples: dict[str, list[float]]) -> dict[str, float]:
    """A run's own time: median CPU seconds over the rounds, the smallest, and the median wall time."""
    return {"s": statistics.median(samples["cpu"]), "min_s": min(samples["cpu"]),
            "wall_s": statistics.median(samples["wall"])}


def added(samples: dict[str, list[float]], base: dict[str, list[float]]) -> dict[str, Any]:
    """What a run costs beyond ``base``, from the rounds' paired CPU differences: their median
    (``median_difference_s``), 25th and 75th percentiles (``spread_s``), and ``s``, the median where
    the 25th percentile is above zero (``measurable``), else None: the difference is within the
    noise of a run, and a negative median is that noise, not a saving."""
    diffs = [a - b for a, b in zip(samples["cpu"], base["cpu"])]
    low, median, high = statistics.quantiles(diffs, n=4, method="inclusive")
    return {"s": median if low > 0 else None, "measurable": low > 0, "median_difference_s": median,
            "spread_s": [low, high]}


def quiet(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            return fn()
    return run


def ww_spectra(model: Any) -> list[Any]:
    """The spectra wbfe's WeightWatcher-compatible mode scores (the ×½ conv slices), for the fit timings."""
    from wbfe.metrics._group import Spectrum
    from wbfe.metrics.ww_compat import ww_conv2d_matrices

    specs = []
    for _, module in model.named_children():
        w = module.weight.detach().numpy()
        mats = ww_conv2d_matrices(w) if w.ndim == 4 else [w.astype(np.float64)]
        e = np.sort(np.concatenate([np.linalg.svd(x, compute_uv=False) ** 2 for x in mats]))
        specs.append(Spectrum(eigs=e, rows=mats[0].shape[0], cols=mats[0].shape[1], n_slices=len(mats)))
    return specs


def views(model: Any, ww: Any, repeats: int) -> dict[str, Any]:
    """``intra`` and ``conv fft``: each run's total and its cost beside the plain run, wbfe against WeightWatcher."""
    import wbfe

    out: dict[str, Any] = {}
    for mode, compat in (("default", False), ("ww_compatible", True)):
        runs: dict[str, Callable[[], Any]] = {
            "plain": lambda: wbfe.score(model, metrics="htsr", ww_compatible=compat),  # noqa: B023 - run at once
            "intra": lambda: wbfe.score(model, metrics="htsr", ww_compatible=compat, intra=True),  # noqa: B023
            "conv_fft": lambda: wbfe.score(model, metrics="htsr", ww_compatible=compat, conv="fft"),  # noqa: B023
        }
        times = interleaved(runs, repeats)
        for label in ("intra", "conv_fft"):
            out[f"{label}_{mode}"] = {**total(times[label]), "added": added(times[label], times["plain"])}
    rows = [r for r in wbfe.score(model, metrics="htsr", intra=True).layers if r["role"] == "intra"]
    out["intra_wbfe_products"] = [r["name"] for r in rows]
    ww_runs = {label: quiet(partial(ww.analyze, randomize=False, mp_fit=False, plot=False, **keywords))
               for label, keywords in (("plain", {}), ("intra", {"intra": True}), ("conv_fft", {"conv2d_fft": True}))}
    times = interleaved(ww_runs, repeats)
    out["plain_ww"] = total(times["plain"])
    out["intra_ww"] = total(times["intra"])  # the products only: no plain run inside it to subtract
    out["conv_fft_ww"] = {**total(times["conv_fft"]), "added": added(times["conv_fft"], times["plain"])}
    details = quiet(lambda: ww.analyze(randomize=False, mp_fit=False, plot=False, intra=True))()
    out["intra_ww_products"] = [str(name).strip() for name in details["name"]]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--scale", type=int, default=1, help="multiplies the layer widths")
    parser.add_argument("--tpl-max", type=int, default=300,
                        help="the powerlaw package's tpl fit on the layers of at most this many eigenvalues")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    import torch
    import weightwatcher
    from threadpoolctl import threadpool_limits

    import wbfe

    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    model = build_model(args.scale)
    out: dict[str, Any] = {"model": {name: list(m.weight.shape) for name, m in model.named_children()},
                           "scale": args.scale, "repeats": args.repeats, "threads": 1,
                           "machine": platform.processor() or platform.machine(), "clock": "process CPU time",
                           "groups": {}, "tail_fits": {}}
    with threadpool_limits(1):
        ww = weightwatcher.WeightWatcher(model=model)
        for mode, compat in (("default", False), ("ww_compatible", True)):
            runs: dict[str, Callable[[], Any]] = {
                group: partial(wbfe.score, model, metrics=metrics, ww_compatible=compat)
                for group, metrics in (("htsr", "htsr"), ("vectors", "htsr,vectors"), ("detx", "htsr,detx"))}
            times = interleaved(runs, args.repeats)
            out["groups"][f"htsr_{mode}"] = total(times["htsr"])
            for group in ("vectors", "detx"):
                out["groups"][f"{group}_{mode}"] = {**total(times[group]), "added": added(times[group], times["htsr"])}
        ww_runs = {label: quiet(partial(ww.analyze, randomize=False, mp_fit=False, plot=False, **keywords))
                   for label, keywords in (("plain", {}), ("vectors", {"vectors": True}), ("detx", {"detX": True}),
                                           ("clip_xmax", {"fix_fingers": "clip_xmax"}))}
        times = interleaved(ww_runs, args.repeats)
        out["groups"]["ww_analyze"] = total(times["plain"])
        for group in ("vectors", "detx"):
            out["groups"][f"{group}_ww"] = {**total(times[group]), "added": added(times[group], times["plain"])}
        out["tail_fits"]["clip_xmax_ww"] = {**total(times["clip_xmax"]),
                                            "added": added(times["clip_xmax"], times["plain"])}
        out["views"] = views(model, ww, args.repeats)
        out["tail_fits"].update(tail_fits(model, args.repeats, args.tpl_max))
    import powerlaw

    out["versions"] = {"wbfe": wbfe.__version__, "weightwatcher": weightwatcher.__version__,
                       "powerlaw": powerlaw.__version__, "numpy": np.__version__}
    out["load_average"] = os.getloadavg()  # over the last 1, 5 and 15 minutes, at the end
    text = json.dumps(out, indent=2)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")


def tail_fits(model: Any, repeats: int, tpl_max: int) -> dict[str, Any]:
    """The ``htsr`` group's fit options on the model's spectra, beside its plain fit, and the
    ``powerlaw`` package's own fits of the same tails with the same xmin choices beside wbfe's."""
    import powerlaw

    from wbfe.metrics import get_group
    from wbfe.metrics._group import MetricOptions
    from wbfe.options.conventions import WBFE, WEIGHTWATCHER, conventions_for
    from wbfe.metrics.fingers import peak_range

    out: dict[str, Any] = {}
    specs = ww_spectra(model)
    htsr = get_group("htsr")
    compute_many = htsr.compute_many
    assert compute_many is not None  # htsr fits its spectra together
    for compat in (False, True):
        mode = "ww_compatible" if compat else "default"
        options = {"plain": MetricOptions(conventions=conventions_for(compat)),
                   "clip_xmax": MetricOptions(conventions=conventions_for(compat), fix_fingers="clip_xmax"),
                   "xmin_peak": MetricOptions(conventions=conventions_for(compat), fix_fingers="xmin_peak"),
                   "tpl": MetricOptions(conventions=conventions_for(compat), fit="tpl"),
                   "e_tpl": MetricOptions(conventions=conventions_for(compat), fit="e_tpl")}
        times = interleaved({label: partial(compute_many, specs, o) for label, o in options.items()}, repeats)
        out[f"plain_{mode}"] = total(times["plain"])
        for label in ("clip_xmax", "xmin_peak", "tpl", "e_tpl"):
            out[f"{label}_{mode}"] = {**total(times[label]), "added": added(times[label], times["plain"])}

    # WeightWatcher's E_TPL is TPL with xmin_peak, whose range's lower end its source writes as
    # log10(0.95 * peak): far below the peak, so in ww_compatible mode e_tpl scans tpl's candidates
    # up to 1.5 * peak, and the two agree wherever tpl's own xmin lies below that.
    from wbfe.metrics.fingers import fit_tail

    same = []
    for s in specs:
        x = s.eigs[s.eigs > 1e-5]
        tpl = fit_tail(x, fit="tpl", conventions=WEIGHTWATCHER)
        e_tpl = fit_tail(x, fit="e_tpl", conventions=WEIGHTWATCHER)
        same.append({"eigenvalues": int(x.size), "peak_range": list(peak_range(x, log10=WEIGHTWATCHER.peak_log10)),
                     "tpl_xmin": tpl.xmin, "e_tpl_xmin": e_tpl.xmin, "same_alpha": tpl.alpha == e_tpl.alpha})
    out["e_tpl_vs_tpl_ww_compatible"] = same

    # The package, once per layer set (it is slow), against wbfe's fit of the same layers.
    tails = [s.eigs[s.eigs > 1e-5] for s in specs]
    pl_range = {"alpha": [1, None]}
    tpl_range = {"alpha": [-20, 20], "Lambda": [0, None]}
    sets: dict[str, tuple[list[int], str, Callable[[np.ndarray], Any]]] = {
        "xmin_peak": (list(range(len(specs))), "xmin_peak", lambda x: powerlaw.Fit(
            x, xmin=peak_range(x, log10=WBFE.peak_log10), parameter_ranges=pl_range, verbose=False).power_law.alpha),
        "tpl": ([k for k, x in enumerate(tails) if x.size <= tpl_max], "tpl", lambda x: powerlaw.Fit(
            x, xmin_distribution="truncated_power_law", parameter_ranges=tpl_range,
            verbose=False).truncated_power_law.alpha),
        "e_tpl": ([k for k, x in enumerate(tails) if x.size <= tpl_max], "e_tpl", lambda x: powerlaw.Fit(
            x, xmin=peak_range(x, log10=WBFE.peak_log10), xmin_distribution="truncated_power_law",
            parameter_ranges=tpl_range, verbose=False).truncated_power_law.alpha),
    }
    for label, (layers, option, package_fit) in sets.items():
        chosen = [specs[k] for k in layers]
        wbfe_options = (MetricOptions(fix_fingers="xmin_peak") if option == "xmin_peak"
                        else MetricOptions(fit=option))  # type: ignore[arg-type]
        cpu, _ = _clock()
        quiet(lambda: [package_fit(tails[k]) for k in layers])()  # noqa: B023 - run at once
        package_s = _clock()[0] - cpu
        wbfe_times = interleaved({"wbfe": lambda: [htsr.compute(s, wbfe_options) for s in chosen]},  # noqa: B023
                                 repeats)
        out[f"{label}_package"] = {"layers_eigenvalues": [int(tails[k].size) for k in layers],
                                   "powerlaw_package_s": package_s, "wbfe": total(wbfe_times["wbfe"])}
    return out


if __name__ == "__main__":
    main()
