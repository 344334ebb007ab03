"""Lazy imports under the pipeline's threads (issue 45 §12).

A module enters ``sys.modules`` when its import starts. wbfe asked ``sys.modules`` whether torch
was loaded and then read ``torch.Tensor`` from it; while a pipeline thread was still importing
torch (the read-ahead thread loading the first bfloat16 tensor), another thread scoring a float32
matrix read the half-imported module and crashed: ``AttributeError: partially initialized module
'torch' has no attribute 'Tensor'``. Before the fix the race test below failed on every try, and
the stress test's checkpoint, scored in fresh processes on a busy 2-core machine, failed in 3 of
50 runs (1 of 20 with the default threads, 2 of 30 with 16 workers), 0 of 40 after it. Each test
runs its scoring in fresh interpreters, where torch is not imported yet.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")  # the crash needs torch installed: it holds the bfloat16 tensors

ROOT = Path(__file__).resolve().parents[1]

# One score in this fresh interpreter, its JSON on stdout; argv[2] > 0 makes the pipeline believe
# the machine has that many CPUs (its workers: one per CPU the BLAS thread settings allow).
_SCORE = textwrap.dedent("""
    import sys
    cpus = int(sys.argv[2])
    if cpus:
        import wbfe._config
        wbfe._config.usable_cpus = lambda: cpus
    import wbfe
    sys.stdout.write(wbfe.score(sys.argv[1], device="cpu").to_json())
""")


def _mixed_checkpoint(path: Path) -> Path:
    """An LLM-like safetensors file (written without torch): per layer a float32 projection, then a
    bfloat16 one (read ahead on the read thread, which imports torch for it), a float32 norm, small
    float32 and float16 matrices scored in line meanwhile, and larger float16/float32 ones."""
    rng = np.random.default_rng(45)
    tensors: list[tuple[str, str, tuple[int, ...], bytes]] = []

    def add(name: str, shape: tuple[int, ...], dtype: str) -> None:
        w = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
        if dtype == "BF16":
            data = (w.view(np.uint32) >> 16).astype(np.uint16).tobytes()  # truncated to bfloat16
        else:
            data = w.astype(np.float16 if dtype == "F16" else np.float32).tobytes()
        tensors.append((name, dtype, shape, data))

    for layer in range(3):
        add(f"model.layers.{layer}.attn.o_proj.weight", (512, 768), "F32")
        add(f"model.layers.{layer}.attn.q_proj.weight", (512, 768), "BF16")
        add(f"model.layers.{layer}.input_norm.weight", (768,), "F32")
        for j in range(8):
            add(f"model.layers.{layer}.small.{j}.weight", (96, 160), ("F32", "F16")[j % 2])
        add(f"model.layers.{layer}.mlp.up.weight", (640, 640), "F16")
        add(f"model.layers.{layer}.mlp.down.weight", (640, 512), "F32")
    header, offset = {}, 0
    for name, dtype, shape, data in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text)
        for *_, data in tensors:
            fh.write(data)
    return path


def _score_runs(path: Path, runs: int, cpus: int) -> list[str]:
    """``runs`` scores of ``path``, each in a fresh interpreter; every one must succeed."""
    env = dict(os.environ)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        env.pop(var, None)
        if cpus:
            env[var] = str(cpus)
    outputs = []
    for i in range(runs):
        done = subprocess.run([sys.executable, "-c", _SCORE, str(path), str(cpus)], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"run {i + 1} of {runs} ({cpus or 'default'} CPUs) failed:\n{done.stderr[-3000:]}"
        outputs.append(done.stdout)
    return outputs


def _check_stress(tmp_path: Path, runs: int) -> None:
    path = _mixed_checkpoint(tmp_path / "mixed.safetensors")
    outputs = _score_runs(path, runs, 0) + _score_runs(path, runs, 16)
    rows = json.loads(outputs[0])["layers"]
    # Every matrix is scored: the bfloat16 ones too (read through torch, which the race was about).
    assert {row["dtype"] for row in rows} == {"float32", "bfloat16", "float16"}
    assert len(rows) == 3 * 12
    assert len(set(outputs)) == 1, "the same checkpoint scored differently from one run to the next"


def test_mixed_dtype_checkpoint_scores_identically_in_fresh_processes(tmp_path: Path) -> None:
    # Default threads and 16 pipeline workers, three fresh processes each (~20 s).
    _check_stress(tmp_path, 3)


@pytest.mark.slow
def test_mixed_dtype_checkpoint_scores_identically_many_times(tmp_path: Path) -> None:
    _check_stress(tmp_path, 20)


# In a fresh interpreter: a thread imports torch while this one asks, as the pipeline's threads do,
# whether a numpy array is a torch tensor, until the import has finished.
_RACE = textwrap.dedent("""
    import sys, threading
    import numpy as np
    from wbfe.linalg.arrays import dtype_name, is_torch, torch_loaded
    from wbfe._deps import loaded
    assert "torch" not in sys.modules
    importer = threading.Thread(target=lambda: __import__("torch"))
    importer.start()
    x, asked, half = np.zeros(3, np.float32), 0, 0
    while importer.is_alive():
        assert not is_torch(x) and dtype_name(x) == "float32"
        half += "torch" in sys.modules and not torch_loaded()
        asked += 1
    importer.join()
    import torch
    assert loaded("torch") is torch and is_torch(torch.zeros(1)) and not is_torch(x)
    print(asked, half)
""")


def test_is_torch_never_reads_a_half_imported_torch() -> None:
    done = subprocess.run([sys.executable, "-c", _RACE], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    asked, half = map(int, done.stdout.split())
    assert half > 0, "torch was never seen half-imported: the race was not exercised"
    assert asked >= half


def test_loaded_waits_for_the_end_of_an_import(tmp_path: Path) -> None:
    # A module whose import another thread is in the middle of is not handed out; once done, it is.
    (tmp_path / "wbfe_slow_module.py").write_text("import time\ntime.sleep(0.5)\nTensor = object\n")
    script = textwrap.dedent(f"""
        import sys, threading, time
        sys.path.insert(0, {str(tmp_path)!r})
        from wbfe._deps import loaded
        importer = threading.Thread(target=lambda: __import__("wbfe_slow_module"))
        importer.start()
        while "wbfe_slow_module" not in sys.modules:
            time.sleep(0.001)
        assert loaded("wbfe_slow_module") is None, "a half-imported module was handed out"
        importer.join()
        assert loaded("wbfe_slow_module").Tensor is object
        sys.modules["blocked"] = None
        assert loaded("blocked") is None and loaded("never_imported_here") is None
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
