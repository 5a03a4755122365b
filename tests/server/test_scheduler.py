"""The scheduler with fake runners: loading, reuse, reload on shape, keep-alive, eviction,
the queue limit, dead runners, and the parallel fallback when memory is short."""

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from server_fakes import FakeStarter

from ember.server.scheduler import Defaults, QueueFullError, Scheduler, Shape

A, B = "/models/a.gguf", "/models/b.gguf"


def run(test: Callable[[], Awaitable[Any]]) -> Any:
    return asyncio.run(asyncio.wait_for(test(), timeout=10))


def scheduler(starter: FakeStarter, **args: Any) -> Scheduler:
    args.setdefault("num_parallel", 1)
    return Scheduler(start=starter, defaults=Defaults(num_ctx=1024, num_batch=256), **args)


async def settle() -> None:
    for _ in range(5):  # let scheduled unload tasks run
        await asyncio.sleep(0)


def test_a_loaded_model_is_reused_and_sized_by_the_defaults():
    async def test() -> None:
        starter = FakeStarter()
        s = scheduler(starter, num_parallel=2)
        first = await s.acquire(Shape(A), keep_alive=None)
        second = await s.acquire(Shape(A), keep_alive=None)
        assert first.runner is second.runner and len(starter.runners) == 1
        settings = starter.runners[0].settings
        assert settings is not None
        assert (settings.parallel, settings.kv_size, settings.batch_size) == (2, 2048, 256)
        first.release()
        second.release()

    run(test)


def test_leaving_out_num_ctx_reuses_a_larger_size_but_another_size_reloads():
    async def test() -> None:
        starter = FakeStarter()
        s = scheduler(starter)
        lease = await s.acquire(Shape(A, num_ctx=2048), keep_alive=None)
        lease.release()
        lease = await s.acquire(Shape(A), keep_alive=None)  # no num_ctx: the loaded one does
        assert len(starter.runners) == 1 and lease.loaded.num_ctx == 2048
        lease.release()
        lease = await s.acquire(Shape(A, num_ctx=512), keep_alive=None)
        assert len(starter.runners) == 2 and lease.loaded.num_ctx == 512
        assert not starter.runners[0].alive()
        lease.release()

    run(test)


def test_leaving_out_num_batch_wants_the_default_one():
    """A runner another request loaded with num_batch 8 rounds a prompt's logits otherwise than
    the default's, so a seed would not give its text again: as Ollama's, it reloads."""

    async def test() -> None:
        starter = FakeStarter()
        s = scheduler(starter)
        lease = await s.acquire(Shape(A, num_batch=8), keep_alive=None)
        lease.release()
        lease = await s.acquire(Shape(A), keep_alive=None)
        assert len(starter.runners) == 2 and lease.loaded.shape.num_batch == 256
        lease.release()
        lease = await s.acquire(Shape(A, num_batch=256), keep_alive=None)  # the same
        lease.release()
        # a context under the default batch cuts it: the same as leaving it out
        for shape in (Shape(A, num_ctx=128), Shape(A, num_ctx=128, num_batch=512)):
            lease = await s.acquire(shape, keep_alive=None)
            assert lease.loaded.shape.num_batch == 128
            lease.release()
        assert len(starter.runners) == 3

    run(test)


def test_a_num_ctx_past_the_models_bounds_reuses_the_runner_it_loaded():
    """num_ctx 100,000 on a model trained for 8,192 loads 8,192, and num_ctx 1 loads 4 (as
    Ollama's): asking the same again must not reload."""

    async def test() -> None:
        starter = FakeStarter()
        s = scheduler(starter)
        for num_ctx, loaded in ((100_000, 8192), (100_000, 8192), (1, 4), (2, 4)):
            lease = await s.acquire(Shape(A, num_ctx=num_ctx), keep_alive=None, context_length=8192)
            assert lease.loaded.num_ctx == loaded
            lease.release()
        assert len(starter.runners) == 2

    run(test)


