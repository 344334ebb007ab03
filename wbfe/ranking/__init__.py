"""Rank a model zoo against published quality numbers (docs/ranking.md, docs/math.md §5).

>>> import wbfe
>>> result = wbfe.rank("cifar10-resnet", quality="test_accuracy")   # doctest: +SKIP
>>> result.to_pandas()[["metric", "rho", "ci_low", "ci_high", "p_value", "n"]]   # doctest: +SKIP
"""

from __future__ import annotations

from wbfe.ranking.ranker import Failure, ModelResult, RankResult, expected_sign, rank
from wbfe.ranking.stats import Correlation, correlate
from wbfe.ranking.zoo import BuiltinZoo, Zoo, ZooEntry, list_zoos, load_zoo

__all__ = ["rank", "RankResult", "ModelResult", "Failure", "expected_sign", "Correlation",
           "correlate", "Zoo", "ZooEntry", "BuiltinZoo", "load_zoo", "list_zoos"]
