"""Two ``wbfe rank`` drivers on the same zoo and the same score cache at once (issue 21: "two
drivers on the same zoo do not corrupt it")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.ray_zoo import make_zoo, without_run_details


def _rank(spec: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    wbfe = str(Path(sys.executable).parent / "wbfe")
    return subprocess.Popen([wbfe, "rank", str(spec), "--format", "json", "--metrics", "bfe,htsr",
                             "--n-boot", "200"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _result(proc: subprocess.Popen[str]) -> dict[str, object]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


def test_two_drivers_at_once_agree_with_one_and_leave_a_valid_cache(tmp_path: Path) -> None:
    spec = make_zoo(tmp_path / "zoo", 4)
    env = {**os.environ, "WBFE_CACHE_DIR": str(tmp_path / "shared-cache"), "OMP_NUM_THREADS": "1"}
    alone = _result(_rank(spec, {**env, "WBFE_CACHE_DIR": str(tmp_path / "own-cache")}))
    assert alone["n_scored"] == 4
    first, second = _rank(spec, env), _rank(spec, env)  # both start before either finishes
    results = [_result(first), _result(second)]
    for result in results:
        assert without_run_details(result) == without_run_details(alone)
    # Each model is scored exactly once between them: the cache claim makes the other driver
    # wait for and take the first one's score instead of scoring it again.
    assert sum(int(result["n_scored"]) for result in results) == 4  # type: ignore[call-overload]
    assert sum(int(r["n_scored"]) + int(r["n_cached"]) for r in results) == 8  # type: ignore[call-overload]
    # The cache the two wrote together is whole: a third run takes every model from it.
    third = _result(_rank(spec, env))
    assert (third["n_cached"], third["n_scored"]) == (4, 0)
    assert without_run_details(third) == without_run_details(alone)
    entries = sorted((tmp_path / "shared-cache" / "entries").rglob("*"))
    files = [p for p in entries if p.is_file()]
    assert len(files) == 4 and all(json.loads(p.read_text())["format"] == "wbfe-score-cache/2" for p in files)
    leftovers = [p for p in (tmp_path / "shared-cache").rglob("*") if p.is_file() and not p.name.endswith(".json")]
    assert leftovers == []  # no half-written temporary file left behind