def test_leaving_out_num_ctx_reloads_a_smaller_size_another_request_asked_for():
    """An embedding call's num_ctx 64 must not cut the next chat, which leaves it out, to 64
    cells: it gets the default context (1024 here), as a load would give it."""

    async def test() -> None:
        starter = FakeStarter()
        s = scheduler(starter)
        lease = await s.acquire(Shape(A, num_ctx=64), keep_alive=None)
        lease.release()
        lease = await s.acquire(Shape(A), keep_alive=None)
        assert len(starter.runners) == 2 and lease.loaded.num_ctx == 1024
        lease.release()
        # a model trained for less than the default: its whole context is what a load gives
        lease = await s.acquire(Shape(B, num_ctx=256), context_length=256, keep_alive=None)
        lease.release()
        lease = await s.acquire(Shape(B), context_length=256, keep_alive=None)
        assert len(starter.runners) == 3 and lease.loaded.num_ctx == 256
        lease.release()

    run(test)


def test_a_reload_waits_for_the_running_requests():
    async def test() -> None:
        starter = FakeStarter()
        s = scheduler(starter, num_parallel=2)
        busy = await s.acquire(Shape(A, num_ctx=2048), keep_alive=None)
        reload = asyncio.ensure_future(s.acquire(Shape(A, num_ctx=512), keep_alive=None))
        await settle()
        assert not reload.done() and starter.runners[0].alive()
        busy.release()
        lease = await reload
        assert lease.loaded.num_ctx == 512 and not starter.runners[0].alive()
        lease.release()

    run(test)


def test_num_ctx_is_cut_to_the_trained_context_and_num_batch_to_num_ctx():
    shape = Defaults(num_ctx=4096, num_batch=512).complete(Shape(A, num_ctx=100_000), 8192)
    assert (shape.num_ctx, shape.num_batch) == (8192, 512)
    shape = Defaults(num_ctx=4096, num_batch=512).complete(Shape(A, num_ctx=128), 8192)
    assert (shape.num_ctx, shape.num_batch) == (128, 128)
    # a request asking num_batch 512 with num_ctx 128 matches what that load gave
    assert Shape(A, num_ctx=128, num_batch=512).matches(shape)
    # as Ollama's scheduler, a num_ctx under 4 loads 4
    shape = Defaults(num_ctx=4096, num_batch=512).complete(Shape(A, num_ctx=1), 8192)
    assert (shape.num_ctx, shape.num_batch) == (4, 4)


def test_keep_alive_zero_unloads_when_the_request_ends():
    async def test() -> None:
        starter = FakeStarter()
        s = scheduler(starter)
        lease = await s.acquire(Shape(A), keep_alive=0)
        assert starter.runners[0].alive()
        lease.release()
        await settle()
        assert not starter.runners[0].alive() and s.running() == []

    run(test)


def test_keep_alive_expires_idle_models_and_negative_keeps_them():
    async def test() -> None:
        starter = FakeStarter()
        s = scheduler(starter, max_loaded=2)
        (await s.acquire(Shape(A), keep_alive=0.05)).release()
        (await s.acquire(Shape(B), keep_alive=math.inf)).release()
        await asyncio.sleep(0.2)
        assert [loaded.shape.model_path for loaded in s.running()] == [B]

    run(test)


def test_a_new_request_cancels_the_expiry_of_an_idle_model():
    async def test() -> None:
        starter = FakeStarter()
        s = scheduler(starter)
        (await s.acquire(Shape(A), keep_alive=0.05)).release()
        lease = await s.acquire(Shape(A), keep_alive=None)
        await asyncio.sleep(0.15)
        assert starter.runners[0].alive() and len(starter.runners) == 1
        lease.release()

    run(test)


def test_a_request_without_keep_alive_leaves_the_models_as_it_was():
    """As Ollama's scheduler: a pin (-1) stays after a request that sets none, and an unload
    asked for (0) while another request runs still happens once the model is idle."""

    async def test() -> None:
        starter = FakeStarter()
        s = scheduler(starter, num_parallel=2)
        (await s.acquire(Shape(A), keep_alive=math.inf)).release()
        (await s.acquire(Shape(A), keep_alive=None)).release()
        assert s.running()[0].keep_alive == math.inf
        busy = await s.acquire(Shape(A), keep_alive=None)
        await s.unload(A)
        assert s.running()[0].expires_at <= time.time()  # /api/ps shows it expiring
        (await s.acquire(Shape(A), keep_alive=None)).release()
        busy.release()
        await settle()
        assert not starter.runners[0].alive() and s.running() == []
        lease = await s.acquire(Shape(A), keep_alive=None)  # a new load: the default
        assert lease.loaded.keep_alive == 300.0
        lease.release()

    run(test)


