"""Real models against the transformers references: prompt ids, first-step logits, greedy runs."""

import pytest
import torch

from ember.batch import Batch
from ember.model import forward

MODELS = ["smollm2:135m", "gemma3:270m", "qwen2.5-coder:0.5b"]
LOGIT_TOLERANCE = 0.05  # of max |logit|, over the reference's top 20
GAP_REQUIRED = 0.2  # greedy tokens must agree up to the first step whose reference gap is below


def run_prompt(llm, ids: list[int], steps: int) -> tuple[torch.Tensor, list[int]]:
    """First-step logits over ids, then `steps` greedy tokens (not stopped at end tokens)."""
    model, cache = llm.session.model, llm.session.model.make_cache()
    cache.init(max_sequences=1, capacity=len(ids) + steps, max_batch=512)
    logits = torch.empty(0)
    for start in range(0, len(ids), 512):
        logits = forward(model, cache, Batch.single(ids[start : start + 512], start))[0]
    first, out = logits.clone(), []
    for step in range(steps):
        out.append(int(logits.argmax()))
        if step < steps - 1:
            logits = forward(model, cache, Batch.single([out[-1]], len(ids) + step))[0]
    return first, out


def cases():
    for name in MODELS:
        for prompt in (
            "chat_why_sky_blue",
            "raw_capital_of_france",
            "raw_code_fibonacci",
            "chat_ollama_template",
            "long_sliding_window",
        ):
            yield pytest.param(name, prompt, id=f"{name}-{prompt}")


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize(("name", "prompt"), cases())
def test_matches_reference(real_llm, reference, name, prompt, record_property):
    ref = reference(name)["prompts"].get(prompt)
    if ref is None:
        pytest.skip(f"no {prompt} in the reference of {name}")
    llm = real_llm(name)
    assert llm.tokenize(ref["prompt_text"]) == ref["prompt_ids"]
    greedy = ref["greedy"]
    first, ids = run_prompt(llm, ref["prompt_ids"], greedy["n_steps"])

    top = ref["first_step"]["top_ids"]
    expected = torch.tensor(ref["first_step"]["top_logits"])
    closeness = float((first[top] - expected).abs().max() / expected.abs().max())
    record_property("top20_max_rel_diff", closeness)
    assert int(first.argmax()) == top[0]
    assert closeness < LOGIT_TOLERANCE

    gaps = greedy["gap_to_second"]
    must_hold = next((i for i, g in enumerate(gaps) if g < GAP_REQUIRED), len(gaps))
    assert ids[:must_hold] == greedy["ids"][:must_hold]
