"""What each metric means, which sign predicts a better model, and the one colour it has in every figure."""

from __future__ import annotations

from wbfe.ranking import expected_sign

__all__ = ["MEANINGS", "colour", "meaning", "sign_text", "base_metric", "HEAD_SOURCES"]

# Column -> one sentence (README "What comes out" and "Spectral metrics").
MEANINGS: dict[str, str] = {
    "bfe": "BFE-W: Bayesian free energy of the weight matrix at the prior precision lambda (docs/math.md §2)",
    "lambda": "prior precision used for BFE-W (lambda* = 1/mean eigenvalue by default)",
    "alpha": "power-law exponent of the ESD tail (WeightWatcher's alpha; 2-6 is the usual trained range)",
    "alpha_weighted": "alpha x log10(largest eigenvalue) (WeightWatcher's alpha-hat)",
    "log_norm": "log10 of the squared Frobenius norm (sum of eigenvalues)",
    "log_spectral_norm": "log10 of the largest eigenvalue",
    "stable_rank": "sum of eigenvalues / largest eigenvalue",
    "log_alpha_norm": "log10 of the sum of eigenvalues to the power alpha",
    "entropy": "matrix entropy of the singular values (1 = flat spectrum)",
    "htmp_kappa": "HTMP shape kappa: small = heavy-tailed, large = Marchenko-Pastur-like (docs/math.md §3)",
    "h": "HTMP effective temperature h of the fitted law",
    "h_star": "h at the free-energy optimum for this lambda and gamma",
    "f_inf": "HTMP free energy F-infinity at lambda",
    "htmp_beta": "HTMP scale beta",
    "htmp_tau": "HTMP shift tau (one eigenvalue spacing below the smallest eigenvalue)",
    "htmp_ks": "Kolmogorov-Smirnov distance of the HTMP fit",
    "tpl_alpha": "exponent of the truncated power law on the same tail",
    "tpl_lambda": "truncation rate of the truncated power law",
    "xmin": "smallest eigenvalue of the power-law tail",
    "num_pl_spikes": "eigenvalues in the power-law tail",
    "norm": "squared Frobenius norm (sum of eigenvalues)",
    "spectral_norm": "largest eigenvalue",
    "matrix_rank": "numerical rank",
    "sigma": "standard error of alpha",
    "bulk_max": "Marchenko-Pastur bulk edge of the fitted MP law",
    "num_spikes": "eigenvalues above the MP bulk edge",
    "mp_softrank": "bulk edge / largest eigenvalue",
    "gamma": "aspect ratio p/P of the matrix (smaller over larger side)",
}

# Fixed per metric (tab10/tab20 hues), so a metric is the same colour on every figure of every page.
_COLOURS: dict[str, str] = {
    "bfe": "#1f77b4", "lambda": "#aec7e8",
    "alpha": "#ff7f0e", "tpl_alpha": "#ffbb78", "alpha_weighted": "#d62728",
    "log_norm": "#2ca02c", "log_spectral_norm": "#98df8a", "stable_rank": "#9467bd", "log_alpha_norm": "#8c564b",
    "entropy": "#e377c2", "htmp_kappa": "#17becf", "h": "#bcbd22", "f_inf": "#7f7f7f",
    # a comparison's change columns
    "rel_frobenius": "#393b79", "w1_log_eigs": "#637939", "stable_rank_delta": "#8c6d31", "overlap_in": "#843c39",
    "overlap_out": "#7b4173",
}
_FALLBACK = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354")

HEAD_SOURCES: dict[str, str] = {
    "option": "named with --head",
    "framework": "given by the model's own framework (the model its config.json describes, a Keras or ONNX "
                 "graph, a GGUF file's output layer)",
    "config": "declared by the checkpoint's format or config (e.g. a tied or declared output layer)",
    "name": "found by its name: the last matrix whose module name ends in lm_head / embed_out, "
            "else classifier / head / fc / linear / logits / output_layer",
    "structure": "inferred from the model's structure (no name matched)",
    "tied": "tied to the input embedding (the output layer shares the embedding's weights)",
}


def base_metric(metric: str) -> str:
    """``bfe_head`` / ``bfe_mean`` / ``d_bfe`` (a comparison's change) -> ``bfe``; a layer column is its own base."""
    metric = metric.removeprefix("d_")
    return metric.rsplit("_", 1)[0] if metric.endswith(("_head", "_mean")) else metric


def colour(metric: str) -> str:
    """The colour of ``metric`` (or of its ``_head``/``_mean`` summary) in every figure."""
    base = base_metric(metric)
    # A stable choice for metrics added later (not hash(): that is salted per process).
    return _COLOURS.get(base) or _FALLBACK[sum(base.encode()) % len(_FALLBACK)]


def meaning(metric: str) -> str:
    """One sentence on what ``metric`` measures ('' when unknown)."""
    return MEANINGS.get(base_metric(metric), "")


def sign_text(metric: str) -> str:
    """The expected sign of ``metric`` against quality, in words."""
    words = {-1: "lower is better (expected ρ < 0)", 1: "higher is better (expected ρ > 0)"}
    return words.get(expected_sign(metric) or 0, "no expected direction")
