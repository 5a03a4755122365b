"""What every route shares: the model resolver, the scheduler, and the step from a request's
model name and options to a Plan (the model, its merged options, the runner shape it needs)."""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, fields, replace
from typing import Any

from ember.errors import OptionsError
from ember.options import Options
from ember.runner.client import RunnerError
from ember.server.api import RequestOptions
from ember.server.errors import MAX_QUEUE_MESSAGE, RUNNER_STOPPED_MESSAGE, APIError
from ember.server.metrics import Metrics
from ember.server.model import Models, ServedModel
from ember.server.response_store import ResponseStore
from ember.server.scheduler import Lease, QueueFullError, Runner, Scheduler, Shape

log = logging.getLogger("ember.server")

_OPTION_NAMES = frozenset(f.name for f in fields(Options))
_RUNNER_ACCEPTED = frozenset({"num_gpu", "main_gpu", "use_mmap"})  # no meaning here: dropped
_SHAPE_OPTIONS = ("num_ctx", "num_batch", "num_thread")
VISION_MIN_CTX = 2048  # Ollama's least num_ctx for a model with the vision capability


@dataclass(frozen=True, slots=True)
class Plan:
    model: ServedModel
    options: Options  # defaults ← the model's PARAMETERs ← the request's options
    shape: Shape  # what the runner must be loaded with (None: whatever is loaded)


@dataclass
class ServerState:
    models: Models
    scheduler: Scheduler
    num_ctx: int = 4096  # EMBER_CONTEXT_LENGTH
    responses: ResponseStore = field(default_factory=ResponseStore)  # /v1/responses' store
    metrics: Metrics = field(default_factory=Metrics)  # served only when EMBER_METRICS is on

    def __post_init__(self) -> None:
        self.scheduler.events = self.metrics  # loads and restarts

    def plan(self, name: str, options: RequestOptions | dict[str, Any] | None) -> Plan:
        """The model called name and the options of a request; 404 or 400 when they fail."""
        model = self.models.resolve(name)
        given = _given(options)
        params = {k: v for k, v in model.parameters.items() if k in _OPTION_NAMES}
        try:
            base = Options.parse(params, Options(num_ctx=self.num_ctx))
            merged = Options.parse(given, base)
        except OptionsError as err:
            raise APIError(400, str(err)) from None
        shaping = {**params, **given}
        shape = Shape(
            str(model.model_path),
            **{k: shaping.get(k) for k in _SHAPE_OPTIONS},  # type: ignore[arg-type]
            projectors=tuple(str(p) for p in model.projector_paths),
            draft=self._draft_path(merged.draft_model or model.draft),
        )
        if "vision" in model.capabilities and merged.num_ctx < VISION_MIN_CTX:
            # as Ollama's scheduler: a model that takes images loads at least this context (an
            # image alone is hundreds of tokens), then as any model no more than it was trained for
            shape = replace(shape, num_ctx=VISION_MIN_CTX)
        if shape.num_ctx is not None and model.context_length > 0:  # as a load will cut it
            shape = replace(shape, num_ctx=min(shape.num_ctx, model.context_length))
        return Plan(model, merged, shape)

    def _draft_path(self, name: str) -> str:
        """The GGUF of the draft model called name ("": none); 400 when there is no such model."""
        if not name:
            return ""
        try:
            return str(self.models.resolve(name).model_path)
        except APIError as err:
            raise APIError(400, f"draft model {name!r}: {err.message}") from None

    @contextlib.asynccontextmanager
    async def lease(self, plan: Plan, keep_alive: float | None) -> AsyncIterator[Lease]:
        """A runner slot for plan; 503 past the queue limit, 500 when the model cannot load."""
        try:
            held = await self.scheduler.acquire(
                plan.shape,
                info=plan.model,
                context_length=plan.model.context_length,
                keep_alive=keep_alive,
            )
        except QueueFullError:
            raise APIError(503, MAX_QUEUE_MESSAGE) from None
        except RunnerError as err:
            raise APIError(500, f"the model failed to load: {err}") from None
        try:
            yield held
        finally:
            held.release()


def _given(options: RequestOptions | dict[str, Any] | None) -> dict[str, Any]:
    if options is None:
        return {}
    if isinstance(options, dict):
        return options
    unknown = options.unknown()
    if unknown:  # as Ollama: logged and ignored
        log.warning("invalid option provided", extra={"option": ", ".join(sorted(unknown))})
    return {k: v for k, v in options.given().items() if k not in _RUNNER_ACCEPTED}


async def runner_failure(err: RunnerError, runner: Runner) -> APIError:
    """The API's error for a runner call that failed: a dead runner's is Ollama's message."""
    if err.status >= 500:  # a cut connection: a killed process takes a moment to be reaped
        for _ in range(20):
            if not runner.alive():
                break
            await asyncio.sleep(0.05)
    if not runner.alive() or "the runner stopped" in str(err):
        return APIError(500, RUNNER_STOPPED_MESSAGE)
    return APIError(err.status if 400 <= err.status < 500 else 500, str(err))
