"""Prometheus metrics of one server (GET /metrics when EMBER_METRICS is on): counters and
histograms recorded as requests run, gauges of the scheduler and its runners read at scrape
time. Each server has a registry of its own, never prometheus_client's process-wide one."""

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import httpx
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ember.errors import EmberError
from ember.server.model import ServedModel
from ember.server.scheduler import Loaded, Scheduler

METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"})
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
HEALTH_TIMEOUT = 2.0  # seconds a scrape waits for a runner's counts before leaving them out


class Metrics:
    """The server's metrics; the scheduler reports loads and restarts to it (its Events)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        model = ["model"]
        self.requests = Counter(
            "ember_requests",
            "HTTP requests by route template and status",
            ["route", "method", "status"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "ember_prompt_tokens", "Prompt tokens (cached ones included)", model, registry=r
        )
        self.generated_tokens = Counter(
            "ember_generated_tokens", "Tokens generated", model, registry=r
        )
        self.prefix_hit_tokens = Counter(
            "ember_prefix_cache_hit_tokens",
            "Prompt tokens found in the runner's prompt cache",
            model,
            registry=r,
        )
        self.time_to_first_token = Histogram(
            "ember_time_to_first_token_seconds",
            "From a request's arrival to its first generated text (queue and load included)",
            model,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.time_per_token = Histogram(
            "ember_time_per_output_token_seconds",
            "Each generation's mean decode time per generated token",
            model,
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.load_seconds = Histogram(
            "ember_model_load_seconds",
            "Runner start and model load",
            model,
            buckets=LOAD_BUCKETS,
            registry=r,
        )
        self.runner_restarts = Counter(
            "ember_runner_restarts", "Runners found dead and started again", model, registry=r
        )
        self.gauges = SchedulerGauges()
        self.registry.register(self.gauges)

    # --- the scheduler's Events ---
    def model_loaded(self, info: Any, seconds: float) -> None:
        self.load_seconds.labels(model_label(info)).observe(seconds)

    def runner_restarted(self, info: Any) -> None:
        self.runner_restarts.labels(model_label(info)).inc()

    def completion(self, model: str, start_ns: int) -> "CompletionObserver":
        """An observer of one generation's runner records; start_ns: its arrival."""
        return CompletionObserver(self, model, start_ns)

    async def exposition(self, scheduler: Scheduler) -> bytes:
        """The text format, with the scheduler's and runners' gauges read now."""
        self.gauges.snapshot = await snapshot(scheduler)
        return generate_latest(self.registry)


class CompletionObserver:
    """Counts one generation: time to its first text, then its final record's counts."""

    def __init__(self, metrics: Metrics, model: str, start_ns: int) -> None:
        self.metrics, self.model, self.start_ns = metrics, model, start_ns
        self.has_text = False

    def record(self, record: dict[str, Any]) -> None:
        m, model = self.metrics, self.model
        if record.get("content") and not self.has_text:
            self.has_text = True
            seconds = (time.perf_counter_ns() - self.start_ns) / 1e9
            m.time_to_first_token.labels(model).observe(seconds)
        if not record.get("done"):
            return
        eval_count = int(record.get("eval_count", 0))
        m.prompt_tokens.labels(model).inc(int(record.get("prompt_count", 0)))
        m.prefix_hit_tokens.labels(model).inc(int(record.get("prompt_cached_count", 0)))
        m.generated_tokens.labels(model).inc(eval_count)
        if eval_count:
            per_token = int(record.get("eval_duration", 0)) / eval_count / 1e9
            m.time_per_token.labels(model).observe(per_token)


def model_label(info: Any) -> str:
    return info.name if isinstance(info, ServedModel) else "unknown"


# --- gauges, read at scrape time ---


@dataclass(frozen=True, slots=True)
class ModelUsage:
    model: str
    slots_busy: int
    slots: int  # the parallel the model got (after any fallback)
    kv_cells_used: int | None  # None: the runner did not tell
    kv_cells: int | None


@dataclass(frozen=True, slots=True)
class Snapshot:
    queue_depth: int = 0
    models: tuple[ModelUsage, ...] = ()


@runtime_checkable
class ReportsHealth(Protocol):
    """A runner that tells its slots and KV cache cells (RunnerClient's /health)."""

    async def health(self) -> dict[str, Any]: ...


async def snapshot(scheduler: Scheduler) -> Snapshot:
    running = scheduler.running()
    healths = await asyncio.gather(*(_health(loaded) for loaded in running))
    models = tuple(
        ModelUsage(
            model_label(loaded.info),
            loaded.busy,
            loaded.parallel,
            _count(health, "kv_cells_used"),
            _count(health, "kv_cells"),
        )
        for loaded, health in zip(running, healths, strict=True)
    )
    return Snapshot(scheduler.waiting, models)


async def _health(loaded: Loaded) -> dict[str, Any]:
    if not isinstance(loaded.runner, ReportsHealth):
        return {}
    try:
        return await asyncio.wait_for(loaded.runner.health(), HEALTH_TIMEOUT)
    except (EmberError, httpx.HTTPError, TimeoutError, OSError):
        return {}  # a busy or dying runner: its cells are left out of this scrape


def _count(health: dict[str, Any], key: str) -> int | None:
    value = health.get(key)
    return value if isinstance(value, int) else None


class SchedulerGauges(Collector):
    """The gauges of the last snapshot taken (Metrics.exposition takes one per scrape)."""

    def __init__(self) -> None:
        self.snapshot = Snapshot()

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        yield GaugeMetricFamily(
            "ember_queue_depth", "Requests waiting for a model load or a slot", snap.queue_depth
        )
        yield GaugeMetricFamily(
            "ember_loaded_models", "Models loaded in a runner", value=len(snap.models)
        )
        per_model = [
            ("ember_slots_busy", "Slots serving a request", lambda u: u.slots_busy),
            ("ember_slots", "Slots (parallel sequences) a model got", lambda u: u.slots),
            ("ember_kv_cache_cells_used", "KV cache cells in use", lambda u: u.kv_cells_used),
            ("ember_kv_cache_cells", "KV cache cells", lambda u: u.kv_cells),
        ]
        for name, doc, read in per_model:
            family = GaugeMetricFamily(name, doc, labels=["model"])
            for usage in snap.models:
                value = read(usage)
                if value is not None:
                    family.add_metric([usage.model], value)
            yield family


class RequestCounter:
    """ASGI middleware: counts each request by its route's template (never the raw path, whose
    values are unbounded) and the status it was answered with."""

    def __init__(self, app: ASGIApp, *, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500  # what an exception that escapes the app becomes

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            # a client names any method it likes: each new one would be a series of its own
            method = scope["method"] if scope["method"] in METHODS else "OTHER"
            self.metrics.requests.labels(route, method, str(status)).inc()
