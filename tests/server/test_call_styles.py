"""Tool calls that are not one JSON value: Qwen3-Coder's (`<function=NAME>` and a
`<parameter=KEY>` for each argument, values typed by the tools' schemas as Ollama's qwen3-coder
parser types them), and the name before the arguments' JSON (Mistral's `[TOOL_CALLS]NAME[ARGS]
{...}`, Kimi K2's). The format is read from the template; calls parse from pieces split
anywhere; the routes answer the real `ollama` and `openai` clients over a scripted runner."""

import json
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from server_fakes import MODELS, FakeModels, FakeStarter, served
from test_harmony import through

from ember.server.app import create_app
from ember.server.output import OutputParser
from ember.server.scheduler import Defaults, Scheduler
from ember.server.state import ServerState
from ember.server.tools import ToolCallFormat, tool_call_format
from ember.server.xml_calls import typed

# ChatML whose calls are written as Qwen3-Coder's template writes them
CODER = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if tools and loop.first %}<tools>{% for t in tools %}{{ t.function.name }} "
    "{% endfor %}</tools>\n{% endif %}{{ m.content }}"
    "{% for call in m.tool_calls or [] %}\n<tool_call>\n<function={{ call.function.name }}>\n"
    "{% for k, v in call.function.arguments | items %}<parameter={{ k }}>\n{{ v }}\n"
    "</parameter>\n{% endfor %}</function>\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
BARE = CODER.replace("\n<tool_call>", "").replace("\n</tool_call>", "")  # no tags around calls
CALL = (
    "I will look it up.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco"
    "\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n"
    "<parameter=hours>\n[9, 12]\n</parameter>\n</function>\n</tool_call>"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "hours": {"type": "array", "items": {"type": "integer"}},
            },
            "required": ["city"],
        },
    },
}
PARAMS = {"get_weather": WEATHER["function"]["parameters"]["properties"]}  # type: ignore[index]
ARGUMENTS = {"city": "San Francisco", "days": 3, "metric": True, "hours": [9, 12]}


# Mistral's newer turns: the name, an id, then the arguments
MISTRAL = (
    "{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{% elif m.tool_calls %}{% for c in m.tool_calls %}[TOOL_CALLS]{{ c.function.name }}"
    "[CALL_ID]{{ c.id }}[ARGS]{{ c.function.arguments | tojson }}{% endfor %}{{ eos_token }}"
    "{% else %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}"
)
# Kimi K2's: a section of calls, each named with an index, closed by tags
KIMI = (
    "{% for m in messages %}<|im_{{ m.role }}|>{{ m.content }}"
    "{% if m.tool_calls %}<|tool_calls_section_begin|>{% for c in m.tool_calls %}"
    "<|tool_call_begin|>functions.{{ c.function.name }}:{{ loop.index0 }}"
    "<|tool_call_argument_begin|>{{ c.function.arguments | tojson }}<|tool_call_end|>"
    "{% endfor %}<|tool_calls_section_end|>{% endif %}<|im_end|>{% endfor %}"
)
# DeepSeek V3.1's: the name, then the arguments joined as text (an object fails there)
DEEPSEEK = (
    "{% for m in messages %}{% if m.role == 'user' %}<｜User｜>{{ m.content }}"
    "{% elif m.tool_calls %}<｜Assistant｜><｜tool▁calls▁begin｜>{% for c in m.tool_calls %}"
    "<｜tool▁call▁begin｜>{{ c.function.name + '<｜tool▁sep｜>' + c.function.arguments }}"
    "<｜tool▁call▁end｜>{% endfor %}<｜tool▁calls▁end｜>"
    "{% elif m.role == 'tool' %}<｜tool▁output▁begin｜>{{ m.content }}<｜tool▁output▁end｜>"
    "{% else %}<｜Assistant｜>{{ m.content }}{% endif %}{% endfor %}"
)


