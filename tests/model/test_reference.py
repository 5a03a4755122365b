"""Real models against the transformers references: prompt ids, first-step logits, greedy runs."""

import pytest
import torch

from ember.backend import native
from ember.backend.precision import float_activations
from ember.batch import Batch
from ember.model import forward

LOGIT_TOLERANCE = 0.05  # of max |logit|, over the reference's top 20
# Greedy tokens may part from the reference only at a step whose reference gap (first logit
# less second) is below this, and must agree until they do. The issue asks 0.2 (llama.cpp
# diverges at gaps of 0.13-0.15); over a float32 cache ours holds to 0.05.
GAP_REQUIRED = 0.05
# Over a half or 8-bit cache, the 0.2: rounding K and V to f16 turns the last-place
# differences between CPUs' vector math (torch's softmax: Sleef's 16-lane and 8-lane exp) into
# flips of the cache's roundings. On an Intel Xeon, SmolLM2's chat prompt's second step, a
# reference gap of 0.054, came out 0.07 the other way over f16 (0.01 the reference's way over
# float32); on the Zen 5 EPYC the tests were first run on, it held.
GAP_REQUIRED_REDUCED_CACHE = 0.2
# A step where our own top two are this close is a tie within float32's last places: two prompt
# attentions equally exact against float64 (~5e-7 of the largest output in every layer: the
# native kernel and oneDNN's products) put SmolLM2's chat prompt's second step 0.011 the
# reference's way and 0.007 the other (a reference gap of 0.054). Parting there is allowed
# wherever the reference's gap is under the 0.2.
OWN_TIE = 0.02
# A model whose projections are K types throughout takes x as q8_K's int8 codes (one pass,
# llama.cpp's rounding: precision.py's activation_passes) in most of its products, where the
# other bundled models' 32-element types keep int16 or float32: its greedy runs are held to the
# issue's 0.2 over any cache, as llama.cpp's would be. Qwen2.5-Coder 1.5B's "capital of France"
# parts at a reference gap of 0.098 over a float32 cache (its own gap 0.022 the other way).
INT8_ACTIVATIONS = {"qwen2.5-coder:1.5b"}


def int16_activations() -> bool:
    """Whether this run's kernels take one row's x as int16 codes per 32 values for the
    32-element types (the avx2, avxvnni and portable paths; the AVX-512 ones take float32 x:
    precision.float_activations). Its greedy runs are held to the issue's 0.2 as well: on the
    avx2 path SmolLM2's chat prompt's second step (a reference gap of 0.054) comes out 0.04 the
    other way, its Q8_0 head's x rounded where the AVX-512 paths' is not (a tie of 0.003 there)."""
    kern = native.usable_kernels()
    return kern is not None and not float_activations(kern.isa)


def run_prompt(
    llm, ids: list[int], steps: int, *, kv_type: str = "f32", chunk: int = 512
) -> tuple[torch.Tensor, list[int], list[float]]:
    """First-step logits over ids (fed chunk tokens a batch), then `steps` greedy tokens (not
    stopped at end tokens) and each step's gap between its first and second logit, over a KV
    cache of kv_type."""
    model, cache = llm.model, llm.model.make_cache()
    cache.init(max_sequences=1, capacity=len(ids) + steps, max_batch=chunk, dtype=kv_type)
    logits = torch.empty(0)
    for start in range(0, len(ids), chunk):
        logits = forward(model, cache, Batch.single(ids[start : start + chunk], start))[0]
    first, out, gaps = logits.clone(), [], []
    for step in range(steps):
        out.append(int(logits.argmax()))
        top2 = logits.topk(2).values
        gaps.append(float(top2[0] - top2[1]))
        if step < steps - 1:
            logits = forward(model, cache, Batch.single([out[-1]], len(ids) + step))[0]
    return first, out, gaps


PROMPTS = {
    "smollm2:135m": ["chat_why_sky_blue", "raw_capital_of_france", "chat_ollama_template"],
    # chat_sky_blue_and_red (26 tokens, tests/reference/make_gemma_chat_reference.py): a chat
    # past 16 tokens, which takes a prompt's own products in one batch
    "gemma3:270m": [
        "chat_why_sky_blue",
        "chat_sky_blue_and_red",
        "raw_capital_of_france",
        "long_sliding_window",
    ],
    "qwen2.5-coder:0.5b": ["chat_why_sky_blue", "raw_capital_of_france", "raw_code_fibonacci"],
    # K types throughout (the others are mostly 32-element types): the K-type kernels at a real
    # size, the q8_K one-pass products among them; its packages are requirements-models-large.txt
    # (CI installs them; elsewhere these cases skip without them)
    "qwen2.5-coder:1.5b": ["chat_why_sky_blue", "raw_capital_of_france", "raw_code_fibonacci"],
}
CASES = [pytest.param(m, p, id=f"{m}-{p}") for m, prompts in PROMPTS.items() for p in prompts]


