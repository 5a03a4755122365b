"""Which runner process serves a request: one per loaded model, started on demand, kept while
its keep-alive lasts, evicted when too many are loaded, replaced when it dies or when a request
needs another shape (num_ctx, num_batch, threads). It knows nothing of HTTP or prompts.

A request holds a Lease from acquire() to release(). Requests that wait (for a load, or for one
of the runner's parallel slots) count against max_queue; past it acquire raises QueueFullError.
"""

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ember.errors import EmberError
from ember.runner.client import LoadSettings, RunnerClient, RunnerError
from ember.server.errors import MAX_QUEUE_MESSAGE

# a load's shape and defaults live in shapes.py; the server imports them from here
from ember.server.shapes import Defaults as Defaults
from ember.server.shapes import Shape as Shape
from ember.server.shapes import bounded_ctx

log = logging.getLogger("ember.server")

AUTO_PARALLEL = (4, 2, 1)  # tried in turn when EMBER_NUM_PARALLEL is unset and memory is short
DEFAULT_MAX_LOADED = 3


class Runner(Protocol):
    """What the scheduler and the routes use of a runner (RunnerClient; fakes in tests)."""

    async def load(self, settings: LoadSettings) -> dict[str, Any]: ...

    def completion(self, prompt: str, **fields: Any) -> AsyncGenerator[dict[str, Any], None]: ...

    async def embedding(
        self, content: str | list[str], *, truncate: bool = True, cut_to: int = 0
    ) -> dict[str, Any]: ...

    async def rerank(
        self, query: str, documents: list[str], *, truncate: bool = True
    ) -> dict[str, Any]: ...

    async def tokenize(self, content: str, *, add_special: bool = True) -> list[int]: ...

    async def detokenize(self, tokens: list[int]) -> str: ...

    def alive(self) -> bool: ...

    async def close(self) -> None: ...


StartRunner = Callable[..., Awaitable[Runner]]  # (model path, *projector paths)


class Events(Protocol):
    """What the scheduler tells an observer (the server's metrics); `info` is the loaded
    model's info as acquire() was given it."""

    def model_loaded(self, info: Any, seconds: float) -> None: ...

    def runner_restarted(self, info: Any) -> None: ...


class NoEvents:
    def model_loaded(self, info: Any, seconds: float) -> None:
        pass

    def runner_restarted(self, info: Any) -> None:
        pass


async def start_process(model_path: str, *projectors: str) -> Runner:
    return await RunnerClient.start(model_path, *projectors)


class QueueFullError(EmberError):
    def __init__(self) -> None:
        super().__init__(MAX_QUEUE_MESSAGE)


@dataclass(eq=False)
class Loaded:
    """A runner process and its bookkeeping."""

    shape: Shape  # complete: every field set
    runner: Runner
    parallel: int
    info: Any  # what /api/ps shows of the model (the server's ServedModel)
    kv_bytes: int = 0
    kv_cache_type: str = ""  # as the runner reports it ("": not reported)
    refs: int = 0  # requests holding or waiting for a slot
    busy: int = 0  # requests holding a slot
    keep_alive: float = 300.0
    expires_at: float = math.inf  # wall-clock seconds
    slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(1))
    timer: asyncio.TimerHandle | None = None
    is_retired: bool = False

    @property
    def num_ctx(self) -> int:
        return self.shape.num_ctx or 0


class Lease:
    """One request's hold on a runner; release() exactly once (more calls do nothing)."""

    def __init__(self, scheduler: "Scheduler", loaded: Loaded, load_duration: int) -> None:
        self.scheduler, self.loaded, self.load_duration = scheduler, loaded, load_duration
        self._is_released = False

    @property
    def runner(self) -> Runner:
        return self.loaded.runner

    def release(self) -> None:
        if not self._is_released:
            self._is_released = True
            self.scheduler._release(self.loaded)


