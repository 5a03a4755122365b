"""/v1/messages over fake runners: Anthropic's message and its stream of events, the translation
of system, blocks, tools, tool_choice and tool results, the thinking budget (two completions),
stop sequences, count_tokens, Anthropic's error object, and x-api-key with the real client."""

import asyncio
import base64
import json
from collections.abc import AsyncGenerator, Iterator
from typing import Any

import anthropic
import pytest
from fastapi.testclient import TestClient
from server_fakes import FakeRunner, FakeStarter, fake_state, served_in_thread

from ember.envconfig import HostAddress
from ember.runner.client import free_port
from ember.server import budget, middleware
from ember.server.anthropic_api import MessagesRequest
from ember.server.api import parse_body
from ember.server.app import create_app
from ember.server.prompt import Message
from ember.server.thinking import THINK

TOOLS = [
    {"name": "f", "description": "the f tool", "input_schema": {"type": "object"}},
    {"name": "g", "input_schema": {"type": "object"}},
]
CALL = '<tool_call> {"name": "f", "arguments": {"x": 1}} </tool_call>'
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()


class ScriptedRunner(FakeRunner):
    """A FakeRunner that answers a prompt ending with a key of `replies` with its value, adds
    `final` to its final record, and sends `error` instead of it when given."""

    def __init__(self, path: str, **args: Any) -> None:
        self.replies: dict[str, str] = args.pop("replies", {})
        self.final: dict[str, Any] = args.pop("final", {})
        error = args.pop("error", None)
        super().__init__(path, **args)
        self.default, self.error = self.reply, error

    async def completion(self, prompt: str, **fields: Any) -> AsyncGenerator[dict[str, Any], None]:
        ends = [reply for end, reply in self.replies.items() if prompt.endswith(end)]
        self.reply = ends[0] if ends else self.default
        async for record in super().completion(prompt, **fields):
            yield {**record, **self.final} if record.get("done") else record


class ScriptedStarter(FakeStarter):
    async def __call__(self, path: str) -> FakeRunner:
        runner = ScriptedRunner(path, **self.runner_args)
        self.runners.append(runner)
        return runner


@pytest.fixture
def starter() -> ScriptedStarter:
    return ScriptedStarter()


@pytest.fixture
def client(starter: ScriptedStarter) -> Iterator[TestClient]:
    with TestClient(create_app(fake_state(starter))) as c:
        yield c


def post(client: TestClient, path: str = "/v1/messages", **body: Any) -> Any:
    body.setdefault("model", "fake")
    body.setdefault("max_tokens", 64)
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return client.post(path, json=body)


def events(response: Any) -> list[dict[str, Any]]:
    """The SSE events, each checked to be named by its type."""
    out = []
    for raw in response.text.strip().split("\n\n"):
        name, data = raw.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        out.append(event)
    return out


def test_message_object(client, starter):
    body = post(client, max_tokens=2, temperature=0.5, top_k=7, metadata={"user_id": "u"}).json()
    assert body["id"].startswith("msg_") and body["type"] == "message"
    assert body["role"] == "assistant" and body["model"] == "fake"
    assert body["content"] == [{"type": "text", "text": "Hello there"}]
    assert body["stop_reason"] == "max_tokens" and body["stop_sequence"] is None
    assert body["usage"] == {"input_tokens": 2, "output_tokens": 2}
    options = starter.runners[0].fields[0]["options"]
    assert (options["num_predict"], options["temperature"], options["top_k"]) == (2, 0.5, 7)


def test_system_blocks_and_content_blocks_make_the_prompt(client, starter):
    system = [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}]
    content = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    assert post(client, system=system, messages=[{"role": "user", "content": content}]).is_success
    prompt = starter.runners[0].prompts[0]
    assert prompt == "<system>Be brief.\nBe kind.</system>\n<user>one\ntwo</user>\n<assistant>"


