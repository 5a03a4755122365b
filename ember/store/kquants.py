"""Q4_K, Q5_K and Q6_K encoders in numpy, byte for byte as llama.cpp's quantize_row_q*_K_ref:
the same float32 operations in the same order, vectorised over blocks (Python loops run only
over search steps and the terms of a sum). Rows of whole 256-value blocks in, GGUF bytes out."""

from collections.abc import Callable

import numpy as np

QK_K = 256
_F32 = np.float32
_GROUP_MAX_EPS = _F32(1e-15)  # ggml's threshold under which a group counts as all zeros
_ROUNDER = _F32(12582912.0)  # 1.5 * 2**23: adding it rounds a float32 to an integer
_BATCH_BLOCKS = 1024  # blocks encoded at once: 1 MB float32 arrays stay in cache


def quantize_q4_k(rows: np.ndarray) -> np.ndarray:
    """Q4_K: per 32 values a 6-bit scale and min, 4-bit levels. 144 bytes per block."""
    return _encode(rows, _q4_k_blocks, 144)


def quantize_q5_k(rows: np.ndarray) -> np.ndarray:
    """Q5_K: as Q4_K with 5-bit levels, the fifth bits in 32 bytes qh. 176 bytes per block."""
    return _encode(rows, _q5_k_blocks, 176)


def quantize_q6_k(rows: np.ndarray) -> np.ndarray:
    """Q6_K: per 16 values an int8 scale, 6-bit levels (low 4 bits in ql, high 2 in qh), one
    fp16 super-scale. 210 bytes per block."""
    return _encode(rows, _q6_k_blocks, 210)


