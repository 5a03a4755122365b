"""The NEON copies of the kernels (neon; neondot, with the dot product instructions), built with
a cross compiler and run under qemu-aarch64 (skipped where those tools are missing: `apt-get
install gcc-aarch64-linux-gnu qemu-user`). They must give the same bits as the portable copy for
every type, and match a float64 product of the dequantized weights (tests/backend/
neon_harness.c); dispatch.c must pick neondot on a CPU with the instructions and neon on one
without."""

import subprocess
from pathlib import Path

import pytest
from aarch64 import BEST, CC, CPUS, QEMU, compile_objects, tools


@pytest.mark.slow
@pytest.mark.skipif(not tools(), reason=f"needs {CC} and {QEMU}")
def test_neon_kernels_under_qemu(tmp_path: Path) -> None:
    exe = tmp_path / "harness"
    harness = str(Path(__file__).with_name("neon_harness.c"))
    objects = [str(obj) for obj in compile_objects(tmp_path)]
    link = [CC, "-O2", "-static", "-fopenmp", harness, *objects, "-o", str(exe), "-lm"]
    subprocess.run(link, check=True, capture_output=True)
    for cpu, isa in CPUS.items():
        run = subprocess.run(
            [QEMU, "-cpu", cpu, str(exe)], capture_output=True, text=True, timeout=300
        )
        lines = run.stdout.strip().splitlines()
        assert run.returncode == 0 and lines[-1] == "OK", run.stdout
        assert lines[-2] == f"best {BEST[isa]}", run.stdout
        assert ("neondot passes" in run.stdout) == (isa == "neondot"), run.stdout
