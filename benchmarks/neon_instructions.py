"""Instructions the AArch64 copies' dot products execute, counted under qemu-aarch64 (no ARM CPU
is at hand to time them; the count of what one row's dot product runs is the figure an emulator
gives truly).

    .venv/bin/python benchmarks/neon_instructions.py [--row 3072]

For each copy (neon: ARMv8.0 Advanced SIMD; neondot: with the dot product instructions) and
each type, the dot product of one weight row of --row values with one row of activations as the
decode kernels take them (q8_K for the K types: kquants.h; int16 codes per 32 values for the
32-element types: simple.h) is cross-compiled (aarch64-linux-gnu-gcc, the build's flags) and
run under `qemu-aarch64 -cpu max -singlestep -d exec,nochain`, which traces every instruction;
the count without the call is taken away. Printed per block of the type (256 values for the K
types, 32 for the others); also per block and row of x where a call takes two rows
(kq_dot_rows: a down projection's two q8_K passes, or two sequences; em_dots: two sequences),
the weight's block unpacked once for both. Needs `apt-get install gcc-aarch64-linux-gnu qemu-user`.

With --llama-cpp, llama.cpp's own AArch64 dot products (ggml-cpu/arch/arm/quants.c from
llama-cpp-python's source package, the version the Makefile builds, fetched with pip) are
compiled with the same flags for the same two copies and counted the same way, one row of x in
its own rounding (q8_K for the K types, q8_0 or q8_1 for the others).

With --mca, each call's executed instructions (the trace's addresses, disassembled) are also
given, in the order they ran, to llvm-mca (LLVM 19's scheduling models) for real ARM cores:
the neon copies on a Cortex-A53 and a Cortex-A72 (ARMv8.0 without the dot product instructions:
Raspberry Pi 3 and 4), the neondot ones on a Cortex-A55 (in order), a Neoverse N1 (Graviton2,
Ampere Altra; the Cortex-A76 of a Raspberry Pi 5 is its sibling), a Neoverse V1 (Graviton3), a
Neoverse V2 (Graviton4) and an Apple M1. Printed: cycles a block. A model, not a measurement:
every load hits L1, every branch is predicted, calls and returns are left out (the same few in
every column); LLVM's Cortex-A72 model is its Cortex-A57's. Needs llvm-mca-19 (apt-get install
llvm-19).
"""

import argparse
import functools
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

NATIVE = Path(__file__).resolve().parents[1] / "ember" / "backend" / "native"
CC, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"
OBJDUMP, MCA = "aarch64-linux-gnu-objdump", "llvm-mca-19"
FLAGS = ["-O3", "-ffp-contract=off", "-std=gnu11", "-static"]
COPIES = {"neon": [], "neondot": ["-march=armv8.2-a+dotprod"]}
# llvm-mca's CPU models each copy is timed on (--mca): cores without and with the dot product
MCA_CPUS = {
    "neon": ["cortex-a53", "cortex-a72"],
    "neondot": ["cortex-a55", "neoverse-n1", "neoverse-v1", "neoverse-v2", "apple-m1"],
}
# name: (ggml type, block bytes, values a block)
TYPES = {
    "Q2_K": (10, 84, 256),
    "Q3_K": (11, 110, 256),
    "Q4_K": (12, 144, 256),
    "Q5_K": (13, 176, 256),
    "Q6_K": (14, 210, 256),
    "IQ4_XS": (23, 136, 256),
    "Q4_0": (2, 18, 32),
    "Q4_1": (3, 20, 32),
    "Q5_0": (6, 22, 32),
    "Q8_0": (8, 34, 32),
}

