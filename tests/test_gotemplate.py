"""Go templates as Ollama's Modelfiles write them: the template language (gotemplate.py) and the
values and turn rules of Ollama's Template.Execute (gochat.py)."""

import datetime
import tracemalloc

import pytest

from ember import gotemplate
from ember.gochat import render_go
from ember.gotemplate import GoTemplate, GoTemplateError, is_go_template
from ember.template import TemplateError, render_chat

CHAT = [
    {"role": "user", "content": "Hello friend!"},
    {"role": "assistant", "content": "Hello human!"},
    {"role": "user", "content": "What is your name?"},
]
SYSTEM = [{"role": "system", "content": "Be brief."}]


def go(source: str, **data: object) -> str:
    return GoTemplate(source).render(dict(data))


def chat(source: str, messages: list[dict], **kwargs: object) -> str:
    return render_go(GoTemplate(source), messages, **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------- the language


def test_fields_text_and_trim_markers() -> None:
    assert go("a {{ .X }} b", X="x") == "a x b"
    assert go("a  \n {{- .X -}} \n  b", X="x") == "axb"
    assert go("a {{- /* a comment */ -}} b") == "ab"
    assert go("a{{/* a comment */}}b") == "ab"
    assert go("{{ .A.B.C }}", A={"B": {"C": 3}}) == "3"
    # "-3" is a number, not a trim marker
    assert go("{{ print -3 }}") == "-3"


def test_a_missing_key_is_nil_and_prints_no_value() -> None:
    assert go("[{{ .Missing }}]") == "[<no value>]"
    assert go("{{ if .Missing }}yes{{ else }}no{{ end }}") == "no"
    assert go("{{ .Missing.Deeper }}") == "<no value>"


def test_if_else_if_else() -> None:
    source = '{{ if eq .R "a" }}A{{ else if eq .R "b" "c" }}BC{{ else }}other{{ end }}'
    assert [go(source, R=r) for r in "abcd"] == ["A", "BC", "BC", "other"]


def test_truth_follows_go() -> None:
    source = "{{ if . }}t{{ else }}f{{ end }}"
    values = [0, 1, "", "x", [], [0], {}, {"a": 1}, None, False, True, 0.0]
    got = "".join(GoTemplate(source).render(v) for v in values)  # type: ignore[arg-type]
    assert got == "ftftftftfftf"


def test_range_with_index_else_break_and_continue() -> None:
    assert go("{{ range $i, $v := .L }}{{ $i }}={{ $v }};{{ end }}", L=["a", "b"]) == "0=a;1=b;"
    assert go("{{ range .L }}{{ . }}{{ else }}empty{{ end }}", L=[]) == "empty"
    source = (
        "{{ range .L }}{{ if eq . 2 }}{{ continue }}{{ end }}"
        "{{ if eq . 4 }}{{ break }}{{ end }}{{ . }}{{ end }}"
    )
    assert go(source, L=[1, 2, 3, 4, 5]) == "13"
    # a map ranges in key order; $ is the data at the top
    assert (
        go("{{ range $k, $v := .M }}{{ $k }}{{ $v }}{{ $.S }}{{ end }}", M={"b": 2, "a": 1}, S="!")
        == "a1!b2!"
    )
    assert go("{{ range 3 }}{{ . }}{{ end }}") == "012"


def test_with_rebinds_dot() -> None:
    assert go("{{ with .A }}{{ .B }}{{ else }}none{{ end }}", A={"B": "b"}) == "b"
    assert go("{{ with .A }}{{ .B }}{{ else }}none{{ end }}", A={}) == "none"


def test_variables_are_scoped_and_assignable() -> None:
    assert go("{{ $x := 1 }}{{ if true }}{{ $x = 2 }}{{ $y := 3 }}{{ end }}{{ $x }}") == "2"
    with pytest.raises(GoTemplateError, match="undefined variable"):
        go("{{ if true }}{{ $y := 3 }}{{ end }}{{ $y }}")
    source = '{{ $last := "" }}{{ range .L }}{{ $last = . }}{{ end }}{{ $last }}'
    assert go(source, L=["a", "b"]) == "b"


def test_pipelines_and_parentheses() -> None:
    assert go('{{ "x" | printf "%s-%s" "a" }}') == "a-x"
    assert go("{{ (index .L 1).Name }}", L=[{"Name": "a"}, {"Name": "b"}]) == "b"
    assert go("{{ len (slice .L 1) }}", L=[1, 2, 3]) == "2"
    assert go("{{ if and .A (not .B) }}y{{ end }}", A=1, B=0) == "y"


def test_and_or_short_circuit_and_return_an_operand() -> None:
    assert go("{{ or .A .B }}", A="", B="b") == "b"
    assert go("{{ and .A .B }}", A="", B="b") == ""
    # the second operand would fail; it is never evaluated
    assert go("{{ or .A (index .L 9) }}", A="a", L=[]) == "a"


def test_builtins() -> None:
    assert (
        go('{{ len .S }} {{ len .L }} {{ index .M "k" }}', S="héllo", L=[1], M={"k": "v"})
        == "6 1 v"
    )
    assert go('{{ printf "%d %s %v %q %5.2f %%" 3 "s" .L "q" 3.14159 }}', L=[1, "a"]) == (
        '3 s [1 a] "q"  3.14 %'
    )
    assert go('{{ print 1 2 "x" 3 }}|{{ println "a" 1 }}') == "1 2x3|a 1\n"
    assert go("{{ lt 1 2 }} {{ ge 2.5 3 }} {{ ne .A .B }}", A="x", B="y") == "true false true"
    assert go("{{ 1000000.0 }} {{ 123456.5 }} {{ 0.00001 }} {{ 2.0 }}") == "1e+06 123456.5 1e-05 2"
    assert (
        go("{{ .L }} {{ .M }}", L=["a", 1, None], M={"b": 1, "a": [2]})
        == "[a 1 <nil>] map[a:[2] b:1]"
    )


def test_json_writes_go_json() -> None:
    value = {"b": 1.0, "a": "<x> & y", "c": [True, None]}
    assert go("{{ json .V }}", V=value) == '{"a":"\\u003cx\\u003e \\u0026 y","b":1,"c":[true,null]}'


def test_ollama_functions() -> None:
    today = datetime.date.today()
    assert go("{{ currentDate }}") == today.isoformat()
    assert go("{{ yesterdayDate }}") == (today - datetime.timedelta(days=1)).isoformat()
    prop = {"Type": ["string", "null"]}
    assert go("{{ toTypeScriptType .P }} {{ toTypeScriptType .Q }}", P=prop, Q={}) == (
        "string | null any"
    )


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{{ .X ", "unclosed action"),
        ("{{ if .X }}x", "without {{end}}"),
        ("{{ end }}", "unexpected {{end}}"),
        ("{{ else }}", "unexpected {{else}}"),
        ('{{ define "t" }}x{{ end }}', "not supported"),
        ('{{ template "t" }}', "not supported"),
        ("{{ (.X }}", "unclosed left paren"),
        ("{{ .X) }}", "unexpected ')'"),
        ("{{ }}", "missing value"),
        ("{{ .X | }}", "missing command"),
        ('{{ "abc }}', "unexpected"),
        ("{{ .X # }}", "unexpected"),
    ],
)
def test_templates_that_do_not_parse(source: str, message: str) -> None:
    with pytest.raises(GoTemplateError, match="does not parse") as err:
        GoTemplate(source)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{{ index .L 5 }}", "index out of range"),
        ("{{ slice .L 2 1 }}", "slice bounds out of range"),
        ("{{ len 3 }}", "len of type int"),
        ('{{ lt 1 "a" }}', "incompatible types"),
        ("{{ not 1 2 }}", "wrong number of args"),
        ("{{ .L.X }}", "can't evaluate field X"),
        ("{{ range .N }}{{ end }}", "can't iterate"),
        ("{{ break }}", "outside range"),
        ("{{ .X 1 }}", "non-function"),
    ],
)
def test_templates_that_fail(source: str, message: str) -> None:
    with pytest.raises(GoTemplateError, match="failed") as err:
        go(source, L=[1], N=1.5, X=1)
    assert message in str(err.value)


