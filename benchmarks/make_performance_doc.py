"""Write docs/performance.md from the measurements in benchmarks/results/.

Every figure on that page is read here from a file in benchmarks/results/ (its JSON or, for the
fused MoE run, the ``/usr/bin/time -v`` text) and formatted; the prose around the figures is the
template in this file, and holds no figure of its own: a measurement no file records is not on the
page. The code's own settings the page names (block sizes, thresholds) come from ``SETTINGS``, each
the value of a constant under wbfe/. Rerun after a benchmark writes new results, and commit both:
``tests/test_docs.py`` fails while the page and the files disagree, ``tests/test_performance_doc.py``
while the template holds a figure or a setting differs from its constant.

    python benchmarks/make_performance_doc.py            # rewrite docs/performance.md
    python benchmarks/make_performance_doc.py --check    # exit 1 if it is out of date
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

Cell = Callable[[dict[str, Any]], str]  # one thread-count's figures -> the text of a table cell

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
OUTPUT = ROOT / "docs" / "performance.md"

# The vs-WeightWatcher table: file key -> the row's label.
VS_WW_ROWS = {
    "synthetic": "synthetic (Conv 64×64×3×3, 3×Linear 1024², 2×Linear 512→2048)",
    "cifar-resnet20": "CIFAR ResNet-20",
    "cifar-resnet32": "CIFAR ResNet-32",
    "cifar-resnet44": "CIFAR ResNet-44",
    "cifar-resnet56": "CIFAR ResNet-56",
    "transformer-108M": "transformer-shaped, 108 M parameters",
}
RESNETS = ("cifar-resnet20", "cifar-resnet32", "cifar-resnet44", "cifar-resnet56")
LARGE = ("synthetic", "transformer-108M")
THREADS = ("threads_1", "threads_default")
FLOP_LIMIT_CAP = 250  # above this the flop bound is only "> 250×": the solve is no longer the cost

# The LLM-scale table: run key -> (checkpoint label, metrics label).
LLM_ROWS = {
    "moe:bfe": ("10,368 experts 256 × 1024", "`bfe`"),
    "moe:bfe,htsr": ("10,368 experts 256 × 1024", "`bfe,htsr` (default)"),
    "moe:htmp": ("384 experts (one MoE layer)", "`htmp`"),
    "dense:bfe": ("one 7B layer (7 matrices)", "`bfe`"),
    "dense:bfe,htsr": ("one 7B layer (7 matrices)", "`bfe,htsr` (default)"),
}
# Settings of the code that the page names (not measurements): key -> (the module that defines
# it, the constant's name, its value). tests/test_performance_doc.py checks each value against the
# constant's assignment in that module (or, if the module moved, the one module defining the name).
SETTINGS: dict[str, tuple[str, str, float]] = {
    "gram_block_bytes": ("wbfe/linalg/spectra.py", "_BLOCK_BYTES", 8 << 20),
    "small_p": ("wbfe/linalg/spectra.py", "_SMALL_P", 256),
    "worker_bytes": ("wbfe/linalg/spectra.py", "_WORKER_BYTES", 32 << 20),
    "row_batch": ("wbfe/engine/rows.py", "ROW_BATCH", 256),
    "mp_batch_min": ("wbfe/metrics/mp.py", "_BATCH_MIN", 16),
    "budget": ("wbfe/engine/pipeline.py", "_BUDGET", 2.5),
    "budget_floor_bytes": ("wbfe/engine/pipeline.py", "_BUDGET_FLOOR", 64 << 20),
}


def setting(key: str) -> float:
    """The value of one of the code's settings (SETTINGS)."""
    return SETTINGS[key][2]


def mib_of(key: str) -> str:
    """A byte-size setting in MiB."""
    return f"{setting(key) / 2**20:.0f} MiB"


def load(results: Path, name: str) -> Any:
    """Args: results: the results folder; name: a file in it. Returns: its parsed JSON."""
    return json.loads((results / name).read_text(encoding="utf-8"))


def secs(x: float) -> str:
    """Seconds as the tables print them: two decimals, three below 0.1 s."""
    return f"{x:.2f}" if x >= 0.1 else f"{x:.3f}"


def times(x: float) -> str:
    """A ratio: one decimal below 20, whole above."""
    return f"{x:.1f}×" if x < 20 else f"{x:.0f}×"


def span(values: Iterable[float], fmt: str = "{:.0f}", unit: str = "") -> str:
    """The range of values as "a–b" (one value when both ends print alike)."""
    vals = sorted(values)
    lo, hi = fmt.format(vals[0]), fmt.format(vals[-1])
    return (lo if lo == hi else f"{lo}–{hi}") + unit


def sci(x: float) -> str:
    """A small number as 3.3e-8 (no zero-padded exponent)."""
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def minutes(seconds: float) -> str:
    """Minutes, whole from 3 min, else one decimal."""
    m = seconds / 60
    return f"{m:.0f} min" if m >= 3 else f"{m:.1f} min"


def thousands(x: float) -> str:
    """A count with thousands separators."""
    return f"{x:,.0f}"


def pair(model: dict[str, Any], get: Cell) -> str:
    """One cell: the one-thread value / the default-threads value."""
    return " / ".join(get(model[t]) for t in THREADS)


def load_span(values: Iterable[float]) -> str:
    """A range of load averages as the page prints them."""
    return span(values, "{:.1f}")


