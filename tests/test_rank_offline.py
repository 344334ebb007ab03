"""``wbfe rank`` on a zoo that cannot be had here stops at once with one error (issue 35 item 11); never the network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests.test_ranking_availability import FIX, closed_port


def _rank(args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    wbfe = str(Path(sys.executable).parent / "wbfe")
    start = time.monotonic()
    out = subprocess.run([wbfe, "rank", *args], capture_output=True, text=True, env=env, timeout=240)
    return out, time.monotonic() - start


def test_hub_zoo_with_a_closed_endpoint(tmp_path: Path) -> None:
    spec = tmp_path / "zoo.csv"
    spec.write_text("model,checkpoint,acc\n" + "".join(f"m{i},nobody/model-{i},{0.5 + i / 100}\n" for i in range(40)))
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{closed_port()}", HF_HUB_CACHE=str(tmp_path / "hf"),
               WBFE_CACHE_DIR=str(tmp_path / "cache"))
    out, _ = _rank([str(spec)], env)  # before: 40 attempts, one connection each
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"wbfe: error: zoo {tmp_path.name}/zoo.csv: none of its 40 models can be scored here: not cached, and the "
        f"Hugging Face hub could not be reached (127.0.0.1: Connection refused) (every one); {FIX}"]


def test_torchvision_zoo_offline(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TORCH_HOME": str(tmp_path / "torch"),
           "WBFE_CACHE_DIR": str(tmp_path / "cache")}
    out, _ = _rank(["torchvision-imagenet"], env)
    assert out.returncode == 2
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("wbfe: error: zoo torchvision-imagenet: none of its ")
    assert lines[0].endswith(f"models can be scored here: not cached, and HF_HUB_OFFLINE is set (every one); {FIX}")


def test_torchvision_zoo_offline_never_imports_torchvision(tmp_path: Path) -> None:
    """With nothing in torch's hub cache and HF_HUB_OFFLINE set, none of the weights can be had: that
    is known without importing torchvision (2-3 s), so the one-line failure comes first."""
    probe = (
        "import json, sys\n"
        "sys.argv = ['wbfe', 'rank', 'torchvision-imagenet']\n"
        "from wbfe_cli.main import main\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
        "sys.stderr.write('PROBE ' + json.dumps({'code': code, 'torchvision': sorted("
        "m for m in sys.modules if m.split('.')[0] == 'torchvision')}) + '\\n')\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TORCH_HOME": str(tmp_path / "torch"),
           "WBFE_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=240)
    *lines, last = out.stderr.splitlines()
    assert last.startswith("PROBE "), out.stderr[-2000:]
    assert json.loads(last[len("PROBE "):]) == {"code": 2, "torchvision": []}
    assert len(lines) == 1 and lines[0].startswith("wbfe: error: zoo torchvision-imagenet: none of its ")
    assert lines[0].endswith(f"models can be scored here: not cached, and HF_HUB_OFFLINE is set (every one); {FIX}")
