"""GB/s of K-quant weight bytes read by kquants.h's dot products: one thread, one row of x,
a 4096 x 4096 matrix per type, for every ISA path this CPU runs (the test shim, compiled here).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_kquants.py [--rows 4096] [--k 4096] [--reps 5]
"""

import argparse
import ctypes
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ember.backend import native  # noqa: E402
from tests.backend.test_kquants_dot import (  # noqa: E402
    ISAS,
    Q8_BYTES,
    TYPES,
    _cpu_flags,
    random_blocks,
)

SHIM = ROOT / "tests" / "backend" / "kquants_shim.c"


def build(isa: str, out: Path) -> ctypes.CDLL | None:
    flags, needs = ISAS[isa]
    if not needs <= _cpu_flags():
        return None
    cc = shutil.which("cc") or shutil.which("gcc")
    so = out / f"kq_{isa}.so"
    subprocess.run([cc, "-O3", *flags, "-shared", "-fPIC", str(SHIM), "-o", str(so)], check=True)
    lib = ctypes.CDLL(str(so))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.shim_dot.argtypes = [ctypes.c_int, p, p, i64, i64, p]
    lib.shim_quantize_q8_K.argtypes = [p, p, i64]
    lib.shim_impl.restype = ctypes.c_char_p
    return lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(args.k).astype(np.float32)
    weights = {t: random_blocks(t, args.rows, args.k, rng) for t in TYPES}
    out = np.empty(args.rows, np.float32)
    out_p = out.ctypes.data
    print(
        f"CPU: {native.cpu_name()}; {args.rows} x {args.k} weights, one thread, one row of x, "
        f"best of {args.reps}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        libs = {isa: build(isa, Path(tmp)) for isa in ISAS if isa != "avx2-relaxed"}
        libs = {isa: lib for isa, lib in libs.items() if lib is not None}
        print(f"{'type':8}" + "".join(f"{isa:>16}" for isa in libs))
        for t, w in weights.items():
            row = f"{t.name:8}"
            for lib in libs.values():
                xq = np.empty(args.k // 256 * Q8_BYTES, np.uint8)
                lib.shim_quantize_q8_K(x.ctypes.data, xq.ctypes.data, args.k)
                best = float("inf")
                for _ in range(args.reps):
                    t0 = time.perf_counter()
                    lib.shim_dot(int(t), w.ctypes.data, xq.ctypes.data, args.rows, args.k, out_p)
                    best = min(best, time.perf_counter() - t0)
                row += f"{w.nbytes / best / 1e9:>10.1f} GB/s"
            print(row)
        names = [f"{isa}={lib.shim_impl().decode()}" for isa, lib in libs.items()]
        print("paths: " + ", ".join(names))


if __name__ == "__main__":
    main()