def test_end_turn_and_stop_sequence(client, starter):
    assert post(client).json()["stop_reason"] == "end_turn"
    starter.runner_args["final"] = {"stop_sequence": "END"}
    body = post(client, model="other", stop_sequences=["END"]).json()
    assert (body["stop_reason"], body["stop_sequence"]) == ("stop_sequence", "END")
    assert starter.runners[-1].fields[0]["options"]["stop"] == ["END"]


def test_stream_events(client):
    r = post(client, stream=True)
    assert r.headers["content-type"].startswith("text/event-stream")
    got = events(r)
    assert [e["type"] for e in got[:3]] == ["message_start", "ping", "content_block_start"]
    assert got[0]["message"]["id"].startswith("msg_") and got[0]["message"]["content"] == []
    assert got[2]["content_block"] == {"type": "text", "text": ""}
    text = "".join(e["delta"]["text"] for e in got if e["type"] == "content_block_delta")
    assert text == "Hello there friend"
    assert [e["type"] for e in got[-3:]] == ["content_block_stop", "message_delta", "message_stop"]
    assert got[-2]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert got[-2]["usage"] == {"input_tokens": 2, "output_tokens": 3}
    # before the runner's count, Ollama's estimate: a quarter of the characters ("user", "hi")
    assert got[0]["message"]["usage"] == {"input_tokens": 1, "output_tokens": 0}


def test_message_start_estimates_the_input_tokens_as_ollama():
    tool = {"name": "f", "description": "d" * 38, "input_schema": {}}
    body = {"model": "m", "max_tokens": 8, "system": "s" * 40, "tools": [tool]}
    messages = [{"role": "user", "content": "u" * 36}, {"role": "assistant", "content": "a" * 31}]
    req = parse_body(MessagesRequest, json.dumps(body | {"messages": messages}))
    assert req.estimated_tokens() == (40 + 4 + 36 + 9 + 31 + 1 + 38 + 2) // 4


def test_tool_use_answer(client, starter):
    starter.runner_args["reply"] = CALL
    body = post(client, model="tooly", tools=TOOLS).json()
    [use] = body["content"]
    assert use["type"] == "tool_use" and use["id"].startswith("toolu_")
    assert (use["name"], use["input"]) == ("f", {"x": 1})
    assert body["stop_reason"] == "tool_use"
    assert "<tools>2</tools>" in starter.runners[0].prompts[0]


def test_tool_use_stream(client, starter):
    starter.runner_args["reply"] = CALL
    got = events(post(client, model="tooly", tools=TOOLS, stream=True))
    [start] = [e for e in got if e["type"] == "content_block_start"]
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["input"] == {}
    [delta] = [e for e in got if e["type"] == "content_block_delta"]
    assert delta["delta"] == {"type": "input_json_delta", "partial_json": '{"x":1}'}
    assert got[-2]["delta"]["stop_reason"] == "tool_use"


@pytest.mark.parametrize(
    ("choice", "native", "shown"),
    [
        ({"type": "auto"}, "auto", 2),
        ({"type": "any"}, "required", 2),
        ({"type": "tool", "name": "g"}, {"type": "function", "function": {"name": "g"}}, 1),
        ({"type": "none"}, "none", 0),
    ],
)
def test_tool_choice_maps_to_the_native_one(client, starter, choice, native, shown):
    body = {"model": "tooly", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    req = parse_body(MessagesRequest, json.dumps({**body, "tools": TOOLS, "tool_choice": choice}))
    assert req.native().tool_choice == native and req.native().parallel_tool_calls
    assert post(client, model="tooly", tools=TOOLS, tool_choice=choice).is_success
    assert (f"<tools>{shown}</tools>" in starter.runners[0].prompts[0]) == (shown > 0)


def test_disable_parallel_tool_use_and_unknown_tools():
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    choice = {"type": "any", "disable_parallel_tool_use": True}
    req = parse_body(MessagesRequest, json.dumps({**body, "tools": TOOLS, "tool_choice": choice}))
    assert req.native().parallel_tool_calls is False
    assert req.native().tools[0].function.description == "the f tool"


@pytest.mark.parametrize(
    ("fields", "think", "budget"),
    [
        ({}, None, None),
        ({"thinking": {"type": "enabled", "budget_tokens": 5}}, True, 5),
        ({"thinking": {"type": "disabled"}}, False, None),
        # adaptive leaves it to the effort, else to the model, as Ollama's
        ({"thinking": {"type": "adaptive"}}, None, None),
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}, "high", None),
        ({"output_config": {"effort": "xhigh"}}, "high", None),
        ({"output_config": {"effort": "low"}, "thinking": {"type": "disabled"}}, False, None),
    ],
)
def test_thinking_and_effort_become_think(fields, think, budget):
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    req = parse_body(MessagesRequest, json.dumps({**body, **fields}))
    assert (req.native().think, req.thinking_budget()) == (think, budget)


