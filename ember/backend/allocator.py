"""glibc's malloc policy for a model's batches. By default glibc raises its mmap threshold to
the largest block freed so far (up to 32 MiB), so after a prompt's first batch its activations
come from the heap, whose freed pieces stay in the process: the 3B file's peak RSS was ~120 MiB
higher for it (`benchmarks/bench_generate.py`, 2,364-2,469 MiB against 2,240-2,251 with the
threshold fixed at 4 MiB). A fixed threshold gives every large block back when it is freed."""

import ctypes
import os
import platform

MMAP_THRESHOLD = 4 << 20
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)


def return_large_blocks() -> bool:
    """Fixes glibc's mmap threshold at MMAP_THRESHOLD, unless the user set one
    (MALLOC_MMAP_THRESHOLD_); whether it was set. Elsewhere than glibc: nothing."""
    if platform.libc_ver()[0] != "glibc" or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
