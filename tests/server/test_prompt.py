"""Prompts: chat templates with tools and images, history truncation, /api/generate's rules."""

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.gguf import GGUFFile
from ember.server.prompt import (
    ChatTemplate,
    Completion,
    FillInMiddle,
    Message,
    PromptError,
    chat_prompt,
    fill_in_middle,
    generate_prompt,
)

# Each turn on its own line as "role: content", so lengths are easy to reason about.
LINES = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def chars(text: str) -> int:
    return len(text)


@pytest.fixture(scope="module")
def qwen(qwen2_path: Path) -> ChatTemplate:
    metadata = GGUFFile.open(qwen2_path).metadata
    return ChatTemplate(
        metadata["tokenizer.chat_template"], fim=fill_in_middle(metadata["tokenizer.ggml.tokens"])
    )


@pytest.fixture(scope="module")
def smollm2(smollm2_path: Path) -> ChatTemplate:
    metadata = GGUFFile.open(smollm2_path).metadata
    return ChatTemplate(
        metadata["tokenizer.chat_template"], fim=fill_in_middle(metadata["tokenizer.ggml.tokens"])
    )


@pytest.mark.model
def test_qwen_chat_with_tools_and_a_tool_round_trip(qwen: ChatTemplate) -> None:
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    messages = [
        Message("user", "Weather in Paris?"),
        Message("assistant", "", tool_calls=(call,)),
        Message("tool", "18 degrees", tool_name="get_weather"),
    ]
    text = chat_prompt(qwen, messages, tools=[TOOL]).text
    assert "# Tools" in text
    assert '"name": "get_weather", "description": "The weather in a city"' in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": '
        '"Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n18 degrees\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    ) in text


@pytest.mark.model
def test_qwen_without_tools_has_its_default_system(qwen: ChatTemplate) -> None:
    text = chat_prompt(qwen, [Message("user", "Hi")]).text
    assert text == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.model
def test_model_system_replaces_the_templates_default(smollm2: ChatTemplate) -> None:
    template = ChatTemplate(smollm2.source, system="Be brief.")
    text = chat_prompt(template, [Message("user", "Hi")]).text
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # a system message of the request wins over the model's
    text = chat_prompt(template, [Message("system", "Be long."), Message("user", "Hi")]).text
    assert "Be long." in text and "Be brief." not in text


