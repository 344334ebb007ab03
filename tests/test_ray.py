"""``--executor ray`` on one local Ray instance (the fast test; the multi-node ones are in
tests/test_ray_cluster.py, marked slow)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterator

import pytest

from tests.ray_zoo import make_sharded, make_zoo, without_run_details
from wbfe.errors import InvalidOptionError
from wbfe.executors import ExecutorOptions
from wbfe.ranking import rank

ray = pytest.importorskip("ray")


WORKER_CACHE = "wbfe-cache-of-the-ray-workers"


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:  # the workers inherit it: their object copies go there
        mp.setenv("WBFE_CACHE_DIR", str(tmp_path_factory.mktemp(WORKER_CACHE)))
        ray.init(num_cpus=1, include_dashboard=False, logging_level=logging.WARNING)
    yield
    ray.shutdown()


@pytest.mark.parametrize("executor, address, message", [
    ("dask", None, "executor must be 'local' or 'ray'"),
    ("local", "auto", "--address needs --executor ray"),
    ("ray", "http://x", "Ray address must be auto"),
])
def test_executor_options_are_checked_first(executor: str, address: str, message: str) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        ExecutorOptions(executor, address)  # type: ignore[arg-type]


def test_workers_are_refused_under_ray() -> None:
    with pytest.raises(InvalidOptionError, match="^--workers is for the local executor; under Ray every model is its own"):
        ExecutorOptions("ray", workers=2)
    assert ExecutorOptions("local", workers=2).workers == 2


def test_an_address_where_nothing_listens_is_refused_at_once() -> None:
    import socket
    import time

    from wbfe.executors.ray_cluster import check_reachable

    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(InvalidOptionError, match=f"no Ray cluster answers at ray://127.0.0.1:{port}"):
        check_reachable(f"ray://127.0.0.1:{port}")
    assert time.monotonic() - start < 5
    with socket.socket() as server:  # and one where something does
        server.bind(("127.0.0.1", 0))
        server.listen()
        check_reachable(f"127.0.0.1:{server.getsockname()[1]}")


def test_missing_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from wbfe.errors import MissingDependencyError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(MissingDependencyError, match=r"pip install 'wbfe\[ray\]'"):
        ExecutorOptions("ray")


def test_tasks_still_running_are_cancelled_when_the_caller_stops_on_a_refusal() -> None:
    """A part's refusal raised by the caller of ``run_tasks`` (score_on_ray) cancels the parts still running on the
    cluster at once, as an interrupt does; a run that goes to the end cancels nothing."""
    from types import SimpleNamespace

    from wbfe.executors.ray_cluster import run_tasks

    cancelled: list[str] = []
    submitted: list[dict[str, object]] = []

    def submit(**options: object) -> SimpleNamespace:
        submitted.append(options)
        return SimpleNamespace(remote=lambda *args: options["name"])

    fake = SimpleNamespace(remote=lambda fn: SimpleNamespace(options=submit),
                           wait=lambda refs, num_returns: (refs[:1], refs[1:]),
                           cancel=lambda ref, force: cancelled.append(ref))
    tasks = [(f"part-{k}", "cpu", 10, ()) for k in range(3)]
    with pytest.raises(ValueError, match="refused"):
        for k, ref in run_tasks(fake, print, 2, tasks):
            assert (k, ref) == (0, "part-0")
            raise ValueError("refused")
    assert cancelled == ["part-1", "part-2"]
    assert submitted[0] == {"max_retries": 2, "retry_exceptions": [OSError, MemoryError, ConnectionError, TimeoutError],
                            "name": "part-0", "num_cpus": 1, "memory": 240}
    cancelled.clear()
    assert list(run_tasks(fake, print, 2, tasks)) == [(0, "part-0"), (1, "part-1"), (2, "part-2")]
    assert cancelled == []


def test_task_resources_come_from_the_device_and_the_largest_tensor(tmp_path: Path) -> None:
    from wbfe.executors.ray_cluster import task_resources
    from wbfe.executors.ray_score import largest_tensor_elements

    spec = make_zoo(tmp_path / "zoo", 1, width=48)
    largest = largest_tensor_elements(str(spec.parent / "m0.safetensors"))
    assert largest == 48 * 48  # l1.weight, the largest of 48x48, 24x48, 10x24 and a bias
    assert largest_tensor_elements(str(spec.parent)) == 48 * 48
    assert largest_tensor_elements("org/model") is None
    assert task_resources("cuda", largest) == {"num_cpus": 1, "num_gpus": 1, "memory": 48 * 48 * 24}
    assert task_resources("cpu", None) == {"num_cpus": 1}


def test_rank_on_ray_equals_local_and_caches_each_model(tmp_path: Path, local_ray: None) -> None:
    spec = make_zoo(tmp_path / "zoo", 4, unusable=True)
    kw = dict(metrics="bfe,htsr", n_boot=200, n_perm=200)
    local = rank(spec, cache_dir=tmp_path / "local-cache", **kw)  # type: ignore[arg-type]
    lines: list[str] = []
    on_ray = rank(spec, executor="ray", cache_dir=tmp_path / "ray-cache", progress=lines.append, **kw)  # type: ignore[arg-type]
    assert without_run_details(on_ray.to_dict()) == without_run_details(local.to_dict())
    assert on_ray.options["executor"] == "ray" and "executor" not in local.options
    # The checkpoint wbfe refuses is a failed model with wbfe's reason (the same text as locally),
    # not retried, and its progress line names the node it failed on.
    assert [f.model for f in on_ray.failed] == ["broken"]
    assert on_ray.failed[0].reason.startswith("NoUsableMatrixError")
    node = ray.get_runtime_context().get_node_id()[:12]
    assert any(line.startswith("[5/5] broken: failed on node " + node) for line in lines), lines
    assert sum("by Ray" in line for line in lines) == 5
    # Every scored model went into the cache: the re-run tries only the broken one, which fails again; n_scored is
    # documented as models scored in this run, so it is 0 (was 1, which counted the failure).
    again = rank(spec, executor="ray", cache_dir=tmp_path / "ray-cache", **kw)  # type: ignore[arg-type]
    assert (again.n_cached, again.n_scored) == (4, 0)
    assert without_run_details(again.to_dict()) == without_run_details(local.to_dict())


def test_sharded_score_on_ray_equals_local(tmp_path: Path, local_ray: None) -> None:
    import wbfe

    folder = make_sharded(tmp_path / "sharded")
    local = wbfe.score(folder).to_dict()
    seen: list[tuple[int, object, str]] = []
    on_ray = wbfe.score(folder, executor="ray", progress=lambda d, t, line: seen.append((d, t, line))).to_dict()
    assert on_ray["model"].pop("executor") == "ray"
    assert on_ray == local
    # The cross-shard ties were resolved on the driver, named after the first copy (shard 1).
    tied = [s for s in local["skipped"] if s["reason"].startswith("tied")]
    assert [s["reason"] for s in tied] == ["tied: identical to model.layers.0.self_attn.q_proj.weight"] * 2
    assert len(seen) == 3 and all(t == 3 and "by Ray" in line for _, t, line in seen)
    total = sum(p.stat().st_size - 8 - int.from_bytes(p.read_bytes()[:8], "little")
                for p in folder.glob("*.safetensors"))  # the tensor bytes: file less its header
    assert 1024 <= total < 2**20  # the progress line's sizes in KiB, as `wbfe cache` prints them
    assert seen[-1][2].endswith(f"3/3 parts by Ray, {total / 1024:.1f} KiB of {total / 1024:.1f} KiB, "
                                f"all done in {seen[-1][2].rsplit(' in ', 1)[1]}"), seen
    # One file split into groups of tensors (here one tensor per task): the same result again.
    from wbfe.executors.ray_score import plan_parts, score_on_ray
    from wbfe.scoring import score_here
    from wbfe.options import ScoreOptions

    single = make_zoo(tmp_path / "zoo", 1).parent / "m0.safetensors"
    assert [len(p.names) for p in plan_parts(single, part_bytes=1)] == [1, 1, 1, 1]  # type: ignore[union-attr]
    split = score_on_ray(single, ScoreOptions(), ExecutorOptions("ray"), score_here, part_bytes=1).to_dict()
    split["model"].pop("executor")
    assert split == wbfe.score(single).to_dict()
    # A format that is not split (a torch pickle) is scored whole by one task: the same result.
    import torch

    torch.save({"a.weight": torch.randn(30, 20, generator=torch.Generator().manual_seed(3))}, tmp_path / "p.pt")
    whole = wbfe.score(tmp_path / "p.pt", executor="ray").to_dict()
    assert whole["model"].pop("executor") == "ray"
    assert whole == wbfe.score(tmp_path / "p.pt").to_dict()


def test_a_zoo_of_file_uris_ranks_on_ray_exactly_as_the_local_zoo(tmp_path: Path, local_ray: None,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Each Ray task copies its URI into the object cache on its node (memory:// is per process, so
    # file:// stands in for s3:// here); the driver keys the score cache on the store's metadata
    # and downloads nothing.
    pytest.importorskip("fsspec")
    monkeypatch.setenv("WBFE_CACHE_DIR", str(tmp_path / "objects-home"))
    spec = make_zoo(tmp_path / "zoo", 3)
    rows = spec.read_text().splitlines()
    uri_spec = tmp_path / "uris.csv"
    uri_spec.write_text("\n".join([rows[0]] + [
        f"{m},{(spec.parent / ckpt).as_uri()},{q}" for m, ckpt, q in (r.split(",") for r in rows[1:])]) + "\n")
    kw = dict(metrics="bfe,htsr", n_boot=200, n_perm=200)
    local = without_run_details(rank(spec, cache_dir=False, **kw).to_dict())  # type: ignore[arg-type]
    on_ray = without_run_details(rank(uri_spec, executor="ray", cache_dir=tmp_path / "c", **kw).to_dict())  # type: ignore[arg-type]
    assert [m["ref"] for m in on_ray["models"]] == [(spec.parent / f"m{k}.safetensors").as_uri() for k in range(3)]
    for out in (local, on_ray):
        out["models"] = [{k: v for k, v in m.items() if k != "ref"} for m in out["models"]]
        out.pop("zoo", None)
    assert on_ray == local
    assert not (tmp_path / "objects-home" / "objects").exists()
    worker_cache = Path(ray.get(ray.remote(lambda: __import__("os").environ["WBFE_CACHE_DIR"]).remote()))
    assert worker_cache.name.startswith(WORKER_CACHE)
    assert sorted(p.name for p in (worker_cache / "objects").rglob("*.safetensors")) == [f"m{k}.safetensors" for k in range(3)]
    # `wbfe score URI --executor ray`: the URI is scored whole by one task, which fetches it.
    import wbfe

    sharded = make_sharded(tmp_path / "sharded")
    whole = wbfe.score(sharded.as_uri(), executor="ray").to_dict()
    assert whole["model"].pop("executor") == "ray" and whole["model"]["source"] == sharded.as_uri()
    local_score = wbfe.score(sharded).to_dict()
    for out in (whole, local_score):
        out["model"] = {k: v for k, v in out["model"].items() if k not in ("source", "files")}
    assert whole == local_score


def test_small_experts_score_on_ray_exactly_as_locally(tmp_path: Path, local_ray: None) -> None:
    """A fused stack of small experts is eigen-solved in batches; a Ray task runs the same loop as a
    local score, so its numbers equal the local ones bit for bit (not only to rounding)."""
    import wbfe
    from tests.test_experts import _common, _experts, _fused, _save
    from wbfe.executors.ray_score import score_on_ray
    from wbfe.scoring import score_here
    from wbfe.options import ScoreOptions

    folder = _save(tmp_path / "moe", _common() | _fused(_experts(), "qwen"), "qwen3_moe")
    options = ScoreOptions(metrics=("bfe", "htsr"))
    on_ray = score_on_ray(folder, options, ExecutorOptions("ray"), score_here).to_dict()
    on_ray["model"].pop("executor")
    assert on_ray == wbfe.score(folder, options=options).to_dict()


def test_intra_and_conv_fft_on_ray_equal_local(tmp_path: Path, local_ray: None) -> None:
    """The options travel whole: --conv fft is scored per part as locally; an --intra run, whose
    products may straddle two parts, is scored by one task, with every product row."""
    import torch
    from safetensors.torch import save_file

    from wbfe.executors.ray_score import score_on_ray
    from wbfe.options import ScoreOptions
    from wbfe.scoring import score_here

    g = torch.Generator().manual_seed(4)
    path = tmp_path / "m.safetensors"
    save_file({"a.weight": torch.randn(40, 30, generator=g), "b.weight": torch.randn(20, 40, generator=g),
               "c.weight": torch.randn(24, 20, generator=g), "d.weight": torch.randn(8, 6, 3, 3, generator=g)}, str(path))
    for options in (ScoreOptions(intra=True, seed=2), ScoreOptions(conv="fft"), ScoreOptions(intra=True, conv="fft")):
        split = score_on_ray(path, options, ExecutorOptions("ray"), score_here, part_bytes=1).to_dict()
        assert split["model"].pop("executor") == "ray"
        assert split == score_here(path, options).to_dict()
    assert [row["name"] for row in split["layers"] if row["role"] == "intra"] == ["a.weight X b.weight",
                                                                                 "b.weight X c.weight"]


def test_a_folder_is_sized_and_split_by_the_files_a_local_score_reads(tmp_path: Path) -> None:
    """model.safetensors beside stray shards: a local score reads model.safetensors alone, so its tensors are
    the parts and its largest tensor sizes a task's memory (every *.safetensors of the folder was counted)."""
    import torch
    from safetensors.torch import save_file

    from wbfe.executors.ray_score import largest_tensor_elements, plan_parts

    folder = tmp_path / "m"
    folder.mkdir()
    save_file({"a.weight": torch.ones(8, 6), "b.weight": torch.ones(4, 8)}, str(folder / "model.safetensors"))
    save_file({"big.weight": torch.ones(64, 64)}, str(folder / "model-00001-of-00002.safetensors"))
    assert largest_tensor_elements(folder) == 48
    assert [(p.names, p.largest) for p in plan_parts(folder)] == [(("a.weight", "b.weight"), 48)]  # type: ignore[union-attr]


