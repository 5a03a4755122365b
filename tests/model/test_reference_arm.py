"""The real-model reference tests (test_reference.py) on AArch64, under qemu-aarch64's user-mode
emulation: an AArch64 Python with AArch64 wheels (.venv-arm, built by .ci/arm-env) loads the
kernels' AArch64 library, cross-compiled here from the checkout's sources, and runs the same
tests, on an emulated A64FX (ARMv8.2 without the Advanced SIMD dot product instructions: the neon
copy; torch's AArch64 wheel needs v8.2, so not the harness's Cortex-A72) and on qemu's "max" CPU
(with them: neondot). No ARM CPU is at hand; this is how the NEON copies are checked
end to end on real models. Emulation is ~100x slower than the host, so a subset runs: one prompt
of SmolLM2 and one of Qwen2.5-Coder 0.5B on both CPUs, and Gemma 3's two short ones on neondot
(its long prompt, past the sliding window, took over 15 minutes there)."""

import os
import subprocess
from pathlib import Path

import pytest
from aarch64 import CC, QEMU, ROOT, build_library, tools

ENV = ROOT / ".venv-arm"
PYTHON = ENV / "sysroot" / "usr" / "bin" / "python3.11"
# the qemu CPUs and the copy each picks
PICKS = {"a64fx": "neon", "max": "neondot"}
# (qemu CPU, test_reference.py's cases as -k selects them, how many)
ONE_EACH = "smollm2:135m-raw_cap or qwen2.5-coder:0.5b-raw_cap"
GEMMA3_SHORT = "gemma3 and not long and not and_red"
RUNS = [
    # a model's prompts take the same kernels: one each of SmolLM2 and Qwen (for time)
    pytest.param("a64fx", f"test_matches_reference and ({ONE_EACH})", 2, id="neon"),
    # and Gemma 3's two short ones; its 26-token chat (chat_sky_blue_and_red) left out for
    # time, as its long prompt
    pytest.param(
        "max", f"test_matches_reference and ({ONE_EACH} or ({GEMMA3_SHORT}))", 4, id="neondot"
    ),
]

pytestmark = [
    pytest.mark.model,
    pytest.mark.slow,
    pytest.mark.skipif(not tools(), reason=f"needs {CC} and {QEMU}"),
    pytest.mark.skipif(not PYTHON.is_file(), reason="needs .venv-arm (built by .ci/arm-env)"),
]


@pytest.fixture(scope="module")
def arm_library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_library(tmp_path_factory.mktemp("aarch64"))


def emulated(cpu: str, *args: str, timeout: int) -> subprocess.CompletedProcess[str]:
    """The AArch64 Python on the emulated cpu, in the checkout, with .venv-arm's packages."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/root"),  # the catalog's assembled multi-part models
        "PYTHONPATH": f"{ROOT}:{ENV / 'site'}",
        "OMP_NUM_THREADS": "2",
    }
    cmd = [QEMU, "-cpu", cpu, "-L", str(ENV / "sysroot"), str(PYTHON), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


# the library and copy picked, then the tests, in one process: torch's import alone takes ~30 s
# under emulation
PICKS_THEN_PYTEST = """import sys, pytest
from ember.backend import native as n
print(n.library_path().name, n.kernels().isa, flush=True)
sys.exit(pytest.main(sys.argv[1:]))"""


@pytest.mark.parametrize(("cpu", "selection", "count"), RUNS)
def test_reference_under_qemu(arm_library: Path, cpu: str, selection: str, count: int) -> None:
    tests = ["-p", "no:cacheprovider", "-q", "tests/model/test_reference.py", "-k", selection]
    run = emulated(cpu, "-c", PICKS_THEN_PYTEST, *tests, timeout=1500)
    picked, _, report = run.stdout.partition("\n")
    assert picked.split() == [arm_library.name, PICKS[cpu]], run.stdout[-3000:] + run.stderr
    assert run.returncode == 0, report[-6000:] + run.stderr[-2000:]
    assert f"{count} passed" in report, report[-3000:]
