"""KV caches: the Cache seam, a causal cache (optionally sliding-window or chunked), an encoder
cache (cross-attention), short convolutions' state (conv_state.py) and gated DeltaNet's
(recurrent_state.py), a per-layer-type wrapper, the batch-only caches of embedding encoders; keys
and values held as f32, f16, bf16, q8_0 or q4_0 (store.py)."""

from ember.kvcache.base import Cache, CacheFullError, CellCounter, PlainCausal, ShiftFn
from ember.kvcache.bidirectional import BidirectionalCache, NoCache
from ember.kvcache.causal import CausalCache
from ember.kvcache.conv_state import ConvStateCache
from ember.kvcache.encoder import EncoderCache
from ember.kvcache.recurrent_state import RecurrentStateCache
from ember.kvcache.store import KV_TYPES, kv_type_name
from ember.kvcache.wrapper import WrapperCache

__all__ = [
    "KV_TYPES",
    "BidirectionalCache",
    "Cache",
    "CacheFullError",
    "CausalCache",
    "CellCounter",
    "ConvStateCache",
    "EncoderCache",
    "NoCache",
    "PlainCausal",
    "RecurrentStateCache",
    "ShiftFn",
    "WrapperCache",
    "kv_type_name",
]
