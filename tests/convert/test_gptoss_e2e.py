"""A tiny random-weight gpt-oss whose vocabulary has Harmony's tags and whose chat template
writes Harmony, through `ember create` and a real `ember serve`: it shows the thinking and tools
capabilities, its tool names reach the template as identifiers, <|return|> and <|call|> end its
generation, and a format follows the analysis (or, with think false, opens the final channel),
so the `ollama` client gets the format's JSON as content. (Its thinking and calls, which random
weights cannot write, are read in tests/server/test_harmony.py from a scripted runner.)"""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytest.importorskip("transformers")
TESTS = Path(__file__).resolve().parents[1]
sys.path += [str(TESTS / "server"), str(TESTS / "cli")]

from cli_support import EMBER, cli_env  # noqa: E402
from hf_dirs import _save_bpe  # noqa: E402
from hf_families import build_family  # noqa: E402
from serve_process import Server  # noqa: E402
from test_harmony import HARMONY, WEATHER  # noqa: E402
from tinymodels import tiny_vocab  # noqa: E402

from ember.gguf import GGUFFile  # noqa: E402
from ember.tokenizer import Tokenizer  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
TAGS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>"]
TAGS.append("<|call|>")


def harmony_vocab():  # type: ignore[no-untyped-def]
    """The tiny qwen2 vocabulary with its last merges' tokens made Harmony's tags (those merges
    dropped): the same size, so the model's embedding fits."""
    vocab = tiny_vocab("qwen2")
    first = len(vocab.tokens) - 3 - len(TAGS)  # before the three specials at the end
    tokens, types = list(vocab.tokens), list(vocab.token_types)
    tokens[first : first + len(TAGS)] = TAGS
    types[first : first + len(TAGS)] = [3] * len(TAGS)
    merges = vocab.merges[: len(vocab.merges) - len(TAGS)]
    return dataclasses.replace(vocab, tokens=tokens, token_types=types, merges=merges)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("oss")
    from ember.convert import convert_directory

    build_family("gpt-oss").save_pretrained(root / "hf")
    _save_bpe("qwen2", harmony_vocab(), root / "hf")
    (root / "hf" / "chat_template.jinja").write_text(HARMONY)
    convert_directory(root / "hf", root / "oss.gguf")
    server = Server(root)
    try:
        (root / "Modelfile").write_text(f"FROM {root / 'oss.gguf'}\n")
        result = subprocess.run(
            [*EMBER, "create", "oss", "-f", str(root / "Modelfile")],
            text=True, capture_output=True, timeout=300,
            env=cli_env(root, server.url.removeprefix("http://")),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        yield server, root / "oss.gguf"
    finally:
        server.stop()


def test_generation_ends_on_return_and_call(served) -> None:
    _, path = served
    with GGUFFile.open(path) as f:
        tok = Tokenizer.from_metadata(f.metadata)
        ids = {t: tok.encode(t, add_special=False) for t in TAGS}
    assert all(len(i) == 1 for i in ids.values())
    assert tok.eos_ids >= {ids["<|return|>"][0], ids["<|call|>"][0]}
    assert ids["<|end|>"][0] not in tok.eos_ids


def test_capabilities_and_the_rendered_prompt(served) -> None:
    server, _ = served
    shown = httpx.post(f"{server.url}/api/show", json={"model": "oss"}).json()
    assert {"completion", "tools", "thinking"} <= set(shown["capabilities"])
    body = {
        "model": "oss",
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": [WEATHER],
        "think": "high",
        "_debug_render_only": True,
    }
    rendered = httpx.post(f"{server.url}/api/chat", json=body).json()["_debug_info"]
    text = rendered["rendered_template"]
    assert text.startswith("<|start|>system<|message|>Reasoning: high<|end|>")
    assert "type get_weather\n" in text
    assert text.endswith("<|start|>user<|message|>Weather?<|end|><|start|>assistant")


# its city one of two: random weights finish the call within the limit
SHORT_WEATHER = {
    "type": "function",
    "function": {
        "name": "get-weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo"]}},
            "required": ["city"],
        },
    },
}


def test_a_forced_call_is_valid_arguments_of_a_tool(served) -> None:
    # tool_choice (Ember's extension on /api/chat): with think false the grammar holds the
    # output to the call's header (its tags as control tokens) and the tool's schema
    server, _ = served
    body = {
        "model": "oss",
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": [SHORT_WEATHER],
        "tool_choice": "required",
        "think": False,
        "stream": False,
        "options": {"num_predict": 60, "seed": 1},
    }
    r = httpx.post(f"{server.url}/api/chat", json=body, timeout=120)
    assert r.status_code == 200, r.text
    assert "tool_calls" in r.json()["message"], r.json()
    [call] = r.json()["message"]["tool_calls"]
    assert call["function"]["name"] == "get-weather"  # renamed for the template, and back
    assert call["function"]["arguments"] in ({"city": "Paris"}, {"city": "Oslo"})


def test_a_format_follows_the_analysis_or_answers_at_once(served) -> None:
    ollama = pytest.importorskip("ollama")
    server, _ = served
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}},
        "required": ["city"],
        "additionalProperties": False,
    }
    api = ollama.Client(server.url)
    question = [{"role": "user", "content": "A city?"}]
    options = {"num_predict": 40, "seed": 1}
    # think false: the final channel opened after the prompt, the format on the whole output
    r = api.chat(model="oss", messages=question, format=schema, think=False, options=options)
    assert r.message.thinking is None
    answer = json.loads(r.message.content)
    assert set(answer) == {"city"} and isinstance(answer["city"], str)
    # else the grammar (its tags as the vocabulary's control tokens) lets the analysis come
    # first: random weights think until the limit, read as thinking, or answer the format
    r = api.chat(model="oss", messages=question, format=schema, options=options)
    if r.message.content:
        assert set(json.loads(r.message.content)) == {"city"}
    else:
        assert r.message.thinking and r.done_reason == "length"
    free = api.chat(
        model="oss", messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 8}
    )
    assert free.done  # random weights write no Harmony: nothing to show, and no error
