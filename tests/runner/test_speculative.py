"""Speculative decoding: drafted runs verified by the target give exactly plain decoding's tokens
(fake model with exact lists, tiny random models, the real models), and every way a generation
ends (stop string, num_predict, end token) lands where it does without drafting."""

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import EOS, FakeModel, FakeTokenizer
from test_engine_models import load

from ember.gguf import GGUFFile
from ember.kvcache import CausalCache
from ember.options import Options
from ember.runner.draft import DraftModelError, check_vocabulary, ngram_draft
from ember.runner.engine import Engine
from ember.runner.sequence import Done, Piece, Request
from ember.sample.grammar import Grammar
from ember.tokenizer import Tokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from code_edit_prompt import CODE_EDIT_PROMPT

TOK = FakeTokenizer()
ALPHABET = list(range(26))  # the fake model continues any run of successors


def run(engine: Engine, request: Request) -> tuple[str, list[int], Done]:
    seq = engine.submit(request)
    text = []
    while not isinstance(event := seq.events.get(timeout=300), Done):
        assert isinstance(event, Piece)
        text.append(event.text)
    return "".join(text), list(seq.generated), event


def assert_cache_holds_slot_inputs(engine: Engine) -> None:
    """Every slot's cells hold exactly positions 0..len(inputs) - 1: no rejected draft left."""
    cache = engine.cache
    assert isinstance(cache, CausalCache)
    for slot in engine.inputs.slots:
        mine = (cache.cell_seqs & (1 << slot.id)) != 0
        held = sorted(cache.cell_pos[mine].tolist())
        assert held == list(range(len(slot.inputs)))


@pytest.fixture
def fake_engine() -> Iterator[Engine]:
    model = FakeModel(eos_after=None)
    engine = Engine(model, TOK, num_parallel=2, num_ctx=256, num_batch=32)  # type: ignore[arg-type]
    yield engine
    engine.close()


def greedy(**kw: object) -> Options:
    return Options.parse({"temperature": 0, **kw})


def test_ngram_draft_takes_the_latest_longest_match() -> None:
    tokens = [1, 2, 3, 9, 2, 3, 7, 8, 5, 2, 3]
    assert ngram_draft(tokens, 2) == [7, 8]  # "2 3" last seen before 7 8 (the 3-gram: never)
    assert ngram_draft([4, 5, 6, 1, 4, 5, 6], 5) == [1, 4, 5, 6]  # up to what there is
    assert ngram_draft([1, 2, 3], 4) == []
    assert ngram_draft([7, 1, 7], 3) == [1, 7]


def test_drafted_tokens_equal_plain_decoding_in_fewer_steps(fake_engine: Engine) -> None:
    model = fake_engine.model
    assert isinstance(model, FakeModel)
    prompt = [*ALPHABET, 0, 1]
    model.clear()
    plain = run(fake_engine, Request(prompt, greedy(num_predict=40)))
    plain_steps = len(model.batches)
    model.clear()
    drafted = run(fake_engine, Request(prompt, greedy(num_predict=40, draft_ngram=8)))
    assert drafted[:2] == plain[:2]
    # its first token drawn from the logits the plain run kept after the same prompt; of the
    # other 39, 34 drafted and accepted, 5 drawn from the steps' own rows
    assert (drafted[2].draft_proposed, drafted[2].draft_accepted) == (34, 34)
    assert plain[2].draft_proposed is None
    assert len(model.batches) < plain_steps / 4
    assert_cache_holds_slot_inputs(fake_engine)


@pytest.mark.parametrize(
    "options",
    [
        {"stop": ["hhii"]},  # inside a drafted run, mid-token
        {"num_predict": 11},  # never past num_predict
        {"stop": ["ccd"], "num_predict": 30},
    ],
)
def test_a_generation_ends_where_it_ends_without_drafting(fake_engine: Engine, options) -> None:
    prompt = [*ALPHABET, 0, 1]
    options = {"num_predict": 40, **options}
    plain = run(fake_engine, Request(prompt, greedy(**options)))
    drafted = run(fake_engine, Request(prompt, greedy(draft_ngram=16, **options)))
    assert drafted[:2] == plain[:2]
    assert (drafted[2].done_reason, drafted[2].eval_count) == (
        plain[2].done_reason,
        plain[2].eval_count,
    )
    assert drafted[2].draft_accepted
    assert_cache_holds_slot_inputs(fake_engine)


def test_an_end_token_inside_a_drafted_run_ends_it() -> None:
    model = FakeModel(eos_after=9)  # after "j": the end token, whatever the draft says
    engine = Engine(model, TOK, num_parallel=1, num_ctx=128, num_batch=32)  # type: ignore[arg-type]
    try:
        prompt = [*ALPHABET, 0, 1]
        text, tokens, done = run(engine, Request(prompt, greedy(num_predict=40, draft_ngram=12)))
        assert (text, done.done_reason) == (TOK.text(list(range(2, 10))), "stop")
        assert EOS not in tokens
        assert done.draft_proposed and done.draft_accepted == 7  # "c".."i"; "k" was refused
        assert_cache_holds_slot_inputs(engine)
    finally:
        engine.close()


