"""tool_choice grammars (tool_grammar.py) run through llguidance on a byte-level tokenizer: what
each mode accepts and rejects, in Qwen's tagged format, bare JSON and Mistral's list, with free
thinking before the calls; and the grammar each route sends the (fake) runner."""

import functools
import json
import re
from typing import Any

import llguidance
import pytest
from fastapi.testclient import TestClient

from ember.server.api import ChatRequest, RequestError, Tool
from ember.server.thinking import THINK, ThinkingTags
from ember.server.tool_grammar import (
    Thinking,
    chat_grammar,
    choice_mode,
    format_grammar,
    tool_grammar,
)
from ember.server.tools import BARE_JSON, ToolCallFormat

QWEN = ToolCallFormat("<tool_call>", "</tool_call>")
MISTRAL = ToolCallFormat("[TOOL_CALLS] [", "]")
LLAMA = ToolCallFormat("{", "", "parameters")
WEATHER = Tool.model_validate(
    {
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        }
    }
)
TIME = Tool.model_validate(
    {
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"tz": {"enum": ["utc", "cet"]}},
                "required": ["tz"],
            },
        }
    }
)
TOOLS = [WEATHER, TIME]


class _Bytes:
    """A tokenizer whose tokens are the 256 bytes (and EOS): every text has one spelling."""

    def __init__(self) -> None:
        self.eos_token_id, self.bos_token_id = 256, None
        self.tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
        self.special_token_ids = [256]

    def __call__(self, text: str | bytes) -> list[int]:
        return list(text.encode() if isinstance(text, str) else text)


LL = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()))


def accepts(grammar: str, text: str) -> bool:
    """Whether grammar allows text, byte by byte, as a complete output."""
    matcher = llguidance.LLMatcher(LL, llguidance.LLMatcher.grammar_from_lark(grammar))
    assert not matcher.is_error(), matcher.get_error()
    for byte in text.encode():
        if not matcher.consume_token(byte):
            return False
    return matcher.is_accepting()


def call(name: str, key: str = "arguments", **arguments: Any) -> str:
    return json.dumps({"name": name, key: arguments})


def qwen(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


WEATHER_CALL = qwen(call("get_weather", city="Paris"))
TIME_CALL = qwen(call("get_time", tz="utc"))


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        (WEATHER_CALL, True),
        (qwen(call("get_weather", city="Oslo", days=3)), True),
        (f"{WEATHER_CALL}\n{TIME_CALL}", True),  # parallel calls, a pair of tags each
        ("Sure! " + WEATHER_CALL, False),  # text before the call
        ("The weather is fine.", False),  # no call at all
        ("", False),
        (qwen(call("get_wether", city="Paris")), False),  # an unknown tool
        (qwen(call("get_time", tz="pst")), False),  # outside the enum
        (qwen(call("get_weather", days=3)), False),  # a required argument missing
        (qwen(call("get_weather", city="Paris", country="FR")), False),  # an undeclared one
        (qwen(call("get_weather", city=7)), False),  # a wrong type
        (qwen(json.dumps({"name": "get_weather"})), False),  # no arguments
        (WEATHER_CALL[:-3], False),  # unfinished
    ],
)
def test_required_accepts_only_schema_valid_calls(text: str, ok: bool) -> None:
    assert accepts(tool_grammar(TOOLS, QWEN, mode="required"), text) is ok


def test_one_call_without_parallel_tool_calls() -> None:
    grammar = tool_grammar(TOOLS, QWEN, mode="required", parallel=False)
    assert accepts(grammar, WEATHER_CALL + "\n")
    assert not accepts(grammar, f"{WEATHER_CALL}\n{TIME_CALL}")


