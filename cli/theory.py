"""``wbfe theory ...``: the theory solvers and their simulation checks.

The commands live in one module per model and attach themselves to :data:`app` on import.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(no_args_is_help=True)

for _module in ("wbfe_cli.theory_ts", "wbfe_cli.theory_hier"):
    try:
        importlib.import_module(_module)
    except ModuleNotFoundError as _exc:  # a model whose commands are not written yet
        if _exc.name != _module:
            raise
