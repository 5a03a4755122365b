"""glibc's malloc keeps what a prompt's temporaries free for the next ones (backend/heap.py),
set once a model has loaded, and a large batch gives it back before the head runs."""

import platform
import subprocess
import sys

import pytest

from ember.backend import heap
from ember.batch import Batch
from ember.gguf import GGUFFile
from ember.model import forward, load_model

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")


@glibc
def test_glibc_takes_the_thresholds_once():
    assert heap.keep_freed_memory() and heap.keep_freed_memory()
    assert heap.MMAP_THRESHOLD <= 32 << 20  # glibc refuses more (HEAP_MAX_SIZE / 2)


def test_loading_a_model_sets_it(monkeypatch, tiny_models):
    calls = []
    monkeypatch.setattr(heap, "keep_freed_memory", lambda: calls.append(1) or True)
    load_model(GGUFFile.open(next(iter(tiny_models.values())).path))
    assert calls == [1]


# Run in a fresh process, whose heap has fewer holes than one that has run other tests.
_GIVE_BACK = """
import os, torch
from ember.backend import heap

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)

heap.keep_freed_memory()
temporaries = [torch.ones(1 << 18) for _ in range(128)]  # 128 MiB from the heap
# pins until one lies above them all (the first may fill a hole lower in the heap): the freed
# pieces are then not the heap's top, which free() itself would give back
top, pins = max(t.data_ptr() for t in temporaries), [torch.ones(1 << 14)]
while pins[-1].data_ptr() < top and len(pins) < 4096:
    pins.append(torch.ones(1 << 14))
del temporaries
before = rss_mib()
heap.give_back_freed(heap.LARGE_BATCH - 1)
kept = rss_mib()
heap.give_back_freed(heap.LARGE_BATCH)
print(before - kept, before - rss_mib())
"""


@glibc
def test_a_large_batch_gives_back_what_it_freed():
    run = subprocess.run(
        [sys.executable, "-c", _GIVE_BACK], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    below, large = map(float, run.stdout.split())
    assert below < 16 and large > 96, (below, large)


def test_a_prompt_gives_back_before_the_head(monkeypatch, tiny_models):
    model = load_model(GGUFFile.open(tiny_models["llama"].path))
    events: list[object] = []
    monkeypatch.setattr(heap, "give_back_freed", events.append)
    head = model.logits
    monkeypatch.setattr(model, "logits", lambda h: events.append("head") or head(h))
    for n in (heap.LARGE_BATCH - 1, heap.LARGE_BATCH):
        cache = model.make_cache()
        cache.init(max_sequences=1, capacity=n, max_batch=n)
        forward(model, cache, Batch.single([1] * n, 0))
    assert events == ["head", heap.LARGE_BATCH, "head"]
