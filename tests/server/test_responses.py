"""/v1/responses over fake runners: the response object, input items as messages, tools and
tool_choice, text.format, reasoning, the stream's events, the store (previous_response_id, GET,
DELETE, its bounds) and the fields Ember refuses by name."""

import base64
import json
import time
from datetime import datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from ember.server.response_store import ResponseStore, StoredResponse
from ember.server.responses_api import InputItem, prompt_messages

CALL = '<tool_call> {"name": "get_weather", "arguments": {"city": "Paris"}} </tool_call>'
WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


def create(client: TestClient, **body: Any) -> Any:
    body.setdefault("model", "fake")
    body.setdefault("input", "hi")
    return client.post("/v1/responses", json=body)


def events(response: Any) -> list[dict[str, Any]]:
    """The stream's events, each checked to be named by its type."""
    parsed = []
    for block in response.text.strip().split("\n\n"):
        name, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        parsed.append(event)
    return parsed


def text_of(body: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in body["output"]
        if item["type"] == "message"
        for part in item["content"]
    )


def test_a_text_response(client, starter):
    body = create(client, seed=3, stop=["x"]).json()
    assert body["id"].startswith("resp_") and body["object"] == "response"
    assert body["status"] == "completed" and body["incomplete_details"] is None
    [message] = body["output"]
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["id"].startswith("msg_") and message["status"] == "completed"
    assert message["content"] == [
        {"type": "output_text", "text": "Hello there friend", "annotations": [], "logprobs": []}
    ]
    usage = body["usage"]
    assert usage["output_tokens"] == 3
    assert usage["total_tokens"] == usage["input_tokens"] + 3 > 3
    options = starter.runners[0].fields[0]["options"]
    assert (options["temperature"], options["top_p"], options["seed"]) == (1.0, 1.0, 3)
    assert options["stop"] == ["x"]
    assert starter.runners[0].prompts[0] == "<user>hi</user>\n<assistant>"


def test_a_body_compressed_with_zstd_is_taken_as_codex_sends_it(client, starter):
    import zstandard

    body = json.dumps({"model": "fake", "input": "hi"}).encode()
    zstd = {"content-encoding": "zstd", "content-type": "application/json"}
    r = client.post("/v1/responses", content=zstandard.compress(body), headers=zstd)
    assert r.status_code == 200 and text_of(r.json()) == "Hello there friend"
    r = client.post("/v1/responses", content=b"not zstd", headers=zstd)
    assert r.status_code == 400 and "zstd" in r.json()["error"]["message"]
    bomb = zstandard.compress(b" " * (33 << 20))  # past the body limit once decompressed
    r = client.post("/v1/responses", content=bomb, headers=zstd)
    assert r.status_code == 400 and "over 32 MiB" in r.json()["error"]["message"]


