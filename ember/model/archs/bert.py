"""BERT encoders (all-MiniLM-L6-v2 and its kin), an embedding-only architecture: learned absolute
positions and token types, bidirectional attention over one sequence's whole input, post-
LayerNorm layers with biases, exact (erf) GELU. `hidden` gives each token's final hidden state;
the runner pools them by the mean (`bert.pooling_type` 1) or takes the first token's ([CLS],
`bert.pooling_type` 2), and the server L2-normalises the result. A cross-encoder
(`bert.pooling_type` 4, rank) scores its [CLS] state with the pooler and classifier heads.

Nothing is cached between batches: the runner puts each input of a non-causal model whole in
one batch (`is_causal`), and the attention mask keeps the batch's sequences apart."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ember.batch import Batch
from ember.errors import EmberError
from ember.gguf import GGUFFile
from ember.kvcache import Cache, NoCache
from ember.model.config import Config, ModelLoadError
from ember.model.registry import register
from ember.model.weights import Weights
from ember.pooling import POOLING_CLS, POOLING_MEAN, POOLING_RANK


class EmbeddingOnlyError(EmberError):
    """A generation asked of an embedding model."""


@dataclass(frozen=True, slots=True)
class BertOptions:
    num_layers: int
    hidden: int
    num_heads: int
    head_dim: int
    ffn: int
    eps: float
    context_length: int
    type_vocab: int
    pooling_type: int

    @classmethod
    def from_config(cls, c: Config) -> "BertOptions":
        hidden, num_heads = c.uint("embedding_length"), c.uint("attention.head_count")
        if hidden % num_heads:
            raise ModelLoadError("bert: embedding_length must be a multiple of head_count")
        if c.metadata.get("bert.attention.causal", False) is not False:
            raise ModelLoadError("bert: only bidirectional (non-causal) attention is supported")
        pooling = c.metadata.get("bert.pooling_type", POOLING_MEAN)
        if pooling not in (POOLING_MEAN, POOLING_CLS, POOLING_RANK):  # what the runner pools by
            raise ModelLoadError(
                f"bert: pooling type {pooling!r} is not supported (mean, CLS or rank)"
            )
        return cls(
            num_layers=c.uint("block_count", maximum=1024),
            hidden=hidden,
            num_heads=num_heads,
            head_dim=hidden // num_heads,
            ffn=c.uint("feed_forward_length"),
            eps=c.float("attention.layer_norm_epsilon", 1e-12),
            context_length=c.uint("context_length", 512, maximum=1 << 20),
            type_vocab=c.uint("tokenizer.ggml.token_type_count", 2, absolute=True),
            pooling_type=pooling,
        )


class Block:
    """One encoder layer, its weights named as in the GGUF (`blk.N.*`)."""

    def __init__(self, w: Weights, i: int, o: BertOptions) -> None:
        p, c = f"blk.{i}.", o.hidden
        names = [p + f"attn_{n}.weight" for n in "qkv"]
        self.attn_qkv = w.fused(names, [c, c, c], c)
        self.qkv_bias = torch.cat([w.tensor(p + f"attn_{n}.bias", (c,)) for n in "qkv"])
        self.attn_output = w.linear(p + "attn_output.weight", c, c)
        self.attn_output_bias = w.tensor(p + "attn_output.bias", (c,))
        self.attn_norm = layer_norm_weights(w, p + "attn_output_norm", c)
        self.ffn_up = w.linear(p + "ffn_up.weight", o.ffn, c)
        self.ffn_up_bias = w.tensor(p + "ffn_up.bias", (o.ffn,))
        self.ffn_down = w.linear(p + "ffn_down.weight", c, o.ffn)
        self.ffn_down_bias = w.tensor(p + "ffn_down.bias", (c,))
        self.out_norm = layer_norm_weights(w, p + "layer_output_norm", c)

    def __call__(self, x: torch.Tensor, mask: torch.Tensor | None, o: BertOptions) -> torch.Tensor:
        t = x.shape[0]
        qkv = (self.attn_qkv(x) + self.qkv_bias).view(t, 3, o.num_heads, o.head_dim)
        q, k, v = qkv.permute(1, 2, 0, 3).unbind(0)  # each (H, T, D)
        h = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # scale 1/sqrt(D)
        h = h.transpose(0, 1).reshape(t, o.hidden)
        x = layer_norm(x + self.attn_output(h) + self.attn_output_bias, self.attn_norm, o.eps)
        up = F.gelu(self.ffn_up(x) + self.ffn_up_bias)  # exact (erf) GELU, as HF's "gelu"
        return layer_norm(x + self.ffn_down(up) + self.ffn_down_bias, self.out_norm, o.eps)


class Encoder:
    """What the embedding encoders share: no cache and no logits, the token types of a batch."""

    is_causal = False  # the runner keeps each input whole in one batch
    token_types: torch.Tensor  # (type_vocab, C)

    def make_cache(self) -> Cache:
        return NoCache()

    def forward(self, batch: Batch, cache: Cache) -> torch.Tensor:
        """An encoder has no logits: its forward pass is `hidden`."""
        return self.hidden(batch, cache)

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        raise NotImplementedError

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise EmbeddingOnlyError("this is an embedding model: it does not generate text")

    def _types(self, batch: Batch) -> torch.Tensor:
        """The token type embedding of each token (T, C), or type 0's row (C) for them all."""
        if not batch.token_types:
            return self.token_types[0]
        types = torch.tensor(batch.token_types)
        if int(types.max()) >= self.token_types.shape[0] or int(types.min()) < 0:
            raise EmberError(f"a token type is outside 0..{self.token_types.shape[0] - 1}")
        return self.token_types[types]