@pytest.mark.model
def test_fill_in_middle_tokens_come_from_the_vocabulary(
    qwen: ChatTemplate, smollm2: ChatTemplate
) -> None:
    assert qwen.fim == FillInMiddle("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
    assert smollm2.fim is None
    prompt = generate_prompt(qwen, Completion("def add(a, b):\n", suffix="\nprint(add(1, 2))"))
    assert prompt.text == (
        "<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\nprint(add(1, 2))<|fim_middle|>"
    )


def test_model_messages_come_first_then_the_chat() -> None:
    template = ChatTemplate(LINES, system="S", messages=(Message("user", "m1"),))
    text = chat_prompt(template, [Message("user", "hi")]).text
    assert text == "system: S\nuser: m1\nuser: hi\n"


def test_images_become_tags_numbered_in_order() -> None:
    messages = [
        Message("user", "two pictures", images=(b"a", b"b")),
        Message("assistant", "ok"),
        Message("user", "compare [img] with this", images=(b"c",)),
    ]
    prompt = chat_prompt(ChatTemplate(LINES), messages)
    assert prompt.text == (
        "user: [img-0][img-1]two pictures\nassistant: ok\nuser: compare [img-2] with this\n"
    )
    assert prompt.images == (b"a", b"b", b"c")


def test_thinking_and_tool_names_reach_the_template() -> None:
    template = ChatTemplate(
        "{% for m in messages %}{{ m.role }}|{{ m.reasoning_content }}|{{ m.thinking }}|"
        "{{ m.name }}|{{ m.tool_name }};{% endfor %}{{ enable_thinking }}/{{ reasoning_effort }}"
    )
    messages = [Message("assistant", "a", thinking="hmm"), Message("tool", "r", tool_name="f")]
    text = chat_prompt(template, messages, think="high").text
    assert text == "assistant|hmm|hmm||;tool|||f|f;True/high"
    assert chat_prompt(template, messages, think=False).text.endswith("False/")
    assert chat_prompt(template, messages).text.endswith(";/")  # not set: not defined


def test_final_assistant_message_is_continued() -> None:
    chatml = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    messages = [Message("user", "Count to 3"), Message("assistant", "1, 2,")]
    text = chat_prompt(ChatTemplate(chatml), messages).text
    assert text == "<|im_start|>user\nCount to 3<|im_end|>\n<|im_start|>assistant\n1, 2,"


def test_bos_and_eos_texts_are_template_variables() -> None:
    template = ChatTemplate(
        "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}", "<s>", "</s>"
    )
    assert chat_prompt(template, [Message("user", "x")]).text == "<s>x</s>"


# --- truncation ---


def test_whole_chat_kept_when_it_fits() -> None:
    messages = [Message("user", "aaaa"), Message("assistant", "bbbb"), Message("user", "cccc")]
    prompt = chat_prompt(ChatTemplate(LINES), messages, count=chars, num_ctx=1000)
    assert prompt.text == "user: aaaa\nassistant: bbbb\nuser: cccc\n"
    assert prompt.truncated is False


def test_oldest_messages_dropped_keeping_system_and_last() -> None:
    messages = [
        Message("system", "sys"),
        Message("user", "u1" * 10),
        Message("assistant", "a1" * 10),
        Message("user", "u2"),
        Message("assistant", "a2"),
        Message("user", "last"),
    ]
    prompt = chat_prompt(ChatTemplate(LINES), messages, count=chars, num_ctx=60)
    assert prompt.text == "system: sys\nuser: u2\nassistant: a2\nuser: last\n"
    assert prompt.truncated is True


def test_last_message_kept_even_when_it_alone_is_too_long() -> None:
    messages = [Message("system", "sys"), Message("user", "old"), Message("user", "x" * 100)]
    prompt = chat_prompt(ChatTemplate(LINES), messages, count=chars, num_ctx=10)
    assert prompt.text == "system: sys\nuser: " + "x" * 100 + "\n"
    assert prompt.truncated is True


def test_system_messages_in_the_middle_are_kept() -> None:
    messages = [
        Message("user", "old" * 10),
        Message("system", "mid"),
        Message("user", "older" * 10),
        Message("user", "new"),
    ]
    prompt = chat_prompt(ChatTemplate(LINES), messages, count=chars, num_ctx=30)
    assert prompt.text == "system: mid\nuser: new\n"


def test_images_count_toward_the_context_and_are_numbered_after_truncation() -> None:
    template = ChatTemplate(LINES, image_tokens=50)
    messages = [
        Message("user", "a", images=(b"old",)),
        Message("assistant", "b"),
        Message("user", "c", images=(b"new",)),
    ]
    fits_all = chat_prompt(template, messages, count=chars, num_ctx=200)
    assert fits_all.images == (b"old", b"new") and not fits_all.truncated
    prompt = chat_prompt(template, messages, count=chars, num_ctx=90)
    assert prompt.text == "assistant: b\nuser: [img-0]c\n"
    assert prompt.images == (b"new",)
    assert prompt.truncated is True


def test_no_truncation_without_num_ctx() -> None:
    messages = [Message("user", "x" * 100), Message("user", "y")]
    prompt = chat_prompt(ChatTemplate(LINES), messages, count=chars)
    assert prompt.truncated is False and "x" * 100 in prompt.text


def drop_one_at_a_time(messages: list[Message], num_ctx: int) -> str:
    """The rule as stated: drop the oldest non-system message until the prompt fits."""
    kept = list(messages)
    while True:
        text = ChatTemplate(LINES).render(kept)[0]
        droppable = [i for i, m in enumerate(kept[:-1]) if m.role != "system"]
        if len(text) <= num_ctx or not droppable:
            return text
        del kept[droppable[0]]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["system", "user", "assistant"]), st.integers(0, 30)),
        min_size=1,
        max_size=12,
    ),
    st.integers(10, 300),
)
def test_truncation_matches_dropping_one_message_at_a_time(
    shape: list[tuple[str, int]], num_ctx: int
) -> None:
    messages = [Message(role, str(i % 10) * n) for i, (role, n) in enumerate(shape)]
    prompt = chat_prompt(ChatTemplate(LINES), messages, count=chars, num_ctx=num_ctx)
    assert prompt.text == drop_one_at_a_time(messages, num_ctx)


# --- /api/generate ---


def test_generate_wraps_the_prompt_as_a_user_turn() -> None:
    template = ChatTemplate(LINES, system="model system", messages=(Message("user", "m"),))
    assert generate_prompt(template, Completion("hi")).text == (
        "system: model system\nuser: m\nuser: hi\n"
    )
    text = generate_prompt(template, Completion("hi", system="own")).text
    assert text == "system: own\nuser: m\nuser: hi\n"


def test_generate_with_context_continues_it_without_model_messages() -> None:
    template = ChatTemplate(LINES, messages=(Message("user", "m"),))
    text = generate_prompt(template, Completion("next", context="user: before\n")).text
    assert text == "user: before\nuser: next\n"


def test_generate_images_are_tagged_before_the_prompt() -> None:
    prompt = generate_prompt(ChatTemplate(LINES), Completion("what?", images=(b"1", b"2")))
    assert prompt.text == "user: [img-0][img-1]what?\n"
    assert prompt.images == (b"1", b"2")


