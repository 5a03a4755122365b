"""Tool calls: formats read from templates, and the stream parser at every piece boundary."""

from typing import Any

import pytest

from ember.gguf import GGUFFile
from ember.server.tools import (
    BARE_JSON,
    ToolCallFormat,
    ToolCallParser,
    can_use_tools,
    json_end,
    parse_calls,
    tool_call_format,
)

QWEN = ToolCallFormat("<tool_call>", "</tool_call>")
MISTRAL = (
    "{%- for m in messages %}{%- if m.role == 'user' %}[INST] {{ m.content }}[/INST]"
    "{%- elif m.tool_calls %}[TOOL_CALLS] [{%- for tc in m.tool_calls %}"
    '{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments|tojson }}}'
    "{% if not loop.last %}, {% endif %}{%- endfor %}]</s>{%- else %}{{ m.content }}</s>"
    "{%- endif %}{%- endfor %}"
)
# as Mistral Nemo's: a call needs an id of nine letters and digits, turns end with eos_token
MISTRAL_IDS = (
    "{%- for m in messages %}{%- if m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{%- elif m.tool_calls %}[TOOL_CALLS][{%- for tc in m.tool_calls %}"
    "{%- if tc.id is not defined or tc.id | length != 9 %}"
    "{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}"
    "{%- endif %}{{ {'name': tc.function.name, 'arguments': tc.function.arguments, 'id': tc.id}"
    " | tojson }}{% if not loop.last %}, {% endif %}{%- endfor %}]{{ eos_token }}"
    "{%- else %}{{ m.content + eos_token }}{%- endif %}{%- endfor %}"
)
LLAMA_JSON = (
    "{%- for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{%- if m.tool_calls %}{{ m.tool_calls[0].function | tojson }}{% else %}{{ m.content }}"
    "{% endif %}<|eot_id|>{%- endfor %}"
)

# Qwen 2.5's turns as an Ollama Modelfile writes them: a Go template
QWEN_GO = (
    "{{- if or .System .Tools }}<|im_start|>system\n{{ if .System }}{{ .System }}{{ end }}"
    "{{- if .Tools }}\n\n# Tools\n\n<tools>{{ range .Tools }}\n"
    '{"type": "function", "function": {{ .Function }}}{{ end }}\n</tools>\n\n'
    "Calls go within <tool_call></tool_call> tags.{{ end }}<|im_end|>\n{{ end }}"
    "{{- range $i, $_ := .Messages }}{{ $last := eq (len (slice $.Messages $i)) 1 }}"
    '{{- if eq .Role "user" }}<|im_start|>user\n{{ .Content }}<|im_end|>\n'
    '{{ else if eq .Role "assistant" }}<|im_start|>assistant\n'
    "{{ if .Content }}{{ .Content }}{{ else if .ToolCalls }}<tool_call>\n"
    '{{ range .ToolCalls }}{"name": "{{ .Function.Name }}", '
    '"arguments": {{ .Function.Arguments }}}\n'
    "{{ end }}</tool_call>{{ end }}{{ if not $last }}<|im_end|>\n{{ end }}"
    '{{ else if eq .Role "tool" }}<|im_start|>user\n<tool_response>\n{{ .Content }}\n'
    "</tool_response><|im_end|>\n{{ end }}"
    '{{- if and (ne .Role "assistant") $last }}<|im_start|>assistant\n{{ end }}{{ end }}'
)


@pytest.fixture(scope="module")
def qwen_template(qwen2_path: Any) -> str:
    template: str = GGUFFile.open(qwen2_path).metadata["tokenizer.chat_template"]
    return template


@pytest.fixture(scope="module")
def smollm2_template(smollm2_path: Any) -> str:
    template: str = GGUFFile.open(smollm2_path).metadata["tokenizer.chat_template"]
    return template


@pytest.mark.model
def test_qwen_template_shows_tool_call_tags(qwen_template: str) -> None:
    assert tool_call_format(qwen_template) == QWEN
    assert can_use_tools(qwen_template) is True


@pytest.mark.model
def test_smollm2_template_has_no_tools(smollm2_template: str) -> None:
    assert can_use_tools(smollm2_template) is False
    assert tool_call_format(smollm2_template) == BARE_JSON


@pytest.mark.parametrize(
    ("template", "fmt"),
    [
        (MISTRAL, ToolCallFormat("[TOOL_CALLS] [", "]")),
        (MISTRAL_IDS, ToolCallFormat("[TOOL_CALLS][", "]")),  # was bare JSON: the render failed
        (LLAMA_JSON, BARE_JSON),
        (QWEN_GO, QWEN),
        ("{{ raise_exception('x') }}", BARE_JSON),
        (None, BARE_JSON),
    ],
)
def test_formats_of_other_templates(template: str | None, fmt: ToolCallFormat) -> None:
    assert tool_call_format(template) == fmt