def test_ollama_options_lie_under_the_responses_fields(client, starter):
    """Ember's extension, as on /v1/chat/completions: the native API's options and keep_alive."""
    options = {"num_ctx": 4096, "top_k": 7, "temperature": 0.3, "num_predict": 9}
    create(client, options=options, keep_alive="2m", max_output_tokens=2)
    given = starter.runners[0].fields[0]["options"]
    assert (given["temperature"], given["top_k"], given["num_predict"]) == (0.3, 7, 2)
    settings = starter.runners[0].settings
    assert settings.kv_size == 4096 * settings.parallel  # num_ctx a sequence
    [loaded] = client.get("/api/ps").json()["models"]
    expires = datetime.fromisoformat(loaded["expires_at"]).timestamp()
    assert 100 < expires - time.time() <= 120
    r = create(client, options={"num_ctx": "big"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "options.num_ctx"


def test_max_output_tokens_cuts_it_incomplete(client, starter):
    body = create(client, max_output_tokens=2).json()
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete" and text_of(body) == "Hello there"
    assert body["max_output_tokens"] == 2
    assert body["completed_at"] is None  # OpenAI's: set once a response is completed
    assert starter.runners[0].fields[0]["options"]["num_predict"] == 2
    assert isinstance(create(client).json()["completed_at"], int)


def test_instructions_and_message_items_make_the_prompt(client, starter):
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Q1"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "A1"}]},
        {"role": "user", "content": "Q2"},
    ]
    create(client, instructions="You help.", input=items)
    assert starter.runners[0].prompts[0] == (
        "<system>You help.</system>\n<system>Be brief.</system>\n<user>Q1</user>\n"
        "<assistant>A1</assistant>\n<user>Q2</user>\n<assistant>"
    )


def test_function_call_items_join_the_assistant_turn_and_outputs_name_their_call():
    sun = [{"type": "input_text", "text": "sun"}]
    items = [
        {"role": "user", "content": "weather?"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "a call"}]},
        {"role": "assistant", "content": "Checking."},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": '{"z": 1}'},
        {"type": "function_call_output", "call_id": "c2", "output": "noon"},
        {"type": "function_call_output", "call_id": "c1", "output": sun},
    ]
    user, assistant, time, weather = prompt_messages([InputItem.model_validate(i) for i in items])
    assert user.content == "weather?"
    assert (assistant.content, assistant.thinking) == ("Checking.", "a call")
    assert [c["function"] for c in assistant.tool_calls] == [
        {"name": "get_weather", "arguments": {}},
        {"name": "get_time", "arguments": {"z": 1}},
    ]
    assert [c["id"] for c in assistant.tool_calls] == ["c1", "c2"]  # a template's .ID
    assert (time.role, time.content, time.tool_name) == ("tool", "noon", "get_time")
    assert time.tool_call_id == "c2"
    assert (weather.content, weather.tool_name) == ("sun", "get_weather")


def test_a_function_call_in_the_output(client, starter):
    starter.runner_args["reply"] = CALL
    body = create(client, model="tooly", tools=[WEATHER]).json()
    [call] = body["output"]
    assert call["type"] == "function_call" and call["status"] == "completed"
    assert call["call_id"].startswith("call_") and call["id"].startswith("fc_")
    assert (call["name"], json.loads(call["arguments"])) == ("get_weather", {"city": "Paris"})
    assert body["tools"] == [WEATHER]
    assert "<tools>1</tools>" in starter.runners[0].prompts[0]


