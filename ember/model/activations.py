"""A bound on the memory one batch's activations take, from a model file's tensor shapes alone:
the load-time reservation checks it against free memory instead of computing a worst-case
batch (which on a CPU costs what a full prompt costs and holds nothing once it is done)."""

import re
from dataclasses import dataclass

from ember.backend.weights import CHUNK_ROWS
from ember.gguf import GGUFFile
from ember.nn.attention import SCORES_BYTES

_LAYER = re.compile(r"blk\.(\d+)\.(.+)")
_KV = ("attn_k.weight", "attn_v.weight", "attn_qkv.weight")  # qkv: an upper bound of k and v


@dataclass(frozen=True, slots=True)
class Activations:
    per_token: int  # floats a token's rows hold at once, at most
    per_cell: int  # floats of the keys and values attention reads, a cell
    widest_input: int  # the most columns a weight has (a float32 chunk's width)

    @classmethod
    def of(cls, gguf: GGUFFile, *, experts_used: int = 1) -> "Activations":
        """Each weight of a layer writes one row per token (an expert's, one per routed token),
        so a layer holds at most the sum of its weights' outputs, twice (an elementwise op's
        result beside its inputs), and the residual stream and its norm four times more."""
        outputs: dict[int, int] = {}
        kv: dict[int, int] = {}
        hidden, widest = 0, 0
        for info in gguf.tensors.values():
            if len(info.shape) < 2:
                continue
            widest = max(widest, info.shape[-1])
            found = _LAYER.fullmatch(info.name)
            if found is None:
                if info.name == "token_embd.weight":
                    hidden = info.shape[-1]
                continue
            layer, name = int(found[1]), found[2]
            rows = info.shape[-2] * (experts_used if len(info.shape) == 3 else 1)
            outputs[layer] = outputs.get(layer, 0) + rows
            if name in _KV:
                kv[layer] = kv.get(layer, 0) + info.shape[-2]
        return cls(
            per_token=2 * max(outputs.values(), default=0) + 4 * hidden,
            per_cell=max(kv.values(), default=0),
            widest_input=widest,
        )

    def nbytes(self, tokens: int, cells: int) -> int:
        """Bytes of a batch of tokens that sees cells: its rows, the float32 keys and values it
        attends to (a layer's), a weight's float32 chunk, and attention scores (blocked)."""
        floats = tokens * self.per_token + cells * self.per_cell + CHUNK_ROWS * self.widest_input
        return 4 * floats + 3 * SCORES_BYTES
