"""Claims in the score cache: two processes on one zoo score each model once (wbfe.ranking.claims,
ScoreCache.claim, score_claimed), a dead owner's claim is taken over, a live one is respected."""

from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from wbfe.ranking.cache import ScoreCache, cache_key, score_claimed
from wbfe.ranking.claims import STALE_AFTER, is_stale, process_start, read_claim

N_MODELS = 6
OPTIONS = {"metrics": ["bfe"]}


def make_zoo(folder: Path) -> list[Path]:
    """Tiny safetensors models, one 24x16 matrix each, seeded."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(N_MODELS):
        w = np.random.default_rng(i).standard_normal((24, 16)).astype(np.float32)
        path = folder / f"m{i}.safetensors"
        save_file({"fc.weight": torch.from_numpy(w)}, str(path))
        paths.append(path)
    return paths


def _key(path: Path) -> str:
    from wbfe.sources import content_hash

    return cache_key(content_hash(str(path)), OPTIONS)


def _driver(cache_dir: str, models: list[str], log: str, barrier: "multiprocessing.synchronize.Barrier") -> None:
    """One rank driver: score what it claims (logging it), take the rest from the cache."""
    import wbfe

    cache = ScoreCache(cache_dir)
    got: dict[str, float] = {}

    def score(model: str) -> None:
        time.sleep(0.3)  # long enough that both drivers are busy at once
        value = float(wbfe.score(model, metrics="bfe").layers[0]["bfe"])
        cache.put(_key(Path(model)), {"bfe": value})
        got[model] = value
        with open(log, "a") as fh:
            fh.write(f"scored {Path(model).name}\n")

    def shared(model: str, payload: dict) -> None:
        got[model] = payload["bfe"]

    barrier.wait()
    score_claimed(cache, models, key_of=lambda m: _key(Path(m)), score=score, shared=shared, poll=0.05)
    Path(log).with_suffix(".json").write_text(json.dumps(got))


def test_two_processes_score_each_model_once(tmp_path: Path) -> None:
    import wbfe

    models = [str(p) for p in make_zoo(tmp_path / "zoo")]
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(2)
    logs = [str(tmp_path / f"driver{k}.log") for k in range(2)]
    procs = [context.Process(target=_driver, args=(str(tmp_path / "cache"), models, log, barrier)) for log in logs]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=150)
        assert proc.exitcode == 0
    scored = [Path(log).read_text().split()[1::2] if Path(log).exists() else [] for log in logs]
    assert sorted(scored[0] + scored[1]) == sorted(Path(m).name for m in models)  # each once, in all
    assert scored[0] and scored[1]  # and the work was split
    want = {m: float(wbfe.score(m, metrics="bfe").layers[0]["bfe"]) for m in models}
    for log in logs:
        assert json.loads(Path(log).with_suffix(".json").read_text()) == pytest.approx(want, rel=1e-12)
    assert list((tmp_path / "cache").rglob("*.claim")) == []  # every claim released


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_dead_owners_claim_is_taken_over(tmp_path: Path) -> None:
    cache = ScoreCache(tmp_path)
    path = cache.claim_path("k" * 64)
    path.parent.mkdir(parents=True)
    dead = {"pid": _dead_pid(), "host": socket.gethostname(), "started": None, "token": "old", "time": 0.0}
    path.write_text(json.dumps(dead))
    claim = cache.claim("k" * 64)
    assert claim is not None and read_claim(path)["pid"] == os.getpid()
    assert cache.claim("k" * 64) is None  # now held by a live process (this one)
    claim.release()
    assert not path.exists() and [p.name for p in path.parent.iterdir()] == []  # no tombstone left


def test_live_and_foreign_claims(tmp_path: Path) -> None:
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": process_start(os.getpid())}
    assert not is_stale(me, age=1.0)
    assert is_stale({**me, "started": (me["started"] or 0) + 1}, age=1.0)  # the pid now names another process
    foreign = {"pid": 1, "host": "another-host.example"}
    assert not is_stale(foreign, age=STALE_AFTER - 1) and is_stale(foreign, age=STALE_AFTER + 1)
    assert not is_stale({}, age=1.0) and is_stale({}, age=11.0)  # half-written: a writer gets 10 s
    # a foreign claim is respected until it is old, then taken over
    cache = ScoreCache(tmp_path)
    path = cache.claim_path("f" * 64)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**foreign, "token": "x"}))
    assert cache.claim("f" * 64) is None
    old = time.time() - STALE_AFTER - 60
    os.utime(path, (old, old))
    taken = cache.claim("f" * 64)
    assert taken is not None and read_claim(cache.claim_path("f" * 64))["token"] == taken.token


def test_release_leaves_a_claim_that_is_no_longer_ours(tmp_path: Path) -> None:
    cache = ScoreCache(tmp_path)
    claim = cache.claim("a" * 64)
    assert claim is not None
    other = {"pid": 1, "host": "another-host.example", "token": "theirs"}
    claim.path.write_text(json.dumps(other))  # taken over meanwhile
    claim.release()
    assert read_claim(claim.path) == other


def test_score_claimed_waits_for_the_holder_and_scores_what_it_gives_up(tmp_path: Path) -> None:
    cache = ScoreCache(tmp_path)
    keys = {"a": "a" * 64, "b": "b" * 64, "c": "c" * 64}
    held = {k: cache.claim(keys[k]) for k in ("a", "b")}  # "another driver" (a thread here) holds a and b
    scored, shared = [], []

    def score(name: str) -> None:
        scored.append(name)
        cache.put(keys[name], {"by": "me"})

    def holder() -> None:
        time.sleep(0.3)
        cache.put(keys["a"], {"by": "holder"})
        held["a"].release()  # stored: taken from the cache
        held["b"].release()  # gave up (its scoring failed): scored here

    thread = threading.Thread(target=holder)
    thread.start()
    score_claimed(cache, ["a", "b", "c"], key_of=keys.get, score=score,
                  shared=lambda name, payload: shared.append((name, payload["by"])), poll=0.05)
    thread.join()
    assert scored == ["c", "b"] and shared == [("a", "holder")]
