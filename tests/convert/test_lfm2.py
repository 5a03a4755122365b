"""LFM2 converted from a tiny random-weight HF Lfm2ForCausalLM (two short-convolution layers
and two attention layers): logits equal HF's whether the prompt comes whole, in pieces or token
by token; sequences batched together equal each alone (each convolves over its own past); a
context shift equals a fresh run on one-layer models of either kind; the engine resumes a
conversation from its cache and evaluates again a prompt it cannot resume."""

from collections.abc import Callable, Iterator

import pytest
import torch

pytest.importorskip("transformers")

from hf_families import convert_family, save_family
from test_dense_families import OTHER, PROMPT, run, run_both, shift_error
from tinymodels import hf_logits

from ember.convert import convert_directory
from ember.gguf import GGUFFile
from ember.kvcache import ConvStateCache
from ember.model import load_model
from ember.options import Options
from ember.runner.engine import Engine
from ember.runner.sequence import Done, Request
from ember.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return convert_family("lfm2", tmp_path_factory.mktemp("lfm2"))


def test_the_file_marks_its_convolution_layers(converted):
    with GGUFFile.open(converted[0]) as f:
        md, names = f.metadata, set(f.tensors)
    assert md["general.architecture"] == "lfm2"
    assert md["lfm2.attention.head_count_kv"] == [0, 2, 0, 2]
    assert {"blk.0.shortconv.conv.weight", "token_embd_norm.weight"} <= names
    assert f.tensors["blk.0.shortconv.conv.weight"].shape == (64, 3)


@pytest.mark.parametrize("pieces", [[20], [7, 13], [3] + [1] * 17])
def test_logits_equal_transformers(converted, pieces):
    path, hf = converted
    chunks, at = [], 0
    for n in pieces:
        chunks.append(PROMPT[at : at + n])
        at += n
    logits = run(load_model(GGUFFile.open(path)), chunks)
    assert (logits - hf_logits(hf, PROMPT)).abs().max() < 1e-4


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    return convert_family("lfm2-moe", tmp_path_factory.mktemp("lfm2-moe"))


def test_lfm2_moe_logits_equal_transformers(moe):
    path, hf = moe
    with GGUFFile.open(path) as f:
        assert f.metadata["general.architecture"] == "lfm2moe"
        assert "blk.1.exp_probs_b.bias" in f.tensors and "blk.0.ffn_gate.weight" in f.tensors
    model = load_model(GGUFFile.open(path))
    for chunks in ([PROMPT], [PROMPT[:7], *[[t] for t in PROMPT[7:]]]):
        assert (run(model, chunks) - hf_logits(hf, PROMPT)).abs().max() < 1e-4
    alone = torch.cat([run(model, [PROMPT]), run(model, [OTHER])])
    assert (run_both(model) - alone).abs().max() < 1e-4


def test_two_sequences_in_one_batch_equal_each_alone(converted):
    model = load_model(GGUFFile.open(converted[0]))
    alone = torch.cat([run(model, [PROMPT]), run(model, [OTHER])])
    assert (run_both(model) - alone).abs().max() < 1e-4


@pytest.mark.parametrize("kind", ["conv", "full_attention"])
def test_context_shift_equals_a_fresh_run_over_kept_tokens(kind, tmp_path):
    save_family("lfm2", tmp_path / "hf", num_hidden_layers=1, layer_types=[kind])
    convert_directory(tmp_path / "hf", tmp_path / "model.gguf")
    assert shift_error(load_model(GGUFFile.open(tmp_path / "model.gguf"))) < 1e-4


def test_the_state_steps_back_and_resumes_only_where_it_holds_the_inputs():
    state = ConvStateCache(kernel=3)
    state.init(max_sequences=2, capacity=256, max_batch=256)
    from ember.batch import Batch

    state.start_forward(Batch.single(list(range(10)), 0, seq=0))
    state.set_layer(0)
    x = torch.randn(10, 4)
    weight = torch.randn(4, 3)
    full = state.convolve(x, weight)
    assert state.can_resume(0, 10) and state.can_resume(0, 7) and not state.can_resume(0, 11)
    state.remove(0, 7, None)  # step back three inputs, then take them again
    state.start_forward(Batch(tokens=(7, 8, 9), positions=(7, 8, 9), sequences=(0,) * 3,
                              outputs=(0, 1, 2)))  # fmt: skip
    assert torch.allclose(state.convolve(x[7:], weight), full[7:])
    state.copy_prefix(0, 1, 5)  # another sequence from the first five: its state at 5
    assert state.can_resume(1, 5) and not state.can_resume(1, 6)
    state.start_forward(Batch.single([5], 5, seq=1))
    assert torch.allclose(state.convolve(x[5:6], weight), full[5:6])
    long = ConvStateCache(kernel=3)  # a history of 64: a sequence of 100 cannot go back to 20
    long.init(max_sequences=1, capacity=256, max_batch=256)
    long.start_forward(Batch.single(list(range(100)), 0))
    long.set_layer(0)
    long.convolve(torch.randn(100, 4), weight)
    assert long.can_resume(0, 40) and not long.can_resume(0, 20) and long.can_resume(0, 0)


def generate(engine: Engine, prompt: list[int]) -> tuple[str, int]:
    """Six greedy tokens' text after prompt, and how many prompt tokens were evaluated."""
    options = Options.parse({"temperature": 0.0, "num_predict": 6})
    seq = engine.submit(Request(list(prompt), options))
    text = []
    while not isinstance(event := seq.events.get(timeout=120), Done):
        text.append(event.text)
    assert event.error is None, event.error
    return "".join(text), event.prompt_eval_count


def check_resumes(path, cases: Callable[[Engine], Iterator[tuple[list[int], int]]]) -> None:
    """Each prompt cases(engine) yields (after the engine ran the ones before) evaluates the
    tokens expected on a warm engine, and gives a fresh engine's text."""
    gguf = GGUFFile.open(path)
    model, tokenizer = load_model(gguf), Tokenizer.from_metadata(gguf.metadata)

    def engine() -> Engine:
        return Engine(model, tokenizer, num_parallel=1, num_ctx=128, num_batch=8, kv_type="f32")

    warm, got = engine(), []
    try:
        got = [(prompt, generate(warm, prompt), expected) for prompt, expected in cases(warm)]
    finally:
        warm.close()
    for prompt, (text, evaluated), expected in got:
        assert evaluated == expected
        fresh = engine()
        try:
            assert generate(fresh, prompt)[0] == text
        finally:
            fresh.close()


def test_the_engine_resumes_where_the_state_is_held_and_else_evaluates_again(converted):
    def cases(warm: Engine) -> Iterator[tuple[list[int], int]]:
        generate(warm, PROMPT)
        near = PROMPT[:9] + OTHER  # the inputs before position 9 are still in the history
        yield near, len(OTHER)
        yield list(warm.inputs.slots[0].inputs) + OTHER * 5, len(OTHER) * 5  # it goes on
        far = PROMPT[:9] + OTHER  # 87 tokens on: position 9 left the history of 64
        yield far, len(far)

    check_resumes(converted[0], cases)
