"""``wbfe describe``: the matrices a score would analyse, from the checkpoint's headers alone."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from ._notes import third_party_notes
from ._output import emit, output_format
from ._options import REF_HELP, Format, score_group, with_groups

if TYPE_CHECKING:
    from wbfe.description import Description
    from wbfe.options import ScoreOptions


def describe_command(
    ref: Annotated[Optional[str], typer.Argument(help=REF_HELP)] = None,
    fmt: Annotated[Optional[Format], typer.Option(
        "--format", "-f", help="Output format. Default: json where --output is named *.json, else table.")] = None,
    output: Annotated[Optional[str], typer.Option(
        "--output", "-o", help="Write the description to this file instead of stdout ('-': stdout).")] = None,
    verbose: Annotated[bool, typer.Option(
        "--verbose", "-v", help="Each message other libraries (transformers) gave, once.")] = False,
    quiet: Annotated[bool, typer.Option(
        "--quiet", "-q", help="Nothing on stderr but errors: no 'wrote FILE', no other libraries' messages.")] = False,
    *,
    score: "ScoreOptions",
) -> None:
    """List the matrices a score would analyse (name, shape, N, M, role, form, head) and the tensors it
    would skip, without reading a tensor or computing an eigenvalue."""
    import wbfe
    from wbfe.render.files import check_output, local_reads

    target = ref if ref is not None else wbfe.default_checkpoint()
    reads = local_reads(target)
    written = check_output(output, reads=reads) if output is not None else None  # before any work
    chosen = output_format(fmt.value if fmt is not None else None, output, [f.value for f in Format])
    with third_party_notes(verbose=verbose, quiet=quiet):
        described = wbfe.describe(target, options=score)
        text = described.to_json() + "\n" if chosen == "json" else _table(described)
        emit(text, output, written, reads, described.model.get("files"), quiet=quiet)


def _options(**values: Any) -> "ScoreOptions":
    from wbfe.description import describe_options

    return describe_options(**values)


describe_command = with_groups(dataclasses.replace(
    score_group("conv", "layers", "head", "min_eigs", "ww_compatible", "stream"), build=_options))(describe_command)


def _table(described: "Description") -> str:
    from wbfe.render.text import format_value, shape_text, skipped_line, text_table

    rows = [{**m, "shape": shape_text(m["shape"]), "head": "*" if m["head"] else ""} for m in described.matrices]
    lines = [f"model: {format_value(described.model['source'])}  ({described.model['format']})"]
    framework = described.model.get("framework")
    if framework is not None:  # which decided head, order and orientation: the framework, or the rules and why
        said = framework.get("model") if framework.get("used") != "rules" else framework.get("why")
        lines.append(f"framework: {framework.get('used')} ({said})")
    lines.append("")
    lines.append(text_table(rows, ("name", "role", "shape", "N", "M", "n_slices", "n_eigs", "form", "dtype", "head")))
    lines.append(f"\nhead: {described.head} ({described.head_source}); {len(described.matrices)} matrices")
    if described.skipped:
        lines.append(skipped_line(described.skipped))
    return "\n".join(lines) + "\n"
