"""The code pages of torch's libraries that starting up alone read, let go once a model is loaded.

`import torch` runs libtorch's operator registrations, which reads ~57 MB of libtorch_cpu.so's
and libtorch_python.so's code into the process (the Xeon: 45 and 11 MB of their executable
mappings resident after the import). Ember's decode steps run in its own kernels and call few
of torch's operators, so most of those pages stayed mapped unused, a quarter of SmolLM2's peak
RSS. MADV_DONTNEED unmaps them: they are clean pages of the library files, so they stay in the
page cache as any file's (memory the system counts as available and reclaims first), and a
page a later operator runs is mapped again from there (a minor fault, no read). Gemma 3's
`bench_generate.py` worker peaked at 445-447 MB against 498-502 without, its prompt as fast.

Only executable mappings of those libraries with no private pages are advised: a private page
(a debugger's breakpoint) would be lost to MADV_DONTNEED, the file's page mapped in its place.
Nothing happens where /proc or madvise is missing (another system).
"""

import ctypes
from pathlib import Path

from ember.backend.heap import libc_function

MADV_DONTNEED = 4  # linux/mman.h
LIBRARIES = frozenset({"libtorch_cpu.so", "libtorch_python.so", "libtorch.so"})


def clean_code_mappings(smaps: str, names: frozenset[str] = LIBRARIES) -> list[tuple[int, int]]:
    """(start, end) of each executable mapping of a library in `names` that holds no private
    (copied-on-write) page, from a /proc/PID/smaps text."""
    spans: list[tuple[int, int]] = []
    current: tuple[int, int] | None = None
    for line in smaps.splitlines():
        fields = line.split(maxsplit=5)
        if not fields:
            continue
        if fields[0].endswith(":"):  # a field of the mapping above
            if current is not None and fields[0] == "Anonymous:" and fields[1] == "0":
                spans.append(current)
            continue
        current = None  # a mapping's header: "start-end perms offset dev inode [path]"
        if len(fields) == 6 and "x" in fields[1] and Path(fields[5]).name in names:
            start, end = fields[0].split("-")
            current = (int(start, 16), int(end, 16))
    return spans


def let_go() -> int:
    """Unmaps the resident code pages of torch's libraries (see the module's note); the bytes of
    the mappings advised."""
    madvise = libc_function("madvise")
    if madvise is None:
        return 0
    try:
        smaps = Path("/proc/self/smaps").read_text()
    except OSError:
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    advised = 0
    for start, end in clean_code_mappings(smaps):
        if madvise(start, end - start, MADV_DONTNEED) != 0:
            return advised
        advised += end - start
    return advised
