"""Time LinearWeight calls, int4 kinds against fp32, on SmolLM2-sized layers (not a test).

Run: .venv/bin/python tests/backend/bench_weights.py [threads]
Interleaves the kinds and prints medians in ms; compare ratios within one run only.
"""

import sys
import time

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT

from ember.backend.weights import LinearWeight

SHAPES = [(576, 1536), (1536, 576), (49152, 576)]  # (out, in)


def random_bytes(shape: tuple[int, int], block_bytes: int) -> np.ndarray:
    """Random Q4_0 (18-byte) or Q8_0 (34-byte) blocks with fp16 scales of about 0.01."""
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, size=(shape[0] * shape[1] // 32, block_bytes), dtype=np.uint8)
    scales = (rng.standard_normal(len(blocks)) * 0.01).astype(np.float16)
    blocks[:, :2] = scales.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(-1)


def median_ms(calls: list[float]) -> float:
    return sorted(calls)[len(calls) // 2] * 1e3


def bench(shape: tuple[int, int], rows: int) -> str:
    q4, q8 = random_bytes(shape, 18), random_bytes(shape, 34)
    kinds = {
        "fp32": LinearWeight.from_gguf(q4, QT.Q4_0, shape, use_int4=False),
        "int4 (Q4_0)": LinearWeight.from_gguf(q4, QT.Q4_0, shape),
        "int4x2 (Q8_0)": LinearWeight.from_gguf(q8, QT.Q8_0, shape, use_int4_planes=True),
    }
    x = torch.randn(rows, shape[1])
    times: dict[str, list[float]] = {k: [] for k in kinds}
    repeats = 200 if rows == 1 else max(3, int(2e9 / (shape[0] * shape[1] * rows)))
    for w in kinds.values():
        w(x)
    for _ in range(repeats):
        for kind, w in kinds.items():
            start = time.perf_counter()
            w(x)
            times[kind].append(time.perf_counter() - start)
    cells = "  ".join(f"{k} {median_ms(t):8.3f}" for k, t in times.items())
    return f"{shape[0]:>6} x {shape[1]:<5} rows {rows:>4}:  {cells}"


def main() -> None:
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    print(f"threads {torch.get_num_threads()}, median ms per call")
    for shape in SHAPES:
        for rows in (1, 512):
            print(bench(shape, rows), flush=True)


if __name__ == "__main__":
    main()
