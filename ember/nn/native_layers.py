"""A decode step's layers through the native layer call (ember/backend/layer.py): one call a
layer over the cache's float keys and values in place, for batches of up to MAX_ROWS tokens.
Where any layer cannot run natively (a quantized cache, a layer not stored yet, a cache kind
without cells), nothing is run and the caller takes its Python layers."""

from collections.abc import Callable, Sequence

import torch

from ember.backend.layer import MAX_ROWS, NativeLayer, StepView
from ember.kvcache import Cache, CausalCache, WrapperCache

__all__ = ["RopeTables", "run_native"]

RopeTables = Callable[[int], tuple[torch.Tensor, torch.Tensor]]  # layer -> (cos, sin) (T, dim/2)


def run_native(
    layers: Sequence[NativeLayer] | None, x: torch.Tensor, cache: Cache, tables: RopeTables
) -> torch.Tensor | None:
    """x (T, C) through every layer (a new tensor), or None where the step must go in Python."""
    if layers is None or not 0 < x.shape[0] <= MAX_ROWS:
        return None
    stored: list[tuple[CausalCache, tuple[torch.Tensor, torch.Tensor]]] = []
    for i in range(len(layers)):
        cache.set_layer(i)
        layer_cache = cache.current if isinstance(cache, WrapperCache) else cache
        if not isinstance(layer_cache, CausalCache):
            return None
        kv = layer_cache.stored_floats()
        if kv is None:
            return None
        stored.append((layer_cache, kv))
    # each cache's view and each RoPE table's addresses once a step, not once a layer
    views: dict[int, tuple[StepView, tuple[int, int, int, int | None]]] = {}
    ropes: dict[int, tuple[tuple[torch.Tensor, torch.Tensor], tuple[int, int]]] = {}
    threads = torch.get_num_threads()
    x = x.float().contiguous().clone()
    for i, (layer, (c, (keys, values))) in enumerate(zip(layers, stored, strict=True)):
        view = views.get(id(c))
        if view is None:
            mask = None if c.mask is None else c.mask.float().contiguous()
            kept = StepView(c.locs.long().contiguous(), c.lo, c.hi - c.lo, mask)
            view = views[id(c)] = kept, kept.fields()
        cos_sin = tables(i)
        rope = ropes.get(id(cos_sin))
        if rope is None:  # the tables kept with their addresses: their id stays theirs
            rope = ropes[id(cos_sin)] = cos_sin, (cos_sin[0].data_ptr(), cos_sin[1].data_ptr())
        layer(x, rope[1], keys, values, view[1], threads)
    return x
