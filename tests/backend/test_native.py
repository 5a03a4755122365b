"""The native kernels, on every ISA this CPU runs: each type's matmul against dequantize-then-
matmul (tightly with the activations quantized as the kernels do: int16 blocks of 32, two q8_K
passes for the K types; loosely with float32 ones),
dequantization bit-equal to gguf-py, EMBER_CPU_ISA, and a real model's greedy tokens on the
generic path."""

import ctypes
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as QT
from gguf import quants
from native_isas import ISAS
from quant_data import F16_FIELDS, gguf_reference, quantized, random_blocks

from ember.backend import native
from ember.backend.precision import (
    float_activations,
    gemm8_prefill,
    gemm16_prefill,
    int8_prefill,
)
from ember.backend.quant import UnsupportedTypeError
from ember.backend.weights import (
    NATIVE_ROWS,
    FusedLinear,
    NativeLinear,
    concat_linear,
    linear_from_gguf,
)
from ember.errors import OptionsError

pytestmark = pytest.mark.skipif(not native.available(), reason="the native library was not built")

SIMPLE = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.IQ4_NL]
K_TYPES = [QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_XS]
FLOAT = [QT.F16, QT.BF16]
AFFINE = {QT.Q4_1, QT.Q5_1}
ROWS = [0, 1, 2, 7, 9, 16]