def test_a_grammar_turns_drafting_off(tiny_models) -> None:
    model, tok = load(tiny_models["llama"].path)
    engine = Engine(model, tok, num_parallel=1, num_ctx=64, num_batch=16)
    try:
        request = Request(
            tok.encode("Hello world"),
            greedy(num_predict=4, draft_ngram=4),
            grammar=Grammar.from_format({"regex": "[a-z]+"}, tok),
        )
        assert run(engine, request)[2].draft_proposed is None
    finally:
        engine.close()


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_tiny_models_give_the_same_tokens_with_drafts(tiny_models, arch) -> None:
    model, tok = load(tiny_models[arch].path)
    # random weights repeat themselves soon: prompt lookup finds runs to draft
    prompt = tok.encode("The sky is blue. The sky is blue. The sky is")
    engine = Engine(model, tok, num_parallel=2, num_ctx=160, num_batch=32)
    try:
        for opts in ({"temperature": 0}, {"temperature": 0.9, "seed": 7, "top_k": 5}):
            base = {**opts, "num_predict": 32, "repeat_penalty": 1.1}
            plain = run(engine, Request(prompt, Options.parse(base)))
            drafted = run(engine, Request(prompt, Options.parse({**base, "draft_ngram": 6})))
            assert drafted[1] == plain[1]
            assert drafted[2].draft_accepted
        if arch == "llama":  # (gemma3's cache is one per layer type)
            assert_cache_holds_slot_inputs(engine)
    finally:
        engine.close()


def test_a_tiny_model_drafting_for_itself_is_always_right(tiny_models) -> None:
    path = tiny_models["qwen2"].path
    model, tok = load(path)
    draft, _ = load(path)
    prompt = tok.encode("Why is the sky blue?")
    engine = Engine(model, tok, num_parallel=2, num_ctx=96, num_batch=16, draft_model=draft)
    try:
        plain = run(engine, Request(prompt, greedy(num_predict=30, draft_num_predict=0)))
        drafted = run(engine, Request(prompt, greedy(num_predict=30)))
        assert drafted[1] == plain[1]
        assert drafted[2].draft_proposed == drafted[2].draft_accepted > 20
    finally:
        engine.close()


def test_a_draft_model_with_another_vocabulary_is_refused(tiny_models) -> None:
    llama = Tokenizer.from_metadata(GGUFFile.open(tiny_models["llama"].path).metadata)
    gemma = Tokenizer.from_metadata(GGUFFile.open(tiny_models["gemma3"].path).metadata)
    check_vocabulary(llama, llama)
    with pytest.raises(DraftModelError, match="same tokenizer"):
        check_vocabulary(llama, gemma)


@pytest.mark.model
@pytest.mark.slow
def test_qwen_edits_code_with_prompt_lookup_exactly(real_llm) -> None:
    llm = real_llm("qwen2.5-coder:0.5b")  # its weights; an engine of its own, small to reserve
    engine = Engine(llm.model, llm.tokenizer, num_parallel=1, num_ctx=512, num_batch=128)
    try:
        prompt = llm.prompt_ids(CODE_EDIT_PROMPT)
        plain = run(engine, Request(prompt, greedy(num_predict=64)))
        drafted = run(engine, Request(prompt, greedy(num_predict=64, draft_ngram=8)))
        assert drafted[1] == plain[1] and len(plain[1]) == 64
        proposed, accepted = drafted[2].draft_proposed, drafted[2].draft_accepted
        assert proposed and accepted and accepted > proposed / 2  # the answer repeats the prompt
    finally:
        engine.close()


@pytest.mark.model
@pytest.mark.slow
def test_smollm2_drafting_for_itself_gives_its_own_tokens(smollm2_path) -> None:
    model, tok = load(smollm2_path)
    draft, draft_tok = load(smollm2_path)
    check_vocabulary(tok, draft_tok)
    engine = Engine(model, tok, num_parallel=1, num_ctx=512, num_batch=64, draft_model=draft)
    try:
        prompt = tok.encode(
            "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n"
        )
        plain = run(engine, Request(prompt, greedy(num_predict=32, draft_num_predict=0)))
        drafted = run(engine, Request(prompt, greedy(num_predict=32, draft_num_predict=4)))
        assert drafted[1] == plain[1]
        proposed, accepted = drafted[2].draft_proposed, drafted[2].draft_accepted
        assert proposed and accepted is not None and accepted >= 0.9 * proposed
    finally:
        engine.close()
