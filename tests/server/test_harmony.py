"""gpt-oss's Harmony format: its output read into thinking, content and tool calls (pieces split
anywhere), tool names renamed for the template and back, think as the reasoning effort, and the
routes with the real `ollama` and `openai` clients over a scripted runner."""

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from server_fakes import MODELS, FakeModels, FakeStarter, served
from test_tool_grammar import accepts_tokens, control_ids

from ember.server.api import Tool
from ember.server.app import create_app
from ember.server.harmony import (
    FINAL,
    HarmonyNames,
    HarmonyParser,
    answering,
    call_grammar,
    prefill,
    uses_harmony,
)
from ember.server.output import Part
from ember.server.prompt import Prompt
from ember.server.scheduler import Defaults, Scheduler
from ember.server.state import ServerState

# A Harmony template of our own, shaped as gpt-oss's: system with the reasoning effort, tools as
# a developer message, earlier calls and results, the assistant's message opened last
HARMONY = (
    "<|start|>system<|message|>Reasoning: {{ reasoning_effort | default('medium') }}<|end|>"
    "{% if tools %}<|start|>developer<|message|>{% for t in tools %}"
    "type {{ t.function.name }}\n{% endfor %}<|end|>{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'assistant' and m.tool_calls %}<|start|>assistant to=functions."
    "{{ m.tool_calls[0].function.name }}<|channel|>commentary json<|message|>"
    "{{ m.tool_calls[0].function.arguments | tojson }}<|call|>"
    "{% elif m.role == 'assistant' %}<|start|>assistant<|channel|>final<|message|>"
    "{{ m.content }}<|end|>"
    "{% elif m.role == 'tool' %}<|start|>functions.f to=assistant<|channel|>commentary"
    "<|message|>{{ m.content }}<|end|>"
    "{% else %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant{% endif %}"
)
THOUGHT = "<|channel|>analysis<|message|>The user greets. Answer kindly.<|end|>"
ANSWER = "<|start|>assistant<|channel|>final<|message|>Hello there, friend!"
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris", "unit": "celsius"}'
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get-weather",  # not an identifier: the template sees get_weather
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def parse(text: str, step: int, **kwargs: Any) -> Part:
    parser = HarmonyParser(**kwargs)
    whole = Part()
    for part in [parser.add(text[i : i + step]) for i in range(0, len(text), step)]:
        whole.content += part.content
        whole.thinking += part.thinking
        whole.tool_calls += part.tool_calls
    last = parser.flush()
    whole.content += last.content
    whole.tool_calls += last.tool_calls
    return whole


@pytest.mark.parametrize("step", [1, 2, 3, 5, 7, 1000])
def test_analysis_is_thinking_and_final_is_content(step: int) -> None:
    part = parse(THOUGHT + ANSWER, step)
    assert part.thinking == "The user greets. Answer kindly."
    assert part.content == "Hello there, friend!"
    assert part.tool_calls == []


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_a_message_to_a_function_is_a_call(step: int) -> None:
    names = HarmonyNames(["get-weather"])
    part = parse(THOUGHT + CALL, step, names=names)
    assert part.thinking == "The user greets. Answer kindly."
    assert part.content == ""
    [call] = part.tool_calls
    assert call["id"].startswith("call_")
    assert call["function"] == {
        "name": "get-weather",
        "arguments": {"city": "Paris", "unit": "celsius"},
    }


@pytest.mark.parametrize(
    "header",
    [
        "assistant to=functions.get_weather<|channel|>commentary json",  # recipient first
        "assistant<|channel|>commentary to=functions.get_weather<|constrain|>json",
        "assistant<|channel|>analysis to=functions.get_weather",
    ],
)
def test_call_headers_in_each_order(header: str) -> None:
    part = parse(f'<|end|><|start|>{header}<|message|>{{"city": "Oslo"}}', 3)
    assert [c["function"] for c in part.tool_calls] == [
        {"name": "get_weather", "arguments": {"city": "Oslo"}}
    ]


def test_a_partial_end_tag_is_held_then_given_back() -> None:
    parser = HarmonyParser(prefill=FINAL)
    assert parser.add("a <|en").content == "a "
    assert parser.add("dless").content == "<|endless"
    assert parser.add("<|end|>tail").content == ""  # outside a message: dropped
    assert not parser.flush()


