"""Ember's native kernels: the shared library setup.py builds at install (kernels.c compiled once
per ISA, dispatch.c), loaded with ctypes. torch is not imported here (the server process asks
for `system_info()` and has no use for torch).

`kernels()` gives the functions of one ISA copy: the best this CPU runs, or the one
EMBER_CPU_ISA names (an ISA the CPU lacks is a NativeError). Without the library (a build with
no compiler), `kernels()` is None and the weights run on the pure-PyTorch path.
"""

import ctypes
import os
import platform
from dataclasses import dataclass
from functools import cache
from importlib import machinery
from pathlib import Path

from ember import envconfig
from ember.errors import EmberError

# numbered as dispatch.c: generic 0, avx2 1, avxvnni 2, avx512 3, neon 4, amx 5, neondot 6
ISAS = envconfig.CPU_ISAS
_HERE = Path(__file__).parent
_i64, _ptr, _int, _float = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float


class NativeError(EmberError, RuntimeError):
    """The native kernels cannot do what was asked (an ISA this CPU lacks, a type they lack)."""


@dataclass(frozen=True, slots=True)
class Kernels:
    """One ISA copy's entry points (ctypes functions; pointers and sizes as ints).

    matmul(type, W, x, y, M, N, K, passes) -> 0 | -1 type | -2 shape | -3 memory: y (M, N) =
        x @ W^T; passes: 1 or 2 q8_K passes over x for the K types (kernels.c's em_prep)
    dequant(type, W, out, rows, K) -> same codes: out (rows, K) float32
    attend(kv_type, q, H, D, k, k_hs, k_cs, v, v_hs, v_cs, H_kv, D_v, S, mask, scale, out) -> 0
        | -1 | -2 | -3: one token's attention over a float KV cache range (attend.h)
    layer(&em_layer, threads) -> same codes: one decoder layer for a few tokens (layer.h; the
        struct is ember/backend/layer.py's LayerArgs)
    act_mul(act, gu, M, F, ld, out, ldo) -> 0 | -1 act | -2 shape: out (M, F; rows ldo floats
        apart) = act(g) * u for rows [g | u] of gu, ld floats apart; act 0 silu, 1 tanh-GELU
    rms_norm(x, M, n, ldx, w, eps, out, ldo) -> 0 | -2 shape: RMSNorm of M rows of n floats,
        times w (n floats, or NULL)
    qk_rope(x, M, H, D, ldx, Hq, norm, qn, kn, eps, cos, sin, rope_dim, neox, q_scale, out) -> 0
        | -2 shape: out (M, H, D) = the H heads of x's rows normalised (norm; times qn for the
        first Hq, kn for the rest, each D floats or NULL), RoPE-rotated, the first Hq scaled
    q8_rows(x, M, K, xq) -> 0 | -2 shape: x (M, K) float32 quantized per 32 values into xq (M
        rows of q8_row_bytes(K) bytes) for gemm8
    gemm8(type, W, xq, M, N, K, y, ldy) -> 0 | -1 | -2 | -3: y (M, N; rows ldy floats apart) =
        x @ W^T in int8, x as q8_rows made it (gemm8.h; fast on avx512 alone)
    q16_rows(x, M, K, xq) -> 0 | -2 shape: x (M, K) float32 quantized per 32 values into xq (M
        rows of q16_row_bytes(K) bytes) for gemm16
    gemm16(type, W, xq, M, N, K, y, ldy) -> 0 | -1 | -2 | -3: y (M, N; rows ldy floats apart) =
        x @ W^T in int16, x as q16_rows made it (gemm16.h; fast on the x86 paths)
    prompt_attend(q, T, H, D, k, v, H_kv, S, D_v, scale, window, out) -> 0 | -2 | -3: out (T, H,
        D_v) = one sequence's prompt attention under a causal mask, the last `window` cells of
        each token's where window > 0, all float32 and contiguous (prompt_attend.h)
    argmax_rows(x, V, maxima, block, rows, G, ids) -> 0 | -2: ids (G int64) = torch.argmax of
        the G rows `rows` (int64) of x, through their block maxima (sample.h)
    """

    isa: str
    matmul: ctypes._CFuncPtr  # type: ignore[name-defined]
    dequant: ctypes._CFuncPtr  # type: ignore[name-defined]
    block_elems: ctypes._CFuncPtr  # type: ignore[name-defined]
    attend: ctypes._CFuncPtr  # type: ignore[name-defined]
    layer: ctypes._CFuncPtr  # type: ignore[name-defined]
    act_mul: ctypes._CFuncPtr  # type: ignore[name-defined]
    rms_norm: ctypes._CFuncPtr  # type: ignore[name-defined]
    qk_rope: ctypes._CFuncPtr  # type: ignore[name-defined]
    q8_rows: ctypes._CFuncPtr  # type: ignore[name-defined]
    gemm8: ctypes._CFuncPtr  # type: ignore[name-defined]
    q16_rows: ctypes._CFuncPtr  # type: ignore[name-defined]
    gemm16: ctypes._CFuncPtr  # type: ignore[name-defined]
    prompt_attend: ctypes._CFuncPtr  # type: ignore[name-defined]
    argmax_rows: ctypes._CFuncPtr  # type: ignore[name-defined]

    def supports(self, ggml_type: int) -> bool:
        return self.block_elems(int(ggml_type)) > 0