def _encode(rows: np.ndarray, encode: Callable[[np.ndarray], np.ndarray], size: int) -> np.ndarray:
    if rows.shape[-1] % QK_K:
        raise ValueError(f"rows of {rows.shape[-1]} values are not whole {QK_K}-value blocks")
    blocks = np.ascontiguousarray(rows, dtype=_F32).reshape(-1, QK_K)
    out = np.empty((len(blocks), size), np.uint8)
    for start in range(0, len(blocks), _BATCH_BLOCKS):
        out[start : start + _BATCH_BLOCKS] = encode(blocks[start : start + _BATCH_BLOCKS])
    return out.reshape(*rows.shape[:-1], rows.shape[-1] // QK_K * size)


def _q4_k_blocks(x: np.ndarray) -> np.ndarray:
    head, levels = _scale_min_blocks(x, nmax=15, rmin=-1.0, nstep=20)
    return np.concatenate([head, _nibbles(levels)], axis=1)


def _q5_k_blocks(x: np.ndarray) -> np.ndarray:
    head, levels = _scale_min_blocks(x, nmax=31, rmin=-0.5, nstep=15)
    fifth = (levels >> 4).reshape(len(levels), 8, 32)  # value 32k + i sets bit k of qh[i]
    qh = np.bitwise_or.reduce(fifth << np.arange(8, dtype=np.uint8)[:, None], axis=1)
    return np.concatenate([head, qh, _nibbles(levels & 0xF)], axis=1)


def _q6_k_blocks(x: np.ndarray) -> np.ndarray:
    groups = _by_element(x, 16)
    scales, levels = _signed_scale_search(groups, nmax=32)
    scales = scales.reshape(len(x), 16)
    peak = np.take_along_axis(scales, np.abs(scales).argmax(axis=1)[:, None], axis=1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = _F32(-128.0) / peak
        d_bytes, d = _fp16(_F32(1.0) / iscale)
        sc = np.minimum(127, _nearest_int(iscale * scales)).astype(np.int8)
        step = (d * sc.astype(_F32)).ravel()
        requantized = np.clip(_nearest_int(groups / step), -32, 31) + 32
    levels = _by_block(np.where(step != 0, requantized, levels), len(x))
    out = np.concatenate([*_q6_k_level_bits(levels), sc.view(np.uint8), d_bytes], axis=1)
    out[np.abs(peak[:, 0]) < _GROUP_MAX_EPS] = 0  # an all-zero block is all zero bytes
    return out


# ---------------------------------------------------------------- Q4_K / Q5_K


def _scale_min_blocks(
    x: np.ndarray, *, nmax: int, rmin: float, nstep: int
) -> tuple[np.ndarray, np.ndarray]:
    """The 16-byte head (d, dmin, packed 6-bit scales and mins) and the levels of each block."""
    sub = _by_element(x, 32)
    av_x = np.sqrt(_running_sum(sub * sub) / _F32(32))
    scales, mins, levels = _scale_min_search(sub, av_x + np.abs(sub), nmax, rmin, nstep)
    scales, mins = scales.reshape(len(x), 8), mins.reshape(len(x), 8)
    max_scale, max_min = np.maximum(scales.max(axis=1), 0), np.maximum(mins.max(axis=1), 0)
    ls, lm = _six_bits(scales, max_scale), _six_bits(mins, max_min)
    d_bytes, d = _fp16(max_scale[:, None] / _F32(63))
    dmin_bytes, dmin = _fp16(max_min[:, None] / _F32(63))
    step = (d * ls.astype(_F32)).ravel()
    offset = (dmin * lm.astype(_F32)).ravel()
    with np.errstate(divide="ignore", invalid="ignore"):
        requantized = np.clip(_nearest_int((sub + offset) / step), 0, nmax)
    levels = np.where(step != 0, requantized, levels)  # a zero step keeps the search's levels
    head = np.concatenate([d_bytes, dmin_bytes, _pack_scales(ls, lm)], axis=1)
    return head, _by_block(levels, len(x))


def _scale_min_search(
    x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, nstep: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """make_qkx2_quants for each column of x (rdelta 0.1, squared error): the scale, the min
    subtracted (>= 0) and the levels in [0, nmax] that minimise the weighted error."""
    lo = x.min(axis=0)
    lo = start = np.where(lo > 0, _F32(0), lo)  # the min is never above 0
    hi = x.max(axis=0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = _F32(nmax) / (hi - lo)
        scale, levels = _F32(1) / iscale, _levels(iscale, x, lo, nmax)
        best = _weighted_error(scale, levels, lo, x, w)
        sum_w, sum_x = _running_sum(w), _running_sum(w * x)
        for step in range(nstep + 1):  # each step starts from the best min so far, as in C
            iscale = (_F32(rmin) + _F32(0.1) * _F32(step) + _F32(nmax)) / (hi - lo)
            trial = _levels(iscale, x, lo, nmax)
            trial_scale, trial_min, solvable = _least_squares(x, w, trial, sum_w, sum_x)
            error = _weighted_error(trial_scale, trial, trial_min, x, w)
            better = solvable & (error < best)
            levels = np.where(better, trial, levels)
            best, scale = np.where(better, error, best), np.where(better, trial_scale, scale)
            lo = np.where(better, trial_min, lo)
    flat = hi == start  # nothing to spread: levels and scale 0, the min as found
    return np.where(flat, _F32(0), scale), -np.where(flat, start, lo), np.where(flat, 0, levels)


def _levels(iscale: np.ndarray, x: np.ndarray, lo: np.ndarray, nmax: int) -> np.ndarray:
    return np.clip(_nearest_int(iscale * (x - lo)), 0, nmax).astype(_F32)


def _least_squares(
    x: np.ndarray, w: np.ndarray, levels: np.ndarray, sum_w: np.ndarray, sum_x: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The weighted least-squares scale and min for fixed levels (min capped at 0), and where
    the system has a solution."""
    wl = w * levels
    sum_l, sum_l2, sum_xl = _running_sum(wl), _running_sum(wl * levels), _running_sum(wl * x)
    det = sum_w * sum_l2 - sum_l * sum_l
    scale = (sum_w * sum_xl - sum_x * sum_l) / det
    minimum = (sum_l2 * sum_x - sum_l * sum_xl) / det
    positive = minimum > 0  # a min above 0 is not allowed: fit the scale alone
    scale = np.where(positive, sum_xl / sum_l2, scale)
    return scale, np.where(positive, _F32(0), minimum), det > 0


def _weighted_error(
    scale: np.ndarray, levels: np.ndarray, minimum: np.ndarray, x: np.ndarray, w: np.ndarray
) -> np.ndarray:
    diff = scale * levels + minimum - x
    return _running_sum(w * (diff * diff))


def _six_bits(values: np.ndarray, largest: np.ndarray) -> np.ndarray:
    """values scaled so that `largest` is 63, as C stores them: int -> uint8, then min 63."""
    inverse = np.divide(_F32(63), largest, out=np.zeros_like(largest), where=largest > 0)
    return np.minimum(_nearest_int(inverse[:, None] * values) & 0xFF, 63).astype(np.uint8)


def _pack_scales(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """ggml's 12-byte packing of 8 six-bit scales and mins: sub-blocks 0-3 in the low 6 bits of
    bytes 0-7, sub-blocks 4-7 in the nibbles of bytes 8-11 plus the top 2 bits of bytes 0-7."""
    low, high = slice(0, 4), slice(4, 8)
    return np.concatenate(
        [
            ls[:, low] | ((ls[:, high] >> 4) << 6),
            lm[:, low] | ((lm[:, high] >> 4) << 6),
            (ls[:, high] & 0xF) | ((lm[:, high] & 0xF) << 4),
        ],
        axis=1,
    )


def _nibbles(levels: np.ndarray) -> np.ndarray:
    """Per 64 values, value 64c + i in the low nibble of byte 32c + i and 64c + 32 + i in its
    high nibble."""
    q = levels.reshape(len(levels), 4, 2, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 4)).reshape(len(levels), QK_K // 2)


# ---------------------------------------------------------------- Q6_K


def _signed_scale_search(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """make_qx_quants(rmse_type=1, no weights) for each column of x: the signed scale and the
    levels in [0, 2 nmax); both 0 for an all-zero group."""
    peak = np.take_along_axis(x, np.abs(x).argmax(axis=0)[None], axis=0)[0]
    w = x * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        levels, sumlx, suml2 = _signed_fit(x, w, _F32(-nmax) / peak, nmax)
        scale = np.where(suml2 != 0, sumlx / suml2, _F32(0))
        best = scale * sumlx
        for step in (*range(-9, 0), *range(1, 10)):
            iscale = -(_F32(nmax) + _F32(0.1) * _F32(step)) / peak
            trial, sumlx, suml2 = _signed_fit(x, w, iscale, nmax)
            better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            levels = np.where(better, trial, levels)
            scale = np.where(better, sumlx / suml2, scale)
            best = np.where(better, scale * sumlx, best)
    zero = np.abs(peak) < _GROUP_MAX_EPS
    return np.where(zero, _F32(0), scale), np.where(zero, _F32(0), levels)


def _signed_fit(
    x: np.ndarray, w: np.ndarray, iscale: np.ndarray, nmax: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Levels (shifted by nmax) for one trial scale, with the sums of w x l and w l l."""
    q = np.clip(_nearest_int(iscale * x), -nmax, nmax - 1).astype(_F32)
    return q + _F32(nmax), _running_sum(w * x * q), _running_sum(w * q * q)


def _q6_k_level_bits(levels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ql and qh: per 128 values, value 128h + 32k + i has its low nibble in ql[64h + 32(k % 2)
    + i] (high nibble when k >= 2) and its top 2 bits at bit 2k of qh[32h + i]."""
    n = len(levels)
    u = levels.reshape(n, 2, 4, 32)
    ql = (u[:, :, :2] & 0xF) | ((u[:, :, 2:] & 0xF) << 4)
    top = (u >> 4) << (2 * np.arange(4, dtype=np.uint8))[:, None]
    return ql.reshape(n, QK_K // 2), np.bitwise_or.reduce(top, axis=2).reshape(n, QK_K // 4)


# ---------------------------------------------------------------- shared


def _by_element(blocks: np.ndarray, group: int) -> np.ndarray:
    """(values in a group, groups): a group's running sums then add whole rows, in order."""
    return np.ascontiguousarray(blocks.reshape(-1, group).T)


def _by_block(levels: np.ndarray, num_blocks: int) -> np.ndarray:
    return levels.T.astype(np.uint8).reshape(num_blocks, QK_K)


def _nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's nearest_int: round half to even through the float32 mantissa (like C, wrong
    beyond +-2**22, where ggml only asserts)."""
    biased = np.add(v, _ROUNDER, dtype=_F32).view(np.int32)
    biased &= 0x7FFFFF
    biased -= 0x400000
    return biased


def _running_sum(a: np.ndarray) -> np.ndarray:
    """The float32 sum of the rows of `a` in order, as C's loops add (np.sum may pair terms
    up and round differently)."""
    total = a[0].copy()
    for row in a[1:]:
        total += row
    return total


def _fp16(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """fp16 bytes of a per-block (n, 1) float32 and the float32 a decoder reads back."""
    with np.errstate(over="ignore"):
        half = values.astype(np.float16)
    return half.view(np.uint8).reshape(len(values), 2), half.astype(_F32)
