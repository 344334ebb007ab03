"""Quantized checkpoints, read as float64 weights: FP8 (per tensor, channel or block), MXFP4, GPTQ, AWQ and
compressed-tensors' integer layouts (:func:`dequantised`; the layouts: docs/checkpoints.md)."""

from wbfe.quant.grouping import dequantised

__all__ = ["dequantised"]
