"""The scoring pipeline's threads: read-ahead, matrices scored on workers side by side, stream order."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import wbfe
from wbfe.engine import jobs, pipeline
from wbfe.linalg import spectra


def _checkpoint(path: Path) -> Path:
    g = torch.Generator().manual_seed(12)
    tensors = {
        "a.weight": torch.randn(300, 600, generator=g),   # a worker's (300²·600 flops >= 2^24)
        "b.weight": torch.randn(40, 50, generator=g),     # scored in line: too small to hand off
        "c.bias": torch.randn(300, generator=g),          # skipped: not a matrix
        "d.weight": torch.randn(256, 256, generator=g),   # a worker's LU
        "e.weight": torch.zeros(300, 600),                # degenerate: skipped with its reason
        "f.weight": torch.randn(700, 400, generator=g).to(torch.bfloat16),
        "g.weight": torch.randn(64, 32, 3, 3, generator=g),
    }
    save_file(tensors, str(path))
    return path


@pytest.mark.parametrize("metrics", ["bfe", "bfe,htsr"])
def test_workers_give_the_sequential_scores_in_stream_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             metrics: str) -> None:
    path = _checkpoint(tmp_path / "m.safetensors")
    monkeypatch.setattr(pipeline, "worker_count", lambda device: 1)
    stored: list[str] = []
    one = wbfe.score(path, metrics=metrics, device="cpu", progress=lambda done, total, name: done and stored.append(name))
    monkeypatch.setattr(pipeline, "worker_count", lambda device: 2)
    threads: dict[tuple[int, ...], str] = {}

    def spectrum(matrices: list, device: torch.device, **kw: bool) -> object:
        threads[tuple(matrices[0].shape)] = threading.current_thread().name
        return spectra.spectrum(matrices, device, **kw)

    monkeypatch.setattr(jobs, "spectrum", spectrum)
    seen: list[str] = []
    two = wbfe.score(path, metrics=metrics, device="cpu", progress=lambda done, total, name: done and seen.append(name))
    assert threads[(300, 600)].startswith("wbfe-score") and threads[(256, 256)].startswith("wbfe-score")
    assert threads[(40, 50)] == "MainThread"
    again = wbfe.score(path, metrics=metrics, device="cpu")
    assert seen == stored and sorted(seen) == ["a.weight", "b.weight", "d.weight", "e.weight", "f.weight",
                                               "g.weight"]  # matrices: no tick for the bias
    assert [x["name"] for x in two.layers] == [x["name"] for x in one.layers] == [
        n for n in stored if n not in ("c.bias", "e.weight")]
    assert two.skipped == one.skipped and sorted(s["name"] for s in two.skipped) == ["c.bias", "e.weight"]
    for x, y, z in zip(one.layers, two.layers, again.layers):
        assert y["bfe"] == pytest.approx(x["bfe"], rel=1e-12)  # one BLAS thread against the default
        assert y["bfe"] == z["bfe"]  # the same input, the same output


def _mkl_threads() -> int:
    """MKL's thread count inside torch (threadpoolctl cannot see it, so wbfe sets it through torch)."""
    found = re.search(r"mkl_get_max_threads\(\) : (\d+)", torch.__config__.parallel_info())
    return int(found.group(1)) if found else torch.get_num_threads()


def test_pinned_threads_are_restored_and_nest() -> None:
    from threadpoolctl import threadpool_info, threadpool_limits

    def openblas() -> set[int]:
        return {i["num_threads"] for i in threadpool_info() if i["internal_api"] == "openblas"}

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with threadpool_limits(2, user_api="blas"):
            with spectra.pin_threads():
                assert torch.get_num_threads() == 1 and _mkl_threads() == 1 and openblas() == {1}
                with spectra.pin_threads():  # nested: a no-op, not a second restore
                    assert torch.get_num_threads() == 1
                assert torch.get_num_threads() == 1 and openblas() == {1}
            assert torch.get_num_threads() == 2 and _mkl_threads() == 2 and openblas() == {2}
    finally:
        torch.set_num_threads(before)


def test_finished_does_not_wait_for_a_running_job_unless_asked() -> None:
    from wbfe.engine.matrices import plan_matrix
    from wbfe.sources import TensorEntry

    e = TensorEntry(name="x.weight", shape=(300, 600), dtype="float32", load=lambda: None)
    release = threading.Event()
    with pipeline.Pipeline(torch.device("cpu"), workers=2) as p:
        p.compute(e, plan_matrix(e.name, e.shape, e.dtype), job=lambda: release.wait(10) and "done")
        assert list(p.finished()) == []  # still running: nothing yet, and no wait
        release.set()
        assert [outcome for _, _, outcome in p.finished(wait=True)] == ["done"]