def test_a_named_function_is_the_only_one_allowed() -> None:
    grammar = tool_grammar([TIME], QWEN, mode="required")
    assert accepts(grammar, TIME_CALL)
    assert not accepts(grammar, WEATHER_CALL)


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("The weather is fine.", True),
        ("", True),
        ("Let me look. " + WEATHER_CALL, True),
        (f"{WEATHER_CALL}\n{TIME_CALL}", True),
        ("Let me look. " + qwen(call("get_time", tz="pst")), False),  # the opening forces a call
        ("Let me look. <tool_call>\nnot json", False),
        (WEATHER_CALL + " and more text", False),  # nothing after the calls
    ],
)
def test_auto_is_free_until_the_opening_tag(text: str, ok: bool) -> None:
    assert accepts(tool_grammar(TOOLS, QWEN, mode="auto"), text) is ok


@pytest.mark.parametrize(
    ("text", "ok", "parallel"),
    [
        # the parser reads JSON at the start of a tagged format's output as a call (small
        # models leave the tag out): the grammar holds it as a tagged call
        (call("get_weather", city="Paris"), True, True),
        (call("get_weather", city="Paris") + "\n" + call("get_time", tz="cet"), True, True),
        (call("get_weather", city="Paris") + "\n" + call("get_time", tz="cet"), False, False),
        (json.dumps({"name": "get_weather", "arguments": {"town": 42}}), False, True),
        (call("get_weather", city="Paris") + '\n{"temp": "21C"}', False, True),  # text after
        ('{"answer": 42}', False, True),
        ("The answer is {42}.", True, True),  # JSON inside text is text
    ],
)
def test_auto_holds_a_tagged_formats_output_that_opens_with_json(text, ok, parallel) -> None:
    assert accepts(tool_grammar(TOOLS, QWEN, mode="auto", parallel=parallel), text) is ok


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        (call("get_weather", city="Paris"), True),
        (call("get_weather", city="Paris") + "\n" + call("get_time", tz="cet"), True),
        ("  " + call("get_time", tz="utc"), True),
        ("[" + call("get_time", tz="utc") + "]", False),
        (call("get_time", tz="pst"), False),
        ("no call", False),
    ],
)
def test_bare_json_required(text: str, ok: bool) -> None:
    assert accepts(tool_grammar(TOOLS, BARE_JSON, mode="required"), text) is ok


def test_bare_json_auto_holds_an_output_that_opens_with_json_to_a_call() -> None:
    grammar = tool_grammar(TOOLS, BARE_JSON, mode="auto")
    assert accepts(grammar, "It is sunny in {Paris}.")
    assert accepts(grammar, " " + call("get_weather", city="Paris"))
    assert not accepts(grammar, json.dumps({"answer": 42}))


def test_the_arguments_key_of_the_format() -> None:
    grammar = tool_grammar(TOOLS, LLAMA, mode="required")
    assert accepts(grammar, call("get_time", "parameters", tz="utc"))
    assert not accepts(grammar, call("get_time", tz="utc"))


def test_a_format_that_opens_a_list_takes_the_calls_inside_it() -> None:
    grammar = tool_grammar(TOOLS, MISTRAL, mode="required")
    two = f"[TOOL_CALLS] [{call('get_time', tz='utc')}, {call('get_weather', city='Rome')}]"
    assert accepts(grammar, two)
    assert not accepts(grammar, f"[TOOL_CALLS] [{call('get_time', tz='pst')}]")
    single = tool_grammar(TOOLS, MISTRAL, mode="required", parallel=False)
    assert not accepts(single, two)


def test_thinking_stays_free_before_the_calls() -> None:
    grammar = tool_grammar(TOOLS, QWEN, mode="required", thinking=Thinking(THINK))
    assert accepts(grammar, "<think>\nMaybe <tool_call> {not json}?\n</think>\n\n" + WEATHER_CALL)
    assert accepts(grammar, WEATHER_CALL)  # thinking may be skipped
    assert not accepts(grammar, "<think>hmm</think>\nIt is sunny.")
    opened = tool_grammar(TOOLS, QWEN, mode="required", thinking=Thinking(THINK, is_open=True))
    assert accepts(opened, "hmm, the weather.\n</think>\n\n" + WEATHER_CALL)
    auto = tool_grammar(TOOLS, QWEN, mode="auto", thinking=Thinking(THINK))
    assert accepts(auto, "<think>a <tool_call> here</think>\n\nOK. " + WEATHER_CALL)
    assert not accepts(auto, "<think>x</think>\n\nOK. " + qwen(call("get_time", tz="x")))


