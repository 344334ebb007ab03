"""``wbfe describe``: the matrices a score would analyse, from the checkpoint's headers alone."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ._options import REF_HELP, Conv, ConvOption, Format, Head, Layers, MinEigs, Stream, WwCompatible


def describe_command(
    ref: Annotated[Optional[str], typer.Argument(help=REF_HELP)] = None,
    fmt: Annotated[Format, typer.Option("--format", "-f", help="Output format.")] = Format.table,
    *,
    conv: ConvOption = Conv.flatten,
    layers: Layers = None,
    head: Head = None,
    min_eigs: MinEigs = 10,
    ww_compatible: WwCompatible = False,
    stream: Stream = None,
) -> None:
    """List the matrices a score would analyse (name, shape, N, M, role, form, head) and the tensors it
    would skip, without reading a tensor or computing an eigenvalue."""
    import wbfe
    from wbfe.options import ScoreOptions
    from wbfe.render.text import format_value, text_table

    options = ScoreOptions(metrics=("bfe",), conv=conv.value, layers=layers, head=head, min_eigs=min_eigs,
                           ww_compatible=ww_compatible, stream=stream)
    target = ref if ref is not None else wbfe.default_checkpoint()
    described = wbfe.describe(target, options=options)
    if fmt is Format.json:
        typer.echo(described.to_json())
        return
    rows = [{**m, "shape": "x".join(map(str, m["shape"])), "head": "*" if m["head"] else ""} for m in described.matrices]
    typer.echo(f"model: {format_value(described.model['source'])}  ({described.model['format']})")
    framework = described.model.get("framework")
    if framework is not None:  # which decided head, order and orientation: the framework, or the rules and why
        said = framework.get("model") if framework.get("used") != "rules" else framework.get("why")
        typer.echo(f"framework: {framework.get('used')} ({said})")
    typer.echo("")
    typer.echo(text_table(rows, ("name", "role", "shape", "N", "M", "n_slices", "n_eigs", "form", "dtype", "head")))
    typer.echo(f"\nhead: {described.head} ({described.head_source}); {len(described.matrices)} matrices, "
               f"{len(described.skipped)} tensors skipped (see --format json for each reason)")