def test_fuel_bounds_an_untrusted_template(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gotemplate, "FUEL", 10_000)
    nested = "{{ range .L }}{{ range $.L }}{{ range $.L }}x{{ end }}{{ end }}{{ end }}"
    with pytest.raises(GoTemplateError, match="out of fuel"):
        go(nested, L=list(range(100)))
    monkeypatch.setattr(gotemplate, "MAX_OUTPUT", 1_000)
    with pytest.raises(GoTemplateError, match="too much text"):
        go("{{ range .L }}{{ $.S }}{{ end }}", L=list(range(10)), S="y" * 200)


def test_a_range_over_a_huge_number_burns_fuel_not_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gotemplate, "FUEL", 10_000)
    tracemalloc.start()
    try:
        with pytest.raises(GoTemplateError, match="out of fuel"):
            go("{{ range $i := 1000000000000 }}{{ end }}")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    # and fmt's sizes past a million are refused, as Go's, not written out
    assert go('{{ printf "%.999999999f" 1.0 }}') == "%!(BADPREC)"
    assert go('{{ printf "%999999999d" 1 }}') == "%!(BADWIDTH)"


def test_an_undefined_function_is_refused_at_parse_as_gos() -> None:
    for source in ("{{ .Prompt }} {{ foo .Prompt }}", "{{ if and .A (bar .B) }}x{{ end }}"):
        with pytest.raises(GoTemplateError, match=r"does not parse: function .* not defined"):
            GoTemplate(source)