@pytest.mark.parametrize(
    ("template", "fmt"),
    [
        (
            DEEPSEEK,
            ToolCallFormat(
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>",
                "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                style="named",
            ),
        ),
        (CODER, ToolCallFormat("<tool_call>", "</tool_call>", style="xml")),
        (BARE, ToolCallFormat("", "", style="xml")),
        (MISTRAL, ToolCallFormat("[TOOL_CALLS]", style="named")),
        (
            KIMI,
            ToolCallFormat(
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.",
                "<|tool_call_end|><|tool_calls_section_end|>",
                style="named",
            ),
        ),
    ],
)
def test_the_format_is_read_from_the_template(template: str, fmt: ToolCallFormat) -> None:
    assert tool_call_format(template) == fmt


def parse(text: str, step: int, fmt: ToolCallFormat) -> tuple[str, list[dict[str, Any]]]:
    parser = OutputParser(tools=fmt, tool_names=["get_weather"], tool_params=PARAMS)
    parts = [parser.add(text[i : i + step]) for i in range(0, len(text), step)]
    parts.append(parser.flush())
    return "".join(p.content for p in parts), [c for p in parts for c in p.tool_calls]


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
@pytest.mark.parametrize("template", [CODER, BARE])
def test_calls_parse_from_any_split(step: int, template: str) -> None:
    text = (
        CALL
        if template is CODER
        else CALL.replace("<tool_call>\n", "").replace("\n</tool_call>", "")
    )
    twice = text + "\n" + text[len("I will look it up.\n\n") :]
    content, calls = parse(twice, step, tool_call_format(template))
    assert content == "I will look it up."  # the space before a call is not content
    assert [c["function"] for c in calls] == [
        {"index": 0, "name": "get_weather", "arguments": ARGUMENTS},
        {"index": 1, "name": "get_weather", "arguments": ARGUMENTS},
    ]
    assert all(c["id"].startswith("call_") for c in calls)


def test_what_is_not_a_call_stays_content() -> None:
    fmt = tool_call_format(CODER)
    assert parse("a <tool_ b\n\n", 1, fmt) == ("a <tool_ b\n\n", [])
    assert parse("x <tool_call>oops</tool_call> y", 2, fmt) == (
        "x <tool_call>oops</tool_call> y",
        [],
    )
    # a call cut off (a length limit) is parsed as far as it went
    content, calls = parse("<tool_call>\n<function=f>\n<parameter=a>\n1", 3, fmt)
    assert (content, [c["function"]["arguments"] for c in calls]) == ("", [{"a": "1"}])


NAMED = [
    (
        MISTRAL,
        'Sure.\n[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris", "n": [1, "}"]}'
        '[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}',
        "Sure.",
    ),
    (
        KIMI,
        "ok <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
        '<|tool_call_argument_begin|>{"city": "Paris", "n": [1, "}"]}<|tool_call_end|>'
        "<|tool_calls_section_end|> then",
        "ok then",
    ),
    (
        DEEPSEEK,
        "ok <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        '{"city": "Paris", "n": [1, "}"]}<｜tool▁call▁end｜><｜tool▁calls▁end｜> then',
        "ok then",
    ),
]


@pytest.mark.parametrize("step", [1, 2, 5, 1000])
@pytest.mark.parametrize(("template", "text", "content"), NAMED)
def test_named_calls_parse_from_any_split(
    step: int, template: str, text: str, content: str
) -> None:
    got, calls = parse(text, step, tool_call_format(template))
    assert got == content
    assert calls[0]["function"] == {
        "index": 0,
        "name": "get_weather",
        "arguments": {"city": "Paris", "n": [1, "}"]},
    }
    if template is MISTRAL:  # a second call opens again
        assert calls[1]["function"] == {"index": 1, "name": "get_time", "arguments": {"tz": "CET"}}


@pytest.mark.parametrize(
    "text",
    [
        "I write [TOOL_CALLS] as text.",  # no name and arguments after it
        'Cut [TOOL_CALLS]f[ARGS]{"a": ',  # a call cut off
        'Not [TOOL_CALLS]f[ARGS]["a"]',  # arguments that are not an object
    ],
)
def test_what_is_not_a_named_call_stays_content(text: str) -> None:
    assert parse(text, 3, tool_call_format(MISTRAL)) == (text, [])


