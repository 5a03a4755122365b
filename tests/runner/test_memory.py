"""The load-time reservation: the KV cache allocated at its full size, a batch's activations
counted from the file's tensor shapes (never run), and the count an upper bound of what a
worst-case batch takes, measured by torch's profiler on tiny and real models."""

import platform
import subprocess
import sys
from types import SimpleNamespace

import pytest
from memprofile import worst_case_within_bound

from ember.gguf import GGUFFile
from ember.model import load_model
from ember.runner import memory
from ember.runner.memory import InsufficientMemoryError, reserve


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_the_bound_holds_a_tiny_models_worst_case_batch(tiny_models, arch):
    model = load_model(GGUFFile.open(tiny_models[arch].path))
    measured, bound = worst_case_within_bound(model, num_parallel=2, num_ctx=512, num_batch=128)
    assert 0 < measured <= bound


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2:135m", "gemma3:270m", "qwen2.5-coder:0.5b"])
def test_the_bound_holds_a_real_models_worst_case_batch_at_the_defaults(real_llm, name):
    """num_ctx 4096, num_batch 512, 4 sequences: a full batch over all 16384 cells."""
    model = real_llm(name).model
    measured, bound = worst_case_within_bound(model, num_parallel=4, num_ctx=4096, num_batch=512)
    assert measured <= bound <= 8 * measured  # safe, and not so loose that loads fail for it


def test_reserving_runs_one_token_at_a_time(tiny_models):
    """The worst-case batch is counted, not computed: the dry runs are single tokens."""
    model = load_model(GGUFFile.open(tiny_models["llama"].path))
    sizes = []
    forward = model.forward
    model.forward = lambda batch, cache: sizes.append(len(batch)) or forward(batch, cache)
    cache = model.make_cache()
    kv = reserve(model, cache, num_parallel=2, num_ctx=256, num_batch=64, dtype="f16")
    assert sizes == [1, 1]
    assert kv == cache.nbytes() > 0


def test_a_load_that_does_not_fit_fails_with_what_it_needs(tiny_models, monkeypatch):
    model = load_model(GGUFFile.open(tiny_models["llama"].path))
    free = SimpleNamespace(available=1 << 20)
    monkeypatch.setattr(memory.psutil, "virtual_memory", lambda: free)
    ollamas = r"^model requires more system memory \(.* GiB\) than is available \(0\.0 GiB\): "
    with pytest.raises(InsufficientMemoryError, match=ollamas + "4 × 4096 tokens"):
        reserve(model, model.make_cache(), num_parallel=4, num_ctx=4096, num_batch=512,
                dtype="f16")  # fmt: skip


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's")
def test_freed_heap_blocks_go_back_to_the_system():
    """What a load frees in small blocks (a vocabulary's build) leaves the process's RSS."""
    script = """
from ember.runner.memory import release_free_heap
def anon_kb():
    return int(next(l for l in open("/proc/self/status") if l.startswith("RssAnon")).split()[1])
blocks = [bytearray(4000) for _ in range(50_000)]  # 200 MB of heap blocks, below mmap's threshold
kept = blocks[::16]  # one in 16 stays: the heap cannot shrink from its top
del blocks
before = anon_kb()
release_free_heap()
print((before - anon_kb()) // 1024)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 100  # MB given back, of ~185 MB freed
