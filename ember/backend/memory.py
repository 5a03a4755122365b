"""The process heap. glibc's malloc serves a large block from its own mapping, but after one is
freed it raises that threshold (up to 32 MiB), so later tensors of a few MiB come from the heap,
where freed ones stay resident: a prefill's per-layer temporaries lifted a 3B model's peak
memory by ~165 MiB. A fixed threshold keeps every block of 1 MiB or more a mapping of its own,
given back to the system when freed (at ~0.1 ms a MiB of page faults when reused: nothing next
to the matmuls that fill it)."""

import ctypes

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
LARGE_BLOCK = 1 << 20


def return_large_blocks() -> bool:
    """Large blocks go back to the system when freed; False where the C library has no mallopt
    (not glibc) or refuses."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, LARGE_BLOCK))
