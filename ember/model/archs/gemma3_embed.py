"""EmbeddingGemma: Gemma 3's text stack with bidirectional attention (on the sliding layers
within half the sliding window either side, as HF and llama.cpp run it), its final states pooled
(the mean) and projected by sentence-transformers' two bias-free Dense layers. Files as Ollama
writes them (`gemma3` with `gemma3.pooling_type`, `dense.0`/`dense.1`) or as llama.cpp does
(`gemma-embedding`, `dense_2`/`dense_3`); each input is one batch and nothing is cached."""

import torch

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.kvcache import BidirectionalCache, Cache
from ember.model.archs.bert import EmbeddingOnlyError
from ember.model.archs.gemma3 import GLOBAL, Gemma3
from ember.model.config import Config, ModelLoadError
from ember.model.registry import register
from ember.model.weights import Weights
from ember.pooling import POOLING_CLS, POOLING_MEAN

_DENSE_NAMES = (("dense.0.weight", "dense.1.weight"), ("dense_2.weight", "dense_3.weight"))


class Gemma3Embedding(Gemma3):
    is_causal = False  # the runner keeps each input whole in one batch

    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        super().__init__(gguf, config)
        pooling = config.metadata.get(f"{config.arch}.pooling_type", POOLING_MEAN)
        if pooling not in (POOLING_MEAN, POOLING_CLS):
            raise ModelLoadError(f"gemma3 embedding: pooling type {pooling!r} is not supported")
        self.pooling_type = pooling  # read by the runner's engine
        self.dense = _dense_layers(Weights(gguf), self.options.hidden)

    def make_cache(self) -> Cache:
        o = self.options
        half = o.window // 2  # HF's window (w // 2 + 1, exclusive) and llama.cpp's symmetric one
        return BidirectionalCache(
            [None if o.layer_type(i) == GLOBAL else half for i in range(o.num_layers)]
        )

    def forward(self, batch: Batch, cache: Cache) -> torch.Tensor:
        """An embedding model has no logits: its forward pass is `hidden`."""
        return self.hidden(batch, cache)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise EmbeddingOnlyError("this is an embedding model: it does not generate text")

    def project(self, pooled: torch.Tensor) -> torch.Tensor:
        """(n, C) pooled states -> (n, E) embeddings through the Dense layers."""
        for weight in self.dense:
            pooled = pooled @ weight.T
        return pooled


def _dense_layers(w: Weights, hidden: int) -> list[torch.Tensor]:
    """The Dense layers' weights (out, in), chained from the hidden size; none in a file
    without them."""
    names = next((pair for pair in _DENSE_NAMES if w.has(pair[0])), None)
    if names is None:
        return []
    weights, width = [], hidden
    for name in names:
        shape = w.shape(name)
        if len(shape) != 2 or shape[1] != width:
            raise ModelLoadError(f"tensor {name!r} has shape {shape}: it must take {width} inputs")
        weights.append(w.tensor(name, shape))
        width = shape[0]
    return weights


register("gemma-embedding")(Gemma3Embedding)  # llama.cpp's name; gemma3 files: gemma3_vision
