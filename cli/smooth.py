"""``wbfe smooth`` and ``wbfe sharpen``: write an SVD-edited copy of a checkpoint (:mod:`wbfe.editing`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from ._output import shown
from ._options import SmoothMethod, edit_group, with_groups

if TYPE_CHECKING:
    from wbfe.options import EditOptions

__all__ = ["SmoothMethod", "smooth_command", "sharpen_command"]


def _report(summary: Any) -> None:
    left = len(summary.unchanged)
    typer.echo(f"wrote {shown(summary.output)}: {len(summary.edited)} of {summary.n_matrices} weight matrices edited, "
               f"{left} left as {'it was' if left == 1 else 'they were'}", err=True)
    for name, why in summary.unchanged.items():
        typer.echo(f"  unchanged {shown(name)}: {shown(why)}", err=True)


REF = typer.Argument(..., help="Checkpoint: file, folder, org/name[@rev], timm:NAME, torchvision:WEIGHTS.")
OUT = typer.Argument(..., help="The safetensors file to write (replaced atomically).")


def smooth_command(ref: str = REF, out: str = OUT, *, edit: "EditOptions") -> None:
    """Keep the largest singular components of every weight matrix (WeightWatcher's SVDSmoothing)."""
    from wbfe.editing import smooth_checkpoint

    _report(smooth_checkpoint(ref, out, percent=edit.percent, method=edit.method, layers=edit.layers,
                              ww_compatible=edit.ww_compatible))


smooth_command = with_groups(edit_group("percent", "method", "layers", "ww_compatible"))(smooth_command)


def sharpen_command(ref: str = REF, out: str = OUT, *, edit: "EditOptions") -> None:
    """Remove the correlation-trap components of every weight matrix (WeightWatcher's SVDSharpness)."""
    from wbfe.editing import sharpen_checkpoint

    _report(sharpen_checkpoint(ref, out, layers=edit.layers, seed=edit.seed,
                               ww_compatible=edit.ww_compatible))


sharpen_command = with_groups(edit_group("layers", "seed", "ww_compatible"))(sharpen_command)
