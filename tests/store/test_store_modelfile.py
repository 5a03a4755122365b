"""The Modelfile parser, table tests taken from Ollama's parser/parser_test.go, typed PARAMETER
values, and a stored model written back as a Modelfile that parses to the same commands."""

import codecs

import pytest

from ember.store import Command, ModelfileError, parse_modelfile
from ember.store.create import CreateRequest
from ember.store.modelfile import collect_parameters, format_parameters, quote, typed_parameter

C = Command
LLAMA3_TEMPLATE = (
    "{{ if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>"
    "{{ end }}{{ if .Prompt }}<|start_header_id|>user<|end_header_id|>\n\n{{ .Prompt }}"
    "<|eot_id|>{{ end }}<|start_header_id|>assistant<|end_header_id|>\n\n{{ .Response }}<|eot_id|>"
)


def test_parse_file() -> None:
    text = f"""
FROM model1
ADAPTER adapter1
LICENSE MIT
PARAMETER param1 value1
PARAMETER param2 value2
TEMPLATE \"\"\"{LLAMA3_TEMPLATE}\"\"\"    
"""  # noqa: W291 (trailing spaces after the closing quotes are part of the case)
    assert parse_modelfile(text) == [
        C("model", "model1"),
        C("adapter", "adapter1"),
        C("license", "MIT"),
        C("param1", "value1"),
        C("param2", "value2"),
        C("template", LLAMA3_TEMPLATE),
    ]


def test_parse_trims_outside_quotes_only() -> None:
    text = f"""
FROM "     model 1"
ADAPTER      adapter3
LICENSE "MIT       "
PARAMETER param1        value1
PARAMETER param2    value2
TEMPLATE \"\"\"   {LLAMA3_TEMPLATE}   \"\"\"    
"""  # noqa: W291
    assert parse_modelfile(text) == [
        C("model", "     model 1"),
        C("adapter", "adapter3"),
        C("license", "MIT       "),
        C("param1", "value1"),
        C("param2", "value2"),
        C("template", f"   {LLAMA3_TEMPLATE}   "),
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('FROM "FOO  BAR  "', [C("model", "FOO  BAR  ")]),
        ('FROM "FOO BAR"\nPARAMETER param1 value1', [C("model", "FOO BAR"), C("param1", "value1")]),
        ("FROM     FOOO BAR    ", [C("model", "FOOO BAR")]),
        ("FROM /what/is/the path ", [C("model", "/what/is/the path")]),
        ("FROM foo", [C("model", "foo")]),
        ("FROM /path/to/model/fp16.bin", [C("model", "/path/to/model/fp16.bin")]),
        ("FROM llama3:7b-instruct-q4_K_M", [C("model", "llama3:7b-instruct-q4_K_M")]),
        ("from foo", [C("model", "foo")]),  # commands are case-insensitive
        ("PARAMETER param1 value1\nFROM foo", [C("param1", "value1"), C("model", "foo")]),
        (
            "PARAMETER what the \nFROM lemons make lemonade ",
            [C("what", "the"), C("model", "lemons make lemonade")],
        ),
        ("FROM foo\r\nSYSTEM hi\r\n", [C("model", "foo"), C("system", "hi")]),
    ],
)
def test_parse_from(text: str, expected: list[Command]) -> None:
    assert parse_modelfile(text) == expected


@pytest.mark.parametrize("text", ["", "PARAMETER param1 value1", "# only a comment\n"])
def test_missing_from_is_an_error(text: str) -> None:
    with pytest.raises(ModelfileError, match="no FROM line"):
        parse_modelfile(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("\nFROM foo\nPARAMETER param1\n", "PARAMETER param1 needs a value"),
        ("\nFROM foo\nMESSAGE system\n", "MESSAGE system needs a value"),
        ("\nFROM foo\nMESSAGE system", "MESSAGE system needs a value"),
        ("FROM foo\nSYSTEM", "SYSTEM needs a value"),
        ("FROM\n", "FROM needs a value"),
        ("FROM foo\nPARAMETER te-mp 1\n", "parameter name"),
    ],
)
def test_missing_values_are_errors(text: str, message: str) -> None:
    with pytest.raises(ModelfileError, match=message):
        parse_modelfile(text)


