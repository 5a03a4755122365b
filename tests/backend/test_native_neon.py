"""The NEON copies of the kernels (neon; neondot, with the dot product instructions), built with
a cross compiler and run under qemu-aarch64 (skipped where those tools are missing: `apt-get
install gcc-aarch64-linux-gnu qemu-user`). They must give the same bits as the portable copy for
every type, and match a float64 product of the dequantized weights (tests/backend/
neon_harness.c); dispatch.c must pick neondot on a CPU with the instructions and neon on one
without."""

import shutil
import subprocess
from pathlib import Path

import pytest

NATIVE = Path(__file__).parents[2] / "ember" / "backend" / "native"
CC, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"
FLAGS = ["-O3", "-fopenmp", "-fPIC", "-fvisibility=hidden", "-ffp-contract=off", "-std=gnu11"]


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which(CC) and shutil.which(QEMU)), reason=f"needs {CC} and {QEMU}")
def test_neon_kernels_under_qemu(tmp_path: Path) -> None:
    objects = []
    copies = (("generic", ["-DEMBER_PORTABLE=1"]), ("neon", []))
    for isa, extra in (*copies, ("neondot", ["-march=armv8.2-a+dotprod"])):
        obj = tmp_path / f"kernels_{isa}.o"
        src = str(NATIVE / "kernels.c")
        subprocess.run([CC, *FLAGS, f"-DEMBER_ISA={isa}", *extra, "-c", src, "-o", obj], check=True)
        objects.append(obj)
    dispatch = tmp_path / "dispatch.o"
    src = str(NATIVE / "dispatch.c")
    has = ["-DEMBER_HAS_NEON=1", "-DEMBER_HAS_NEONDOT=1"]
    subprocess.run([CC, *FLAGS, *has, "-c", src, "-o", dispatch], check=True)
    exe = tmp_path / "harness"
    harness = str(Path(__file__).with_name("neon_harness.c"))
    link = [CC, "-O2", "-static", "-fopenmp", harness, *objects, dispatch, "-o", exe, "-lm"]
    subprocess.run(link, check=True, capture_output=True)
    # Cortex-A72 (ARMv8.0) has no sdot; qemu's "max" CPU has it
    for cpu, best in (("cortex-a72", 4), ("max", 6)):
        run = subprocess.run(
            [QEMU, "-cpu", cpu, str(exe)], capture_output=True, text=True, timeout=300
        )
        lines = run.stdout.strip().splitlines()
        assert run.returncode == 0 and lines[-1] == "OK", run.stdout
        assert lines[-2] == f"best {best}", run.stdout
        assert ("neondot passes" in run.stdout) == (best == 6), run.stdout
