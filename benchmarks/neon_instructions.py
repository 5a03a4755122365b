"""Instructions the AArch64 copies of the K types' dot products execute per superblock, counted
under qemu-aarch64 (no ARM CPU is at hand to time them; a count of what one row's dot product
runs is the figure an emulator gives truly).

    .venv/bin/python benchmarks/neon_instructions.py [--superblocks 12]

For each copy (neon: ARMv8.0 Advanced SIMD; neondot: with the dot product instructions) and
each type (Q4_K, Q5_K, Q6_K), kquants.h's dot product of one weight row of --superblocks
superblocks with one row of q8_K activations is cross-compiled (aarch64-linux-gnu-gcc, the
build's flags), run once under `qemu-aarch64 -cpu max -singlestep -d exec,nochain`, and the
instructions executed inside it are counted (each traced block is one instruction in
singlestep mode). Needs `apt-get install gcc-aarch64-linux-gnu qemu-user`.
"""

import argparse
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

NATIVE = Path(__file__).resolve().parents[1] / "ember" / "backend" / "native"
CC, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"
FLAGS = ["-O3", "-ffp-contract=off", "-std=gnu11", "-static"]
COPIES = {"neon": [], "neondot": ["-march=armv8.2-a+dotprod"]}
TYPES = {"Q4_K": (12, 144), "Q5_K": (13, 176), "Q6_K": (14, 210)}  # ggml type, block bytes

DRIVER = """
#include "kquants.h"
#include <stdlib.h>
__attribute__((noinline)) float dot_row(int type, const void *w, const kq_block_q8_K *x,
                                        int64_t nb) {
    switch (type) {
    case KQ_TYPE_Q4_K: return kq_dot_q4_K(w, x, nb);
    case KQ_TYPE_Q5_K: return kq_dot_q5_K(w, x, nb);
    default: return kq_dot_q6_K(w, x, nb);
    }
}
int main(int argc, char **argv) {
    const int type = atoi(argv[1]), bytes = atoi(argv[2]), nb = atoi(argv[3]);
    uint8_t *w = malloc((size_t)bytes * nb);
    kq_block_q8_K *x = malloc(sizeof(kq_block_q8_K) * nb);
    srand(1);
    for (int i = 0; i < bytes * nb; i++) w[i] = (uint8_t)rand();
    for (int b = 0; b < nb; b++) {
        float v[KQ_QK];
        for (int j = 0; j < KQ_QK; j++) v[j] = rand() / (float)RAND_MAX - 0.5f;
        kq_quantize_row_q8_K(v, x + b, KQ_QK);
    }
    volatile float s = dot_row(type, w, x, nb);
    return s != s;
}
"""


def count(exe: Path, args: list[str], log: Path) -> int:
    """Instructions executed inside dot_row (its symbol's address range)."""
    nm = subprocess.run(["aarch64-linux-gnu-nm", "-S", str(exe)], capture_output=True, text=True)
    start, size = next(
        (int(f[0], 16), int(f[1], 16))
        for f in (line.split() for line in nm.stdout.splitlines())
        if len(f) == 4 and f[3] == "dot_row"
    )
    cmd = [QEMU, "-cpu", "max", "-singlestep", "-d", "exec,nochain", "-D", str(log), str(exe)]
    subprocess.run(cmd + args, check=True)
    pcs = (re.search(r"\[[0-9a-f]+/([0-9a-f]+)/", line) for line in log.open())
    return sum(1 for m in pcs if m and start <= int(m.group(1), 16) < start + size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--superblocks", type=int, default=12, help="a row's (3,072 values: 12)")
    args = parser.parse_args()
    if not (shutil.which(CC) and shutil.which(QEMU)):
        raise SystemExit(f"needs {CC} and {QEMU} (apt-get install gcc-aarch64-linux-gnu qemu-user)")
    print(f"instructions per superblock, one row of {args.superblocks} superblocks")
    print(f"{'type':<6}" + "".join(f"{c:>10}" for c in COPIES))
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "driver.c"
        src.write_text(DRIVER)
        exes = {}
        for copy, flags in COPIES.items():
            exes[copy] = Path(tmp) / copy
            cmd = [CC, *FLAGS, *flags, f"-I{NATIVE}", str(src), "-o", str(exes[copy])]
            subprocess.run(cmd, check=True)
        for name, (ggml, bytes_) in TYPES.items():
            run = [str(ggml), str(bytes_), str(args.superblocks)]
            per = [count(exes[c], run, Path(tmp) / "exec.log") / args.superblocks for c in COPIES]
            print(f"{name:<6}" + "".join(f"{n:>10.1f}" for n in per))


if __name__ == "__main__":
    main()
