"""``wbfe theory ...``: the theory solvers and their simulation checks.

The commands live in one module per model and attach themselves to :data:`app` on import.
"""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True)


def _register() -> None:
    # The commands attach themselves to `app` on import (one module per model).
    from . import theory_hier, theory_ts  # noqa: F401


_register()
