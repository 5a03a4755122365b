"""glibc's mmap threshold, fixed when a model loads so that a batch's large activations go back
to the system when freed; a threshold the user set is left alone."""

import platform
import subprocess
import sys

import pytest

from ember.backend import allocator

needs_glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")

# A fresh process: a 24 MiB block made and freed twice. Under glibc's dynamic threshold the
# first free raises the threshold past 24 MiB, so the second block comes from the heap and stays
# resident after its free; with the threshold fixed both are unmapped. Prints the RSS the second
# block leaves behind, in MiB.
PROBE = """
import sys, torch
from ember.backend.allocator import return_large_blocks
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 >> 20
if sys.argv[1] == "fixed":
    return_large_blocks()
torch.ones(3 << 20, dtype=torch.float64).sum()
before = rss()
torch.ones(3 << 20, dtype=torch.float64).sum()
print(rss() - before)
"""


def resident_after_free(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True
    )
    return int(out.stdout.strip().splitlines()[-1])


@needs_glibc
def test_a_freed_large_block_leaves_the_process_once_the_threshold_is_fixed():
    assert resident_after_free("dynamic") >= 20  # kept by the heap: the problem
    assert resident_after_free("fixed") <= 2


@needs_glibc
def test_a_threshold_the_user_set_is_kept(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "131072")
    assert allocator.return_large_blocks() is False
