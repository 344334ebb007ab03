"""One harness under atheris (libFuzzer): ``python -m benchmarks.fuzz.run READER FINDINGS [libFuzzer flags]``
(``--write-seeds READER FOLDER`` writes its seeds).

Run by ``benchmarks/fuzz_readers.py``, one process per reader. wbfe's modules are instrumented for
coverage (only wbfe's: the readers' own dependencies run at full speed). A finding (an exception
that is not a ``WbfeError``, or a broken invariant) is saved in ``FINDINGS`` as
``<signature>.bin`` (the smallest input met with that signature: exception type and the frame that
raised it) and ``<signature>.txt`` (its traceback), and fuzzing goes on, so that one bug does not
hide the next. A native crash, hang or memory blow-up ends the process: libFuzzer writes the input
(``-artifact_prefix``) and the driver starts it again.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import pkgutil
import resource
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

# Packages whose modules are instrumented: what the readers, the engine and the adapters run.
_INSTRUMENTED = ("wbfe.sources", "wbfe.engine", "wbfe.ranking", "wbfe.framework", "wbfe.quant")
_MODULES = ("wbfe", "wbfe.scoring", "wbfe.adapters", "wbfe.engine.matrices", "wbfe.engine.pipeline", "wbfe.engine.experts")


def _import_instrumented() -> None:
    import atheris

    with atheris.instrument_imports(include=["wbfe"]):
        for name in _MODULES:
            importlib.import_module(name)
        for package_name in _INSTRUMENTED:
            package = importlib.import_module(package_name)
            for info in pkgutil.walk_packages(package.__path__, package_name + "."):
                try:
                    importlib.import_module(info.name)
                except ImportError:  # a module of an optional dependency this machine lacks
                    pass


def signature(exc: BaseException) -> str:
    """Exception type and the innermost frame in wbfe (else the innermost frame) that raised it."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "/wbfe/" in f.filename or "/benchmarks/fuzz/" in f.filename]
    chosen = ours or frames
    where = f"{Path(chosen[-1].filename).name}:{chosen[-1].lineno}" if chosen else "?"
    return f"{type(exc).__name__}@{where}"


def recorder(fuzz_one: Callable[[bytes], None], findings: Path) -> Callable[[bytes], None]:
    """``fuzz_one`` that saves each new finding (and a smaller input for a known one) and goes on."""
    findings.mkdir(parents=True, exist_ok=True)

    def one(data: bytes) -> None:
        try:
            fuzz_one(data)
        except Exception as exc:  # noqa: BLE001 - every exception here is a finding
            sig = signature(exc)
            key = hashlib.sha1(sig.encode()).hexdigest()[:12]
            sample = findings / f"{key}.bin"
            if not sample.exists() or len(data) < sample.stat().st_size:
                sample.write_bytes(data)
                text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
                (findings / f"{key}.txt").write_text(f"{sig}\n\n{text[-6000:]}", encoding="utf-8")

    return one


def write_seeds(reader: str, folder: Path) -> None:
    """Write the harness's seed files into ``folder``."""
    module: Any = importlib.import_module(f"benchmarks.fuzz.harness_{reader}")
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in module.seeds().items():
        (folder / f"seed-{name}").write_bytes(data)


def main(argv: list[str]) -> None:
    if argv[1] == "--write-seeds":
        write_seeds(argv[2], Path(argv[3]))
        return
    reader, findings = argv[1], Path(argv[2])
    limit_mb = int(os.environ.get("WBFE_FUZZ_AS_MB", "0"))
    if limit_mb:  # a hostile size claim must be refused, not allocated: MemoryError is a finding
        resource.setrlimit(resource.RLIMIT_AS, (limit_mb << 20, limit_mb << 20))
    import atheris

    _import_instrumented()
    from benchmarks.fuzz import common

    common.USE_ALARM = False  # libFuzzer's -timeout owns SIGALRM
    module: Any = importlib.import_module(f"benchmarks.fuzz.harness_{reader}")
    for data in module.seeds().values():  # warm up: the lazy imports (torch, the engine) are no input's time
        try:
            module.fuzz_one(data)
        except Exception:  # noqa: BLE001 - the fuzzing proper reports it
            pass
    atheris.Setup([argv[0], *argv[3:]], recorder(module.fuzz_one, findings))
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
