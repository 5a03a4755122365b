"""Where compute runs. OpenMP (torch's and our kernels') keeps a team of worker threads for each
thread that has started parallel work, for as long as that thread lives. With two such threads
alive on few cores, libgomp sees more threads than CPUs and stops spinning between parallel
regions: every small kernel then waits for a wake-up, and decode runs at half speed (measured:
SmolLM2 14 ms a token from one thread, 30 ms when the model was loaded by another that lives
on). So one thread does a model's compute, and work done before it (loading) runs on a thread
that ends with it."""

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def in_fresh_thread(fn: Callable[[], T]) -> T:
    """fn() on a new thread that ends when fn returns; its result, or its exception."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as err:  # handed to the caller's thread
            box["error"] = err

    thread = threading.Thread(target=run, name="ember-load")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]
