"""Theory II (docs/math.md §7): sequential feature recovery in a hierarchical model; the target, the spectral
learner, kernel ridge, the predictions and the simulated sweep that compares them."""

from __future__ import annotations

from wbfe.theory.hierarchical.kernel import fit_kernel_ridge, predict_kernel_ridge
from wbfe.theory.hierarchical.model import (ACTIVATIONS, FEATURE_KINDS, FeatureData, HierarchicalTeacher, feature_dim,
                                            hermite_features, make_teacher, sample_data, sym_to_vec, vec_to_sym)
from wbfe.theory.hierarchical.settings import HierarchicalSettings
from wbfe.theory.hierarchical.spectral import (SOLVERS, SpectralFit, fit_spectral, matched_overlaps, moment_operator,
                                               predict_spectral, top_eigenpairs)
from wbfe.theory.hierarchical.sweep import HierarchicalPoint, HierarchicalResult, simulate_hierarchical

__all__ = ["ACTIVATIONS", "FEATURE_KINDS", "SOLVERS", "FeatureData", "HierarchicalTeacher", "SpectralFit",
           "HierarchicalSettings", "HierarchicalPoint", "HierarchicalResult", "feature_dim", "hermite_features",
           "make_teacher", "sample_data", "sym_to_vec", "vec_to_sym", "moment_operator", "top_eigenpairs",
           "fit_spectral", "predict_spectral", "matched_overlaps", "fit_kernel_ridge", "predict_kernel_ridge",
           "simulate_hierarchical"]
