"""The run loop with images on the tiny mllama: the encoder cache keeps one image per sequence,
so a prompt with an image gives the same tokens alone and beside three sequences with other
images (or none); a repeated prefix with its image evaluates only the new tokens; a context
shift that drops the image drops its cross-attention states and generation goes on."""

import threading

import pytest
import torch

pytest.importorskip("transformers")

from hf_mllama import build_mllama
from test_gemma3_vision import image_bytes

from ember.batch import Batch
from ember.convert import convert_directory
from ember.errors import EmberError
from ember.gguf import GGUFFile
from ember.kvcache import EncoderCache
from ember.model import load_model
from ember.options import Options
from ember.runner.engine import Engine
from ember.runner.multimodal import prompt_inputs
from ember.runner.sequence import Done, Request
from ember.tokenizer import Tokenizer

IMAGES = [((50, 30), "RGB", 1), ((20, 64), "RGBA", 2), ((33, 33), "L", 3), ((64, 48), "P", 4)]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    root = tmp_path_factory.mktemp("mllama-runner")
    build_mllama(root / "hf")
    convert_directory(root / "hf", root / "model.gguf")
    gguf = GGUFFile.open(root / "model.gguf")
    return load_model(gguf), Tokenizer.from_metadata(gguf.metadata)


def request(loaded, prompt: str, image: int | None, **options) -> Request:
    model, tok = loaded
    images = {} if image is None else {0: image_bytes(*IMAGES[image])}
    inputs = prompt_inputs(prompt, images, tok, model)
    greedy = Options(temperature=0, num_predict=options.pop("num_predict", 8), **options)
    return Request(inputs.tokens, greedy, same_batch=inputs.same_batch,
                   multimodal=inputs.multimodal, image_hashes=inputs.image_hashes)  # fmt: skip


def prompt(i: int) -> str:
    return f"Hello world {'the sky ' * i}[img-0] is blue"


def run(engine: Engine, requests: list[Request]) -> list[list[int]]:
    out: list[list[int]] = [[] for _ in requests]

    def one(i: int) -> None:
        seq = engine.submit(requests[i])
        while not isinstance(seq.events.get(timeout=300), Done):
            pass
        out[i] = list(seq.generated)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def generate(e: Engine, req: Request) -> tuple[list[int], Done]:
    seq = e.submit(req)
    while not isinstance(done := seq.events.get(timeout=300), Done):
        pass
    return list(seq.generated), done


def engine(loaded, *, num_parallel: int = 1, num_ctx: int = 64, num_batch: int = 64) -> Engine:
    model, tok = loaded
    return Engine(model, tok, num_parallel=num_parallel, num_ctx=num_ctx, num_batch=num_batch)


def encoder_of(e: Engine) -> EncoderCache:
    return next(c for c in e.cache.caches if isinstance(c, EncoderCache))  # type: ignore[attr-defined]


def test_the_image_is_one_token_carrying_its_states(loaded):
    model, _ = loaded
    req = request(loaded, prompt(0), 0)
    ((start, group),) = req.same_batch.items()
    assert group == 0 and req.inputs[start] == model.image_token
    assert req.multimodal[start].shape == (4 * 5, 64)  # 2 × 2 tiles of 5 positions


def test_a_second_image_in_a_prompt_is_refused(loaded):
    model, tok = loaded
    images = {0: image_bytes(*IMAGES[0]), 1: image_bytes(*IMAGES[1])}
    with pytest.raises(EmberError, match=r"^this model only supports one image while more than"):
        prompt_inputs("[img-0] and [img-1]", images, tok, model)


def test_the_load_plan_counts_an_image_per_sequence(loaded):
    model, _ = loaded
    cache = model.make_cache()
    encoder = next(c for c in cache.caches if isinstance(c, EncoderCache))
    per_image = 4 * 5 * 1 * 2 * 2 * 16 * 4  # tiles, positions, cross layers, k/v, heads, dim
    assert encoder.planned_bytes(max_sequences=3, capacity=64, max_batch=8) == 3 * per_image


