"""Worst-case reservation at load: the whole KV cache is allocated, a token runs at the end of a
full context, and what the largest batch needs beside them is checked against free memory, so
that a model that does not fit fails now, with a message, and never mid-request.

The largest batch is counted, not run: on a CPU torch frees a batch's activations as it goes,
so running it held nothing afterwards and cost what a full prompt costs (39 s on a 3B model).
Its bound comes from the file's tensor shapes (ember/model/activations.py); a model without one
(a test's fake) runs its worst-case batch as before."""

import ctypes
import io

import psutil
import torch
from PIL import Image

from ember.batch import Batch
from ember.errors import EmberError
from ember.kvcache import Cache
from ember.model import Model
from ember.model.activations import Activations
from ember.runner.multimodal import ImageModel

_LIBC = ctypes.CDLL(None)  # the process's own symbols: the C library it runs on
_MARGIN = 1.1  # allocator slack, over the KV figure and the bound of a batch's activations


class InsufficientMemoryError(EmberError):
    """The KV cache and compute buffers of a load do not fit in the memory that is free."""


def release_free_heap() -> None:
    """Hands the heap's free pages back to the OS: glibc's malloc_trim (elsewhere nothing).

    A load frees far more than it keeps, in small blocks glibc would otherwise hold for the
    life of the process: after Gemma 3's vocabulary (262,144 tokens, 513,511 derived merges)
    ~70 MB of them, 9% of a runner's peak at its defaults (benchmarks/bench_memory.py)."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)


def gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def reserve(
    model: Model,
    cache: Cache,
    *,
    num_parallel: int,
    num_ctx: int,
    num_batch: int,
    dtype: torch.dtype | str,
    num_outputs: int = 0,
) -> int:
    """Sizes cache for num_parallel sequences of num_ctx tokens, allocates it, and checks that a
    worst-case batch of num_batch tokens over all of it fits beside it, with logits at
    num_outputs of its rows (at least one a sequence; more where drafted tokens are verified).
    Returns the bytes the KV cache takes."""
    if isinstance(model, ImageModel):  # an image's inputs share one batch, even past num_batch:
        # the longest span, as the model declares it (an oblong image's can pass the square's),
        # else a worst-case image's (the vision encoder run once, as Ollama reserves its graph).
        # Declared, the tower is not run at load: Qwen3-VL-2B's at its 2 M pixels takes 98 s
        # on 2 threads (benchmarks/bench_vision.py), its working memory bounded by blocked
        # attention (nn.attention.all_pairs) to its activations, ~130 MB
        longest = getattr(model, "longest_image_span", None)
        if longest is None:
            longest = len(model.image_span(model.encode_multimodal(worst_case_image())).tokens)
        # (a span longer than num_ctx never runs: Qwen 2.5 VL's grows with the image)
        num_batch = max(num_batch, min(longest, num_ctx))
    # Bytes per cell, measured on a small cache of the same model: no per-arch arithmetic (a
    # sliding-window layer's cache holds fewer cells: the cache says how many).
    cache.init(max_sequences=1, capacity=num_batch, max_batch=num_batch, dtype=dtype)
    _run_worst_case(model, cache, 1, end=1, outputs=1)
    kv = cache.planned_bytes(max_sequences=num_parallel, capacity=num_ctx, max_batch=num_batch)
    cells = num_parallel * num_ctx
    mask = num_batch * cells * 4  # the additive mask of a full batch over every cell
    outputs = min(max(num_outputs, num_parallel), num_batch)
    # a batch's logits, and the row each slot keeps after its prompt (InputCache.load)
    logits = (outputs + num_parallel) * model.vocab_size * 4
    bound: Activations | None = getattr(model, "activations", None)
    activations = 0 if bound is None else bound.nbytes(num_batch, cells)
    need = (kv + mask + logits + activations) * _MARGIN
    free = psutil.virtual_memory().available + cache.nbytes()
    what = (  # Ollama's words first: its clients look for them (integration/utils_test.go)
        f"model requires more system memory ({gib(need)}) than is available ({gib(free)}): "
        f"{num_parallel} × {num_ctx} tokens of KV cache ({gib(kv)}) and its compute buffers; "
        "lower num_ctx or the number of parallel requests"
    )
    if need > free:
        raise InsufficientMemoryError(what)
    try:
        cache.init(max_sequences=num_parallel, capacity=num_ctx, max_batch=num_batch, dtype=dtype)
        if bound is None:  # no bound to check: the largest batch over a full context, run
            _run_worst_case(model, cache, num_batch, end=num_ctx, outputs=outputs)
        # One token at the end of a full context: each layer's keys and values are allocated
        # at their full size (and zeroed: the pages are the process's now).
        _run_worst_case(model, cache, 1, end=num_ctx, outputs=1)
    except (RuntimeError, MemoryError) as err:  # torch reports a failed allocation this way
        first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise InsufficientMemoryError(
            f"cannot allocate {num_parallel} × {num_ctx} tokens of KV cache ({gib(kv)}) and "
            f"its compute buffers: {first_line}"
        ) from None
    return cache.nbytes()


def worst_case_image() -> bytes:
    """Ollama's worst-case image: a 2048 × 2048 gray one (a PNG: the formats decoded are
    Ollama's four)."""
    out = io.BytesIO()
    Image.new("L", (2048, 2048), 128).save(out, format="PNG")
    return out.getvalue()


def _run_worst_case(model: Model, cache: Cache, n: int, *, end: int, outputs: int) -> None:
    """A dry-run batch of n tokens at the positions before end, which sees cells [0, end)."""
    batch = Batch(
        tokens=(0,) * n,
        positions=tuple(range(end - n, end)),
        sequences=(0,) * n,
        outputs=tuple(range(n - outputs, n)),
    )
    cache.start_forward(batch, reserve=True)
    with torch.inference_mode():
        model.forward(batch, cache)
