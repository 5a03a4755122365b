"""GGUFFile.release_view: the pages of a view of the file stop counting in this process."""

import os

import gguf
import numpy as np

from ember.gguf import GGUFFile


def _rss_kib_of(path: str) -> int:
    """Resident KiB of this process's mappings of `path` (/proc/self/smaps)."""
    total, current = 0, None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
                current = head[-1] if len(head) >= 6 else None
            elif head[0] == "Rss:" and current == path:
                total += int(head[1])
    return total


def test_a_released_view_leaves_the_process_and_reads_the_same(tmp_path):
    path = str(tmp_path / "big.gguf")
    w = gguf.GGUFWriter(path, "llama")
    values = np.arange(1 << 21, dtype=np.float32)  # 8 MiB
    w.add_tensor("big.weight", values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    f = GGUFFile.open(path)
    view = f.raw("big.weight")
    assert int(view[::4096].astype(np.int64).sum()) >= 0  # every page touched
    real = os.path.realpath(path)
    assert _rss_kib_of(real) >= 8 << 10
    f.release_view(np.arange(4, dtype=np.uint8))  # not the file's: nothing
    assert _rss_kib_of(real) >= 8 << 10
    f.release_view(view[1000:])  # the whole pages inside it
    assert _rss_kib_of(real) < 64
    assert np.array_equal(view.view(np.float32), values)  # read again from the file