@pytest.mark.parametrize(
    ("text", "schema", "value"),
    [
        ("null", {"type": "string"}, None),
        ("7", None, "7"),  # no schema: a string
        ("7", {"type": "integer"}, 7),
        ("7.5", {"type": "integer"}, "7.5"),
        ("7.0", {"type": "number"}, 7),
        ("7.5", {"type": "number"}, 7.5),
        ("nan", {"type": "number"}, "nan"),  # not JSON
        ("TRUE", {"type": "boolean"}, True),
        ("yes", {"type": "boolean"}, False),  # as Ollama and Qwen's parser
        ("yes", {"type": ["boolean", "string"]}, "yes"),
        ("12", {"anyOf": [{"type": "string"}, {"type": "integer"}]}, 12),
        ('{"a": [1]}', {"type": "object"}, {"a": [1]}),
        ("[1, 2]", {"type": "object"}, "[1, 2]"),
        ("[1, 2]", {"type": "array"}, [1, 2]),
    ],
)
def test_values_take_their_schemas_type(text: str, schema: Any, value: Any) -> None:
    assert typed(text, schema) == value


def model(template: str) -> Any:
    fmt = tool_call_format(template)
    return served(
        "m", template=template, capabilities=frozenset({"completion", "tools"}), tool_format=fmt
    )


MISTRAL_CALL = "I will look it up.[TOOL_CALLS]get_weather[ARGS]" + json.dumps(ARGUMENTS)


DEEPSEEK_CALL = (
    "I will look it up.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
    + json.dumps(ARGUMENTS)
    + "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
)


@pytest.mark.parametrize(
    ("template", "reply"), [(CODER, CALL), (MISTRAL, MISTRAL_CALL), (DEEPSEEK, DEEPSEEK_CALL)]
)
def test_clients_get_typed_calls(template: str, reply: str) -> None:
    ollama = pytest.importorskip("ollama")
    openai = pytest.importorskip("openai")
    starter = FakeStarter(reply=reply)
    scheduler = Scheduler(start=starter, defaults=Defaults(), num_parallel=2)
    state = ServerState(FakeModels({**MODELS, "m": model(template)}), scheduler)  # type: ignore[arg-type]
    messages = [{"role": "user", "content": "Weather in San Francisco?"}]
    with TestClient(create_app(state)) as client:
        api = ollama.Client("http://testserver", transport=through(client))
        r = api.chat(model="m", messages=messages, tools=[WEATHER])
        assert r.message.content == "I will look it up."
        [call] = r.message.tool_calls or []
        assert (call.function.name, call.function.arguments) == ("get_weather", ARGUMENTS)
        assert starter.runners[0].fields[-1].get("grammar") is None  # read, not constrained
        # the call goes back in the history (as arguments in JSON text where the template
        # joins them to text: DeepSeek's)
        history = [*messages, r.message.model_dump(exclude_none=True)]
        api.chat(
            model="m", messages=[*history, {"role": "tool", "content": "12 C"}], tools=[WEATHER]
        )
        assert "get_weather" in starter.runners[0].prompts[-1]
        assert "San Francisco" in starter.runners[0].prompts[-1].split("Weather in")[-1]

        http = httpx.Client(transport=through(client))
        oai = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http)
        done = oai.chat.completions.create(model="m", messages=messages, tools=[WEATHER])
        [oai_call] = done.choices[0].message.tool_calls or []
        assert json.loads(oai_call.function.arguments) == ARGUMENTS
        assert done.choices[0].finish_reason == "tool_calls"
        forced = {"model": "m", "messages": messages, "tools": [WEATHER]}
        r2 = client.post("/v1/chat/completions", json={**forced, "tool_choice": "required"})
        assert r2.status_code == 400
