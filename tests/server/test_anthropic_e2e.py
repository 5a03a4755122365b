"""The real `anthropic` client against a real `ember serve` with qwen2.5-coder:0.5b: a message, a
stream, a tool round trip, an image refused by a text-only model, and count_tokens."""

import base64
from collections.abc import Iterator

import anthropic
import pytest
from serve_process import Server

pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.slow]

MODEL = "qwen2.5-coder:0.5b"
WEATHER = {
    "name": "get_weather",
    "description": "Get the current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city name"}},
        "required": ["city"],
    },
}
GREEDY = {"temperature": 0}  # this client has no temperature argument: the field goes in the body
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()  # refused before it is read


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, qwen2_path) -> Iterator[Server]:
    s = Server(tmp_path_factory.mktemp("anthropic"), EMBER_NUM_PARALLEL="1")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def claude(server: Server) -> anthropic.Anthropic:
    # the key is sent as x-api-key and ignored: this server has none
    return anthropic.Anthropic(base_url=server.url, api_key="unused", timeout=600, max_retries=0)


def ask(text: str) -> list[anthropic.types.MessageParam]:
    return [{"role": "user", "content": text}]


def test_create_and_count_tokens(claude):
    messages = ask("Say hello in French.")
    reply = claude.messages.create(model=MODEL, max_tokens=8, extra_body=GREEDY, messages=messages)
    assert reply.type == "message" and reply.id.startswith("msg_")
    [block] = reply.content
    assert block.type == "text" and block.text.strip()
    assert reply.stop_reason in ("end_turn", "max_tokens") and 0 < reply.usage.output_tokens <= 8
    counted = claude.messages.count_tokens(model=MODEL, messages=messages)
    assert counted.input_tokens == reply.usage.input_tokens > 5


def test_stream(claude):
    with claude.messages.stream(
        model=MODEL, max_tokens=8, extra_body=GREEDY, messages=ask("Count to five.")
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    pieces = [e.delta.text for e in events if e.type == "content_block_delta"]  # type: ignore[union-attr]
    assert len(pieces) > 1 and "".join(pieces) == final.content[0].text  # type: ignore[union-attr]
    assert 0 < final.usage.output_tokens <= 8 and final.stop_reason in ("end_turn", "max_tokens")


def test_tool_round_trip(claude):
    messages = ask("What is the weather in Paris?")
    first = claude.messages.create(
        model=MODEL,
        max_tokens=40,
        extra_body=GREEDY,
        tools=[WEATHER],
        tool_choice={"type": "any"},
        messages=messages,
    )
    assert first.stop_reason == "tool_use"
    [use] = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    assert use.input == {"city": "Paris"}
    result = {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 degrees"}
    # without the follow-up this 0.5B model calls the tool again (with any prompt we tried)
    follow_up = {"type": "text", "text": "Answer me in one sentence."}
    second = claude.messages.create(
        model=MODEL,
        max_tokens=24,
        extra_body=GREEDY,
        tools=[WEATHER],
        messages=[
            *messages,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [result, follow_up]},
        ],  # type: ignore[list-item]
    )
    # an answer, not another call (whether this 0.5B model stops after its first sentence
    # turns on a near-tie that a prompt's rounding moves)
    assert second.stop_reason in ("end_turn", "max_tokens"), second.content
    [answer] = second.content
    assert answer.type == "text" and "21" in answer.text


def test_an_image_to_a_text_only_model_is_a_clear_400(claude):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[{"role": "user", "content": [image, {"type": "text", "text": "What?"}]}],
        )
    error = refused.value.body["error"]  # type: ignore[index]
    assert error["type"] == "invalid_request_error"
    assert error["message"] == f'"{MODEL}" does not support vision'
