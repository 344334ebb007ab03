"""Figures: each drawn on its own matplotlib Figure with an Agg canvas (see ``_canvas``), never through pyplot."""