# both drivers' weight row and activations (ggml's type numbers: 10-14 Q2_K-Q6_K, 23 IQ4_XS)
ROW_AND_X = """
#include <stdint.h>
#include <stdlib.h>
static uint8_t *weight_row(int type, int bytes, int nb) {
    uint8_t *w = malloc((size_t)bytes * nb);
    srand(1);
    for (int i = 0; i < bytes * nb; i++) w[i] = (uint8_t)rand();
    /* the blocks' f16 scales (d, and dmin or m where there is one) 2^-7: random bytes hold NaNs */
    int at = 0, two = type == 3 || type == 12 || type == 13;
    if (type == 10) at = 80, two = 1;
    if (type == 11) at = 108;
    if (type == 14) at = 208;
    for (int b = 0; b < nb; b++)
        for (int i = 0; i <= two; i++) {
            uint8_t *f16 = w + (size_t)b * bytes + at + 2 * i;
            f16[0] = 0x00, f16[1] = 0x20;
        }
    return w;
}
static float *activations(int n) {
    float *v = malloc(sizeof(float) * n);
    for (int i = 0; i < n; i++) v[i] = rand() / (float)RAND_MAX - 0.5f;
    return v;
}
"""

DRIVER = (
    ROW_AND_X
    + """
#include "kquants.h"
#include "simple.h"
#include <stdlib.h>
__attribute__((noinline)) float dot_row(int type, const uint8_t *w, const void *x, int64_t nb,
                                        int nx, int64_t stride) {
    const kq_block_q8_K *k = x;
    const em_block_q16 *q = x;
    float out[2] = {0.0f, 0.0f}; /* both read at the end: neither call's work is dead code */
    if (nx < 0) { /* two weight rows (stride bytes apart), one row of x: decode's em_dot2_T */
        switch (type) {
        case 2: em_dot2_q4_0(w, stride, q, nb, 0, out); break;
        case 3: em_dot2_q4_1(w, stride, q, nb, 0, out); break;
        case 6: em_dot2_q5_0(w, stride, q, nb, 0, out); break;
        default: em_dot2_q8_0(w, stride, q, nb, 0, out);
        }
        return out[0] + out[1];
    }
    switch (type) {
    case KQ_TYPE_Q4_K: kq_dot_rows_q4_K(w, k, nb, nx, nb, out); break;
    case KQ_TYPE_Q5_K: kq_dot_rows_q5_K(w, k, nb, nx, nb, out); break;
    case KQ_TYPE_Q6_K: kq_dot_rows_q6_K(w, k, nb, nx, nb, out); break;
    case KQ_TYPE_Q2_K: kq_dot_rows_q2_K(w, k, nb, nx, nb, out); break;
    case KQ_TYPE_Q3_K: kq_dot_rows_q3_K(w, k, nb, nx, nb, out); break;
    case KQ_TYPE_IQ4_XS: kq_dot_rows_iq4_xs(w, k, nb, nx, nb, out); break;
    case 2: em_dots_q4_0(w, q, 0, nb, nx, 0, out); break;
    case 3: em_dots_q4_1(w, q, 0, nb, nx, 0, out); break;
    case 6: em_dots_q5_0(w, q, 0, nb, nx, 0, out); break;
    default: em_dots_q8_0(w, q, 0, nb, nx, 0, out);
    }
    return out[0] + out[1];
}
int main(int argc, char **argv) {
    const int type = atoi(argv[1]), bytes = atoi(argv[2]), n = atoi(argv[3]), call = atoi(argv[4]);
    const int nx = atoi(argv[5]); /* rows of x a call takes (1 or 2; -2: two weight rows, one x) */
    const int elems = type >= 10 && type != 20 ? 256 : 32, nb = n / elems;
    uint8_t *w = weight_row(type, bytes, 2 * nb);
    float *v = activations(n);
    void *x;
    if (elems == 256) {
        x = malloc(sizeof(kq_block_q8_K) * nb * 2);
        kq_quantize_row_q8_K(v, x, n);
        kq_quantize_row_q8_K(v, (kq_block_q8_K *)x + nb, n);
    } else {
        x = malloc(sizeof(em_block_q16) * nb * 2);
        em_quantize_row_q16(v, x, nb);
        em_quantize_row_q16(v, (em_block_q16 *)x + nb, nb);
    }
    volatile float s = call ? dot_row(type, w, x, nb, nx, (int64_t)bytes * nb) : 0.0f;
    return s != s; /* a NaN would tell of a bad block */
}
"""
)


LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"  # the Makefile's
LLAMA_DRIVER = (
    ROW_AND_X
    + """
#include "ggml.h"
#include "ggml-common.h"
#include "quants.h"
#include <math.h>
#include <stdlib.h>
float ggml_table_f32_ue4m3[256]; /* for a type not counted here */
void quantize_row_q8_K_ref(const float *x, block_q8_K *y, int64_t k) { /* ggml-quants.c's */
    for (int64_t i = 0; i < k / QK_K; i++, x += QK_K) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK_K; j++)
            if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
        const float iscale = amax ? -127.0f / max : 0.0f;
        for (int j = 0; j < QK_K; j++) {
            const int v = (int)nearbyintf(iscale * x[j]);
            y[i].qs[j] = v > 127 ? 127 : v;
        }
        for (int j = 0; j < QK_K / 16; j++) {
            int sum = 0;
            for (int l = 0; l < 16; l++) sum += y[i].qs[16 * j + l];
            y[i].bsums[j] = sum;
        }
        y[i].d = iscale ? 1 / iscale : 0.0f;
    }
}
typedef void (*dot_fn)(int, float *, size_t, const void *, size_t, const void *, size_t, int);
__attribute__((noinline)) float dot_row(dot_fn f, int n, const void *w, const void *x) {
    float s;
    f(n, &s, 0, w, 0, x, 0, 1);
    return s;
}
int main(int argc, char **argv) {
    const int type = atoi(argv[1]), bytes = atoi(argv[2]), n = atoi(argv[3]), call = atoi(argv[4]);
    const int elems = type >= 10 && type != 20 ? 256 : 32, nb = n / elems;
    uint8_t *w = weight_row(type, bytes, nb);
    float *v = activations(n);
    void *x = malloc(sizeof(block_q8_K) * (n / 256 + 1) + sizeof(block_q8_1) * (n / 32));
    dot_fn f;
    switch (type) {
    case 10: f = ggml_vec_dot_q2_K_q8_K; break;
    case 11: f = ggml_vec_dot_q3_K_q8_K; break;
    case 12: f = ggml_vec_dot_q4_K_q8_K; break;
    case 13: f = ggml_vec_dot_q5_K_q8_K; break;
    case 14: f = ggml_vec_dot_q6_K_q8_K; break;
    case 23: f = ggml_vec_dot_iq4_xs_q8_K; break;
    case 2: f = ggml_vec_dot_q4_0_q8_0; break;
    case 3: f = ggml_vec_dot_q4_1_q8_1; break;
    case 6: f = ggml_vec_dot_q5_0_q8_0; break;
    default: f = ggml_vec_dot_q8_0_q8_0;
    }
    if (elems == 256) quantize_row_q8_K_ref(v, x, n);
    else if (type == 3) quantize_row_q8_1(v, x, n);
    else quantize_row_q8_0(v, x, n);
    volatile float s = call ? dot_row(f, n, w, x) : 0.0f;
    return s != s;
}
"""
)


