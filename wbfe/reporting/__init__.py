"""Self-contained audit pages: one HTML file (or a Markdown folder) per scored model or ranked zoo.

>>> from wbfe.reporting import score_report, write_report
>>> report = score_report(wbfe.score("model.safetensors"), spectra_from="model.safetensors")  # doctest: +SKIP
>>> write_report(report, "report.html")                                                       # doctest: +SKIP

Modules: :mod:`~wbfe.reporting.content` (the format-neutral document), :mod:`~wbfe.reporting.model`
and :mod:`~wbfe.reporting.zoo` (what a model's or a zoo's page holds), :mod:`~wbfe.reporting.figures`
(matplotlib figures), :mod:`~wbfe.reporting.spectra` (re-reading a few matrices for their ESDs),
:mod:`~wbfe.reporting.page` (HTML) and :mod:`~wbfe.reporting.markdown` (Markdown with figures beside it).
"""

from __future__ import annotations

from wbfe.reporting.comparison import compare_report
from wbfe.reporting.content import Report
from wbfe.reporting.model import score_report
from wbfe.reporting.output import load_saved, write_report
from wbfe.reporting.zoo import rank_report

__all__ = ["Report", "score_report", "rank_report", "compare_report", "load_saved", "write_report"]