def test_output_config_format_is_the_native_format():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    output = {"format": {"type": "json_schema", "schema": schema}}
    req = parse_body(MessagesRequest, json.dumps({**body, "output_config": output}))
    assert req.native().format == schema


def test_tool_round_trip_translation():
    use = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"x": 1}}
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [{"type": "text", "text": "no such x"}],
        "is_error": True,
    }
    messages = [
        {"role": "user", "content": "call f"},
        {"role": "assistant", "content": [{"type": "text", "text": "Calling."}, use]},
        {"role": "user", "content": [result, {"type": "text", "text": "and now?"}]},
    ]
    body = {"model": "m", "max_tokens": 8, "messages": messages}
    got = parse_body(MessagesRequest, json.dumps(body)).ollama_messages()
    call = {"id": "toolu_1", "function": {"name": "f", "arguments": {"x": 1}}}
    assert got == [
        Message("user", "call f"),
        Message("assistant", "Calling.", tool_calls=(call,)),
        Message("tool", "Error: no such x", tool_name="f", tool_call_id="toolu_1"),
        Message("user", "and now?"),
    ]


@pytest.mark.parametrize("empty", ["", [], [{"type": "text", "text": ""}]])
def test_an_empty_user_turn_stays_a_turn(empty):
    """Not dropped: after an assistant turn that would make the assistant's words a prefill
    to continue. An empty assistant turn says nothing (no prefill)."""
    messages = [
        {"role": "user", "content": "count to 5"},
        {"role": "assistant", "content": "1, 2"},
        {"role": "user", "content": empty},
        {"role": "assistant", "content": empty},
    ]
    body = {"model": "m", "max_tokens": 8, "messages": messages}
    got = parse_body(MessagesRequest, json.dumps(body)).ollama_messages()
    assert got == [Message("user", "count to 5"), Message("assistant", "1, 2"), Message("user", "")]


def test_tool_result_string_content_reaches_the_prompt(client, starter):
    use = {"type": "tool_use", "id": "toolu_9", "name": "f", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_9", "content": "42"}
    messages = [
        {"role": "user", "content": "call f"},
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [result]},
    ]
    assert post(client, model="tooly", tools=TOOLS, messages=messages).is_success
    assert "<tool>42</tool>\n" in starter.runners[0].prompts[0]


