"""The command group of ``wbfe`` and its sub-groups: an option given twice is refused, not decided by the last."""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperGroup

__all__ = ["Group", "click_errors"]

# Click's exception classes, wherever this typer keeps them (typer 0.2x vendors click): BadParameter's module.
click_errors: Any = sys.modules[typer.BadParameter.__module__]


class Group(TyperGroup):
    """Refuses an option given more than once to a command (``-f json ... -f csv`` printed CSV without a word);
    an option that takes a list (``--map``, ``--lower-is-better``) is repeatable."""

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name, command, rest = super().resolve_command(ctx, args)
        if command is not None:
            _refuse_repeats(command, name, rest, ctx)
        return name, command, rest


def _refuse_repeats(command: Any, name: Any, args: list[str], parent: Any) -> None:
    sub = command.context_class(command, info_name=name, parent=parent)
    try:
        _, _, order = command.make_parser(sub).parse_args(args=list(args))
    except click_errors.UsageError:
        return  # the command's own parse reports it
    seen: set[str] = set()
    for param in order:
        if getattr(param, "param_type_name", "") != "option" or param.multiple or getattr(param, "count", False):
            continue
        if param.name in seen:
            flags = " / ".join([*param.opts, *param.secondary_opts])
            raise click_errors.UsageError(f"{flags} is given more than once: give it once", ctx=sub)
        seen.add(param.name)