class Scheduler:
    def __init__(
        self,
        *,
        start: StartRunner = start_process,
        defaults: Defaults | None = None,
        num_parallel: int = 0,
        max_loaded: int = 0,
        max_queue: int = 512,
        keep_alive: float = 300.0,
    ) -> None:
        self._start = start
        self.defaults = defaults or Defaults()
        self.parallels = (num_parallel,) if num_parallel else AUTO_PARALLEL
        self.max_loaded = max_loaded or DEFAULT_MAX_LOADED
        self.max_queue = max_queue
        self.keep_alive = keep_alive
        self.loaded: dict[str, Loaded] = {}  # by model path
        self._waiting = 0
        self._lock = asyncio.Lock()  # one load (or unload) at a time, as Ollama's processPending
        self._released = asyncio.Event()
        self._draining = False  # the lock's holder waits for runners to be released
        self.events: Events = NoEvents()

    @property
    def waiting(self) -> int:
        """Requests waiting for a load or for a slot."""
        return self._waiting

    async def acquire(
        self, shape: Shape, *, info: Any = None, context_length: int = 0, keep_alive: float | None
    ) -> Lease:
        """A slot on a runner of the model for shape, loading it if needed."""
        if self._waiting >= self.max_queue:
            raise QueueFullError()
        self._waiting += 1
        try:
            while True:
                loaded, load_duration = await self._slot(shape, info, context_length, keep_alive)
                loaded.busy += 1
                if loaded.runner.alive():
                    return Lease(self, loaded, load_duration)
                # its runner died while this request waited for the slot: nothing was sent to
                # it yet, so the request goes to the runner that replaces it
                self._release(loaded)
        finally:
            self._waiting -= 1

    async def _slot(
        self, shape: Shape, info: Any, context_length: int, keep_alive: float | None
    ) -> tuple[Loaded, int]:
        """A slot on a runner for shape, and the nanoseconds its load (or wait for one) took."""
        start = time.perf_counter_ns()
        gone = asyncio.Event()
        held = asyncio.ensure_future(
            self._hold_runner(shape, info, context_length, keep_alive, gone)
        )
        try:
            loaded = await asyncio.shield(held)
        except asyncio.CancelledError:
            # the client went away: a request still waiting for the lock loads nothing (as
            # Ollama's processPending skips it); a load under way goes on and the model stays
            # for the next request (Ollama's expires it), only this request's hold let go
            gone.set()
            held.add_done_callback(self._abandon)
            raise
        load_duration = time.perf_counter_ns() - start
        try:
            await loaded.slots.acquire()
        except BaseException:
            self._drop_ref(loaded)
            raise
        return loaded, load_duration

    async def _hold_runner(
        self,
        shape: Shape,
        info: Any,
        context_length: int,
        keep_alive: float | None,
        gone: asyncio.Event,
    ) -> Loaded:
        if shape.num_ctx is not None:  # what it loads with is what it matches
            shape = replace(shape, num_ctx=bounded_ctx(shape.num_ctx, context_length))
        if shape.num_batch is None:  # the default, as Ollama's: another batch size rounds a
            # prompt's logits otherwise, so a seed would not give its text again
            shape = replace(shape, num_batch=self.defaults.num_batch)
        least_ctx = self.defaults.complete(shape, context_length).num_ctx or 0
        loaded = self._ready(shape, info, least_ctx)
        if loaded is not None:  # no await since the check: nothing retired it in between
            self._hold(loaded, keep_alive)
            return loaded
        async with self._lock:
            if gone.is_set():  # no eviction, reload or load for a client that left
                raise asyncio.CancelledError
            loaded = await self._runner_for(shape, info, context_length)
            self._hold(loaded, keep_alive)
            return loaded

    def _ready(self, shape: Shape, info: Any, least_ctx: int) -> Loaded | None:
        """The loaded runner for shape when a request may take it without the lock: a load of
        another model (seconds) must not hold up the requests of those already loaded. Not
        while the lock's holder waits for runners to drain (an eviction or a reload)."""
        current = self.loaded.get(shape.model_path)
        if self._draining or current is None or current.is_retired:
            return None
        if not current.runner.alive() or not shape.matches(current.shape, least_ctx):
            return None
        current.info = info if info is not None else current.info
        return current

    def _abandon(self, held: "asyncio.Future[Loaded]") -> None:
        if not held.cancelled() and held.exception() is None:
            self._drop_ref(held.result())

    @contextlib.asynccontextmanager
    async def lease(
        self, shape: Shape, *, info: Any = None, context_length: int = 0, keep_alive: float | None
    ) -> AsyncIterator[Lease]:
        held = await self.acquire(
            shape, info=info, context_length=context_length, keep_alive=keep_alive
        )
        try:
            yield held
        finally:
            held.release()

    def running(self) -> list[Loaded]:
        return [loaded for loaded in self.loaded.values() if loaded.runner.alive()]

    async def unload(self, model_path: str) -> bool:
        """Unloads the model now if idle, else as soon as its requests end; False if not loaded.
        Without the lock, as Ollama's expireRunner: an unload (`ember stop`) never waits for
        another model's load or drain, and an idle runner leaves nothing they need (_close
        takes it out of `loaded` before its first await)."""
        loaded = self.loaded.get(model_path)
        if loaded is None:
            return False
        loaded.keep_alive = 0.0
        loaded.expires_at = time.time()  # as Ollama's /api/ps shows an expiring model
        if loaded.refs == 0 and not loaded.is_retired:
            log.info("model unloaded", extra={"model": model_path})
            await self._close(loaded)
        return True

    async def close(self) -> None:
        """Ends every runner process (at server shutdown)."""
        for loaded in list(self.loaded.values()):
            await self._close(loaded)

    # --- loading ---

    async def _runner_for(self, shape: Shape, info: Any, context_length: int) -> Loaded:
        complete = self.defaults.complete(shape, context_length)
        current = self.loaded.get(shape.model_path)
        if current is not None:
            if not current.runner.alive():
                log.warning("runner stopped; starting a new one", extra={"model": shape.model_path})
                self.events.runner_restarted(current.info)
                await self._close(current)
            elif shape.matches(current.shape, complete.num_ctx or 0):
                current.info = info if info is not None else current.info
                return current
            else:
                log.info("reloading: the request needs another context or batch size")
                await self._wait_idle(current)
                await self._close(current)
        while len(self.loaded) >= self.max_loaded:
            await self._evict_one()
        return await self._load(complete, info)

    async def _load(self, shape: Shape, info: Any) -> Loaded:
        start = time.perf_counter()
        loaded = await self._start_and_load(shape, info)
        self.events.model_loaded(info, time.perf_counter() - start)
        return loaded

    async def _start_and_load(self, shape: Shape, info: Any) -> Loaded:
        attempt = 0
        while True:
            parallel = self.parallels[min(attempt, len(self.parallels) - 1)]
            runner = await self._start(shape.model_path, *shape.projectors)
            try:
                result = await runner.load(self._settings(shape, parallel))
            except RunnerError as err:
                await runner.close()
                if err.status != 507:
                    raise
                if self._idle():  # memory held by an idle model: give it back and retry
                    await self._evict_one()
                elif attempt + 1 < len(self.parallels):
                    attempt += 1
                else:
                    raise
                log.info("model does not fit; retrying", extra={"reason": str(err)})
                continue
            except BaseException:
                await runner.close()
                raise
            loaded = Loaded(shape, runner, parallel, info, kv_bytes=int(result.get("kv_bytes", 0)))
            loaded.keep_alive = self.keep_alive
            loaded.kv_cache_type = str(result.get("kv_cache_type", self.defaults.kv_cache_type))
            loaded.slots = asyncio.Semaphore(parallel)
            self.loaded[shape.model_path] = loaded
            log.info(
                "model loaded",
                extra={"model": shape.model_path, "parallel": parallel, "num_ctx": shape.num_ctx},
            )
            return loaded

    def _settings(self, shape: Shape, parallel: int) -> LoadSettings:
        num_ctx, num_batch = shape.num_ctx or 1, shape.num_batch or 1
        return LoadSettings(
            parallel=parallel,
            batch_size=num_batch,
            kv_size=num_ctx * parallel,
            kv_cache_type=self.defaults.kv_cache_type,  # "": the runner's default (f16)
            num_threads=shape.num_thread or 0,
            multiuser_cache=self.defaults.multiuser_cache,
            draft_model=shape.draft,
        )

    # --- eviction and expiry ---

    def _idle(self) -> list[Loaded]:
        return [loaded for loaded in self.loaded.values() if loaded.refs == 0]

    async def _evict_one(self) -> None:
        """Unloads the idle runner that would expire first; waits for one if all are busy."""
        await self._drain(lambda: bool(self._idle()))
        victim = min(self._idle(), key=lambda loaded: (loaded.keep_alive, loaded.shape.model_path))
        await self._close(victim)

    async def _wait_idle(self, loaded: Loaded) -> None:
        await self._drain(lambda: loaded.refs == 0 or not loaded.runner.alive())

    async def _drain(self, is_done: Callable[[], bool]) -> None:
        """Waits, holding the lock, until is_done(); meanwhile new requests queue behind the
        lock rather than take loaded runners, so the runners can drain."""
        self._draining = True
        try:
            while not is_done():
                self._released.clear()
                await self._released.wait()
        finally:
            self._draining = False

    def _hold(self, loaded: Loaded, keep_alive: float | None) -> None:
        loaded.refs += 1
        if keep_alive is not None:  # as Ollama's: a request that sets none leaves the model's
            loaded.keep_alive = keep_alive  # (a pin with -1, an unload with 0) as it was
        loaded.expires_at = time.time() + loaded.keep_alive
        if loaded.timer is not None:
            loaded.timer.cancel()
            loaded.timer = None

    def _release(self, loaded: Loaded) -> None:
        loaded.busy -= 1
        loaded.slots.release()
        self._drop_ref(loaded)

    def _drop_ref(self, loaded: Loaded) -> None:
        loaded.refs -= 1
        self._released.set()
        if loaded.is_retired or loaded.refs > 0:
            return
        loaded.expires_at = time.time() + loaded.keep_alive
        if not loaded.runner.alive() or loaded.keep_alive <= 0:
            asyncio.get_running_loop().create_task(self._expire(loaded))
        elif math.isfinite(loaded.keep_alive):
            loop = asyncio.get_running_loop()
            loaded.timer = loop.call_later(
                loaded.keep_alive, lambda: loop.create_task(self._expire(loaded))
            )

    async def _expire(self, loaded: Loaded) -> None:
        async with self._lock:
            if loaded.refs == 0 and not loaded.is_retired:
                log.info("model unloaded", extra={"model": loaded.shape.model_path})
                await self._close(loaded)

    async def _close(self, loaded: Loaded) -> None:
        loaded.is_retired = True
        if loaded.timer is not None:
            loaded.timer.cancel()
        if self.loaded.get(loaded.shape.model_path) is loaded:
            del self.loaded[loaded.shape.model_path]
        await loaded.runner.close()
