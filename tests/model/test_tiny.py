"""Invariants on tiny random-weight models of every architecture, against HF transformers."""

import pytest
import torch
from tinymodels import hf_logits, write_tiny_gguf

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.model import forward, load_model

ARCHS = ["llama", "qwen2", "gemma3"]
PROMPT = [5, 17, 42, 8, 99, 3, 64, 21, 7, 150, 11, 12, 13, 14, 15, 16, 30, 31, 32, 33]


@pytest.fixture(scope="module")
def engines(tiny_models):
    return {arch: load_model(GGUFFile.open(tiny_models[arch].path)) for arch in ARCHS}


def run(model, chunks: list[list[int]], *, all_logits: bool = False) -> torch.Tensor:
    """Feeds chunks in order; logits of every token (all_logits) or of each chunk's last."""
    cache = model.make_cache()
    cache.init(max_sequences=1, capacity=64, max_batch=64)
    rows, pos = [], 0
    for chunk in chunks:
        outputs = tuple(range(len(chunk))) if all_logits else (len(chunk) - 1,)
        batch = Batch(
            tokens=tuple(chunk),
            positions=tuple(range(pos, pos + len(chunk))),
            sequences=(0,) * len(chunk),
            outputs=outputs,
        )
        rows.append(forward(model, cache, batch))
        pos += len(chunk)
    return torch.cat(rows)


@pytest.mark.parametrize("arch", ARCHS)
def test_logits_equal_transformers(engines, tiny_models, arch):
    ours = run(engines[arch], [PROMPT], all_logits=True)
    with torch.no_grad():
        theirs = hf_logits(tiny_models[arch].hf, PROMPT)
    assert (ours - theirs).abs().max() < 1e-4


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_decode_equals_prefill(engines, arch):
    full = run(engines[arch], [PROMPT], all_logits=True)
    one_by_one = run(engines[arch], [[t] for t in PROMPT])
    assert (full - one_by_one).abs().max() < 1e-3


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("split", [1, 7, 13])
def test_any_batch_split_gives_the_same_logits(engines, arch, split):
    whole = run(engines[arch], [PROMPT], all_logits=True)
    parts = run(engines[arch], [PROMPT[:split], PROMPT[split:]], all_logits=True)
    assert (whole - parts).abs().max() < 1e-3


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory):
    """One-layer models: their cached keys depend on their own tokens only, so a shifted cache
    must equal a fresh run over the kept tokens exactly (deeper layers mix in dropped tokens)."""
    models = {}
    for arch in ARCHS:
        path = tmp_path_factory.mktemp("one_layer") / f"{arch}.gguf"
        write_tiny_gguf(arch, path, num_hidden_layers=1)
        models[arch] = load_model(GGUFFile.open(path))
    return models


@pytest.mark.parametrize("arch", ARCHS)
def test_context_shift_equals_a_fresh_run_over_kept_tokens(one_layer, arch):
    model = one_layer[arch]
    cache = model.make_cache()
    cache.init(max_sequences=1, capacity=64, max_batch=64)
    forward(model, cache, Batch.single(PROMPT, 0))
    keep, discard = 4, 6
    cache.remove(0, keep, keep + discard)
    kept = PROMPT[:keep] + PROMPT[keep + discard :]
    shifted = forward(model, cache, Batch.single([77], len(kept)))
    fresh = run(model, [[*kept, 77]])
    assert (shifted - fresh).abs().max() < 1e-3
