"""glibc's malloc keeps what a prompt's temporaries free for the next ones (backend/heap.py),
set once a model has loaded."""

import platform

import pytest

from ember.backend import heap
from ember.gguf import GGUFFile
from ember.model import load_model

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