def test_a_go_template_that_shows_tools_can_use_them() -> None:
    assert can_use_tools(QWEN_GO) is True
    assert can_use_tools("{{ range .Messages }}{{ .Content }}{{ end }}") is False


def call(name: str, index: int = 0, **arguments: Any) -> dict[str, Any]:
    return {"function": {"index": index, "name": name, "arguments": arguments}}


def run(parser: ToolCallParser, pieces: list[str]) -> tuple[str, list[dict[str, Any]]]:
    content, calls = "", []
    for piece in pieces:
        c, new = parser.add(piece)
        content, calls = content + c, calls + new
    c, new = parser.flush()
    return content + c, calls + new


def splits(text: str) -> list[list[str]]:
    """text whole, one character at a time, and cut in two at every position."""
    return [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]


WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
NAMES = ("get_weather", "get_time")

TAGGED_CASES = [
    # (output, content, calls) for Qwen's <tool_call> format
    (f"<tool_call>\n{WEATHER}\n</tool_call>", "", [call("get_weather", city="Paris")]),
    (
        f"Let me check.\n<tool_call>\n{WEATHER}\n</tool_call>",
        "Let me check.\n",
        [call("get_weather", city="Paris")],
    ),
    (
        f"<tool_call>{WEATHER}</tool_call>\n<tool_call>"
        '{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>',
        "",
        [call("get_weather", city="Paris"), call("get_time", 1, zone="CET")],
    ),
    (
        f"<tool_call>[{WEATHER}, {WEATHER}]</tool_call>",
        "",
        [call("get_weather", city="Paris"), call("get_weather", 1, city="Paris")],
    ),
    # a bare call at the start is taken too (small models forget the tags)
    (f"  {WEATHER}", "", [call("get_weather", city="Paris")]),
    ("No tools needed: 2 + 2 = 4.", "No tools needed: 2 + 2 = 4.", []),
    ("a <b>tag</b> that is not one", "a <b>tag</b> that is not one", []),
    # not calls: given back as they came
    (
        '<tool_call>{"name": "unknown", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "unknown", "arguments": {}}</tool_call>',
        [],
    ),
    ("<tool_call>{not json}</tool_call>", "<tool_call>{not json}</tool_call>", []),
    # a call the end cut short after its tag is no content, as Ollama's parser drops it
    ('<tool_call>{"name": "get_weather", "argu', "", []),
    (
        f'<tool_call>{WEATHER}</tool_call>\n<tool_call>{{"na',
        "",
        [call("get_weather", city="Paris")],
    ),
    ('{"answer": 42}', '{"answer": 42}', []),
    (f"<tool_call>{WEATHER}</tool_call> Done.", "Done.", [call("get_weather", city="Paris")]),
]


@pytest.mark.parametrize(("output", "content", "calls"), TAGGED_CASES)
def test_tagged_calls_however_the_output_is_cut(
    output: str, content: str, calls: list[dict[str, Any]]
) -> None:
    for pieces in splits(output):
        assert run(ToolCallParser(QWEN, NAMES), pieces) == (content, calls), pieces


BARE_CASES = [
    (WEATHER, "", [call("get_weather", city="Paris")]),
    (f"\n[{WEATHER}]\n", "", [call("get_weather", city="Paris")]),
    (
        '{"name": "get_weather", "parameters": {"city": "Rome"}}',
        "",
        [call("get_weather", city="Rome")],
    ),
    (
        '{"type": "function", "function": '
        '{"name": "get_time", "arguments": "{\\"zone\\": \\"UTC\\"}"}}',
        "",
        [call("get_time", zone="UTC")],
    ),
    # JSON that names no arguments is an answer, not a call
    ('{"name": "get_weather"}', '{"name": "get_weather"}', []),
    # bare JSON counts only at the start of the output
    (f"Sure: {WEATHER}", f"Sure: {WEATHER}", []),
    ('{"a": "}{"}', '{"a": "}{"}', []),
]


@pytest.mark.parametrize(("output", "content", "calls"), BARE_CASES)
def test_bare_json_calls_however_the_output_is_cut(
    output: str, content: str, calls: list[dict[str, Any]]
) -> None:
    for pieces in splits(output):
        assert run(ToolCallParser(BARE_JSON, NAMES), pieces) == (content, calls), pieces


def test_mistral_run_of_calls() -> None:
    fmt = ToolCallFormat("[TOOL_CALLS] [", "]")
    output = f"[TOOL_CALLS] [{WEATHER}, " + '{"name": "get_time", "arguments": {}}]'
    for pieces in splits(output):
        assert run(ToolCallParser(fmt, NAMES), pieces) == (
            "",
            [call("get_weather", city="Paris"), call("get_time", 1)],
        )


