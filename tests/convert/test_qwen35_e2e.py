"""A tiny random-weight Qwen3.5 (gated DeltaNet and gated attention layers) through `ember
create` from its HF folder and a real `ember serve`, asked by the `ollama` client: greedy tokens
equal transformers' own greedy generation, alone, as parallel requests and after a cached
prompt; a generation past num_ctx (which a recurrent state cannot shift) evaluates the kept
tokens again and finishes."""

import concurrent.futures

import pytest

pytest.importorskip("transformers")
pytest.importorskip("ollama")

from served_family import ask, greedy, past_num_ctx, served_family

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PROMPT = "the quick brown fox jumps over the lazy dog and then"
NAME = "qwen35-tiny"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with served_family(tmp_path_factory.mktemp("qwen35"), "qwen3.5", NAME) as served:
        yield served


def test_greedy_tokens_equal_transformers(served):
    server, hf, tokenizer = served
    answer = ask(server, NAME, PROMPT)
    assert answer.response == greedy(hf, tokenizer, PROMPT, 12) and answer.eval_count == 12


def test_parallel_requests_each_equal_transformers(served):
    server, hf, tokenizer = served
    prompts = [PROMPT, "a b c d e f g", "the lazy dog sleeps and the fox"]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda p: ask(server, NAME, p).response, prompts))
    assert answers == [greedy(hf, tokenizer, p, 12) for p in prompts]


def test_a_longer_prompt_after_a_cached_one_equals_transformers(served):
    """(It resumes from the recurrent state's checkpoint: tests/convert/test_qwen35.py counts the
    tokens evaluated; the API reports the whole prompt, as Ollama's.)"""
    server, hf, tokenizer = served
    first = "the fox and the dog"
    ask(server, NAME, first, count=1)  # its slot holds the prompt, its state checkpointed
    follow = first + " ran over the hill and then"
    assert ask(server, NAME, follow).response == greedy(hf, tokenizer, follow, 12)


def test_a_generation_past_num_ctx_evaluates_again_and_finishes(served):
    assert past_num_ctx(served[0], NAME, PROMPT)
