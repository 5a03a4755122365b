"""The run loop with images on the tiny Gemma 3 vision model: a prompt with an image gives the
same tokens alone, beside three other sequences with other images, and with a num_batch smaller
than the image's span (the span is one same_batch group, so it is never split)."""

import threading

import pytest

pytest.importorskip("transformers")

from hf_vision import build_gemma3_vision
from test_gemma3_vision import image_bytes

from ember.convert import convert_directory
from ember.gguf import GGUFFile
from ember.model import load_model
from ember.options import Options
from ember.runner.engine import Engine
from ember.runner.multimodal import prompt_inputs
from ember.runner.sequence import Done, Request
from ember.tokenizer import Tokenizer

IMAGES = [((50, 30), "RGB", 1), ((20, 64), "RGBA", 2), ((33, 33), "L", 3), ((64, 48), "P", 4)]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    root = tmp_path_factory.mktemp("vision-runner")
    build_gemma3_vision(root / "hf")
    convert_directory(root / "hf", root / "model.gguf")
    gguf = GGUFFile.open(root / "model.gguf")
    return load_model(gguf), Tokenizer.from_metadata(gguf.metadata)


def request(loaded, i: int) -> Request:
    model, tok = loaded
    inputs = prompt_inputs(
        f"Hello world {'the sky ' * i}[img-0] is blue", {0: image_bytes(*IMAGES[i])}, tok, model
    )
    greedy = Options(temperature=0, num_predict=8)
    return Request(inputs.tokens, greedy, same_batch=inputs.same_batch,
                   multimodal=inputs.multimodal, image_hashes=inputs.image_hashes)  # fmt: skip


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


def engine(loaded, *, num_parallel: int, num_batch: int) -> Engine:
    model, tok = loaded
    return Engine(model, tok, num_parallel=num_parallel, num_ctx=64, num_batch=num_batch)


def test_the_prompt_holds_the_image_span(loaded):
    model, _ = loaded
    req = request(loaded, 0)
    span = model.image_span(model.encode_multimodal(image_bytes(*IMAGES[0])))
    ((offset, rows),) = span.pieces.items()
    (start,) = req.same_batch
    assert req.inputs[start : start + len(span.tokens)] == span.tokens
    assert set(req.multimodal) == {start + offset}
    assert req.multimodal[start + offset].shape == rows.shape
    assert rows.shape[1] == 64 and len(span.tokens) > len(rows)


def test_an_image_prompt_alone_equals_it_beside_three_others(loaded):
    requests = [request(loaded, i) for i in range(4)]
    alone = []
    for r in requests:
        e = engine(loaded, num_parallel=1, num_batch=64)
        try:
            alone += run(e, [r])
        finally:
            e.close()
    e = engine(loaded, num_parallel=4, num_batch=64)
    try:
        together = run(e, requests)
    finally:
        e.close()
    assert together == alone
    assert all(len(t) > 0 for t in alone)


def test_an_image_longer_than_num_batch_gives_the_same_tokens(loaded):
    requests = [request(loaded, i) for i in range(2)]
    results = []
    for num_batch in (3, 64):  # the image's span is 8 inputs
        e = engine(loaded, num_parallel=2, num_batch=num_batch)
        try:
            results.append(run(e, requests))
        finally:
            e.close()
    assert results[0] == results[1]


def generate(e: Engine, req: Request) -> tuple[list[int], Done]:
    seq = e.submit(req)
    while not isinstance(done := seq.events.get(timeout=300), Done):
        pass
    return list(seq.generated), done


def test_a_repeated_prompt_with_its_image_evaluates_only_the_new_tokens(loaded):
    """Images are compared by hash: the same image is reused from the cache, another is not
    (their placeholders are the same tokens)."""
    req = request(loaded, 1)
    (start,) = req.same_batch
    e = engine(loaded, num_parallel=1, num_batch=64)
    try:
        first, done = generate(e, req)
        again, repeated = generate(e, request(loaded, 1))
        other = request(loaded, 1)
        model, tok = loaded
        swapped = prompt_inputs(
            "Hello world the sky [img-0] is blue", {0: image_bytes(*IMAGES[2])}, tok, model
        )
        other = Request(
            swapped.tokens,
            other.options,
            same_batch=swapped.same_batch,
            multimodal=swapped.multimodal,
            image_hashes=swapped.image_hashes,
        )
        _, changed = generate(e, other)
    finally:
        e.close()
    assert swapped.tokens == req.inputs  # the same tokens: only the image differs
    assert done.prompt_eval_count == len(req.inputs)
    assert repeated.prompt_eval_count == 0  # all cached, with the logits after it
    assert again == first
    assert changed.prompt_eval_count == len(req.inputs) - start  # from the image's span on


def test_the_load_reservation_takes_the_span_every_image_has(loaded, monkeypatch):
    """Gemma 3 resizes every image to one size, so its span's length is known without running
    the tower at load (27 layers over 4,096 patches on gemma3:4b)."""
    model, _ = loaded
    span = model.image_span(model.encode_multimodal(image_bytes(*IMAGES[0])))
    assert len(span.tokens) == model.longest_image_span

    def refuse(self, data: bytes):
        raise AssertionError("the tower ran at load")

    monkeypatch.setattr(type(model), "encode_multimodal", refuse)
    engine(loaded, num_parallel=1, num_batch=16).close()
