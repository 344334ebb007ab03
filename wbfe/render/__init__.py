"""Results as text (:mod:`~wbfe.render.text`), the one writer of output files (:mod:`~wbfe.render.files`) and
other libraries' messages held for the command line (:mod:`~wbfe.render.diagnostics`): the base every feature
uses. Pages and figures are :mod:`wbfe.reporting`, which imports the features it reports on."""
