"""Shared by bench_fit_batching.py, bench_blas_layer.py and bench_speed_paths.py: the three checkpoints
(generated, seeded, into a temporary folder) and an A/B driver that scores each in fresh processes, the
variants alternating, and reports medians, each round's ratio and the load average.

A variant is a set of switches the child applies by monkeypatching before it scores (see
``_CHILD``); the library itself has no switch. Each child times ``wbfe.score(path,
device="cpu")`` (the default metrics unless a case names others) and prints a digest of every
numeric column, so that the variants are seen to give the same numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import hashlib, json, sys, time
switches = set(filter(None, sys.argv[3].split(",")))
import wbfe, wbfe.metrics.htsr as htsr, wbfe.metrics.htmp as htmp, wbfe.metrics.powerlaw as pl, wbfe.metrics.mp as mp
import wbfe.engine.jobs as jobs, wbfe.linalg.spectra as spectra
counts = {}

def counted(module, name):
    inner = getattr(module, name)
    def wrapper(*a, **k):
        counts[name] = counts.get(name, 0) + 1
        return inner(*a, **k)
    setattr(module, name, wrapper)

# What the batched paths do when they batch (single-fit fallbacks inside them are not counted).
for module, name in ((pl, "_fit_scan_many"), (pl, "_tpl_objective_many"), (mp, "_fit_batch"),
                     (htmp, "fit_many"), (jobs, "spectra_batch")):
    if hasattr(module, name):
        counted(module, name)
# single_fits: every fit one at a time and no rows held back for batches; single_pl, single_tpl,
# single_mp: that one fit one at a time, the others still batched.
if switches & {"single_fits", "single_pl"}:
    htsr.fit_power_law_many = lambda samples, min_tail, ww_compatible: [
        pl.fit_power_law(s, min_tail=min_tail, ww_compatible=ww_compatible) for s in samples]
if switches & {"single_fits", "single_tpl"}:
    import wbfe.metrics.fingers as fingers
    htsr.fit_truncated_power_law_many = fingers.fit_truncated_power_law_many = lambda samples, xmins: [
        pl.fit_truncated_power_law(s, xmin=m) for s, m in zip(samples, xmins)]
if switches & {"single_fits", "single_mp"}:
    htsr.mp_fit_many = lambda spectra_, N, M: [mp.mp_fit(e, N, M) for e in spectra_]
if "single_fits" in switches:
    for group in (htsr.GROUP, htmp.GROUP):
        object.__setattr__(group, "compute_many", None)
if "single_spectra" in switches:  # every eigen-solve one matrix at a time
    jobs.batchable = lambda *a: False
if "scipy_blas" in switches:  # scipy.linalg's public wrappers and threadpoolctl in place of wbfe.linalg.blas
    import numpy as np, scipy.linalg, scipy.linalg.blas as sb, scipy.linalg.lapack as sl
    import wbfe.linalg.blas as blas

    def syrk_lower(c, a, *, trans):
        if a.size == 0 or c.size == 0:
            return
        out = sb.dsyrk(1.0, a, beta=1.0, c=c, trans=int(trans), lower=1, overwrite_c=1)
        if not np.shares_memory(out, c):
            c[...] = out

    def potrf_lower(g):
        out, info = sl.dpotrf(g, lower=1, clean=0, overwrite_a=1)
        if not np.shares_memory(out, g):
            g[...] = out
        return int(info)

    def getrf(a):
        lu, _, info = sl.dgetrf(a, overwrite_a=1)
        if not np.shares_memory(lu, a):
            a[...] = lu
        return int(info)

    blas.syrk_lower, blas.potrf_lower, blas.getrf = syrk_lower, potrf_lower, getrf
    blas.eigvalsh_lower = lambda g: np.asarray(scipy.linalg.eigh(
        g, lower=True, eigvals_only=True, driver="evr", overwrite_a=True, check_finite=False))
    if "keep_two_stage" not in switches:  # scipy has no public two-stage driver: dsyevr at every size
        blas.has_two_stage = lambda: False
    blas.controls_threads = lambda: False  # spectra then limits threads through threadpoolctl
if "no_workers" in switches:  # no worker pool: every matrix on the calling thread, with all BLAS threads
    import wbfe.engine.pipeline as pipeline
    pipeline.worker_count = lambda device: 1
if "eig_bfe" in switches:  # BFE-W from the eigenvalues even where no group needs them (no Cholesky/LU diagonal)
    planned = jobs.planned_spectrum
    jobs.planned_spectrum = lambda matrices, plan, device, *, need_eigs=True: planned(matrices, plan, device)
metrics = tuple(filter(None, sys.argv[2].split(","))) or None
start = time.perf_counter()
result = wbfe.score(sys.argv[1], metrics=metrics, device="cpu", **json.loads(sys.argv[4]))
seconds = time.perf_counter() - start
digest = hashlib.sha256()
for row in result.layers:
    digest.update(json.dumps({k: v for k, v in row.items() if isinstance(v, (int, float, str)) or v is None},
                             sort_keys=True, default=str).encode())
column = sys.argv[5] if len(sys.argv) > 5 else ""  # one column's values by layer, where asked for
print(json.dumps({"seconds": seconds, "matrices": len(result.layers), "skipped": len(result.skipped),
                  "digest": digest.hexdigest()[:16], "batched_calls": counts}
                 | ({"column": {row["name"]: row.get(column) for row in result.layers}} if column else {})))
"""