def test_arguments_that_are_not_json_stay_text() -> None:
    part = parse("<|end|><|start|>assistant to=functions.f<|channel|>commentary<|message|>{oops", 4)
    assert part.tool_calls == []
    assert part.content == "{oops"


def test_think_false_drops_the_analysis() -> None:
    part = parse(THOUGHT + ANSWER, 3, thinking=False)
    assert part.thinking == ""
    assert part.content == "Hello there, friend!"


def test_a_continued_final_answer_is_content() -> None:
    prompt = "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>Hel"
    assert prefill(prompt) == FINAL
    assert parse("lo!", 1, prefill=prefill(prompt)).content == "lo!"


def test_prefill_and_answering() -> None:
    assert prefill("<|start|>user<|message|>Hi<|end|><|start|>assistant") == "<|start|>assistant"
    assert prefill("<|start|>user<|message|>Hi<|end|>") == ""
    assert prefill("no tags") == ""
    opened = answering(Prompt("<|start|>user<|message|>Hi<|end|><|start|>assistant"))
    assert opened.text.endswith(FINAL)
    assert answering(opened) == opened


def test_names_become_unique_identifiers() -> None:
    names = HarmonyNames(["get-weather", "get_weather", "9 lives", "%%", "browser.search"])
    assert [names.harmony(n) for n in ("get-weather", "get_weather", "9 lives", "%%")] == [
        "get_weather",
        "get_weather_2",
        "_9_lives",
        "unnamed",
    ]
    assert names.harmony("browser.search") == "browser.search"  # a built-in keeps its name
    assert names.user("get_weather_2") == "get_weather"
    assert names.user("unknown") == "unknown"


def test_only_gpt_oss_with_harmony_tags() -> None:
    assert uses_harmony("gptoss", HARMONY)
    assert not uses_harmony("llama", HARMONY)
    assert not uses_harmony("gptoss", "{{ messages }}")
    assert not uses_harmony("gptoss", None)


OSS = served(
    "oss",
    template=HARMONY,
    capabilities=frozenset({"completion", "tools", "thinking"}),
    harmony=True,
    details={"format": "gguf", "family": "gptoss"},
)


def app_client(reply: str) -> tuple[TestClient, FakeStarter]:
    starter = FakeStarter(reply=reply)
    scheduler = Scheduler(start=starter, defaults=Defaults(), num_parallel=2)
    state = ServerState(FakeModels({**MODELS, "oss": OSS}), scheduler)  # type: ignore[arg-type]
    return TestClient(create_app(state)), starter


def through(client: TestClient) -> httpx.MockTransport:
    """A transport for a real client's httpx.Client that answers from the app (buffered)."""

    def handle(request: httpx.Request) -> httpx.Response:
        r = client.request(
            request.method, str(request.url), content=request.read(), headers=request.headers
        )
        headers = {k: v for k, v in r.headers.items() if k.lower() != "content-length"}
        return httpx.Response(r.status_code, headers=headers, content=r.content)

    return httpx.MockTransport(handle)


@pytest.fixture
def oss() -> Iterator[tuple[TestClient, FakeStarter]]:
    client, starter = app_client(THOUGHT + ANSWER)
    with client:
        yield client, starter


def test_ollama_client_reads_thinking_and_content(oss: tuple[TestClient, FakeStarter]) -> None:
    ollama = pytest.importorskip("ollama")
    client, starter = oss
    api = ollama.Client("http://testserver", transport=through(client))
    r = api.chat(model="oss", messages=[{"role": "user", "content": "Hi"}], think="high")
    assert r.message.thinking == "The user greets. Answer kindly."
    assert r.message.content == "Hello there, friend!"
    assert "Reasoning: high" in starter.runners[0].prompts[-1]
    chunks = list(api.chat(model="oss", messages=[{"role": "user", "content": "Hi"}], stream=True))
    assert "".join(c.message.thinking or "" for c in chunks) == r.message.thinking
    assert "".join(c.message.content for c in chunks) == r.message.content
    r = api.generate(model="oss", prompt="Hi", think=False)  # gpt-oss still reasons, a little
    assert (r.thinking, r.response) == (None, "Hello there, friend!")
    assert "Reasoning: low" in starter.runners[0].prompts[-1]


