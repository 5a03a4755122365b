"""One sequence's prompt attention (a plain causal mask, or on AVX-512's paths the band of a
sliding window: _WINDOW_ISAS): on x86 the native kernel
(ember/backend/native/prompt_attend.h: blocks of 16 keys, 32 on AVX-512, met by tiles of a
query head's tokens, with a running softmax, in one pass over the keys); elsewhere two float32
matmuls a block of queries, through oneDNN (ember/backend/gemm.py), with the mask and softmax in
torch between.

A layer's attention over a 512-token prompt, 2 threads, the Xeon of README's Speed section,
ms, the native kernel against the matmuls and torch's SDPA in 64-query blocks
(`benchmarks/bench_prompt_attention.py`; oneDNN held to AVX2 for the avx2 path; 2026-11-28):
avx512 path SmolLM2 1.5 against 4.4 and 2.8, Gemma 3 2.2 against 3.5 and 3.7, Qwen 0.5B 2.3
against 6.2 and 3.7, a 3B shape 7.5 against 17.8 and 15.3; avx2 path 2.5 against 4.9 and 3.1,
3.9 against 4.8 and 4.0, 3.9 against 7.5 and 4.2, 12.9 against 20.3 and 16.1. It takes up to
NATIVE_CELLS cells, and on AVX-512's paths past them: any number on AMD's CPUs, and on Intel's
while a KV head's keys and values take at most half the L2 cache.

torch's flash kernel makes its products with MKL's sgemm, which takes its AVX2 code on AMD
CPUs; oneDNN runs AVX-512 there. A layer's attention over a 512-token prompt, 2 threads, a
Zen 5 EPYC, ms, SDPA in 64-query blocks -> this (`benchmarks/bench_prompt_attention.py`, three
runs on a noisy machine): SmolLM2 2.6-5.0 -> 2.1-2.7, Gemma 3 4.4-6.0 -> 1.9-3.4, Qwen 0.5B
3.8-5.4 -> 2.5-3.9, a 3B shape 16-21 -> 8.3-11.3; a 512-token prefill 4-5% shorter on all three
bundled models (in-process runs alternating five times).

Each KV head's query heads go together as the rows of one product, token-major (a view of q
where one KV head serves all), so the keys are read once for the group. oneDNN keeps the code
it generates for every shape it meets (~0.4 MB each, for good), so the shapes come from a small
set: queries padded to whole blocks, cells rounded up by cells_for; the padded cells are masked
and the padded queries' rows dropped.
"""

import ctypes
import functools
from pathlib import Path

import torch
import torch.nn.functional as F

from ember.backend import gemm, native