def test_raw_prompt_is_sent_as_it_is() -> None:
    template = ChatTemplate(LINES, system="ignored in raw mode")
    prompt = generate_prompt(template, Completion("<|im_start|>raw", raw=True, images=(b"i",)))
    assert prompt.text == "<|im_start|>raw"
    assert prompt.images == (b"i",)


@pytest.mark.parametrize(
    "request_", [Completion("x", raw=True, system="s"), Completion("x", raw=True, context="c")]
)
def test_raw_with_system_or_context_is_refused(request_: Completion) -> None:
    with pytest.raises(PromptError, match="raw mode does not support"):
        generate_prompt(ChatTemplate(LINES), request_)


def test_suffix_needs_fill_in_middle_tokens() -> None:
    with pytest.raises(PromptError, match="insert"):
        generate_prompt(ChatTemplate(LINES), Completion("a", suffix="b"))


def test_no_template_sends_the_prompt_as_it_is() -> None:
    assert generate_prompt(ChatTemplate(None), Completion("hello")).text == "hello"
    text = chat_prompt(ChatTemplate(None), [Message("system", "s"), Message("user", "u")]).text
    assert text == "s\n\nu"


def test_fim_styles() -> None:
    assert fill_in_middle(["<fim_prefix>", "<fim_suffix>", "<fim_middle>", "a"]) == FillInMiddle(
        "<fim_prefix>", "<fim_suffix>", "<fim_middle>"
    )
    assert fill_in_middle(["<|fim_prefix|>", "<|fim_suffix|>"]) is None


# --- Go templates (Ollama's Modelfile TEMPLATEs) ---

GO_LINES = "{{ range .Messages }}{{ .Role }}: {{ .Content }}\n{{ end }}"
GO_TURN = "{{ if .System }}[{{ .System }}] {{ end }}Q: {{ .Prompt }}\nA: {{ .Response }}\n"


def test_a_go_template_builds_chats_with_the_models_system_and_messages() -> None:
    template = ChatTemplate(GO_LINES, system="S", messages=(Message("user", "m1"),))
    text = chat_prompt(template, [Message("assistant", "a1"), Message("user", "hi")]).text
    assert text == "system: S\nuser: m1\nassistant: a1\nuser: hi\n"
    # as Ollama's: a run of one role is one message
    text = chat_prompt(template, [Message("user", "hi")]).text
    assert text == "system: S\nuser: m1\n\nhi\n"
    # a template without .Messages: a turn at a time, the last left open for the answer
    template = ChatTemplate(GO_TURN, system="S")
    messages = [Message("user", "a"), Message("assistant", "b"), Message("user", "c")]
    assert chat_prompt(template, messages).text == "[S] Q: a\nA: b\nQ: c\nA: "
    # a final assistant message is continued, as the template's turns leave it open
    messages = [Message("user", "a"), Message("assistant", "1, 2,")]
    assert chat_prompt(template, messages).text == "[S] Q: a\nA: 1, 2,"


def test_a_go_template_drops_the_oldest_messages_to_fit() -> None:
    template = ChatTemplate(GO_LINES)
    messages = [Message("system", "s")]
    messages += [Message("user" if i % 2 else "assistant", f"m{i}") for i in range(6)]
    prompt = chat_prompt(template, messages, count=chars, num_ctx=40)
    assert prompt.text == "system: s\nassistant: m4\nuser: m5\n" and prompt.truncated


def test_generate_through_a_go_template() -> None:
    template = ChatTemplate(GO_TURN, system="model system")
    assert generate_prompt(template, Completion("hi")).text == "[model system] Q: hi\nA: "
    assert generate_prompt(template, Completion("hi", system="own")).text == "[own] Q: hi\nA: "


def test_a_go_template_that_reads_suffix_fills_the_gap_itself() -> None:
    # as Ollama's codellama template: its own tokens, whatever the vocabulary's
    template = ChatTemplate(
        "{{ if .Suffix }}<PRE> {{ .Prompt }} <SUF>{{ .Suffix }} <MID>"
        "{{ else }}{{ .Prompt }}{{ end }}"
    )
    text = generate_prompt(template, Completion("def f():", suffix="return 1")).text
    assert text == "<PRE> def f(): <SUF>return 1 <MID>"
    assert generate_prompt(template, Completion("def f():")).text == "def f():"


def test_tools_are_none_without_any_as_hf_passes_them() -> None:
    # Llama 3.1's and Hermes' templates test `tools is not none`: an undefined tools is not none
    template = ChatTemplate("{% if tools is not none %}[{{ tools | length }} tools]{% endif %}x")
    assert chat_prompt(template, [Message("user", "q")]).text == "x"
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert chat_prompt(template, [Message("user", "q")], tools=tools).text == "[1 tools]x"