def section_flow(results: Path) -> str:
    fits = load(results, "fit_batching.json")
    blas_file = load(results, "blas_layer.json")
    blas = blas_file["cases"]
    loaded_run = blas_file["earlier_runs"][0]
    earlier_moe = blas_file["earlier_runs"][-1]["cases"]["moe_experts"]  # the three-round quiet run the rerun replaced
    earlier_llama = blas_file["earlier_runs"][1]["cases"]["llama7b_layers"]  # the loaded run the quiet rerun replaced
    llama = blas["llama7b_layers"]
    moe, resnet = fits["cases"]["moe_experts"], fits["cases"]["resnet56"]
    ticks = load(results, "progress_ticks.json")
    ahead = load(results, "read_ahead.json")
    ahead_x = span([c["end_to_end_speedup"] for c in ahead["cases"].values()], "{:.2f}", "×")
    ahead_loads = load_span(v for c in ahead["cases"].values() for x in c["variants"].values()
                            for v in x["load_average_1min"])

    def x(case: dict[str, Any], key: str = "end_to_end_speedup") -> str:
        return f"{(case[key] if key == 'end_to_end_speedup' else case[key]['end_to_end_speedup']):.2f}×"

    def loads(case: dict[str, Any]) -> str:
        return load_span(v for variant in case["variants"].values() for v in variant["load_average_1min"])

    def rounds(case: dict[str, Any]) -> str:
        return span(case["per_round"], "{:.2f}", "×")

    fit_loads = loads(moe)
    quiet = fits["quiet_rerun"]
    quiet_loads = load_span(v for case in quiet["cases"].values() for variant in case["variants"].values()
                            for v in variant["load_average_1min"])
    blas_rows = "\n".join(
        f"| {label} | {thousands(case['matrices'])} | {x(case)} | {rounds(case)} | {loads(case)} | {when} |"
        for label, case, when in (
            ("ResNet-56", blas["resnet56"], blas["resnet56"]["run_label"]),
            ("MoE experts of 256 × 1024", blas["moe_experts"], blas["moe_experts"]["run_label"]),
            ("LLaMA-7B-shaped layer", blas["llama7b_layers"], blas["llama7b_layers"]["run_label"]),
            ("MoE experts of 256 × 1024", earlier_moe, earlier_moe["run_label"]),
            ("LLaMA-7B-shaped 4,096² matrix", earlier_llama, earlier_llama["run_label"]),
            ("ResNet-56", loaded_run["cases"]["resnet56"], "loaded run"),
            ("MoE experts of 256 × 1024", loaded_run["cases"]["moe_experts"], "loaded run"),
        ))
    return f"""## How a checkpoint flows

(`wbfe/engine/pipeline.py`, `wbfe/linalg/spectra.py`)

- Each safetensors tensor is read into a buffer of its own (`readinto`, no zero fill), freed with
  the tensor, so the resident set is the tensors alive now.
- The files' SHA-256 (the provenance `sha256`) is computed on the calling thread when the provenance
  is written, after the matrices are scored.
- Duplicate tensors are found from a digest (BLAKE2b) of every byte of each tensor.
- The float64 Gram matrix is a symmetric rank-k update in {mib_of("gram_block_bytes")} blocks. It, the Cholesky factor
  and the eigen-solve (`dsyevr`, the routine and workspace of `scipy.linalg.eigvalsh`, so the same
  eigenvalues bit for bit) call OpenBLAS through scipy's Cython exports via ctypes
  (`wbfe/linalg/blas.py`), which releases the GIL (scipy's Python wrappers hold it), so that workers
  work side by side. When only BFE-W is asked, a Cholesky factorisation replaces the eigen-solve,
  and a square matrix with p ≥ {setting("small_p"):.0f} skips the Gram matrix: log det WᵀW = 2·log|det W| from
  its LU factors.
- Mid-size matrices (float64 copy ≤ {mib_of("worker_bytes")}) are scored on worker threads side by side, every BLAS
  and OpenMP pool held at one thread; larger ones alone with all threads; tiny ones in line.
- Matrices with p < {setting("small_p"):.0f} run on one BLAS thread wherever they run. The thread counts are set
  through OpenBLAS's own calls, found in `/proc/self/maps` (threadpoolctl's controller is the
  fallback elsewhere).
- The Marchenko–Pastur fits of matrices of one shape (an MoE layer's experts, a ResNet stage's
  convolutions; rows are held back, up to {setting("row_batch"):.0f}, to gather them) are made together from
  {setting("mp_batch_min"):.0f} spectra, with their KDE, σ grid and Nelder–Mead steps over the whole stack, each result
  the single fit's bit for bit (any decision the batch's rounding could change is retaken alone);
  `htmp`'s fits of one γ share their U grids.
- Tensors in flight and their float64 work stay within {setting("budget"):g}× the largest tensor met so far, or
  {mib_of("budget_floor_bytes")}.
- Each tensor is read when its turn comes. A thread that read the next large one while this one was
  scored gave {ahead_x} end to end even on a checkpoint streamed over HTTP (a loopback server,
  unthrottled and at {float(ahead["args"]["link_mb_s"]):.0f} MB/s; `benchmarks/results/read_ahead.json`, medians of
  {ahead["args"]["repeats"]}, load average {ahead_loads}), and was removed, with the benchmark that switched it off
  (the file's `script` says where it stays in the history).
- The progress callback ticks once per matrix as its spectrum is done (its total counts the
  matrices). On {ticks["checkpoint"]}, with the default metrics, the median tick falls at
  {ticks["median_tick_position_cold"]:.2f} of a fresh process's score ({ticks["median_tick_position_warm"]:.2f} once the imports made at first
  use are done; `benchmarks/bench_progress_ticks.py`, `benchmarks/results/progress_ticks.json`, load
  average {load_span(ticks["load_average_start"][:1] + ticks["load_average_end"][:1])}):
  after the last tick the MP fits of the held rows remain.

### The BLAS layer, measured

End to end, the default score with `wbfe/linalg/blas.py` against scipy.linalg's public wrappers
(`dsyrk`, `dpotrf`, `dgetrf`, `eigh(driver="evr")`, no two-stage solver) under threadpoolctl
(`benchmarks/bench_blas_layer.py`, run as `bench_fit_batching.py --with-blas-layer`,
`benchmarks/results/blas_layer.json`): fresh processes alternating, the median of each row's
rounds, the same numbers but for the two-stage solver's last digits (which scipy does not wrap; the
LLaMA-shaped matrices' eigenvalues come from it). The first three rows are the current figures (each
row says its run); the rows below them are the runs they replaced. On the 7B-shaped layer
({llama["matrices"]} matrices, one at a time: no worker runs beside another) the gain is the two-stage
solver's: scipy's wrappers with it kept are {x(llama, "two_stage_share")} faster than without it (rounds
{rounds(llama["two_stage_share"])}), and the rest of the layer gives {x(llama, "rest_of_blas_layer")}.

| case | matrices | speed-up, median | rounds | 1-minute load average | run |
|---|---|---|---|---|---|
{blas_rows}

Decision (`decision` in the file): {blas_file["decision"]}. The layer must earn
{blas_file["threshold"]:g}× on a case that uses it.

### Batched fits, measured

End to end (`benchmarks/bench_fit_batching.py`, `benchmarks/results/fit_batching.json`, fresh
processes alternating, median of {fits["args"]["repeats"]}, {fits["date"]}, a shared
{fits["cpu_count"]}-core machine at load average {fit_loads}), every fit one at a time against
batched: the default score of {thousands(moe["matrices"])} MoE experts of 256 × 1024 {x(moe)}, of which the MP
fit alone {x(moe, "mp_alone")} and the truncated power law alone {x(moe, "tpl_alone")}; `htmp` on one MoE
layer {x(fits["cases"]["moe_layer_htmp"])} and on a ResNet-56 {x(fits["cases"]["resnet56_htmp"])}.
Batched code that gained less than {fits["threshold"]:g}× on every case that used it was removed: the
truncated power law's lockstep Newton steps ({x(moe, "tpl_alone")} on the experts, {x(resnet, "tpl_alone")} on a
ResNet-56), the power-law scans of equal-length short spectra (only the ResNet's: {x(resnet, "pl_alone")})
and the batched eigen-solve of small equal-shaped matrices (ResNet-56: {x(resnet, "spectra_batch")}).
Rerun on tree {quiet["measured_tree"]} on a quiet machine ({quiet["date"]}, load average {quiet_loads},
median of {quiet["args"]["repeats"]}), what was kept still earns it: the default score of all
{thousands(quiet["cases"]["moe_experts"]["matrices"])} MoE experts {x(quiet["cases"]["moe_experts"])} (rounds
{rounds(quiet["cases"]["moe_experts"]["fits"])}), `htmp` on one MoE layer {x(quiet["cases"]["moe_layer_htmp"])} and on a
ResNet-56 {x(quiet["cases"]["resnet56_htmp"])}.
"""