def test_tool_call_through_both_clients() -> None:
    ollama = pytest.importorskip("ollama")
    openai = pytest.importorskip("openai")
    client, starter = app_client(THOUGHT + CALL)
    with client:
        api = ollama.Client("http://testserver", transport=through(client))
        messages = [{"role": "user", "content": "Weather in Paris?"}]
        r = api.chat(model="oss", messages=messages, tools=[WEATHER])
        [call] = r.message.tool_calls
        assert call.function.name == "get-weather"
        assert call.function.arguments == {"city": "Paris", "unit": "celsius"}
        prompt = starter.runners[0].prompts[-1]
        assert "type get_weather\n" in prompt and "get-weather" not in prompt
        assert starter.runners[0].fields[-1].get("grammar") is None  # read, not constrained

        # the call and its result go back: the template sees the renamed call
        history = [*messages, r.message.model_dump(exclude_none=True)]
        history.append({"role": "tool", "content": "12 C", "tool_name": "get-weather"})
        api.chat(model="oss", messages=history, tools=[WEATHER])
        assert "to=functions.get_weather<|channel|>" in starter.runners[0].prompts[-1]

        http = httpx.Client(transport=through(client))
        oai = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http)
        done = oai.chat.completions.create(model="oss", messages=messages, tools=[WEATHER])
        [oai_call] = done.choices[0].message.tool_calls or []
        assert oai_call.function.name == "get-weather"
        assert json.loads(oai_call.function.arguments) == {"city": "Paris", "unit": "celsius"}
        assert done.choices[0].finish_reason == "tool_calls"


def test_a_format_follows_the_analysis(oss: tuple[TestClient, FakeStarter]) -> None:
    client, starter = oss
    body = {"model": "oss", "messages": [{"role": "user", "content": "Hi"}], "stream": False}
    assert client.post("/api/chat", json={**body, "format": "json"}).status_code == 200
    prompt, fields = starter.runners[0].prompts[-1], starter.runners[0].fields[-1]
    assert prompt.endswith("<|start|>assistant") and fields["format"] is None
    assert "analysis" in fields["grammar"] and "final" in fields["grammar"]
    # think false: the final channel opened after the prompt, the format on the whole output
    r = client.post("/api/chat", json={**body, "format": "json", "think": False})
    assert r.status_code == 200
    assert starter.runners[0].prompts[-1].endswith(FINAL)
    assert starter.runners[0].fields[-1]["format"] == "json"
    assert "grammar" not in starter.runners[0].fields[-1]
    # /api/generate alike
    generate = {"model": "oss", "prompt": "Hi", "stream": False, "format": "json"}
    assert client.post("/api/generate", json=generate).status_code == 200
    assert "analysis" in starter.runners[0].fields[-1]["grammar"]
    assert client.post("/api/generate", json={**generate, "think": False}).status_code == 200
    assert starter.runners[0].prompts[-1].endswith(FINAL)


SPECIALS = control_ids("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|constrain|>")


def accepts(grammar: str, text: str) -> bool:
    return accepts_tokens(grammar, text, SPECIALS)


def test_a_forced_call_is_one_to_a_tool_after_the_analysis() -> None:
    tools = [Tool.model_validate(WEATHER)]
    grammar = call_grammar(tools, HarmonyNames(["get-weather"]), SPECIALS)
    header = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    assert accepts(grammar, header + '{"city": "Paris"}')
    assert accepts(
        grammar, THOUGHT + "<|start|>assistant" + header + '{"city": "Oslo", "unit": "c"}'
    )
    assert not accepts(grammar, header + '{"unit": "c"}')  # its required city
    assert not accepts(grammar, ANSWER.removeprefix("<|start|>assistant"))  # no answer instead
    assert not accepts(grammar, header.replace("get_weather", "get-weather") + '{"city": "P"}')
    direct = call_grammar(tools, HarmonyNames(["get-weather"]), SPECIALS, analysis=False)
    assert accepts(direct, header + '{"city": "Paris"}')  # think false: the call at once
    assert not accepts(direct, THOUGHT + "<|start|>assistant" + header + '{"city": "Oslo"}')


def test_the_runner_gets_the_forced_calls_grammar(oss: tuple[TestClient, FakeStarter]) -> None:
    client, starter = oss
    body = {
        "model": "oss",
        "messages": [{"role": "user", "content": "Hi"}],
        "tools": [WEATHER],
        "tool_choice": "required",
    }
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert "to=functions.get_weather" in starter.runners[0].fields[-1]["grammar"]