def weight(qtype: QT, shape: tuple[int, int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Bytes of a (out, in) weight and its gguf-py dequantization."""
    if qtype == QT.IQ4_NL or qtype in K_TYPES:
        raw = random_blocks(qtype, shape, seed)
    else:
        raw = quantized(qtype, shape, seed)
    return torch.from_numpy(raw.copy()), gguf_reference(raw, qtype, shape)


def largest_codes(qtype: QT, shape: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight's bytes with every code (and sub-block scale) at its largest, its f16 scales
    sane, and its gguf-py dequantization"""
    blocks = random_blocks(qtype, shape).reshape(-1, quants.GGML_QUANT_SIZES[qtype][1])
    full = blocks.copy()
    full[:] = 0xFF
    for offset in F16_FIELDS[qtype]:
        full[:, offset : offset + 2] = blocks[:, offset : offset + 2]
    return torch.from_numpy(full.reshape(-1).copy()), gguf_reference(full.reshape(-1), qtype, shape)


def q16(x: torch.Tensor, limit: int = 32767) -> torch.Tensor:
    """x as the 32-block kernels see it: per 32 values d = max|x| / 32767 (gemm16's: 16383),
    codes rounded half to even."""
    blocks = x.reshape(x.shape[0], -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / limit
    codes = torch.round(blocks * torch.where(d > 0, 1 / d, torch.zeros_like(d)))
    return (codes.double() * d.double()).reshape(x.shape)


def q8_k(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's q8_K of x, as float32 codes and scales per 256 values: iscale = -127 / the
    value of largest magnitude, codes round(iscale * x) (at most 127), d = 1 / iscale."""
    blocks = x.reshape(x.shape[0], -1, 256)
    top = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True))
    iscale = torch.where(top != 0, -127 / top, torch.zeros_like(top))
    codes = torch.round(iscale * blocks).clamp(max=127)
    return codes, torch.where(iscale != 0, 1 / iscale, torch.zeros_like(iscale))


def q8_k_twice(x: torch.Tensor) -> torch.Tensor:
    """x as the K-type kernels see it: q8_K of x plus q8_K of what it left out."""
    codes, d = q8_k(x)
    first = (codes * d).reshape(x.shape)  # float32, as the kernel computes the rest
    codes2, d2 = q8_k(x - first)
    blocks = codes.double() * d.double() + codes2.double() * d2.double()
    return blocks.reshape(x.shape)


def q8_0(x: torch.Tensor) -> torch.Tensor:
    """x as gemm8 sees it: per 32 values d = max|x| / 127, codes round(x * (1 / d)), half to
    even (llama.cpp's q8_0)."""
    blocks = x.reshape(x.shape[0], -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    codes = torch.round(blocks * torch.where(d > 0, 1 / d, torch.zeros_like(d)))
    return (codes.double() * d.double()).reshape(x.shape)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", SIMPLE + K_TYPES + FLOAT, ids=lambda t: t.name)
def test_dequant_is_bit_exact(isa: str, qtype: QT) -> None:
    shape = (37, 256 * 3)
    raw, exact = weight(qtype, shape)
    got = NativeLinear(raw, qtype, *shape, kernels=native.kernels(isa)).dequantize()
    assert torch.equal(got.view(torch.int32), exact.view(torch.int32))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", SIMPLE + K_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", ROWS)
def test_quantized_matmul(isa: str, qtype: QT, rows: int) -> None:
    # N not a multiple of the 16-row chunks, K an odd number of blocks
    shape = (77, 256 * 3 if qtype in K_TYPES else 32 * 13)
    raw, w = weight(qtype, shape, seed=rows)
    x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(rows))
    lin = NativeLinear(raw, qtype, *shape, kernels=native.kernels(isa))
    assert lin.isa == isa
    y = lin(x)
    assert y.shape == (rows, shape[0]) and y.dtype == torch.float32
    if not rows:
        return
    # tightly: the same quantized activations in float64, up to float32 accumulation
    xq = q16(x) if qtype in SIMPLE or int16_rows(isa, rows, qtype) else q8_k_twice(x)
    if qtype in SIMPLE and float_activations(isa) and not int16_rows(isa, rows, qtype):
        xq = x.double()  # x as it is, and weights d * q + m rounded once: still within 2e-6
    want = xq @ w.double().t()
    scale = xq.abs() @ w.double().abs().t()
    assert ((y.double() - want).abs() <= 2e-6 * scale + 1e-30).all()
    # loosely: the float32 activations (int16 or two int8 passes: ~1e-5 of the largest output)
    exact = x.double() @ w.double().t()
    assert float((y.double() - exact).abs().max() / exact.abs().max()) < 1e-4


LANE_TYPES = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.Q4_K, QT.Q5_K, QT.Q6_K]
# the fewest rows of x that take the lane kernels (weight rows across a register's lanes, x as
# int16 codes per 32 values): vnni.h on the avx512 and amx paths, rows8.h on avx2 and avxvnni
LEAST_LANE_ROWS = {
    "avx512": {QT.Q8_0: 2, QT.Q6_K: 3},
    "avx2": {QT.Q4_0: 3, QT.Q4_1: 3, QT.Q6_K: 3},
}
LEAST_LANE_ROWS["amx"] = LEAST_LANE_ROWS["avx512"]
LEAST_LANE_ROWS["avxvnni"] = LEAST_LANE_ROWS["avx2"]


def least_int16_rows(isa: str, qtype: QT) -> int:
    """The fewest rows of x that meet a weight of qtype in the lane kernels on this ISA path"""
    return LEAST_LANE_ROWS[isa].get(qtype, 1 if isa in ("avx512", "amx") else 2)


def int16_rows(isa: str, rows: int, qtype: QT) -> bool:
    """Whether these rows of x meet a weight of qtype as int16 codes per 32 values in the lane
    kernels (on the amx path Q4_K and Q5_K from 8 rows in AMX's tiles, amx.h: the same bits)"""
    takes = isa in LEAST_LANE_ROWS and qtype in LANE_TYPES
    return takes and least_int16_rows(isa, qtype) <= rows <= 16


# The lane kernels take a one-pass K-type weight's x as q8_K's int8 codes (kernels.c's
# em_lanes_x8): rows8.h on the avx2 and avxvnni paths (Q4_K and Q5_K from 2 rows, Q6_K from
# 3), vnni.h on the avx512 path from its usual rows; not the amx path (its tiles take int16)
LEAST_Q8K_LANE_ROWS = {QT.Q4_K: 2, QT.Q5_K: 2, QT.Q6_K: 3}


def least_q8k_lane_rows(isa: str, qtype: QT) -> int:
    """The fewest rows of x that meet a one-pass weight of qtype as q8_K codes in the lane
    kernels (17: never)"""
    if qtype not in LEAST_Q8K_LANE_ROWS:
        return 17
    if isa in ("avx2", "avxvnni"):
        return LEAST_Q8K_LANE_ROWS[qtype]
    return least_int16_rows(isa, qtype) if isa == "avx512" else 17


def q8k_lane_rows(isa: str, rows: int, qtype: QT) -> bool:
    """Whether these rows of x meet a one-pass weight of qtype as q8_K codes in the lanes"""
    return least_q8k_lane_rows(isa, qtype) <= rows <= 16


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 2, 7, 16, 130])
def test_one_activation_pass(isa: str, qtype: QT, rows: int) -> None:
    # the K types with one q8_K pass over x (llama.cpp's precision): exactly that pass's result,
    # at any row count (130: prefill's path, over three tiles of x)
    shape = (77, 256 * 3)
    raw, w = weight(qtype, shape, seed=rows)
    x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(rows))
    lin = NativeLinear(raw, qtype, *shape, kernels=native.kernels(isa), activation_passes=1)
    y = lin(x)
    if rows > NATIVE_ROWS and not int8_prefill(isa):
        # prefill on the avx512 path: gemm16, and oneDNN's float32 matmul for the types gemm16
        # lacks, outrun the int8 kernel there
        if not lin.takes_int16(rows):
            exact = x.double() @ w.double().t()
            assert float((y.double() - exact).abs().max() / exact.abs().max()) < 1e-5
            return
        rounded = q16(x, limit=16383)
        want = rounded @ w.double().t()
        assert ((y.double() - want).abs() <= 2e-6 * (rounded.abs() @ w.double().abs().t())).all()
        return
    codes, d = q8_k(x)
    xq = (codes.double() * d.double()).reshape(x.shape)
    if lin.takes_int8(rows):  # gemm8 takes the prompt where it has fast code for the type
        xq = q8_0(x)
    if int16_rows(isa, rows, qtype) and not q8k_lane_rows(isa, rows, qtype):
        # amx.h's and the amx path's vnni.h's int16 codes, closer than one q8_K pass
        want = q16(x) @ w.double().t()
        assert ((y.double() - want).abs() <= 2e-6 * (q16(x).abs() @ w.double().abs().t())).all()
        least = max(2, least_int16_rows(isa, qtype))  # nor on its batch of 1-16
        assert torch.equal(y[:1], lin(x[[0] * least])[:1])
        return
    want = xq @ w.double().t()
    scale = xq.abs() @ w.double().abs().t()
    assert ((y.double() - want).abs() <= 2e-6 * scale + 1e-30).all()
    # its error is int8's (~1% of the largest output here): above two passes'
    exact = x.double() @ w.double().t()
    two = NativeLinear(raw, qtype, *shape, kernels=native.kernels(isa))(x).double()
    error = float((y.double() - exact).abs().max() / exact.abs().max())
    assert float((two - exact).abs().max() / exact.abs().max()) < error < 3e-2
    if lin.takes_int8(rows):  # nor with gemm8, for any batch it takes (above NATIVE_ROWS)
        assert torch.equal(y[1 : NATIVE_ROWS + 2], lin(x[1 : NATIVE_ROWS + 2]))
        assert torch.equal(y[-NATIVE_ROWS - 1 :], lin(x[-NATIVE_ROWS - 1 :]))
    elif q8k_lane_rows(isa, rows, qtype):  # nor in the lanes' batches (from their least rows)
        least, last = least_q8k_lane_rows(isa, qtype), rows - 1
        assert torch.equal(y[:1], lin(x[[0] + [last] * (least - 1)])[:1])
        assert torch.equal(y[-1:], lin(x[[last] * least])[:1])
        # and its codes are one row's: the sums as exact, only the float steps' order differs
        alone = torch.cat([lin(x[i : i + 1]) for i in range(rows)]).double()
        assert ((y.double() - alone).abs() <= 2e-6 * scale + 1e-30).all()
    elif rows > 1:  # a row does not depend on its batch, nor on its tile
        assert torch.equal(y[1:2], lin(x[1:2]))
        assert torch.equal(y[-1:], lin(x[-1:]))


