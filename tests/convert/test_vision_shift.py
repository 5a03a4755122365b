"""Images across context shifts on the tiny Gemma 3 vision model: a shift drops an image's span
whole or keeps it whole, forgets a dropped image's embeddings, and a shift that cannot be done
in place evaluates a kept image again with its embeddings (not as bare placeholders)."""

import gc
import weakref

import pytest
import torch

pytest.importorskip("transformers")

from hf_vision import build_gemma3_vision
from test_gemma3_vision import image_bytes

from ember.convert import convert_directory
from ember.gguf import GGUFFile
from ember.model import load_model
from ember.options import Options
from ember.runner.engine import Engine
from ember.runner.inputcache import shift_discard
from ember.runner.multimodal import PromptInputs, prompt_inputs
from ember.runner.sequence import Done, Request, Sequence
from ember.tokenizer import Tokenizer

NUM_CTX = 32
IMAGE = image_bytes((50, 30), "RGB", 1)
LATE = "Hello world the sky the sky [img-0] is blue"  # the image at 16..21 of 24 inputs
EARLY = "Hi [img-0] the sky the sky the sky the sky the sky is blue and green"  # at 4..9 of 30
AFTER = "Hello world the sky the sky the sky the sky [img-0] is blue"  # at 20..25 of 28
NO_EOS = ((1, -100.0), (5, -100.0))  # the tiny model's end tokens: generate past num_ctx


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    root = tmp_path_factory.mktemp("vision-shift")
    build_gemma3_vision(root / "hf")
    convert_directory(root / "hf", root / "model.gguf")
    gguf = GGUFFile.open(root / "model.gguf")
    return load_model(gguf), Tokenizer.from_metadata(gguf.metadata)


def inputs_of(loaded, text: str) -> PromptInputs:
    model, tok = loaded
    return prompt_inputs(text, {0: IMAGE}, tok, model)


def request(inputs: PromptInputs, *, num_keep: int, num_predict: int, tokens=None) -> Request:
    # a frequency penalty: the random model would repeat one token, and an answer ends after
    # 31 in a row (Ollama's guard), before its context shifts
    greedy = Options(
        temperature=0, num_keep=num_keep, num_predict=num_predict, frequency_penalty=5.0
    )
    return Request(list(tokens or inputs.tokens), greedy, logit_bias=NO_EOS,
                   same_batch=inputs.same_batch, multimodal=inputs.multimodal,
                   image_hashes=inputs.image_hashes)  # fmt: skip


def finish(seq: Sequence) -> Done:
    while not isinstance(done := seq.events.get(timeout=120), Done):
        pass
    return done


class Spy:
    """Records each shift (the slot's inputs before and after, what comes back to evaluate
    again) and the logits row of each emitted token, with the slot's length then."""

    def __init__(self, e: Engine) -> None:
        self.shifts: list[tuple[list[int], list[int], list[int], int]] = []
        self.rows: list[tuple[int, torch.Tensor]] = []
        shift, emit = e.inputs.shift, e._emit

        def on_shift(slot, num_keep, groups=None):
            before = list(slot.inputs)
            again = shift(slot, num_keep, groups)
            self.shifts.append((before, list(slot.inputs), again, len(self.rows)))
            return again

        def on_emit(seq, row, token):
            self.rows.append((len(seq.slot.inputs), row.clone()))
            emit(seq, row, token)

        e.inputs.shift, e._emit = on_shift, on_emit  # type: ignore[method-assign]


def engine(loaded, **kwargs) -> Engine:
    model, tok = loaded
    return Engine(model, tok, num_ctx=NUM_CTX, num_batch=NUM_CTX, **kwargs)


def test_a_shift_drops_an_image_whole_and_forgets_its_embeddings(loaded):
    e = engine(loaded)
    spy = Spy(e)

    def submit() -> tuple[Sequence, weakref.ref, int]:
        inputs = inputs_of(loaded, LATE)
        (embedding,) = inputs.multimodal.values()
        (start,) = inputs.same_batch
        return e.submit(request(inputs, num_keep=2, num_predict=40)), weakref.ref(embedding), start

    try:
        seq, embedding, start = submit()
        done = finish(seq)
        slot = seq.slot
    finally:
        e.close()
    span = range(start, start + 6)  # <start_of_image>, 4 placeholders, <end_of_image>
    assert done.done_reason == "length" and done.eval_count == 40  # went on past num_ctx
    assert all(0 <= t < loaded[1].vocab_size for t in seq.generated)
    before, after, again, _ = spy.shifts[0]
    dropped = len(before) - len(after)
    assert again == [] and after == before[:2] + before[2 + dropped :]  # shifted in place
    assert 2 + shift_discard(NUM_CTX, NUM_CTX, 2) in span[1:]  # half would cut the span...
    assert span[0] >= 2 and span[-1] < 2 + dropped  # ...so the whole span went
    # nothing keeps the dropped image: not the sequence, its slot, nor its request
    assert seq.multimodal == {} and seq.same_batch == {} and seq.image_hashes == {}
    assert slot.images == {} and seq.request.multimodal == {}
    gc.collect()
    assert embedding() is None


