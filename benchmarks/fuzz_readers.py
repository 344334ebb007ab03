"""Coverage-guided fuzzing of every reader (issue #33 §1): run each harness of ``benchmarks/fuzz/``
under atheris (libFuzzer) for a set time and record ``benchmarks/results/fuzz_readers.json`` as
``{reader: {seconds, executions, findings, ...}, "run": {versions, limits}}``.

    nice -n 19 python benchmarks/fuzz_readers.py --seconds 600 [--readers gguf,onnx] [--jobs 2]

Each reader runs in its own process (``python -m benchmarks.fuzz.run``) on a working corpus seeded
with the harness's valid files and the replay corpus ``tests/fuzz_corpus/<reader>/``, with its
address space capped (``RLIMIT_AS``: a hostile size claim must be refused before it is allocated),
libFuzzer's ``-rss_limit_mb`` and ``-timeout`` (a hang is a finding). A Python finding is saved and
fuzzing goes on (see ``benchmarks/fuzz/run.py``); a native crash ends the process, whose input
libFuzzer saves, and the reader is started again on its corpus for the time left. Findings are
listed by signature in the JSON and their inputs left in the work folder (``--work``); once fixed,
an input goes to ``tests/fuzz_corpus/<reader>/``, which ``tests/test_fuzz_corpus.py`` replays.
A rerun of some readers updates their records (the earlier runs kept under ``earlier_runs``) and
keeps the others'.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # benchmarks/ is a folder of the repository, not an installed package
    sys.path.insert(0, str(ROOT))

from benchmarks.fuzz import HARNESSES  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "fuzz_readers.json"
CORPUS = ROOT / "tests" / "fuzz_corpus"
_EXECUTED = re.compile(r"stat::number_of_executed_units:\s*(\d+)")
_PROGRESS = re.compile(r"^#(\d+)\s", re.M)
_ARTIFACT = re.compile(r"Test unit written to (\S+)")
_MAX_RESTARTS = 20


# A line importing one of wbfe's own modules (a parenthesised list included).
_WBFE_IMPORT = re.compile(r"^[ \t]*(?:from wbfe[\w.]* import (?:\([^)]*\)|[^\n]*)|import wbfe[^\n]*)\n", re.M)


def harness_digest(reader: str) -> str:
    """SHA-256 of what decides a harness's checks: its module and ``benchmarks/fuzz/common.py``,
    without the lines that import wbfe's own modules (a module moved inside the package changes
    where a harness imports it from, not what it checks). A run records it;
    ``tests/test_fuzz_results.py`` requires the latest run of every reader to match the files as
    they are, so a changed harness needs a fresh run."""
    digest = hashlib.sha256()
    for path in (ROOT / "benchmarks" / "fuzz" / f"harness_{reader}.py", ROOT / "benchmarks" / "fuzz" / "common.py"):
        digest.update(_WBFE_IMPORT.sub("", path.read_text(encoding="utf-8")).encode("utf-8"))
    return digest.hexdigest()


def _env(args: argparse.Namespace) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                "KERAS_BACKEND": env.get("KERAS_BACKEND", "torch"), "PYTHONWARNINGS": "ignore",
                "WBFE_FUZZ_AS_MB": str(args.as_mb), "TF_CPP_MIN_LOG_LEVEL": "3"})
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def fuzz_reader(reader: str, args: argparse.Namespace) -> dict[str, Any]:
    """Fuzz one reader for ``args.seconds`` (restarting it after a native crash); its record."""
    work = Path(args.work) / reader
    corpus, findings, crashes = work / "corpus", work / "findings", work / "crashes"
    for folder in (corpus, findings, crashes):
        folder.mkdir(parents=True, exist_ok=True)
    env = _env(args)
    subprocess.run([sys.executable, "-m", "benchmarks.fuzz.run", "--write-seeds", reader, str(corpus)],
                   cwd=ROOT, env=env, check=True, capture_output=True)
    replay = CORPUS / reader
    if replay.is_dir():
        for path in replay.iterdir():
            if path.is_file():
                shutil.copy(path, corpus / f"replay-{path.name}")
    dictionary = _dictionary(reader, work)
    digest = harness_digest(reader)  # at the start: the code this run fuzzed
    start = time.monotonic()
    executions, restarts, log_tail = 0, 0, ""
    while True:
        left = int(args.seconds - (time.monotonic() - start))
        if left < 5 or restarts > _MAX_RESTARTS:
            break
        command = [sys.executable, "-m", "benchmarks.fuzz.run", reader, str(findings),
                   f"-max_total_time={left}", f"-timeout={args.timeout}", f"-rss_limit_mb={args.rss_mb}",
                   f"-artifact_prefix={crashes}/", "-print_final_stats=1", str(corpus)]
        if dictionary is not None:
            command.insert(-1, f"-dict={dictionary}")
        if args.max_len:
            command.insert(-1, f"-max_len={args.max_len}")
        run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, errors="replace",
                             preexec_fn=lambda: os.nice(args.nice))
        output = run.stdout + run.stderr
        counted = _EXECUTED.findall(output)
        progress = _PROGRESS.findall(output)
        executions += int(counted[-1]) if counted else (int(progress[-1]) if progress else 0)
        log_tail = output[-3000:]
        (work / f"log-{restarts}.txt").write_text(output[-200_000:], encoding="utf-8")
        if run.returncode == 0:
            break
        restarts += 1
        if not _ARTIFACT.search(output):  # no input to blame: the harness itself failed to start
            break
    seconds = round(time.monotonic() - start, 1)
    python = sorted(p.with_suffix(".txt").read_text(encoding="utf-8").splitlines()[0]
                    for p in findings.glob("*.bin") if p.with_suffix(".txt").exists())
    # libFuzzer's artifacts: crash-, timeout-, oom- (findings) and slow-unit- (an input slower than
    # -report_slow_units, 10 s: noted, not a finding).
    native = sorted(p.name for p in crashes.iterdir() if p.is_file() and not p.name.startswith("slow-unit-"))
    slow = sorted(p.name for p in crashes.iterdir() if p.is_file() and p.name.startswith("slow-unit-"))
    return {
        "seconds": seconds,
        "harness_sha256": digest,
        "executions": executions,
        "findings": len(python) + len(native),
        "finding_signatures": python + [f"native:{name}" for name in native],
        "exec_per_sec": round(executions / seconds, 1) if seconds else None,
        "corpus_files": sum(1 for p in corpus.iterdir() if p.is_file()),
        "restarts": restarts,
        "slow_units": len(slow),
        **({"log_tail": log_tail} if restarts and not native else {}),
    }


def _dictionary(reader: str, work: Path) -> Path | None:
    """The harness's ``DICTIONARY`` tokens as a libFuzzer dictionary file, if it has any."""
    import importlib

    tokens = getattr(importlib.import_module(f"benchmarks.fuzz.harness_{reader}"), "DICTIONARY", ())
    if not tokens:
        return None
    path = work / "tokens.dict"
    path.write_text("".join(f'"{_escaped(t)}"\n' for t in tokens), encoding="ascii")
    return path


