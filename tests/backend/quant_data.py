"""Test data for quantized tensors: gguf-py's quantization and dequantization, random blocks."""

import numpy as np
import torch
from gguf import GGMLQuantizationType as QT
from gguf import quants

QUANTIZABLE = [QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.MXFP4]
# Byte offsets of the fp16 scale fields in each block: random bytes there could be NaN or huge.
F16_FIELDS = {
    QT.Q4_0: (0,),
    QT.Q4_1: (0, 2),
    QT.Q5_0: (0,),
    QT.Q5_1: (0, 2),
    QT.Q8_0: (0,),
    QT.Q2_K: (80, 82),
    QT.Q3_K: (108,),
    QT.Q4_K: (0, 2),
    QT.Q5_K: (0, 2),
    QT.Q6_K: (208,),
    QT.IQ4_NL: (0,),
    QT.IQ4_XS: (0,),
    QT.MXFP4: (),  # its scale is a byte exponent: every value is a finite power of two
}


def gguf_reference(raw: np.ndarray, qtype: QT, shape: tuple[int, int]) -> torch.Tensor:
    """gguf-py's dequantization of flat bytes, as a float32 torch tensor of `shape`."""
    rows = raw.reshape(shape[0], -1)
    if qtype == QT.F32:
        rows = rows.view(np.float32)
    elif qtype == QT.F16:
        rows = rows.view(np.float16)
    out = quants.dequantize(rows, qtype)
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(shape)


def random_blocks(qtype: QT, shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    """Random block bytes whose fp16 fields hold sane scales (normal, about 0.01)."""
    rng = np.random.default_rng(seed)
    block_elems, block_bytes = quants.GGML_QUANT_SIZES[qtype]
    num_blocks = shape[0] * shape[1] // block_elems
    blocks = rng.integers(0, 256, size=(num_blocks, block_bytes), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        scales = (rng.standard_normal(num_blocks) * 0.01).astype(np.float16)
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(num_blocks, 2)
    return blocks.reshape(-1)


def quantized(qtype: QT, shape: tuple[int, int], seed: int = 0) -> np.ndarray:
    """gguf-py's quantization of normal data with a different spread per row."""
    rng = np.random.default_rng(seed)
    spread = np.exp(rng.uniform(-6, 2, size=(shape[0], 1)))
    data = (rng.standard_normal(shape) * spread).astype(np.float32)
    data[0, :7] = 0.0  # an all-zero start of a block: scale 0
    return np.ascontiguousarray(quants.quantize(data, qtype)).view(np.uint8).reshape(-1)