def test_num_keep_inside_an_image_keeps_the_image_whole(loaded):
    inputs = inputs_of(loaded, EARLY)
    (start,) = inputs.same_batch  # the span: start..start + 5
    tok = loaded[1]
    for keep, kept in [(start + 2, start + 6), (start, start), (start + 6, start + 6)]:
        seq = Sequence(request(inputs, num_keep=keep, num_predict=1), tok, NUM_CTX)
        assert seq.num_keep == kept
    # where keeping the image would leave nothing to discard, it is dropped whole instead
    seq = Sequence(request(inputs, num_keep=start + 2, num_predict=1), tok, start + 6)
    assert seq.num_keep == start
    # a prompt truncated to fit num_ctx keeps it whole too
    seq = Sequence(request(inputs, num_keep=start + 2, num_predict=1), tok, 20)
    assert seq.prompt == inputs.tokens[: start + 6] + inputs.tokens[-20 + start + 6 :]
    assert seq.multimodal.keys() == inputs.multimodal.keys()


@pytest.mark.parametrize(
    ("text", "keep"),
    [(EARLY, 6), (AFTER, 2)],  # num_keep inside the image (kept whole, to 10); before the cut
    ids=["image-in-num-keep", "image-after-the-cut"],
)
def test_a_shift_evaluating_again_gives_a_kept_image_its_embeddings(loaded, text, keep):
    """Cells shared between slots cannot shift in place: the kept inputs are evaluated again,
    a kept image with its embeddings: the logits then equal a fresh run's over those inputs."""
    inputs = inputs_of(loaded, text)
    ((start, n),) = inputs.same_batch.items()
    e = engine(loaded, num_parallel=2, multiuser=True)
    spy = Spy(e)
    try:  # the first leaves its prompt in slot 0; the second shares those cells
        longer = request(inputs, num_keep=keep, num_predict=1, tokens=[*inputs.tokens, 300])
        finish(e.submit(longer))
        seq = e.submit(request(inputs, num_keep=keep, num_predict=12))
        done = finish(seq)
    finally:
        e.close()
    assert done.done_reason == "length" and seq.slot.id == 1 and done.prompt_cached_count > 0
    before, after, again, row_index = spy.shifts[0]
    assert len(before) == NUM_CTX and after == []
    moved = start - again.index(inputs.tokens[start])  # 0: kept in num_keep
    assert (moved > 0) == (keep < start)
    span = inputs.tokens[start : start + n + 1]
    assert again[start - moved : start + n + 1 - moved] == span  # the image's span, whole
    assert set(seq.multimodal) == {i - moved for i in inputs.multimodal}  # still needed
    length, reevaluated = spy.rows[row_index]
    last = seq.generated[row_index - 1]  # the token pending at the shift
    assert length == len(again) + 1

    def fresh(with_images: bool) -> torch.Tensor:
        at = {i - moved: v for i, v in inputs.multimodal.items()} if with_images else {}
        kept = PromptInputs([*again, last], {start - moved: n}, at)
        f = engine(loaded)
        fspy = Spy(f)
        try:
            finish(f.submit(request(kept, num_keep=keep, num_predict=1)))
        finally:
            f.close()
        return fspy.rows[0][1]

    assert torch.allclose(reevaluated, fresh(True), atol=1e-4)
    assert not torch.allclose(reevaluated, fresh(False), atol=1e-2)  # placeholders differ


def test_a_follow_up_repeating_the_prefix_with_its_image_evaluates_only_new_tokens(loaded):
    """A chat's next turn: the first prompt, its answer, new text; the image reused by hash."""
    inputs = inputs_of(loaded, LATE)
    e = engine(loaded)
    try:
        seq = e.submit(request(inputs, num_keep=4, num_predict=3))
        finish(seq)
        new = [300, 301]
        follow = [*inputs.tokens, *seq.generated, *new]
        done = finish(e.submit(request(inputs, num_keep=4, num_predict=1, tokens=follow)))
    finally:
        e.close()
    # the last answer token was never evaluated (sampled, not yet fed back): it runs now
    assert done.prompt_eval_count == 1 + len(new)
    assert done.prompt_cached_count == len(follow) - 1 - len(new)
