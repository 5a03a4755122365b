"""A llama text model whose prompts may hold images: each image's embeddings replace its
placeholder rows of the token embeddings, unscaled, under the usual causal attention (llava's
and Mistral 3's way; Gemma 3 adds bidirectional attention and keeps its own)."""

from collections.abc import Sequence

import torch

from ember.batch import Batch
from ember.kvcache import Cache
from ember.model.archs.llama import Llama


class LlamaWithImages(Llama):
    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        images = [t for t in batch.multimodal_data if isinstance(t, torch.Tensor)]
        return self.hidden_with_images(batch, cache, images)

    def hidden_with_images(
        self, batch: Batch, cache: Cache, images: Sequence[torch.Tensor]
    ) -> torch.Tensor:
        """As Llama.hidden, batch.multimodal[i] being the first row of images[i]'s embeddings."""
        x = self.token_embd.lookup(torch.tensor(batch.tokens))  # (T, C)
        for start, rows in zip(batch.multimodal, images, strict=True):
            x[start : start + len(rows)] = rows
        return self.layers(x, batch, cache)
