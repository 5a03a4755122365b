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
"""

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

NATIVE = Path(__file__).resolve().parents[1] / "ember" / "backend" / "native"
CC, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"
FLAGS = ["-O3", "-ffp-contract=off", "-std=gnu11", "-static"]
COPIES = {"neon": [], "neondot": ["-march=armv8.2-a+dotprod"]}
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
                                        int nx) {
    const kq_block_q8_K *k = x;
    const em_block_q16 *q = x;
    float out[2];
    switch (type) {
    case KQ_TYPE_Q4_K: kq_dot_rows_q4_K(w, k, nb, nx, nb, out); return out[0];
    case KQ_TYPE_Q5_K: kq_dot_rows_q5_K(w, k, nb, nx, nb, out); return out[0];
    case KQ_TYPE_Q6_K: kq_dot_rows_q6_K(w, k, nb, nx, nb, out); return out[0];
    case KQ_TYPE_Q2_K: kq_dot_rows_q2_K(w, k, nb, nx, nb, out); return out[0];
    case KQ_TYPE_Q3_K: kq_dot_rows_q3_K(w, k, nb, nx, nb, out); return out[0];
    case KQ_TYPE_IQ4_XS: kq_dot_rows_iq4_xs(w, k, nb, nx, nb, out); return out[0];
    case 2: em_dots_q4_0(w, q, 0, nb, nx, 0, out); return out[0];
    case 3: em_dots_q4_1(w, q, 0, nb, nx, 0, out); return out[0];
    case 6: em_dots_q5_0(w, q, 0, nb, nx, 0, out); return out[0];
    default: em_dots_q8_0(w, q, 0, nb, nx, 0, out); return out[0];
    }
}
int main(int argc, char **argv) {
    const int type = atoi(argv[1]), bytes = atoi(argv[2]), n = atoi(argv[3]), call = atoi(argv[4]);
    const int nx = atoi(argv[5]); /* rows of x a call takes (1 or 2) */
    const int elems = type >= 10 && type != 20 ? 256 : 32, nb = n / elems;
    uint8_t *w = weight_row(type, bytes, nb);
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
    volatile float s = call ? dot_row(type, w, x, nb, nx) : 0.0f;
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
    cmd = [QEMU, "-cpu", "max", "-singlestep", "-d", "exec,nochain", "-D", str(log), str(exe)]
    subprocess.run(cmd + args, check=True)
    with log.open() as lines:
        return sum(1 for line in lines if line.startswith("Trace"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row", type=int, default=3072, help="values a row (a multiple of 256)")
    parser.add_argument("--llama-cpp", action="store_true", help="llama.cpp's kernels beside")
    args = parser.parse_args()
    if not (shutil.which(CC) and shutil.which(QEMU)):
        raise SystemExit(f"needs {CC} and {QEMU} (apt-get install gcc-aarch64-linux-gnu qemu-user)")
    print(f"instructions per block, one row of {args.row} values")
    columns = [*COPIES, *(f"llama.cpp {c}" for c in COPIES if args.llama_cpp)]
    print(f"{'type':<10}" + "".join(f"{c:>19}" for c in columns))
    with tempfile.TemporaryDirectory() as tmp:
        src, log = Path(tmp) / "driver.c", Path(tmp) / "exec.log"
        src.write_text(DRIVER)
        exes = {}
        for copy, flags in COPIES.items():
            exes[copy] = Path(tmp) / copy
            cmd = [CC, *FLAGS, *flags, f"-I{NATIVE}", str(src), "-o", str(exes[copy]), "-lm"]
            subprocess.run(cmd, check=True, capture_output=True)
        if args.llama_cpp:
            ggml, lsrc = llama_cpp_ggml(Path(tmp)), Path(tmp) / "llama_driver.c"
            lsrc.write_text(LLAMA_DRIVER)
            includes = [f"-I{ggml / d}" for d in ("include", "src", "src/ggml-cpu")]
            quants = ggml / "src" / "ggml-cpu" / "arch" / "arm" / "quants.c"
            for copy, flags in COPIES.items():
                exe = exes[f"llama.cpp {copy}"] = Path(tmp) / f"llama_{copy}"
                cmd = [CC, *FLAGS, *flags, "-D_GNU_SOURCE", *includes, str(lsrc), str(quants)]
                subprocess.run([*cmd, "-o", str(exe), "-lm"], check=True, capture_output=True)
        for name, (ggml_type, bytes_, elems) in TYPES.items():
            for nx in (1, 2):
                run = [str(ggml_type), str(bytes_), str(args.row)]
                per = []
                for column in columns:
                    if column.startswith("llama.cpp") and nx == 2:
                        per.append(None)  # one row a call (two only with i8mm's mmla)
                        continue
                    with_call = executed(exes[column], [*run, "1", str(nx)], log)
                    without = executed(exes[column], [*run, "0", str(nx)], log)
                    per.append((with_call - without) / (args.row // elems) / nx)
                label = name if nx == 1 else f"{name} x{nx}"
                cells = "".join(f"{'':>19}" if n is None else f"{n:>19.1f}" for n in per)
                print(f"{label:<10}" + cells)


if __name__ == "__main__":
    main()
