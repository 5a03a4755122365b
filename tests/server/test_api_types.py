"""Request bodies: Ollama's names and defaults, one-line errors, OpenAI's translated."""

import base64
import json
import math
from typing import Any

import pytest
from pydantic import BaseModel

from ember.options import Options
from ember.server.api import (
    ChatRequest,
    CopyRequest,
    CreateRequest,
    DeleteRequest,
    EmbeddingRequest,
    EmbedRequest,
    GenerateRequest,
    PullRequest,
    PushRequest,
    RequestError,
    ShowRequest,
    image_bytes,
    parse_body,
)
from ember.server.openai_api import ChatCompletionRequest, CompletionRequest, EmbeddingsRequest
from ember.server.prompt import Message


def parse(model: type[BaseModel], body: dict[str, Any] | str) -> Any:
    raw = body if isinstance(body, str) else json.dumps(body)
    return parse_body(model, raw.encode())


def error(model: type[BaseModel], body: dict[str, Any] | str) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse(model, body)
    return info.value


def test_generate_defaults() -> None:
    r = parse(GenerateRequest, {"model": "smollm2:135m"})
    assert (r.prompt, r.system, r.suffix, r.raw, r.stream) == ("", "", "", False, True)
    assert r.options is None and r.keep_alive is None and r.think is None and r.format is None
    assert r.images == [] and r.context is None and r.top_logprobs == 0


def test_generate_fields() -> None:
    image = base64.b64encode(b"\x89PNG").decode()
    r = parse(
        GenerateRequest,
        {
            "model": "m",
            "prompt": "p",
            "images": [image],
            "keep_alive": "1h30m",
            "think": "low",
            "format": {"type": "object"},
            "context": [1, 2, 3],
            "_debug_render_only": True,
            "options": {"temperature": 0, "num_ctx": 2048.0, "stop": "\n", "penalize_newline": 1},
        },
    )
    assert r.images == [b"\x89PNG"]
    assert r.keep_alive == 5400.0 and r.think == "low" and r.format == {"type": "object"}
    assert r.context == [1, 2, 3] and r.debug_render_only is True
    assert r.options.given() == {"temperature": 0.0, "num_ctx": 2048, "stop": ["\n"]}
    assert r.options.unknown() == {"penalize_newline"}
    # the known options feed the engine's own validation
    assert Options.parse(r.options.given()).num_ctx == 2048


@pytest.mark.parametrize("request_type", [GenerateRequest, ChatRequest])
@pytest.mark.parametrize("given", [None, ""])
def test_a_format_of_null_or_empty_is_no_format(request_type, given) -> None:
    # as Ollama's: LangChain's OllamaLLM sends "format": "" on every request
    assert parse(request_type, {"model": "m", "format": given}).format is None


@pytest.mark.parametrize(
    ("value", "seconds"), [(0, 0.0), (-1, math.inf), ("5m", 300.0), (30, 30.0)]
)
def test_keep_alive_forms(value: Any, seconds: float) -> None:
    assert parse(ChatRequest, {"model": "m", "keep_alive": value}).keep_alive == seconds


def test_nulls_mean_not_given_and_unknown_fields_are_ignored() -> None:
    r = parse(
        ChatRequest,
        {"model": "m", "messages": [{"role": "user", "content": None}], "tools": None, "x": 1},
    )
    assert r.messages[0].content == "" and r.tools == []


def test_chat_message_to_prompt() -> None:
    r = parse(
        ChatRequest,
        {
            "model": "m",
            "messages": [
                {"role": "USER", "content": "hi", "images": [base64.b64encode(b"img").decode()]},
                {
                    "role": "assistant",
                    "content": "",
                    "thinking": "hmm",
                    "tool_calls": [
                        {"function": {"name": "f", "arguments": {"b": 1, "a": 2}}},
                        {"function": {"name": "g", "arguments": '{"x": true}'}},
                    ],
                },
                {"role": "tool", "content": "3", "tool_name": "f"},
            ],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        },
    )
    messages = [m.to_prompt() for m in r.messages]
    assert messages[0] == Message("user", "hi", images=(b"img",))
    assert messages[1].tool_calls == (
        {"function": {"name": "f", "arguments": {"b": 1, "a": 2}}},
        {"function": {"name": "g", "arguments": {"x": True}}},
    )
    assert list(messages[1].tool_calls[0]["function"]["arguments"]) == ["b", "a"]
    assert messages[1].thinking == "hmm"
    assert messages[2] == Message("tool", "3", tool_name="f")
    tool = r.tools[0].to_template()
    assert tool["function"]["name"] == "f" and tool["type"] == "function"