def med(name: str) -> Cell:
    """A cell of median seconds of one timed call."""
    return lambda t: secs(t["median_seconds"][name])


def ratio(name: str) -> Cell:
    """A cell of one speed-up."""
    return lambda t: times(t[name])


def mb(n: float) -> str:
    """Bytes as MB with two decimals."""
    return f"{n / 1e6:.2f}"


def vs_ww_row(key: str, m: dict[str, Any]) -> str:
    limits = [m[t]["speedup_default_at_limit_vs_ww"] for t in THREADS]
    limit = f"> {FLOP_LIMIT_CAP}×" if min(limits) > FLOP_LIMIT_CAP else pair(m, ratio("speedup_default_at_limit_vs_ww"))
    ww_rss = max(m[t]["peak_rss_mb"]["ww"] for t in THREADS)
    wbfe_rss = span(m[t]["peak_rss_mb"]["default"] for t in THREADS)
    cells = [
        VS_WW_ROWS[key],
        pair(m, med("ww")) + " s",
        pair(m, med("default")) + " s",
        "**" + pair(m, ratio("speedup_default_vs_ww")) + "**",
        pair(m, ratio("speedup_bfe_only_vs_ww")),
        pair(m, med("htmp")) + " s",
        pair(m, ratio("speedup_vs_ww_same_metrics")),
        pair(m, ratio("speedup_default_at_solver_floor_vs_ww")),
        limit,
        f"{ww_rss:.0f} / {wbfe_rss} MB",
    ]
    return "| " + " | ".join(cells) + " |"


# The runs of bench_vs_weightwatcher.py that timed the CIFAR ResNets: file -> what the run was.
VS_WW_RUNS = {
    "vs_weightwatcher.json": "the full run above",
    "vs_weightwatcher_synthetic_cifar.json": "an earlier run of the synthetic model and the ResNets",
    "vs_weightwatcher_cifar.json": "a rerun of the ResNets alone, with the load recorded",
}


def run_load(run: dict[str, Any], model: dict[str, Any]) -> str:
    """The load average a vs-WeightWatcher run recorded for one model, or that it recorded none."""
    seen = [v for t in THREADS for v in model[t].get("load_average_1min", [])]
    return load_span(seen) if seen else "not recorded"


def run_rounds(model: dict[str, Any]) -> str:
    """The per-round default-vs-WW ratios of one model, one thread / two, or that none were kept."""
    if not all(model[t].get("round_speedup_default_vs_ww") for t in THREADS):
        return "not recorded"
    return " / ".join(span(model[t]["round_speedup_default_vs_ww"], "{:.1f}", "×") for t in THREADS)


def section_vs_ww_runs(results: Path) -> str:
    """The ResNets' default-vs-WW ratio in every run that measured it, with each run's conditions."""
    runs = {name: load(results, name) for name in VS_WW_RUNS if (results / name).exists()}
    rows = []
    for key in RESNETS:
        for name, run in runs.items():
            if key in run["models"]:
                m = run["models"][key]
                gemm = run["gemm_gflops_f64"]
                rows.append(f"| {VS_WW_ROWS[key]} | `{name}` ({run['date']}) | {pair(m, med('ww'))} s | "
                            f"{pair(m, med('default'))} s | **{pair(m, ratio('speedup_default_vs_ww'))}** | "
                            f"{run_rounds(m)} | {run['cpu_model']} | {gemm['threads_1']:.0f} / {gemm['threads_default']:.0f} | "
                            f"{run_load(run, m)} |")
    ww = [(run["models"][k][t]["median_seconds"]["ww"]) for k in RESNETS for t in THREADS
          for run in runs.values() if k in run["models"]]
    spread = [max(v) / min(v) - 1 for v in (
        [run["models"][k][t]["median_seconds"]["ww"] for run in runs.values() if k in run["models"]]
        for k in RESNETS for t in THREADS) if len(v) > 1]
    kinds = "; ".join(f"`{name}`: {what}" for name, what in VS_WW_RUNS.items() if name in runs)
    return f"""### The same ResNets in other runs

The ResNets were timed in {len(runs)} runs of the same benchmark ({kinds}). They disagree: the
same ResNet's WeightWatcher median differs up to {times(max(spread) + 1)} between runs
({span(ww, "{:.2f}", " s")} over all of them), with the machine, its GEMM rate and its load, and the
ratios with it. Each row is one run, all shown since none is the better measurement; the rounds column
is the range of each round's own ratio, one thread / two, where the run kept them:

| checkpoint | run | WW default | wbfe default | default vs WW default | rounds | processor | GEMM GFLOP/s | 1-minute load average |
|---|---|---|---|---|---|---|---|---|
{chr(10).join(rows)}
"""