def library_path() -> Path | None:
    """The library the package build left beside this file for this interpreter, if any: by its
    extension suffix first (a tree may hold another machine's build beside it, e.g. the AArch64
    one the emulated reference tests cross-compile: tests/model/test_reference_arm.py)."""
    for suffix in machinery.EXTENSION_SUFFIXES:
        if (path := _HERE / f"_ember_kernels{suffix}").is_file():
            return path
    found = sorted(_HERE.glob("_ember_kernels*.so")) + sorted(_HERE.glob("_ember_kernels*.dylib"))
    return found[0] if found else None


@cache
def library() -> ctypes.CDLL | None:
    path = library_path()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path))
    except OSError:
        return None
    lib.ember_cpu_features.restype = ctypes.c_char_p
    lib.ember_set_threads.argtypes = [_int]
    lib.ember_set_threads.restype = None
    return lib


def available() -> bool:
    """Whether the native library was built and loads."""
    return library() is not None


def runnable_isas() -> list[str]:
    """The ISA copies compiled in that this CPU runs, best first."""
    lib = library()
    if lib is None:
        return []
    ok = [i for i in range(len(ISAS)) if lib.ember_isa_compiled(i) and lib.ember_cpu_supports(i)]
    return [ISAS[i] for i in sorted(ok, reverse=True)]


def cpu_name() -> str:
    """The CPU's model name ("AMD EPYC"), for benchmark headers; the machine's type where the
    system does not say."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_is_intel() -> bool:
    """Whether the CPU is Intel's (cpuid's vendor, as the library read it when it loaded)."""
    lib = library()
    return lib is not None and ctypes.c_int.in_dll(lib, "ember_cpu_intel").value == 1


def set_lanes_x8(x8: bool) -> None:
    """Makes the lane kernels (rows8.h; vnni.h on the avx512 path) take a one-pass K type's x
    as q8_K's int8 codes (the default) or as int16 ones; for benchmarks."""
    lib = library()
    if lib is not None:
        ctypes.c_int.in_dll(lib, "ember_lanes_x8").value = int(x8)


def cpu_features() -> str:
    """The CPU's SIMD features that matter to the kernels ("avx2 fma f16c"), as detected."""
    lib = library()
    return lib.ember_cpu_features().decode() if lib is not None else ""


def chosen_isa() -> str | None:
    """EMBER_CPU_ISA, else the best ISA this CPU runs; None without the library."""
    runnable = runnable_isas()
    wanted = envconfig.cpu_isa()
    if not runnable:
        if wanted:
            raise NativeError(
                f"EMBER_CPU_ISA={wanted}, but Ember's native kernels were not built (no C "
                "compiler at install?)"
            )
        return None
    if wanted and wanted not in runnable:
        lib = library()
        why = (
            "this CPU lacks it"
            if lib and lib.ember_isa_compiled(ISAS.index(wanted))
            else ("the library was built without it")
        )
        raise NativeError(
            f"EMBER_CPU_ISA={wanted}: {why} (CPU features: {cpu_features() or 'none'}; "
            f"available: {', '.join(runnable)})"
        )
    return wanted or runnable[0]