def test_an_integer_option_sent_as_a_fraction_is_cut_toward_zero():
    # Ollama's Options.FromMap casts JSON's float64 to int; top-level integers stay strict
    r = GenerateRequest.model_validate({"model": "m", "options": {"seed": -1.5, "num_ctx": 2048.7}})
    assert r.options is not None and (r.options.seed, r.options.num_ctx) == (-1, 2048)


ERRORS = [
    # (model, body, message)
    (GenerateRequest, {"prompt": "x"}, "model is required"),
    (GenerateRequest, "", "missing request body"),
    (GenerateRequest, "[1, 2]", "the request body must be a JSON object"),
    (
        GenerateRequest,
        {"model": "m", "options": {"temperature": "hot"}},
        'invalid value for "options.temperature": input should be a valid number (got "hot")',
    ),
    (
        GenerateRequest,
        {"model": "m", "options": {"num_ctx": "big"}},
        'invalid value for "options.num_ctx": input should be a valid integer (got "big")',
    ),
    (
        GenerateRequest,
        {"model": "m", "stream": "yes"},
        'invalid value for "stream": input should be a valid boolean (got "yes")',
    ),
    (
        GenerateRequest,
        {"model": "m", "prompt": 5},
        'invalid value for "prompt": input should be a valid string (got 5)',
    ),
    (
        GenerateRequest,
        {"model": "m", "images": ["not base64!"]},
        'invalid value for "images[0]": images must be base64-encoded (got "not base64!")',
    ),
    (ChatRequest, {"model": "m", "messages": [{"content": "x"}]}, "messages[0].role is required"),
    (
        ChatRequest,
        {"model": "m", "keep_alive": "soon"},
        'invalid value for "keep_alive": must be a number of seconds or a duration such as "5m"'
        ' (got "soon")',
    ),
    (
        ChatRequest,
        {"model": "m", "think": "very"},
        'invalid value for "think": must be true, false, "high", "medium", "low" or "max"'
        ' (got "very")',
    ),
    (
        ChatRequest,
        {"model": "m", "format": "yaml"},
        'invalid value for "format": must be "json" or a JSON schema object (got "yaml")',
    ),
    (
        ChatRequest,
        {"model": "m", "top_logprobs": 21},
        'invalid value for "top_logprobs": input should be less than or equal to 20 (got 21)',
    ),
    (
        ChatRequest,
        {"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]},
        "messages[0].tool_calls[0].function.name is required",
    ),
    (CopyRequest, {"source": "a"}, "destination is required"),
    (EmbedRequest, {"model": "m", "input": [1, 2]}, 'invalid value for "input[0]"'),
]


@pytest.mark.parametrize(("model", "body", "message"), ERRORS)
def test_bad_bodies_give_one_line(model: type[BaseModel], body: Any, message: str) -> None:
    err = error(model, body)
    assert err.message.startswith(message)
    assert "\n" not in err.message


def test_images_in_lines_of_base64_are_taken_as_go_takes_them() -> None:
    # `base64 img.png` and Python's encodebytes break lines; Go's StdEncoding skips \r and \n
    data = bytes(range(256)) * 3
    wrapped = base64.encodebytes(data).decode().replace("\n", "\r\n")
    assert GenerateRequest.model_validate({"model": "m", "images": [wrapped]}).images == [data]
    assert image_bytes(wrapped, "x") == data
    with pytest.raises(RequestError):
        image_bytes(wrapped.replace("\r\n", " "), "x")  # other white space is not base64


def test_invalid_json_says_so() -> None:
    assert error(GenerateRequest, '{"model": ').message.startswith("invalid JSON")


@pytest.mark.parametrize(
    "body",
    [
        '{"model": "m", "format": {"type": "number", "minimum": NaN}}',
        '{"model": "m", "format": {"maximum": Infinity}}',
        '{"model": "m", "format": {"maximum": -Infinity}}',
    ],
)
def test_nan_and_infinity_are_not_json(body: str) -> None:
    """As Go's decoder refuses them (pydantic's parser takes them; a schema holding one failed
    with a 500 where it was written back as JSON)."""
    message = error(GenerateRequest, body).message
    assert message == "invalid JSON: NaN and Infinity are not JSON numbers"
    assert parse(GenerateRequest, {"model": "m", "prompt": "NaN and Infinity"}).prompt


@pytest.mark.parametrize(
    ("raw", "prompt"),
    [
        (b'{"model": "m", "prompt": "cut \\ud83d here"}', "cut \ufffd here"),
        (b'{"model": "m", "prompt": "\\udc00 alone"}', "\ufffd alone"),
        (b'{"model": "m", "prompt": "pair \\ud83d\\ude00"}', "pair \U0001f600"),
        (b'{"model": "m", "prompt": "caf\xe9"}', "caf\ufffd"),  # Latin-1, not UTF-8
    ],
)
def test_lone_surrogates_and_bytes_that_are_not_utf8_read_as_replacement(
    raw: bytes, prompt: str
) -> None:
    """As Go's decoder: a string cut inside an emoji by a front end's JSON.stringify still
    makes a request (it was a 400, "unexpected end of hex escape")."""
    assert parse_body(GenerateRequest, raw).prompt == prompt


def test_error_names_the_param() -> None:
    assert (
        error(GenerateRequest, {"model": "m", "options": {"top_k": "x"}}).param == "options.top_k"
    )


@pytest.mark.parametrize(
    "model", [ShowRequest, DeleteRequest, PullRequest, PushRequest, EmbedRequest, CreateRequest]
)
def test_deprecated_name_field_names_the_model(model: type[BaseModel]) -> None:
    assert parse(model, {"name": "smollm2"}).model == "smollm2"
    assert parse(model, {"model": "a", "name": "b"}).model == "a"


def test_other_native_bodies() -> None:
    assert parse(EmbedRequest, {"model": "m", "input": "text"}).input == ["text"]
    assert parse(EmbedRequest, {"model": "m", "input": ""}).input == []
    assert parse(EmbeddingRequest, {"model": "m", "prompt": "p"}).prompt == "p"
    assert parse(ShowRequest, {"model": "m", "verbose": True}).verbose is True
    assert parse(PullRequest, {"model": "m"}).stream is True
    assert parse(PushRequest, {"model": "m", "insecure": True}).insecure is True
    create = parse(
        CreateRequest,
        {"model": "n", "from": "m", "quantization": "q8_0", "license": "MIT", "stream": False},
    )
    assert (create.from_, create.quantize, create.license, create.stream) == (
        "m",
        "q8_0",
        ["MIT"],
        False,
    )
    assert parse(CopyRequest, {"source": "a", "destination": "b"}).destination == "b"


# --- OpenAI ---


def test_openai_chat_defaults_become_ollama_options() -> None:
    r = parse(ChatCompletionRequest, {"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert r.stream is False
    assert r.ollama_options() == {"temperature": 1.0, "top_p": 1.0}
    assert r.ollama_format() is None and r.ollama_think() is None


def test_openai_chat_fields() -> None:
    r = parse(
        ChatCompletionRequest,
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 10,
            "temperature": 0,
            "top_p": 0.5,
            "seed": 7,
            "stop": "END",
            "frequency_penalty": 0.1,
            "presence_penalty": 0.2,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"schema": {"type": "array"}},
            },
            "reasoning_effort": "none",
            "stream_options": {"include_usage": True},
            "n": 1,
            "user": "ignored",
        },
    )
    assert r.ollama_options() == {
        "temperature": 0.0,
        "top_p": 0.5,
        "num_predict": 10,
        "seed": 7,
        "stop": ["END"],
        "frequency_penalty": 0.1,
        "presence_penalty": 0.2,
    }
    assert r.ollama_format() == {"type": "array"}
    assert r.ollama_think() is False
    assert r.stream_options is not None and r.stream_options.include_usage is True


