"""The run loop driven by a fake model with exact token lists: generation, stop, cancel, shift,
prefix reuse, round-robin fairness, same_batch groups, embeddings."""

import itertools
import threading
from collections.abc import Iterator

import pytest
import torch
from fakes import FakeModel, FakeTokenizer

from ember.options import Options
from ember.runner.engine import Engine, Usage
from ember.runner.sequence import Done, InputTooLongError, Piece, Request, Sequence

TOK = FakeTokenizer()
GREEDY = {"temperature": 0.0}


def opts(**kw: object) -> Options:
    return Options.parse({**GREEDY, **kw})


def collect(seq: Sequence) -> tuple[str, Done]:
    text = []
    while not isinstance(event := seq.events.get(timeout=10), Done):
        assert isinstance(event, Piece)
        text.append(event.text)
    return "".join(text), event


@pytest.fixture
def make() -> Iterator:
    engines: list[Engine] = []

    def build(model: FakeModel | None = None, **kw: object) -> tuple[Engine, FakeModel]:
        model = model or FakeModel()
        kw = {"num_parallel": 1, "num_ctx": 64, "num_batch": 16, **kw}
        engine = Engine(model, TOK, **kw)  # type: ignore[arg-type]
        model.clear()  # forget the reservation's dry runs
        engines.append(engine)
        return engine, model

    yield build
    for engine in engines:
        engine.close()


def test_generates_the_successors(make):
    engine, _ = make()
    text, done = collect(engine.submit(Request([0, 1, 2], opts(num_predict=5))))
    assert text == "ddeeffgghh"
    assert (done.done_reason, done.prompt_eval_count, done.eval_count) == ("length", 3, 5)


def test_end_token_stops_without_text(make):
    engine, _ = make(FakeModel(eos_after=5))
    text, done = collect(engine.submit(Request([3], opts(num_predict=50))))
    # the end token counts in eval_count, as Ollama's numPredicted
    assert (text, done.done_reason, done.eval_count) == ("eeff", "stop", 3)
    assert done.stop_sequence == ""  # the end token, not a stop string


def test_stop_string_is_cut_mid_token_and_never_sent(make):
    engine, _ = make()
    seq = engine.submit(Request([0], opts(num_predict=20, stop=["cd", "zz"])))
    text, done = collect(seq)
    assert (text, done.done_reason) == ("bbc", "stop")  # "bbccdd": the stop starts inside "cc"
    assert done.stop_sequence == "cd"


@pytest.mark.parametrize("num_predict", [0, -1, 641])
def test_num_predict_zero_or_less_or_past_the_cap_is_ten_contexts(make, num_predict):
    """As Ollama's runner, which limits only a positive num_predict: 0 and -1 set no limit of
    their own (nor does one past the cap), so 10 × num_ctx (64 here) ends the answer."""
    engine, _ = make()
    _, done = collect(engine.submit(Request([0, 1], opts(num_predict=num_predict))))
    assert (done.done_reason, done.eval_count, done.prompt_eval_count) == ("length", 640, 2)


def test_cancel_frees_the_slot_within_one_step(make):
    engine, model = make()
    seq = engine.submit(Request([0], opts(num_predict=100_000, num_ctx=64)))
    assert isinstance(seq.events.get(timeout=10), Piece)
    seq.cancel()
    steps_at_cancel = len(model.batches)
    _, done = collect(seq)
    assert done.done_reason == "closed"
    assert len(model.batches) - steps_at_cancel <= 2  # the one in flight, at most one more
    # the only slot is free again: the next request runs
    text, _ = collect(engine.submit(Request([5], opts(num_predict=1))))
    assert text == "gg"


def test_a_waiting_request_cancelled_before_it_starts_ends_closed(make):
    engine, _ = make()
    first = engine.submit(Request([0], opts(num_predict=2000)))
    waiting = engine.submit(Request([1], opts(num_predict=5)))
    waiting.cancel()
    first.cancel()
    assert collect(waiting)[1].done_reason == "closed"
    assert collect(first)[1].done_reason == "closed"


