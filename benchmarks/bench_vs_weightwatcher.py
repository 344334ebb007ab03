"""wbfe against WeightWatcher 0.7.7 on the same checkpoints: time, peak RSS, fraction of the machine's limit.

For each model, runs alternately (A B A B ...) in fresh processes, timing only the analysis call:
  - default: ``wbfe.score(path)``, the default metric groups (what ``wbfe score`` computes)
  - htmp  : ``wbfe.score(path, metrics=("bfe", "htsr", "htmp"))`` (adds the HTMP fit)
  - wbfe  : ``wbfe.score(path, metrics=("bfe", "htsr"))``  (norms, ranks, entropy, PL + TPL + MP fits)
  - bfe   : ``wbfe.score(path, metrics="bfe")``           (the BFE-W-only path)
  - ww    : ``WeightWatcher().analyze(model=folder, randomize=False, plot=False)`` (its default:
            norms, ranks, entropy, PL fit; no MP fit)
  - ww_mp : the same with ``mp_fit=True``, which adds bulk_max / num_spikes / mp_softrank: the
            same metric set as ``wbfe`` but the truncated power law (once per setting: it is slow)
  - floor : no scoring: wbfe's eigen-solve alone (float64 Gram matrix, dsyevr) of every matrix it
            scores, already in memory; with several threads the better of one matrix at a time on
            all of them and one matrix per thread. WW's time over it is the most a default run
            could reach with this exact solver on this machine.
with one BLAS thread and with the default thread count. Also measures the float64 GEMM rate at
each thread setting and, per checkpoint, the time the unavoidable linear algebra would take at that
rate (see ``limit_flops``): the fraction of that limit each wbfe path achieves.

    python benchmarks/bench_vs_weightwatcher.py [--repeats 3] [--models synthetic,cifar,transformer]

Results: benchmarks/results/vs_weightwatcher.json (and printed); a run of some models only writes
vs_weightwatcher_<models>.json beside it unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "vs_weightwatcher.json"
# ../shared beside the main checkout; from a worktree under /work/wt/NAME it is two levels up.
CIFAR = next((base / "shared" / "zoo" / "cifar10-resnet" for base in (ROOT.parent, ROOT.parent.parent)
              if (base / "shared" / "zoo" / "cifar10-resnet").is_dir()), ROOT.parent / "shared" / "zoo" / "cifar10-resnet")
ALL_MODELS = "synthetic,cifar,transformer"
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

_CHILD = r"""
import json, re, sys, time, logging
tool, path = sys.argv[1], sys.argv[2]
mp_fit = tool == "ww_mp"
if tool.startswith("ww"):
    import weightwatcher as ww
    logging.disable(logging.WARNING)
    start = time.perf_counter()
    details = ww.WeightWatcher().analyze(model=path, randomize=False, plot=False, mp_fit=mp_fit)
    n = len(details)
elif tool == "floor":
    # The eigen-solve alone: wbfe's spectra stage (float64 Gram matrix, LAPACK's dsyevr through
    # wbfe.linalg.blas) on every matrix wbfe scores, the tensors already in memory; no reading, hashing,
    # fits or rows. With several BLAS threads, the better of one matrix at a time on all of them and
    # one matrix per thread, largest first.
    import torch
    from concurrent.futures import ThreadPoolExecutor
    from wbfe.engine.matrices import MatrixPlan, as_matrices, plan_matrix
    from wbfe.engine.pipeline import worker_count
    from wbfe.sources import open_source
    from wbfe.linalg.spectra import eigenvalues, pin_threads
    cpu = torch.device("cpu")
    groups = []
    with open_source(path) as source:
        for entry in source.entries():
            plan = plan_matrix(entry.name, entry.shape, entry.dtype)
            if isinstance(plan, MatrixPlan):
                groups.append(as_matrices(entry.load(), plan))
    groups.sort(key=lambda ms: -len(ms) * min(ms[0].shape) ** 2 * max(ms[0].shape))
    eigenvalues(groups[-1], cpu)  # a floor: BLAS's and wbfe.linalg.blas's one-time set-up off the clock
    start = time.perf_counter()
    for ms in groups:
        eigenvalues(ms, cpu)
    elapsed = time.perf_counter() - start
    threads = worker_count(cpu)  # the workers wbfe's own pipeline would use
    if threads > 1:
        with pin_threads(), ThreadPoolExecutor(threads) as pool:
            start = time.perf_counter()
            list(pool.map(lambda ms: eigenvalues(ms, cpu), groups))
            elapsed = min(elapsed, time.perf_counter() - start)
    n = len(groups)
