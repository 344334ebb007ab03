"""Encoders of llama.cpp's K-quant blocks (Q4_K, Q5_K, Q6_K), written from the block layouts of
ggml-quants.h, because the ``gguf`` package can decode these types but not produce them.

Simple min/max quantisation (llama.cpp searches scales more cleverly): the tests need valid blocks
of a known float matrix, decoded by ``gguf``'s own dequantisers, not the best ones. Rows must be a
multiple of 256 values long. Also used by benchmarks/bench_gguf.py.
"""

from __future__ import annotations

import numpy as np

QK_K = 256


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16)


def _pack_scales_k4(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """The 12 bytes holding eight 6-bit scales and eight 6-bit mins (get_scale_min_k4's inverse)."""
    sc = sc.astype(np.uint8)
    mn = mn.astype(np.uint8)
    out = np.empty((sc.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)
    return out


def _affine_k(blocks: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-super-block d, dmin (f16), 6-bit scales and mins, and codes in [0, levels] for y = d·sc·q − dmin·m."""
    sub = blocks.reshape(-1, 8, 32)
    lo = np.minimum(sub.min(axis=-1), 0.0)
    hi = sub.max(axis=-1)
    scale = (hi - lo) / levels
    minus = -lo
    d = _f16(scale.max(axis=-1) / 63.0)
    dmin = _f16(minus.max(axis=-1) / 63.0)
    d32, dmin32 = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d32 > 0, np.clip(np.rint(scale / d32), 0, 63), 0)
        mn = np.where(dmin32 > 0, np.clip(np.rint(minus / dmin32), 0, 63), 0)
        step = (d32 * sc)[..., None]
        q = np.where(step > 0, np.rint((sub + (dmin32 * mn)[..., None]) / step), 0)
    return d, dmin, sc, mn, np.clip(q, 0, levels).astype(np.uint8)


def quantize_q4_k(rows: np.ndarray) -> np.ndarray:
    """Float rows (n, k·256) -> Q4_K bytes (n, k·144)."""
    shape = rows.shape
    blocks = rows.astype(np.float32).reshape(-1, QK_K)
    d, dmin, sc, mn, q = _affine_k(blocks, 15)
    q = q.reshape(-1, 4, 2, 32)
    qs = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(-1, 128)
    out = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2),
                          _pack_scales_k4(sc, mn), qs], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 144)


def quantize_q5_k(rows: np.ndarray) -> np.ndarray:
    """Float rows (n, k·256) -> Q5_K bytes (n, k·176)."""
    shape = rows.shape
    blocks = rows.astype(np.float32).reshape(-1, QK_K)
    d, dmin, sc, mn, q = _affine_k(blocks, 31)  # q: (n, 8, 32)
    low = (q & 0x0F).reshape(-1, 4, 2, 32)
    qs = (low[:, :, 0, :] | (low[:, :, 1, :] << 4)).reshape(-1, 128)
    high = (q >> 4) & 1  # bit j of qh[l] is the high bit of sub-block j's value l
    qh = np.zeros((q.shape[0], 32), dtype=np.uint8)
    for j in range(8):
        qh |= (high[:, j, :] << j).astype(np.uint8)
    out = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2),
                          _pack_scales_k4(sc, mn), qh, qs], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 176)


def quantize_q6_k(rows: np.ndarray) -> np.ndarray:
    """Float rows (n, k·256) -> Q6_K bytes (n, k·210): y = d·scale[g]·(q − 32), 16 groups of 16."""
    shape = rows.shape
    blocks = rows.astype(np.float32).reshape(-1, QK_K)
    groups = blocks.reshape(-1, 16, 16)
    scale = np.abs(groups).max(axis=-1) / 31.0
    d = _f16(scale.max(axis=-1) / 127.0)
    d32 = d.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d32 > 0, np.clip(np.rint(scale / d32), 0, 127), 0)
        step = (d32 * sc)[..., None]
        q = np.where(step > 0, np.rint(groups / step), 0)
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 128)  # two halves of 128
    nib = q & 0x0F
    ql = (nib[:, :, 0:64] | (nib[:, :, 64:128] << 4)).reshape(-1, 128)
    top = (q >> 4) & 0x03
    qh = (top[:, :, 0:32] | (top[:, :, 32:64] << 2) | (top[:, :, 64:96] << 4) | (top[:, :, 96:128] << 6))
    out = np.concatenate([ql, qh.reshape(-1, 64), sc.astype(np.int8).view(np.uint8), d.view(np.uint8).reshape(-1, 2)],
                         axis=1)
    return out.reshape(*shape[:-1], shape[-1] // QK_K * 210)


K_QUANTIZERS = {"Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k, "Q6_K": quantize_q6_k}
