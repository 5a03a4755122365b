"""The decoder's quantized weights, moved into one anonymous mapping after the load
(backend/arena.py): the same bytes, the same results, the file's pages given back."""

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from ember.backend import arena
from ember.backend.weights import NativeLinear
from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.model import forward, load_model

Q8_0 = GGMLQuantizationType.Q8_0


def _q8_linear(rows: int, cols: int, seed: int) -> NativeLinear:
    w = np.random.default_rng(seed).standard_normal((rows, cols), dtype=np.float32)
    return NativeLinear(quants.quantize(w, Q8_0), int(Q8_0), rows, cols)


def test_settle_moves_each_weight_next_to_the_last_and_keeps_its_results():
    weights = [_q8_linear(5, 64, 0), _q8_linear(3, 96, 1), _q8_linear(7, 32, 2)]
    x = torch.randn(3, 128)
    before = [w(x[:, : w.in_features]) for w in weights]
    originals = [w.raw for w in weights]
    released: list[torch.Tensor] = []
    assert arena.settle(weights, released.append) == []  # every one moved
    sizes = [-(-t.numel() // arena.ALIGN) * arena.ALIGN for t in originals]
    assert {id(t) for t in originals} <= {id(t) for t in released}  # and its chunks before it
    start = weights[0].raw.data_ptr()
    assert start % arena.ALIGN == 0
    for w, old, y, offset in zip(weights, originals, before, np.cumsum([0, *sizes]), strict=False):
        assert w.raw.data_ptr() == start + offset  # one mapping, in order
        assert torch.equal(w.raw, old) and w.raw.data_ptr() != old.data_ptr()
        assert torch.equal(w(x[:, : w.in_features]), y)


def test_a_loaded_model_reads_its_blocks_from_the_arena_and_its_head_after_two_calls(
    tmp_path, monkeypatch
):
    import tinymodels

    path = tmp_path / "llama-q8.gguf"
    tinymodels.write_tiny_gguf("llama", path, ggml_type="Q8_0")
    batch = Batch.single([3, 9, 27, 11, 5], 0)

    def logits(model) -> torch.Tensor:
        cache = model.make_cache()
        cache.init(max_sequences=1, capacity=8, max_batch=8)
        return forward(model, cache, batch)

    gguf = GGUFFile.open(path)
    first = next(iter(gguf.tensors))
    file_start = gguf.raw(first).ctypes.data - gguf.tensors[first].offset

    def in_file(w: NativeLinear) -> bool:
        return file_start <= w.raw.data_ptr() < file_start + path.stat().st_size

    model = load_model(gguf)
    blocks = arena.linears_of(model.blocks)
    assert len(blocks) == 4 * len(model.blocks)  # q/k/v, out, gate/up, down
    assert not any(in_file(w) for w in blocks)
    assert in_file(model.output) and model.output.after_call is not None
    moved = logits(model)
    assert in_file(model.output)  # the prompt's call: it moves after the next one
    assert torch.equal(logits(model), moved)
    assert not in_file(model.output) and model.output.after_call is None
    last = max(blocks, key=lambda w: w.raw.data_ptr())  # the place kept after the blocks'
    end = last.raw.data_ptr() + last.raw.numel()
    assert model.output.raw.data_ptr() == end + (-end) % arena.ALIGN
    monkeypatch.setattr(arena, "settle_decoder", lambda model, release: None)
    unmoved = load_model(GGUFFile.open(path))
    assert torch.equal(moved, logits(unmoved)) and torch.equal(logits(model), moved)