GEMM8 = [QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0, QT.IQ4_NL, QT.Q4_K, QT.Q5_K, QT.Q6_K]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", GEMM8, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [17, 42])
def test_gemm8_is_the_product_of_x_rounded_to_int8(isa: str, qtype: QT, rows: int) -> None:
    raw, shape, x, y = checked_prefill_product("gemm8", isa, qtype, rows, q8_0, 3e-2)
    # a weight that takes it for prefill: through quantize_rows and codes_into, the same
    lin = NativeLinear(raw, qtype, *shape, kernels=native.kernels(isa), prefill_int8=True)
    if lin.takes_int8(rows):
        out = torch.empty(rows, 30)
        lin.codes_into(lin.quantize_rows(x), 20, 50, out)
        assert torch.equal(out, y[:, 20:50])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", GEMM8, ids=lambda t: t.name)
def test_gemm8_sums_hold_the_largest_codes_exactly(isa: str, qtype: QT) -> None:
    # every code at its largest and every x at +-127 after rounding: the AVX2 path adds
    # several vpmaddubsw results in int16 before widening them, which must not wrap
    shape = (32, 256 if qtype in K_TYPES else 64)
    raw, w = largest_codes(qtype, shape)
    x = torch.ones(18, shape[1])
    x[1::2] = -1.0
    y = prefill_product("gemm8", isa, raw, qtype, shape, x)
    want = q8_0(x) @ w.double().t()
    assert ((y.double() - want).abs() <= 2e-6 * (q8_0(x).abs() @ w.double().abs().t())).all()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("kernel", ["gemm8", "gemm16"])
def test_prefill_quantization_is_the_portable_one(isa: str, kernel: str) -> None:
    # x's rows as each copy quantizes them (vector code on the x86 paths) are the portable C's
    # bytes: ties rounded half to even, -0.0, and for gemm8 NaN and inf (codes 0; the int16
    # codes of a row holding them are not defined alike)
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(3))
    x[1, :32] = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5] * 5 + [127.0, -127.0])
    x[2, 32:64] = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5] * 5 + [16383.0, -16383.0])
    x[4, :32] = -0.0
    if kernel == "gemm8":
        x[3, 3], x[3, 40], x[3, 70] = float("nan"), float("inf"), float("-inf")
    rows = []
    for path in (isa, "generic"):
        kern = native.kernels(path)
        assert kern is not None
        size, quantize = (
            (native.q8_row_bytes, kern.q8_rows)
            if kernel == "gemm8"
            else (native.q16_row_bytes, kern.q16_rows)
        )
        xq = torch.empty(5, size(128), dtype=torch.uint8)
        assert quantize(x.data_ptr(), 5, 128, xq.data_ptr()) == 0
        rows.append(xq)
    assert torch.equal(rows[0], rows[1])


