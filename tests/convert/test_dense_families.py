"""The dense text families converted from tiny random-weight HF models (transformers' own
classes): logits equal HF's, incremental decode equals a prefill, two sequences in one batch
equal each alone, and the GGUF loads under its own architecture name."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from hf_families import save_family
from tinymodels import hf_logits

from ember.batch import Batch
from ember.convert import convert_directory
from ember.gguf import GGUFFile
from ember.model import forward, load_model

# family -> GGUF architecture
FAMILIES = {
    "qwen3": "qwen3",
    "mistral": "llama",
    "gemma2": "gemma2",
    "olmo2": "olmo2",
    "qwen2-yarn": "qwen2",
    "olmo3": "olmo3",
    "phi3": "phi3",
    "phi3-longrope": "phi3",
    "granite": "granite",
}
# families whose blocks bind the native layer call
NATIVE_LAYERS = ("qwen3", "mistral", "qwen2-yarn")
PROMPT = [5, 17, 42, 8, 99, 3, 64, 21, 7, 150, 11, 12, 13, 14, 15, 16, 30, 31, 32, 33]
OTHER = [9, 200, 4, 77, 18, 6, 250, 61, 2, 40, 41]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    out = {}
    for family in FAMILIES:
        root = tmp_path_factory.mktemp(family)
        hf = save_family(family, root / "hf")
        convert_directory(root / "hf", root / "model.gguf")
        out[family] = (root / "model.gguf", hf)
    return out


def run(model, chunks: list[list[int]]) -> torch.Tensor:
    """Feeds one sequence chunk by chunk; the logits of every token."""
    cache = model.make_cache()
    cache.init(max_sequences=2, capacity=64, max_batch=64)
    rows, pos = [], 0
    for chunk in chunks:
        batch = Batch(tokens=tuple(chunk), positions=tuple(range(pos, pos + len(chunk))),
                      sequences=(0,) * len(chunk), outputs=tuple(range(len(chunk))))  # fmt: skip
        rows.append(forward(model, cache, batch))
        pos += len(chunk)
    return torch.cat(rows)


def load(path: Path):
    return load_model(GGUFFile.open(path))


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers(converted, family):
    path, hf = converted[family]
    with GGUFFile.open(path) as f:
        assert f.metadata["general.architecture"] == FAMILIES[family]
    assert (run(load(path), [PROMPT]) - hf_logits(hf, PROMPT)).abs().max() < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_incremental_decode_equals_prefill(converted, family):
    model = load(converted[family][0])
    full = run(model, [PROMPT])
    assert (run(model, [PROMPT[:5]] + [[t] for t in PROMPT[5:]]) - full).abs().max() < 1e-4


def run_both(model) -> torch.Tensor:
    """PROMPT and OTHER as two sequences of one batch; the logits of every token."""
    cache = model.make_cache()
    cache.init(max_sequences=2, capacity=64, max_batch=64)
    tokens = PROMPT + OTHER
    batch = Batch(tokens=tuple(tokens),
                  positions=tuple(range(len(PROMPT))) + tuple(range(len(OTHER))),
                  sequences=(0,) * len(PROMPT) + (1,) * len(OTHER),
                  outputs=tuple(range(len(tokens))))  # fmt: skip
    return forward(model, cache, batch)


def batch_error(model) -> float:
    """How far PROMPT and OTHER in one batch are from each run alone."""
    alone = torch.cat([run(model, [PROMPT]), run(model, [OTHER])])
    return float((run_both(model) - alone).abs().max())


def stepped_error(model, expected: torch.Tensor, tokens: list[int]) -> float:
    """The larger distance from expected (the reference's logits over tokens) of the model's,
    over the whole prompt and over its first 20 tokens then one token a step."""
    steps = ([tokens], [tokens[:20], *[[t] for t in tokens[20:]]])
    return max(float((run(model, chunks) - expected).abs().max()) for chunks in steps)


@pytest.mark.parametrize("family", FAMILIES)
def test_two_sequences_in_one_batch_equal_each_alone(converted, family):
    model = load(converted[family][0])
    both = run_both(model)
    alone = torch.cat([run(model, [PROMPT]), run(model, [OTHER])])
    assert (both - alone).abs().max() < 1e-4


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory):
    """One-layer models: their cached keys depend on their own tokens only, so a shifted cache
    must equal a fresh run over the kept tokens (deeper layers mix in dropped tokens)."""
    out = {}
    for family in FAMILIES:
        root = tmp_path_factory.mktemp(f"{family}-1")
        save_family(family, root / "hf", num_hidden_layers=1)
        convert_directory(root / "hf", root / "model.gguf")
        out[family] = load(root / "model.gguf")
    return out


def shift_error(model) -> float:
    """How far the next logits after a context shift (4 tokens kept, 6 dropped) are from a
    fresh run over the kept tokens: ~0 when the shift re-rotates the cached keys right."""
    cache = model.make_cache()
    cache.init(max_sequences=1, capacity=64, max_batch=64)
    forward(model, cache, Batch.single(PROMPT, 0))
    keep, discard = 4, 6
    cache.remove(0, keep, keep + discard)
    kept = PROMPT[:keep] + PROMPT[keep + discard :]
    shifted = forward(model, cache, Batch.single([77], len(kept)))
    return float((shifted - run(model, [[*kept, 77]])[-1:]).abs().max())


@pytest.mark.parametrize("family", FAMILIES)
def test_context_shift_equals_a_fresh_run_over_kept_tokens(one_layer, family):
    assert shift_error(one_layer[family]) < 1e-4


@pytest.mark.parametrize("family", FAMILIES)
def test_a_q8_0_quantized_file_loads_and_stays_close(converted, family, tmp_path):
    """Ember's quantizer (llama.cpp's per-tensor choices) on the converted file: the quantized
    GGUF loads (fused phi3 tensors, QK-norms and post-norms kept F32) and its logits stay close."""
    from ember.store.quantize import quantize

    path, _ = converted[family]
    out = tmp_path / "q8_0.gguf"
    with out.open("wb") as f:
        for _ in quantize(path, f, "Q8_0"):  # type: ignore[arg-type]  # any .write() will do
            pass
    with GGUFFile.open(out) as g:
        assert g.metadata["general.file_type"] == 7  # MOSTLY_Q8_0
    full, quantized = run(load(path), [PROMPT]), run(load(out), [PROMPT])
    assert (quantized - full).abs().max() < 0.1 * (full.max() - full.min())
    if family in NATIVE_LAYERS:  # decode steps through the native layer call, as the Python's
        model, steps = load(out), [PROMPT[:12], *[[t] for t in PROMPT[12:]]]
        assert model.native_layers() is not None
        native = run(model, steps)
        model._native = None
        python = run(model, steps)
        assert (native - python).abs().max() < 1e-4 * python.abs().max()


@pytest.mark.parametrize("family", FAMILIES)
def test_show_reports_completion_for_each_family(converted, family):
    """/api/show's capabilities come from metadata and template, whatever the architecture: a
    converted text model completes (never `embedding`), with tools and thinking as its template
    says."""
    from types import SimpleNamespace

    from ember.server.model_show import capabilities

    with GGUFFile.open(converted[family][0]) as f:
        metadata = dict(f.metadata)
    plain = SimpleNamespace(template=None, projector_paths=())
    assert capabilities(metadata, plain) == ["completion"]  # type: ignore[arg-type]
    thinking = (
        "{% if tools %}{{ tools }}{% endif %}{% for m in messages %}{% if m.thinking %}<think>"
        "{{ m.thinking }}</think>{% endif %}{{ m.content }}{% endfor %}"
    )
    assert capabilities(metadata, SimpleNamespace(template=thinking, projector_paths=())) == [
        "completion",
        "tools",
        "thinking",
    ]  # type: ignore[arg-type]


def test_longrope_past_the_original_context_takes_the_long_factors(converted):
    """A cache larger than the original 64 positions rotates with the long factors, as llama.cpp
    picks them by n_ctx; transformers takes them for a sequence past 64 tokens: 80 tokens over a
    cache of 128 equal it (in one batch and stepped), and over the short factors do not."""
    path, hf = converted["phi3-longrope"]
    model, tokens = load(path), [(7 * i + 3) % 250 for i in range(80)]
    expected = hf_logits(hf, tokens)

    def logits(chunks: list[list[int]]) -> torch.Tensor:
        cache = model.make_cache()
        cache.init(max_sequences=1, capacity=128, max_batch=128)
        rows, pos = [], 0
        for chunk in chunks:
            n = len(chunk)
            batch = Batch(tokens=tuple(chunk), positions=tuple(range(pos, pos + n)),
                          sequences=(0,) * n, outputs=tuple(range(n)))  # fmt: skip
            rows.append(forward(model, cache, batch))
            pos += len(chunk)
        return torch.cat(rows)

    assert (logits([tokens]) - expected).abs().max() < 1e-4
    assert (logits([tokens[:70], *[[t] for t in tokens[70:]]]) - expected).abs().max() < 1e-4
    model.options = replace(model.options, long_rope=None)  # the short factors alone
    assert (logits([tokens]) - expected).abs().max() > 1e-2
