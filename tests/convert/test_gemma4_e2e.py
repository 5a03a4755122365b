"""A tiny random-weight Gemma 4 (sliding and full layers, shared keys, per-layer embeddings)
through `ember create` from its HF folder and a real `ember serve`, asked by the `ollama` client:
greedy tokens equal transformers' own greedy generation, and a generation past num_ctx shifts
the context and finishes."""

import pytest

pytest.importorskip("transformers")
pytest.importorskip("ollama")

from served_family import ask, greedy, past_num_ctx, served_family

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PROMPT = "the quick brown fox jumps over the lazy dog and then"
NAME = "gemma4-tiny"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_family(tmp_path_factory.mktemp("gemma4"), "gemma4", NAME) as served:
        yield served


def test_greedy_tokens_equal_transformers(served):
    server, hf, tokenizer = served
    answer = ask(server, NAME, PROMPT)
    assert answer.response == greedy(hf, tokenizer, PROMPT, 12) and answer.eval_count == 12


def test_a_generation_past_num_ctx_shifts_and_finishes(served):
    assert past_num_ctx(served[0], NAME, PROMPT)
