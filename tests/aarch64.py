"""The kernels' AArch64 copies cross-compiled for the tests that run them under qemu-aarch64
(tests/backend/test_native_neon.py, tests/model/test_reference_arm.py): kernels.c once per copy
(generic, neon, neondot) and dispatch.c, with setup.py's flags. Needs `apt-get install
gcc-aarch64-linux-gnu qemu-user`."""

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[1]
NATIVE = ROOT / "ember" / "backend" / "native"
CC, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"
FLAGS = ["-O3", "-fopenmp", "-fPIC", "-fvisibility=hidden", "-ffp-contract=off", "-std=gnu11"]
COPIES = {"generic": ["-DEMBER_PORTABLE=1"], "neon": [], "neondot": ["-march=armv8.2-a+dotprod"]}
# dispatch.c's numbers of the ISAs dispatch picks (ember/backend/native/__init__.py)
BEST = {"neon": 4, "neondot": 6}
# qemu CPUs and the copy each runs: Cortex-A72 (ARMv8.0) has no sdot, qemu's "max" has it
CPUS = {"cortex-a72": "neon", "max": "neondot"}


def tools() -> bool:
    return bool(shutil.which(CC) and shutil.which(QEMU))


def compile_objects(out: Path) -> list[Path]:
    """The three copies' objects and dispatch.c's, compiled side by side into out."""
    jobs = []
    for isa, extra in COPIES.items():
        obj = out / f"kernels_{isa}.o"
        src = NATIVE / "kernels.c"
        cmd = [CC, *FLAGS, f"-DEMBER_ISA={isa}", *extra, "-c", str(src), "-o", str(obj)]
        jobs.append((obj, subprocess.Popen(cmd)))
    dispatch = out / "dispatch.o"
    has = [f"-DEMBER_HAS_{isa.upper()}=1" for isa in COPIES if isa != "generic"]
    cmd = [CC, *FLAGS, *has, "-c", str(NATIVE / "dispatch.c"), "-o", str(dispatch)]
    jobs.append((dispatch, subprocess.Popen(cmd)))
    for obj, job in jobs:
        assert job.wait() == 0, f"{CC} failed for {obj.name}"
    return [obj for obj, _ in jobs]


def build_library(out: Path) -> Path:
    """The shared library setup.py would build on AArch64, beside the x86 one in the package
    (the loader picks the one of its own interpreter's suffix)."""
    target = NATIVE / "_ember_kernels.cpython-311-aarch64-linux-gnu.so"
    cmd = [CC, "-shared", "-fopenmp", *map(str, compile_objects(out)), "-lm", "-o", str(target)]
    subprocess.run(cmd, check=True)
    return target