class Bert(Encoder):
    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        w = Weights(gguf)
        o = self.options = BertOptions.from_config(config)
        self.pooling_type = o.pooling_type  # read by the runner's engine
        self.vocab_size = w.vocab_size()
        self.context_length = o.context_length
        self.token_embd = w.embedding("token_embd.weight", self.vocab_size, o.hidden)
        self.position_embd = w.tensor("position_embd.weight", (o.context_length, o.hidden))
        # a batch without token types is all "sentence A" (type 0), as llama.cpp runs BERT
        self.token_types = w.tensor("token_types.weight", (o.type_vocab, o.hidden))
        self.embd_norm = layer_norm_weights(w, "token_embd_norm", o.hidden)
        self.blocks = [Block(w, i, o) for i in range(o.num_layers)]

    def hidden(self, batch: Batch, cache: Cache) -> torch.Tensor:
        """The final hidden state of each output row (one per token for an embedding)."""
        o = self.options
        positions = input_positions(batch, o.context_length)
        x = self.token_embd.lookup(torch.tensor(batch.tokens))
        x = x + self.position_embd[positions] + self._types(batch)
        x = layer_norm(x, self.embd_norm, o.eps)
        mask = sequence_mask(batch)
        for block in self.blocks:
            x = block(x, mask, o)
        return output_rows(x, batch)


class BertRanker(Bert):
    """A BERT cross-encoder (BertForSequenceClassification with one label): the score of an
    input is classifier(tanh(pooler(hidden[CLS]))), as HF's logits[:, 0]."""

    def __init__(self, gguf: GGUFFile, config: Config) -> None:
        super().__init__(gguf, config)
        w, c = Weights(gguf), self.options.hidden
        self.cls = w.tensor("cls.weight", (c, c)), w.tensor("cls.bias", (c,))  # the pooler
        self.cls_output = w.tensor("cls.output.weight", (1, c)), w.tensor("cls.output.bias", (1,))

    def score(self, pooled: torch.Tensor) -> torch.Tensor:
        """(n, C) [CLS] states -> (n,) relevance scores (the raw logit, as llama-server's)."""
        pooled = torch.tanh(F.linear(pooled, *self.cls))
        return F.linear(pooled, *self.cls_output)[:, 0]


def bert(gguf: GGUFFile, config: Config) -> Bert:
    """The encoder of a `bert` file: a ranker where its pooling type says rank."""
    if config.metadata.get("bert.pooling_type") == POOLING_RANK:
        return BertRanker(gguf, config)
    return Bert(gguf, config)


def input_positions(batch: Batch, context_length: int) -> torch.Tensor:
    """Each token's position within its sequence's part of the batch (its whole input)."""
    first: dict[int, int] = {}
    for s, p in zip(batch.sequences, batch.positions, strict=True):
        first.setdefault(s, p)
    positions = torch.tensor(
        [p - first[s] for s, p in zip(batch.sequences, batch.positions, strict=True)]
    )
    if int(positions.max()) >= context_length:
        raise EmberError(f"an input of this model holds at most {context_length} tokens")
    return positions


def sequence_mask(batch: Batch) -> torch.Tensor | None:
    """(T, T) True where a token sees another (its own sequence's); None when all do."""
    sequences = torch.tensor(batch.sequences)
    same = sequences[:, None] == sequences[None, :]
    return None if bool(same.all()) else same


def output_rows(x: torch.Tensor, batch: Batch) -> torch.Tensor:
    """The rows of x (T, C) that the batch outputs."""
    if batch.outputs == tuple(range(len(batch))):
        return x
    return x[torch.tensor(batch.outputs, dtype=torch.long)]


def layer_norm_weights(w: Weights, name: str, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return w.tensor(name + ".weight", (dim,)), w.tensor(name + ".bias", (dim,))


def layer_norm(
    x: torch.Tensor, norm: tuple[torch.Tensor, torch.Tensor], eps: float
) -> torch.Tensor:
    return F.layer_norm(x, norm[0].shape, norm[0], norm[1], eps)


register("bert")(bert)