def test_bad_command_reports_its_line() -> None:
    with pytest.raises(ModelfileError, match=r"\(line 3\): command must be one of") as err:
        parse_modelfile("\nFROM foo\nBADCOMMAND param1 value1\n")
    assert err.value.line == 3


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_a_value_missing_at_a_lines_end_reports_that_line(newline: str) -> None:
    text = newline.join(["FROM foo", "PARAMETER temperature", ""])
    with pytest.raises(ModelfileError, match=r"\(line 2\): PARAMETER temperature needs a value"):
        parse_modelfile(text)
    with pytest.raises(ModelfileError, match=r"\(line 3\): command must be one of"):
        parse_modelfile(newline.join(["FROM foo", "", "BAD x", ""]))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "\nFROM foo\nMESSAGE system You are a file parser. Always parse things.\n",
            [C("message", "system: You are a file parser. Always parse things.")],
        ),
        (
            "\nFROM foo\nMESSAGE system You are a file parser. Always parse things.",
            [C("message", "system: You are a file parser. Always parse things.")],
        ),
        (
            "\nFROM foo\nMESSAGE system S\nMESSAGE user Hey there!\nMESSAGE assistant Hello!\n",
            [
                C("message", "system: S"),
                C("message", "user: Hey there!"),
                C("message", "assistant: Hello!"),
            ],
        ),
        (
            '\nFROM foo\nMESSAGE system """\nYou are a multiline file parser.\n"""\n\t\t\t',
            [C("message", "system: \nYou are a multiline file parser.\n")],
        ),
    ],
)
def test_parse_messages(text: str, expected: list[Command]) -> None:
    assert parse_modelfile(text) == [C("model", "foo"), *expected]


def test_bad_message_role() -> None:
    with pytest.raises(ModelfileError, match="message role must be one of"):
        parse_modelfile("\nFROM foo\nMESSAGE badguy I'm a bad guy!\n")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('"""\nThis is a\nmultiline system.\n"""\n\t\t\t', "\nThis is a\nmultiline system.\n"),
        ('"""\nThis is a\nmultiline system."""\n\t\t\t', "\nThis is a\nmultiline system."),
        ('"""This is a\nmultiline system."""\n\t\t\t', "This is a\nmultiline system."),
        ('"""This is a multiline system."""\n\t\t\t', "This is a multiline system."),
        (
            '"""\nThis is a multiline system with "quotes".\n"""\n',
            '\nThis is a multiline system with "quotes".\n',
        ),
        ('""""""\n', ""),
        ('""\n', ""),
        ('"\'"\n', "'"),
        ('"""\'\'"\'""\'""\'"\'\'\'\'\'""\'""\'"""\n', "''\"'\"\"'\"\"'\"'''''\"\"'\"\"'"),
    ],
)
def test_parse_quoted(value: str, expected: str) -> None:
    assert parse_modelfile(f"\nFROM foo\nSYSTEM {value}") == [
        C("model", "foo"),
        C("system", expected),
    ]


@pytest.mark.parametrize(
    "value", ['"""This is a multiline system.""\n\t\t\t', '"\n\t\t\t', '"""abc""" trailing\n']
)
def test_unterminated_quotes_are_errors(value: str) -> None:
    with pytest.raises(ModelfileError, match="unexpected end"):
        parse_modelfile(f"\nFROM foo\nSYSTEM {value}")


def test_template_at_end_of_file() -> None:
    assert parse_modelfile('\nFROM foo\nTEMPLATE """\n{{ .Prompt }}\n"""') == [
        C("model", "foo"),
        C("template", "\n{{ .Prompt }}\n"),
    ]


@pytest.mark.parametrize(
    ("line", "name", "value"),
    [
        ("numa true", "numa", "true"),
        ("num_ctx 1", "num_ctx", "1"),
        ("top_p 1.0", "top_p", "1.0"),
        ("min_p 0.05", "min_p", "0.05"),
        ("stop ### User:", "stop", "### User:"),
        ("stop ### User: ", "stop", "### User:"),
        ('stop "### User:"', "stop", "### User:"),
        ('stop "### User: "', "stop", "### User: "),
        ('stop """### User:"""', "stop", "### User:"),
        ('stop """### User:\n"""', "stop", "### User:\n"),
        ("stop <|endoftext|>", "stop", "<|endoftext|>"),
        ("stop </s>", "stop", "</s>"),
    ],
)
def test_parse_parameters(line: str, name: str, value: str) -> None:
    assert parse_modelfile(f"FROM foo\nPARAMETER {line}\n") == [
        C("model", "foo"),
        C(name, value),
    ]


def test_comments_and_indentation() -> None:
    assert parse_modelfile("\n# comment\nFROM foo\n\t# indented\n  SYSTEM a # not a comment\n") == [
        C("model", "foo"),
        C("system", "a # not a comment"),
    ]


ROUND_TRIPS = [
    "\nFROM foo\nADAPTER adapter1\nLICENSE MIT\nPARAMETER param1 value1\nTEMPLATE template1\n"
    "MESSAGE system You are a file parser.\nMESSAGE user Hey there!\n",
    '\nFROM foo\nLICENSE """\nVery long legal text.\n"Oh look, a quote!"\n"""\n\n'
    'MESSAGE system """\nYou are a store greeter. Always respond with "Hello!".\n"""\n',
    '\nFROM foo\nSYSTEM ""\n',
    '\nFROM foo\nSYSTEM """"quoted" start"""\nSYSTEM " padded "\n',
]


