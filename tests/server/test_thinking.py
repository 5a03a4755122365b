"""Thinking: tags read from templates, and the stream parser split at every piece boundary."""

import pytest

from ember.gguf import GGUFFile
from ember.server.thinking import (
    THINK,
    ThinkingParser,
    ThinkingTags,
    can_think,
    infer_tags,
    no_thinking_message,
)

# The parts of Qwen3's template that concern thinking (reasoning_content after the last query,
# enable_thinking=false closing an empty think block in the generation prompt).
QWEN3 = """{%- set ns = namespace(last_query_index=messages|length - 1) %}
{%- for m in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}
{%- if m.role == "user" and ns.last_query_index == messages|length - 1 %}
{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}
{%- for m in messages %}
{%- if m.role == "assistant" %}
{%- if loop.index0 > ns.last_query_index and m.reasoning_content %}
{{- '<|im_start|>assistant\\n<think>\\n' + m.reasoning_content.strip('\\n') + '\\n</think>\\n\\n'
 + m.content + '<|im_end|>\\n' }}
{%- else %}{{- '<|im_start|>assistant\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}
{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"""

# DeepSeek-R1 renders no thinking; it only cuts it out of past answers (and opens it).
DEEPSEEK_R1 = """{% for m in messages %}{% if m['role'] == 'user' %}<｜User｜>{{ m['content'] }}
{% elif m['role'] == 'assistant' %}{% set content = m['content'] %}
{% if '</think>' in content %}{% set content = content.split('</think>')[-1] %}{% endif %}
<｜Assistant｜>{{ content }}<｜end▁of▁sentence｜>{% endif %}{% endfor %}
{% if add_generation_prompt %}<｜Assistant｜><think>\n{% endif %}"""

OWN_TAGS = (
    "{% for m in messages %}{% if m.thinking %}<|begin_of_thought|>{{ m.thinking }}"
    "<|end_of_thought|>{% endif %}{{ m.content }}{% endfor %}"
)


@pytest.mark.parametrize(
    ("template", "tags"),
    [
        (QWEN3, THINK),
        (DEEPSEEK_R1, THINK),
        (OWN_TAGS, ThinkingTags("<|begin_of_thought|>", "<|end_of_thought|>")),
        ("{% for m in messages %}{{ m.content }}{% endfor %}", None),
        (  # a Go template, as Ollama's Modelfiles write them
            "{{ range .Messages }}{{ if .Thinking }}<think>{{ .Thinking }}</think>{{ end }}"
            "{{ .Content }}{{ end }}",
            THINK,
        ),
        ("{{ range .Messages }}{{ .Content }}{{ end }}", None),
        ("{{ raise_exception('no') }}", None),
        (None, None),
    ],
)
def test_tags_inferred_from_templates(template: str | None, tags: ThinkingTags | None) -> None:
    assert infer_tags(template) == tags
    assert can_think(template) is (tags is not None)


@pytest.mark.model
@pytest.mark.parametrize("fixture", ["smollm2_path", "qwen2_path"])
def test_our_models_cannot_think(fixture: str, request: pytest.FixtureRequest) -> None:
    metadata = GGUFFile.open(request.getfixturevalue(fixture)).metadata
    assert can_think(metadata["tokenizer.chat_template"]) is False


def test_message_for_a_model_without_thinking() -> None:
    assert no_thinking_message("smollm2:135m") == '"smollm2:135m" does not support thinking'


def run(parser: ThinkingParser, pieces: list[str]) -> tuple[str, str]:
    thinking, content = "", ""
    for piece in pieces:
        t, c = parser.add(piece)
        thinking, content = thinking + t, content + c
    t, c = parser.flush()
    return thinking + t, content + c


def splits(text: str) -> list[list[str]]:
    """text whole, one character at a time, and cut in two at every position."""
    return [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]


CASES = [
    # (output, thinking, content)
    ("<think>I should greet.</think>Hello!", "I should greet.", "Hello!"),
    # the space before the closing tag stays thinking, as Ollama's parser keeps it
    ("  <think>\n  a plan \n</think>\n\n  Answer", "a plan \n", "Answer"),
    ("Hello, no thinking here.", "", "Hello, no thinking here."),
    ("Hello <think>not at the start</think>", "", "Hello <think>not at the start</think>"),
    ("<think>unfinished thought", "unfinished thought", ""),
    ("<think></think>just content", "", "just content"),
    ("<thin", "", "<thin"),
    ("<think>a < b and </thinker> too</think>ok", "a < b and </thinker> too", "ok"),
    ("", "", ""),
]


@pytest.mark.parametrize(("output", "thinking", "content"), CASES)
def test_split_is_the_same_however_the_output_is_cut(
    output: str, thinking: str, content: str
) -> None:
    for pieces in splits(output):
        assert run(ThinkingParser(), pieces) == (thinking, content), pieces


def test_a_possible_closing_tag_is_held_back() -> None:
    parser = ThinkingParser()
    assert parser.add("<think>step one ") == ("step one ", "")
    assert parser.add(" </th") == (" ", "")
    assert parser.add("ink> done") == ("", "done")


def test_content_streams_as_it_comes_after_thinking() -> None:
    parser = ThinkingParser()
    parser.add("<think>x</think>")
    assert parser.add("a") == ("", "a")
    assert parser.add(" b") == ("", " b")


def test_prompt_that_opens_thinking_starts_the_parser_inside_it() -> None:
    parser = ThinkingParser(prompt="<｜Assistant｜><think>\n")
    assert run(parser, ["The user ", "asks.</think>", "\n\nAnswer."]) == (
        "The user asks.",
        "Answer.",
    )


def test_prompt_with_a_closed_think_block_starts_outside() -> None:
    parser = ThinkingParser(prompt="<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert run(parser, ["Plain answer."]) == ("", "Plain answer.")


def test_own_tags() -> None:
    tags = ThinkingTags("<|begin_of_thought|>", "<|end_of_thought|>")
    output = "<|begin_of_thought|>hmm<|end_of_thought|>yes"
    for pieces in splits(output):
        assert run(ThinkingParser(tags), pieces) == ("hmm", "yes")


@pytest.mark.parametrize(("opening", "closing"), [("[THINK]", "[/THINK]"), ("◁think▷", "◁/think▷")])
def test_tags_not_in_angle_brackets_are_inferred(opening: str, closing: str) -> None:
    """Magistral's and Kimi's, as Ollama's InferTags reads whatever surrounds .Thinking."""
    template = (
        '{{- range .Messages }}{{ if eq .Role "user" }}[INST]{{ .Content }}[/INST]{{ else }}'
        f"{{{{ if .Thinking }}}}{opening}{{{{ .Thinking }}}}{closing}{{{{ end }}}}"
        "{{ .Content }}</s>{{ end }}{{ end }}"
    )
    tags = infer_tags(template)
    assert tags == ThinkingTags(opening, closing)
    parser = ThinkingParser(tags)
    assert parser.add(f"{opening}a plan{closing}Answer") == ("a plan", "Answer")


def test_a_go_template_naming_a_closing_tag_in_its_text_cannot_think() -> None:
    """Only what surrounds .Thinking makes tags in a Go template (Ollama's InferTags)."""
    prose = '{{ range .Messages }}{{ if eq .Role "user" }}Reason in <think></think>. '
    prose += "{{ .Content }}{{ end }}{{ end }}"
    assert not can_think(prose)