def test_shift_keeps_num_keep_and_renumbers_positions(make):
    engine, model = make(num_ctx=8, num_batch=8)
    prompt = [0, 1, 2, 3]
    text, done = collect(engine.submit(Request(prompt, opts(num_predict=20, num_keep=2))))
    expected = [(3 + i) % 26 + 1 for i in range(20)]
    assert text == TOK.text([t % 26 for t in expected]) and done.eval_count == 20
    for seen in model.seen:
        assert len(seen.tokens) <= 8
        assert seen.tokens[:2] == [0, 1]  # num_keep survives every shift
        assert seen.positions == list(range(len(seen.positions)))  # re-rotated keys
        # the rest is a run of successors ending with the token being evaluated
        tail = seen.tokens[2:]
        assert all(b == (a + 1) % 26 for a, b in itertools.pairwise(tail))
    shifted = [s for s in model.seen if s.tokens[2] != 2]
    assert shifted, "the context never shifted"
    # a shift discards half of what follows num_keep: (8 - 2) // 2 = 3 tokens
    assert all(s.position <= 7 for s in model.seen)


def test_without_shift_a_full_context_ends_with_length(make):
    engine, _ = make(num_ctx=8)
    _, done = collect(engine.submit(Request([0, 1, 2, 3], opts(num_predict=50), shift=False)))
    assert (done.done_reason, done.eval_count) == ("length", 5)


def test_long_prompt_is_truncated_after_num_keep_or_refused(make, caplog):
    engine, model = make(num_ctx=8, num_batch=8)
    prompt = list(range(12))
    with pytest.raises(InputTooLongError, match=r"^the input length exceeds the context length"):
        engine.submit(Request(prompt, opts(), truncate=False))
    _, done = collect(engine.submit(Request(prompt, opts(num_predict=1, num_keep=3))))
    assert done.prompt_eval_count == 8
    # as Ollama's runner, a warning says so
    assert "truncating input prompt limit=8 prompt=12 keep=3 new=8" in caplog.text
    assert model.batches[0].tokens == (0, 1, 2, 7, 8, 9, 10, 11)


def test_prefix_is_reused_and_one_token_always_evaluated(make):
    engine, model = make()
    prompt = list(range(10))
    collect(engine.submit(Request(prompt, opts(num_predict=3))))
    model.clear()
    _, done = collect(engine.submit(Request([*prompt[:8], 20, 21], opts(num_predict=1))))
    assert model.batches[0].tokens == (20, 21) and model.batches[0].positions == (8, 9)
    assert (done.prompt_eval_count, done.prompt_cached_count, done.prompt_count) == (2, 8, 10)
    model.clear()
    text, done = collect(engine.submit(Request([*prompt[:8], 20, 21], opts(num_predict=3))))
    # all cached, with the logits after it: its first token is drawn from those, nothing runs
    # again; the next batch decodes that token
    assert (text, done.prompt_eval_count, done.prompt_cached_count) == ("wwxxyy", 0, 10)
    assert model.batches[0].tokens == (22,) and model.batches[0].positions == (10,)
    assert model.seen[0].tokens == [*prompt[:8], 20, 21, 22]
    model.clear()
    for _ in range(2):
        collect(engine.submit(Request([*prompt[:8], 20], opts(num_predict=1))))
    # a shorter prompt is not the one whose logits were kept: its last token runs again, once
    assert [b.tokens for b in model.batches] == [(20,)]


def test_each_slot_reserves_its_row_of_kept_logits_at_load(make):
    engine, _ = make(num_parallel=2)
    rows = [slot.logits for slot in engine.inputs.slots]
    assert all(r is not None and r.shape == (FakeModel.vocab_size,) for r in rows)
    collect(engine.submit(Request([1, 2, 3], opts(num_predict=2))))
    slot = next(s for s in engine.inputs.slots if s.logits_at)
    assert slot.logits_at == 3 and any(slot.logits is r for r in rows)  # kept in place


def test_a_repeated_prompt_draws_from_the_logits_of_its_first_evaluation(make):
    # logits that depend on the batch, as real kernels' last places do: a token evaluated
    # again alone would predict another successor than in its prompt's batch
    engine, _ = make(FakeModel(batch_dependent=True))
    first, _ = collect(engine.submit(Request([1, 2, 3], opts(num_predict=4))))
    again, done = collect(engine.submit(Request([1, 2, 3], opts(num_predict=4))))
    assert first == again == "gghhiijj" and done.prompt_eval_count == 0
    sampled = opts(num_predict=8, temperature=1.0, seed=7)
    first, _ = collect(engine.submit(Request([4, 5, 6, 7], sampled)))
    again, _ = collect(engine.submit(Request([4, 5, 6, 7], sampled)))
    assert first == again


