"""What a small torch op costs when a decode step's weights have just streamed through the
caches: the same ops timed warm (back to back) and cold (after reading --mib of memory, as a
SmolLM2 step reads its 98 MB of weights), medians of --runs.

    .venv/bin/python benchmarks/bench_cold_ops.py --mib 100

profile_decode.py's "other", "cache start_forward" and "embedding lookup" are such ops: each
is microseconds warm, but the first ops after the native layers find torch's dispatch code and
data evicted, so a step's few dozen ops cost ~1 ms on SmolLM2.
"""

import argparse
import statistics
import time

import numpy as np
import torch

from ember.nn import rms_norm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=100, help="memory read between timings")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    stream = np.ones(args.mib * 2**20 // 8)
    x, w, logits = torch.randn(1, 576), torch.randn(576), torch.randn(49152)
    ops = {
        "torch.empty(576)": lambda: torch.empty(576),
        "rms_norm (1, 576)": lambda: rms_norm(x, w, 1e-5),
        "rms_norm again": lambda: rms_norm(x, w, 1e-5),
        "argmax (49152,)": lambda: logits.argmax(),
    }
    print(f"{args.threads} threads; cold = after reading {args.mib} MiB; medians of {args.runs}")
    for cold in (False, True):
        times: dict[str, list[float]] = {name: [] for name in ops}
        for _ in range(args.runs):
            if cold:
                stream.sum()
            for name, op in ops.items():
                t0 = time.perf_counter()
                op()
                times[name].append(time.perf_counter() - t0)
        cells = ", ".join(f"{n} {statistics.median(t) * 1e6:.1f} us" for n, t in times.items())
        print(f"{'cold' if cold else 'warm'}: {cells}")


if __name__ == "__main__":
    main()
