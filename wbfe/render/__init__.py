"""Results as text (tables, CSV, JSON-ready data: :mod:`~wbfe.render.text`) and the one writer of
output files (:mod:`~wbfe.render.files`), used by every feature and by the engine's result; and what
other libraries print while wbfe works, held for the command line (:mod:`~wbfe.render.diagnostics`).

The audit pages and figures built on them are :mod:`wbfe.reporting` (with :mod:`wbfe.reporting.plots`),
which imports the features it reports on and so sits above them.
"""
