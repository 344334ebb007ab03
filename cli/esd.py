"""``wbfe esd``: draw one matrix's empirical spectral density with its fits."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .main import app
from ._options import Conv


@app.command("esd")
def esd_command(
    ref: Optional[str] = typer.Argument(None, help="Checkpoint (as for `wbfe score`). Default: the embedded demo CNN."),
    layer: str = typer.Option(..., "--layer", help="Tensor name as stored (or module name without .weight)."),
    output: str = typer.Option("esd.png", "--output", "-o", help="PNG file to write."),
    conv: Conv = typer.Option(Conv.flatten, "--conv", help="Conv kernels: flatten or slices."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    bins: int = typer.Option(60, "--bins", help="Histogram bins (log-spaced)."),
) -> None:
    """Plot the ESD of one layer (log-log) with the power-law, truncated power-law and HTMP fits."""
    import wbfe
    from wbfe.plots.esd import fit_esd, plot_esd
    from wbfe.scoring import layer_spectrum

    from wbfe.output import check_output

    target = ref if ref is not None else wbfe.default_checkpoint()
    if check_output(output) is None:
        from wbfe.errors import OutputError

        raise OutputError("wbfe esd writes a PNG file; give --output a file name, not '-'")
    plan, spec = layer_spectrum(target, layer, conv=conv.value, device=device)
    fits = fit_esd(spec.eigs, spec.gamma)
    plot_esd(spec.eigs, fits, Path(output), title=f"{plan.name}  {'x'.join(map(str, plan.shape))}  ({plan.convention})", bins=bins)
    typer.echo(f"wrote {output}", err=True)