def test_an_image_prompt_alone_equals_it_beside_three_others(loaded):
    """Four sequences with four images (and one with none) in shared batches: each sequence's
    rows attend to its own image only."""
    requests = [request(loaded, prompt(i), i) for i in range(4)]
    requests.append(request(loaded, "Hello world the sky is blue", None))
    alone = []
    for r in requests:
        e = engine(loaded)
        try:
            alone += run(e, [r])
        finally:
            e.close()
    e = engine(loaded, num_parallel=5)
    try:
        together = run(e, requests)
        assert len(encoder_of(e).entries) == 4  # one image per sequence that has one
    finally:
        e.close()
    assert together == alone
    assert len({tuple(t) for t in alone}) > 1 and all(alone)


def test_a_prompt_split_over_batches_gives_the_same_tokens(loaded):
    """Rows see the image by position: the batch they run in does not matter."""
    req = request(loaded, prompt(3), 2)
    results = []
    for num_batch in (3, 64):
        e = engine(loaded, num_batch=num_batch)
        try:
            results.append(run(e, [req]))
        finally:
            e.close()
    assert results[0] == results[1]


def test_a_repeated_prefix_with_its_image_evaluates_only_the_new_tokens(loaded):
    first = request(loaded, prompt(1), 1)
    longer = request(loaded, prompt(1) + " and the sea is green", 1)
    fresh = engine(loaded)
    try:
        expected, _ = generate(fresh, longer)
    finally:
        fresh.close()
    e = engine(loaded)
    try:
        generate(e, first)
        again, done = generate(e, longer)
    finally:
        e.close()
    assert done.prompt_eval_count == len(longer.inputs) - len(first.inputs)
    assert again == expected  # the image's states came from the encoder cache


def test_a_context_shift_that_drops_the_image_drops_its_states(loaded):
    req = request(loaded, prompt(0), 0, num_predict=40, num_keep=1)
    (start,) = req.same_batch
    e = engine(loaded, num_ctx=24)
    encoder = encoder_of(e)
    seen: list[int | None] = []
    original = encoder.remove

    def spy(seq: int, begin: int, end: int | None) -> None:
        original(seq, begin, end)
        seen.append(encoder.image_position(seq))

    encoder.remove = spy  # type: ignore[method-assign]
    try:
        tokens, done = generate(e, req)
    finally:
        e.close()
    assert 1 <= start < 12 and len(tokens) == 40 and done.done_reason == "length"
    assert None in seen  # the shift removed the image's position
    assert encoder.entries == {}  # and nothing of it stayed


def test_the_encoder_cache_follows_removals_and_shared_prefixes():
    cache = EncoderCache()
    cache.init(max_sequences=3, capacity=32, max_batch=8)
    batch = Batch((1, 2, 3, 4), (5, 6, 9, 10), (0, 0, 1, 1), (1, 3), (0, 2), ("a", "b"))
    cache.start_forward(batch)
    for seq in (0, 1):
        cache.set_layer(3)
        cache.store(seq, torch.ones(7, 2, 4) * seq, torch.zeros(7, 2, 4))
    assert cache.image_row(1) == 2 and cache.lookup(1)[0].shape == (2, 7, 4)
    cache.remove(1, 2, 4)  # before the image: it moves down
    assert cache.image_position(1) == 7
    cache.copy_prefix(0, 2, 6)  # the image (at 5) is in the shared prefix
    assert torch.equal(cache.lookup(2)[0], cache.lookup(0)[0])
    cache.remove(0, 5, None)
    assert cache.image_position(0) is None and cache.image_position(2) == 5
    cache.copy_prefix(1, 2, 3)  # no image below 3 in 1: 2's image at 5 stays past the prefix
    assert cache.image_position(2) == 5
    cache.copy_prefix(1, 2, 8)
    assert cache.image_position(2) == 7
