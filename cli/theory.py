"""``wbfe theory ...``: the theory solvers and their simulation checks, one module per model, registered here."""

from __future__ import annotations

import typer

from ._group import Group

from . import theory_hier, theory_ts

theory_app = typer.Typer(cls=Group, no_args_is_help=True, rich_markup_mode=None)

theory_app.command("solve")(theory_ts.solve_cmd)
theory_app.command("curve")(theory_ts.curve_cmd)
theory_app.command("hmc")(theory_ts.hmc_cmd)
theory_app.command("student")(theory_ts.student_cmd)
theory_app.command("scaling")(theory_ts.scaling_cmd)
theory_app.command("hierarchical")(theory_hier.hierarchical_cmd)
