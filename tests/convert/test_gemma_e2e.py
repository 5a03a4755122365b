"""Tiny random-weight Gemma 4 (sliding and full layers, shared keys, per-layer embeddings) and
Gemma 3n (AltUp, LAuReL besides) through `ember create` from their HF folders and a real `ember
serve`, asked by the `ollama` client: greedy tokens equal transformers' own greedy generation,
and a generation past num_ctx shifts the context and finishes."""

import pytest

pytest.importorskip("transformers")
pytest.importorskip("ollama")

from served_family import ask, greedy, past_num_ctx, served_family

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PROMPT = "the quick brown fox jumps over the lazy dog and then"


@pytest.fixture(scope="module", params=["gemma4", "gemma3n"])
def served(request, tmp_path_factory):
    family = request.param
    with served_family(tmp_path_factory.mktemp(family), family, f"{family}-tiny") as served:
        yield (*served, f"{family}-tiny")


def test_greedy_tokens_equal_transformers(served):
    server, hf, tokenizer, name = served
    answer = ask(server, name, PROMPT)
    assert answer.response == greedy(hf, tokenizer, PROMPT, 12) and answer.eval_count == 12


def test_a_generation_past_num_ctx_shifts_and_finishes(served):
    assert past_num_ctx(served[0], served[3], PROMPT)