def test_past_max_loaded_the_idle_model_is_evicted():
    async def test() -> None:
        starter = FakeStarter()
        s = scheduler(starter, max_loaded=1)
        busy = await s.acquire(Shape(A), keep_alive=None)
        other = asyncio.ensure_future(s.acquire(Shape(B), keep_alive=None))
        await settle()
        assert not other.done()  # A is busy: B waits for it
        busy.release()
        lease = await other
        assert not starter.runners[0].alive() and lease.runner is starter.runners[1]
        assert [loaded.shape.model_path for loaded in s.running()] == [B]
        lease.release()

    run(test)


async def a_loaded_while_b_loads(
    **args: Any,
) -> tuple[FakeStarter, Scheduler, asyncio.Event, "asyncio.Future[Any]"]:
    """A loaded and idle, and B's load under way until the returned gate is set."""
    gate = asyncio.Event()
    gate.set()
    starter = FakeStarter(load_gate=gate)
    s = scheduler(starter, **args)
    (await s.acquire(Shape(A), keep_alive=None)).release()
    gate.clear()  # B's load takes its time
    loading = asyncio.ensure_future(s.acquire(Shape(B), keep_alive=None))
    await settle()
    return starter, s, gate, loading


def test_a_load_of_another_model_does_not_hold_up_the_loaded_one():
    # found by the soak: every request waited for the lock while a second model loaded
    async def test() -> None:
        starter, s, gate, loading = await a_loaded_while_b_loads(num_parallel=2)
        lease = await asyncio.wait_for(s.acquire(Shape(A), keep_alive=None), 1)
        assert lease.runner is starter.runners[0] and not loading.done()
        lease.release()
        gate.set()
        (await loading).release()

    run(test)


def test_requests_to_a_model_being_drained_for_an_eviction_wait_behind_it():
    async def test() -> None:
        starter = FakeStarter()
        s = scheduler(starter, max_loaded=1, num_parallel=2)
        busy = await s.acquire(Shape(A), keep_alive=None)
        other = asyncio.ensure_future(s.acquire(Shape(B), keep_alive=None))
        await settle()
        later = asyncio.ensure_future(s.acquire(Shape(A), keep_alive=None))
        await settle()
        assert not later.done()  # A has a free slot, but B waits for A to drain
        busy.release()
        lease = await other
        assert lease.runner is starter.runners[1] and not later.done()
        lease.release()
        (await later).release()
        assert len(starter.runners) == 3

    run(test)


def test_requests_past_the_queue_limit_are_refused():
    async def test() -> None:
        s = scheduler(FakeStarter(), num_parallel=1, max_queue=2)
        running = await s.acquire(Shape(A), keep_alive=None)
        waiting = [asyncio.ensure_future(s.acquire(Shape(A), keep_alive=None)) for _ in range(2)]
        await settle()
        with pytest.raises(QueueFullError, match="maximum pending requests exceeded"):
            await s.acquire(Shape(A), keep_alive=None)
        running.release()
        first = await waiting[0]
        first.release()
        (await waiting[1]).release()

    run(test)


def test_a_dead_runner_is_replaced_by_the_next_request():
    async def test() -> None:
        starter = FakeStarter()
        s = scheduler(starter)
        lease = await s.acquire(Shape(A), keep_alive=None)
        starter.runners[0].is_alive = False  # killed while the request ran
        lease.release()
        await settle()
        assert s.running() == []
        lease = await s.acquire(Shape(A), keep_alive=None)
        assert lease.runner is starter.runners[1]
        lease.release()

    run(test)


