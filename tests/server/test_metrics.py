"""GET /metrics over fake runners: off unless asked (404), behind the API key, and scraped during
a short run: the counters move, the histograms fill, the gauges show the loaded model; the real
prometheus_client parser reads every scrape. And /api/ps's slots and KV cache type."""

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from server_fakes import FakeStarter, fake_state

from ember.envconfig import parse_host
from ember.server import middleware
from ember.server.app import create_app

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(client: TestClient, **headers: str) -> Samples:
    resp = client.get("/metrics", headers=headers)
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    families = list(text_string_to_metric_families(resp.text))
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in families for s in f.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
def starter() -> FakeStarter:
    return FakeStarter()


@pytest.fixture
def client(starter: FakeStarter) -> Iterator[TestClient]:
    with TestClient(create_app(fake_state(starter), metrics=True)) as c:
        yield c


def generate(client: TestClient, **body: Any) -> Any:
    return client.post("/api/generate", json={"model": "fake", "prompt": "why", **body})


def test_metrics_are_404_unless_ember_metrics_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBER_METRICS", raising=False)
    with TestClient(create_app(fake_state())) as off:
        resp = off.get("/metrics")
        assert resp.status_code == 404 and "error" in resp.json()
    monkeypatch.setenv("EMBER_METRICS", "1")
    with TestClient(create_app(fake_state())) as on:
        assert value(scrape(on), "ember_loaded_models") == 0


def test_metrics_need_the_api_key_when_one_is_set() -> None:
    app = middleware.install(
        create_app(fake_state(), metrics=True),
        bound=parse_host("0.0.0.0:11434"),
        origins=[],
        api_key="k3y",
    )
    with TestClient(app) as c:
        assert c.get("/metrics").status_code == 401
        assert value(scrape(c, Authorization="Bearer k3y"), "ember_queue_depth") == 0


def test_a_short_run_moves_the_counters_and_fills_the_histograms(client, starter) -> None:
    before = scrape(client)
    assert value(before, "ember_loaded_models") == 0
    assert value(before, "ember_generated_tokens_total", model="fake") == 0
    for stream in (False, True):
        assert generate(client, stream=stream).status_code == 200
    chat = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    assert client.post("/api/chat", json=chat).status_code == 200
    assert client.post("/api/embed", json={"model": "fake", "input": "x"}).status_code == 200
    assert generate(client, model="nope").status_code == 404
    assert client.get("/no/such/route").status_code == 404

    after = scrape(client)
    prompts = starter.runners[0].prompts
    words = sum(len(p.split()) for p in prompts)

    def requests(route: str, status: str, method: str = "POST") -> float:
        return value(after, "ember_requests_total", route=route, method=method, status=status)

    assert requests("/api/generate", "200") == 2 and requests("/api/chat", "200") == 1
    assert requests("/api/generate", "404") == 1
    assert requests("unmatched", "404", "GET") == 1  # never the raw path
    assert requests("/metrics", "200", "GET") == 1  # the first scrape
    assert value(after, "ember_generated_tokens_total", model="fake") == 3 * 3
    assert value(after, "ember_prompt_tokens_total", model="fake") == words + 1  # + the embed
    assert value(after, "ember_prefix_cache_hit_tokens_total", model="fake") == words - 3
    for histogram in ("time_to_first_token_seconds", "time_per_output_token_seconds"):
        assert value(after, f"ember_{histogram}_count", model="fake") == 3
        assert value(after, f"ember_{histogram}_sum", model="fake") > 0
    assert value(after, "ember_model_load_seconds_count", model="fake") == 1
    # the gauges: one model, its two slots idle, its KV cells as its runner reports them
    assert value(after, "ember_loaded_models") == 1 and value(after, "ember_queue_depth") == 0
    assert value(after, "ember_slots", model="fake") == 2
    assert value(after, "ember_slots_busy", model="fake") == 0
    assert value(after, "ember_kv_cache_cells_used", model="fake") == words
    assert value(after, "ember_kv_cache_cells", model="fake") == 2 * 4096


def test_a_method_of_the_clients_own_is_counted_as_other(client) -> None:
    """The method is a label: each made-up one was a series of its own, without bound."""
    for i in range(3):
        client.request(f"X{i}" * 50, "/api/tags")
    methods = {dict(labels).get("method") for _, labels in scrape(client)}
    assert "OTHER" in methods and not any(m and m.startswith("X0") for m in methods)


def test_a_dead_runner_started_again_is_counted(client, starter) -> None:
    assert generate(client, stream=False).status_code == 200
    starter.runners[0].is_alive = False  # killed between two requests
    assert generate(client, stream=False).status_code == 200
    samples = scrape(client)
    assert value(samples, "ember_runner_restarts_total", model="fake") == 1
    assert value(samples, "ember_model_load_seconds_count", model="fake") == 2


def test_ps_and_the_gauges_show_a_slot_in_use(client, starter) -> None:
    assert generate(client, prompt="", stream=False).json()["done_reason"] == "load"
    gate = asyncio.Event()
    starter.runners[0].gate = gate
    answer: list[Any] = []
    waiting = threading.Thread(target=lambda: answer.append(generate(client, stream=False)))
    waiting.start()
    try:
        (model,) = _ps_when(client, lambda m: m["slots_in_use"] == 1)
        assert model["num_parallel"] == 2 and model["kv_cache_type"] == "f16"
        assert value(scrape(client), "ember_slots_busy", model="fake") == 1
    finally:
        client.portal.call(gate.set)  # type: ignore[union-attr]
        waiting.join(10)
    assert answer[0].status_code == 200
    assert client.get("/api/ps").json()["models"][0]["slots_in_use"] == 0


def _ps_when(client: TestClient, ready: Any) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        models = client.get("/api/ps").json()["models"]
        if models and ready(models[0]):
            return models
        time.sleep(0.02)
    raise AssertionError("the request never took a slot")


def test_ps_shows_the_parallel_a_fallback_got() -> None:
    starter = FakeStarter(fits=2)  # 4 parallel does not fit: the scheduler falls back to 2
    with TestClient(create_app(fake_state(starter, num_parallel=0), metrics=True)) as c:
        assert generate(c, prompt="", stream=False).status_code == 200
        (model,) = c.get("/api/ps").json()["models"]
        assert model["num_parallel"] == 2 and model["slots_in_use"] == 0
        assert model["context_length"] == 4096 and model["kv_cache_type"] == "f16"
        assert {"name", "model", "size", "digest", "details", "expires_at"} <= model.keys()
        assert value(scrape(c), "ember_slots", model="fake") == 2
