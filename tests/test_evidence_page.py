"""docs/evidence.md covers every zoo wbfe rank knows: scored (with the HTMP columns beside rank's
default groups, per status) or listed as left out with its reason."""

from __future__ import annotations

import json
from pathlib import Path

from wbfe.ranking.zoo import list_zoos

ROOT = Path(__file__).resolve().parents[1]
RESULTS = json.loads((ROOT / "benchmarks" / "results" / "evidence.json").read_text(encoding="utf-8"))
PAGE = (ROOT / "docs" / "evidence.md").read_text(encoding="utf-8")


def test_every_builtin_zoo_is_scored_or_left_out_with_a_reason():
    for zoo in list_zoos():
        if zoo.name in RESULTS["zoos"]:
            continue
        why = RESULTS["left_out"].get(zoo.name) or RESULTS["missing"].get(zoo.name)
        assert why, zoo.name
        assert f"| `{zoo.name}` | {why} |" in PAGE or f"| `{zoo.name}` | — | not scored: {why} |" in PAGE
    assert set(RESULTS["left_out"]) >= {z.name for z in list_zoos() if not z.offline}


def test_htmp_columns_for_every_zoo_and_status():
    for key, zoo in RESULTS["zoos"].items():
        view = zoo["views"]["module"]
        statuses = [s for s, n in view["counts"].items() if n]
        for metric in ("h_head", "f_inf_head", "htmp_kappa_head", "h_mean", "f_inf_mean", "htmp_kappa_mean"):
            assert metric in view["metric_order"], (key, metric)
            assert {"all", *statuses} <= set(view["metrics"][metric]), (key, metric)
            assert all(m["scores"].get(metric) is not None for m in view["models"]), (key, metric)
    assert PAGE.count("| `htmp_kappa_head` | ") == len(RESULTS["zoos"])
