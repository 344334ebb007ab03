"""Public alias of :mod:`wbfe.metrics.htmp`, so ``from wbfe import htmp`` works."""

from wbfe.metrics.htmp import *  # noqa: F401,F403
from wbfe.metrics.htmp import __all__  # noqa: F401
