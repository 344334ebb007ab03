"""Figures (matplotlib, Agg backend)."""
