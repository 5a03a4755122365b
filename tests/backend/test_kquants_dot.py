"""kquants.h (K-quant rows times q8_K activations) on every ISA path this CPU runs.

A tiny C shim (kquants_shim.c) is compiled per ISA with the system C compiler and loaded with
ctypes. For Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and IQ4_XS rows (llama.cpp-exact encodings of random
floats where ember.store.kquants has one, random valid blocks for every type), the checks are:
dequantization bit-exact against gguf.quants; q8_K quantization exactly as llama.cpp's reference
(replicated in numpy); dot products equal to a float64 dequant(W) @ dequant(q8_K(x)) within
float32 accumulation error, and to dequant(W) @ x within the int8 activation error.
"""

import ctypes
import shutil
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

from ember.store import kquants as encoders

SHIM = Path(__file__).with_name("kquants_shim.c")
QK = 256
Q8_BYTES = 4 + 256 + 32 + 16  # d, qs, bsums (16 values each), bsums32 (32 each)

# ggml type -> (block bytes, byte offsets of its fp16 fields)
TYPES = {
    QT.Q2_K: (84, (80, 82)),
    QT.Q3_K: (110, (108,)),
    QT.Q4_K: (144, (0, 2)),
    QT.Q5_K: (176, (0, 2)),
    QT.Q6_K: (210, (208,)),
    QT.IQ4_XS: (136, (0,)),
}
ENCODERS = {
    QT.Q4_K: encoders.quantize_q4_k,
    QT.Q5_K: encoders.quantize_q5_k,
    QT.Q6_K: encoders.quantize_q6_k,
}