# Half-size and quantized caches (the engine's default is f16): the same bar. The gemma3 case
# feeds 64 tokens a batch, so its sliding-window layers hold 512 + 64 cells, not all 868.
KV_CASES = [
    pytest.param("smollm2:135m", "chat_why_sky_blue", "f16", 512, id="smollm2-f16"),
    pytest.param("smollm2:135m", "raw_capital_of_france", "q8_0", 512, id="smollm2-q8_0"),
    pytest.param("gemma3:270m", "long_sliding_window", "f16", 64, id="gemma3-window-f16"),
    pytest.param("gemma3:270m", "chat_sky_blue_and_red", "f16", 512, id="gemma3-chat-f16"),
    pytest.param("qwen2.5-coder:0.5b", "raw_code_fibonacci", "q8_0", 512, id="qwen-q8_0"),
]


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize(("name", "prompt"), CASES)
def test_matches_reference(real_llm, reference, name, prompt, record_property):
    check(real_llm, reference, name, prompt, record_property)


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize(("name", "prompt", "kv_type", "chunk"), KV_CASES)
def test_kv_cache_types_match_reference(
    real_llm, reference, name, prompt, kv_type, chunk, record_property
):
    check(real_llm, reference, name, prompt, record_property, kv_type=kv_type, chunk=chunk)


@pytest.mark.model
@pytest.mark.slow
def test_a_chats_logits_do_not_depend_on_its_batches(real_llm, reference):
    """Gemma 3's 26-token chat in one batch (a prompt's own products) and in batches of 8 (the
    decode kernels) ends on the same logits: a prompt's rows round as they would alone. Where
    the MLP's gate and up took gemm8's int8 for a prompt, the two were 5.7% of the largest apart
    over the f16 cache, and the one batch 5.8% from the reference."""
    ids = reference("gemma3:270m")["prompts"]["chat_sky_blue_and_red"]["prompt_ids"]
    llm = real_llm("gemma3:270m")
    whole = run_prompt(llm, ids, 1, kv_type="f16")[0]
    pieces = run_prompt(llm, ids, 1, kv_type="f16", chunk=8)[0]
    assert (whole - pieces).abs().max() <= 2e-3 * whole.abs().max()


# The other ISA paths this CPU runs (the best one, the default, takes the cases above): every
# prompt over the engine's default f16 cache, and Gemma 3's long prompt in batches of 64 too.
OTHER_ISAS = native.runnable_isas()[1:] if native.available() else []
ISA_CASES = [
    pytest.param(isa, name, prompt, chunk, id=f"{isa}-{name}-{prompt}-{chunk}")
    for isa in OTHER_ISAS
    for name, prompts in PROMPTS.items()
    for prompt in prompts
    for chunk in ([512, 64] if prompt == "long_sliding_window" else [512])
]


@pytest.fixture(scope="module")
def isa_llm(real_llm):
    """LLMs by (name, isa), loaded under EMBER_CPU_ISA=isa (their weights keep that path)."""
    from ember import LLM

    loaded = {}

    def get(name: str, isa: str):
        if (name, isa) not in loaded:
            real_llm(name)  # skips when the model's package is missing
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("EMBER_CPU_ISA", isa)
                loaded[name, isa] = LLM(name)
        return loaded[name, isa]

    return get


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize(("isa", "name", "prompt", "chunk"), ISA_CASES)
def test_other_isa_paths_match_reference(
    monkeypatch, isa_llm, weight_isas, reference, isa, name, prompt, chunk, record_property
):
    llm = isa_llm(name, isa)
    monkeypatch.setenv("EMBER_CPU_ISA", isa)  # for what picks its path at run time (attention)
    assert weight_isas(llm.model) == {isa}
    check(lambda _: llm, reference, name, prompt, record_property, kv_type="f16", chunk=chunk)


def check(real_llm, reference, name, prompt, record_property, **run) -> None:
    ref = reference(name)["prompts"][prompt]
    llm = real_llm(name)
    assert llm.tokenize(ref["prompt_text"]) == ref["prompt_ids"]
    greedy = ref["greedy"]
    first, ids, own_gaps = run_prompt(llm, ref["prompt_ids"], greedy["n_steps"], **run)

    top = ref["first_step"]["top_ids"]
    expected = torch.tensor(ref["first_step"]["top_logits"])
    closeness = float((first[top] - expected).abs().max() / expected.abs().max())
    record_property("top20_max_rel_diff", closeness)
    assert closeness < LOGIT_TOLERANCE

    gaps, expected_ids = greedy["gap_to_second"], greedy["ids"]
    reduced = run.get("kv_type", "f32") != "f32" or name in INT8_ACTIVATIONS or int16_activations()
    near_tie = GAP_REQUIRED_REDUCED_CACHE if reduced else GAP_REQUIRED
    # The first step's pick parts from the reference's as a greedy step may: for one of its top
    # tokens within the near-tie gap of its first. On a Zen 2 (AVX2 only: torch's AVX2 kernels
    # beside the avx2 path's), Gemma 3's long prompt over a float32 cache scored the reference's
    # second 0.002 above its first (a reference gap of 0.116; every top-20 logit within 0.3%).
    pick = int(first.argmax())
    if pick != top[0]:
        allowed = GAP_REQUIRED_REDUCED_CACHE if own_gaps[0] < OWN_TIE else near_tie
        assert pick in top and float(expected[0] - expected[top.index(pick)]) < allowed, (
            f"the first step picked {pick} where the reference picks {top[0]}"
        )
    parted = next(
        (i for i, (a, b) in enumerate(zip(ids, expected_ids, strict=True)) if a != b), None
    )
    record_property("parted_at_step", parted)
    if parted is not None and own_gaps[parted] < OWN_TIE:
        near_tie = GAP_REQUIRED_REDUCED_CACHE
    if parted is not None:
        assert gaps[parted] < near_tie, (
            f"parted from the reference at step {parted}, where its gap is {gaps[parted]:.3f}: "
            f"{ids[: parted + 1]} against {expected_ids[: parted + 1]}"
        )
