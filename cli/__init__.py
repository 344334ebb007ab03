"""The ``wbfe`` command line (installed as the ``wbfe_cli`` package); thin wrappers over ``wbfe``."""