def test_usage_counts_slots_and_the_kv_cells_sequences_hold(make):
    engine, _ = make(num_parallel=2)
    assert engine.usage() == Usage(num_slots=2, slots_busy=0, kv_cells_used=0, kv_cells=128)
    collect(engine.submit(Request(list(range(10)), opts(num_predict=3))))
    # the prompt and the generated tokens fed back stay cached (the last one never went in)
    assert engine.usage() == Usage(num_slots=2, slots_busy=0, kv_cells_used=12, kv_cells=128)


def test_round_robin_gives_every_sequence_a_share_of_each_batch(make):
    engine, model = make(num_parallel=3, num_batch=4)
    seqs = [engine.submit(Request([i] * 10, opts(num_predict=3))) for i in range(3)]
    results = [collect(s) for s in seqs]
    assert all(done.eval_count == 3 for _, done in results)
    for batch in model.batches:
        assert len(batch) <= 4
    # while all three still have prompt to evaluate, each batch holds all three
    full = [b for b in model.batches if len(set(b.sequences)) == 3]
    assert len(full) >= 4
    busy = model.batches[: len(full)]
    assert all(len(set(b.sequences)) == 3 for b in busy)


def test_more_sequences_than_batch_tokens_all_progress(make):
    engine, model = make(num_parallel=6, num_batch=2)
    seqs = [engine.submit(Request([i, i + 1], opts(num_predict=4))) for i in range(6)]
    texts = [collect(s)[0] for s in seqs]
    assert texts == [TOK.text([(i + 2 + k) % 26 for k in range(4)]) for i in range(6)]
    assert all(len(b) <= 2 for b in model.batches)


def test_same_batch_group_is_never_split(make):
    engine, model = make(num_batch=4)
    prompt = list(range(9))
    seq = engine.submit(Request(prompt, opts(num_predict=1), same_batch={2: 3}))
    collect(seq)
    holder = [b for b in model.batches if 2 in b.tokens]
    assert len(holder) == 1 and {2, 3, 4, 5} <= set(holder[0].tokens)


def test_multiuser_cache_shares_a_prefix_between_slots(make):
    engine, model = make(num_parallel=2, multiuser=True)
    prompt = list(range(12))
    collect(engine.submit(Request(prompt, opts(num_predict=2))))
    model.clear()
    # another user's prompt sharing 10 tokens goes to the other slot, with the prefix shared
    _, _done = collect(engine.submit(Request([*prompt[:10], 25, 24], opts(num_predict=1))))
    assert model.batches[0].sequences == (1, 1) and model.batches[0].positions == (10, 11)
    assert model.seen[0].tokens == [*prompt[:10], 25, 24]
    model.clear()
    # the first slot still holds its own context, and the logits after it: nothing runs
    text, done = collect(engine.submit(Request(prompt, opts(num_predict=1))))
    assert (text, done.prompt_cached_count, model.batches) == ("mm", 12, [])


def test_parallel_sequences_get_what_they_get_alone(make):
    engine, _ = make(num_parallel=4, num_batch=5)
    requests = [Request(list(range(i, i + 3 + 2 * i)), opts(num_predict=6)) for i in range(4)]
    alone = [collect(engine.submit(r))[0] for r in requests]
    results: list[str] = [""] * 4

    def run(i: int) -> None:
        results[i] = collect(engine.submit(requests[i]))[0]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == alone


def test_embedding_is_the_mean_of_hidden_states(make):
    engine, _ = make(num_batch=2)
    _, done = collect(engine.submit(Request([1, 2, 3, 6], opts(), embedding=True)))
    assert done.embedding == [3.0, 1.5]  # mean token, mean position (split over two batches)


def test_an_embedding_is_cut_to_the_context_its_request_asked_for(make):
    # the scheduler loads at least 4 tokens; a request's num_ctx of 2 still cuts to 2, as
    # Ollama's embed handler cuts to the num_ctx it was sent
    engine, _ = make(num_ctx=8)
    _, done = collect(engine.submit(Request([1, 2, 3, 6], opts(), embedding=True, cut_to=2)))
    assert done.prompt_eval_count == 2 and done.embedding == [1.5, 0.5]