def test_content_streams_until_a_possible_tag_and_calls_come_when_complete() -> None:
    parser = ToolCallParser(QWEN, NAMES)
    assert parser.add("Checking <tool") == ("Checking ", [])
    assert parser.add('_call>\n{"name": ') == ("", [])
    assert parser.add('"get_time", "arguments": {}}') == ("", [call("get_time")])
    assert parser.add("\n</tool_call>") == ("", [])
    assert parser.flush() == ("", [])


def test_without_names_any_named_call_counts() -> None:
    parser = ToolCallParser(QWEN)
    output = '<tool_call>{"name": "anything", "arguments": {"x": [1, {"y": "}"}]}}</tool_call>'
    assert run(parser, [output]) == ("", [call("anything", x=[1, {"y": "}"}])])


def test_arguments_keep_their_order() -> None:
    parser = ToolCallParser(QWEN, ["f"])
    _, calls = run(parser, ['<tool_call>{"name": "f", "arguments": {"z": 1, "a": 2, "m": 3}}'])
    assert list(calls[0]["function"]["arguments"]) == ["z", "a", "m"]


@pytest.mark.parametrize(
    ("text", "end"),
    [('{"a": 1} tail', 8), ('[{"a": "]"}]x', 12), ('{"a": "\\"}"}', 12), ('{"a": [1, 2', None)],
)
def test_json_end(text: str, end: int | None) -> None:
    assert json_end(text) == end


def test_parse_calls_refuses_arguments_that_are_not_an_object() -> None:
    assert parse_calls('{"name": "f", "arguments": [1]}', (), is_tagged=True) is None
    assert parse_calls('{"name": "f", "arguments": "not json"}', (), is_tagged=True) is None
    assert parse_calls("[]", (), is_tagged=True) is None


# as Nemotron Nano 2's: a list of calls in tags, the end of turn written after them
NEMOTRON = (
    "{% for m in messages %}<SPECIAL_11>{{ m.role }}\n{% if m.tool_calls %}<TOOLCALL>"
    "{{ m.tool_calls | map(attribute='function') | list | tojson }}</TOOLCALL><SPECIAL_12>\n\n"
    "{% else %}{{ m.content }}\n<SPECIAL_12>\n{% endif %}{% endfor %}"
)


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_a_closing_cut_by_the_end_of_turn_is_not_content(step: int) -> None:
    fmt = tool_call_format(NEMOTRON)
    assert fmt == ToolCallFormat("<TOOLCALL>[", "]</TOOLCALL><SPECIAL_12>")
    parser = ToolCallParser(fmt, NAMES)
    text = f"Checking. <TOOLCALL>[{WEATHER}]</TOOLCALL>"  # the model stops on <SPECIAL_12>
    pieces = [parser.add(text[i : i + step]) for i in range(0, len(text), step)]
    pieces.append(parser.flush())
    assert "".join(c for c, _ in pieces) == "Checking. "
    assert [call["function"]["name"] for _, calls in pieces for call in calls] == ["get_weather"]


@pytest.mark.parametrize("step", [1, 2, 1000])
@pytest.mark.parametrize(
    ("text", "content", "names"),
    [
        # Granite 3.3: its template names <|tool_call|> only in prose, so its format is bare JSON
        (f"<|tool_call|>[{WEATHER}]", "", ["get_weather"]),
        (f" <|tool_call|> {WEATHER}", "", ["get_weather"]),
        ('<|tool_call|>[{"name": "nope", "arguments": {}}]', None, []),  # not a tool's call
        ("<|tool_call|> sorry, no tool fits", None, []),
        ("<|im_start|>hello", None, []),
        ("<b>bold</b>", None, []),
    ],
)
def test_a_bare_json_model_may_open_its_calls_with_a_tag(
    step: int, text: str, content: str | None, names: list[str]
) -> None:
    parser = ToolCallParser(BARE_JSON, NAMES)
    pieces = [parser.add(text[i : i + step]) for i in range(0, len(text), step)]
    pieces.append(parser.flush())
    assert "".join(c for c, _ in pieces) == (text if content is None else content)
    assert [call["function"]["name"] for _, calls in pieces for call in calls] == names


def test_a_tools_name_as_the_key_of_its_arguments_is_a_call() -> None:
    """As Ollama's parser reads {"get_conditions": {"location": "Tokyo"}} (tools_test.go)."""
    names = ("get_conditions",)
    expected = [{"function": {"name": "get_conditions", "arguments": {"location": "Tokyo"}}}]
    for text in ('{"get_conditions": {"location": "Tokyo"}}',
                 '{"get_conditions": "{\\"location\\": \\"Tokyo\\"}"}'):  # fmt: skip
        assert parse_calls(text, names, is_tagged=True) == expected
        assert parse_calls(text, names, is_tagged=False) == expected
    # a key that names no tool stays an answer
    assert parse_calls('{"city": {"name": "Tokyo"}}', names, is_tagged=False) is None