def request(**fields: Any) -> ChatRequest:
    return ChatRequest.model_validate(
        {"model": "m", "tools": [t.to_template() for t in TOOLS]} | fields
    )


@pytest.mark.parametrize(
    ("fields", "mode"),
    [
        ({}, "auto"),
        ({"tool_choice": "auto"}, "auto"),
        ({"tool_choice": "required"}, "required"),
        ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "required"),
        ({"tools": []}, None),
        ({"format": "json"}, None),  # auto with a format: the format holds the output
    ],
)
def test_choice_mode(fields: dict[str, Any], mode: str | None) -> None:
    assert choice_mode(request(**fields)) == mode


def test_a_forced_call_with_a_format_is_refused() -> None:
    with pytest.raises(RequestError, match="cannot be combined with a format"):
        choice_mode(request(tool_choice="required", format={"type": "object"}))


# --- through the routes, over a fake runner ---


def chat(client: TestClient, path: str = "/api/chat", **body: Any) -> Any:
    tools = [t.to_template() for t in TOOLS]
    messages = [{"role": "user", "content": "weather?"}]
    body = {"model": "tooly", "messages": messages, "tools": tools, "stream": False} | body
    return client.post(path, json=body)


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions"])
def test_the_runner_gets_the_grammar_of_tool_choice(client, starter, path):
    assert chat(client, path, tool_choice="required").status_code == 200
    assert chat(client, path, tool_choice="auto", parallel_tool_calls=False).status_code == 200
    named = {"type": "function", "function": {"name": "get_time"}}
    assert chat(client, path, tool_choice=named).status_code == 200
    assert chat(client, path, tool_choice="none").status_code == 200
    required, auto, one, none = (f.get("grammar") for f in starter.runners[0].fields)
    assert accepts(required, WEATHER_CALL) and not accepts(required, "hi")
    assert accepts(auto, "hi") and not accepts(auto, f"{WEATHER_CALL}\n{TIME_CALL}")
    assert accepts(one, TIME_CALL) and not accepts(one, WEATHER_CALL)
    assert none is None


def test_a_forced_call_with_a_format_is_a_400(client, starter):
    r = chat(client, tool_choice="required", format="json")
    assert r.status_code == 400 and "format" in r.json()["error"]
    fmt = {"type": "json_object"}
    r = chat(client, "/v1/chat/completions", tool_choice="required", response_format=fmt)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    assert chat(client, tool_choice="auto", format="json").status_code == 200
    assert "grammar" not in starter.runners[0].fields[0]  # the format holds the output


@pytest.mark.parametrize("path", ["/api/chat", "/v1/chat/completions", "/v1/messages"])
def test_a_forced_call_without_tools_is_a_400(client, path):
    """As OpenAI and Anthropic answer it: a forced call needs a tool, not free text."""
    choice: Any = {"type": "any"} if path == "/v1/messages" else "required"
    extra = {"max_tokens": 8} if path == "/v1/messages" else {}
    r = chat(client, path, tools=[], tool_choice=choice, **extra)
    assert r.status_code == 400 and "needs at least one tool" in json.dumps(r.json())


