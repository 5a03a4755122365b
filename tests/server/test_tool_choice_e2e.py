"""Issue 14 through a real `ember serve` on qwen2.5-coder:0.5b and the `openai` client: sampled
answers (temperature 1) to tool_choice "required" and a named function are always a schema-valid
call; "none" never is; the same seed gives the same text on every route; logit_bias and the
completions logprobs act on real tokens."""

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import openai
import pytest
from serve_process import Server

from ember.gguf import GGUFFile
from ember.tokenizer import Tokenizer

pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.slow]

MODEL = "qwen2.5-coder:0.5b"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
TIME = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 40}},
    "required": ["timezone"],
}
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": name, "description": name, "parameters": schema}}
    for name, schema in SCHEMAS.items()
]
MESSAGES: list[Any] = [{"role": "user", "content": "Is it warm in Lisbon right now?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, qwen2_path: Path) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("tool_choice"), EMBER_NUM_PARALLEL="4")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def oai(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", timeout=600)


def sampled_calls(oai: openai.OpenAI, tool_choice: Any, requests: int) -> list[Any]:
    """The tool calls of requests × 4 choices sampled at temperature 1 (one call allowed each)."""
    calls = []
    for seed in range(requests):
        reply = oai.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice=tool_choice,
            parallel_tool_calls=False,
            temperature=1.0,
            seed=seed * 10,
            n=4,
            max_tokens=96,
        )
        for choice in reply.choices:
            assert choice.finish_reason == "tool_calls", choice.message
            assert choice.message.tool_calls and len(choice.message.tool_calls) == 1
            calls.append(choice.message.tool_calls[0].function)
    return calls


def test_required_and_a_named_function_always_give_schema_valid_calls(oai):
    required = sampled_calls(oai, "required", 3)
    named = sampled_calls(oai, {"type": "function", "function": {"name": "get_time"}}, 2)
    assert len(required) + len(named) == 20
    for call in required + named:
        jsonschema_rs.validate(SCHEMAS[call.name], json.loads(call.arguments))
    assert {call.name for call in named} == {"get_time"}


def test_none_gives_no_call(oai):
    reply = oai.chat.completions.create(
        model=MODEL, messages=MESSAGES, tools=TOOLS, tool_choice="none", max_tokens=8, seed=1
    )
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_the_same_seed_gives_the_same_sampled_text_on_native_and_v1_routes(server, oai):
    options = {"temperature": 1.0, "seed": 7, "num_predict": 8}
    body = {"model": MODEL, "prompt": "Write a haiku about rust.", "stream": False}
    replies = [
        httpx.post(f"{server.url}/api/generate", json={**body, "options": options}, timeout=600)
        for _ in "ab"
    ]
    assert replies[0].json()["response"] == replies[1].json()["response"] != ""
    chats = [
        oai.chat.completions.create(
            model=MODEL, messages=MESSAGES, temperature=1.0, seed=7, max_tokens=8
        )
        for _ in "ab"
    ]
    assert chats[0].choices[0].message.content == chats[1].choices[0].message.content


def test_logit_bias_and_completion_logprobs_on_real_tokens(oai, qwen2_path):
    tokenizer = Tokenizer.from_metadata(GGUFFile.open(qwen2_path).metadata)
    [banana] = tokenizer.encode(" banana", add_special=False)
    reply = oai.completions.create(
        model=MODEL,
        prompt="My favourite fruit is",
        max_tokens=3,
        temperature=0,
        logit_bias={str(banana): 100},
        logprobs=2,
    )
    choice = reply.choices[0]
    assert choice.text == " banana" * 3
    assert choice.logprobs is not None
    assert choice.logprobs.tokens == [" banana"] * 3
    assert choice.logprobs.text_offset == [0, 7, 14]
    # OpenAI's: the 2 most likely (before the bias) and the sampled token, if not among them
    tops = choice.logprobs.top_logprobs or []
    assert tops and all(len(top) in (2, 3) and " banana" in top for top in tops)
