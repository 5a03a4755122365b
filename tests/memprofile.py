"""The peak of torch's CPU allocations while a function runs, from the profiler's record of
every allocation (the running total the allocator reports with each); and that peak for a
model's worst-case batch beside the bound the load-time reservation counts for it."""

from collections.abc import Callable

from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile

from ember.model import Model
from ember.runner import memory


def peak_bytes(fn: Callable[[], object]) -> int:
    """The most bytes fn's allocations held at once, over what was allocated when it began."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    allocations = []
    todo = list(prof.profiler.kineto_results.experimental_event_tree())
    while todo:
        event = todo.pop()
        if event.tag == _EventType.Allocation:
            allocations.append(event)
        todo.extend(event.children)
    if not allocations:
        return 0
    first = min(allocations, key=lambda e: e.start_time_ns).extra_fields
    most = max(e.extra_fields.total_allocated for e in allocations)
    return most - (first.total_allocated - first.alloc_size)


def worst_case_within_bound(
    model: Model, *, num_parallel: int, num_ctx: int, num_batch: int
) -> tuple[int, int]:
    """(measured, bound) bytes of a batch of num_batch tokens that sees every cell of a cache
    reserved for num_parallel × num_ctx, logits at one row a sequence."""
    cache = model.make_cache()
    memory.reserve(model, cache, num_parallel=num_parallel, num_ctx=num_ctx,
                   num_batch=num_batch, dtype="f16")  # fmt: skip
    cells = num_parallel * num_ctx

    def run() -> None:
        memory._run_worst_case(model, cache, num_batch, end=cells, outputs=num_parallel)

    measured = peak_bytes(run)
    logits = num_parallel * model.vocab_size * 4
    return measured, model.activations.nbytes(num_batch, cells) + logits  # type: ignore[attr-defined]
