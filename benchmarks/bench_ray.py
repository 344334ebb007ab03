"""`wbfe rank --executor ray` on a generated zoo: wall time with 1 and with 2 local Ray worker
nodes (``ray.cluster_utils.Cluster``, a head with no CPU for tasks and 1-CPU worker nodes), the
speed-up, and Ray's own overhead per task.

Peers measured in the same run: the local sequential ranking of the same zoo (``executor="local"``,
BLAS and torch held at one thread, as a 1-CPU Ray task is)
and a round of empty Ray tasks (what Ray itself costs per task on this machine). Each Ray
configuration is warmed up once (its worker processes import torch and wbfe) before the timed run;
no cache is used, so every model is scored every time. Cluster start-up is reported, not timed in.

    python benchmarks/bench_ray.py [--models 8 --width 2048 --repeat 1]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS = Path(__file__).parent / "results" / "ray.json"


def _timed_rank(spec: Path, executor: str) -> float:
    from wbfe.ranking import rank

    start = time.perf_counter()
    rank(spec, executor=executor, cache_dir=False, metrics="bfe,htsr", n_boot=200, n_perm=200,  # type: ignore[arg-type]
         exact_max_n=0)  # the statistics (driver-side, the same for every executor) kept small
    return time.perf_counter() - start


def _local_one_thread(spec: Path, repeat: int) -> float:
    """The local ranking on one thread (as one Ray task gets one CPU): the per-task comparison."""
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            return min(_timed_rank(spec, "local") for _ in range(repeat + 1))
    finally:
        torch.set_num_threads(before)


def _empty_task_overhead(ray: object, n: int = 40) -> float:
    import ray as ray_mod

    @ray_mod.remote(num_cpus=1)
    def nothing() -> None:
        return None

    ray_mod.get([nothing.remote() for _ in range(4)])  # warm
    start = time.perf_counter()
    ray_mod.get([nothing.remote() for _ in range(n)])
    return (time.perf_counter() - start) / n


def on_cluster(spec: Path, nodes: int, repeat: int) -> dict[str, float]:
    import ray
    from ray.cluster_utils import Cluster

    t0 = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for _ in range(nodes):
        cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, logging_level=logging.ERROR)
    cluster.wait_for_nodes()
    startup = time.perf_counter() - t0
    try:
        _timed_rank(spec, "ray")  # warm-up: worker processes import torch and wbfe
        wall = min(_timed_rank(spec, "ray") for _ in range(repeat))
        empty = _empty_task_overhead(ray)
    finally:
        ray.shutdown()
        cluster.shutdown()
    return {"nodes": nodes, "cluster_startup_s": round(startup, 2), "wall_s": round(wall, 3),
            "empty_task_s": round(empty, 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=8)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    from tests.ray_zoo import make_zoo

    with tempfile.TemporaryDirectory() as tmp:
        spec = make_zoo(Path(tmp) / "zoo", args.models, width=args.width)
        local = _local_one_thread(spec, args.repeat)
        one = on_cluster(spec, 1, args.repeat)
        two = on_cluster(spec, 2, args.repeat)
    n = args.models
    result = {
        "benchmark": "wbfe rank --executor ray, generated zoo",
        "models": n, "width": args.width, "metrics": "bfe,htsr",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}, python {platform.python_version()}",
        "note": "shared machine: other processes were running while measured",
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "local_sequential_s": round(local, 3),
        "ray_1_node": one,
        "ray_2_nodes": two,
        "speedup_2_vs_1_nodes": round(one["wall_s"] / two["wall_s"], 2),
        "ray_overhead_per_task_s": round((one["wall_s"] - local) / n, 3),
        "local_per_model_s": round(local / n, 3),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