else:
    # imported before the clock, as `import weightwatcher` imports its whole stack
    import torch, scipy.linalg, scipy.optimize, scipy.special, wbfe, wbfe.scoring, wbfe.metrics.htsr
    import wbfe.metrics.htmp
    metrics = {"wbfe": ("bfe", "htsr"), "bfe": ("bfe",), "default": None, "htmp": ("bfe", "htsr", "htmp")}[tool]
    start = time.perf_counter()
    n = len(wbfe.score(path, metrics=metrics, device="cpu").layers)
elapsed = time.perf_counter() - start
hwm = int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1))
print(json.dumps({"seconds": elapsed, "peak_rss_mb": hwm / 1024, "layers": n}))
"""


def _thread_env(threads: int | None) -> dict[str, str]:
    env = dict(os.environ)
    for var in THREAD_VARS:
        if threads is None:
            env.pop(var, None)
        else:
            env[var] = str(threads)
    return env


def _run(tool: str, folder: Path, threads: int | None) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, tool, str(folder)], env=_thread_env(threads), check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _save(folder: Path, tensors: dict) -> Path:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def build_models(tmp: Path, names: list[str]) -> dict[str, Path]:
    import torch

    g = torch.Generator().manual_seed(0)
    models: dict[str, Path] = {}
    if "synthetic" in names:
        tensors = {"conv.weight": torch.randn(64, 64, 3, 3, generator=g) / 24}
        for i in range(3):
            tensors[f"fc{i}.weight"] = torch.randn(1024, 1024, generator=g) / 32
        for i in range(2):
            tensors[f"up{i}.weight"] = torch.randn(2048, 512, generator=g) / 23
        models["synthetic"] = _save(tmp / "synthetic", tensors)
    if "cifar" in names and CIFAR.is_dir():
        for depth in (20, 32, 44, 56):
            folder = tmp / f"resnet{depth}"
            folder.mkdir()
            (folder / "model.safetensors").symlink_to(CIFAR / f"resnet{depth}.safetensors")
            models[f"cifar-resnet{depth}"] = folder
    if "transformer" in names:
        hidden, layers, vocab = 768, 12, 30522
        tensors = {"embeddings.word_embeddings.weight": torch.randn(vocab, hidden, generator=g) * 0.02}
        for i in range(layers):
            p = f"encoder.layer.{i}."
            tensors[p + "attention.qkv.weight"] = torch.randn(3 * hidden, hidden, generator=g) * 0.02
            tensors[p + "attention.out.weight"] = torch.randn(hidden, hidden, generator=g) * 0.02
            tensors[p + "mlp.fc1.weight"] = torch.randn(4 * hidden, hidden, generator=g) * 0.02
            tensors[p + "mlp.fc2.weight"] = torch.randn(hidden, 4 * hidden, generator=g) * 0.02
        models["transformer-108M"] = _save(tmp / "transformer", tensors)
    return models


_GEMM_CHILD = r"""
import time, numpy as np
a = np.random.default_rng(0).standard_normal((2048, 2048))
a @ a  # warm-up
best = min((lambda s: (a @ a, time.perf_counter() - s)[1])(time.perf_counter()) for _ in range(5))
print(2 * 2048**3 / best / 1e9)
"""


def gemm_gflops(threads: int | None) -> float:
    """Sustained float64 GEMM rate of a fresh process with this many BLAS threads (None: the default)."""
    out = subprocess.run([sys.executable, "-c", _GEMM_CHILD], env=_thread_env(threads), check=True,
                         capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def limit_flops(folder: Path) -> dict[str, float]:
    """Flops of the linear algebra each path cannot avoid, per matrix of p <= P:

    - ``eig`` (any metric that needs the spectrum): the Gram product as a symmetric rank-k update,
      p²·P, plus the reduction to tridiagonal form, 4/3·p³ (the eigenvalues of a tridiagonal
      matrix are O(p²));
    - ``bfe`` (BFE-W alone): p²·P + p³/3 for the Gram product and its Cholesky factor, or 2/3·p³
      for the LU factors of a square matrix with p >= 256 (what wbfe does on the CPU).
    """

    from wbfe.engine.matrices import MatrixPlan, plan_matrix
    from wbfe.linalg.spectra import resolve_device, uses_lu
    from wbfe.sources import open_source

    eig = bfe = 0.0
    with open_source(folder) as source:
        for entry in source.entries():
            plan = plan_matrix(entry.name, entry.shape, entry.dtype)
            if isinstance(plan, MatrixPlan):
                p, big = min(plan.rows, plan.cols), max(plan.rows, plan.cols)
                eig += plan.n_slices * (p * p * big + (4 / 3) * p**3)
                lu = uses_lu(plan.rows, plan.cols, resolve_device("cpu"))
                bfe += plan.n_slices * ((2 / 3) * p**3 if lu else p * p * big + p**3 / 3)
    return {"eig": eig, "bfe": bfe}


def cpu_model() -> str:
    """The processor's name as the kernel reports it (GEMM rates differ 1.7x between the
    machines this benchmark has run on, and the ratios with them)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    if "model name" not in fields:
        import platform

        return platform.processor() or "unknown"
    # A virtual machine may report only a vendor's name; family and model tell the generation.
    return f"{fields['model name']} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default=ALL_MODELS)
    parser.add_argument("--tools", default="ww,default,wbfe,bfe,htmp,floor,ww_mp",
                        help="which runs (ww_mp, once per setting, is slow: 12-70 s a model)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"results file (default {RESULTS.name}; with a subset of --models, one named after it)")
    args = parser.parse_args()
    # A run of some models only never replaces the full run's figures.
    out = args.out or (RESULTS if args.models == ALL_MODELS else
                       RESULTS.with_name(f"{RESULTS.stem}_{args.models.replace(',', '_')}.json"))
    gflops = {1: gemm_gflops(1), None: gemm_gflops(None)}
    report: dict = {"date": time.strftime("%Y-%m-%d"), "cpu_model": cpu_model(), "cpu_count": os.cpu_count(),
                    "gemm_gflops_f64": {"threads_1": round(gflops[1], 2), "threads_default": round(gflops[None], 2)},
                    "repeats": args.repeats, "load_average_start": [round(x, 2) for x in os.getloadavg()],
                    "models": {}}
    with tempfile.TemporaryDirectory(prefix="wbfe-bench-") as tmp:
        models = build_models(Path(tmp), args.models.split(","))
        for name, folder in models.items():
            flops = limit_flops(folder)
            entry: dict = {"checkpoint_bytes": (folder / "model.safetensors").stat().st_size,
                           "limit_gflop": {k: round(v / 1e9, 3) for k, v in flops.items()}}
            for threads in (1, None):
                load_before = os.getloadavg()[0]
                wanted = args.tools.split(",")
                runs: dict[str, list[dict]] = {t: [] for t in wanted}
                for i in range(args.repeats):
                    tools = [t for t in wanted if t != "ww_mp" or i == 0]
                    for tool in tools:  # alternate so drift hits all alike
                        runs[tool].append(_run(tool, folder, threads))
                med = {t: statistics.median(r["seconds"] for r in rs) for t, rs in runs.items()}
                limit = {k: v / (gflops[threads] * 1e9) for k, v in flops.items()}
                key = "threads_1" if threads == 1 else "threads_default"
                ratio = lambda a, b: round(med[a] / med[b], 2) if a in med and b in med else None  # noqa: E731
                # The noise of this setting: the machine's load over it, and each round's own ratio.
                rounds = ([round(w["seconds"] / d["seconds"], 2) for w, d in zip(runs["ww"], runs["default"])]
                          if "ww" in runs and "default" in runs else None)
                entry[key] = {
                    "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                    "round_speedup_default_vs_ww": rounds,
                    "median_seconds": {t: round(v, 4) for t, v in med.items()},
                    "speedup_default_vs_ww": ratio("ww", "default"),
                    "speedup_with_htmp_vs_ww": ratio("ww", "htmp"),
                    "speedup_vs_ww": ratio("ww", "wbfe"),
                    "speedup_bfe_only_vs_ww": ratio("ww", "bfe"),
                    "speedup_vs_ww_same_metrics": ratio("ww_mp", "wbfe"),
                    "speedup_bfe_only_vs_ww_same_metrics": ratio("ww_mp", "bfe"),
                    "peak_rss_mb": {t: round(max(r["peak_rss_mb"] for r in rs), 1) for t, rs in runs.items()},
                    "layers": {t: rs[0]["layers"] for t, rs in runs.items()},
                    "limit_seconds": {k: round(v, 4) for k, v in limit.items()},
                    "fraction_of_limit_wbfe": round(limit["eig"] / med["wbfe"], 3) if "wbfe" in med else None,
                    "fraction_of_limit_bfe_only": round(limit["bfe"] / med["bfe"], 3) if "bfe" in med else None,
                    # The most the BFE-only path could reach against WW's default on this machine:
                    # its unavoidable flops at the GEMM rate, against WW's time.
                    "speedup_bfe_only_at_limit_vs_ww": round(med["ww"] / limit["bfe"], 2) if "ww" in med else None,
                    # ... and the same for the default groups, which need every eigenvalue: above 5 here,
                    # the 5x is within reach of an exact float64 solver at all.
                    "speedup_default_at_limit_vs_ww": round(med["ww"] / limit["eig"], 2) if "ww" in med else None,
                    # ... and against the exact solver's own time on this machine (tool "floor"): what
                    # the default groups could reach if everything but the eigen-solve were free.
                    "speedup_default_at_solver_floor_vs_ww": ratio("ww", "floor"),
                    "solver_floor_over_default": ratio("floor", "default"),
                }
            report["models"][name] = entry
            print(name, json.dumps(entry), flush=True)
    report["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