def section_vs_ww(results: Path) -> str:
    data = load(results, "vs_weightwatcher.json")
    models = data["models"]
    gemm = data["gemm_gflops_f64"]
    rows = "\n".join(vs_ww_row(key, models[key]) for key in VS_WW_ROWS if key in models)
    large = [models[k] for k in LARGE if k in models]
    resnets = [models[k] for k in RESNETS if k in models]
    over_floor = span((1 / t["solver_floor_over_default"] - 1) * 100 for m in large for t in (m[x] for x in THREADS))
    floor = {k: pair(models[k], ratio("speedup_default_at_solver_floor_vs_ww")) for k in LARGE}
    limit_1 = {k: times(models[k]["threads_1"]["speedup_default_at_limit_vs_ww"]) for k in LARGE}
    same = span((t["speedup_vs_ww_same_metrics"] for m in models.values() for t in (m[x] for x in THREADS)))
    htmp_ratio = span((m[t]["speedup_with_htmp_vs_ww"] for m in resnets for t in THREADS), "{:.1f}", "×")
    htmp_secs = span((m[t]["median_seconds"]["htmp"] for m in resnets for t in THREADS), "{:.2f}", " s")
    htmp_adds = [(m[t]["median_seconds"]["htmp"] / m[t]["median_seconds"]["default"] - 1) * 100
                 for m in large for t in THREADS]
    htmp_adds_text = span([max(0.0, min(htmp_adds)), max(htmp_adds)], unit=" %")
    transformer_2 = models["transformer-108M"]["threads_default"]["speedup_default_vs_ww"]
    resnet_floor = span((m[t]["median_seconds"]["floor"] / m[t]["median_seconds"]["default"] * 100
                         for m in resnets for t in THREADS), unit=" %")
    htsr = load(results, "htsr_fits.json")["runs"]["after"]
    htsr_ms = span((r["htsr_total_ms"] for r in htsr["rows"]), "{:.1f}", " ms")
    mp_share = span((r["mp_fit_ms"] / r["htsr_total_ms"] * 100 for r in htsr["rows"]), unit=" %")
    mt = load(results, "metrics_time.json")
    mt_rows = ", ".join(f"{r['htsr_over_eig']:.2f}× at {thousands(r['shape'][0])} × {thousands(r['shape'][1])}"
                        for r in mt["rows"])
    htmp = load(results, "htmp_fit.json")["summary"]
    return f"""## The default score against WeightWatcher's default

`wbfe score` computes the `bfe` and `htsr` groups by default. `python
benchmarks/bench_vs_weightwatcher.py` (`benchmarks/results/vs_weightwatcher.json`) times, on the
same files, each in a fresh process, alternating, median of {data["repeats"]}, timing the analysis
call only: `wbfe.score(path)` (the default), the BFE-W-only path (`metrics="bfe"`), the default plus
`htmp`, and WeightWatcher 0.7.7's default `analyze()` (norms, ranks, entropy, the power-law fit) and
`analyze(mp_fit=True)`, which adds the Marchenko–Pastur fit and so computes what `htsr` does (less
the truncated power law, which wbfe adds), and wbfe's eigen-solve alone ("solver floor": the Gram
matrix and `dsyevr` of every matrix, the tensors already in memory, nothing else). Measured
{data["date"]} on a {data["cpu_count"]}-core {data["cpu_model"]}, float64 GEMM
{gemm["threads_1"]:.0f} GFLOP/s on one thread, {gemm["threads_default"]:.0f} on two (this run
recorded no load average); each cell is one BLAS thread / two:

| checkpoint | WW default | wbfe default | **default vs WW default** | BFE-W only vs WW default | wbfe with `htmp` | vs WW with `mp_fit` (same metrics) | the most the solver floor allows | the most the flop limit allows | peak RSS WW / wbfe |
|---|---|---|---|---|---|---|---|---|---|
{rows}

Compare ratios from one run only: the next table shows how far runs on these shared machines
differ.

{section_vs_ww_runs(results)}
### What the ratios are made of

On the synthetic model and the transformer the default is the eigen-solve: wbfe's time is
{over_floor} % above its solver floor, and WeightWatcher's time over that floor is
{floor["synthetic"]} (synthetic) and {floor["transformer-108M"]} (transformer). So no default,
however little it did besides, could be much faster than that against WeightWatcher there with this
exact solver (the transformer on two threads is {times(transformer_2)}). "The most the flop limit
allows" is the same bound from the flops instead (each Gram product as a rank-k update, p²P, and the
reduction to tridiagonal form, 4/3·p³, at the measured GEMM rate): {limit_1["synthetic"]} /
{limit_1["transformer-108M"]} (synthetic / transformer) on one thread. The floor is below it because
LAPACK's tridiagonal reduction runs below the GEMM rate: half its flops are symmetric
matrix–vector products bound by memory. On the ResNets (p ≤ 64) the eigen-solve is
{resnet_floor} of the default's time; the rest is the HT-SR fits and the reading and bookkeeping
around each matrix. The HT-SR group alone takes {htsr_ms} a matrix on one thread
(`benchmarks/bench_htsr_fits.py`, `benchmarks/results/htsr_fits.json`, spectra of
{span((r["n"] for r in htsr["rows"]), "{:,.0f}").replace("–", " to ")} eigenvalues, {htsr["time"]}), the
Marchenko–Pastur fit {mp_share} of it, and is made together for matrices of one shape (above); per
matrix of n × 2n, all its columns took {mt_rows} the time of its eigen-solve
(`benchmarks/bench_metrics.py`, `benchmarks/results/metrics_time.json`, one thread, best of
{mt["repeats"]}, {mt["date"]}, load average {load_span(mt["load_average_1min"])}). Neither the Marchenko–Pastur fit nor the truncated power law is in
WeightWatcher's default `analyze()`; computed the way WeightWatcher computes them (`mp_fit=True`),
the same metrics take it {same}× longer than wbfe.

### Why `htmp` is not in the default

The HTMP fit takes a median {htmp["median_seconds"] * 1000:.1f} ms of CPU for {thousands(htmp["n_eigenvalues"])}
eigenvalues ([below](#the-htmp-fit)), but it is per matrix whatever its size: with it the default
would be {htmp_ratio} WeightWatcher's speed on the ResNets ({htmp_secs}), while on the large models
it adds {htmp_adds_text}. And at λ* its diagnosis is nearly always "near optimum"
([watch.md](watch.md)). `--metrics bfe,htsr,htmp` adds it; `wbfe watch` asks for it itself.
"""


def section_eigensolvers(results: Path) -> str:
    data = load(results, "eigensolvers.json")
    rows = data["rows"]
    two_stage = ", ".join(
        (f"**{r['evr_over']['two_stage']:.2f}× at {thousands(r['p'])}**" if r["p"] >= data["two_stage_from_p"]
         else f"{r['evr_over']['two_stage']:.2f}× at {thousands(r['p'])}") for r in rows)
    others = span((r["evr_over"][k] for r in rows for k in ("evd", "ev")), "{:.2f}", "×")
    torch = span((r["evr_over"]["torch"] for r in rows), "{:.1f}", "×")
    worst = max(r["max_diff_over_lambda_max"]["two_stage"] for r in rows)
    sizes = ",".join(str(r["p"]) for r in rows)
    threads = "one thread" if data["threads"] == 1 else f"{data['threads']} threads"
    return f"""## Eigenvalues of large matrices

From p = {thousands(data["two_stage_from_p"])} the eigenvalues come from LAPACK's two-stage
tridiagonal reduction (`dsyevd_2stage`, eigenvalues only, called through the LAPACKE of the OpenBLAS
scipy ships, `wbfe/linalg/blas.py`), below from `dsyevr` as before. `python
benchmarks/bench_eigensolvers.py --sizes {sizes} --repeats {data["repeats"]}`
(`benchmarks/results/eigensolvers.json`), {threads}, time of `dsyevr` over each:
two-stage {two_stage} (7B-shaped matrices at 4,096); `dsyevd` and `dsyev` {others}, torch's
`eigvalsh` {torch}. In that run every two-stage eigenvalue was within {sci(worst)}·λ_max of
`dsyevr`'s; `tests/test_eigensolver.py` holds it to 1e-12·λ_max on 21 spectra.
"""


