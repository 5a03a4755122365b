"""A decoder's file made an embedding model (Qwen3-Embedding as Ollama's library and llama.cpp
ship it: `qwen3` with `qwen3.pooling_type` 3) pools its last token's final hidden state, as
Ollama's qwen3_embed does; the engine's vectors equal HF's Qwen3 last state."""

import pytest
import torch

pytest.importorskip("transformers")

from gguf_copy import read_gguf, write_gguf
from hf_families import convert_family

from ember.gguf import GGUFFile
from ember.model import POOLING_LAST, POOLING_MEAN, load_model
from ember.runner.engine import Engine
from ember.runner.sequence import Done, Request
from ember.tokenizer import Tokenizer

PROMPTS = [[5, 17, 42, 8, 99, 3, 64], [9, 200, 4, 77, 18, 6, 250, 61, 2, 40, 41], [7, 150, 11]]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen3-embedding")
    path, hf = convert_family("qwen3", root)
    reader, tensors = read_gguf(path)
    for pooling, name in ((POOLING_LAST, "last.gguf"), (POOLING_MEAN, "mean.gguf")):
        extra = {"qwen3.pooling_type": pooling}
        write_gguf(reader, root / name, "qwen3", tensors, prefix="qwen3.", extra=extra)
    return root, hf


def embed(path, prompts: list[list[int]]) -> list[list[float]]:
    gguf = GGUFFile.open(path)
    model, tokenizer = load_model(gguf), Tokenizer.from_metadata(gguf.metadata)
    engine = Engine(model, tokenizer, num_parallel=2, num_ctx=64, num_batch=4, kv_type="f32")
    try:
        seqs = [engine.submit(Request(list(p), embedding=True)) for p in prompts]
        out = []
        for seq in seqs:
            while not isinstance(event := seq.events.get(timeout=120), Done):
                pass
            assert event.embedding is not None, event.error
            out.append(event.embedding)
        return out
    finally:
        engine.close()


def hf_states(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf.model(torch.tensor([ids])).last_hidden_state[0]


def test_the_file_pooling_last_embeds_the_last_tokens_state(files):
    root, hf = files
    assert load_model(GGUFFile.open(root / "last.gguf")).pooling_type == POOLING_LAST
    got = torch.tensor(embed(root / "last.gguf", PROMPTS))  # batches of 4: prompts in pieces
    expected = torch.stack([hf_states(hf, p)[-1] for p in PROMPTS])
    assert (got - expected).abs().max() < 1e-4


def test_the_file_pooling_mean_embeds_the_mean(files):
    root, hf = files
    got = torch.tensor(embed(root / "mean.gguf", PROMPTS))
    expected = torch.stack([hf_states(hf, p).mean(0) for p in PROMPTS])
    assert (got - expected).abs().max() < 1e-4
    last = torch.stack([hf_states(hf, p)[-1] for p in PROMPTS])
    assert (got - last).abs().max() > 0.1  # the two poolings are told apart