def test_tool_choice_and_parallel_tool_calls_reach_the_native_request(client, starter):
    tools = [WEATHER, {**WEATHER, "name": "other"}]
    create(client, model="tooly", tools=tools, tool_choice={"type": "function", "name": "other"})
    assert "<tools>1</tools>" in starter.runners[0].prompts[-1]
    create(client, model="tooly", tools=tools, tool_choice="none", parallel_tool_calls=False)
    assert "<tools>" not in starter.runners[0].prompts[-1]
    r = create(client, model="tooly", tools=tools, tool_choice={"type": "web_search_preview"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    r = create(client, model="tooly", tools=tools, tool_choice={"type": "function", "name": "x"})
    assert r.status_code == 400 and "unknown function" in r.json()["error"]["message"]
    other = {"type": "function", "name": "other"}
    allowed = {"type": "allowed_tools", "mode": "required", "tools": [other]}
    assert create(client, model="tooly", tools=tools, tool_choice=allowed).status_code == 200
    assert "<tools>1</tools>" in starter.runners[0].prompts[-1]


def test_text_format_becomes_the_format(client, starter):
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    fmt = {"type": "json_schema", "name": "thing", "schema": schema, "strict": True}
    body = create(client, text={"format": fmt}).json()
    assert starter.runners[0].fields[-1]["format"] == schema
    assert body["text"] == {"format": fmt}
    create(client, text={"format": {"type": "json_object"}})
    assert starter.runners[0].fields[-1]["format"] == "json"
    create(client, text={"format": {"type": "text"}})
    assert starter.runners[0].fields[-1]["format"] is None


def test_reasoning_effort_thinks_and_answers_with_a_reasoning_item(client, starter):
    starter.runner_args["reply"] = "<think>let me see</think> The answer"
    body = create(client, model="thinker", reasoning={"effort": "high"}).json()
    reasoning, _ = body["output"]
    assert reasoning["type"] == "reasoning" and reasoning["id"].startswith("rs_")
    assert reasoning["summary"] == [{"type": "summary_text", "text": "let me see"}]
    assert text_of(body) == "The answer"
    assert body["reasoning"] == {"effort": "high", "summary": None}
    r = create(client, model="fake", reasoning={"effort": "low"})
    assert r.status_code == 400 and "thinking" in r.json()["error"]["message"]
    assert create(client, model="fake", reasoning={"effort": "none"}).status_code == 200


def test_the_stream_of_events(client):
    r = create(client, stream=True)
    assert r.headers["content-type"].startswith("text/event-stream")
    stream = events(r)
    assert [e["sequence_number"] for e in stream] == list(range(len(stream)))
    kinds = [e["type"] for e in stream]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = "".join(e["delta"] for e in stream if e["type"] == "response.output_text.delta")
    final = stream[-1]["response"]
    assert deltas == text_of(final) == "Hello there friend"
    assert stream[0]["response"]["status"] == "in_progress" and final["status"] == "completed"
    assert final["usage"]["output_tokens"] == 3


def test_the_stream_of_a_function_call_and_of_thinking(client, starter):
    starter.runner_args["reply"] = CALL
    stream = events(create(client, model="tooly", tools=[WEATHER], stream=True))
    kinds = [e["type"] for e in stream]
    assert "response.output_text.delta" not in kinds
    [delta] = [e for e in stream if e["type"] == "response.function_call_arguments.delta"]
    [done] = [e for e in stream if e["type"] == "response.function_call_arguments.done"]
    assert json.loads(delta["delta"]) == json.loads(done["arguments"]) == {"city": "Paris"}
    assert stream[-1]["response"]["output"][0]["type"] == "function_call"

    starter.runner_args["reply"] = "<think>hmm</think> Yes"
    stream = events(create(client, model="thinker", reasoning={"effort": "medium"}, stream=True))
    thought = [e["delta"] for e in stream if e["type"] == "response.reasoning_summary_text.delta"]
    assert "".join(thought) == "hmm"
    assert [item["type"] for item in stream[-1]["response"]["output"]] == ["reasoning", "message"]


def test_a_stream_cut_by_max_output_tokens_ends_incomplete(client):
    stream = events(create(client, stream=True, max_output_tokens=1))
    assert stream[-1]["type"] == "response.incomplete"
    assert stream[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_an_error_mid_stream_ends_with_error_and_failed(client, starter):
    create(client)  # loads the runner
    starter.runners[0].error = "boom"
    stream = events(create(client, stream=True))
    assert [e["type"] for e in stream[-2:]] == ["error", "response.failed"]
    assert stream[-2]["message"] == "boom" and stream[-1]["response"]["error"]["message"] == "boom"
    r = create(client, model="nope", stream=True)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_stored_responses_continue_read_and_delete(client, starter):
    first = create(client, input="My name is Ada.").json()
    assert first["store"] is True
    assert client.get(f"/v1/responses/{first['id']}").json() == first
    second = create(client, input="And my name?", previous_response_id=first["id"]).json()
    assert second["previous_response_id"] == first["id"]
    assert starter.runners[0].prompts[-1] == (
        "<user>My name is Ada.</user>\n<assistant>Hello there friend</assistant>\n"
        "<user>And my name?</user>\n<assistant>"
    )
    create(client, input="Third", previous_response_id=second["id"])
    assert starter.runners[0].prompts[-1].count("<user>") == 3
    deleted = client.delete(f"/v1/responses/{first['id']}").json()
    assert deleted == {"id": first["id"], "object": "response.deleted", "deleted": True}
    for r in (
        client.get(f"/v1/responses/{first['id']}"),
        client.delete(f"/v1/responses/{first['id']}"),
        create(client, previous_response_id=first["id"]),
    ):
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_store_false_keeps_nothing_and_a_stream_is_stored_when_done(client):
    unstored = create(client, store=False).json()
    assert client.get(f"/v1/responses/{unstored['id']}").status_code == 404
    streamed = events(create(client, stream=True))[-1]["response"]
    assert client.get(f"/v1/responses/{streamed['id']}").json() == streamed


def test_a_stored_function_call_continues_with_its_output(client, starter):
    starter.runner_args["reply"] = CALL
    first = create(client, model="tooly", tools=[WEATHER]).json()
    call_id = first["output"][0]["call_id"]
    starter.runners[0].reply = "Sunny."
    output = {"type": "function_call_output", "call_id": call_id, "output": "sun"}
    body = create(
        client, model="tooly", tools=[WEATHER], input=[output], previous_response_id=first["id"]
    ).json()
    assert text_of(body) == "Sunny."
    assert starter.runners[0].prompts[-1].endswith("<tool>sun</tool>\n<tools>1</tools><assistant>")


def test_the_store_drops_the_least_recently_used_and_the_expired():
    now = [0.0]
    store = ResponseStore(max_entries=2, max_age_s=10, clock=lambda: now[0])

    def put(response_id: str) -> None:
        store.put(StoredResponse({"id": response_id}, []))

    put("a")
    put("b")
    assert store.get("a") is not None  # a is now the more recent
    put("c")
    assert (store.get("a") is not None, store.get("b"), store.get("c") is not None) == (
        True,
        None,
        True,
    )
    now[0] = 10.5
    put("d")
    assert (store.get("a"), store.get("c"), len(store)) == (None, None, 1)
    assert store.delete("d") and not store.delete("d")


def test_logprobs_on_request(client):
    body = create(client, include=["message.output_text.logprobs"], top_logprobs=1).json()
    lps = body["output"][0]["content"][0]["logprobs"]
    assert [lp["token"] for lp in lps] == ["Hello", "there", "friend"]
    assert lps[0]["top_logprobs"][0]["token"] == "Hello"


def test_images_as_data_uris(client):
    png = "data:image/png;base64," + base64.b64encode(b"\x89PNG").decode()
    image = {"type": "input_image", "image_url": png, "detail": "auto"}
    item = {"role": "user", "content": [{"type": "input_text", "text": "what?"}, image]}
    r = create(client, input=[item])
    assert r.status_code == 400 and "vision" in r.json()["error"]["message"]
    url = {**image, "image_url": "https://example.com/cat.png"}
    r = create(client, input=[{"role": "user", "content": [url]}])
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].content[0].image_url"


@pytest.mark.parametrize(
    ("body", "param", "named"),
    [
        ({"background": True}, "background", "background"),
        ({"conversation": "conv_1"}, "conversation", "conversation"),
        ({"max_tool_calls": 2, "prompt": {"id": "p"}}, "max_tool_calls", "max_tool_calls, prompt"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]", "'web_search'"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", "'item_reference'"),
        ({"input": [{"content": "no role"}]}, "input[0].type", "needs a type"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "'tool'"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
            "input[0].content[0]",
            "'input_file'",
        ),
        ({"text": {"format": {"type": "grammar"}}}, "text.format.type", "text.format.type"),
        ({"input": 3}, "input", "input"),
        ({"input": []}, "input", "input is required"),
    ],
)
def test_what_ember_does_not_do_is_refused_by_name(client, body, param, named):
    r = create(client, **body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert named in error["message"]


def test_fields_that_do_not_change_the_answer_are_accepted(client):
    r = create(client, metadata={"k": "v"}, user="u", prompt_cache_key="k", service_tier="auto")
    assert r.status_code == 200 and r.json()["metadata"] == {"k": "v"}
