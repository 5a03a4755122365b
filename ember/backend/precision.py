"""How each weight rounds its activations: by ISA path (which kernel a prompt or a token takes)
and by the GGUF tensor's role (how much rounding its input bears). NativeLinear
(ember/backend/weights.py) asks these once, at load."""

from ember.backend import gemm
from ember.gguf import GGMLType

# Types whose native kernel runs at any row count where x takes one q8_K pass: 83-120 GFLOPS
# against torch's 66-103 on dequantized float32 (512 rows of a 3B model's projections, AVX2,
# 2 threads: benchmarks/bench_prefill_kernels.py). Two passes cost twice, and the int16 path of
# the 32-element types half torch's speed: those keep the float32 matmul for prefill. Not on
# the avx512 path where oneDNN runs the float32 one (gemm.py): there it is the faster, 405-476
# GFLOPS against the int8 kernel's 303-328 (the same command, a Zen 5 EPYC), and exact; gemm16
# (below) takes those weights there now, faster again.
# the paths of the avx512 copy: amx is avx512 with AMX's tiles for 8-16 rows of x (Q4_K, Q5_K)
# and for the prompts' gemm8 and gemm16 products (amx.h: the same bits)
_AVX512 = ("avx512", "amx")

INT8_PREFILL = frozenset(
    {GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.IQ4_XS}
)


def float_activations(isa: str | None) -> bool:
    """Whether the 32-element types' kernels may take x as float32 on this ISA path (avx512
    and amx, simple.h's EM_FLOAT_X: IQ4_NL, and one row of Q8_0; the others take int16 codes
    per 32 values there too, vnni.h) instead of int16 codes per 32 values (every other path:
    simple.h's kernels with the same bits on each, and rows8.h's for several rows on avx2 and
    avxvnni, with vnni.h's bits)."""
    return isa in _AVX512


# Types whose prefill may take gemm8 (native/gemm8.h: x in int8 per 32 values, the weight unpacked
# 16 rows at a time into codes; a one-pass K type's, or any asked for by prefill_int8, which no
# loaded model is: see below), by ISA path, where it outruns the float32 matmul on 512 rows of
# the bundled models' and the 3B file's projections (GFLOPS, 2 threads, a Zen 5 EPYC:
# `benchmarks/bench_gemm8.py`, several runs). avx512 (VNNI): 640-860 against oneDNN's 360-450
# (Q6_K's 16-value units 540-590). avx2 (vpmaddubsw): 280-370 against oneDNN's AVX2 code's
# 210-240; its 8-bit codes would saturate: those keep float32. avxvnni (AVX-VNNI's 256-bit
# vpdpbusd, exact for every code width; everything else held to AVX2): 360-420 against 207-221,
# Q6_K 291, Q8_0 358. Since gemm8.h's AVX2 code unrolls a unit (2026-11-28, an Intel Xeon:
# avx2 Q5_0 262-302 against 207-231 before, Q6_K 208-218 against 147-168, oneDNN 180-208;
# avxvnni 376-413 against 267-312), avx2's Q6_K (two int16 sums a unit) takes it too. Since its
# panels unpack with AVX2 and AVX-VNNI's tile meets 16 weight rows a broadcast (2026-11-29, the
# Zen 5): avx512 945-1,135 (Q6_K 755), avxvnni 595-650 (Q6_K 480), avx2 415-445 (Q6_K 375),
# against oneDNN's 360-410 and 215-230.
_GEMM8_AVX2 = frozenset(
    {GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q4_K, GGMLType.Q5_K}
    | {GGMLType.Q6_K}
)
_GEMM8_VNNI = _GEMM8_AVX2 | {GGMLType.Q8_0, GGMLType.IQ4_NL}
_GEMM8 = {"avx512": _GEMM8_VNNI, "amx": _GEMM8_VNNI, "avxvnni": _GEMM8_VNNI, "avx2": _GEMM8_AVX2}


# Types whose prefill takes gemm16 (native/gemm16.h: x in int16 per 32 values, the decode
# kernels' rounding, ~2.5e-5 of the product from the float32 matmul's) where the weight takes
# neither gemm8 nor the one-pass q8_K kernel: the attention projections, their output and the
# down projection. GFLOPS on 512 rows of Gemma 3's and Qwen 0.5B's projections, 2 threads, the
# Zen 5 EPYC (`benchmarks/bench_gemm8.py --kernel gemm16 [--isa P]`, oneDNN held to AVX2 on the
# lower paths), against the float32 matmul there: avx512 (vpdpwssd) 625-640 against oneDNN's
# 375-470; avxvnni 355-385 and avx2 (vpmaddwd) 295-310 against oneDNN's AVX2 code's 215-245.
_GEMM16_TYPES = frozenset(
    {GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0, GGMLType.IQ4_NL}
    | {GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K}
)
_GEMM16_ISAS = frozenset({"avx512", "amx", "avxvnni", "avx2"})  # the x86 paths: fast code


def gemm16_prefill(isa: str | None, ggml_type: int) -> bool:
    """Whether a weight of `ggml_type` that takes neither gemm8 nor the q8_K kernel for prefill
    takes gemm16 on this ISA path (else the float32 matmul)."""
    return isa in _GEMM16_ISAS and ggml_type in _GEMM16_TYPES


def gemm8_prefill(isa: str | None, ggml_type: int) -> bool:
    """Whether a weight of `ggml_type` whose input may be int8 (prefill_int8) takes gemm8 for
    prefill on this ISA path."""
    return isa is not None and ggml_type in _GEMM8.get(isa, ())


def int8_prefill(isa: str | None) -> bool:
    """Whether a one-pass K type's prefill takes its int8 kernel on this ISA path (not where
    oneDNN runs the float32 matmul at AVX-512 speed: see INT8_PREFILL)."""
    return not (isa in _AVX512 and gemm.available())


# The GGUF weights whose input is a normalized hidden state, without outliers: one q8_K pass
# over it is enough for a K type, as llama.cpp takes everywhere. Every other weight keeps two:
# a down projection's input (an activation times a projection) is heavy-tailed, and an attention
# output's rounding depends on the batch (its sums run over other sequences' masked cells), which
# one int8 pass turns into code flips: Gemma 3's eight parallel sequences then parted from each
# run alone at a near-tie.
_ONE_PASS = frozenset(
    {"attn_q", "attn_k", "attn_v", "attn_qkv", "ffn_gate", "ffn_up", "output", "token_embd"}
    | {"ffn_gate_exps", "ffn_up_exps", "ffn_gate_shexp", "ffn_up_shexp"}
)


def activation_passes(name: str) -> int:
    """The q8_K passes (NativeLinear's activation_passes) for the GGUF tensor `name`."""
    return 1 if _stem(name) in _ONE_PASS else 2


# No weight of a 32-element type takes gemm8 for a prompt (NativeLinear's prefill_int8 stays
# off): its int8 rounding of x made a prompt's logits depend on its batch. The MLP's gate and up
# had taken it (their input is a normalized hidden state), and the real models' reference
# prompts held, but Gemma 3's chats of 17 tokens and more (one batch) left the float32
# reference's first logits by up to 5.8% of the largest (26-41-token chats: 5.8, 2.7, 0.8,
# 0.5%; its 15-token reference chat pushed through gemm8, 8.3%; the bar is 5%), where the same
# prompts in batches of 8 (the decode kernels' int16 codes) were within 0.07%. gemm16 (int16 per
# 32 values) keeps them within 0.11% in any batch (tests/model/test_reference.py).


def _stem(name: str) -> str:
    return name.removesuffix(".weight").rsplit(".", 1)[-1]