def checked_prefill_product(
    kernel: str,
    isa: str,
    qtype: QT,
    rows: int,
    rounding: Callable[[torch.Tensor], torch.Tensor],
    error: float,
) -> tuple[torch.Tensor, tuple[int, int], torch.Tensor, torch.Tensor]:
    """(W's blocks, its shape, x, y) where y = x @ W^T by the isa copy's gemm8 or gemm16, checked:
    it is the product of x as `rounding` rounds it, within `error` of x's own (of the largest);
    rows of W from the middle give its bits, and so does the portable C. 77 weight rows: whole
    panels (16, or gemm16's 32 on the avx512 path) and a part; x's rows whole tiles and a part."""
    shape = (77, 256 * 3 if qtype in K_TYPES else 32 * 13)
    raw, w = weight(qtype, shape, seed=rows)
    x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(rows))
    y = prefill_product(kernel, isa, raw, qtype, shape, x)
    rounded = rounding(x)
    want = rounded @ w.double().t()
    scale = rounded.abs() @ w.double().abs().t()
    assert ((y.double() - want).abs() <= 2e-6 * scale + 1e-30).all()
    exact = x.double() @ w.double().t()
    assert float((y.double() - exact).abs().max() / exact.abs().max()) < error
    # rows of W from the middle: the same bits (each output's sums do not depend on its panel)
    middle = raw[20 * raw.numel() // shape[0] :]
    assert torch.equal(prefill_product(kernel, isa, middle, qtype, (30, shape[1]), x), y[:, 20:50])
    # and every path gives the same bits (the portable C does the vector code's float steps)
    assert torch.equal(prefill_product(kernel, "generic", raw, qtype, shape, x), y)
    return raw, shape, x, y


def prefill_product(
    kernel: str, isa: str, raw: torch.Tensor, qtype: QT, shape: tuple[int, int], x: torch.Tensor
) -> torch.Tensor:
    """x @ W^T by the isa copy's gemm8 or gemm16 (whether its prefill takes it or not), into a
    wider output whose columns past the product must stay untouched"""
    kern = native.kernels(isa)
    assert kern is not None
    rows, (n, k) = x.shape[0], shape
    size, quantize, gemm = (
        (native.q8_row_bytes, kern.q8_rows, kern.gemm8)
        if kernel == "gemm8"
        else (native.q16_row_bytes, kern.q16_rows, kern.gemm16)
    )
    xq = torch.empty(rows, size(k), dtype=torch.uint8)
    assert quantize(x.data_ptr(), rows, k, xq.data_ptr()) == 0
    wide = torch.full((rows, n + 5), float("nan"))
    y = wide[:, 2 : 2 + n]
    assert gemm(qtype, raw.data_ptr(), xq.data_ptr(), rows, n, k, y.data_ptr(), n + 5) == 0
    assert wide[:, :2].isnan().all() and wide[:, 2 + n :].isnan().all()
    return y


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", GEMM8, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [17, 42])
def test_gemm16_is_the_product_of_x_rounded_to_int16(isa: str, qtype: QT, rows: int) -> None:
    checked_prefill_product("gemm16", isa, qtype, rows, lambda x: q16(x, limit=16383), 1e-4)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", GEMM8, ids=lambda t: t.name)
def test_gemm16_sums_hold_the_largest_codes_exactly(isa: str, qtype: QT) -> None:
    # every code at its largest and x at +-16383 after rounding: 32 products a sum in int32,
    # Q6_K's codes (q - 32) * scale at their largest, -32 * -128, where 0xff bytes give 31 * -1
    shape = (32, 256 if qtype in K_TYPES else 64)
    raw, w = largest_codes(qtype, shape)
    if qtype == QT.Q6_K:
        blocks = raw.view(-1, 210)
        blocks[:, :192] = 0  # ql, qh: q = 0
        blocks[:, 192:208] = 0x80  # the scales: -128
        w = gguf_reference(raw.numpy(), qtype, shape)
    x = torch.ones(18, shape[1])
    x[1::2] = -1.0
    y = prefill_product("gemm16", isa, raw, qtype, shape, x)
    want = q16(x, limit=16383) @ w.double().t()
    assert ((y.double() - want).abs() <= 2e-6 * want.abs()).all()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", GEMM8, ids=lambda t: t.name)
def test_prefill_takes_gemm16_where_the_float32_matmul_was(isa: str, qtype: QT) -> None:
    # a weight whose prompt takes neither gemm8 nor the q8_K kernel (two passes: an attention
    # output, a down projection) takes gemm16 on the x86 paths, its result gemm16's
    shape = (40, 256 if qtype in K_TYPES else 64)
    raw, w = weight(qtype, shape)
    x = torch.randn(NATIVE_ROWS + 1, shape[1], generator=torch.Generator().manual_seed(3))
    lin = NativeLinear(raw, qtype, *shape, kernels=native.kernels(isa))
    assert not lin.takes_int16(NATIVE_ROWS) and not lin.takes_int8(NATIVE_ROWS + 1)
    assert lin.takes_int16(NATIVE_ROWS + 1) == gemm16_prefill(isa, qtype)
    assert lin.takes_dense(NATIVE_ROWS + 1) != lin.takes_int16(NATIVE_ROWS + 1)
    assert gemm16_prefill(isa, qtype) == (isa in ("avx2", "avxvnni", "avx512", "amx"))
    y = lin(x)
    if lin.takes_int16(len(x)):
        assert torch.equal(y, prefill_product("gemm16", isa, raw, qtype, shape, x))
    exact = x.double() @ w.double().t()
    assert float((y.double() - exact).abs().max() / exact.abs().max()) < 1e-4
    # gate and up with gemm8 keep it; a one-pass K type keeps its int8 kernel (or gemm8)
    int8 = NativeLinear(raw, qtype, *shape, kernels=native.kernels(isa), prefill_int8=True)
    assert not int8.takes_int16(len(x)) or not gemm8_prefill(isa, qtype)
    if qtype in K_TYPES:
        one = NativeLinear(raw, qtype, *shape, kernels=native.kernels(isa), activation_passes=1)
        assert one.takes_int16(len(x)) == (not int8_prefill(isa))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", [QT.Q4_K, QT.Q5_K, QT.Q6_K], ids=lambda t: t.name)
def test_one_pass_lanes_hold_the_largest_codes_exactly(isa: str, qtype: QT) -> None:
    # every code at its largest and x at +-127 after rounding: rows8.h adds vpmaddubsw's int16
    # pairs before widening them (four of 4- and 5-bit codes, two of Q6_K's), which must not wrap
    shape = (32, 512)
    raw, w = largest_codes(qtype, shape)
    x = torch.ones(9, shape[1])
    x[1::2] = -1.0
    lin = NativeLinear(raw, qtype, *shape, kernels=native.kernels(isa), activation_passes=1)
    codes, d = q8_k(x)  # +-127 (and the lane kernels' int16 codes: x itself)
    xq = (codes.double() * d.double()).reshape(x.shape) if q8k_lane_rows(isa, 9, qtype) else q16(x)
    want = xq @ w.double().t()
    assert ((lin(x).double() - want).abs() <= 2e-6 * (xq.abs() @ w.double().abs().t())).all()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("int8", [True, False], ids=["int8", "not-int8"])
def test_prefill_takes_gemm8_where_the_weight_and_the_isa_path_allow(isa: str, int8: bool) -> None:
    raw, _ = weight(QT.Q5_0, (40, 64))
    x = torch.randn(NATIVE_ROWS + 1, 64, generator=torch.Generator().manual_seed(3))
    lin = NativeLinear(raw, QT.Q5_0, 40, 64, kernels=native.kernels(isa), prefill_int8=int8)
    assert not lin.takes_int8(NATIVE_ROWS)
    assert lin.takes_int8(NATIVE_ROWS + 1) == (int8 and gemm8_prefill(isa, QT.Q5_0))
    # else gemm16 where the path has it, else the float32 matmul
    assert lin.takes_int16(NATIVE_ROWS + 1) == (
        not lin.takes_int8(NATIVE_ROWS + 1) and gemm16_prefill(isa, QT.Q5_0)
    )
    assert lin.takes_dense(NATIVE_ROWS + 1) != lin.takes_codes(NATIVE_ROWS + 1)
    y = lin(x)
    if lin.takes_int8(x.shape[0]):
        want = torch.empty_like(y)
        lin.codes_into(lin.quantize_rows(x), 0, 40, want)
        assert torch.equal(y, want)
    tol = (3e-2 if lin.takes_int8(x.shape[0]) else 1e-4) * float(y.abs().max())
    assert torch.allclose(y, x @ lin.dequantize().t(), rtol=0, atol=tol)


def test_down_projections_keep_two_activation_passes() -> None:
    from ember.backend.precision import activation_passes

    assert activation_passes("blk.3.ffn_down.weight") == 2
    assert activation_passes("blk.3.ffn_down_exps.weight") == 2
    assert activation_passes("mm.2.weight") == 2
    for name in ("blk.0.attn_q.weight", "blk.1.ffn_up.weight", "output.weight"):
        assert activation_passes(name) == 1


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", FLOAT, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", ROWS)
def test_float_matmul(isa: str, qtype: QT, rows: int) -> None:
    shape = (45, 203)  # no block structure: any K, tails of the vector loops
    raw, w = weight(qtype, shape, seed=rows)
    x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(rows))
    y = NativeLinear(raw, qtype, *shape, kernels=native.kernels(isa))(x)
    assert y.shape == (rows, shape[0])
    want = x.double() @ w.double().t()
    scale = x.double().abs() @ w.double().abs().t()
    assert ((y.double() - want).abs() <= 2e-6 * scale + 1e-30).all()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    "qtype", [QT.Q4_1, QT.Q5_0, QT.Q8_0, QT.F16, QT.Q4_K, QT.Q6_K], ids=lambda t: t.name
)
@pytest.mark.parametrize("k", [256, 2048])  # rows past 1,024 values: avx512 pairs weight rows
def test_a_row_does_not_depend_on_its_batch(isa: str, qtype: QT, k: int) -> None:
    raw, _ = weight(qtype, (301, k))  # big enough for the parallel loop; an odd row count
    lin = NativeLinear(raw, qtype, 301, k, kernels=native.kernels(isa))
    x = torch.randn(9, k)
    alone = torch.cat([lin(x[i : i + 1]) for i in range(9)])
    if int16_rows(isa, 9, qtype):
        # the lane kernels take 1-16 rows (from least_int16_rows), fewer take float32 x, int16
        # codes a weight row at a time or q8_K: a row's bits are the same in any batch these take
        least = least_int16_rows(isa, qtype)
        alone = torch.cat([lin(x[[(i + j) % 9 for j in range(least)]])[:1] for i in range(9)])
    assert torch.equal(lin(x), alone)


