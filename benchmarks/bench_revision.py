"""End-to-end time of the default ``wbfe score`` at this checkout against another revision's, on the
generated checkpoints of ``_score_ab`` (a ResNet-56, MoE experts, LLaMA-7B-shaped layers).

Run:  python benchmarks/bench_revision.py --base REV [--cases resnet56,moe[,llama7b]] [--repeats 3]
      (writes benchmarks/results/revision.json)

A change that only makes the code shorter must not make it slower: the base revision's ``wbfe/`` is
exported with ``git archive`` into a temporary folder, and each round scores every case once with
each tree in a fresh process, the two alternating; the numbers of both must agree (column digests).
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is a folder, not a package
from benchmarks._score_ab import (  # noqa: E402
    ROOT, alternate, case_arguments, header, llama7b_layers, moe_experts, ratio, resnet56)

OUT = Path(__file__).resolve().parent / "results" / "revision.json"


def export(rev: str, into: Path) -> str:
    """``rev``'s ``wbfe/`` under ``into``; its full commit id."""
    commit = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT, check=True,
                            capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "archive", "--format=tar", commit, "wbfe"], cwd=ROOT, check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return commit


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    case_arguments(parser)
    parser.set_defaults(moe_layers=2, dense_layers=1)
    parser.add_argument("--base", required=True, help="the revision to compare against (a commit, tag or branch)")
    parser.add_argument("--cases", default="resnet56,moe", help="of resnet56, moe, llama7b (a 7B layer: minutes a run)")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/wbfe-ab-cases"))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "wbfe"], cwd=ROOT, check=True, capture_output=True,
                                text=True).stdout.strip())
    builders = {"resnet56": lambda: resnet56(args.work_dir / "resnet56"),
                "moe": lambda: moe_experts(args.work_dir / f"moe-{args.moe_layers}x{args.experts}", args.moe_layers,
                                           args.experts),
                "llama7b": lambda: llama7b_layers(args.work_dir / f"llama-{args.dense_layers}", args.dense_layers)}
    unknown = set(args.cases.split(",")) - builders.keys()
    if unknown:
        parser.error(f"unknown case(s) {sorted(unknown)}; choose from {sorted(builders)}")
    with tempfile.TemporaryDirectory() as tmp:
        base_commit = export(args.base, Path(tmp))
        report = header() | {"args": {k: str(v) for k, v in vars(args).items()}, "base": base_commit, "head": head,
                             "head_has_uncommitted_changes": dirty, "cases": {}}
        for name in args.cases.split(","):
            info = builders[name]()
            print(f"{name}: {info['what']}", flush=True)
            case = {"checkpoint": info["what"]} | alternate(Path(info["path"]), "", {"base": "", "head": ""},
                                                            args.repeats, roots={"base": Path(tmp)})
            case.update(ratio(case, "base", "head"))
            report["cases"][name] = case
            print(json.dumps({k: case[k] for k in ("end_to_end_speedup", "same_numbers")}), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