def test_images_decoded_and_checked(client):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [image]}]}
    [message] = parse_body(MessagesRequest, json.dumps(body)).ollama_messages()
    assert message.images == (base64.b64decode(PNG),)
    r = post(client, messages=body["messages"])
    assert r.status_code == 400
    assert r.json()["error"] == {
        "type": "invalid_request_error",
        "message": '"fake" does not support vision',
    }
    url = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    r = post(client, messages=[{"role": "user", "content": [url]}])
    assert r.status_code == 400 and "EMBER_ALLOW_IMAGE_URLS" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("changes", "status", "kind", "words"),
    [
        ({"max_tokens": None}, 400, "invalid_request_error", "max_tokens is required"),
        ({"model": "nope"}, 404, "not_found_error", "not found"),
        ({"messages": []}, 400, "invalid_request_error", "messages"),
        ({"messages": [{"role": "system", "content": "x"}]}, 400, "invalid_request_error", "role"),
        ({"tools": [{"type": "web_search_20250305", "name": "s"}]}, 400, "invalid_request_error",
         "unsupported tool type"),
        ({"thinking": {"type": "enabled"}}, 400, "invalid_request_error", "budget_tokens"),
    ],
)  # fmt: skip
def test_errors_use_anthropic_error_objects(client, changes, status, kind, words):
    body = {"model": "fake", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    r = client.post("/v1/messages", json={**body, **changes})
    assert r.status_code == status
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == kind
    assert words in error["error"]["message"]


def test_thinking_asked_of_a_model_that_cannot_think_is_left_off(client):
    """As Ollama relaxes it for Anthropic's clients (Claude Code asks it of every model)."""
    body = {"model": "fake", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
    thinking = {"type": "enabled", "budget_tokens": 8}
    r = client.post("/v1/messages", json=body | {"thinking": thinking})
    assert r.status_code == 200 and r.json()["content"][0]["type"] == "text"


def test_a_tool_result_of_an_earlier_turns_call_is_taken():
    """A tool_result whose tool_use is not in the messages (a client that trims its history)."""
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [result]}]}
    (message,) = parse_body(MessagesRequest, json.dumps(body)).native().messages
    assert (message.role, message.content, message.tool_call_id) == ("tool", "sunny", "toolu_1")