ISAS = {
    "generic": ([], set()),
    "avx2": (["-mavx2", "-mfma", "-mf16c"], {"avx2", "fma", "f16c"}),
    # the relaxed float flags kernels.c is built with: results must not change under them
    "avx2-relaxed": (
        [
            *("-mavx2", "-mfma", "-mf16c", "-fno-math-errno", "-fassociative-math"),
            *("-fno-signed-zeros", "-fno-trapping-math"),
        ],
        {"avx2", "fma", "f16c"},
    ),
    "avxvnni": (["-mavx2", "-mfma", "-mf16c", "-mavxvnni"], {"avx2", "fma", "f16c", "avx_vnni"}),
    "avx512": (
        ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"],
        {"avx512f", "avx512bw", "avx512vl", "avx2", "fma", "f16c"},
    ),
    "avx512vnni": (
        ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni", "-mavx2", "-mfma", "-mf16c"],
        {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx2", "fma", "f16c"},
    ),
}
IMPL_NAMES = {
    "avx2-relaxed": "x86-avx2",
    "generic": "generic",
    "avx2": "x86-avx2",
    "avxvnni": "x86-avx2-vnni",
    "avx512": "x86-avx512",
    "avx512vnni": "x86-avx512-vnni",
}


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@pytest.fixture(scope="session")
def shim_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kquants")


def _load(isa: str, out_dir: Path) -> ctypes.CDLL:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    flags, needs = ISAS[isa]
    if isa != "generic" and not needs <= _cpu_flags():
        missing = sorted(needs - _cpu_flags())
        pytest.skip(f"this CPU lacks {missing}: the {isa} path cannot run here")
    so = out_dir / f"kq_{isa}.so"
    if not so.exists():
        # -ffp-contract=fast: dequantization must stay bit-exact even with FMA contraction on
        cmd = [cc, "-O3", "-Wall", "-Wextra", "-Werror", "-ffp-contract=fast", *flags, "-shared"]
        done = subprocess.run([*cmd, "-fPIC", str(SHIM), "-o", str(so)], capture_output=True)
        assert done.returncode == 0, done.stderr.decode()
    lib = ctypes.CDLL(str(so))
    p, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.shim_impl.restype = ctypes.c_char_p
    lib.shim_quantize_q8_K.argtypes = [p, p, i64]
    lib.shim_dot.argtypes = [c_int, p, p, i64, i64, p]
    lib.shim_dot_generic.argtypes = [c_int, p, p, i64, i64, p]
    lib.shim_dot_table.argtypes = [c_int, p, p, i64, i64, p]
    lib.shim_dot_rows.argtypes = [c_int, p, p, c_int, i64, i64, p]
    lib.shim_dequant.argtypes = [c_int, p, p, i64]
    return lib


@pytest.fixture(scope="session", params=list(ISAS))
def lib(request: pytest.FixtureRequest, shim_dir: Path) -> tuple[str, ctypes.CDLL]:
    return request.param, _load(request.param, shim_dir)


def _ptr(a: np.ndarray) -> int:
    assert a.flags.c_contiguous
    return a.ctypes.data


def random_blocks(qtype: QT, rows: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Random valid blocks: random codes and scale bytes, small finite fp16 super-scales (a few
    subnormal ones too, for the fp16 conversion)."""
    size, f16_fields = TYPES[qtype]
    nb = rows * k // QK
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    for off in f16_fields:
        d = (rng.standard_normal(nb) * 0.01).astype(np.float16)
        d[:: max(1, nb // 3)] = np.float16(rng.integers(1, 1024) * 2.0**-24)  # subnormal
        raw[:, off : off + 2] = d.view(np.uint8).reshape(nb, 2)
    return raw.reshape(rows, -1)


def weights(qtype: QT, rows: int, k: int, rng: np.random.Generator, encoded: bool) -> np.ndarray:
    if encoded:
        w = rng.standard_normal((rows, k)).astype(np.float32)
        return np.ascontiguousarray(ENCODERS[qtype](w))
    return random_blocks(qtype, rows, k, rng)


def q8_k_numpy(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's quantize_row_q8_K_ref in float32 numpy: (qs int8 (nb, 256), d float32 (nb,))."""
    blocks = x.astype(np.float32).reshape(-1, QK)
    idx = np.argmax(np.abs(blocks), axis=1)  # first of the largest magnitudes, as the C loop
    mx = blocks[np.arange(len(blocks)), idx]
    qs = np.zeros(blocks.shape, np.int8)
    d = np.zeros(len(blocks), np.float32)
    for b, m in enumerate(mx):
        if m == 0:
            continue
        iscale = np.float32(-127.0) / m
        v = np.round(iscale * blocks[b])  # float32 product, round half to even
        qs[b] = np.minimum(v, 127).astype(np.int8)
        d[b] = np.float32(1.0) / iscale
    return qs, d


def quantize_x(lib: ctypes.CDLL, x: np.ndarray) -> np.ndarray:
    buf = np.zeros(len(x) // QK * Q8_BYTES, np.uint8)
    lib.shim_quantize_q8_K(_ptr(x), _ptr(buf), len(x))
    return buf


def parse_q8(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    blocks = buf.reshape(-1, Q8_BYTES)
    d = blocks[:, :4].copy().view(np.float32).reshape(-1)
    qs = blocks[:, 4:260].copy().view(np.int8)
    bsums = blocks[:, 260:292].copy().view(np.int16)
    bsums32 = blocks[:, 292:].copy().view(np.int16)
    return qs, d, bsums, bsums32


@pytest.mark.parametrize("isa", [i for i in ISAS if i != "generic"])
def test_x86_paths_compile(isa, shim_dir):
    """The x86 paths this CPU cannot run still compile, without a warning."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    if ISAS[isa][1] <= _cpu_flags():
        pytest.skip(f"this CPU runs {isa}: the other tests build it with -Werror and run it")
    probe = subprocess.run([cc, "-dumpmachine"], capture_output=True, text=True)
    if not probe.stdout.startswith(("x86_64", "i686", "i386")):
        pytest.skip(f"the compiler targets {probe.stdout.strip()}, not x86")
    obj = shim_dir / f"compile_{isa}.o"
    done = subprocess.run(
        [cc, "-O1", "-Wall", "-Wextra", "-Werror", *ISAS[isa][0], "-c", str(SHIM), "-o", str(obj)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def test_shim_reports_its_path_and_sizes(lib):
    isa, so = lib
    assert so.shim_impl().decode() == IMPL_NAMES[isa]
    assert so.shim_q8_block_bytes() == Q8_BYTES
    assert [so.shim_block_bytes(int(t)) for t in TYPES] == [84, 110, 144, 176, 210, 136]
    assert [so.shim_block_bytes(t) for t in (0, 1, 2, 8, 15, 20, 22, 24)] == [-1] * 8
    for t, (size, _) in TYPES.items():
        assert gguf.GGML_QUANT_SIZES[t] == (QK, size)


@pytest.mark.parametrize("k", [256, 512, 2816])
def test_q8_k_is_llama_cpp_reference(lib, k):
    _, so = lib
    rng = np.random.default_rng(k)
    x = (rng.standard_normal(k) * rng.uniform(0.1, 10)).astype(np.float32)
    x[:QK] = 0.0 if k > QK else x[:QK]  # an all-zero block when there are several
    x[-5] = -40.0  # the signed maximum of the last block is negative
    qs, d, bsums, bsums32 = parse_q8(quantize_x(so, x))
    ref_qs, ref_d = q8_k_numpy(x)
    np.testing.assert_array_equal(qs, ref_qs)
    np.testing.assert_array_equal(d, ref_d)
    np.testing.assert_array_equal(bsums, qs.reshape(-1, 16, 16).astype(np.int32).sum(-1))
    np.testing.assert_array_equal(bsums32, qs.reshape(-1, 8, 32).astype(np.int32).sum(-1))


# (type, encoded): random valid blocks for every type, llama.cpp-exact encodings where Ember has one
CASES = [pytest.param(t, False, id=f"{t.name}-random") for t in TYPES] + [
    pytest.param(t, True, id=f"{t.name}-encoded") for t in ENCODERS
]


@pytest.mark.parametrize("qtype,encoded", CASES)
def test_dequant_bit_exact(lib, qtype, encoded):
    _, so = lib
    rng = np.random.default_rng(int(qtype))
    rows, k = 3, 2816
    w = weights(qtype, rows, k, rng, encoded)
    ref = gguf.quants.dequantize(w, qtype).astype(np.float32)
    out = np.empty((rows, k), np.float32)
    assert so.shim_dequant(int(qtype), _ptr(w), _ptr(out), rows * k) == 0
    np.testing.assert_array_equal(out.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("qtype,encoded", CASES)
@pytest.mark.parametrize("k", [256, 512, 2816])
def test_dot_equals_float64_reference(lib, qtype, k, encoded):
    _, so = lib
    rng = np.random.default_rng(k * 100 + int(qtype) + 7 * encoded)
    rows = 6
    w = weights(qtype, rows, k, rng, encoded)
    wf = gguf.quants.dequantize(w, qtype).astype(np.float64)
    x = rng.standard_normal(k).astype(np.float32)
    xq = quantize_x(so, x)
    qs, d, _, _ = parse_q8(xq)
    xd = (qs.astype(np.float64) * d.astype(np.float64)[:, None]).reshape(-1)

    got = np.empty(rows, np.float32)
    assert so.shim_dot(int(qtype), _ptr(w), _ptr(xq), rows, k, _ptr(got)) == 0
    table = np.empty(rows, np.float32)
    assert so.shim_dot_table(int(qtype), _ptr(w), _ptr(xq), rows, k, _ptr(table)) == 0
    np.testing.assert_array_equal(table, got)
    generic = np.empty(rows, np.float32)
    assert so.shim_dot_generic(int(qtype), _ptr(w), _ptr(xq), rows, k, _ptr(generic)) == 0

    # against the exact product with the quantized activations: float32 accumulation error only,
    # measured against the size of a sum of these terms (their l2 norm)
    exact = wf @ xd
    scale = np.sqrt(((wf * xd) ** 2).sum(axis=1))
    size = np.maximum(np.abs(exact), scale)
    assert np.all(np.abs(got - exact) <= 1e-5 * size), (got, exact)
    assert np.all(np.abs(generic - exact) <= 1e-5 * size), (generic, exact)
    # the SIMD path and the portable one: same integer sums, only float order differs
    assert np.all(np.abs(got - generic) <= 2e-6 * size)

    # against float activations: within the int8 activation error (~0.7% of a sum's size)
    full = wf @ x.astype(np.float64)
    scale_x = np.sqrt(((wf * x.astype(np.float64)) ** 2).sum(axis=1))
    assert np.all(np.abs(got - full) <= 4e-2 * scale_x), (got, full)


@pytest.mark.parametrize("qtype", list(TYPES), ids=lambda t: t.name)
@pytest.mark.parametrize("fill", [0x00, 0xFF, 0x55, 0xAA])
def test_dot_extreme_blocks(lib, qtype, fill):
    """Codes and scales at their extremes and |q8| = 127 everywhere: the int16 products of
    vpmaddubsw and the int32 sums must not saturate or wrap on any path."""
    _, so = lib
    size, f16_fields = TYPES[qtype]
    k, rows = 512, 2
    w = np.full((rows * k // QK, size), fill, np.uint8)
    for off in f16_fields:
        w[:, off : off + 2] = np.array([1.0], np.float16).view(np.uint8)
    w = w.reshape(rows, -1)
    wf = gguf.quants.dequantize(w, qtype).astype(np.float64)
    for x in (
        np.ones(k, np.float32),
        np.where(np.arange(k) % 3 == 0, -1.0, 1.0).astype(np.float32),
    ):
        xq = quantize_x(so, x)
        qs, d, _, _ = parse_q8(xq)
        assert np.abs(qs.astype(int)).max() == 127
        xd = (qs.astype(np.float64) * d.astype(np.float64)[:, None]).reshape(-1)
        got = np.empty(rows, np.float32)
        assert so.shim_dot(int(qtype), _ptr(w), _ptr(xq), rows, k, _ptr(got)) == 0
        exact = wf @ xd
        size_ = np.maximum(np.abs(exact), np.sqrt(((wf * xd) ** 2).sum(axis=1)))
        assert np.all(np.abs(got - exact) <= 1e-5 * size_), (got, exact)


@pytest.mark.parametrize("qtype", list(TYPES), ids=lambda t: t.name)
def test_dot_rows_bit_identical_to_single_rows(lib, qtype):
    """kq_dot_rows_*: 1 to 7 rows of x at once, each output bit-identical to that row alone."""
    _, so = lib
    rng = np.random.default_rng(int(qtype) + 99)
    k, rows = 2816, 3
    w = weights(qtype, rows, k, rng, encoded=qtype in ENCODERS)
    for nx in range(1, 8):
        x = rng.standard_normal((nx, k)).astype(np.float32)
        xq = np.concatenate([quantize_x(so, row) for row in x])
        got = np.empty((rows, nx), np.float32)
        assert so.shim_dot_rows(int(qtype), _ptr(w), _ptr(xq), nx, rows, k, _ptr(got)) == 0
        for j in range(nx):
            one = np.empty(rows, np.float32)
            xj = np.ascontiguousarray(xq.reshape(nx, -1)[j])
            assert so.shim_dot(int(qtype), _ptr(w), _ptr(xj), rows, k, _ptr(one)) == 0
            np.testing.assert_array_equal(got[:, j].view(np.uint32), one.view(np.uint32))
