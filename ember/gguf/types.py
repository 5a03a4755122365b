"""The ggml tensor types and GGUF metadata value types, with block sizes as in gguf-py.

Numbers only: no parsing here (see reader.py).
"""

import enum


class GGMLType(enum.IntEnum):
    """Tensor element encoding, numbered as ggml's `ggml_type` (gaps are retired types)."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    IQ1_M = 29
    BF16 = 30
    TQ1_0 = 34
    TQ2_0 = 35
    MXFP4 = 39
    NVFP4 = 40
    Q1_0 = 41


class GGUFValueType(enum.IntEnum):
    """Type tag of a metadata value in a GGUF header."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_QK_K = 256  # elements in a "K" super-block

# (elements per block, bytes per block): the same table as gguf.constants.GGML_QUANT_SIZES.
BLOCK_SIZES: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.Q4_0: (32, 2 + 16),
    GGMLType.Q4_1: (32, 2 + 2 + 16),
    GGMLType.Q5_0: (32, 2 + 4 + 16),
    GGMLType.Q5_1: (32, 2 + 2 + 4 + 16),
    GGMLType.Q8_0: (32, 2 + 32),
    GGMLType.Q8_1: (32, 4 + 4 + 32),
    GGMLType.Q2_K: (256, 2 + 2 + _QK_K // 16 + _QK_K // 4),
    GGMLType.Q3_K: (256, 2 + _QK_K // 4 + _QK_K // 8 + 12),
    GGMLType.Q4_K: (256, 2 + 2 + _QK_K // 2 + 12),
    GGMLType.Q5_K: (256, 2 + 2 + _QK_K // 2 + _QK_K // 8 + 12),
    GGMLType.Q6_K: (256, 2 + _QK_K // 2 + _QK_K // 4 + _QK_K // 16),
    GGMLType.Q8_K: (256, 4 + _QK_K + _QK_K // 8),
    GGMLType.IQ2_XXS: (256, 2 + _QK_K // 4),
    GGMLType.IQ2_XS: (256, 2 + _QK_K // 4 + _QK_K // 32),
    GGMLType.IQ3_XXS: (256, 2 + _QK_K // 4 + _QK_K // 8),
    GGMLType.IQ1_S: (256, 2 + _QK_K // 8 + _QK_K // 16),
    GGMLType.IQ4_NL: (32, 2 + 16),
    GGMLType.IQ3_S: (256, 2 + _QK_K // 4 + _QK_K // 8 + _QK_K // 32 + 4),
    GGMLType.IQ2_S: (256, 2 + _QK_K // 4 + _QK_K // 16),
    GGMLType.IQ4_XS: (256, 2 + 2 + _QK_K // 2 + _QK_K // 64),
    GGMLType.I8: (1, 1),
    GGMLType.I16: (1, 2),
    GGMLType.I32: (1, 4),
    GGMLType.I64: (1, 8),
    GGMLType.F64: (1, 8),
    GGMLType.IQ1_M: (256, _QK_K // 8 + _QK_K // 16 + _QK_K // 32),
    GGMLType.BF16: (1, 2),
    GGMLType.TQ1_0: (256, 2 + 4 * 13),
    GGMLType.TQ2_0: (256, 2 + 64),
    GGMLType.MXFP4: (32, 1 + 16),
    GGMLType.NVFP4: (64, 4 + 32),
    GGMLType.Q1_0: (128, 2 + 16),
}