def section_llm(results: Path) -> str:
    data = load(results, "llm_scale.json")
    runs = data["runs"]
    lines = []
    for key, (checkpoint, metrics) in LLM_ROWS.items():
        r = runs[key]
        per = r["seconds_per_matrix"]
        per_text = f"{per * 1000:.1f} ms" if per < 1 else f"{per:.1f} s"
        lines.append(f"| {checkpoint} | {metrics} | {r['seconds']:.1f} s | "
                     f"{per_text} | {r['fraction_of_gemm_limit'] * 100:.0f} % | {r['peak_rss_mb']:.0f} MB |")
    ext = data["extrapolated_seconds"]
    llama, qwen = ext["llama7b_32_layers"], ext["qwen30b_a3b_experts_only"]
    dense = [runs["dense:bfe"]["fraction_of_gemm_limit"], runs["dense:bfe,htsr"]["fraction_of_gemm_limit"]]
    table = "\n".join(lines)
    loads = [data["load_average_start"][0], data["load_average_end"][0]]
    return f"""## LLM scale: what to expect on a CPU

`python benchmarks/bench_llm_scale.py` (`benchmarks/results/llm_scale.json`) generates a MoE
checkpoint of 27 layers × 128 experts × 3 bfloat16 matrices of 256 × 1024, each expert its own 2-D
tensor, one shard per layer ({thousands(data["moe_matrices"])} matrices), and one 7B-Llama
layer (q, k, v, o 4096²; gate, up, down 11008 × 4096), and scores each in a fresh process with two
threads (`htmp` on the first MoE layer's shard alone, its 384 experts fitted in batches). Measured
on a {data["cpu_count"]}-core {data["cpu_model"]} (float64 GEMM {data["gemm_gflops_f64_default_threads"]:.0f}
GFLOP/s on both cores), {data["date"][:10]}, load average {load_span(loads)}, with the batched HT-SR fits:

| checkpoint | metrics | time | per matrix | fraction of the GEMM limit | peak RSS |
|---|---|---|---|---|---|
{table}

Expected on this machine, extrapolated per matrix shape: a **7B** dense model (32 such layers; the
embedding and LM head add about one layer) **≈ {minutes(llama["bfe"])} for `bfe`, ≈
{minutes(llama["bfe,htsr"])} for the default**; a **30B-A3B** MoE (48 layers × 128 experts × 3
matrices of 768 × 2048, scaled from the measured experts by their float64 flops) **≈
{minutes(qwen["bfe"])} for `bfe`, ≈ {minutes(qwen["bfe,htsr"])} for the default** for the experts,
and `htmp` adds about {minutes(qwen["htmp_extra"])} (it is per matrix, not per flop). The dense
layers run at {span([d * 100 for d in dense], unit=" %")} of the flop limit (the rest is the
tridiagonal reduction, as above). For small experts the default adds
~{(runs["moe:bfe,htsr"]["seconds_per_matrix"] - runs["moe:bfe"]["seconds_per_matrix"]) * 1000:.1f} ms a
matrix to BFE-W alone (the eigen-solve in place of a Cholesky factor, and the HT-SR fits, now in
batches); those fits and the Python around each matrix are what is left between wbfe and the limit.
Peak RSS stays at {span(r["peak_rss_mb"] for r in runs.values())} MB whatever the model's size: the
interpreter and its libraries plus a few tensors.
"""


def section_memory(results: Path) -> str:
    m = load(results, "memory.json")
    mib = m["largest_tensor_bytes"] / 2**20
    return f"""## Memory

`python benchmarks/bench_memory.py --matrices {m["n_matrices"]}` (`benchmarks/results/memory.json`):
scoring a generated {m["checkpoint_bytes"] / 2**30:.0f} GiB safetensors file of {m["n_matrices"]}
float32 matrices ({mib:.0f} MiB each) peaks at **{m["peak_rss_mb"]:.0f} MB RSS** in
{m["wall_s"]:.1f} s, of which {m["baseline_rss_mb"]:.0f} MB is the same score of a one-matrix 64×64 checkpoint (the
interpreter and the libraries a score loads); the rest is {m["peak_minus_baseline_over_largest_tensor"]:.1f}× the
largest tensor (the tensor, its float64 blocks and the Gram matrix). The pipeline keeps what it has in flight
within {setting("budget"):g}× the largest tensor (or {mib_of("budget_floor_bytes")}), leaving the rest to what
scoring loads besides. A square bfloat16 matrix's float64 copy for its LU factors or Gram matrix is
four times its own size, so checkpoints whose largest tensor is one need more.
"""


def section_gpu(results: Path) -> str:
    recorded = sorted(p.name for p in results.glob("gpu*.json"))
    status = (f"Recorded GPU runs: {', '.join(f'`benchmarks/results/{n}`' for n in recorded)}." if recorded
              else "No GPU has been available to this project yet, so no GPU figure is recorded.")
    return f"""## On a GPU

A GPU path exists (`--device cuda`): each tensor crosses to the device once in its stored dtype
and is widened there, and the Gram matrix, Cholesky factor and eigen-solve are float64 on the
device. Its code runs on the CPU in the tests (every layer's BFE-W within 1e-8 of the numpy path,
for a whole score too), and the CUDA tests compare GPU and CPU numbers where a GPU is present.
`benchmarks/bench_gpu.py` scores a generated bfloat16 checkpoint on the GPU and,
in the same run, on the CPU, and reports GB of weights per second, the device's FP64 and
host-to-device rates, the fraction of that limit, and the largest BFE-W difference of any layer;
`bash benchmarks/gpu_check.sh` runs the CUDA tests and that benchmark in one go. {status}

## Threads

While it scores, wbfe sets the BLAS and OpenMP thread counts of its process (through
threadpoolctl, and `torch.set_num_threads`) and restores them when it is done: matrices are scored
side by side on one thread each, mid-size ones alone on one. Other numeric work running in the
same process at the same time runs with those counts; run it in another process, or set
`OPENBLAS_NUM_THREADS`/`OMP_NUM_THREADS`, which cap wbfe's workers too.
"""


