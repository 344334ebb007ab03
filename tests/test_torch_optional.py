"""torch is an extra (issue 35 §3): without it the base install scores the float checkpoints, and
every path that needs it stops with one typed error that names what needed it (wbfe._deps).

Each check runs in a fresh interpreter in which torch cannot be imported, in the two ways it can
be missing: an entry of None in ``sys.modules`` and an import finder that refuses it (as for a
package that is not installed, ``find_spec`` fails too). The references are computed in this
process, with torch.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import wbfe
from wbfe._deps import TORCH_INSTALL, require_torch, torch_installed

BLOCKERS = {
    "sys.modules": "import sys\nsys.modules['torch'] = None\n",
    "finder": (
        "import sys\n"
        "class NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, NoTorch())\n"
    ),
}
CLI = """
import json
sys.argv = ["wbfe", *json.loads(sys.argv[1])]
from wbfe_cli.main import main
main()
"""
METRICS = "bfe,htsr,htmp"


@pytest.fixture(params=sorted(BLOCKERS))
def blocker(request: pytest.FixtureRequest) -> str:
    return BLOCKERS[request.param]


def run_without_torch(blocker: str, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", blocker + code, *args], capture_output=True, text=True, timeout=300)


def cli_without_torch(blocker: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return run_without_torch(blocker, CLI, json.dumps(list(argv)))


def assert_one_error_line(done: subprocess.CompletedProcess[str], message: str) -> None:
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr == f"wbfe: error: {message}\n"


def test_the_blockers_block(blocker: str) -> None:
    done = run_without_torch(blocker, "import json\nfrom wbfe._deps import torch_installed\n"
                                      "try:\n    import torch\nexcept ImportError:\n    imported = False\n"
                                      "else:\n    imported = True\n"
                                      "print(json.dumps([imported, torch_installed()]))")
    assert json.loads(done.stdout) == [False, False], done.stderr[-2000:]
    assert torch_installed()  # and here, where torch is, it is found


def test_require_torch_here() -> None:
    assert require_torch("anything") is torch


def test_the_fixture_score_is_the_score_with_torch(blocker: str, tmp_path: Path) -> None:
    """The README's first command (`wbfe score`, the default device auto: the CPU without torch)
    gives every number the fixture's weights give as torch tensors."""
    from safetensors.torch import load_file

    from wbfe.fixtures import default_checkpoint

    out = tmp_path / "score.json"
    done = cli_without_torch(blocker, "score", "--metrics", METRICS, "--format", "json", "-o", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    got = {row["name"]: row for row in json.loads(out.read_text())["layers"]}
    want = {row["name"]: row for row in wbfe.score(load_file(str(default_checkpoint())), metrics=METRICS,
                                                     device="cpu").layers}
    assert got and set(got) == set(want)
    compared = 0
    for name, row in want.items():
        for column, value in row.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isnan(value):  # the JSON output writes NaN as null
                assert got[name][column] is None, (name, column)
            else:
                # The same float64 arithmetic; only BLAS's summation order may differ.
                assert got[name][column] == pytest.approx(value, rel=1e-9, abs=1e-12), (name, column)
                compared += 1
    assert compared > 10 * len(want)


def test_a_pickle_is_the_one_clear_error(blocker: str, tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save({"fc.weight": torch.randn(20, 30, generator=torch.Generator().manual_seed(0))}, path)
    message = f"reading a PyTorch pickle needs torch: {TORCH_INSTALL}"
    assert_one_error_line(cli_without_torch(blocker, "score", str(path)), message)
    done = run_without_torch(blocker, (
        "import json, wbfe\n"
        "try:\n    wbfe.score(sys.argv[1])\n"
        "except wbfe.MissingDependencyError as exc:\n"
        "    print(json.dumps([str(exc), exc.package, isinstance(exc, wbfe.WbfeError), isinstance(exc, ImportError)]))\n"
    ), str(path))
    assert json.loads(done.stdout) == [message, "torch", True, True], done.stderr[-2000:]


def test_torchscript_and_cuda_say_so_and_a_float8_scale_is_skipped(blocker: str, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(0)
    scripted = tmp_path / "model.jit"
    with warnings.catch_warnings():  # torch.jit's deprecation notices
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.trace(torch.nn.Linear(30, 20), torch.randn(1, 30)), str(scripted))
    assert_one_error_line(cli_without_torch(blocker, "score", str(scripted)),
                          f"reading a TorchScript archive needs torch: {TORCH_INSTALL}")
    e8 = tmp_path / "model.safetensors"
    save_file({"fc.weight": torch.ones(20, 30).to(torch.float8_e8m0fnu)}, str(e8))
    # planned from its header as with torch (a scale dtype, no weight): never read, so torch is not asked
    assert_one_error_line(cli_without_torch(blocker, "score", str(e8)),
                          f"{e8}: no usable weight matrix (1 tensor skipped — fc.weight: unsupported dtype "
                          "float8_e8m0fnu)")
    assert_one_error_line(cli_without_torch(blocker, "score", "--device", "cuda"),
                          f"--device cuda needs torch: {TORCH_INSTALL}")


def test_vectors_need_torch_but_not_in_weightwatchers_mode(blocker: str, tmp_path: Path) -> None:
    from wbfe.fixtures import default_checkpoint

    assert_one_error_line(cli_without_torch(blocker, "score", "--metrics", "vectors"),
                          f"--metrics vectors without --ww-compatible (which uses scipy) needs torch: {TORCH_INSTALL}")
    out = tmp_path / "vectors.json"
    done = cli_without_torch(blocker, "score", "--metrics", "vectors", "--ww-compatible", "--format", "json",
                             "-o", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    got = {row["name"]: row["tail_mean_loc_ratio"] for row in json.loads(out.read_text())["layers"]}
    want = {row["name"]: row["tail_mean_loc_ratio"]
            for row in wbfe.score(default_checkpoint(), metrics="vectors", ww_compatible=True, device="cpu").layers}
    assert got.keys() == want.keys() and any(v == v for v in want.values())
    for name, value in want.items():
        if value != value:  # NaN, written as null
            assert got[name] is None, name
        else:
            assert got[name] == pytest.approx(value, rel=1e-9), name


def test_a_model_class_without_torch_falls_back_to_the_rules_and_says_why(blocker: str) -> None:
    """As without transformers or timm: the config rules decide, and the reason names torch."""
    configs = {
        "transformers": {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": 1, "n_embd": 8,
                         "n_head": 2, "vocab_size": 16, "n_positions": 8},
        "timm": {"architecture": "resnet18", "num_classes": 10, "pretrained_cfg": {"classifier": "fc"}},
    }
    done = run_without_torch(blocker, (
        "import json\nfrom wbfe.framework import describe_config\n"
        "print(json.dumps({k: [type(d).__name__, str(d)] for k, d in "
        "((k, describe_config(c)) for k, c in json.loads(sys.argv[1]).items())}))\n"
    ), json.dumps(configs))
    got = json.loads(done.stdout)
    assert got == {
        "transformers": ["Fallback", f"torch is not installed, so GPT2LMHeadModel is not built ({TORCH_INSTALL})"],
        "timm": ["Fallback", f"torch is not installed, so resnet18 is not built ({TORCH_INSTALL})"],
    }, done.stderr[-2000:]
    # Here, with torch, the same configs are built: the fallback is torch's absence alone.
    from wbfe.framework import FrameworkDescription, describe_config

    pytest.importorskip("transformers")
    pytest.importorskip("timm", reason="needs the timm extra: pip install -e '.[test,timm]'")
    assert all(isinstance(describe_config(c), FrameworkDescription) for c in configs.values())


def test_version_and_help(blocker: str) -> None:
    done = cli_without_torch(blocker, "--version")
    assert (done.returncode, done.stdout) == (0, f"wbfe {wbfe.__version__}\n"), done.stderr[-2000:]
    done = cli_without_torch(blocker, "--help")
    assert done.returncode == 0 and "score" in done.stdout and "Usage" in done.stdout, done.stderr[-2000:]



def test_bfloat16_widened_holds_every_value_as_torch_does() -> None:
    """Every one of the 65,536 bfloat16 bit patterns, widened by numpy alone, is the value torch
    gives it (NaN where torch's is NaN)."""
    from wbfe.linalg.arrays import widen

    stored = torch.arange(2**16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    got = widen(stored.view(torch.uint8).numpy(), "bfloat16", (2**16,)).astype("float64")
    want = stored.to(torch.float64).numpy()
    assert got.shape == want.shape
    assert ((got == want) | (np.isnan(got) & np.isnan(want))).all()


def test_a_bfloat16_checkpoint_scores_as_with_torch(blocker: str, tmp_path: Path) -> None:
    """Most LLM checkpoints store bfloat16: the base install scores them, with the numbers torch's
    reading gives."""
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(0)
    tensors = {"a.weight": torch.randn(48, 40, generator=generator).bfloat16(),
               "b.weight": torch.randn(40, 32, generator=generator).bfloat16()}
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    out = tmp_path / "score.json"
    done = cli_without_torch(blocker, "score", str(path), "--metrics", METRICS, "--min-eigs", "5", "--format", "json",
                             "-o", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    got = {row["name"]: row for row in json.loads(out.read_text())["layers"]}
    want = {row["name"]: row for row in wbfe.score(str(path), metrics=METRICS, min_eigs=5, device="cpu").layers}
    assert set(got) == set(want) == set(tensors)
    compared = 0
    for name, row in want.items():
        for column in ("bfe", "alpha", "log_norm", "stable_rank", "htmp_kappa"):
            if isinstance(row.get(column), float) and not math.isnan(row[column]):
                assert got[name][column] == pytest.approx(row[column], rel=1e-9), (name, column)
                compared += 1
    assert compared >= 6
