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
"""

import argparse
import shutil
import subprocess
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

DRIVER = """
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
    uint8_t *w = malloc((size_t)bytes * nb);
    float *v = malloc(sizeof(float) * n);
    srand(1);
    for (int i = 0; i < bytes * nb; i++) w[i] = (uint8_t)rand();
    /* the blocks' f16 scales (d, and dmin or m where there is one) 2^-7: random bytes hold NaNs */
    int at = 0, two = type == 3 || type == KQ_TYPE_Q4_K || type == KQ_TYPE_Q5_K;
    if (type == KQ_TYPE_Q2_K) at = 80, two = 1;
    if (type == KQ_TYPE_Q3_K) at = 108;
    if (type == KQ_TYPE_Q6_K) at = 208;
    for (int b = 0; b < nb; b++)
        for (int i = 0; i <= two; i++) {
            uint8_t *f16 = w + (size_t)b * bytes + at + 2 * i;
            f16[0] = 0x00, f16[1] = 0x20;
        }
    for (int i = 0; i < n; i++) v[i] = rand() / (float)RAND_MAX - 0.5f;
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


def executed(exe: Path, args: list[str], log: Path) -> int:
    """Instructions the program executed (one traced block each in singlestep mode)."""
    cmd = [QEMU, "-cpu", "max", "-singlestep", "-d", "exec,nochain", "-D", str(log), str(exe)]
    subprocess.run(cmd + args, check=True)
    with log.open() as lines:
        return sum(1 for line in lines if line.startswith("Trace"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--row", type=int, default=3072, help="values a row (a multiple of 256)")
    args = parser.parse_args()
    if not (shutil.which(CC) and shutil.which(QEMU)):
        raise SystemExit(f"needs {CC} and {QEMU} (apt-get install gcc-aarch64-linux-gnu qemu-user)")
    print(f"instructions per block, one row of {args.row} values")
    print(f"{'type':<10}" + "".join(f"{c:>10}" for c in COPIES))
    with tempfile.TemporaryDirectory() as tmp:
        src, log = Path(tmp) / "driver.c", Path(tmp) / "exec.log"
        src.write_text(DRIVER)
        exes = {}
        for copy, flags in COPIES.items():
            exes[copy] = Path(tmp) / copy
            cmd = [CC, *FLAGS, *flags, f"-I{NATIVE}", str(src), "-o", str(exes[copy]), "-lm"]
            subprocess.run(cmd, check=True, capture_output=True)
        for name, (ggml, bytes_, elems) in TYPES.items():
            for nx in (1, 2):
                run = [str(ggml), str(bytes_), str(args.row)]
                per = []
                for copy in COPIES:
                    with_call = executed(exes[copy], [*run, "1", str(nx)], log)
                    without = executed(exes[copy], [*run, "0", str(nx)], log)
                    per.append((with_call - without) / (args.row // elems) / nx)
                label = name if nx == 1 else f"{name} x{nx}"
                print(f"{label:<10}" + "".join(f"{n:>10.1f}" for n in per))


if __name__ == "__main__":
    main()
