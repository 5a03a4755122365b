"""The coverage-guided fuzz of the GGUF reader (atheris, in a child process, ~60 s; slow tests)
over tiny generated files and the first 64 KB of a real model, and the replay of every input it
ever crashed on (fuzz_corpus/, kept in the repository)."""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from gguf_bytes import valid_builder, write_with_gguf_py
from gguf_fuzz_target import read_any

from ember.catalog import resolve_model
from ember.errors import ModelNotFoundError

HERE = Path(__file__).parent
CORPUS = HERE / "fuzz_corpus"
FUZZ_SECONDS = 60
ARTIFACTS = ("crash-", "timeout-", "oom-", "leak-", "slow-unit-")


def corpus() -> list[Path]:
    return sorted(p for p in CORPUS.iterdir() if p.name.startswith(ARTIFACTS))


def test_every_input_the_fuzz_crashed_on_now_parses_or_raises_gguf_error() -> None:
    for path in corpus():
        start = time.perf_counter()
        read_any(path.read_bytes())
        assert time.perf_counter() - start < 1.0, path.name


def seeds(folder: Path) -> Path:
    folder.mkdir()
    (folder / "crafted.gguf").write_bytes(valid_builder().build())
    with tempfile.TemporaryDirectory() as tmp:
        written = Path(tmp) / "written.gguf"
        write_with_gguf_py(str(written))
        shutil.copy(written, folder / "written.gguf")
    try:  # a real header: SmolLM2's metadata and vocabulary, cut
        with resolve_model("smollm2:135m").open("rb") as f:
            (folder / "smollm2-head.gguf").write_bytes(f.read(64 * 1024))
    except ModelNotFoundError:
        pass
    for crash in corpus():
        shutil.copy(crash, folder / crash.name)
    return folder


@pytest.mark.slow
def test_coverage_guided_fuzz_of_the_reader_finds_no_crash_hang_or_huge_allocation(tmp_path):
    pytest.importorskip("atheris")
    work = tmp_path / "corpus"
    work.mkdir()
    command = [
        sys.executable,
        str(HERE / "fuzz_gguf_reader.py"),
        f"-max_total_time={FUZZ_SECONDS}",
        "-timeout=5",  # seconds for one input: a hang
        "-rss_limit_mb=0",  # a huge allocation is the script's own limit (its docstring: why)
        f"-artifact_prefix={tmp_path}/",
        "-print_final_stats=1",
        str(work),
        str(seeds(tmp_path / "seeds")),
    ]
    path = os.pathsep.join([str(HERE), str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=FUZZ_SECONDS + 120
    )
    found = [p for p in tmp_path.iterdir() if p.name.startswith(ARTIFACTS)]
    for artifact in found:  # kept, so the replay above holds the reader to it from now on
        shutil.copy(artifact, CORPUS / artifact.name)
    report = done.stderr[done.stderr.find("Uncaught") :][:3000] or done.stderr[-3000:]
    assert not found and done.returncode == 0, f"{[p.name for p in found]}: {report}"
    runs = [line for line in done.stderr.splitlines() if "stat::number_of_executed_units" in line]
    print(runs[-1] if runs else done.stderr[-500:])
