"""``wbfe esd``: draw one matrix's empirical spectral density with its fits."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ._output import shown
from ._options import REF_HELP, Conv, ConvOption, Device


def esd_command(
    ref: Annotated[Optional[str], typer.Argument(help=REF_HELP)] = None,
    *,
    layer: Annotated[str, typer.Option("--layer", help="Tensor name as stored (or module name without .weight).")],
    output: Annotated[str, typer.Option("--output", "-o", help="PNG file to write.")] = "esd.png",
    conv: ConvOption = Conv.flatten,
    device: Device = "auto",
    bins: Annotated[int, typer.Option("--bins", min=2, help="Histogram bins (log-spaced).")] = 60,
) -> None:
    """Plot the ESD of one layer (log-log) with the power-law, truncated power-law and HTMP fits."""
    import wbfe
    from wbfe.options import check_conv, check_device
    from wbfe.render.files import local_reads
    from wbfe.render.text import shape_text
    from wbfe.sources import remote_ref
    from wbfe.reporting.output import check_esd_output, write_esd
    from wbfe.reporting.plots.esd import esd_scale, fit_esd
    from wbfe.scoring import layer_spectrum

    view = check_conv((conv or Conv.flatten).value)
    check_device(device)  # every option before the checkpoint is read

    target = ref if ref is not None else wbfe.default_checkpoint()
    reads = local_reads(target)
    check_esd_output(output, reads=reads)
    if remote_ref(target):  # a hub id or URL names no local path: its files are known once resolved
        refuse_resolved(target, output)
    plan, spec = layer_spectrum(target, layer, conv=view, device=device)
    fits = fit_esd(spec.eigs, spec.gamma)
    k, note = esd_scale(spec.eigs, spec.log_scale)  # a matrix far from 1 is drawn rescaled, and says so
    write_esd(spec.eigs, fits, output, title=f"{plan.name}  {shape_text(plan.shape)}  ({plan.convention})",
              bins=bins, scale_exp2=k, reads=reads)
    typer.echo(f"wrote {shown(output)}" + (f" ({note})" if note else ""), err=True)


def refuse_resolved(target: object, output: str) -> None:
    """Refuse an output over the files the reader resolves for ``target`` (a hub cache's snapshot)."""
    from wbfe.render.files import local_files, refuse_overlap
    from wbfe.sources import open_source

    with open_source(target) as source:  # the files' hash is computed only when asked for: none is read here
        refuse_overlap(output, local_files(source.provenance.files))