def test_openai_options_extension_lies_under_the_openai_fields() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Hi"}],
        "options": {"num_ctx": 8192, "temperature": 0.2, "top_k": 5, "num_predict": 9},
        "keep_alive": "10m",
    }
    r = parse(ChatCompletionRequest, body)
    assert r.ollama_options() == {
        "temperature": 0.2,  # over OpenAI's default of 1.0
        "top_p": 1.0,
        "num_ctx": 8192,
        "top_k": 5,
        "num_predict": 9,
    }
    assert r.keep_alive == 600.0
    given = parse(ChatCompletionRequest, {**body, "temperature": 0.7, "max_tokens": 3})
    options = given.ollama_options()
    assert options["temperature"] == 0.7 and options["num_predict"] == 3
    with pytest.raises(RequestError, match=r'"options\.num_ctx"'):
        parse(ChatCompletionRequest, {**body, "options": {"num_ctx": "big"}})


def test_openai_reasoning_and_json_object() -> None:
    r = parse(
        ChatCompletionRequest,
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Hi"}],
            "reasoning": {"effort": "high"},
            "response_format": {"type": "json_object"},
            "max_completion_tokens": 5,
        },
    )
    assert r.ollama_think() == "high" and r.ollama_format() == "json"
    assert r.ollama_options()["num_predict"] == 5


