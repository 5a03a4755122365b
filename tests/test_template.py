"""GGUF chat templates render as HF's apply_chat_template renders them (the oracle: transformers'
render_jinja_template on the same template and messages): its block trimming, its tojson and
its strftime_now."""

from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from ember.gguf import GGUFFile
from ember.template import TemplateError, render_chat

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather of a city; below 10 <C> say 'cold' & wet",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "the city"}},
                "required": ["city"],
            },
        },
    }
]
CHATS = [
    [{"role": "user", "content": "Hi <there> & 'you'"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ],
    [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "<P>"}}}],
        },
        {"role": "tool", "content": "12 C & sunny"},
    ],
]

# Written as templates often are: block tags on lines of their own, indented, no dashes. HF
# renders it with trim_blocks and lstrip_blocks, so its tags leave no newlines or indentation.
INDENTED = """{% for m in messages %}
    {% if m['role'] == 'system' %}
<|system|>{{ m['content'] }}
    {% else %}
<|{{ m['role'] }}|>{{ m['content'] }}
        {% if m.tool_calls %}
            {% for call in m.tool_calls %}
<call>{{ call.function | tojson }}</call>
            {% endfor %}
        {% endif %}
    {% endif %}
{% endfor %}
{% if tools %}
<tools>{{ tools | tojson(indent=2) }}</tools>
{% endif %}
{% if add_generation_prompt %}
<|assistant|>
{% endif %}"""


def hf_render(source: str, messages: list[dict[str, Any]], **context: Any) -> str:
    tools = context.pop("tools", None)
    out, _ = render_jinja_template(
        conversations=[messages],
        tools=tools,
        chat_template=source,
        add_generation_prompt=True,
        **context,
    )
    return str(out[0])


def both(source: str, messages: list[dict[str, Any]], **context: Any) -> tuple[str, str]:
    ember = render_chat(source, [dict(m) for m in messages], **context)
    return ember, hf_render(source, messages, **context)


@pytest.mark.parametrize("chat", CHATS)
@pytest.mark.parametrize("tools", [None, TOOLS])
def test_block_tags_trimmed_as_hf_does(chat: list[dict[str, Any]], tools: Any) -> None:
    ember, hf = both(INDENTED, chat, **({"tools": tools} if tools else {}))
    assert ember == hf
    assert "\n    " not in ember.split("<tools>")[0]  # no indentation left by the tags


def test_tojson_is_plain_json_as_hf_writes_it() -> None:
    source = "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=1, sort_keys=true) }}"
    message = {"role": "user", "content": "a < b && c > 'd' é", "n": 1.5, "k": None}
    ember, hf = both(source, [message])
    assert ember == hf
    assert "a < b && c > 'd' é" in ember  # not \u003c, \u0026, \u0027 or \u00e9


def test_strftime_now_is_the_local_date() -> None:
    day = datetime.now().strftime("%Y-%m-%d")
    assert render_chat('{{ strftime_now("%Y-%m-%d") }}', []) in (
        day,
        datetime.now().strftime("%Y-%m-%d"),  # midnight between the two calls
    )


def test_a_template_error_is_still_one_line() -> None:
    with pytest.raises(TemplateError, match="chat template failed"):
        render_chat("{{ messages[0] | tojson(nonsense=1) }}", [{"role": "user"}])


@pytest.mark.model
@pytest.mark.parametrize("model", ["smollm2_path", "qwen2_path"])
@pytest.mark.parametrize("chat", CHATS)
def test_bundled_templates_render_as_hf(
    model: str, chat: list[dict[str, Any]], request: pytest.FixtureRequest
) -> None:
    path: Path = request.getfixturevalue(model)
    with GGUFFile.open(path) as f:
        source = f.get("tokenizer.chat_template")
    for tools in (None, TOOLS):
        ember, hf = both(source, chat, **({"tools": tools} if tools else {}))
        assert ember == hf
