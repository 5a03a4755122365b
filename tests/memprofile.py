"""The peak of torch's CPU allocations while a function runs, from the profiler's record of
every allocation (the running total the allocator reports with each)."""

from collections.abc import Callable

from torch._C._profiler import _EventType
from torch.profiler import ProfilerActivity, profile


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