def section_htmp(results: Path) -> str:
    data = load(results, "htmp_fit.json")
    s, b, rows = data["summary"], data["batch"], data["rows"]
    laws = {(r["kappa"], r["gamma"], r["beta"]) for r in rows}
    slowest = max(rows, key=lambda r: r["seconds"])
    fast = min((k for k in s if k.startswith("within_")), key=lambda k: float(k[len("within_"):-1]))
    fast_ms = float(fast[len("within_"):-1]) * 1000
    dkappa = "identical" if b["max_abs_dlog_kappa"] == 0 else f"within {sci(b['max_abs_dlog_kappa'])} in log κ"
    return f"""## The HTMP fit

`python benchmarks/bench_htmp_fit.py` (`benchmarks/results/htmp_fit.json`) fits
{thousands(s["n_eigenvalues"])} eigenvalues drawn from {len(laws)} laws (γ from
{span((r["gamma"] for r in rows), "{:g}").replace("–", " to ")}, κ from
{span((r["kappa"] for r in rows), "{:g}").replace("–", " to ")}), with the default τ and with τ = 0,
timed with {data["timer"]}: **median {s["median_seconds"] * 1000:.1f} ms CPU per fit**,
{s[fast]} of {s["fits"]} under {fast_ms:.0f} ms, slowest {slowest["seconds"] * 1000:.0f} ms (κ =
{slowest["kappa"]:g}, γ = {slowest["gamma"]:g}: nearly Marchenko–Pastur laws, where the profile is
flat and needs many knots per κ).

Many matrices of one shape are fitted together (`wbfe.htmp.fit_many`): {b["spectra"]} spectra of
{thousands(b["n_eigenvalues"])} eigenvalues took {b["batch_seconds_per_fit"] * 1000:.1f} ms per fit
in the batch against {b["single_seconds_per_fit"] * 1000:.1f} ms alone,
**{b["ratio_single_over_batch"]:.1f}×**, κ {dkappa} and log β within
{sci(b["max_abs_dlog_beta"])} of the single fits.
"""