def test_chat_grammar_starts_inside_thinking_the_prompt_opened() -> None:
    req = request(tool_choice="required")
    opened = chat_grammar(req, QWEN, THINK, prompt="<|im_start|>assistant\n<think>\n")
    assert opened is not None and accepts(opened, "hmm\n</think>\n\n" + WEATHER_CALL)
    closed = chat_grammar(req, QWEN, THINK, prompt="<|im_start|>assistant\n")
    assert closed is not None and accepts(closed, "<think>hmm</think>" + WEATHER_CALL)
    assert not accepts(closed, "hmm\n</think>\n\n" + WEATHER_CALL)
    assert chat_grammar(request(tool_choice="none", tools=[]), QWEN, THINK, prompt="") is None


def test_pydantic_refs_and_keywords_llguidance_lacks_still_compile() -> None:
    item = {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}
    order = {
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}},
        "required": ["items"],
        "$defs": {"Item": item},
        "title": "Order",
    }
    odd = {"type": "object", "properties": {"url": {"type": "string", "format": "uri-reference"}}}
    tools = [
        Tool.model_validate({"function": {"name": name, "parameters": params}})
        for name, params in (("order", order), ("fetch", odd))
    ]
    grammar = tool_grammar(tools, QWEN, mode="required")
    assert accepts(grammar, qwen(call("order", items=[{"sku": "a1"}])))
    assert not accepts(grammar, qwen(call("order", items=[{"id": "a1"}])))
    assert accepts(grammar, qwen(call("fetch", url="../x")))  # the unknown format: not enforced


def test_a_schema_llguidance_cannot_compile_is_a_400_naming_the_tools() -> None:
    remote = {"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}}
    req = ChatRequest.model_validate(
        {"model": "m", "tools": [{"function": {"name": "f", "parameters": remote}}]}
    )
    with pytest.raises(RequestError, match=r"cannot be enforced: .*example\.com") as err:
        chat_grammar(req, QWEN, None, prompt="")
    assert err.value.param == "tools"


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_a_thinking_models_format_holds_once_its_thinking_ends() -> None:
    grammar = format_grammar(SCHEMA, THINK, prompt="<|im_start|>assistant\n")
    assert grammar is not None
    assert accepts(grammar, '<think>\nA number: {a}? Say 1.\n</think>\n\n{"a": 1}')
    assert accepts(grammar, '{"a": 1}')  # thinking may be skipped
    assert not accepts(grammar, '<think>x</think>\nSure: {"a": 1}')  # nothing but the format
    assert not accepts(grammar, '<think>x</think>{"a": 1, "b": 2}')  # closed, as the format
    assert not accepts(grammar, '<think>x</think>{"a": "1"}')
    opened = format_grammar("json", THINK, prompt="<|im_start|>assistant\n<think>\n")
    assert opened is not None and accepts(opened, 'still thinking</think>\n{"x": [1]}')
    assert format_grammar({"regex": "a+"}, THINK, prompt="") is None  # the runner's alone
    with pytest.raises(RequestError, match="the format cannot be enforced") as err:
        format_grammar({"$ref": "http://example.com/s.json"}, THINK, prompt="")
    assert err.value.param == "format"


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate", "/v1/chat/completions"])
def test_a_thinker_gets_its_format_as_a_grammar_after_thinking(client, starter, path):
    body: dict[str, Any] = {"model": "thinker", "stream": False, "think": True}
    if path == "/api/generate":
        body["prompt"] = "A number?"
    else:
        body["messages"] = [{"role": "user", "content": "A number?"}]
    if path.startswith("/v1"):
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "n", "schema": SCHEMA},
        }
        body.pop("think")
    else:
        body["format"] = SCHEMA
    assert client.post(path, json=body).status_code == 200
    fields = starter.runners[0].fields[-1]
    assert fields["format"] is None
    assert accepts(fields["grammar"], '<think>hmm</think>\n{"a": 1}')
    assert not accepts(fields["grammar"], "<think>hmm</think>\nno")
    no_think = {**body, "think": False} if not path.startswith("/v1") else None
    if no_think is not None:  # without thinking the runner holds the whole output to it
        assert client.post(path, json=no_think).status_code == 200
        assert starter.runners[0].fields[-1]["format"] == SCHEMA
        assert "grammar" not in starter.runners[0].fields[-1]


