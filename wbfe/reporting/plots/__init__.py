"""Figures: each drawn on its own matplotlib Figure with an Agg canvas (see ``canvas``), never through pyplot."""