def fused_moe_figures(text: str) -> dict[str, float]:
    """The `/usr/bin/time -v` figures of fused_moe_1b.txt: user CPU s, wall s, CPU %, peak RSS MB."""
    def field(label: str) -> str:
        found = re.search(rf"^\s*{re.escape(label)}:\s*(.+)$", text, flags=re.M)
        if found is None:
            raise ValueError(f"fused_moe_1b.txt has no '{label}' line")
        return found.group(1).strip()
    clock = [float(x) for x in field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")]
    wall = sum(v * 60 ** i for i, v in enumerate(reversed(clock)))
    return {"user_s": float(field("User time (seconds)")), "wall_s": wall,
            "cpu_percent": float(field("Percent of CPU this job got").rstrip("%")),
            "rss_mb": float(field("Maximum resident set size (kbytes)")) / 1000}


def section_formats(results: Path) -> str:
    moe = fused_moe_figures((results / "fused_moe_1b.txt").read_text(encoding="utf-8"))
    g = load(results, "gguf.json")
    q, f = g["gguf_q4_k"], g["safetensors_f16"]
    return f"""## Checkpoint families and formats

Scoring a generated Qwen3-MoE-style checkpoint (bf16, 1,728 expert matrices of
512×1,024, `benchmarks/fused_moe_checkpoint.py`) with `--metrics bfe` took {moe["user_s"]:.0f} s of
CPU ({moe["wall_s"]:.0f} s of wall time at {moe["cpu_percent"]:.0f} % of a shared CPU) and
{moe["rss_mb"]:.0f} MB peak RSS (`benchmarks/results/fused_moe_1b.txt`).

Scoring a generated {q["file_bytes"] / 1e9:.2f} GB Q4_K GGUF file ({g["weights"] / 1e9:.1f} B
weights in {g["matrices"]} matrices of {g["shape"][0]} × {thousands(g["shape"][1])}) with
`--metrics bfe` took {q["cpu_s"]:.0f} s of CPU and {q["peak_rss_mb"]:.0f} MB peak RSS, against
{f["cpu_s"]:.0f} s and {f["peak_rss_mb"]:.0f} MB for its {f["file_bytes"] / 1e9:.1f} GB float16
safetensors original; the difference is the dequantising (`benchmarks/bench_gguf.py`,
`benchmarks/results/gguf.json`; {g["cpu_count"]} CPUs shared with other work, so wall times of
{thousands(q["wall_s"])} s and {thousands(f["wall_s"])} s). The largest BFE-W difference between the
two was {sci(g["max_abs_delta_bfe"])}.
"""


def section_adapters_compare(results: Path) -> str:
    a = load(results, "adapter.json")
    c = load(results, "compare.json")
    core = a["adapter"]["wall_s"] - a["baseline"]["wall_s"]
    return f"""## Adapters and compare

**A LoRA adapter** (`python benchmarks/bench_adapter.py`, `benchmarks/results/adapter.json`,
{a["cpu_count"]} CPUs): a rank-{a["rank"]} adapter on a {thousands(a["shape"][0])}-wide model
(32 layers × q, k, v, o: {a["modules"]} modules, {a["adapter_bytes"] / 1e6:.0f} MB of factors) scores in
**{a["adapter"]["wall_s"]:.1f} s wall at {a["adapter"]["peak_rss_mb"]:.0f} MB peak RSS**, of which a
bare `import wbfe, torch` is {a["baseline"]["wall_s"]:.1f} s and {a["baseline"]["peak_rss_mb"]:.0f} MB:
{core:.1f} s for the {a["modules"]} modules and the file's hash. The dense route for one module (form
the {thousands(a["shape"][0])} × {thousands(a["shape"][1])} ΔW, then its eigenvalues as `wbfe score`
takes a dense matrix's) took {a["dense_seconds_per_module"]:.0f} s on that loaded machine:
{thousands(round(a["dense_seconds_all_modules_extrapolated"], -2))} s for all {a["modules"]}.

**`wbfe compare`** (`python benchmarks/bench_compare.py`, `benchmarks/results/compare.json`;
{c["cpu_count"]}-core machine shared with other jobs): two generated
{c["checkpoint_bytes_each"] / 1e9:.2f} GB float32 safetensors checkpoints (21 blocks of q, k, v, o
1,024² and up/down 1,024 × 4,096: {c["n_matrices"]} matrices), `wbfe compare A B --metrics bfe` took
**{c["compare"]["wall_s"]:.0f} s at {c["compare"]["peak_rss_mb"]:.0f} MB peak RSS** (a bare
`import wbfe, torch` is {c["baseline"]["peak_rss_mb"]:.0f} MB), against {c["score_a"]["wall_s"]:.1f} s
and {c["score_b"]["wall_s"]:.1f} s for `wbfe score --metrics bfe` of each alone in the same run
({c["compare_over_two_scores"]:.1f}× the two). Pairs run on the engine's pipeline as a score's
matrices do: small pairs in line, those whose float64 copy fits in {mib_of("worker_bytes")}
side by side on its worker threads, every BLAS pool held at one thread.
"""


def section_ray(results: Path) -> str:
    r = load(results, "ray.json")
    empty = span([r["ray_1_node"]["empty_task_s"] * 1000, r["ray_2_nodes"]["empty_task_s"] * 1000], "{:.0f}")
    return f"""## On a Ray cluster

`python benchmarks/bench_ray.py` (`benchmarks/results/ray.json`): {r["models"]} generated models of
{r["width"]}-wide matrices, `--metrics {r["metrics"]}` (machine: {r["machine"]}; {r["note"]}):
1 worker node {r["ray_1_node"]["wall_s"]:.2f} s, 2 worker nodes {r["ray_2_nodes"]["wall_s"]:.2f} s
(speed-up {r["speedup_2_vs_1_nodes"]:.2f}), local on one thread {r["local_sequential_s"]:.2f} s;
Ray's overhead {r["ray_overhead_per_task_s"] * 1000:.0f} ms per model task, {empty} ms for an empty
task.
"""


def section_report(results: Path) -> str:
    r = load(results, "report.json")
    b, a, pages = r["bench"], r["bench_all_groups"], r["pages"]
    return f"""## Audit pages

`python benchmarks/bench_report.py` (`benchmarks/results/report.json`) on a synthetic
{b["model"]["matrices"]}-matrix transformer-shaped model ({b["model"]["weights"] / 1e6:.1f} M
weights), on a {r["machine"]["cpus"]}-core machine (load {r["machine"]["load_average_1min"]}), median
of three: with the default groups the page is {mb(b["html_bytes"])} MB and making it after the score
(re-reading six matrices, drawing every figure, writing the file) took
{b["report_html_s"]["wall"]:.2f} s wall ({b["report_html_s"]["cpu"]:.2f} s CPU) against the score's
{b["score_s"]["wall"]:.2f} s; with `--metrics {",".join(a["metrics"])}` the page is
{mb(a["html_bytes"])} MB and took {a["report_html_s"]["wall"]:.2f} s against the score's
{a["score_s"]["wall"]:.2f} s. The pages of the CIFAR-10 ResNet-20, the MiniLM encoder and the
Fashion-MNIST zoo are {mb(pages["resnet20"]["html_bytes"])}, {mb(pages["minilm"]["html_bytes"])} and
{mb(pages["zoo-fmnist"]["html_bytes"])} MB (`--screenshots` saves the top of each as
`benchmarks/results/report-*.png`).
"""


def section_startup(results: Path) -> str:
    r = load(results, "startup.json")
    c = r["commands"]

    def cell(name: str) -> str:
        heavy = ", ".join(c[name]["heavy_modules"]) or "none"
        return f"| `{name}` | {c[name]['median_s']:.2f} s | {heavy} |"

    rows = "\n".join(cell(name) for name in c)
    gpt2 = r.get("gpt2_folder")
    if gpt2:
        rows += "".join(
            f"\n| `wbfe score` (a {gpt2['folder_kb']} KB GPT-2 folder, {label}) | {gpt2[key]['median_s']:.2f} s | "
            f"{', '.join(gpt2[key]['heavy_modules'])} |" for label, key in (("first", "first"), ("second", "second")))
    return f"""## Start-up

`python benchmarks/bench_startup.py` (`benchmarks/results/startup.json`): a fresh interpreter per
run, median of {next(iter(c.values()))["runs"]} ({r["machine"]["cpus"]} cores, other jobs running), with the
heavy packages each command had imported when it exited:

| command | median | heavy packages imported |
|---|---|---|
{rows}
| `python -c pass` | {r["interpreter_alone_median_s"]:.2f} s | - |
| `python -c "import torch"` | {r["import_torch_alone_median_s"]:.2f} s | torch |

A float safetensors, GGUF, Keras, ONNX, NumPy or Flax checkpoint is read into numpy arrays and
scored on the CPU without importing torch (`tests/test_torch_free.py` checks it per format); torch
is imported where it is needed: PyTorch pickles and TorchScript, float8 tensors (numpy
has no such dtypes), the quantised safetensors layouts (FP8, GPTQ, AWQ, MXFP4), CUDA (asked only where NVIDIA's driver is present), timm,
torchvision and `nn.Module` inputs, and the `vectors` group.
"""


def section_describe(results: Path) -> str:
    d = load(results, "describe.json")
    f = load(results, "framework.json")
    skeleton = f["llama_70b_meta_skeleton"]
    rows = "\n".join(
        f"| {label} | {d[key]['framework'] or 'none'} | {d[key]['describe_s_median']:.2f} s | "
        f"{d[key]['describe_cpu_s_median']:.2f} s | {d[key]['process_s_median']:.2f} s | "
        f"{'yes' if d[key]['transformers_imported'] else 'no'} |"
        for label, key in (("headers and `config.json`", "with_config"), ("headers alone", "without_config"),
                           ("the model class on the meta device", "framework_description")))
    return f"""## Describing a checkpoint

`python benchmarks/bench_describe.py` (`benchmarks/results/describe.json`): `wbfe describe` of a checkpoint of
{d["checkpoint"]} ({d["bytes"] / 1e9:.0f} GB, {d["matrices"]} matrices), read from the headers
alone, a fresh process each run, median of {d["runs"]} on {d["cpus"]} cores at load average
{load_span(d["load_average"][:1])}:

| description from | framework | describe | of it CPU | whole process | imports transformers |
|---|---|---|---|---|---|
{rows}

Building the model class itself on the meta device (`python benchmarks/bench_framework.py`,
`benchmarks/results/framework.json`, transformers {skeleton["transformers"]}, {f["machine"]["cpus"]}
cores): {skeleton["parameters"]} parameter tensors, median {skeleton["build_median_s"]:.2f} s a build once
transformers is imported ({skeleton["import_transformers_s"]:.1f} s), the first description in a
fresh process {skeleton["first_describe_s"]:.0f} s; a plain safetensors file without a config
imported {"neither transformers nor timm" if f["checks"]["plain_file_imports_no_framework"] else "a framework"}.
"""


def section_stream(results: Path) -> str:
    b = load(results, "bench_stream.json")
    runs = [b, *b.get("earlier_runs", [])]

    def row(run: dict[str, Any], label: str) -> str:
        t = run["throughput_mb_s"]
        per = run.get("throughput_mb_s_per_run")
        spread = (" / ".join(span(per[m], "{:,.0f}") for m in ("local", "stream")) if per else "not recorded")
        load_text = load_span(run["load_average_1min"]) if "load_average_1min" in run else "not recorded"
        growth = run["rss_growth_while_reading_mb"]
        return (f"| {label} | {run.get('date', 'not recorded')} | {t['local']:,.0f} / {t['stream']:,.0f} | {spread} | "
                f"{growth['local']:.0f} / {growth['stream']:.0f} MB | {load_text} |")

    rows = "\n".join(row(run, "this run" if i == 0 else "the run before" if i == 1 else "an earlier run")
                     for i, run in enumerate(runs))
    store = b.get("object_store")
    store_text = (f"\nThe same file as an object-store URI ({store['uri']}) read at {store['throughput_mb_s']:,.0f} "
                  f"MB/s in the run that measured it.\n" if store else "")
    c = b["checkpoint"]
    return f"""## Streamed reads

`python benchmarks/bench_stream.py` (`benchmarks/results/bench_stream.json`) writes a
{c["file_bytes"] / 1e6:.0f} MB float32 checkpoint ({c["tensors"]} matrices of {thousands(c["columns"])} columns),
serves it from a loopback HTTP server and reads every tensor once in a fresh process, from the
local file and streamed over HTTP range requests ({b["requests"]} requests, bytes fetched /
file size {b["bytes_fetched_over_file_size"]:.1f}), median of {b["runs"]} runs on {b["machine"]["cpus"]} cores. Loopback
measures the reader's own cost (requests, checks, copies), not a network's; throughput in MB/s,
local / streamed:

| run | date | throughput | each run's | resident set growth while reading | 1-minute load average |
|---|---|---|---|---|---|
{rows}
{store_text}"""


def section_revision(results: Path) -> str:
    rev = load(results, "revision.json")
    labels = {"resnet56": "ResNet-56", "moe": "MoE experts of 256 × 1024", "llama7b": "LLaMA-7B-shaped layer"}
    rows = "\n".join(
        f"| {labels[name]} | {thousands(case['matrices'])} | {case['variants']['base']['median_seconds']:.2f} s | "
        f"{case['variants']['head']['median_seconds']:.2f} s | {case['end_to_end_speedup']:.2f}× | "
        f"{span(case['per_round'], '{:.2f}', '×')} | {'yes' if case['same_numbers'] else 'no'} |"
        for name, case in rev["cases"].items())
    return f"""## Shorter code, the same speed

Code made shorter must not make a score slower. `benchmarks/bench_revision.py` scores the generated
checkpoints with this tree's `wbfe/` and with an earlier revision's (`git archive`), fresh processes
alternating, median of {rev["args"]["repeats"]} (`benchmarks/results/revision.json`, {rev["date"]}, load
average {load_span(rev["load_average_start"][:1])}; base {rev["base"][:10]}, head {rev["head"][:10]}):

| case | matrices | base | head | speed-up | rounds | same numbers |
|---|---|---|---|---|---|---|
{rows}
"""


def section_speed_paths(results: Path) -> str:
    sp = load(results, "speed_paths.json")
    labels = {"moe_experts": ("worker pool and thread pinning", "MoE experts of 256 × 1024", "no_workers"),
              "llama7b_layers": ("BFE-W from a Cholesky/LU factor's diagonal", "LLaMA-7B-shaped layer", "eig_bfe")}
    rows = "\n".join(
        f"| {labels[name][0]} (switch `{labels[name][2]}`) | {labels[name][1]}, {thousands(case['matrices'])} "
        f"matrices | `{case['metrics']}` | {case['variants']['shipped']['median_seconds']:.2f} s | "
        f"{case['variants'][labels[name][2]]['median_seconds']:.2f} s | {case['end_to_end_speedup']:.2f}× | "
        f"{span(case['per_round'], '{:.2f}', '×')} | {case['max_relative_difference_bfe']:.1e} | "
        f"{load_span(v for var in case['variants'].values() for v in var['load_average_1min'])} | {case['decision']} |"
        for name, case in sp["cases"].items())
    return f"""## Speed paths that move the last digits

Two paths exist for speed but, taken away, give a score whose last digits differ (another summation
order, eigenvalues in place of a factor's diagonal), so their A/B records the largest relative
difference of the `bfe` column from the shipped code's first run instead of asking for the same numbers.
`benchmarks/bench_speed_paths.py` (`benchmarks/results/speed_paths.json`, {sp["date"]}) scores each
case in fresh processes, shipped and without the path alternating, median of {sp["args"]["repeats"]}; a path
stays where it is at least {sp["threshold"]}× faster end to end. {sp["note"][0].upper() + sp["note"][1:]}.

| path | case | metrics | shipped | without it | speed-up | rounds | largest relative difference of `bfe` | 1-minute load average | decision |
|---|---|---|---|---|---|---|---|---|---|
{rows}
"""


def render(results: Path = RESULTS) -> str:
    """The whole page.

    Args:
        results: the folder of benchmark results to read.

    Returns:
        The Markdown text of docs/performance.md.

    Raises:
        FileNotFoundError: a results file is missing. KeyError: a file lacks a field the page uses.
    """
    head = """# Performance and memory

<!-- Generated by benchmarks/make_performance_doc.py from benchmarks/results/: edit the script, not
this file, then run `python benchmarks/make_performance_doc.py`. -->

How wbfe reads and scores a checkpoint, and what each benchmark measured. Every figure on this page
is read from its file in `benchmarks/results/` when the page is generated, with the conditions the
file recorded (date, load average, each round's own figure where it kept them); a measurement no
file keeps is not here. The machines are small shared ones (two cores, other jobs running), so
compare ratios within one run rather than times across runs.
"""
    sections = [section_flow, section_vs_ww, section_eigensolvers, section_htmp, section_llm, section_memory,
                section_formats, section_stream, section_adapters_compare, section_ray, section_report, section_gpu,
                section_startup, section_describe, section_revision, section_speed_paths]
    return "\n".join([head, *(make(results) for make in sections)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/performance.md is out of date")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    text = render(args.results)
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date: run python benchmarks/make_performance_doc.py", file=sys.stderr)
            return 1
        return 0
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