def llama_cpp_ggml(tmp: Path) -> Path:
    """llama.cpp's ggml folder from llama-cpp-python's source package (pip download)."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
    subprocess.run([*cmd, LLAMA_CPP_PYTHON, "-d", str(tmp)], check=True)
    (sdist,) = tmp.glob("llama_cpp_python-*.tar.gz")
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if "/vendor/llama.cpp/ggml/" in m.name]
        tar.extractall(tmp, members=members, filter="data")
    (ggml,) = tmp.glob("llama_cpp_python-*/vendor/llama.cpp/ggml")
    return ggml


def executed(exe: Path, args: list[str], log: Path) -> int:
    """Instructions the program executed (one traced block each in singlestep mode)."""
    trace(exe, args, log)
    with log.open() as lines:
        return sum(1 for line in lines if line.startswith("Trace"))


def trace(exe: Path, args: list[str], log: Path) -> None:
    cmd = [QEMU, "-cpu", "max", "-singlestep", "-d", "exec,nochain", "-D", str(log), str(exe)]
    subprocess.run(cmd + args, check=True)


BRANCHES = re.compile(r"^(b|b\.\w+|cbn?z|tbn?z|adrp?)$")


@functools.cache
def disassembly(exe: Path) -> dict[int, str]:
    """Each address of exe's code and its instruction, as llvm-mca reads it: objdump's comments
    and symbols dropped, branch targets made one label (llvm-mca does not follow them). Once an
    executable: every type's call runs in the same one."""
    out = subprocess.run(
        [OBJDUMP, "-d", "--no-show-raw-insn", str(exe)], check=True, capture_output=True, text=True
    ).stdout
    code = {}
    for line in out.splitlines():
        if not (m := re.match(r"\s*([0-9a-f]+):\s+(\S.*)$", line)):
            continue
        text = re.sub(r"\s*<[^>]*>", "", m.group(2).split("//")[0]).strip()
        if BRANCHES.match(text.split()[0]):
            text = re.sub(r"\b[0-9a-f]+$", "here", text)
        code[int(m.group(1), 16)] = text
    return code


def call_cycles(exe: Path, args: list[str], log: Path, cpus: list[str]) -> list[float]:
    """llvm-mca's cycles for what dot_row executed (traced), on each CPU model; calls and
    returns left out."""
    trace(exe, args, log)
    code, ran, inside = disassembly(exe), [], False
    with log.open() as lines:
        for line in lines:
            if not line.startswith("Trace"):
                continue
            symbol, pc = line.split()[-1], int(line.split("[")[1].split("/")[1], 16)
            if symbol == "dot_row":
                inside = True
            elif inside and symbol == "main":
                break
            if inside and code[pc].split()[0] not in ("bl", "blr", "ret"):
                ran.append(code[pc])
    asm = log.with_suffix(".s")
    asm.write_text("here:\n" + "\n".join(ran) + "\n")
    cycles = []
    for cpu in cpus:
        cmd = [MCA, "-mtriple=aarch64", f"-mcpu={cpu}", "-iterations=1", str(asm)]
        report = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        cycles.append(float(re.search(r"Total Cycles:\s+(\d+)", report).group(1)))
    return cycles


def build(tmp: Path, with_llama_cpp: bool) -> dict[str, Path]:
    """The drivers, one static executable a copy (and llama.cpp's, when asked)."""
    src = tmp / "driver.c"
    src.write_text(DRIVER)
    exes = {}
    for copy, flags in COPIES.items():
        exes[copy] = tmp / copy
        cmd = [CC, *FLAGS, *flags, f"-I{NATIVE}", str(src), "-o", str(exes[copy]), "-lm"]
        subprocess.run(cmd, check=True, capture_output=True)
    if with_llama_cpp:
        ggml, lsrc = llama_cpp_ggml(tmp), tmp / "llama_driver.c"
        lsrc.write_text(LLAMA_DRIVER)
        includes = [f"-I{ggml / d}" for d in ("include", "src", "src/ggml-cpu")]
        quants = ggml / "src" / "ggml-cpu" / "arch" / "arm" / "quants.c"
        for copy, flags in COPIES.items():
            exe = exes[f"llama.cpp {copy}"] = tmp / f"llama_{copy}"
            cmd = [CC, *FLAGS, *flags, "-D_GNU_SOURCE", *includes, str(lsrc), str(quants)]
            subprocess.run([*cmd, "-o", str(exe), "-lm"], check=True, capture_output=True)
    return exes


