"""/v1 request fields over a fake runner: logit_bias reaches the runner, the legacy completions
logprobs carry text_offset, and a field Ember does not honour is a 400 that names it."""

from typing import Any

import pytest
from fastapi.testclient import TestClient


def chat(client: TestClient, **body: Any) -> Any:
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]} | body
    return client.post("/v1/chat/completions", json=body)


def complete(client: TestClient, **body: Any) -> Any:
    return client.post("/v1/completions", json={"model": "fake", "prompt": "hi"} | body)


def test_logit_bias_reaches_the_runner_on_every_route(client, starter):
    assert chat(client, logit_bias={"15": -100, "7": 2.5}).status_code == 200
    assert complete(client, logit_bias={"3": 1}).status_code == 200
    body = {"model": "fake", "prompt": "hi", "stream": False, "logit_bias": {"4": -1}}
    assert client.post("/api/generate", json=body).status_code == 200  # Ember's extension
    biases = [f.get("logit_bias") for f in starter.runners[0].fields]
    assert biases == [{15: -100.0, 7: 2.5}, {3: 1.0}, {4: -1.0}]
    assert chat(client).status_code == 200
    assert "logit_bias" not in starter.runners[0].fields[-1]  # none: not sent


def test_logit_bias_keys_must_be_token_ids(client):
    r = chat(client, logit_bias={"hello": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"


@pytest.mark.parametrize(
    ("route", "field", "value"),
    [
        (chat, "functions", [{"name": "f", "parameters": {}}]),
        (chat, "function_call", {"name": "f"}),
        (chat, "audio", {"voice": "alloy", "format": "wav"}),
        (chat, "modalities", ["text", "audio"]),
        (chat, "web_search_options", {}),
        (chat, "verbosity", "low"),
        (complete, "best_of", 3),
    ],
)
def test_a_field_that_would_change_the_output_is_refused_by_name(client, route, field, value):
    r = route(client, **{field: value})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == field and f'"{field}" is not supported' in error["message"]


@pytest.mark.parametrize(
    ("route", "fields"),
    [
        (chat, {"function_call": "auto", "modalities": ["text"], "verbosity": "medium"}),
        (chat, {"functions": None, "user": "u", "metadata": {"a": "b"}, "store": False}),
        (chat, {"service_tier": "auto", "prediction": {"type": "content", "content": "x"}}),
        (complete, {"best_of": 1, "user": "u"}),
    ],
)
def test_defaults_and_fields_without_effect_are_accepted(client, route, fields):
    assert route(client, **fields).status_code == 200


def test_completion_logprobs_have_text_offsets(client):
    choice = complete(client, logprobs=1, echo=True).json()["choices"][0]
    lps = choice["logprobs"]
    assert lps["tokens"] == ["Hello", "there", "friend"]  # the fake's token strings
    assert lps["text_offset"] == [2, 7, 12]  # after the echoed "hi"
    assert lps["token_logprobs"] == [-0.5, -0.5, -0.5]
    assert lps["top_logprobs"][0] == {"Hello": -0.5, "x": -2.0}


def test_a_legacy_top_logprobs_map_holds_the_sampled_token():
    """As OpenAI's: up to logprobs + 1 entries, the token sampled (at temperature, maybe not
    among the most likely) always one of them."""
    from ember.server.openai import _completion_logprobs

    top = [{"token": "Hello", "logprob": -0.4}]
    native = {"logprobs": [{"token": "Z", "logprob": -3.0, "top_logprobs": top}]}
    legacy = _completion_logprobs(native)
    assert legacy is not None and legacy["top_logprobs"] == [{"Hello": -0.4, "Z": -3.0}]
