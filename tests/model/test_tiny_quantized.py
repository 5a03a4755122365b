"""Tiny models in the real models' weight types, so every block-kernel path runs in the tests.

The bundled models hold Q4_0/Q4_1/Q5_0/Q8_0 and K-quant projections; a tiny F32 model never
reaches those kernels, which is how a 0-row projection (a prefill chunk with no output rows)
crashed every real model while the tiny ones passed. Sizes are multiples of 256 so the K-quants
apply to every projection instead of falling back.
"""

import pytest
import torch
from tinymodels import hf_logits, write_tiny_gguf

from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.model import forward, load_model

ARCHS = ["llama", "qwen2", "gemma3"]
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"]
SIZES = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "head_dim": 64}
PROMPT = [(7 * i + 3) % 150 + 5 for i in range(40)]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_quantized")
    out = {}
    for arch in ARCHS:
        for ggml_type in TYPES:
            path = root / f"{arch}-{ggml_type}.gguf"
            hf = write_tiny_gguf(arch, path, ggml_type=ggml_type, **SIZES)
            out[arch, ggml_type] = load_model(GGUFFile.open(path)), hf
    return out


def run(model, chunk_size: int, *, all_logits: bool) -> torch.Tensor:
    """The prompt fed in chunks of chunk_size; only the last chunk has output rows unless
    all_logits (so every earlier chunk's last layer sees zero output rows)."""
    cache = model.make_cache()
    cache.init(max_sequences=1, capacity=64, max_batch=64)
    rows = []
    for start in range(0, len(PROMPT), chunk_size):
        chunk = PROMPT[start : start + chunk_size]
        last = start + chunk_size >= len(PROMPT)
        outputs = range(len(chunk)) if all_logits else range(len(chunk) - 1, len(chunk))
        batch = Batch(
            tokens=tuple(chunk),
            positions=tuple(range(start, start + len(chunk))),
            sequences=(0,) * len(chunk),
            outputs=tuple(outputs) if all_logits or last else (),
        )
        rows.append(forward(model, cache, batch))
    return torch.cat(rows)


@pytest.mark.parametrize("ggml_type", TYPES)
@pytest.mark.parametrize("arch", ARCHS)
def test_logits_match_transformers_on_the_same_weights(models, arch, ggml_type):
    model, hf = models[arch, ggml_type]
    ours = run(model, len(PROMPT), all_logits=True)
    theirs = hf_logits(hf, PROMPT)
    # The kernels may quantize activations to int8 per block (as llama.cpp): a few per mille,
    # up to 2% on qwen2's Q4_K on the avx2 path (one q8_K pass for q/k/v, gate and up).
    assert (ours - theirs).abs().max() <= 3e-2 * theirs.abs().max()


@pytest.mark.parametrize("ggml_type", TYPES)
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("chunk", [1, 7, 16])
def test_chunks_without_outputs_give_the_last_logits_of_one_batch(models, arch, ggml_type, chunk):
    model, _ = models[arch, ggml_type]
    whole = run(model, len(PROMPT), all_logits=False)
    chunked = run(model, chunk, all_logits=False)
    assert chunked.shape == whole.shape == (1, whole.shape[1])
    # chunks of up to 16 rows take the kernels, the whole prompt float32 matmuls: the K types'
    # single int8 pass over most inputs (llama.cpp's precision) is 1-2% off on these random
    # 256-wide models (one q8_K block a row), held to the real models' reference bar; the
    # 32-element types' prompts round as their rows alone do (int16 codes), ~1e-5
    tolerance = 5e-2 if ggml_type.endswith("_K") else 1e-3
    assert (chunked - whole).abs().max() <= tolerance * whole.abs().max()


@pytest.mark.parametrize("arch", ARCHS)
def test_no_projection_of_a_32_element_type_takes_int8_prompts(models, arch):
    """A prompt's rows of a 32-element type never take gemm8's int8 rounding, the MLP's gate
    and up included (precision.py: Gemma 3's chats), so they round as they would alone."""
    model, _ = models[arch, "Q4_0"]
    layer = model.blocks[0]
    for lin in (layer.attn_qkv, layer.attn_output, layer.ffn_gate_up, layer.ffn_down):
        assert not lin.prefill_int8 and not lin.takes_int8(512)
