"""wbfe: data-free model-quality auditing from pretrained weights.

>>> import wbfe
>>> result = wbfe.score("path/to/model.safetensors")          # doctest: +SKIP
>>> result.summary["bfe_head"], result.to_pandas()             # doctest: +SKIP

Heavy dependencies (torch, scipy) are imported on first use, not by ``import wbfe``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from wbfe import errors as _errors
from wbfe.errors import (  # noqa: F401 - exported: __all__ lists them, below, from wbfe.errors' own list
    CorruptCheckpointError, InvalidOptionError, MissingDependencyError, ModelNotFoundError, NoUsableMatrixError,
    SourceNotFoundError, TruncatedCheckpointError, UnknownNameError, UnsafePickleError, UnsupportedDtypeError, WbfeError,
)

__version__ = "0.1.0"

__all__ = [
    "__version__", "score", "ModelScore", "ScoreOptions", "default_checkpoint", "rank", "RankResult",
    "compare", "Comparison", "describe", "Description", "esd", "htmp", "sparsity", "prune", "Allocation", "PruneReport",
]
__all__ += [name for name in _errors.__all__ if name in globals()]  # the errors imported above

_LAZY = {name: f"{module}:{name}" for module, names in (
    ("wbfe.scoring", "score ModelScore ScoreOptions"), ("wbfe.fixtures", "default_checkpoint"),
    ("wbfe.ranking", "rank RankResult"), ("wbfe.comparison", "compare Comparison"),
    ("wbfe.pruning", "sparsity prune Allocation PruneReport"), ("wbfe.description", "describe Description esd"),
) for name in names.split()} | {"htmp": "wbfe.metrics.htmp:"}

if TYPE_CHECKING:
    from wbfe.fixtures import default_checkpoint
    from wbfe.pruning import Allocation, PruneReport, prune, sparsity
    from wbfe.scoring import ModelScore, ScoreOptions, score


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'wbfe' has no attribute {name!r}")
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    value = getattr(module, attr) if attr else module
    globals()[name] = value
    return value
