"""The HDF5 guard works from every way Python is entered (issue #45 §6): a script without an
``if __name__ == "__main__"`` guard, the same script read from stdin, code run by ``exec`` (as
Jupyter runs a cell), and under each multiprocessing start method, in the main process and in a
worker. Each scores a sound Keras 2 ``.h5`` and must give exactly the numbers the test's own process
gives, which match the same matrices read from a NumPy ``.npz`` (another reader, no HDF5).

Before the fix the guard's children came from multiprocessing's fork server, which re-imports the
caller's ``__main__``: the unguarded script ran itself again in the child, the child died, and a
sound file was refused as "damaged or hostile".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

h5py = pytest.importorskip("h5py")

ROOT = Path(__file__).resolve().parents[1]

# The user's three lines: no __main__ guard.
SCRIPT = """import json, sys
import wbfe
print(json.dumps(wbfe.score(sys.argv[1] if len(sys.argv) > 1 else "model.h5").to_dict()["layers"]))
"""

# Each start method set for the whole program, then a score here and one in a worker of that method.
START_METHODS = """import json, multiprocessing, sys
import wbfe


def layers(path):
    return wbfe.score(path).to_dict()["layers"]


if __name__ == "__main__":
    multiprocessing.set_start_method("spawn")
    out = {"main": layers("model.h5")}
    for method in ("fork", "spawn", "forkserver"):
        context = multiprocessing.get_context(method)
        with context.Pool(1) as pool:
            out[method] = pool.apply(layers, ("model.h5",))
    print(json.dumps(out))
"""


def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(45)
    return {"dense": rng.standard_normal((48, 32)).astype(np.float32),
            "dense_1": rng.standard_normal((32, 24)).astype(np.float32),
            "dense_2": rng.standard_normal((24, 10)).astype(np.float32)}


def _write_keras2_h5(path: Path) -> Path:
    """``model.save("model.h5")`` of Keras 2: a Sequential of three Dense layers."""
    weights = _weights()
    config = {"class_name": "Sequential", "config": {"name": "sequential", "layers": [
        {"module": "keras.layers", "class_name": "Dense", "config": {"name": name}} for name in weights]}}
    with h5py.File(path, "w") as f:
        f.attrs["backend"] = b"tensorflow"
        f.attrs["keras_version"] = b"2.15.0"
        f.attrs["model_config"] = json.dumps(config).encode("utf8")
        root = f.create_group("model_weights")
        root.attrs["layer_names"] = np.array([n.encode() for n in weights], dtype="S")
        root.attrs["backend"] = b"tensorflow"
        root.attrs["keras_version"] = b"2.15.0"
        for name, kernel in weights.items():
            group = root.create_group(name)
            names = [f"{name}/kernel:0", f"{name}/bias:0"]
            group.attrs["weight_names"] = np.array([n.encode() for n in names], dtype="S")
            group.create_dataset(names[0], data=kernel)
            group.create_dataset(names[1], data=np.zeros(kernel.shape[1], np.float32))
    return path


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """The .h5 in a folder of its own, and its layers as scored in this process."""
    import wbfe

    folder = tmp_path_factory.mktemp("keras")
    path = _write_keras2_h5(folder / "model.h5")
    expected = wbfe.score(str(path)).to_dict()["layers"]
    assert [row["shape"] for row in expected] == [[32, 48], [24, 32], [10, 24]]
    # The same matrices through another reader (NumPy's, no HDF5): the same BFE-W.
    npz = folder / "same.npz"
    np.savez(npz, **{f"{name}.weight": kernel.T for name, kernel in _weights().items()})
    reference = wbfe.score(str(npz)).to_dict()["layers"]
    assert [row["bfe"] for row in expected] == pytest.approx([row["bfe"] for row in reference], rel=1e-12)
    return path, expected


def _run(args: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    return subprocess.run([sys.executable, *args], cwd=cwd, input=stdin, capture_output=True, text=True,
                          timeout=300, env=env)


def _layers(done: subprocess.CompletedProcess) -> list[dict]:
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_script_without_a_main_guard(model: tuple[Path, list[dict]]) -> None:
    path, expected = model
    (path.parent / "score_it.py").write_text(SCRIPT, encoding="utf-8")
    assert _layers(_run(["score_it.py"], path.parent)) == expected


def test_the_script_read_from_stdin(model: tuple[Path, list[dict]]) -> None:
    path, expected = model
    assert _layers(_run(["-"], path.parent, stdin=SCRIPT)) == expected


def test_code_run_by_exec_as_a_notebook_cell(model: tuple[Path, list[dict]]) -> None:
    path, expected = model
    cell = f"import sys; sys.argv = ['']; exec(compile({SCRIPT!r}, '<cell>', 'exec'))"
    assert _layers(_run(["-c", cell], path.parent)) == expected


@pytest.mark.slow
def test_every_multiprocessing_start_method(model: tuple[Path, list[dict]]) -> None:
    path, expected = model
    (path.parent / "methods.py").write_text(START_METHODS, encoding="utf-8")
    done = _run(["methods.py"], path.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(out) == {"fork", "spawn", "forkserver", "main"}
    for method, layers in out.items():
        assert layers == expected, method


def test_a_forked_copy_of_this_process_uses_a_walker_of_its_own(model: tuple[Path, list[dict]],
                                                                 tmp_path: Path) -> None:
    """After os.fork the child must not talk to its parent's walker (their answers would mix)."""
    from wbfe.sources import hdf5_guard

    path, _ = model
    hdf5_guard.check_hdf5_index(path)  # this process's walker is running
    parent_walker = hdf5_guard._WALKER
    assert parent_walker is not None
    copy = tmp_path / "copy.h5"
    copy.write_bytes(path.read_bytes())
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit code
        code = 1
        try:
            code = 0 if hdf5_guard._WALKER is None else 3
            hdf5_guard.check_hdf5_index(copy)
            walker = hdf5_guard._WALKER
            code = code or (0 if walker is not None and walker.process.pid != parent_walker.process.pid else 4)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert parent_walker.process.poll() is None  # the parent's walker still serves the parent
    hdf5_guard._PASSED.clear()
    hdf5_guard.check_hdf5_index(path)
    assert hdf5_guard._WALKER is parent_walker