# the 32-element types whose decode (one row of x) takes two weight rows a pass (kernels.c's
# em_q16_dot2_of); the others take one
DECODE_PAIRS = {"Q4_0", "Q4_1", "Q5_0"}


def count_table(exes: dict[str, Path], row: int, log: Path) -> None:
    """Instructions a block and row: one row of x (with llama.cpp's), two rows of x a call (x2),
    two weight rows a call (w2: decode, where kernels.c takes it)."""
    print(f"instructions per block, one row of {row} values")
    print(f"{'type':<10}" + "".join(f"{c:>19}" for c in exes))
    for name, (ggml_type, bytes_, elems) in TYPES.items():
        for nx in (1, 2, -2):
            if nx == -2 and name not in DECODE_PAIRS:
                continue
            run = [str(ggml_type), str(bytes_), str(row)]
            per = []
            for column, exe in exes.items():
                if column.startswith("llama.cpp") and nx != 1:
                    per.append(None)  # one row a call (two only with i8mm's mmla)
                    continue
                with_call = executed(exe, [*run, "1", str(nx)], log)
                without = executed(exe, [*run, "0", str(nx)], log)
                per.append((with_call - without) / (row // elems) / abs(nx))
            label = {1: name, 2: f"{name} x2", -2: f"{name} w2"}[nx]
            cells = "".join(f"{'':>19}" if n is None else f"{n:>19.1f}" for n in per)
            print(f"{label:<10}" + cells)


def cycle_table(exes: dict[str, Path], row: int, log: Path) -> None:
    """llvm-mca's cycles a block and weight row as decode runs them (one row of x; Ember's
    DECODE_PAIRS two weight rows a call), Ember's (and llama.cpp's: Ember / llama.cpp)."""
    print(f"\ncycles per block on llvm-mca's CPU models, decode (one row of {row} values)")
    columns = [(copy, cpu) for copy in COPIES for cpu in MCA_CPUS[copy]]
    print(f"{'type':<10}" + "".join(f"{f'{copy} {cpu}':>23}" for copy, cpu in columns))
    for name, (ggml_type, bytes_, elems) in TYPES.items():
        run, blocks = [str(ggml_type), str(bytes_), str(row), "1"], row // elems
        pairs = name in DECODE_PAIRS
        cells = []
        for copy in COPIES:
            ours = call_cycles(exes[copy], [*run, "-2" if pairs else "1"], log, MCA_CPUS[copy])
            theirs = exes.get(f"llama.cpp {copy}")
            peer = call_cycles(theirs, [*run, "1"], log, MCA_CPUS[copy]) if theirs else None
            for i, cycles in enumerate(ours):
                cell = f"{cycles / blocks / (2 if pairs else 1):.1f}"
                cell += f" / {peer[i] / blocks:.1f}" if peer else ""
                cells.append(f"{cell:>23}")
        print(f"{name:<10}" + "".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row", type=int, default=3072, help="values a row (a multiple of 256)")
    parser.add_argument("--llama-cpp", action="store_true", help="llama.cpp's kernels beside")
    parser.add_argument("--mca", action="store_true", help="llvm-mca's cycles on ARM cores too")
    args = parser.parse_args()
    if not (shutil.which(CC) and shutil.which(QEMU)):
        raise SystemExit(f"needs {CC} and {QEMU} (apt-get install gcc-aarch64-linux-gnu qemu-user)")
    if args.mca and not shutil.which(MCA):
        raise SystemExit(f"--mca needs {MCA} (apt-get install llvm-19)")
    with tempfile.TemporaryDirectory() as tmp:
        exes, log = build(Path(tmp), args.llama_cpp), Path(tmp) / "exec.log"
        count_table(exes, args.row, log)
        if args.mca:
            cycle_table(exes, args.row, log)


if __name__ == "__main__":
    main()
