"""``wbfe smooth`` and ``wbfe sharpen``: write an SVD-edited copy of a checkpoint (see :mod:`wbfe.editing`).

Registered by the entry module (:mod:`wbfe_cli.main`).
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Optional

import typer

__all__ = ["SmoothMethod", "smooth_command", "sharpen_command"]


WW_HELP = "Reproduce WeightWatcher 0.7.7's edit exactly (its layers, counts and randomised truncated SVD)."


class SmoothMethod(str, Enum):
    """How many singular components ``wbfe smooth`` keeps."""

    svd = "svd"
    detx = "detx"


def _report(summary: Any) -> None:
    left = len(summary.unchanged)
    typer.echo(f"wrote {summary.output}: {len(summary.edited)} of {summary.n_matrices} weight matrices edited, "
               f"{left} left as {'it was' if left == 1 else 'they were'}", err=True)
    for name, why in summary.unchanged.items():
        typer.echo(f"  unchanged {name}: {why}", err=True)


def smooth_command(
    ref: str = typer.Argument(..., help="Checkpoint: file, folder, org/name[@rev], timm:NAME, torchvision:WEIGHTS."),
    out: str = typer.Argument(..., help="The safetensors file to write (replaced atomically)."),
    percent: float = typer.Option(0.8, "--percent", help="Fraction of the singular components kept (method svd)."),
    method: SmoothMethod = typer.Option(SmoothMethod.svd, "--method", help="svd: a fixed fraction; detx: the det X = 1 tail."),
    layers: Optional[str] = typer.Option(None, "--layers", help="Only tensors whose name matches this regular expression."),
    ww_compatible: bool = typer.Option(False, "--ww-compatible", help=WW_HELP),
) -> None:
    """Keep the largest singular components of every weight matrix (WeightWatcher's SVDSmoothing)."""
    from wbfe.editing import smooth_checkpoint

    _report(smooth_checkpoint(ref, out, percent=percent, method=method.value, layers=layers,
                              ww_compatible=ww_compatible))


def sharpen_command(
    ref: str = typer.Argument(..., help="Checkpoint: file, folder, org/name[@rev], timm:NAME, torchvision:WEIGHTS."),
    out: str = typer.Argument(..., help="The safetensors file to write (replaced atomically)."),
    layers: Optional[str] = typer.Option(None, "--layers", help="Only tensors whose name matches this regular expression."),
    seed: int = typer.Option(0, "--seed", help="Seed of the permutations that find the correlation traps."),
    ww_compatible: bool = typer.Option(False, "--ww-compatible", help=WW_HELP),
) -> None:
    """Remove the correlation-trap components of every weight matrix (WeightWatcher's SVDSharpness)."""
    from wbfe.editing import sharpen_checkpoint

    _report(sharpen_checkpoint(ref, out, layers=layers, seed=seed, ww_compatible=ww_compatible))