def test_html_js_and_urlquery_escape_as_gos() -> None:
    assert go('{{ html "<a href=\\"x\\">&\'" }}') == "&lt;a href=&#34;x&#34;&gt;&amp;&#39;"
    assert go('{{ js "it\'s <b>=\\n" }}') == "it\\'s \\u003Cb\\u003E\\u003D\\u000A"
    assert go('{{ urlquery "a b&c/é" }}') == "a+b%26c%2F%C3%A9"
    assert go("{{ html 1 2 }}") == "1 2"


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    with pytest.raises(GoTemplateError):
        GoTemplate("{{ if 1 }}" * 5000 + "{{ end }}" * 5000).render({})


@pytest.mark.parametrize(
    ("source", "is_go"),
    [
        ("{{ .Prompt }}", True),
        ("{{- range .Messages }}{{ .Content }}{{ end }}", True),
        ("{{ if .System }}x{{ end }}", True),
        ("{{ $.Tools }}", True),
        ("{{- /* note */ -}}", True),
        ("{% for m in messages %}{{ m.content }}{% endfor %}", False),
        ("{{ bos_token }}{{ messages[0]['content'] }}", False),
        ("plain text", False),
    ],
)
def test_go_templates_are_told_from_jinja(source: str, is_go: bool) -> None:
    assert is_go_template(source) is is_go


# ---------------------------------------------------------------- Ollama's turns and values

CHATML_MESSAGES = (
    "{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n"
    "{{ end }}<|im_start|>assistant\n"
)
CHATML_LEGACY = (
    "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
    "{{ if .Prompt }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n{{ end }}"
    "<|im_start|>assistant\n{{ .Response }}<|im_end|>\n"
)
CHATML_EXPECTED = (
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello friend!<|im_end|>\n"
    "<|im_start|>assistant\nHello human!<|im_end|>\n"
    "<|im_start|>user\nWhat is your name?<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.mark.parametrize("source", [CHATML_MESSAGES, CHATML_LEGACY])
def test_a_template_with_or_without_messages_renders_the_same_chat(source: str) -> None:
    assert chat(source, SYSTEM + CHAT) == CHATML_EXPECTED


INST_LEGACY = "[INST] {{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}[/INST] "
INST_RESPONSE = INST_LEGACY + "{{ .Response }}"
INST_MESSAGES = (
    "[INST] {{ if .System }}{{ .System }}\n\n{{ end }}"
    "{{- range .Messages }}"
    '{{- if eq .Role "user" }}{{ .Content }}[/INST] '
    '{{- else if eq .Role "assistant" }} {{ .Content }}[INST] {{ end }}'
    "{{- end }}"
)


@pytest.mark.parametrize("source", [INST_LEGACY, INST_RESPONSE])
def test_an_older_template_runs_once_a_turn_and_ends_open(source: str) -> None:
    expected = "[INST] Hello friend![/INST] Hello human![INST] What is your name?[/INST] "
    assert chat(source, CHAT) == expected
    # the system prompt goes to the turn it starts
    expected = (
        "[INST] Be brief.\n\nHello friend![/INST] Hello human![INST] What is your name?[/INST] "
    )
    assert chat(source, SYSTEM + CHAT) == expected


def test_a_final_assistant_message_is_continued() -> None:
    partial = [*CHAT, {"role": "assistant", "content": "My name is"}]
    expected = "[INST] Hello friend![/INST] Hello human![INST] What is your name?[/INST] My name is"
    assert chat(INST_RESPONSE, partial) == expected
    assert chat(INST_LEGACY, partial) == expected  # .Response is added at the end, as Ollama


def test_a_response_inside_a_branch_cuts_there() -> None:
    source = "{{ .Prompt }}{{ if .Prompt }} => {{ .Response }} <end>{{ else }}x{{ end }}<after>"
    assert chat(source, [{"role": "user", "content": "q"}]) == "q => "


def test_messages_runs_of_one_role_are_merged_and_systems_joined() -> None:
    source = "{{ .System }}|{{ range .Messages }}{{ .Role }}:{{ .Content }};{{ end }}"
    messages = [
        {"role": "system", "content": "a"},
        {"role": "user", "content": "1"},
        {"role": "user", "content": "2"},
        {"role": "system", "content": "b"},
        {"role": "tool", "content": "t1"},
        {"role": "tool", "content": "t2"},
    ]
    assert chat(source, messages) == "a\n\nb|system:a;user:1\n\n2;system:b;tool:t1;tool:t2;"


def test_think_values() -> None:
    source = "{{ .Think }} {{ .ThinkLevel }} {{ .IsThinkSet }}{{ range .Messages }}{{ end }}"
    assert chat(source, CHAT) == "false  false"
    assert chat(source, CHAT, think=True) == "true medium true"  # Ollama's default level
    assert chat(source, CHAT, think=False) == "false  true"
    assert chat(source, CHAT, think="high") == "true high true"


TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather <now>",
        "parameters": {
            "type": "object",
            "required": ["city"],
            "properties": {
                "unit": {"type": ["string", "null"], "enum": ["c", "f"]},
                "city": {"description": "A city", "type": "string"},
            },
        },
    },
}