def test_a_request_waiting_for_a_slot_of_a_runner_that_dies_gets_the_new_runner():
    # found by the soak: queued requests got the dead runner, then its closed HTTP client
    async def test() -> None:
        starter = FakeStarter()
        s = scheduler(starter)
        running = await s.acquire(Shape(A), keep_alive=None)
        waiting = asyncio.ensure_future(s.acquire(Shape(A), keep_alive=None))
        await settle()
        starter.runners[0].is_alive = False  # killed while one request ran and one waited
        running.release()
        lease = await waiting
        assert lease.runner is starter.runners[1] and lease.runner.alive()
        lease.release()

    run(test)


def test_automatic_parallel_falls_back_when_the_load_does_not_fit():
    async def test() -> None:
        starter = FakeStarter(fits=2)
        s = scheduler(starter, num_parallel=0)
        lease = await s.acquire(Shape(A), keep_alive=None)
        assert lease.loaded.parallel == 2 and len(starter.runners) == 2
        assert not starter.runners[0].alive()
        lease.release()

    run(test)


def test_a_fixed_parallel_that_does_not_fit_fails_with_the_runner_error():
    async def test() -> None:
        s = scheduler(FakeStarter(fits=2), num_parallel=4)
        with pytest.raises(Exception, match="does not fit"):
            await s.acquire(Shape(A), keep_alive=None)
        assert s.running() == []

    run(test)


def test_a_request_cancelled_during_the_load_leaves_the_model_loaded_and_idle():
    async def test() -> None:
        gate = asyncio.Event()
        starter = FakeStarter(load_gate=gate)
        s = scheduler(starter)
        waiting = asyncio.ensure_future(s.acquire(Shape(A), keep_alive=0.05))
        await settle()
        waiting.cancel()  # the client went away
        gate.set()
        await settle()
        [loaded] = s.running()
        assert loaded.refs == 0  # nobody holds it: it expires as usual
        await asyncio.sleep(0.2)
        assert s.running() == [] and not starter.runners[0].alive()

    run(test)


def test_a_request_whose_client_left_while_it_waited_loads_nothing():
    # as Ollama's processPending skips a cancelled request: no eviction, no reload for nobody
    async def test() -> None:
        starter = FakeStarter()
        s = scheduler(starter, max_loaded=1)
        busy = await s.acquire(Shape(A), keep_alive=None)
        other = asyncio.ensure_future(s.acquire(Shape(B), keep_alive=None))
        await settle()
        reload = asyncio.ensure_future(s.acquire(Shape(B, num_ctx=2048), keep_alive=None))
        await settle()
        reload.cancel()  # its client gave up behind B's load
        busy.release()
        (await other).release()
        await settle()
        assert len(starter.runners) == 2  # A, then B: B was not reloaded at 2048
        [loaded] = s.running()
        assert loaded.runner is starter.runners[1] and loaded.num_ctx == 1024

    run(test)


def test_an_unload_does_not_wait_for_another_models_load():
    # `ember stop` sends it; as Ollama's expireRunner it marks the model and answers
    async def test() -> None:
        starter, s, gate, loading = await a_loaded_while_b_loads(max_loaded=2)
        assert await asyncio.wait_for(s.unload(A), 0.5)
        gate.set()
        (await loading).release()
        await settle()
        assert not starter.runners[0].alive() and starter.runners[1].alive()

    run(test)


def test_unload_waits_for_running_requests():
    async def test() -> None:
        starter = FakeStarter()
        s = scheduler(starter)
        assert not await s.unload(A)
        lease = await s.acquire(Shape(A), keep_alive=None)
        assert await s.unload(A)
        assert starter.runners[0].alive()  # still answering its request
        lease.release()
        await settle()
        assert not starter.runners[0].alive()

    run(test)


def test_close_ends_every_runner():
    async def test() -> None:
        starter = FakeStarter()
        s = scheduler(starter, max_loaded=2)
        (await s.acquire(Shape(A), keep_alive=None)).release()
        (await s.acquire(Shape(B), keep_alive=None)).release()
        await s.close()
        assert not any(r.alive() for r in starter.runners)

    run(test)