def test_unknown_paths_and_bad_json_under_messages_use_anthropic_errors(client):
    r = client.get("/v1/messages/nope")
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = client.post("/v1/messages", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_an_error_in_the_stream_is_an_error_event(client, starter):
    starter.runner_args["error"] = "out of memory"
    got = events(post(client, stream=True))
    assert got[-1] == {"type": "error", "error": {"type": "api_error", "message": "out of memory"}}


def test_count_tokens_tokenizes_the_rendered_prompt(client, starter):
    r = post(client, "/v1/messages/count_tokens", system="S", messages=[
        {"role": "user", "content": "hi there"},
    ])  # fmt: skip
    # "<system>S</system>\n<user>hi there</user>\n<assistant>": the fake counts 4 words
    assert r.json() == {"input_tokens": 4}
    assert starter.runners[0].prompts == []  # counted, not generated
    r = client.post("/v1/messages/count_tokens", json={"model": "nope", "messages": []})
    assert r.status_code == 400 and r.json()["type"] == "error"


# --- the thinking budget ---

THOUGHTS = "<think> a b c d e f </think> The answer"


def test_thinking_budget_ends_the_thinking_and_continues_with_the_answer(client, starter):
    starter.runner_args.update(reply=THOUGHTS, replies={"</think>": "The answer"})
    thinking = {"type": "enabled", "budget_tokens": 3}
    body = post(client, model="thinker", thinking=thinking, max_tokens=50).json()
    assert body["content"] == [
        {"type": "thinking", "thinking": "a b", "signature": "ember-unsigned"},
        {"type": "text", "text": "The answer"},
    ]
    runner = starter.runners[0]
    assert runner.prompts[1] == runner.prompts[0] + "<think> a b</think>"
    assert [f["options"]["num_predict"] for f in runner.fields] == [3, 47]
    assert body["usage"]["output_tokens"] == 3 + 2
    assert body["usage"]["input_tokens"] == len(runner.prompts[0].split())
    assert body["stop_reason"] == "end_turn"


def test_thinking_within_budget_is_one_completion(client, starter):
    starter.runner_args["reply"] = "<think> a </think> Hi"
    thinking = {"type": "enabled", "budget_tokens": 10}
    body = post(client, model="thinker", thinking=thinking, max_tokens=50).json()
    assert [b["type"] for b in body["content"]] == ["thinking", "text"]
    assert len(starter.runners[0].prompts) == 1


def test_thinking_budget_stream_has_thinking_then_text_blocks(client, starter):
    starter.runner_args.update(reply=THOUGHTS, replies={"</think>": "The answer"})
    thinking = {"type": "enabled", "budget_tokens": 3}
    got = events(post(client, model="thinker", thinking=thinking, max_tokens=50, stream=True))
    starts = [e["content_block"]["type"] for e in got if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    deltas = [e["delta"] for e in got if e["type"] == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == "a b"
    assert {"type": "signature_delta", "signature": "ember-unsigned"} in deltas
    assert "".join(d.get("text", "") for d in deltas) == "The answer"
    assert got[-2]["usage"]["output_tokens"] == 5


def test_budget_tokens_must_be_below_max_tokens(client):
    thinking = {"type": "enabled", "budget_tokens": 64}
    r = post(client, model="thinker", thinking=thinking, max_tokens=64)
    assert r.status_code == 400 and "less than max_tokens" in r.json()["error"]["message"]


async def _records(*pieces: str, reason: str = "length") -> AsyncGenerator[dict[str, Any], None]:
    for piece in pieces:
        yield {"content": piece}
    yield {"done": True, "done_reason": reason, "eval_count": len(pieces), "prompt_count": 5}


def capped(complete: budget.Complete, num_predict: int, limit: int) -> list[dict[str, Any]]:
    async def run() -> list[dict[str, Any]]:
        fields = {"options": {"num_predict": num_predict}}
        return [r async for r in budget.capped(complete, "P", fields, budget=limit, tags=THINK)]

    return asyncio.run(run())


def test_budget_continues_a_closed_thinking_without_a_tag():
    asked: list[tuple[str, int]] = []

    def complete(prompt: str, fields: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        asked.append((prompt, fields["options"]["num_predict"]))
        return _records("<think>", "a", "</think>", "B") if len(asked) == 1 else _records("C")

    got = capped(complete, 10, 4)
    assert asked == [("P", 4), ("P<think>a</think>B", 6)]
    assert [r.get("content") for r in got[:-1]] == ["<think>", "a", "</think>", "B", "C"]
    assert got[-1]["eval_count"] == 5 and got[-1]["prompt_count"] == 5


def test_budget_not_below_num_predict_runs_once():
    asked = []

    def complete(prompt: str, fields: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        asked.append(fields["options"]["num_predict"])
        return _records("<think>", "a")

    got = capped(complete, 2, 2)
    assert asked == [2] and got[-1]["done"]


# --- the API key and the real client ---

KEY = "s3cret"


@pytest.fixture
def live(starter: ScriptedStarter) -> Iterator[str]:
    """The app behind its middleware with an API key, served by uvicorn on a free port."""
    port = free_port()
    app = middleware.install(
        create_app(fake_state(starter)),
        bound=HostAddress("http", "127.0.0.1", port),
        origins=[],
        api_key=KEY,
    )
    with served_in_thread(app, port) as url:
        yield url


def test_x_api_key_with_the_anthropic_client(live, starter):
    client = anthropic.Anthropic(base_url=live, api_key=KEY, max_retries=0)
    reply = client.messages.create(
        model="fake", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.content[0].type == "text" and reply.content[0].text == "Hello there friend"
    wrong = anthropic.Anthropic(base_url=live, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        wrong.messages.count_tokens(model="fake", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


def test_the_anthropic_client_accumulates_a_thinking_stream(live, starter):
    starter.runner_args.update(reply=THOUGHTS, replies={"</think>": "The answer"})
    client = anthropic.Anthropic(base_url=live, auth_token=KEY, max_retries=0)  # Bearer
    with client.messages.stream(
        model="thinker",
        max_tokens=50,
        thinking={"type": "enabled", "budget_tokens": 3},
        messages=[{"role": "user", "content": "think"}],
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "The answer"
    thought, answer = final.content
    assert thought.type == "thinking" and thought.thinking == "a b"
    assert answer.type == "text" and final.usage.output_tokens == 5