@pytest.mark.parametrize("qtype", SIMPLE + FLOAT, ids=lambda t: t.name)
@pytest.mark.parametrize("rows", [1, 2, 3])
def test_every_isa_gives_the_same_bits(qtype: QT, rows: int) -> None:
    # simple.h's kernels take the same float steps on every path (int lanes of 4 products, no
    # fused multiply-add), except the 32-element types on the avx512 path (float32 activations:
    # test_quantized_matmul); rows the lane kernels take: the next test
    shape = (64, 32 * 11) if qtype in SIMPLE else (64, 357)
    raw, _ = weight(qtype, shape)
    x = torch.randn(rows, shape[1])
    runnable = [
        isa
        for isa in native.runnable_isas()
        if not (qtype in SIMPLE and float_activations(isa)) and not int16_rows(isa, rows, qtype)
    ]
    ys = [NativeLinear(raw, qtype, *shape, kernels=native.kernels(i))(x) for i in runnable]
    for isa, y in zip(runnable[1:], ys[1:], strict=True):
        assert torch.equal(y, ys[0]), isa


def assert_every_isa_gives_the_same_bits(
    qtype: QT, shape: tuple[int, int], passes: int, counts: tuple[int, ...], takes
) -> None:
    """Each of these counts of rows of x that every runnable ISA path's lane kernels take
    (takes(isa, rows)) gives the same bits on all of them."""
    raw, _ = weight(qtype, shape)
    runnable = [isa for isa in native.runnable_isas() if any(takes(isa, r) for r in range(17))]
    if len(runnable) < 2:
        pytest.skip("needs two ISA paths whose lane kernels take these rows")
    for rows in counts:
        if not all(takes(isa, rows) for isa in runnable):
            continue
        x = torch.randn(rows, shape[1], generator=torch.Generator().manual_seed(rows))
        ys = [
            NativeLinear(raw, qtype, *shape, kernels=native.kernels(i), activation_passes=passes)(x)
            for i in runnable
        ]
        for isa, y in zip(runnable[1:], ys[1:], strict=True):
            assert torch.equal(y, ys[0]), (isa, rows)


