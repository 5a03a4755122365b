"""One query token's attention by the native kernel (attend.h), over the cache's keys and values
as they are stored (float32, float16 or bfloat16): no copy of the cache to float32 per step, and
one call for the scores, softmax and weighted sum of every head."""

import ctypes

import torch

from ember.backend import native

_KV_TYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def attend_one(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor | None:
    """q (H, D) float32; keys (H_kv, S, D) and values (H_kv, S, D_v) in a float type, each
    with unit stride along D; mask (1, S) float32 or None -> (1, H * D_v), or None where the
    native kernel cannot run (no library, another dtype or layout)."""
    kern = native.usable_kernels()
    kv_type = _KV_TYPES.get(keys.dtype)
    if (
        kern is None
        or kv_type is None
        or values.dtype != keys.dtype
        or keys.stride(-1) != 1
        or values.stride(-1) != 1
        or q.dtype != torch.float32
    ):
        return None
    q = q.contiguous()
    heads, dim = q.shape
    kv_heads, cells, v_dim = values.shape
    if mask is not None:
        mask = mask.reshape(-1).float().contiguous()
    out = torch.empty(1, heads * v_dim)
    native.set_threads(torch.get_num_threads())
    rc = kern.attend(
        kv_type,
        q.data_ptr(),
        heads,
        dim,
        keys.data_ptr(),
        keys.stride(0),
        keys.stride(1),
        values.data_ptr(),
        values.stride(0),
        values.stride(1),
        kv_heads,
        v_dim,
        cells,
        mask.data_ptr() if mask is not None else None,
        ctypes.c_float(scale),
        out.data_ptr(),
    )
    return out if rc == 0 else None
