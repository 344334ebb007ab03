"""``--executor ray`` on a real two-node Ray cluster on this machine (``ray.cluster_utils.Cluster``:
a head and a worker node of one CPU each), torn down at the end. Slow: starting the nodes alone
takes tens of seconds on a loaded machine."""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from tests.ray_zoo import make_sharded, make_zoo, without_run_details
from wbfe.ranking import rank

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

KW: dict[str, Any] = dict(metrics="bfe,htsr", n_boot=200, n_perm=200)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1)
    ray.init(address=c.address, logging_level=logging.WARNING)
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


def _worker(c: Any) -> Any:
    return next(iter(c.worker_nodes))


def slow_scorer(delay: float, marks: Path) -> Callable[[str, Any], Any]:
    """wbfe's scorer, ``delay`` seconds slower, leaving a file in ``marks`` per task started
    (``*.start``) and one per task finished."""
    def scorer(ref: str, options: Any) -> Any:
        import time
        import uuid

        import ray

        from wbfe.ranking.ranker import _score_with_wbfe

        mark = f"{Path(ref).stem}.{ray.get_runtime_context().get_node_id()}.{uuid.uuid4().hex}"
        (marks / f"{mark}.start").touch()
        out = _score_with_wbfe(ref, options)
        time.sleep(delay)
        (marks / f"{mark}.end").touch()
        return out
    return scorer


def _nodes(lines: list[str]) -> set[str]:
    return {m.group(1) for line in lines if (m := re.search(r" on node (\w+) ", line))}


def test_zoo_and_shards_on_two_nodes_equal_local(tmp_path: Path, cluster: Any) -> None:
    spec = make_zoo(tmp_path / "zoo", 8)
    local = rank(spec, cache_dir=False, **KW)
    lines: list[str] = []
    on_ray = rank(spec, executor="ray", cache_dir=tmp_path / "cache", progress=lines.append,
                  scorer=slow_scorer(0.5, tmp_path), **KW)
    assert without_run_details(on_ray.to_dict()) == without_run_details(local.to_dict())
    assert len(_nodes(lines)) == 2, lines  # both nodes scored models

    import wbfe

    folder = make_sharded(tmp_path / "sharded", 4)
    lines.clear()
    sharded = wbfe.score(folder, executor="ray", progress=lambda _d, _t, line: lines.append(line)).to_dict()
    sharded["model"].pop("executor")
    assert sharded == wbfe.score(folder).to_dict()
    assert len(lines) == 4


def test_killing_a_worker_node_still_gives_the_full_result(tmp_path: Path, cluster: Any) -> None:
    spec = make_zoo(tmp_path / "zoo", 6)
    local = rank(spec, cache_dir=False, **KW)
    killed: list[str] = []
    worker = _worker(cluster)

    def kill_while_it_scores() -> None:
        # As soon as the worker node has started a model (and not finished it), the node goes.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for start in tmp_path.glob(f"*.{worker.node_id}.*.start"):
                if not start.with_name(start.name.replace(".start", ".end")).exists():
                    cluster.remove_node(worker)
                    killed.append(start.name)
                    return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_while_it_scores, daemon=True)
    killer.start()
    on_ray = rank(spec, executor="ray", cache_dir=tmp_path / "cache", scorer=slow_scorer(2.0, tmp_path), **KW)
    killer.join()
    assert killed, (worker.node_id, sorted(p.name for p in tmp_path.iterdir()))
    assert without_run_details(on_ray.to_dict()) == without_run_details(local.to_dict())
    assert on_ray.failed == []
    # The task running on the killed node was started again on the head: 7 starts, 6 models.
    assert len(list(tmp_path.glob("*.start"))) == 7
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()


def test_interrupted_driver_resumes_from_the_cache(tmp_path: Path, cluster: Any) -> None:
    spec = make_zoo(tmp_path / "zoo", 6)
    local = rank(spec, cache_dir=False, **KW)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    scored: list[str] = []

    def interrupt_after_two(line: str) -> None:
        if "by Ray" in line:
            scored.append(line)
            if len(scored) == 2:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rank(spec, executor="ray", cache_dir=tmp_path / "cache", progress=interrupt_after_two,
             scorer=slow_scorer(1.0, first), **KW)
    entries = list((tmp_path / "cache" / "entries").rglob("*.json"))
    assert len(entries) == 2
    again = rank(spec, executor="ray", cache_dir=tmp_path / "cache", scorer=slow_scorer(0.0, second), **KW)
    assert (again.n_cached, again.n_scored) == (2, 4)
    assert len(list(second.glob("*.end"))) == 4  # only the four models left ran
    assert without_run_details(again.to_dict()) == without_run_details(local.to_dict())