@pytest.mark.parametrize("qtype", LANE_TYPES, ids=lambda t: t.name)
def test_the_lane_kernels_give_every_isa_the_same_bits(qtype: QT) -> None:
    # rows8.h (8 weight rows a 256-bit register) and vnni.h (16 a 512-bit one; and amx.h's
    # tiles) make each block's sum exact in int32, then take the same float steps
    shape = (77, 256 * 3 if qtype in K_TYPES else 32 * 13)

    def takes(isa: str, rows: int) -> bool:
        return isa in LEAST_LANE_ROWS and int16_rows(isa, rows, qtype)

    assert_every_isa_gives_the_same_bits(qtype, shape, 2, (5, 9, 16), takes)


@pytest.mark.parametrize("qtype", list(LEAST_Q8K_LANE_ROWS), ids=lambda t: t.name)
def test_the_lane_kernels_give_a_one_pass_weight_the_same_bits(qtype: QT) -> None:
    # with q8_K's codes too (rows8.h and vnni.h; not amx.h's int16 tiles)
    def takes(isa: str, rows: int) -> bool:
        return q8k_lane_rows(isa, rows, qtype)

    assert_every_isa_gives_the_same_bits(qtype, (77, 256 * 3), 1, (6, 9, 16), takes)


@pytest.mark.skipif(
    not {"avx2", "avxvnni"} <= set(native.runnable_isas()), reason="needs avx2 and avxvnni"
)
@pytest.mark.parametrize("qtype", SIMPLE + K_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("passes", [1, 2])
def test_avxvnni_gives_the_avx2_bits(qtype: QT, passes: int) -> None:
    # AVX-VNNI's vpdpwssd/vpdpbusd make the same exact int32 sums as vpmaddwd/vpmaddubsw and
    # their adds: every kernel (one row, several, a prompt's where both paths take the same
    # one, and gemm8 where avx2 has it; avxvnni gives gemm8 Q8_0 and IQ4_NL besides)
    shape = (40, 256 * 3 if qtype in K_TYPES else 32 * 11)
    raw, _ = weight(qtype, shape)
    x = torch.randn(NATIVE_ROWS + 3, shape[1], generator=torch.Generator().manual_seed(5))
    avx2, vnni = (
        NativeLinear(raw, qtype, *shape, kernels=native.kernels(isa), activation_passes=passes)
        for isa in ("avx2", "avxvnni")
    )
    for rows in (x[:1], x[:7], x[:NATIVE_ROWS]):
        assert torch.equal(vnni(rows), avx2(rows))
    if vnni.takes_int8(len(x)) == avx2.takes_int8(len(x)):
        assert torch.equal(vnni(x), avx2(x))
    if gemm8_prefill("avx2", qtype):
        want = prefill_product("gemm8", "avx2", raw, qtype, shape, x)
        assert torch.equal(prefill_product("gemm8", "avxvnni", raw, qtype, shape, x), want)
    if qtype in GEMM8:  # and gemm16
        want = prefill_product("gemm16", "avx2", raw, qtype, shape, x)
        assert torch.equal(prefill_product("gemm16", "avxvnni", raw, qtype, shape, x), want)


def test_many_rows_take_the_float32_path_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    from ember.backend import weights

    monkeypatch.setattr(weights, "CHUNK_FLOATS", 32 * 64)  # 77 rows of 64: three chunks
    monkeypatch.setattr(weights, "gemm16_prefill", lambda isa, ggml_type: False)
    raw, w = weight(QT.Q4_1, (77, 64))
    x = torch.randn(40, 64)
    got = NativeLinear(raw, QT.Q4_1, 77, 64)(x)
    torch.testing.assert_close(got, x @ w.t(), rtol=1e-5, atol=1e-5)
    batched = NativeLinear(raw, QT.Q4_1, 77, 64)(x.view(4, 10, 64))  # any leading dims
    assert batched.shape == (4, 10, 77)
    # a K type whose x takes two q8_K passes too; with one pass it keeps its int8 kernel, or
    # gemm8 where that has fast code for the type (but on the avx512 path)
    raw, w = weight(QT.Q4_K, (77, 256))
    x = torch.randn(40, 256)
    got, want = NativeLinear(raw, QT.Q4_K, 77, 256, activation_passes=2)(x), x @ w.t()
    assert float((got - want).abs().max() / want.abs().max()) < 1e-6  # float32 sums, not int8
    one = NativeLinear(raw, QT.Q4_K, 77, 256, activation_passes=1)
    if not int8_prefill(one.isa):  # there oneDNN's float32 matmul is faster
        assert float((one(x) - want).abs().max() / want.abs().max()) < 1e-6
    elif one.takes_int8(x.shape[0]):  # gemm8 (x in int8 per 32 values) where it is fast
        assert float((one(x) - want).abs().max() / want.abs().max()) < 3e-2
    else:
        assert torch.equal(one(x)[-1:], one(x[-1:]))


def test_the_torch_path_without_kernels() -> None:
    raw, w = weight(QT.Q5_0, (50, 96))
    lin = NativeLinear(raw, QT.Q5_0, 50, 96, kernels=False)
    assert lin.isa is None
    x = torch.randn(3, 96)
    torch.testing.assert_close(lin(x), x @ w.t(), rtol=1e-5, atol=1e-5)
    assert lin(torch.zeros(0, 96)).shape == (0, 50)


def test_concat_stacks_blocks_of_one_type_and_keeps_mixed_parts_apart() -> None:
    (a, wa), (b, wb) = weight(QT.Q4_1, (32, 64), 1), weight(QT.Q4_1, (16, 64), 2)
    fused = concat_linear([NativeLinear(a, QT.Q4_1, 32, 64), NativeLinear(b, QT.Q4_1, 16, 64)])
    assert isinstance(fused, NativeLinear) and fused.out_features == 48
    assert torch.equal(fused.dequantize(), torch.cat([wa, wb]))
    c, _ = weight(QT.Q8_0, (8, 64), 3)
    mixed = concat_linear([NativeLinear(a, QT.Q4_1, 32, 64), NativeLinear(c, QT.Q8_0, 8, 64)])
    assert isinstance(mixed, FusedLinear) and mixed.kind == "q4_1+q8_0"
    x = torch.randn(2, 64)
    assert mixed(x).shape == (2, 40)
    assert mixed.nbytes == a.numel() + c.numel()  # still blocks, nothing expanded


def test_f32_stays_dense_and_others_stay_blocks() -> None:
    raw = quantized(QT.F32, (8, 32))
    assert linear_from_gguf(raw, QT.F32, (8, 32)).kind == "f32"
    raw16 = quantized(QT.F16, (8, 32))
    lin = linear_from_gguf(raw16, QT.F16, (8, 32))
    assert lin.kind == "f16" and lin.nbytes == 8 * 32 * 2


def test_an_unknown_type_is_named() -> None:
    kern = native.kernels()
    assert kern is not None and not kern.supports(16)  # IQ2_XXS
    assert all(kern.supports(t) for t in SIMPLE + K_TYPES + FLOAT)
    assert kern.matmul(16, 0, 0, 0, 1, 1, 256, 2) == -1
    with pytest.raises(UnsupportedTypeError, match="IQ2_XXS"):
        NativeLinear(torch.zeros(66, dtype=torch.uint8), 16, 1, 256)


def test_cpu_isa_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CPU_ISA", "generic")
    kern = native.kernels()
    assert kern is not None and kern.isa == "generic"
    raw, _ = weight(QT.Q8_0, (16, 64))
    assert NativeLinear(raw, QT.Q8_0, 16, 64).isa == "generic"
    monkeypatch.setenv("EMBER_CPU_ISA", "sse9")
    with pytest.raises(OptionsError, match="EMBER_CPU_ISA"):
        native.kernels()
    missing = next(i for i in ("neon", "avx512", "avx2") if i not in native.runnable_isas())
    monkeypatch.setenv("EMBER_CPU_ISA", missing)
    with pytest.raises(native.NativeError, match=f"EMBER_CPU_ISA={missing}"):
        native.kernels()
    assert "error" in native.system_info()
    monkeypatch.delenv("EMBER_CPU_ISA")
    best = native.runnable_isas()[0]
    assert native.system_info().startswith(f"native kernels: {best} (cpu: ")


def _cpuinfo(field: str) -> list[str]:
    """Each value of `field` in /proc/cpuinfo (none where there is no such file)."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return [line.split(":", 1)[1].strip() for line in lines if line.startswith(field)]


def test_cpu_name_is_the_model_name_of_proc_cpuinfo() -> None:
    names = _cpuinfo("model name")
    assert native.cpu_name()
    if names:
        assert native.cpu_name() == names[0]


def test_prefetch_choices_follow_the_cpu_vendor() -> None:
    """dispatch.c's prefetch choices: on Intel's CPUs the K types ask 2 KiB ahead (4 KiB
    elsewhere), the int16-code kernels ask for each weight row with several rows of x too, and
    one row of x asks as the products go for rows of any length (elsewhere from 1.5 KiB); hints
    only, so a product's bits are the same either way, on every ISA path."""
    lib = native.library()
    assert lib is not None
    ahead = ctypes.c_int.in_dll(lib, "ember_kq_pf_ahead")
    batches = ctypes.c_int.in_dll(lib, "ember_pf_batches")
    row_min = ctypes.c_int.in_dll(lib, "ember_pf_row_min")
    chosen = ahead.value, batches.value, row_min.value
    vendors = _cpuinfo("vendor_id")
    if vendors:
        intel = vendors[0] == "GenuineIntel"
        assert chosen == ((2048, 1, 0) if intel else (4096, 0, 1536))
        assert native.cpu_is_intel() == intel
    cases = [(QT.Q4_K, 1), (QT.Q4_K, 3), (QT.Q4_1, 1), (QT.Q4_1, 3), (QT.Q8_0, 1), (QT.Q8_0, 8)]
    for isa in native.runnable_isas():
        for qtype, rows in cases:
            raw, _ = weight(qtype, (64, 1024))
            x = torch.randn(rows, 1024)
            w = NativeLinear(raw, qtype, 64, 1024, kernels=native.kernels(isa))
            products = []
            try:
                for setting in ((0, 0, 0), (1024, 1, 1536), (4096, 0, 1 << 30)):
                    ahead.value, batches.value, row_min.value = setting
                    products.append(w(x))
            finally:
                ahead.value, batches.value, row_min.value = chosen
            assert all(torch.equal(products[0], p) for p in products[1:]), (isa, qtype, rows)


@pytest.mark.model
@pytest.mark.slow
def test_generic_path_gives_a_real_model_the_same_greedy_tokens(
    monkeypatch: pytest.MonkeyPatch, smollm2_path, weight_isas
) -> None:
    from ember import LLM

    # A raw prompt of 5 tokens, under NATIVE_ROWS: every token then meets the per-row kernels
    # on every path. A longer prompt's gate and up take gemm8 (x in int8) on the x86 paths and
    # float32 on the generic one, by design (precision.py), and a near-tie can part them: the
    # chat template's "Why is the sky blue?" did at its second step on an Intel Xeon, where
    # " sky" led " answer" by 0.07 on avx512 and trailed it by 0.05 on generic.
    options = {"temperature": 0, "num_predict": 24}
    prompt = "The capital of France is"
    runs = {}
    for isa in dict.fromkeys(["generic", *native.runnable_isas()]):
        monkeypatch.setenv("EMBER_CPU_ISA", isa)
        llm = LLM(str(smollm2_path))
        assert weight_isas(llm.model) == {isa}
        assert len(llm.prompt_ids(prompt, raw=True)) <= NATIVE_ROWS
        runs[isa] = llm.generate(prompt, raw=True, options=options).tokens
    assert len(runs["generic"]) == 24
    assert len(set(map(tuple, runs.values()))) == 1, runs


def test_library_is_the_one_of_this_interpreter(monkeypatch, tmp_path: Path) -> None:
    """Another machine's build beside this one (the AArch64 library the emulated reference tests
    cross-compile into the package) sorts first but is not loaded."""
    from importlib import machinery

    own = tmp_path / f"_ember_kernels{machinery.EXTENSION_SUFFIXES[0]}"
    for path in (tmp_path / "_ember_kernels.cpython-311-aarch64-linux-gnu.so", own):
        path.write_bytes(b"")
    monkeypatch.setattr(native, "_HERE", tmp_path)
    assert native.library_path() == own
    own.unlink()  # a build under another suffix is still found (it may be loadable)
    assert native.library_path() == tmp_path / "_ember_kernels.cpython-311-aarch64-linux-gnu.so"
