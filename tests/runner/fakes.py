"""A fake model and tokenizer whose outputs are exact, to drive the runner with token lists.

Token i (0..25) is the text of letter i written twice ("aa", "bb", ...); EOS is 26. The model
predicts, greedily, the successor of a sequence's last token ((t + 1) mod 26), or EOS after
`eos_after`; with `batch_dependent`, (t + n) mod 26 for a token in a batch of n tokens. Through
a real CausalCache it stores each token's position as its key and its id as its value, and
records, for every output row, the context its attention saw: so a test can check sequences,
causality, prefix reuse and shifts with plain lists.
"""

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from ember.batch import Batch
from ember.kvcache import Cache, CausalCache
from ember.tokenizer.tokenizer import StreamDecoder

EOS = 26
VOCAB = 27


class FakeTokenizer:
    eos_ids = frozenset({EOS})
    vocab_size = VOCAB
    # adds no token around a text (an embedding's cut keeps none)
    vocabulary = SimpleNamespace(add_bos=False, bos_id=None, add_eos=False, eos_id=None)

    def token_bytes(self, id: int) -> bytes:
        return b"</s>" if id == EOS else bytes([97 + id]) * 2

    def stream_decoder(self) -> StreamDecoder:
        return StreamDecoder(self.token_bytes)

    def text(self, ids: list[int]) -> str:
        return "".join(self.token_bytes(i).decode() for i in ids)


@dataclass
class Seen:
    """What one output row of a batch attended to."""

    seq: int
    position: int
    tokens: list[int]  # the visible tokens, by position
    positions: list[int]  # their positions as the cache's keys hold them


@dataclass
class FakeModel:
    eos_after: int | None = None
    batch_dependent: bool = False
    context_length: int = 1 << 16
    vocab_size: int = VOCAB
    batches: list[Batch] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)

    def make_cache(self) -> Cache:
        # keys hold positions: a shift by delta moves them, as RoPE re-rotation would
        return CausalCache(shift=lambda layer, k, delta: k + delta[None, :, None].to(k.dtype))

    def forward(self, batch: Batch, cache: Cache) -> torch.Tensor:
        return self.logits(self.hidden(batch, cache))

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        self.batches.append(batch)
        cache.set_layer(0)
        positions = torch.tensor(batch.positions, dtype=torch.float32).view(-1, 1, 1)
        tokens = torch.tensor(batch.tokens, dtype=torch.float32).view(-1, 1, 1)
        cache.put(positions, tokens)
        keys, values, mask = cache.get()
        for o in batch.outputs:
            visible = torch.ones(keys.shape[1], dtype=torch.bool) if mask is None else mask[o] == 0
            pos, tok = keys[0, visible, 0], values[0, visible, 0]
            order = pos.argsort()
            self.seen.append(
                Seen(
                    batch.sequences[o],
                    batch.positions[o],
                    [int(t) for t in tok[order]],
                    [int(p) for p in pos[order]],
                )
            )
        rows = [[float(batch.tokens[o]), float(batch.positions[o])] for o in batch.outputs]
        if self.batch_dependent:  # (a third column: the logits read it)
            rows = [[*row, float(len(batch.tokens))] for row in rows]
        return torch.tensor(rows)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        out = torch.full((hidden.shape[0], VOCAB), -10.0)
        steps = hidden[:, 2].long().tolist() if hidden.shape[1] > 2 else [1] * hidden.shape[0]
        for r, (token, step) in enumerate(zip(hidden[:, 0].long().tolist(), steps, strict=True)):
            nxt = EOS if token == self.eos_after else (token + step) % 26
            out[r, nxt] = 10.0
        return out

    def clear(self) -> None:
        self.batches.clear()
        self.seen.clear()
