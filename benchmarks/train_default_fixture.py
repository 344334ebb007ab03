"""Train the default demo checkpoint ``fixtures/fmnist-cnn/model.safetensors``.

A small CNN (Conv(1,16,3) / Conv(16,32,3) / Linear(32*7*7, 128) / Linear(128, 10) ``classifier``)
trained on Fashion-MNIST with one CPU thread, deterministically. Run from the repository root:

    .venv/bin/python benchmarks/train_default_fixture.py

``--check-reproducible`` trains a second time and verifies every tensor is bitwise equal.
Needs the Debian package ``dataset-fashion-mnist``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from benchmarks.fashion_mnist.train import TrainConfig

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "benchmarks/train_default_fixture.py"


def default_config(*, epochs: int, seed: int) -> "TrainConfig":
    """The training settings of the shipped checkpoint."""
    from benchmarks.fashion_mnist.models import ArchSpec
    from benchmarks.fashion_mnist.train import TrainConfig

    return TrainConfig(ArchSpec("cnn", width=16, depth=2), epochs=epochs, lr=1e-3,
                       optimizer="adam", batch_size=128, schedule="cosine", seed=seed)


def main(argv: list[str] | None = None) -> int:
    """Train, evaluate and write ``model.safetensors`` and ``model.json``; return an exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, default=REPO / "fixtures" / "fmnist-cnn")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check-reproducible", action="store_true",
                        help="train twice and fail unless the weights are bitwise equal")
    args = parser.parse_args(argv)

    if str(REPO) not in sys.path:  # run as a plain script from anywhere
        sys.path.insert(0, str(REPO))
    import torch

    from benchmarks.fashion_mnist.train import (checkpoint_metadata, load_dataset,
                                                save_checkpoint, train)

    torch.set_num_threads(1)
    config = default_config(epochs=args.epochs, seed=args.seed)
    data = load_dataset()
    result = train(config, data)
    print(f"{config.spec.name}: test accuracy {result.test_accuracy:.2f} %, "
          f"test loss {result.test_loss:.4f}, {result.seconds:.1f} s", file=sys.stderr)

    if args.check_reproducible:
        again = train(config, data)
        first, second = result.model.state_dict(), again.model.state_dict()
        differ = [k for k in first if not torch.equal(first[k], second[k])]
        if differ:
            print(f"NOT reproducible: tensors differ: {differ}", file=sys.stderr)
            return 1
        print("reproducible: every tensor bitwise equal on a second run", file=sys.stderr)

    args.output_dir.mkdir(parents=True, exist_ok=True)
    meta = checkpoint_metadata(config, result, script=SCRIPT)
    save_checkpoint(result.model, args.output_dir / "model.safetensors", meta)
    facts: dict[str, object] = {k: v for k, v in meta.items() if k != "format"}
    facts["tensors"] = {k: list(v.shape) for k, v in result.model.state_dict().items()}
    facts["command"] = f".venv/bin/python {SCRIPT}"
    (args.output_dir / "model.json").write_text(json.dumps(facts, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