def block_for(group: int) -> int:
    """Queries of each head a product takes, for a group of that many query heads: ~512 rows
    at most, a power of two from 16 to 128. Qwen 0.5B's 7 heads took 2.5-5.3 ms a layer with
    128 (896 rows) against 2.9 with 64; Gemma 3's 4 heads 1.9-2.0 with 128, 2.1 with 64, 3.6
    with 256 (bench_prompt_attention.py)."""
    return max(16, min(128, 1 << ((512 // group).bit_length() - 1)))


def cells_for(n: int) -> int:
    """n cells rounded up to the next of the few sizes the products see: multiples of 64 up
    to 1,024, then eight steps an octave (at most 1/8 more)."""
    step = 64 if n <= 1024 else 1 << ((n - 1).bit_length() - 4)
    return -(-n // step) * step


def scores_bytes(num_heads: int, num_kv_heads: int, num_cells: int) -> int:
    """The most bytes one block's scores and weights take together."""
    group = num_heads // num_kv_heads
    return 2 * 4 * group * block_for(group) * cells_for(num_cells)


def available() -> bool:
    """Whether a prompt's attention takes this path: where torch has oneDNN, unless the CPU
    kernels run their generic path (with oneDNN held to SSE4.1 it ran 1.4-1.6x slower than SDPA,
    whose MKL products still ran AVX2; held to AVX2, 0.65-0.96x SDPA's time)."""
    if not gemm.available():
        return False
    kernels = native.usable_kernels()
    return kernels is None or kernels.isa != "generic"


def causal_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> torch.Tensor:
    """q (T, H, D) of the sequence's last T positions; keys, values (H_kv, S, D) float32 of
    all its S cells in order, S >= T -> (T, H * D_v): token i sees cells 0..S-T+i."""
    out = native_attention(q, keys, values, scale)
    return out if out is not None else matmul_attention(q, keys, values, scale)


def matmul_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> torch.Tensor:
    """causal_attention as two oneDNN products a block of queries (the path but x86's)."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, num_cells, _ = keys.shape
    dim_v = values.shape[2]
    group = num_heads // num_kv_heads
    block = block_for(group)
    earlier = num_cells - num_tokens
    padded_cells = cells_for(num_cells)
    out = q.new_empty(num_tokens, num_heads, dim_v)
    for h in range(num_kv_heads):
        heads = slice(h * group, (h + 1) * group)
        # the head's keys (S', D) and its values transposed (D_v, S'), zero cells padded (they
        # are masked): a block takes a row-wise copy of the cells it sees from the values, as
        # oneDNN reads a strided weight at a fraction of its speed
        head_keys = keys[h]
        if padded_cells > num_cells:
            head_keys = F.pad(head_keys, (0, 0, 0, padded_cells - num_cells))
        values_t = values.new_zeros(dim_v, padded_cells)
        values_t[:, :num_cells] = values[h].t()
        for start in range(0, num_tokens, block):
            taken = min(block, num_tokens - start)
            first = earlier + start  # the block's first token's own cell
            seen = cells_for(first + taken)
            # the block's tokens times the group's heads as the rows, token-major (a view of
            # q where all heads share one KV head); the last block padded to block tokens
            rows = q[start : start + taken, heads]
            if taken < block:
                rows = F.pad(rows, (0, 0, 0, 0, 0, block - taken))
            scores = gemm.linear(rows.reshape(block * group, head_dim), head_keys[:seen])
            scores = scores.view(block, group, seen)
            if scale != 1.0:
                scores.mul_(scale)
            scores[:, :, first:] += _tail_mask(block, seen - first)  # the cells after each token's
            weights = torch.softmax(scores, dim=-1).view(block * group, seen)
            part = gemm.linear(weights, values_t[:, :seen].contiguous())
            out[start : start + taken, heads] = part.view(block, group, dim_v)[:taken]
    return out.flatten(1)


# the native kernel's paths: its portable C (generic, NEON) is slower than the matmuls
_NATIVE_ISAS = frozenset({"avx2", "avxvnni", "avx512", "amx"})
# The most cells it takes on every path. Each tile of 4-8 rows reads all the cells' keys and
# values again, from L2 while they fit: past 512 cells (a second batch of a long prompt) the
# kernel on 256-bit registers fell behind the products and SDPA, at 1,024 cells on three of the
# four shapes of bench_prompt_attention.py (--earlier 512: Gemma 3's 14.0 ms against 8.3), at
# 2,048 on all (45 against 19); the avx2 path's still does (2026-11-29: Gemma 3 18.4 against 11.9
# at 1,024, the 3B shape 39.0 against 33.2).
NATIVE_CELLS = 512
# Past them, on AVX-512's paths, while a KV head's keys and values take at most this: there
# (tiles of 8 rows, 512-bit registers) the kernel led up to 1 MiB and fell behind past it
# (bench_prompt_attention.py --earlier E, ms a layer, native against the better of SDPA and the
# products, the Xeon, 2026-11-29): 1,024 cells SmolLM2 4.9 against 8.3, Qwen 0.5B 7.5 against
# 10.7, the 3B shape (1 MiB) 25.1 against 36.6, Gemma 3 (2 MiB) 11.4 against 8.6; 2,048 cells
# SmolLM2 (1 MiB) 10.4 against 14.7, Qwen 0.5B 17.0 against 24.8, Gemma 3 33.6 against 17.4,
# the 3B shape (2 MiB) 82.0 against 73.2.
# That is half this Xeon's L2 (2 MiB a core), where the keys and values stay while the tiles
# reread them; another Intel CPU takes half of its own L2. The Zen 5 EPYC of README's Speed
# section (1 MiB of L2 a core, 32 MiB of L3) reread them fast enough from L3: there the kernel
# led at every length measured, to 8,192 cells (2026-11-29, the same command with --any-length,
# ms a layer, native against the better of SDPA and the products: 2,048 cells SmolLM2 6.4 against
# 7.5, Gemma 3 (4 MiB) 8.9 against 9.4, Qwen 0.5B 9.5 against 18.0, the 3B shape 37.8 against
# 44.7; 8,192 cells 30.7 against 56.9, 64.8 against 62.8, 46.7 against 70.8, 156 against 180), so
# on AMD's CPUs it takes any length.
NATIVE_KV_BYTES = 1 << 20
_WIDE_ISAS = frozenset({"avx512", "amx"})
# The paths whose kernel takes a sliding window's band (one sequence's prompt past the window:
# Gemma 3's local layers after a first batch), where torch's SDPA had computed every cell under
# the mask and then hidden most. Gemma 3's 2,048-token prompt in batches of 512 (2 threads, the
# Xeon, alternated twice): amx 1,471-1,526 -> 1,333-1,409 ms, 4,096 tokens 3,327-3,383 ->
# 3,084-3,159; avx2 (torch held to AVX2) only 2,423-2,456 -> 2,308-2,407, and there its other
# rounding put the long-window reference prompt's top two first logits (0.116 apart in the
# reference) level: not taken on 256-bit registers.
_WINDOW_ISAS = _WIDE_ISAS


def half_of_cache(size: str) -> int:
    """Half of a cache size as Linux writes it ("2048K", "1M"), NATIVE_KV_BYTES where unreadable."""
    units = {"K": 1 << 10, "M": 1 << 20}
    size = size.strip()
    try:
        total = int(size[:-1]) * units[size[-1]] if size[-1:] in units else int(size)
    except ValueError:
        return NATIVE_KV_BYTES
    return total // 2 if total > 0 else NATIVE_KV_BYTES


@functools.cache
def native_kv_bytes() -> int | None:
    """The most bytes of a KV head's keys and values the kernel takes past NATIVE_CELLS on
    AVX-512's paths: half the L2 of an Intel CPU; None (any) on others."""
    if not native.cpu_is_intel():
        return None
    try:
        return half_of_cache(Path("/sys/devices/system/cpu/cpu0/cache/index2/size").read_text())
    except OSError:
        return NATIVE_KV_BYTES


def native_runs(num_cells: int, kv_dims: int) -> bool:
    """Whether causal_attention takes the native kernel here for a sequence of num_cells whose
    keys and values have kv_dims values a cell together (D + D_v)."""
    kern = native.usable_kernels()
    if kern is None or kern.isa not in _NATIVE_ISAS:
        return False
    most = native_kv_bytes()
    wide = kern.isa in _WIDE_ISAS and (most is None or num_cells * kv_dims * 4 <= most)
    return num_cells <= NATIVE_CELLS or wide


def native_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, window: int = 0
) -> torch.Tensor | None:
    """causal_attention by the native kernel (prompt_attend.h), or None where it does not run;
    with window > 0 token i sees only the last `window` of its cells (a sliding window)."""
    kern = native.usable_kernels()
    floats = q.dtype == keys.dtype == values.dtype == torch.float32
    if window > 0 and (kern is None or kern.isa not in _WINDOW_ISAS):
        return None
    # with a window each tile of tokens rereads only its window's cells, as a prompt that long
    reread = min(keys.shape[1], window) if window > 0 else keys.shape[1]
    if not floats or not native_runs(reread, keys.shape[2] + values.shape[2]):
        return None
    assert kern is not None
    q, keys, values = q.contiguous(), keys.contiguous(), values.contiguous()
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, num_cells, dim_v = values.shape
    out = q.new_empty(num_tokens, num_heads * dim_v)
    native.set_threads(torch.get_num_threads())
    rc = kern.prompt_attend(
        q.data_ptr(),
        num_tokens,
        num_heads,
        head_dim,
        keys.data_ptr(),
        values.data_ptr(),
        num_kv_heads,
        num_cells,
        dim_v,
        ctypes.c_float(scale),
        window,
        out.data_ptr(),
    )
    if rc:
        raise native.NativeError(
            f"prompt attention failed ({rc}): q {tuple(q.shape)}, "
            f"keys {tuple(keys.shape)}, values {tuple(values.shape)}"
        )
    return out


@functools.lru_cache(maxsize=16)
def _tail_mask(rows: int, width: int) -> torch.Tensor:
    """(rows, 1, width): -inf where column j comes after row i (j > i)."""
    return torch.full((rows, width), float("-inf")).triu(1)[:, None]
