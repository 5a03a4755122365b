"""Running embedding encoders in the tests: several inputs' hidden states in one batch, and
embeddings through the runner's engine as /embedding and the server compute them."""

import torch

from ember.batch import Batch
from ember.options import Options
from ember.runner.engine import Engine
from ember.runner.sequence import Done, Request
from ember.server.embedding import normalize
from ember.tokenizer import Tokenizer


def ember_hidden(model, seqs: list[list[int]]) -> list[torch.Tensor]:
    """Several sequences in one batch; each one's hidden states."""
    tokens = [t for s in seqs for t in s]
    positions = [p for s in seqs for p in range(len(s))]
    sequences = [i for i, s in enumerate(seqs) for _ in s]
    batch = Batch(tuple(tokens), tuple(positions), tuple(sequences), tuple(range(len(tokens))))
    cache = model.make_cache()
    cache.start_forward(batch)
    with torch.inference_mode():
        rows = model.hidden(batch, cache)
    return list(rows.split([len(s) for s in seqs]))


def embed(engine: Engine, tokenizer: Tokenizer, texts: list[str]) -> list[list[float]]:
    """As the runner's /embedding and the server's normalize: every text submitted at once."""
    seqs = [engine.submit(Request(tokenizer.encode(t), Options(), embedding=True)) for t in texts]
    out = []
    for seq in seqs:
        while not isinstance(event := seq.events.get(timeout=60), Done):
            pass
        assert event.embedding is not None, event.error
        out.append(normalize(event.embedding))
    return out
