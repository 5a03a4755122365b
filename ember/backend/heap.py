"""glibc's malloc, set to keep the memory a prompt's temporaries free for the next ones.

A prompt's layers each make and free the same large tensors (activations of T rows, weight
rows expanded to float32). glibc maps an allocation at or above its mmap threshold afresh, and
gives back the top of its heap once more than its trim threshold is free there; both move with
what was freed before (the threshold rises to the largest mapped block freed, up to 32 MiB).
So whether a layer's tensors reuse the last layer's pages or fault in new ones (4 KiB each,
zeroed) hung on the order of earlier events: Qwen 0.5B's 512-token prompt took 32-43 thousand
page faults, or 120-133 thousand once its largest temporary (the whole gate/up product) was
gone. With the thresholds fixed after the load, the first 512-token prompt of SmolLM2, Gemma 3
and Qwen 0.5B takes 12.8, 17 and 19.6 thousand (48, 28-47 and 42-43 thousand before) and runs
1-28% faster (a Zen 5 EPYC, 2 threads). Blocks of 16 MiB and more (a 3B model's T x F
activations, its down projection's expanded rows) are still mapped and given back at once:
kept, they grew the heap by ~50 MB more at a 3B-shaped model's prompt (peak RSS 2,382 MiB
against 2,291-2,341). The price: SmolLM2's peak RSS is ~12 MB higher (385-387 MB, 374-375).

What a large batch freed is given back once its layers are done, before the head reads its
weights: the first prompt is when the head first reads a tied embedding table (a 3B model's is
308 MiB), and the freed heap was then 75-183 MB over it. With the trim the 3B-shaped file's
peak RSS after a 512-token prompt was 2,258-2,259 MiB against 2,319-2,335 (two alternations);
the trim took 6-9 ms. The next prompt's first layer faults its pages in again, as the first
prompt's did.
"""

import ctypes
import ctypes.util
import functools
from typing import Any

MMAP_THRESHOLD = 16 << 20
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # as glibc pairs them when it raises the threshold itself
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # malloc.h
LARGE_BATCH = 128  # tokens of a forward pass whose freed temporaries are given back after it


@functools.cache
def libc_function(name: str) -> Any:
    """libc's function `name`, or None where this C library lacks it (macOS's has no mallopt)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


@functools.cache
def keep_freed_memory() -> bool:
    """Sets glibc's thresholds once per process; False where malloc is not glibc's."""
    mallopt = libc_function("mallopt")
    if mallopt is None:  # its malloc as it is
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


def give_back_freed(tokens: int) -> None:
    """After the layers of a forward pass of `tokens`: a large batch's freed heap goes back to
    the system (glibc's malloc_trim: the free pages anywhere in its heaps, not just the top)."""
    if tokens >= LARGE_BATCH and (trim := libc_function("malloc_trim")) is not None:
        trim(ctypes.c_size_t(0))