def test_a_worker_error_reaches_the_caller_in_order() -> None:
    from wbfe.engine.matrices import plan_matrix
    from wbfe.sources import TensorEntry

    def entry(name: str) -> tuple[TensorEntry, object]:
        e = TensorEntry(name=name, shape=(300, 600), dtype="float32", load=lambda: None)
        return e, plan_matrix(name, e.shape, e.dtype)

    def fail() -> None:
        raise OSError("disk gone")

    with pipeline.Pipeline(torch.device("cpu"), workers=2) as p:
        first, second = entry("x.weight"), entry("y.weight")
        p.compute(*first, job=lambda: "first")
        p.compute(*second, job=fail)
        done = p.finished(wait=True)
        assert next(done)[2] == "first"
        with pytest.raises(OSError, match="disk gone"):
            next(done)


def test_worker_count_follows_the_environment_and_the_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    from wbfe import _config

    monkeypatch.setattr(_config, "usable_cpus", lambda: 6)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)
    assert pipeline.worker_count(cpu) == 6
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert pipeline.worker_count(cpu) == 4
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")  # OpenBLAS's own variable comes first
    assert pipeline.worker_count(cpu) == 2
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "16")  # never more workers than CPUs
    assert pipeline.worker_count(cpu) == 6
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "lots")  # not a count: the next variable decides
    assert pipeline.worker_count(cpu) == 4
    assert pipeline.worker_count(torch.device("meta")) == 1  # any device but the CPU: one at a time


def test_no_thread_controller_where_blas_has_one_thread_anyway(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    mid = torch.zeros(128, 400)  # a mid-size matrix: one BLAS thread
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    built: list[int] = []
    monkeypatch.setattr(spectra, "_thread_controller", lambda: built.append(1))
    assert isinstance(spectra._threads_for(mid, torch.device("cpu")), contextlib.nullcontext) and not built
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    from wbfe import _config

    monkeypatch.setattr(_config, "usable_cpus", lambda: 1)  # one CPU: BLAS has one thread too
    assert isinstance(spectra._threads_for(mid, torch.device("cpu")), contextlib.nullcontext) and not built
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert isinstance(spectra._threads_for(mid, torch.device("cpu")), contextlib.nullcontext) and not built
    monkeypatch.setattr(_config, "usable_cpus", lambda: 2)
    monkeypatch.delenv("OPENBLAS_NUM_THREADS")
    # BLAS may use two threads now: a matrix with p < 256 (a ResNet's 3x3 convolution too) gets one,
    # every OpenBLAS of the process as threadpoolctl sees them, and the count is restored after;
    # found without building threadpoolctl's controller (~10 ms, most of a small model's score).
    from threadpoolctl import threadpool_info, threadpool_limits

    with threadpool_limits(2, user_api="blas"):
        for matrix in (mid, torch.zeros(64, 576)):
            with spectra._threads_for(matrix, torch.device("cpu")):
                inside = {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["internal_api"] == "openblas"}
            after = {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["internal_api"] == "openblas"}
            assert inside and set(inside.values()) == {1}, inside
            assert set(after.values()) == {2}, after
        assert isinstance(spectra._threads_for(torch.zeros(256, 300), torch.device("cpu")), contextlib.nullcontext)
    assert not built


def test_progress_counts_matrices_up_front_and_moves_per_spectrum(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A safetensors checkpoint's entries are listed from its header before any is scored, so the
    first call already has the total, which counts the matrices (not the biases); each matrix's
    call comes as its spectrum is done, one after the other (no spectra solved as a batch), while
    the rows of equal-shaped matrices are still held back to be fitted together (htsr's compute_many)."""
    from wbfe.engine import rows

    g = torch.Generator().manual_seed(0)
    tensors = {f"layers.{k}.weight": torch.randn(24, 16, generator=g) for k in range(20)}
    tensors.update({f"layers.{k}.bias": torch.zeros(24) for k in range(3)})
    save_file(tensors, str(tmp_path / "m.safetensors"))
    calls: list[tuple[int, object, int]] = []
    events: list[str] = []
    original = rows.RowMaker.flush

    def flush(self: rows.RowMaker) -> None:
        calls.append((-1, None, len(self.pending)))  # when rows are made, and how many at once
        original(self)

    def spectrum(matrices: list, device: torch.device, **kw: bool) -> object:
        events.append("spectrum")
        return spectra.spectrum(matrices, device, **kw)

    def progress(done: int, total: object, name: str) -> None:
        calls.append((done, total, 0))
        events.append("tick")

    monkeypatch.setattr(rows.RowMaker, "flush", flush)
    monkeypatch.setattr(jobs, "spectrum", spectrum)
    wbfe.score(tmp_path / "m.safetensors", progress=progress)
    progress_calls = [c for c in calls if c[0] >= 0]
    assert [c[0] for c in progress_calls] == list(range(0, 21))
    assert {c[1] for c in progress_calls} == {20}  # the total from the first call on: 20 matrices
    assert events == ["tick"] + ["spectrum", "tick"] * 20  # (0, total) first, then a tick per spectrum
    assert calls[-1] == (-1, None, 23)  # every row made in one flush, after every progress call