@cache
def _kernels_of(isa: str) -> Kernels:
    lib = library()
    assert lib is not None
    matmul = getattr(lib, f"ember_matmul_{isa}")
    matmul.argtypes = [_int, _ptr, _ptr, _ptr, _i64, _i64, _i64, _int]
    dequant = getattr(lib, f"ember_dequant_{isa}")
    dequant.argtypes = [_int, _ptr, _ptr, _i64, _i64]
    block_elems = getattr(lib, f"ember_block_elems_{isa}")
    block_elems.argtypes = [_int]
    attend = getattr(lib, f"ember_attend_{isa}")
    attend.argtypes = [_int, _ptr, _i64, _i64, *[_ptr, _i64, _i64] * 2, _i64, _i64, _i64]
    attend.argtypes += [_ptr, ctypes.c_float, _ptr]
    layer = getattr(lib, f"ember_layer_{isa}")
    layer.argtypes = [_ptr, _int]
    act_mul = getattr(lib, f"ember_act_mul_{isa}")
    act_mul.argtypes = [_int, _ptr, _i64, _i64, _i64, _ptr, _i64]
    rms_norm = getattr(lib, f"ember_rms_norm_{isa}")
    rms_norm.argtypes = [_ptr, _i64, _i64, _i64, _ptr, ctypes.c_float, _ptr, _i64]
    qk_rope = getattr(lib, f"ember_qk_rope_{isa}")
    qk_rope.argtypes = [_ptr, *[_i64] * 5, _int, _ptr, _ptr, ctypes.c_float, _ptr, _ptr, _i64]
    qk_rope.argtypes += [_int, ctypes.c_float, _ptr]
    q8_rows = getattr(lib, f"ember_q8_rows_{isa}")
    q8_rows.argtypes = [_ptr, _i64, _i64, _ptr]
    gemm8 = getattr(lib, f"ember_gemm8_{isa}")
    gemm8.argtypes = [_int, _ptr, _ptr, _i64, _i64, _i64, _ptr, _i64]
    q16_rows = getattr(lib, f"ember_q16_rows_{isa}")
    q16_rows.argtypes = [_ptr, _i64, _i64, _ptr]
    gemm16 = getattr(lib, f"ember_gemm16_{isa}")
    gemm16.argtypes = [_int, _ptr, _ptr, _i64, _i64, _i64, _ptr, _i64]
    prompt_attend = getattr(lib, f"ember_prompt_attend_{isa}")
    prompt_attend.argtypes = [_ptr, *[_i64] * 3, _ptr, _ptr, *[_i64] * 3, _float, _i64, _ptr]
    argmax_rows = getattr(lib, f"ember_argmax_rows_{isa}")
    argmax_rows.argtypes = [_ptr, _i64, _ptr, _i64, _ptr, _i64, _ptr]
    return Kernels(
        isa,
        *(matmul, dequant, block_elems, attend, layer, act_mul, rms_norm, qk_rope),
        *(q8_rows, gemm8, q16_rows, gemm16, prompt_attend, argmax_rows),
    )


def q8_row_bytes(k: int) -> int:
    """Bytes of one row of x quantized for gemm8 (gemm8.h's em_g8_row_bytes)."""
    return k + k // 32 * 8 + k // 16 * 4


def q16_row_bytes(k: int) -> int:
    """Bytes of one row of x quantized for gemm16: k / 32 of simple.h's em_block_q16 (d, s and
    32 int16 codes)."""
    return k // 32 * 72


def kernels(isa: str | None = None) -> Kernels | None:
    """The kernels of `isa` (it must be runnable here), or of `chosen_isa()`; None without the
    library."""
    if isa is None:
        isa = chosen_isa()
        if isa is None:
            return None
    elif isa not in runnable_isas():
        raise NativeError(
            f"the {isa} kernels cannot run here (available: {', '.join(runnable_isas()) or 'none'})"
        )
    return _kernels_of(isa)


def usable_kernels() -> Kernels | None:
    """`kernels()` where they can run, else None (no library, or an EMBER_CPU_ISA this CPU
    lacks: the callers then take torch)."""
    return _usable(envconfig.cpu_isa())


@cache
def _usable(isa: str | None) -> Kernels | None:  # keyed by EMBER_CPU_ISA: tests change it
    try:
        return kernels()
    except NativeError:
        return None


_threads = [-1]


def set_threads(n: int) -> None:
    """Threads for the kernels' parallel loops (callers pass torch's count, so both agree)."""
    if n != _threads[0]:
        lib = library()
        if lib is not None:
            lib.ember_set_threads(n)
        _threads[0] = n


def system_info_fields() -> dict[str, str]:
    """The native path, for the server's startup line: kernels (ISA or why none), cpu, threads."""
    threads = str(envconfig.num_threads() or os.cpu_count() or 1)
    try:
        isa = chosen_isa()
    except (NativeError, EmberError) as err:
        return {"kernels": f"error: {err}", "cpu": cpu_features(), "threads": threads}
    if isa is None:
        return {"kernels": "unavailable: pure PyTorch", "cpu": "", "threads": threads}
    return {"kernels": isa, "cpu": cpu_features(), "threads": threads}


def system_info() -> str:
    """One line: "native kernels: avx2 (cpu: avx2 fma f16c), threads 2", or why there are none."""
    f = system_info_fields()
    if f["kernels"].startswith(("unavailable", "error")):
        return f"native kernels {f['kernels']}"
    return f"native kernels: {f['kernels']} (cpu: {f['cpu'] or 'none'}), threads {f['threads']}"