@pytest.mark.parametrize("text", ROUND_TRIPS)
def test_commands_survive_a_round_trip(text: str) -> None:
    commands = parse_modelfile(text)
    assert parse_modelfile("".join(f"{c}\n" for c in commands)) == commands


@pytest.mark.parametrize("value", ["", " lead", "trail ", "two\nlines", '"q"', 'a "b"\nc', "plain"])
def test_quote_round_trips_any_value(value: str) -> None:
    assert parse_modelfile(f"FROM x\nSYSTEM {quote(value)}\n")[1] == C("system", value)


@pytest.mark.parametrize("codec", ["utf-16-le", "utf-16-be"])
def test_utf16_with_bom(codec: str) -> None:
    text = "FROM bob\nPARAMETER param1 1\nSYSTEM You are a utf16 file.\n你好👋\n"
    bom = codecs.BOM_UTF16_LE if codec.endswith("le") else codecs.BOM_UTF16_BE
    data = bom + text.replace("\n你好👋\n", " 你好👋\n").encode(codec)
    assert parse_modelfile(data) == [
        C("model", "bob"),
        C("param1", "1"),
        C("system", "You are a utf16 file. 你好👋"),
    ]


def test_utf8_bom_and_multibyte() -> None:
    data = codecs.BOM_UTF8 + "FROM test\n\tSYSTEM 你好👋".encode()
    assert parse_modelfile(data) == [C("model", "test"), C("system", "你好👋")]


# ---------------------------------------------------------------- typed parameters


@pytest.mark.parametrize(
    ("name", "text", "value"),
    [
        ("temperature", "0.5", 0.5),
        ("top_k", "1", 1),
        ("num_ctx", "-1", -1),
        ("use_mmap", "true", True),
        ("use_mmap", "F", False),
        ("stop", "<|im_end|>", "<|im_end|>"),
        ("num_gpu", "+3", 3),
    ],
)
def test_parameter_values_are_typed_by_option(name: str, text: str, value: object) -> None:
    assert typed_parameter(name, text) == value
    assert type(typed_parameter(name, text)) is type(value)


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("top_k", "1.5", "invalid int value"),
        ("top_k", "1_000", "invalid int value"),
        ("temperature", "warm", "invalid float value"),
        ("use_mmap", "yes", "invalid bool value"),
        ("param1", "value1", "unknown parameter 'param1'"),
    ],
)
def test_bad_parameter_values(name: str, text: str, message: str) -> None:
    with pytest.raises(ModelfileError, match=message):
        typed_parameter(name, text)


def test_stop_repeats_and_deprecated_parameters_drop() -> None:
    commands = parse_modelfile(
        "FROM x\nPARAMETER stop a\nPARAMETER temperature 0.2\nPARAMETER stop b\n"
        "PARAMETER penalize_newline true\n"
    )
    assert collect_parameters(commands) == {"stop": ["a", "b"], "temperature": 0.2}


def test_create_request_from_modelfile() -> None:
    commands = parse_modelfile(
        "FROM test\nPARAMETER temperature 0.5\nPARAMETER top_k 1\nSYSTEM You are a bot.\n"
        "LICENSE license1\nLICENSE license2\nMESSAGE user Hello there!\n"
        "MESSAGE assistant Hi! How are you?\n"
    )
    request = CreateRequest.from_modelfile(commands)
    assert request.from_ == "test"
    assert request.system == "You are a bot."
    assert request.license == ["license1", "license2"]
    assert request.parameters == {"temperature": 0.5, "top_k": 1}
    assert request.messages == [
        {"role": "user", "content": "Hello there!"},
        {"role": "assistant", "content": "Hi! How are you?"},
    ]


def test_adapter_is_not_supported() -> None:
    with pytest.raises(ModelfileError, match="ADAPTER is not supported"):
        CreateRequest.from_modelfile(parse_modelfile("FROM x\nADAPTER ./lora.gguf\n"))


def test_format_parameters_as_ollama_show() -> None:
    text = format_parameters({"stop": ["<|im_end|>", "x"], "temperature": 0.7, "num_ctx": 4096})
    assert text.splitlines() == [
        f"{'num_ctx':<30} 4096",
        f'{"stop":<30} "<|im_end|>"',
        f'{"stop":<30} "x"',
        f"{'temperature':<30} 0.7",
    ]
    # Go's %#v keeps printable Unicode as it is
    assert format_parameters({"stop": ["ünï", "日本"]}).splitlines() == [
        f'{"stop":<30} "ünï"',
        f'{"stop":<30} "日本"',
    ]