def score_once(path: Path, metrics: str, switches: str, options: Optional[dict[str, Any]] = None,
               root: Path = ROOT, column: str = "") -> dict[str, Any]:
    """One fresh process importing wbfe from ``root`` (this checkout, or another revision's): its ``wbfe.score``
    seconds, row count, column digest, batched calls (and ``column``'s value per layer, if named)."""
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = [sys.executable, "-c", _CHILD, str(path), metrics, switches, json.dumps(options or {})]
    out = subprocess.run(argv + ([column] if column else []), check=True, capture_output=True, text=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def resnet56(folder: Path) -> dict[str, Any]:
    """A CIFAR ResNet-56 (benchmarks/cifar_resnet), torch's initialisation, seed 0."""
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(ROOT))
    from benchmarks.cifar_resnet.models import build_resnet

    torch.manual_seed(0)
    model = build_resnet(56)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    return {"path": str(folder), "what": "CIFAR ResNet-56 (torch init, seed 0), float32, 57 matrices"}


def moe_experts(folder: Path, layers: int = 27, experts: int = 128) -> dict[str, Any]:
    """``layers`` × ``experts`` × 3 bfloat16 matrices of 256 × 1024 (gate, up 1024 × 256; down
    256 × 1024), each expert its own 2-D tensor, one shard per layer (as bench_llm_scale.py)."""
    import torch
    from safetensors.torch import save_file

    index = folder / "model.safetensors.index.json"
    what = {"path": str(folder), "what": f"{layers} layers x {experts} experts x 3 bfloat16 matrices of 256x1024 "
                                         f"({layers * experts * 3} matrices), per-expert tensors, one shard per layer"}
    if index.exists():  # written by an earlier run with these arguments (the folder name says which)
        return what
    folder.mkdir(parents=True, exist_ok=True)
    weight_map: dict[str, str] = {}
    for layer in range(layers):
        g = torch.Generator().manual_seed(layer)
        shard = {}
        for e in range(experts):
            p = f"model.layers.{layer}.mlp.experts.{e}."
            shard[p + "gate_proj.weight"] = (torch.randn(1024, 256, generator=g) * 0.02).to(torch.bfloat16)
            shard[p + "up_proj.weight"] = (torch.randn(1024, 256, generator=g) * 0.02).to(torch.bfloat16)
            shard[p + "down_proj.weight"] = (torch.randn(256, 1024, generator=g) * 0.02).to(torch.bfloat16)
        name = f"model-{layer + 1:05d}-of-{layers:05d}.safetensors"
        save_file(shard, str(folder / name))
        weight_map.update(dict.fromkeys(shard, name))
    index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))  # last: marks the folder finished
    return what


LLAMA_MATRICES = ("q", "k", "v", "o", "gate", "up", "down")