def _escaped(token: str) -> str:
    """A token as libFuzzer's dictionary syntax writes it: printable ASCII, ``\\xNN`` for other bytes."""
    return "".join(chr(b) if 32 <= b < 127 and chr(b) not in '\\"' else f"\\x{b:02x}" for b in token.encode())


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("atheris", "wbfe", "torch", "numpy", "safetensors", "gguf", "h5py", "onnx", "msgpack", "pyyaml"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=int, default=600, help="fuzzing time per reader (default 600)")
    parser.add_argument("--readers", default=",".join(HARNESSES), help="comma-separated harness names")
    parser.add_argument("--jobs", type=int, default=2, help="readers fuzzed side by side (default 2)")
    parser.add_argument("--as-mb", type=int, default=6144, help="address-space cap of a harness process, MiB")
    parser.add_argument("--rss-mb", type=int, default=3072, help="libFuzzer's -rss_limit_mb")
    parser.add_argument("--timeout", type=int, default=60, help="libFuzzer's per-input -timeout, seconds")
    parser.add_argument("--max-len", type=int, default=0, help="libFuzzer's -max_len (0: from the seeds)")
    parser.add_argument("--nice", type=int, default=0, help="niceness added to each harness process")
    parser.add_argument("--work", default="/tmp/wbfe-fuzz", help="working corpora, findings and logs")
    parser.add_argument("--out", default=str(RESULTS), help="the results JSON (updated per reader)")
    args = parser.parse_args(argv)
    readers = [r.strip() for r in args.readers.split(",") if r.strip()]
    unknown = [r for r in readers if r not in HARNESSES]
    if unknown:
        parser.error(f"unknown reader(s) {', '.join(unknown)} (known: {', '.join(HARNESSES)})")
    out = Path(args.out)
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for reader, record in zip(readers, pool.map(lambda r: fuzz_reader(r, args), readers)):
            # Several drivers (one per reader, run side by side) may update the one file: hold its lock.
            out.parent.mkdir(parents=True, exist_ok=True)
            with open(Path(tempfile.gettempdir()) / "wbfe-fuzz-results.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                saved = json.loads(out.read_text(encoding="utf-8")) if out.exists() else {}
                earlier = saved.get(reader)
                if isinstance(earlier, dict):  # an earlier run of this reader (before a fix, say) stays on record
                    record["earlier_runs"] = [*earlier.pop("earlier_runs", []), earlier]
                saved[reader] = {**record, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                 "command": "python benchmarks/fuzz_readers.py " + " ".join(
                                     sys.argv[1:] if argv is None else argv)}
                saved["run"] = {**saved.get("run", {}), "versions": _versions(), "cpu_count": os.cpu_count(),
                                "rss_limit_mb": args.rss_mb, "address_space_mb": args.as_mb,
                                "timeout_s": args.timeout}
                out.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            print(f"{reader}: {record['seconds']} s, {record['executions']} executions, "
                  f"{record['findings']} findings {record['finding_signatures']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
