"""The heap setting a model load makes (ember/backend/memory.py)."""

import platform
from pathlib import Path

import pytest
import torch

from ember.backend.memory import return_large_blocks


def resident_mib() -> float:
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_a_freed_large_tensor_goes_back_to_the_system() -> None:
    assert return_large_blocks()
    # glibc's default would serve the later ones from the heap (its threshold raised by the
    # first free) and keep them resident once freed
    for _ in range(3):
        t = torch.ones(2 << 20)  # 8 MiB, touched
        del t
    before = resident_mib()
    t = torch.ones(2 << 20)
    during = resident_mib()
    del t
    after = resident_mib()
    assert during > before + 7
    assert after < before + 2