def test_a_file_re_saved_between_two_parts_is_refused_never_mixed(tmp_path: Path, local_ray: None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The parts read the file pinned when the driver planned them, as a local score reads the file pinned when
    it read its header: re-saved in place after the first part (same names and size, other values), the second
    part refuses it (each part had read the file as it found it: a score mixed from two versions)."""
    from safetensors.torch import load_file, save_file

    from wbfe.errors import CorruptCheckpointError
    from wbfe.executors import ray_score
    from wbfe.options import ScoreOptions
    from wbfe.scoring import score_here

    path = make_zoo(tmp_path / "zoo", 1).parent / "m0.safetensors"
    real = ray_score.run_tasks

    def one_after_another(ray_: object, fn: object, retries: int, calls: object) -> Iterator[tuple[int, object]]:
        for k, call in enumerate(list(calls)):  # type: ignore[call-overload]
            for _, ref in real(ray_, fn, retries, [call]):  # type: ignore[arg-type]
                yield k, ref
            save_file({name: t * 2 for name, t in load_file(str(path)).items()}, str(path))

    monkeypatch.setattr(ray_score, "run_tasks", one_after_another)
    with pytest.raises(CorruptCheckpointError, match=r"m0\.safetensors: changed while being read"):
        ray_score.score_on_ray(path, ScoreOptions(), ExecutorOptions("ray"), score_here, part_bytes=1)


def test_a_refusal_that_is_an_oserror_is_a_failed_model_never_retried(local_ray: None) -> None:
    """SourceNotFoundError (a 404, a missing object) is an OSError too: a model's task returns it as its failure,
    as every refusal, instead of raising it for Ray to rerun (three more tries of a verdict); a plain OSError is
    still raised for Ray to retry elsewhere."""
    from wbfe.errors import RemoteReadError
    from wbfe.executors.ray_executor import _run_task

    def refused() -> None:
        raise RemoteReadError("http://host/m.safetensors: not found (HTTP 404)")

    def flaky() -> None:
        raise ConnectionResetError("reset by peer")

    answer = _run_task(refused, ())
    assert answer["error"] == "RemoteReadError: http://host/m.safetensors: not found (HTTP 404)"
    with pytest.raises(ConnectionResetError):
        _run_task(flaky, ())
