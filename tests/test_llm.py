"""The embeddable Python API on real models, as a user calls it."""

import json

import pytest

from ember import LLM, ModelNotFoundError, OptionsError

pytestmark = pytest.mark.model

GREEDY = {"temperature": 0}


def test_raw_greedy_generation_follows_the_reference(real_llm, reference):
    llm = real_llm("smollm2:135m")
    ref = reference("smollm2:135m")["prompts"]["raw_capital_of_france"]
    result = llm.generate(ref["prompt_text"], raw=True, options={**GREEDY, "num_predict": 12})
    gaps = ref["greedy"]["gap_to_second"]
    must_hold = min(12, next(i for i, g in enumerate(gaps) if g < 0.2))
    assert result.tokens[:must_hold] == ref["greedy"]["ids"][:must_hold]
    assert result.text == llm.detokenize(result.tokens)
    assert result.prompt_eval_count == len(ref["prompt_ids"])
    assert result.eval_count == 12 and result.done_reason == "length"
    assert result.prompt_eval_duration > 0 and result.eval_duration > 0
    # the same prompt again, from the cache: still the whole prompt, as Ollama counts it
    again = llm.generate(ref["prompt_text"], raw=True, options={**GREEDY, "num_predict": 12})
    assert again.prompt_eval_count == len(ref["prompt_ids"])


def test_chat_template_wraps_the_prompt(real_llm, reference):
    for name in ("smollm2:135m", "gemma3:270m"):
        ref = reference(name)["prompts"]["chat_why_sky_blue"]
        assert real_llm(name).prompt_ids("Why is the sky blue?") == ref["prompt_ids"]


def test_stream_yields_the_same_text(real_llm):
    llm = real_llm("smollm2:135m")
    options = {**GREEDY, "num_predict": 16}
    whole = llm.generate("Name three colours.", options=options)
    stream = llm.generate("Name three colours.", options=options, stream=True)
    pieces = list(stream)
    assert "".join(pieces) == whole.text and stream.result.tokens == whole.tokens
    assert len(pieces) > 1


def test_stop_string_is_never_emitted(real_llm):
    llm = real_llm("smollm2:135m")
    free = llm.generate("Count: 1, 2, 3,", raw=True, options={**GREEDY, "num_predict": 20})
    stop = free.text.strip()[2:5]
    assert stop, free.text
    result = llm.generate("Count: 1, 2, 3,", raw=True, options={**GREEDY, "stop": [stop]})
    assert stop not in result.text and result.done_reason == "stop"
    assert free.text.startswith(result.text)


def test_seed_repeats_a_sampled_answer(real_llm):
    llm = real_llm("smollm2:135m")
    options = {"temperature": 1.0, "seed": 1234, "num_predict": 12}
    assert (
        llm.generate("Tell a story.", options=options).tokens
        == llm.generate("Tell a story.", options=options).tokens
    )


def test_generation_goes_past_num_ctx_by_shifting(real_llm):
    llm = real_llm("smollm2:135m")
    result = llm.generate(
        "Write a long essay about the sea.", options={**GREEDY, "num_ctx": 64, "num_predict": 120}
    )
    assert result.eval_count == 120 and result.done_reason == "length"


def test_tokenize_round_trips(real_llm):
    llm = real_llm("qwen2.5-coder:0.5b")
    text = "def f(x):\n    return x ** 2  # ünïcode 🙂"
    assert llm.detokenize(llm.tokenize(text)) == text


def test_bad_options_fail_before_generation(real_llm):
    llm = real_llm("smollm2:135m")
    with pytest.raises(OptionsError, match="unknown option"):
        llm.generate("hi", options={"temprature": 0})
    with pytest.raises(OptionsError, match="repeat_last_n"):
        llm.generate("hi", options={"repeat_last_n": -3})


def test_bad_arguments_are_clear_errors(real_llm):
    llm = real_llm("smollm2:135m")
    for prompt in (None, b"hi"):
        with pytest.raises(TypeError, match="prompt must be a str"):
            llm.generate(prompt)
    # as Ollama's: "" is no format
    assert llm.generate("Hi", format="", options={"num_predict": 2}).eval_count == 2
    for bad in (0, 1.5, "2", True):
        with pytest.raises(ValueError, match="num_parallel must be a positive int"):
            LLM("smollm2:135m", num_parallel=bad)


def test_an_llm_closes_as_a_context_manager(real_llm):
    from ember.options import Options

    with LLM("smollm2:135m", num_parallel=1) as llm:
        assert llm.generate("Hi", options={"num_predict": 1}).eval_count == 1
        engine = llm.engine_for(Options())
    assert llm._box.engine is None and engine.busy() == 0


def test_unknown_model_names_the_problem():
    with pytest.raises(ModelNotFoundError, match="nosuchmodel"):
        LLM("nosuchmodel:1b")
    with pytest.raises(ModelNotFoundError):
        LLM("/nonexistent/model.gguf")


