"""KV caches: the Cache seam, a causal cache (optionally sliding-window), a per-layer-type
wrapper."""

from ember.kvcache.base import Cache, CacheFullError, ShiftFn
from ember.kvcache.causal import CausalCache
from ember.kvcache.wrapper import WrapperCache

__all__ = ["Cache", "CacheFullError", "CausalCache", "ShiftFn", "WrapperCache"]
