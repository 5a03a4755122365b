"""Builds Ember's native kernels at install (`pip install .`, `pip install -e .`); the package's
metadata is in pyproject.toml.

ember/backend/native/kernels.c is compiled once per ISA with that ISA's flags (generic, avx2,
avxvnni, avx512 and amx on x86-64, neon on AArch64), each copy's exported names ending in its ISA,
and linked with dispatch.c into one shared library, ember/backend/native/_ember_kernels*.so,
that Python loads with ctypes (it has no PyInit). A copy the compiler cannot build is left out;
when nothing builds, the install still succeeds and Ember runs on its pure-PyTorch path.
"""

import platform
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = Path("ember/backend/native")
COMMON = ["-O3", "-fopenmp", "-fPIC", "-fvisibility=hidden", "-ffp-contract=off", "-std=gnu11"]
X86_ISAS = {
    "generic": [],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "avxvnni": ["-mavx2", "-mfma", "-mf16c", "-mavxvnni"],
    "avx512": [
        "-mavx512f",
        "-mavx512bw",
        "-mavx512vl",
        "-mavx512vnni",
        "-mavx2",
        "-mfma",
        "-mf16c",
    ],
}
# avx512's copy with AMX's int8 tiles for several rows of x (amx.h)
X86_ISAS["amx"] = X86_ISAS["avx512"] + ["-mamx-tile", "-mamx-int8"]
# Advanced SIMD is baseline on AArch64; neondot adds the dot product instructions (FEAT_DotProd,
# optional from ARMv8.2, so a CPU with it has v8.2's baseline too: every core since Cortex-A55/A75),
# run where the CPU has them
ARM_ISAS = {"generic": [], "neon": [], "neondot": ["-march=armv8.2-a+dotprod"]}


def isas() -> dict[str, list[str]]:
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64", "i686", "i386"):
        return X86_ISAS
    if machine in ("aarch64", "arm64"):
        return ARM_ISAS
    return {"generic": []}


class BuildKernels(build_ext):
    """build_ext for the kernels library: several objects from one source, one plain .so."""

    def build_extension(self, ext: Extension) -> None:
        if ext.name != "ember.backend.native._ember_kernels":
            super().build_extension(ext)
            return
        try:
            self._build_kernels(ext)
        except Exception as err:  # no compiler, no OpenMP ...: install without the kernels
            # nothing to copy or install for it (editable installs copy every extension built)
            self.extensions = [e for e in self.extensions if e is not ext]
            self.distribution.ext_modules = [
                e for e in self.distribution.ext_modules or [] if e is not ext
            ]
            self.warn(
                f"Ember's native kernels were not built ({err}); Ember will run on its "
                "pure-PyTorch path"
            )

    def _build_kernels(self, ext: Extension) -> None:
        from setuptools.errors import CompileError

        temp = Path(self.build_temp) / "ember_kernels"
        objects, built = [], []
        for isa, flags in isas().items():
            try:
                objects += self.compiler.compile(
                    [str(NATIVE / "kernels.c")],
                    output_dir=str(temp / isa),
                    macros=[("EMBER_ISA", isa)]
                    + ([("EMBER_PORTABLE", "1")] if isa == "generic" else []),
                    include_dirs=[str(NATIVE)],
                    extra_postargs=COMMON + flags,
                    depends=[str(p) for p in NATIVE.glob("*.h")],
                )
                built.append(isa)
            except CompileError as err:
                if isa == "generic":
                    raise
                self.warn(f"the {isa} kernels were not built: {err}")
        macros = [(f"EMBER_HAS_{isa.upper()}", "1") for isa in built if isa != "generic"]
        objects += self.compiler.compile(
            [str(NATIVE / "dispatch.c")],
            output_dir=str(temp / "dispatch"),
            macros=macros,
            extra_postargs=COMMON,
        )
        target = self.get_ext_fullpath(ext.name)
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        self.compiler.link_shared_object(
            objects,
            target,
            libraries=["m"],
            extra_postargs=["-fopenmp", "-shared"],
            target_lang="c",
        )
        print(f"Ember's native kernels: {', '.join(built)} -> {target}", file=sys.stderr)


setup(
    ext_modules=[Extension("ember.backend.native._ember_kernels", sources=[])],
    cmdclass={"build_ext": BuildKernels},
)