class _WithControls(_Bytes):
    """The byte tokenizer with control tokens after EOS (ids 257 on), as a vocabulary holds
    Mistral's, Magistral's or gpt-oss's tags."""

    def __init__(self, tags: tuple[str, ...]) -> None:
        super().__init__()
        self.tokens += [t.encode() for t in tags]
        self.special_token_ids = list(range(256, 257 + len(tags)))


@functools.cache
def _controls(tags: tuple[str, ...]) -> llguidance.LLTokenizer:
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_WithControls(tags)))


def control_ids(*tags: str) -> dict[str, int]:
    """The ids _WithControls gives tags: the `specials` a grammar takes."""
    return {t: 257 + i for i, t in enumerate(tags)}


def accepts_tokens(grammar: str, text: str, specials: dict[str, int]) -> bool:
    """Whether grammar allows text, its control tags as their tokens and the rest byte by byte."""
    tokenizer = _controls(tuple(specials))
    matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar))
    assert not matcher.is_error(), matcher.get_error()
    ids: list[int] = []
    for piece in re.split("(" + "|".join(map(re.escape, specials)) + ")", text):
        ids += [specials[piece]] if piece in specials else list(piece.encode())
    return all(matcher.consume_token(i) for i in ids) and matcher.is_accepting()


SPECIALS = control_ids("[TOOL_CALLS]", "[THINK]", "[/THINK]")


NEMO = ToolCallFormat("[TOOL_CALLS][", "]")  # Mistral Nemo's, whose tag is a control token
NEMO_CALL = f"[TOOL_CALLS][{call('get_weather', city='Paris')}]"


@pytest.mark.parametrize("mode", ["auto", "required"])
def test_a_control_token_tag_is_matched_as_its_token(mode: str) -> None:
    grammar = tool_grammar(TOOLS, NEMO, mode=mode, specials=SPECIALS)  # type: ignore[arg-type]
    assert "<[257]>" in grammar
    assert accepts_tokens(grammar, NEMO_CALL, SPECIALS)
    assert accepts_tokens(grammar, "Let me look. " + NEMO_CALL, SPECIALS) == (mode == "auto")
    assert accepts_tokens(grammar, "It is sunny.", SPECIALS) == (mode == "auto")
    assert not accepts_tokens(grammar, f"[TOOL_CALLS][{call('get_weather', city=1)}]", SPECIALS)
    # before, the tag was text only: the model's own token was refused (it had to spell it)
    plain = tool_grammar(TOOLS, NEMO, mode=mode)  # type: ignore[arg-type]
    assert not accepts_tokens(plain, NEMO_CALL, SPECIALS)


def test_control_token_thinking_tags() -> None:
    magistral = ThinkingTags("[THINK]", "[/THINK]")
    grammar = format_grammar(SCHEMA, magistral, prompt="", specials=SPECIALS)
    assert grammar is not None
    assert accepts_tokens(grammar, '[THINK]A number [is] due.[/THINK]\n{"a": 2}', SPECIALS)
    assert accepts_tokens(grammar, '{"a": 2}', SPECIALS)
    assert not accepts_tokens(grammar, '[THINK]x[/THINK] {"a": "2"}', SPECIALS)
    opened = format_grammar(SCHEMA, magistral, prompt="[THINK]", specials=SPECIALS)
    assert opened is not None and accepts_tokens(opened, 'still[/THINK]{"a": 2}', SPECIALS)
    tools = tool_grammar(
        TOOLS, NEMO, mode="required", thinking=Thinking(magistral), specials=SPECIALS
    )
    assert accepts_tokens(tools, "[THINK]weather? use the tool[/THINK]" + NEMO_CALL, SPECIALS)
