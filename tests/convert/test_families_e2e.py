"""Tiny random-weight models of the families converted from safetensors whose layers are more
than attention and an MLP: Gemma 4 (two head sizes, shared keys, per-layer embeddings), Gemma 3n
(AltUp, LAuReL besides), Qwen3.5 (gated DeltaNet and gated attention) and Nemotron-H (Mamba 2,
attention, MLPs and experts), through `ember create` from their HF folders and a real `ember
serve`, asked by the `ollama` client: greedy tokens equal transformers' own greedy generation,
alone, as parallel requests and after a cached prompt; a generation past num_ctx shifts (or,
where a recurrent state cannot shift, evaluates the kept tokens again) and finishes; the `openai`
client's streamed chat equals the `ollama` client's."""

import concurrent.futures

import pytest

pytest.importorskip("transformers")
ollama = pytest.importorskip("ollama")

from served_family import ask, greedy, past_num_ctx, served_family  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
PROMPT = "the quick brown fox jumps over the lazy dog and then"


@pytest.fixture(scope="module", params=["gemma4", "gemma3n", "qwen3.5", "nemotron-h"])
def served(request, tmp_path_factory):
    family = request.param
    with served_family(tmp_path_factory.mktemp(family), family, f"{family}-tiny") as served:
        yield (*served, f"{family}-tiny")


def test_greedy_tokens_equal_transformers(served):
    server, hf, tokenizer, name = served
    answer = ask(server, name, PROMPT)
    assert answer.response == greedy(hf, tokenizer, PROMPT, 12) and answer.eval_count == 12


def test_parallel_requests_each_equal_transformers(served):
    server, hf, tokenizer, name = served
    prompts = [PROMPT, "a b c d e f g", "the lazy dog sleeps and the fox"]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(lambda p: ask(server, name, p).response, prompts))
    assert answers == [greedy(hf, tokenizer, p, 12) for p in prompts]


def test_a_longer_prompt_after_a_cached_one_equals_transformers(served):
    """(It resumes from the recurrent state's checkpoint: test_qwen35.py and test_nemotronh.py count
    the tokens evaluated; the API reports the whole prompt, as Ollama's.)"""
    server, hf, tokenizer, name = served
    first = "the fox and the dog"
    ask(server, name, first, count=1)  # its slot holds the prompt, its state checkpointed
    follow = first + " ran over the hill and then"
    assert ask(server, name, follow).response == greedy(hf, tokenizer, follow, 12)


def test_a_generation_past_num_ctx_finishes(served):
    assert past_num_ctx(served[0], served[3], PROMPT)


def test_the_openai_client_chats_as_the_ollama_client(served):
    openai = pytest.importorskip("openai")
    server, name = served[0], served[3]
    messages = [{"role": "user", "content": "the quick brown fox"}]
    native = ollama.Client(server.url).chat(
        model=name, messages=messages, options={"temperature": 0, "num_predict": 8}
    )
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="ember")
    stream = client.chat.completions.create(
        model=name, messages=messages, temperature=0, max_tokens=8, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == native.message.content and chunks[-1].usage.completion_tokens == 8