def test_logprobs_come_with_their_tokens(make):
    engine, _ = make()
    seq = engine.submit(Request([0], opts(num_predict=2), logprobs=True, top_logprobs=2))
    pieces = []
    while not isinstance(event := seq.events.get(timeout=10), Done):
        pieces.append(event)
    lps = [lp for p in pieces for lp in p.logprobs]
    assert [lp.token for lp in lps] == ["bb", "cc"]
    assert lps[0].logprob == pytest.approx(0.0, abs=1e-6)
    assert lps[0].top[0] == ("bb", lps[0].logprob) and len(lps[0].top) == 2


def test_a_failing_forward_ends_its_sequences_not_the_loop(make):
    class Broken(FakeModel):
        def hidden(self, batch, cache):  # type: ignore[no-untyped-def]
            if 13 in batch.tokens:
                raise RuntimeError("boom")
            return super().hidden(batch, cache)

    engine, _ = make(Broken())
    _, done = collect(engine.submit(Request([13], opts(num_predict=2))))
    assert done.done_reason == "error" and "boom" in (done.error or "")
    text, _ = collect(engine.submit(Request([0], opts(num_predict=1))))
    assert text == "bb"


def test_a_failure_after_the_forward_ends_its_sequence_not_the_loop(make):
    """A bad top_logprobs from the Python API killed the loop thread in the sampler's log
    probabilities, and every caller of the engine waited forever."""
    engine, _ = make()
    broken = Request([0], opts(num_predict=2), logprobs=True, top_logprobs=2.5)  # type: ignore[arg-type]
    _, done = collect(engine.submit(broken))
    assert done.done_reason == "error" and "step failed" in (done.error or "")
    text, _ = collect(engine.submit(Request([0], opts(num_predict=1))))
    assert text == "bb"


def test_a_failure_drawing_from_a_cached_prompt_ends_its_sequence_not_the_loop(make):
    """A wholly cached prompt draws its first token outside the step: a grammar that failed
    there (a looping schema's parser) killed the loop thread, and every later request hung."""
    engine, _ = make()
    collect(engine.submit(Request([1, 2, 3], opts(num_predict=1))))
    broken = Request([1, 2, 3], opts(num_predict=2), logprobs=True, top_logprobs=2.5)  # type: ignore[arg-type]
    _, done = collect(engine.submit(broken))
    assert done.done_reason == "error" and "sampling failed" in (done.error or "")
    text, _ = collect(engine.submit(Request([0], opts(num_predict=1))))
    assert text == "bb"


def test_closing_ends_waiting_requests_with_an_error(make):
    engine, _ = make()
    seq = engine.submit(Request([0], opts(num_predict=10**6)))
    engine.close()
    _, done = collect(seq)
    assert done.error is not None


def test_a_token_text_repeated_more_than_30_times_in_a_row_ends_the_answer(make):
    # as Ollama: the 32nd "ff" in a row is not sent, and the answer ends with "stop"
    engine, _ = make(num_ctx=256)
    forced = Request([0], opts(num_predict=100), logit_bias=((5, 1e9),))
    text, done = collect(engine.submit(forced))
    assert text == "ff" * 31
    assert (done.done_reason, done.eval_count) == ("stop", 32)
    # an answer whose token texts change goes on to num_predict
    text, done = collect(engine.submit(Request([0], opts(num_predict=70))))
    assert (done.done_reason, done.eval_count) == ("length", 70)


class _Unfinished:
    """A grammar that allows every token and is never complete (JSON cut mid-string)."""

    def mask(self) -> torch.Tensor:
        return torch.ones(TOK.vocab_size, dtype=torch.bool)

    def accept(self, token: int) -> None:
        pass

    def is_accepting(self) -> bool:
        return False


def test_a_format_cut_by_the_repeat_guard_ends_with_length_not_stop(make):
    # its JSON does not parse: a client must not take it for a whole answer
    engine, _ = make(num_ctx=256)
    forced = Request([0], opts(num_predict=100), logit_bias=((5, 1e9),), grammar=_Unfinished())  # type: ignore[arg-type]
    text, done = collect(engine.submit(forced))
    assert text == "ff" * 31 and done.done_reason == "length"