@pytest.mark.parametrize(
    ("fields", "think"),
    [
        ({"reasoning_effort": "minimal"}, "low"),  # OpenAI's tiers past Ollama's, clamped
        ({"reasoning_effort": "xhigh"}, "max"),
        ({"reasoning_effort": "ultra"}, "max"),
        ({"reasoning_effort": "none"}, False),
        ({"reasoning_effort": "low", "reasoning": {"effort": "high"}}, "high"),  # the object's
    ],
)
def test_openai_reasoning_efforts_as_ollamas(fields: dict[str, Any], think: object) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **fields}
    assert parse(ChatCompletionRequest, body).ollama_think() == think


def test_openai_messages_become_ollamas() -> None:
    png = base64.b64encode(b"png").decode()
    r = parse(
        ChatCompletionRequest,
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be nice"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is"},
                        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
                        {"type": "text", "text": "this?"},
                        # a blank type too, as Ollama's decodeImageURL takes it
                        {"type": "image_url", "image_url": {"url": f"data:;base64,{png}"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "reasoning": "think",
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "look", "arguments": '{"q": 1}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "a cat"},
            ],
        },
    )
    assert r.ollama_messages() == [
        Message("system", "be nice"),
        Message("user", "what is\nthis?", images=(b"png", b"png")),
        Message(
            "assistant",
            "",
            tool_calls=({"id": "call_1", "function": {"name": "look", "arguments": {"q": 1}}},),
            thinking="think",
        ),
        Message("tool", "a cat", tool_name="look", tool_call_id="call_1"),
    ]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ([{"type": "image_url", "image_url": "https://x/cat.png"}], "invalid image input"),
        ([{"type": "image_url", "image_url": {"url": "data:image/png;base64,!!"}}], "bad base64"),
        ([{"type": "input_file", "file": {}}], "unsupported content part"),
    ],
)
def test_openai_content_that_cannot_be_used(content: list[Any], message: str) -> None:
    r = parse(
        ChatCompletionRequest, {"model": "m", "messages": [{"role": "user", "content": content}]}
    )
    with pytest.raises(RequestError, match=message):
        r.ollama_messages()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (5, 'invalid value for "messages[0].content": input should be a valid array (got 5)'),
        ([{"text": "x"}], "messages[0].content[0].type is required"),
        (
            [{"type": "image_url", "image_url": 5}],
            'invalid value for "messages[0].content[0].image_url": input should be an object',
        ),
    ],
)
def test_openai_content_errors_name_the_field(content: Any, message: str) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    assert error(ChatCompletionRequest, body).message.startswith(message)


def test_openai_bad_tool_arguments() -> None:
    call = {"function": {"name": "f", "arguments": "{oops"}}
    r = parse(
        ChatCompletionRequest,
        {"model": "m", "messages": [{"role": "assistant", "tool_calls": [call]}]},
    )
    with pytest.raises(RequestError, match="JSON object") as info:
        r.ollama_messages()
    assert info.value.param == "messages[0].tool_calls"


def test_openai_bad_fields() -> None:
    body = {"model": "m", "messages": [{"role": "user"}], "reasoning_effort": "extreme"}
    assert error(ChatCompletionRequest, body).message.startswith(
        'invalid value for "reasoning_effort"'
    )
    # as Ollama's middleware, for none as for an empty list
    assert error(ChatCompletionRequest, {"model": "m"}).message == "[] is too short - 'messages'"


def test_openai_completion_and_embeddings() -> None:
    c = parse(CompletionRequest, {"model": "m", "prompt": "p", "suffix": "s", "max_tokens": 3})
    assert (c.prompt, c.suffix, c.ollama_options()["num_predict"]) == ("p", "s", 3)
    assert error(CompletionRequest, {"model": "m", "prompt": ["a"]}).param == "prompt"
    e = parse(EmbeddingsRequest, {"model": "m", "input": "hi", "encoding_format": "base64"})
    assert (e.input, e.encoding_format) == (["hi"], "base64")
    for given, taken in (("BASE64", "base64"), ("Float", "float"), ("", "float")):
        body = {"model": "m", "input": "hi", "encoding_format": given}
        assert parse(EmbeddingsRequest, body).encoding_format == taken  # as Ollama's
    assert parse(EmbeddingsRequest, {"model": "m", "input": ["a", "b"]}).input == ["a", "b"]
