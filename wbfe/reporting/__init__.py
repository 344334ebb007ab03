"""Rendering: self-contained audit pages (one HTML file or a Markdown folder per scored model, ranked zoo
or comparison; docs/report.md) and the figures of every command (:mod:`wbfe.reporting.plots`).

>>> from wbfe.reporting import score_report, write_report
>>> write_report(score_report(wbfe.score("m.safetensors"), spectra_from="m.safetensors"), "r.html")  # doctest: +SKIP
"""

from __future__ import annotations

from wbfe.reporting.comparison import compare_report
from wbfe.reporting.content import Report
from wbfe.reporting.model import score_report
from wbfe.reporting.output import load_saved, write_esd, write_report
from wbfe.reporting.zoo import rank_report

__all__ = ["Report", "score_report", "rank_report", "compare_report", "load_saved", "write_report", "write_esd"]
