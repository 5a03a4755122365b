"""Loading a model lets go of torch's start-up code pages (backend/startup_pages.py): only clean
executable mappings of torch's libraries, and torch runs as before once they are gone."""

import sys
from pathlib import Path

import pytest
import torch

from ember.backend import startup_pages
from ember.gguf import GGUFFile
from ember.model import load_model

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps")

SMAPS = """\
7f0000000000-7f0000400000 r--p 00000000 08:01 11 /venv/torch/lib/libtorch_cpu.so
Rss:                1024 kB
Anonymous:             0 kB
7f0000400000-7f0002000000 r-xp 00400000 08:01 11 /venv/torch/lib/libtorch_cpu.so
Rss:               40000 kB
Anonymous:             0 kB
7f0002000000-7f0002100000 r-xp 00000000 08:01 12 /venv/torch/lib/libtorch_python.so
Rss:                 100 kB
Anonymous:             8 kB
7f0003000000-7f0003100000 r-xp 00000000 08:01 13 /usr/lib/libc.so.6
Rss:                 900 kB
Anonymous:             0 kB
7f0004000000-7f0004100000 r-xp 00000000 08:01 14 /tmp/libtorch_cpu.so.bak
Anonymous:             0 kB
7f0005000000-7f0005100000 rw-p 00000000 00:00 0
Anonymous:             0 kB
7f0006000000-7f0006200000 r-xp 00000000 08:01 15 /venv/torch/lib/libtorch.so
Anonymous:             0 kB
"""


def test_only_clean_code_of_torchs_libraries_is_chosen():
    assert startup_pages.clean_code_mappings(SMAPS) == [
        (0x7F0000400000, 0x7F0002000000),  # code; not its read-only data, nor a written page's
        (0x7F0006000000, 0x7F0006200000),
    ]


def resident_code_kib() -> int:
    """KiB of torch's libraries' executable mappings resident in this process."""
    total, counting = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if not fields[0].endswith(":"):
            counting = len(fields) == 6 and "x" in fields[1]
            counting = counting and Path(fields[5]).name in startup_pages.LIBRARIES
        elif counting and fields[0] == "Rss:":
            total += int(fields[1])
    return total


@linux
def test_torch_runs_on_once_its_pages_are_let_go():
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    expected = torch.softmax(x @ x.T, dim=-1).sum(0)
    before = resident_code_kib()
    assert startup_pages.let_go() > 0
    assert resident_code_kib() < before / 2, (resident_code_kib(), before)
    assert torch.equal(torch.softmax(x @ x.T, dim=-1).sum(0), expected)  # mapped again


def test_loading_a_model_lets_them_go(monkeypatch, tiny_models):
    calls = []
    monkeypatch.setattr(startup_pages, "let_go", lambda: calls.append(1) or 0)
    load_model(GGUFFile.open(next(iter(tiny_models.values())).path))
    assert calls == [1]