def test_tools_print_as_ollamas_json_and_range_as_fields() -> None:
    source = (
        "{{ .Tools }}#{{ range .Tools }}{{ .Function.Name }}:"
        "{{ range $k, $v := .Function.Parameters.Properties }}"
        " {{ $k }}={{ $v.Type }}/{{ toTypeScriptType $v }}{{ end }}{{ end }}"
        "{{ range .Messages }}{{ end }}"
    )
    out = chat(source, CHAT, tools=[TOOL])
    tools, fields = out.split("#")
    assert tools == (
        '[{"type":"function","function":{"name":"get_weather","description":"Weather '
        '\\u003cnow\\u003e","parameters":{"type":"object","required":["city"],"properties":'
        '{"city":{"type":"string","description":"A city"},"unit":{"type":["string","null"],'
        '"enum":["c","f"]}}}}}]'
    )
    assert fields == "get_weather: city=string/string unit=[string null]/string | null"
    assert chat("{{ if .Tools }}tools{{ end }}{{ range .Messages }}{{ end }}", CHAT) == ""
    # no tools is Go's nil slice: length 0, printed and marshalled as null
    nil_tools = "{{ len .Tools }} {{ .Tools }} {{ json .Tools }}{{ range .Messages }}{{ end }}"
    assert chat(nil_tools, CHAT) == "0 null null"


def test_a_tool_without_properties_has_null_ones_in_its_json() -> None:
    bare = {"type": "function", "function": {"name": "now", "description": "The time"}}
    empty = {"type": "function", "function": {"name": "now", "parameters": {"properties": {}}}}
    source = "{{ .Tools }}{{ range .Tools }}|{{ .Function.Parameters.Properties }}{{ end }}"
    source += "{{ range .Messages }}{{ end }}"
    assert chat(source, CHAT, tools=[bare]) == (
        '[{"type":"function","function":{"name":"now","description":"The time",'
        '"parameters":{"type":"","properties":null}}}]|{}'
    )
    assert '"properties":{}' in chat(source, CHAT, tools=[empty])


def test_tool_calls_and_results_reach_the_template() -> None:
    source = (
        "{{ range .Messages }}{{ if .ToolCalls }}{{ range .ToolCalls }}"
        "<call>{{ .Function.Name }} {{ .Function.Arguments }}</call>{{ end }}"
        '{{ else if eq .Role "tool" }}<result name={{ .ToolName }}>{{ .Content }}</result>'
        "{{ else }}{{ .Content }}{{ end }}{{ end }}"
    )
    call = {"function": {"name": "get_weather", "arguments": {"unit": "c", "city": "Paris"}}}
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "20", "tool_name": "get_weather"},
    ]
    assert chat(source, messages, tools=[TOOL]) == (
        'weather?<call>get_weather {"city":"Paris","unit":"c"}</call>'
        "<result name=get_weather>20</result>"
    )


def test_render_chat_takes_go_templates_and_reports_their_errors() -> None:
    messages = SYSTEM + CHAT
    assert render_chat(CHATML_MESSAGES, messages) == CHATML_EXPECTED
    # an older template: each turn's prompt and response in turn
    assert render_chat("{{ .Prompt }}", CHAT) == "Hello friend!Hello human!What is your name?"
    with pytest.raises(TemplateError, match="does not parse"):
        render_chat("{{ .Prompt ", CHAT)
    with pytest.raises(TemplateError, match='"nosuch" not defined'):
        render_chat("{{ .Prompt | nosuch }}", CHAT)


def test_text_that_reads_like_a_keyword_is_text() -> None:
    assert go("{{ range .L }}break continue{{ end }}", L=[1]) == "break continue"


def test_untrusted_sources_fail_fast() -> None:
    # unclosed comments, strings and actions, many times over: a clear error each
    for source in ("{{/*" * 20_000, '{{ "' * 20_000, "{{" * 50_000):
        with pytest.raises(GoTemplateError, match="does not parse"):
            GoTemplate(source)
    with pytest.raises(GoTemplateError, match="unclosed comment"):
        GoTemplate("{{/* no end */ }}")
