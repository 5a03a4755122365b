"""KV caches: the Cache seam, a causal cache (optionally sliding-window or chunked), an encoder
cache (cross-attention), a per-layer-type wrapper."""

from ember.kvcache.base import Cache, CacheFullError, ShiftFn
from ember.kvcache.causal import CausalCache
from ember.kvcache.encoder import EncoderCache
from ember.kvcache.wrapper import WrapperCache

__all__ = ["Cache", "CacheFullError", "CausalCache", "EncoderCache", "ShiftFn", "WrapperCache"]
