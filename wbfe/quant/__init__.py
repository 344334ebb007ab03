"""Quantized checkpoints, read as float64 weights: FP8 (per tensor, channel or block), MXFP4, GPTQ and AWQ.

:func:`dequantised` turns a source's stream of entries into one where each quantized weight is one
entry that loads the dequantised matrix (its ``quant`` names the scheme) and its scale, zero-point and
group-index tensors are marked as consumed (listed as skipped with that reason, never as matrices).
"""

from wbfe.quant.grouping import dequantised

__all__ = ["dequantised"]