def test_format_schema_is_always_enforced(real_llm):
    llm = real_llm("smollm2:135m")
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "colour": {"enum": ["red", "green", "blue"]},
            "sizes": {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
        },
        "required": ["name", "colour", "sizes"],
        "additionalProperties": False,
    }
    for seed in range(3):
        result = llm.generate(
            "Describe a shirt as JSON.",
            format=schema,
            options={"temperature": 1.0, "seed": seed, "num_predict": 200},
        )
        value = json.loads(result.text)
        assert (
            set(value) == {"name", "colour", "sizes"}
            and value["colour"] in schema["properties"]["colour"]["enum"]
        )
        assert result.done_reason == "stop"


def test_threads_share_the_engine_and_get_what_they_get_alone(real_llm):
    import threading

    llm = real_llm("smollm2:135m")
    prompts = ["Name a fruit.", "Name a river.", "Name a planet.", "Name a colour.", "Say hi."]
    options = {**GREEDY, "num_predict": 12}
    alone = [llm.generate(p, options=options).tokens for p in prompts]
    together: list[list[int]] = [[] for _ in prompts]

    def run(i: int) -> None:
        together[i] = llm.generate(prompts[i], options=options).tokens

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone


def test_leaving_a_stream_early_cancels_it(real_llm):
    import time

    from ember.options import Options

    llm = real_llm("smollm2:135m")
    stream = llm.generate("Tell a long story.", options={"num_predict": 5000}, stream=True)
    for _ in stream:
        break  # the iteration is closed here: its sequence is cancelled
    engine = llm.engine_for(Options())
    deadline = time.monotonic() + 5
    while engine.busy() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.busy() == 0 and stream.result is None


def test_a_stream_never_iterated_is_cancelled_when_dropped(real_llm):
    import gc

    from ember.options import Options

    llm = real_llm("smollm2:135m")
    stream = llm.generate("Tell a long story.", options={"num_predict": 5000}, stream=True)
    engine = llm.engine_for(Options())
    del stream
    gc.collect()
    assert _idle_within(engine, 5)


def test_a_stream_iterates_once(real_llm):
    llm = real_llm("smollm2:135m")
    stream = llm.generate("Hi", options={**GREEDY, "num_predict": 4}, stream=True)
    assert "".join(stream) == stream.result.text  # type: ignore[union-attr]
    assert list(stream) == []  # a second pass had waited forever on the read events


def test_close_ends_a_reload_waiting_for_a_running_stream():
    import threading

    llm = LLM("smollm2:135m", num_parallel=1)
    stream = iter(llm.generate("Tell a long story.", options={"num_predict": 5000}, stream=True))
    next(stream)
    other_size = {"options": {"num_ctx": 1024, "num_predict": 1}}
    reloaded = threading.Thread(target=llm.generate, args=("Hi",), kwargs=other_size)
    reloaded.start()
    llm.close()  # not behind the reload's wait: it ends the running stream, the reload goes on
    reloaded.join(timeout=30)
    assert not reloaded.is_alive()
    llm.close()


def test_an_llm_let_go_without_close_ends_its_engine():
    import gc
    import weakref

    llm = LLM("smollm2:135m", num_parallel=1)
    llm.generate("Hi", options={"num_predict": 1})
    thread = llm._box.engine._thread  # type: ignore[union-attr]
    gone = weakref.ref(llm)
    del llm
    gc.collect()
    assert gone() is None
    thread.join(timeout=10)
    assert not thread.is_alive()  # its loop (and KV cache) went with the LLM


def _idle_within(engine, seconds: float) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while engine.busy() and time.monotonic() < deadline:
        time.sleep(0.01)
    return engine.busy() == 0


def test_logprobs_of_each_token_with_the_top_ones(real_llm):
    llm = real_llm("smollm2:135m")
    r = llm.generate("Name a fruit.", options={**GREEDY, "num_predict": 8}, top_logprobs=3)
    assert len(r.logprobs) == r.eval_count == len(r.tokens)
    for lp, token in zip(r.logprobs, r.tokens, strict=True):
        assert lp.token == llm.tokenizer.token_bytes(token).decode("utf-8", "replace")
        assert len(lp.top) == 3 and lp.logprob <= 0
        values = [v for _, v in lp.top]
        assert values == sorted(values, reverse=True)
        assert lp.top[0] == (lp.token, lp.logprob)  # greedy: the chosen one is the most likely
    assert llm.generate("Hi", options={"num_predict": 2}).logprobs == []
    for bad in (True, 2.5, "3"):  # refused at the call, not in the engine's loop
        with pytest.raises(TypeError, match="top_logprobs must be an int"):
            llm.generate("Hi", options={"num_predict": 2}, top_logprobs=bad)