def llama7b_layers(folder: Path, layers: int = 2, matrices: tuple[str, ...] = LLAMA_MATRICES) -> dict[str, Any]:
    """``layers`` decoder layers of LLaMA-7B's shapes in bfloat16: q, k, v, o 4096², gate, up
    11008 × 4096, down 4096 × 11008 (of those, ``matrices``)."""
    import torch
    from safetensors.torch import save_file

    what = {"path": str(folder), "what": f"{layers} LLaMA-7B-shaped decoder layer(s), bfloat16, matrices "
                                         f"{','.join(matrices)} of each ({len(matrices) * layers} matrices; the "
                                         "whole 32-layer stack would take an hour a run on this shared machine)"}
    if (folder / "model.safetensors").exists():
        return what
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for layer in range(layers):
        p = f"model.layers.{layer}."
        shapes = {"q": (4096, 4096), "k": (4096, 4096), "v": (4096, 4096), "o": (4096, 4096),
                  "gate": (11008, 4096), "up": (11008, 4096), "down": (4096, 11008)}
        for short in matrices:
            name = f"self_attn.{short}_proj" if short in "qkvo" else f"mlp.{short}_proj"
            tensors[p + name + ".weight"] = (torch.randn(*shapes[short], generator=g) * 0.02).to(torch.bfloat16)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors.part"))
    os.replace(folder / "model.safetensors.part", folder / "model.safetensors")
    return what


def case_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every A/B benchmark over these generated checkpoints takes: rounds and the cases' sizes."""
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--moe-layers", type=int, default=27)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--dense-layers", type=int, default=2)


def alternate(path: Path, metrics: str, variants: dict[str, str], repeats: int,
              log: Callable[[str], None] = print, options: Optional[dict[str, Any]] = None,
              roots: Optional[dict[str, Path]] = None, column: str = "") -> dict[str, Any]:
    """Score ``path`` ``repeats`` rounds, each round every variant once (the first variant is the
    baseline, the others' order rotates), and the medians, per-round ratios against the baseline
    and whether every run's numbers agree. ``roots`` names the checkout a variant imports wbfe from
    (default: this one). With ``column`` (a numeric column, e.g. "bfe"), also the largest relative
    difference of its values from the baseline's first run, over every run of every variant."""
    names = list(variants)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            run = score_once(path, metrics, variants[name], options, (roots or {}).get(name, ROOT), column)
            run["load_average_1min"] = round(os.getloadavg()[0], 2)
            runs[name].append(run)
            log(f"  round {r + 1} {name}: {run['seconds']:.2f} s (load {run['load_average_1min']})")
    base = names[0]
    out: dict[str, Any] = {"metrics": metrics or "default (bfe,htsr)", "options": options or {},
                           "matrices": runs[base][0]["matrices"],
                           "skipped": runs[base][0]["skipped"], "variants": {}}
    for name in names:
        secs = [x["seconds"] for x in runs[name]]
        out["variants"][name] = {
            "switches": variants[name] or "none (as shipped)",
            "seconds": [round(s, 3) for s in secs], "median_seconds": round(statistics.median(secs), 3),
            "load_average_1min": [x["load_average_1min"] for x in runs[name]],
            "batched_calls": runs[name][0]["batched_calls"],
            "digests": sorted({x["digest"] for x in runs[name]}),
        }
    out["same_numbers"] = len({d for v in out["variants"].values() for d in v["digests"]}) == 1
    if column:
        reference = runs[base][0]["column"]
        for name in names:
            out["variants"][name][f"max_relative_difference_{column}"] = max(
                relative_difference(run["column"], reference) for run in runs[name])
        out[f"max_relative_difference_{column}"] = max(
            v[f"max_relative_difference_{column}"] for v in out["variants"].values())
    return out


def relative_difference(values: dict[str, Any], reference: dict[str, Any]) -> float:
    """The largest |a − b| / |b| over the layers of two runs (layer sets must match; equal values,
    infinities and NaNs included, count 0; an unequal pair with b = 0 counts inf)."""
    if values.keys() != reference.keys():
        raise ValueError("the runs scored different layers")
    worst = 0.0
    for name, b in reference.items():
        a = values[name]
        if a == b or (a is None and b is None) or (a != a and b != b):
            continue
        if a is None or b is None:
            return float("inf")
        worst = max(worst, abs(a - b) / abs(b) if b else float("inf"))
    return worst


def ratio(case: dict[str, Any], slow: str, fast: str) -> dict[str, Any]:
    """``slow``'s time over ``fast``'s: of the medians, and round by round."""
    s, f = case["variants"][slow]["seconds"], case["variants"][fast]["seconds"]
    return {"end_to_end_speedup": round(statistics.median(s) / statistics.median(f), 3),
            "per_round": [round(a / b, 3) for a, b in zip(s, f)]}


def header() -> dict[str, Any]:
    return {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "cpu_count": os.cpu_count(),
            "load_average_start": [round(x, 2) for x in os.getloadavg()], "python": sys.version.split()[0]}

