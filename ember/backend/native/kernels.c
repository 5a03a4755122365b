/* The driver: y = x @ W^T straight from a weight's GGUF blocks, and rows of W as float32.
 *
 * setup.py compiles this file once per ISA with that ISA's flags and -DEMBER_ISA=<name>, so
 * every exported name ends in the ISA (ember_matmul_avx2 ...); dispatch.c picks one at run time.
 *
 *   ember_matmul_<isa>(type, W, x, y, M, N, K): W (N, K) in ggml type `type` (its file bytes),
 *       x (M, K) float32, y (M, N) float32. The M rows of x are quantized once (blocks:
 *       simple.h's int16 blocks for the 32-element types, kquants.h's q8_K for the K types:
 *       `passes` 2 (or 0) takes x then its rounding error, 1 takes x alone, as llama.cpp;
 *       F16/BF16 use them as they are; the lane kernels' int16 blocks where they take the
 *       rows, vnni.h's and rows8.h's, or q8_K's there for a one-pass K type); OpenMP
 *       splits W in chunks of rows, and each W row is used by all M rows of x while it sits in
 *       L1. Returns 0, or -1 for a type it lacks, -2 for a K that is not whole blocks, -3
 *       when out of memory.
 *   ember_dequant_<isa>(type, W, out, rows, K): out (rows, K) float32, bit-equal to gguf-py.
 *   ember_block_elems_<isa>(type): elements of a block, 0 for a type it lacks.
 *   ember_attend_<isa>(...): one token's attention over a float KV cache range (attend.h);
 *       returns 0, -1 for a cache type it lacks, -2 for a bad shape, -3 when out of memory.
 *   ember_prompt_attend_<isa>(q, T, H, D, k, v, H_kv, S, D_v, scale, window, out): one sequence's
 *       prompt attention under a causal mask, with a sliding window where window > 0
 *       (prompt_attend.h); 0, -2 bad shape, -3 memory.
 *   ember_layer_<isa>(layer, threads): one decoder layer for a few tokens (layer.h).
 *   ember_act_mul_<isa>(act, gu, M, F, ld, out, ldo): a gated MLP's act(gate) * up for M rows.
 *   ember_rms_norm_<isa>(x, M, n, ldx, w, eps, out, ldo): RMSNorm over M rows (a prompt's).
 *   ember_qk_rope_<isa>(x, M, H, D, ldx, Hq, norm, qn, kn, eps, cos, sin, rope_dim, neox,
 *       q_scale, out): a prompt's q and k heads normalised, rotated and q scaled.
 *   ember_argmax_rows_<isa>(x, V, maxima, block, rows, G, ids): the sampler's argmax over rows
 *       of a batch's logits through their block maxima (sample.h).
 */
#include <stdlib.h>

extern int ember_kq_pf_ahead; /* dispatch.c: the K types' prefetch distance for this CPU */
extern int ember_pf_batches;  /* dispatch.c: 1 where the int16-code kernels ask with any rows */
extern int ember_pf_row_min;  /* dispatch.c: rows at least this long ask as the products go */
extern int ember_lanes_x8;    /* dispatch.c: 1 unless a benchmark compares int16 codes */
#define KQ_PF_AHEAD ember_kq_pf_ahead

#include "attend.h"
#include "prompt_attend.h"
#include "gemm8.h"
#include "gemm16.h"
#include "kquants.h"
#include "simple.h"

#ifndef EMBER_ISA
#define EMBER_ISA generic
#endif
#define EM_JOIN2(a, b) a##_##b
#define EM_JOIN(a, b) EM_JOIN2(a, b)
#define EM_EXPORT(name) __attribute__((visibility("default"))) EM_JOIN(name, EMBER_ISA)

extern int ember_num_threads; /* dispatch.c: 0 = OpenMP's default */

#define EM_ROWS_PER_CHUNK 16
#define EM_MIN_PARALLEL_BYTES (64 * 1024) /* smaller weights run on the calling thread */

/* Scratch on whole 64-byte lines: a 512-bit load of activations that straddles two lines costs
 * two, and malloc's 16-byte alignment varied with the heap's state, so SmolLM2's 8-row decode
 * step ran at ~510 or ~650 tok/s by where its scratch fell (Zen 5, bench_step.py). */
static void *em_alloc_lines(size_t bytes) {
    return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
}

enum { EM_F16 = 1, EM_Q4_0 = 2, EM_Q4_1 = 3, EM_Q5_0 = 6, EM_Q5_1 = 7, EM_Q8_0 = 8,
       EM_IQ4_NL = 20, EM_BF16 = 30 };

typedef void (*em_dots_q16)(const uint8_t *, const em_block_q16 *, const float *, int64_t, int, int,
                            float *);
typedef float (*em_dot_f32)(const uint8_t *, const float *, int64_t);
typedef void (*em_dotsf)(const uint8_t *, int64_t, const float *, int64_t, int, int, int, float *);
typedef void (*em_dequant_row)(const void *, float *, int64_t);

/* type -> (block elements, block bytes); 0 elements: not a type this library reads */
static void em_block_size(int type, int *elems, int *bytes) {
    *elems = EM_QK;
    switch (type) {
    case EM_Q4_0: *bytes = 18; break;
    case EM_Q4_1: *bytes = 20; break;
    case EM_Q5_0: *bytes = 22; break;
    case EM_Q5_1: *bytes = 24; break;
    case EM_Q8_0: *bytes = 34; break;
    case EM_IQ4_NL: *bytes = 18; break;
    case EM_F16:
    case EM_BF16: *elems = 1, *bytes = 2; break;
    default: /* the K types (kquants.h), or none */
        *bytes = kq_block_bytes(type);
        *elems = *bytes > 0 ? KQ_QK : 0;
    }
}

/* The lane kernels: a register's lanes are weight rows, and 1-16 rows of x meet them as int16
 * codes per 32 values (vnni.h: 16 weight rows a 512-bit register, the avx512 and amx copies;
 * rows8.h: 8 a 256-bit one, the avx2 and avxvnni copies). Both give a row the same bits.
 * Both take a K type's one-pass weight's x (passes 1: q/k/v, gate/up, the head) as q8_K's int8
 * codes instead (em_lanes_x8), as kquants.h and llama.cpp round it; not the amx copy, whose
 * tiles take int16 codes from 8 rows. */
#define EM_LANES_MAX_ROWS 16
static inline int em_lanes_ktype(int type) {
    return type == KQ_TYPE_Q4_K || type == KQ_TYPE_Q5_K || type == KQ_TYPE_Q6_K;
}
static inline int em_lanes_type(int type) {
    return type == EM_Q4_0 || type == EM_Q4_1 || type == EM_Q5_0 || type == EM_Q5_1 || type == EM_Q8_0 ||
           em_lanes_ktype(type);
}
#if defined(EM_FLOAT_X) && defined(__AVX512VNNI__)
#define EM_VNNI 1
#include "vnni.h"
#define EM_LANES 1
typedef em_vnni_block em_lanes_block;
#define em_lanes_least_rows em_vnni_least_rows
#define em_lanes_prepare_row em_vnni_prepare_row
#define em_rows_lanes em_rows_vnni
#if !(defined(__AMX_INT8__) && defined(__AMX_TILE__)) /* amx.h's tiles take int16 codes: not there */
#define EM_LANES_X8 1 /* vnni.h also takes a one-pass K type's x as q8_K's codes (em_prep's x8) */
#define em_lanes_prepare_row_q8k em_vnni_prepare_row_q8k
#define em_lanes_least_rows_x8 em_vnni_least_rows
#endif
#elif defined(EM_X86) && !defined(EM_FLOAT_X)
#include "rows8.h"
#define EM_LANES 1
typedef em_r8_block em_lanes_block;
#define em_lanes_least_rows em_r8_least_rows
#define em_lanes_prepare_row em_r8_prepare_row
#define em_rows_lanes em_rows_r8
#define EM_LANES_X8 1 /* rows8.h also takes a one-pass K type's x as q8_K's codes (em_prep's x8) */
#define em_lanes_prepare_row_q8k em_r8_prepare_row_q8k
#define em_lanes_least_rows_x8 em_r8_least_rows_x8
#endif
#if defined(EM_LANES)
/* Whether x takes int8 codes in the lane kernels (em_prep's x8): a K type's one-pass weight
 * (NativeLinear's activation_passes 1), whose x one row rounds to q8_K's int8 codes anyway */
static int em_lanes_x8(int type, int passes) {
#if defined(EM_LANES_X8)
    return ember_lanes_x8 && passes == 1 && em_lanes_ktype(type);
#else
    (void)type;
    (void)passes;
    return 0;
#endif
}
/* Whether M rows of x against a weight of `type` take the lane kernel */
static int em_lanes_takes(int type, int64_t M, int passes) {
    int64_t least = em_lanes_least_rows(type);
#if defined(EM_LANES_X8)
    if (em_lanes_x8(type, passes)) least = em_lanes_least_rows_x8(type);
#else
    (void)passes;
#endif
    return em_lanes_type(type) && M >= least && M <= EM_LANES_MAX_ROWS;
}
#endif
#if defined(EM_VNNI) && defined(__AMX_INT8__) && defined(__AMX_TILE__)
#define EM_AMX 1
#include "amx.h"
#endif

static em_dots_q16 em_q16_dots_of(int type) {
    switch (type) {
    case EM_Q4_0: return em_dots_q4_0;
    case EM_Q4_1: return em_dots_q4_1;
    case EM_Q5_0: return em_dots_q5_0;
    case EM_Q5_1: return em_dots_q5_1;
    case EM_Q8_0: return em_dots_q8_0;
    case EM_IQ4_NL: return em_dots_iq4_nl;
    default: return 0;
    }
}

#if defined(EM_X86) || defined(EM_NEON)
typedef void (*em_dot2_q16)(const uint8_t *, int64_t, const em_block_q16 *, int64_t, int, float *);
static em_dot2_q16 em_q16_dot2_of(int type) {
    switch (type) {
    case EM_Q4_0: return em_dot2_q4_0;
    case EM_Q4_1: return em_dot2_q4_1;
    case EM_Q5_0: return em_dot2_q5_0;
    case EM_Q5_1: return em_dot2_q5_1;
    case EM_IQ4_NL: return em_dot2_iq4_nl;
    /* Q8_0 reads 34 bytes a block where the others read 18-24 for as much work, so its decode
     * rows (a tied head's 145-178 MB) go at the memory's rate: two rows a pass read them ~30%
     * slower from memory on the Zen 2, though ~30% faster from L3 (no prefetch distance, nor
     * asking as the products go, brought the memory's rate back). The NEON copies keep it to
     * one row too: no ARM CPU's memory was at hand to tell otherwise. */
    default: return 0;
    }
}
#endif

#if defined(EM_FLOAT_X)
static em_dotsf em_f32x_dots_of(int type) {
    pthread_once(&em_f16_values_once, em_f16_values_fill);
    switch (type) {
    case EM_Q4_0: return em_dotsf_q4_0;
    case EM_Q4_1: return em_dotsf_q4_1;
    case EM_Q5_0: return em_dotsf_q5_0;
    case EM_Q5_1: return em_dotsf_q5_1;
    case EM_Q8_0: return em_dotsf_q8_0;
    case EM_IQ4_NL: return em_dotsf_iq4_nl;
    default: return 0;
    }
}
#endif

static em_dequant_row em_k_dequant_of(int type) {
    switch (type) {
    case KQ_TYPE_Q2_K: return kq_dequant_row_q2_K;
    case KQ_TYPE_Q3_K: return kq_dequant_row_q3_K;
    case KQ_TYPE_Q4_K: return kq_dequant_row_q4_K;
    case KQ_TYPE_Q5_K: return kq_dequant_row_q5_K;
    case KQ_TYPE_Q6_K: return kq_dequant_row_q6_K;
    case KQ_TYPE_IQ4_XS: return kq_dequant_row_iq4_xs;
    default: return 0;
    }
}

static int em_threads(int64_t weight_bytes) {
    if (weight_bytes < EM_MIN_PARALLEL_BYTES) return 1;
    return ember_num_threads > 0 ? ember_num_threads : 0;
}

int omp_get_max_threads(void);

/* The team for elementwise work of `work` units: one thread below `least` (or when told one) */
static int em_team(int64_t work, int64_t least) {
    if (work < least || ember_num_threads == 1) return 1;
    return ember_num_threads > 0 ? ember_num_threads : omp_get_max_threads();
}

/* Activations prepared once for a weight type's dot products: int16 blocks (simple.h) for the
 * 32-element types; for the K types q8_K (int8 per 256 values), once or twice: x itself, then
 * what that left out (x - q8_K(x)), whose step is ~1/254 of the first. One pass is llama.cpp's
 * precision and costs ~2/3 of two; it is enough for a normalized hidden state, not for a down
 * projection's input (one pass put Gemma 3's ffn_down outputs 5% of their largest value off and
 * its logits outside the reference's tolerance; two passes are as close as int16). Which weight
 * takes which: ember/backend/precision.py's activation_passes. F16/BF16 read x as it is. */
#if !defined(EM_LANES)
typedef void em_lanes_block; /* copies without lane kernels: never set */
#endif
typedef struct {
    int type, passes;
    int64_t M, K, nb, row_bytes;
    const float *x;
    em_block_q16 *q16; /* (M, nb) */
    float *xs; /* with several rows of q16: each group of EM_DOTS rows' block scales side by side,
                * (groups, nb, [d of each row, then s of each]), for simple.h's em_dots_T */
    kq_block_q8_K *q8k; /* (passes M, nb): row passes m + i is x[m]'s pass i */
    uint8_t *amx; /* the amx copy's 8-16 rows of Q4_K and Q5_K: x as amx.h lays it out */
    em_lanes_block *lanes; /* 1-16 rows for vnni.h or rows8.h: x as it lays it out */
    int x8; /* lanes holds x as q8_K's int8 codes (em_lanes_prepare_row_q8k), not int16 ones */
} em_prep;

/* Floats of em_prep's xs for M rows of nb blocks: none for one row, nor for the portable and
 * NEON kernels, which read each row's scales from its blocks */
static int64_t em_xs_floats(int64_t M, int64_t nb) {
#if defined(EM_X86)
    return M > 1 ? (M + EM_DOTS - 1) / EM_DOTS * nb * 2 * EM_DOTS : 0;
#else
    (void)nb;
    (void)M;
    return 0;
#endif
}

/* The first of xs's floats for the group of EM_DOTS rows that holds row m */
static float *em_xs_group(const em_prep *p, int64_t m) {
    return p->xs + m / EM_DOTS * p->nb * 2 * EM_DOTS;
}

/* Bytes of the buffer em_prepare needs; -1 for a type this library lacks, -2 for a K that is
 * not whole blocks. */
static int64_t em_prep_bytes(int type, int64_t M, int64_t K, int passes) {
    int elems, bytes;
    em_block_size(type, &elems, &bytes);
    if (!elems) return -1;
    if (K % elems) return -2;
    if (type == EM_F16 || type == EM_BF16) return 0;
#if defined(EM_AMX)
    if (em_amx_takes(type, M)) return (K / EM_QK) * em_amx_block_bytes(em_amx_cols(M));
#endif
#if defined(EM_LANES)
    if (em_lanes_takes(type, M, passes)) return M * (K / EM_QK) * (int64_t)sizeof(em_lanes_block);
#endif
    if (elems == KQ_QK) return 2 * M * (K / KQ_QK) * (int64_t)sizeof(kq_block_q8_K);
#if defined(EM_FLOAT_X)
    return 0; /* the 32-element types read x as it is */
#endif
    return M * (K / EM_QK) * (int64_t)sizeof(em_block_q16) + em_xs_floats(M, K / EM_QK) * 4;
}

/* Sets p up to quantize x (M rows of K) for `type` into buf (em_prep_bytes of it), row by row
 * (em_prepare_row); passes: 1 or 2 (K types). */
static void em_prepare_setup(em_prep *p, int type, const float *x, int64_t M, int64_t K, void *buf,
                             int passes) {
    int elems, bytes;
    em_block_size(type, &elems, &bytes);
    p->type = type, p->M = M, p->K = K, p->x = x, p->q16 = 0, p->xs = 0, p->q8k = 0, p->amx = 0;
    p->lanes = 0, p->x8 = 0;
    p->passes = passes == 1 ? 1 : 2;
    p->nb = K / elems, p->row_bytes = p->nb * bytes;
    if (type == EM_F16 || type == EM_BF16) return;
#if defined(EM_AMX)
    if (em_amx_takes(type, M)) {
        p->amx = (uint8_t *)buf;
        return;
    }
#endif
#if defined(EM_LANES)
    if (em_lanes_takes(type, M, passes)) {
        p->lanes = (em_lanes_block *)buf;
        p->x8 = em_lanes_x8(type, passes);
        return;
    }
#endif
    if (elems == KQ_QK) {
        p->q8k = (kq_block_q8_K *)buf;
        return;
    }
#if defined(EM_FLOAT_X)
    return;
#endif
    p->q16 = (em_block_q16 *)buf;
    if (em_xs_floats(M, p->nb)) p->xs = (float *)(p->q16 + M * p->nb);
}

/* Quantizes row m of p's x; rows are independent, so threads may take different ones. */
static void em_prepare_row(const em_prep *p, int64_t m) {
    const int64_t nb = p->nb, K = p->K;
    const float *xm = p->x + m * K;
#if defined(EM_AMX)
    if (p->amx) {
        em_amx_prepare_row(p->amx, xm, K / EM_QK, m, p->M); /* blocks of 32, whatever the type's */
        return;
    }
#endif
#if defined(EM_LANES)
    if (p->lanes) { /* blocks of 32, whatever the type's */
#if defined(EM_LANES_X8)
        if (p->x8) {
            em_lanes_prepare_row_q8k(p->lanes + m * (K / EM_QK), xm, K / EM_QK);
            return;
        }
#endif
        em_lanes_prepare_row(p->lanes + m * (K / EM_QK), xm, K / EM_QK);
        return;
    }
#endif
    if (p->q8k) {
        kq_block_q8_K *x1 = p->q8k + p->passes * m * nb, *x2 = x1 + nb;
        kq_quantize_row_q8_K(xm, x1, K);
        if (p->passes == 1) return;
        for (int64_t b = 0; b < nb; b++) { /* what the first pass left out, a block at a time */
            float rest[KQ_QK];
            for (int j = 0; j < KQ_QK; j++) rest[j] = xm[b * KQ_QK + j] - x1[b].d * (float)x1[b].qs[j];
            kq_quantize_row_q8_K(rest, x2 + b, KQ_QK);
        }
    } else if (p->q16) {
        em_block_q16 *q = p->q16 + m * nb;
        em_quantize_row_q16(xm, q, nb);
        if (!p->xs) return;
        /* the last row also clears its group's lanes of absent rows (the buffer is shared: other
         * products' bytes would be multiplied there, denormals among them) */
        const int absent = m + 1 == p->M ? EM_DOTS - 1 - (int)(m % EM_DOTS) : 0;
        float *xs = em_xs_group(p, m) + m % EM_DOTS;
        for (int64_t b = 0; b < nb; b++, xs += 2 * EM_DOTS) {
            xs[0] = q[b].d, xs[EM_DOTS] = q[b].s;
            for (int j = 1; j <= absent; j++) xs[j] = xs[EM_DOTS + j] = 0.0f;
        }
    }
}

/* em_prepare_setup, then every row on this thread */
static void em_prepare(em_prep *p, int type, const float *x, int64_t M, int64_t K, void *buf,
                       int passes) {
    em_prepare_setup(p, type, x, M, K, buf, passes);
    for (int64_t m = 0; m < M; m++) em_prepare_row(p, m);
}

/* A thread's tiles for p's products, set before its share of them (the amx copy; tile state is
 * a thread's own, and other code, oneDNN's, may have set its own): 1 if p takes them. Products
 * of the same rows of x share a setting. em_tiles_end gives them back, so the kernel need not
 * save them at a switch. */
static int em_tiles_begin(const em_prep *p) {
#if defined(EM_AMX)
    if (p->amx) {
        em_amx_begin(em_amx_cols(p->M));
        return 1;
    }
#else
    (void)p;
#endif
    return 0;
}
static void em_tiles_end(int tiled) {
#if defined(EM_AMX)
    if (tiled) _tile_release();
#else
    (void)tiled;
#endif
}

/* One row of x (decode): reading W is the step, and the hardware prefetcher alone left Q8_0
 * rows at ~7-8 GB/s on one thread; asking for the lines 4 KiB ahead reads them faster
 * (benchmarks/bench_simple_types.py; more rows are compute-bound). Asked a row at a time, before
 * its products, that held rows longer than ~1-4 KiB back: the K types' x86 kernels ask as they
 * go, a block at a time (kquants.h's KQ_PREFETCH), and so do the other types' x86 ones for rows
 * of 1.5 KiB and more, about once a line (F16 rows of 8,192 values: 34-38 GB/s asked a row at
 * a time, 51-56 as they go, 2 threads). Whether this call's kernels ask themselves: */
static int em_kernel_prefetches(const em_prep *p, int64_t M) {
    if (M != 1) return 0;
    if (p->q8k) return 1; /* kquants.h: its x86 kernels ask; its portable and NEON ones do not */
#if defined(EM_X86)
    return p->row_bytes >= ember_pf_row_min; /* dispatch.c: 1,536 bytes; 0 on Intel's CPUs */
#endif
    return 0;
}

#if defined(EM_FLOAT_X)
/* em_rows_of for the avx512 path's 32-element types that vnni.h does not take (IQ4_NL, one row of
 * Q8_0: x read as float32), on its own: changes to
 * how several rows of x run had moved the one-row loop's code and slowed decode by 5-15%.
 *
 * One row of x (decode) meets two weight rows a pass where the rows are short, for independent
 * chains; rows of 1.5 KiB and more (self_pf) one at a time: two streams of them a thread, and
 * x's float32 values, read 16-21 GB/s at 8,192 values a row (Q4_0-Q5_1), one 31-36 (Q8_0 at
 * 3,072: 36 against 51). Rows of x longer than 1,024 values meet two weight rows (each load of
 * x then serves both) and 4 rows of x a pass, shorter ones one weight row and up to 8 rows of x
 * (a weight block widened once for 8: SmolLM2's 8 rows 0.85 -> 0.65 ns a block and row on the
 * Xeon). A row's bits do not depend on the choice. (Measured from memory with 1, 2, 4 and 8
 * rows: benchmarks/bench_simple_types.py --k K --rows.) */
static __attribute__((noinline)) void em_rows_f32x(const em_prep *p, const uint8_t *W,
                                                   const float *xf, int64_t M, int64_t ldy,
                                                   int64_t n0, int64_t n1, int self_pf, float *y) {
    const int64_t K = p->K, row_bytes = p->row_bytes;
    const em_dotsf dots = em_f32x_dots_of(p->type);
    float part[2 * EM_XROWS];
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *wrow = W + n * row_bytes;
        const int nw = n + 1 < n1 && (M == 1 ? !self_pf : K > 1024) ? 2 : 1;
        /* the weight rows ahead. Without it, pairs of rows read a Q8_0 head from memory at half
         * the speed, and so did 8 rows of x (two passes of 4 a weight row) at 0.7x; 2-4 rows
         * of x, one weight row a pass, ask where the hardware's prefetch falls behind
         * (dispatch.c's ember_pf_batches: on the Xeon two sequences of SmolLM2 step 1.3-1.4x
         * as fast; on the Zen 5 asking cost 5%). */
        if ((M == 1 || nw == 2 || M > EM_XROWS / 2 || ember_pf_batches) && !self_pf)
            for (int64_t o = 0; o < nw * row_bytes; o += 64) EM_PF_WEIGHT(wrow + EM_PF_AHEAD + o);
        const int gx = nw == 2 ? EM_XROWS / 2 : EM_XROWS;
        for (int64_t g = 0; g < M; g += gx) {
            const int mc = M - g < gx ? (int)(M - g) : gx;
            dots(wrow, row_bytes, xf + g * K, K, nw, mc, self_pf, part);
            for (int i = 0; i < nw; i++)
                for (int m = 0; m < mc; m++) y[(g + m) * ldy + n + i] = part[i * mc + m];
        }
        n += nw - 1;
    }
}
#endif

/* y[m * ldy + n] = W[n] . x[m] for the W rows n0..n1 and the rows m0..m1 of the prepared x. */
#define EM_GROUP_ROWS 16 /* activation rows (passes) a K-type call takes */
static void em_rows_of(const em_prep *p, const uint8_t *W, int64_t m0, int64_t m1, int64_t ldy,
                       int64_t n0, int64_t n1, float *y) {
    const int64_t nb = p->nb, K = p->K, M = m1 - m0;
    const float *xf = p->x + m0 * K;
    const kq_block_q8_K *q8k = p->q8k ? p->q8k + p->passes * m0 * nb : 0;
    const em_block_q16 *q16 = p->q16 ? p->q16 + m0 * nb : 0;
    y += m0 * ldy;
    const int self_pf = em_kernel_prefetches(p, M);
#if defined(EM_AMX)
    if (p->amx) { /* M <= 16 rows: m0 is 0 (em_rows' tiles are larger) */
        em_rows_amx(p->type, p->amx, W, p->row_bytes, K / EM_QK, M, ldy, n0, n1, y);
        return;
    }
#endif
#if defined(EM_LANES)
    if (p->lanes) { /* M <= 16 rows: m0 is 0 */
        em_rows_lanes(p->type, p->x8, p->lanes, W, p->row_bytes, K / EM_QK, M, ldy, n0, n1, y);
        return;
    }
#endif
#if defined(EM_FLOAT_X)
    if (!q8k && !q16 && p->type != EM_F16 && p->type != EM_BF16) {
        em_rows_f32x(p, W, xf, M, ldy, n0, n1, self_pf, y);
        return;
    }
#endif
    int64_t n = n0;
#if defined(EM_X86) || defined(EM_NEON)
    const em_dot2_q16 dot2 = M == 1 && q16 ? em_q16_dot2_of(p->type) : 0;
    if (dot2) { /* decode: two weight rows a pass (simple.h's em_dot2_T), their bits */
        for (; n + 1 < n1; n += 2) {
            const uint8_t *wrow = W + n * p->row_bytes;
            if (!self_pf)
                for (int64_t o = 0; o < 2 * p->row_bytes; o += 64) EM_PF_WEIGHT(wrow + EM_PF_AHEAD + o);
            dot2(wrow, p->row_bytes, q16, nb, self_pf, y + n);
        }
    }
#endif
    for (; n < n1; n++) {
        const uint8_t *wrow = W + n * p->row_bytes;
        if (M == 1 && !self_pf)
            for (int64_t o = 0; o < p->row_bytes; o += 64) EM_PF_WEIGHT(wrow + EM_PF_AHEAD + o);
        if (p->type == EM_F16 || p->type == EM_BF16) {
            const em_dot_f32 dot = p->type == EM_F16 ? (self_pf ? em_dot_f16_pf : em_dot_f16)
                                                     : (self_pf ? em_dot_bf16_pf : em_dot_bf16);
            for (int64_t m = 0; m < M; m++) y[m * ldy + n] = dot(wrow, xf + m * K, K);
        } else if (q8k) { /* the weight block unpacked once for all rows (both passes) */
            const kq_dot_rows_fn rows_dot = kq_dot_rows_for_type(p->type);
            float part[EM_GROUP_ROWS];
            if (p->passes == 1) {
                for (int64_t g = 0; g < M; g += EM_GROUP_ROWS) {
                    const int64_t mc = M - g < EM_GROUP_ROWS ? M - g : EM_GROUP_ROWS;
                    rows_dot(wrow, q8k + g * nb, nb, (int)mc, nb, part);
                    for (int64_t m = 0; m < mc; m++) y[(g + m) * ldy + n] = part[m];
                }
                continue;
            }
            for (int64_t g = 0; g < M; g += EM_GROUP_ROWS / 2) {
                const int64_t mc = M - g < EM_GROUP_ROWS / 2 ? M - g : EM_GROUP_ROWS / 2;
                rows_dot(wrow, q8k + 2 * g * nb, nb, (int)(2 * mc), nb, part);
                for (int64_t m = 0; m < mc; m++) y[(g + m) * ldy + n] = part[2 * m] + part[2 * m + 1];
            }
        } else {
            const em_dots_q16 dots = em_q16_dots_of(p->type);
            if (M > 1 && ember_pf_batches) /* several rows of x: the row ahead too (dispatch.c) */
                for (int64_t o = 0; o < p->row_bytes; o += 64) EM_PF_WEIGHT(wrow + EM_PF_AHEAD + o);
            float part[EM_DOTS];
            for (int64_t g = 0; g < M; g += EM_DOTS) {
                const int mc = M - g < EM_DOTS ? (int)(M - g) : EM_DOTS;
                const float *xs = p->xs ? em_xs_group(p, m0 + g) : 0;
                dots(wrow, q16 + g * nb, xs, nb, mc, self_pf, part);
                for (int m = 0; m < mc; m++) y[(g + m) * ldy + n] = part[m];
            }
        }
    }
}

/* em_rows_of over every row of x, EM_X_TILE rows at a time (prefill): a tile of prepared
 * activations (64 rows of q8_K for K = 3072: 220 KiB) stays in L2 while the chunk's weight rows
 * meet it, where all 512 rows of a batch (1.8 MiB) would be read from L3 for each weight row. */
#define EM_X_TILE 64
static void em_rows(const em_prep *p, const uint8_t *W, int64_t M, int64_t ldy, int64_t n0,
                    int64_t n1, float *y) {
    for (int64_t m0 = 0; m0 < M; m0 += EM_X_TILE)
        em_rows_of(p, W, m0, M - m0 < EM_X_TILE ? M : m0 + EM_X_TILE, ldy, n0, n1, y);
}

int omp_get_thread_num(void);

int EM_EXPORT(ember_matmul)(int type, const void *w, const float *x, float *y, int64_t M,
                            int64_t N, int64_t K, int passes) {
    const int64_t need = em_prep_bytes(type, M, K, passes);
    if (need < 0) return (int)need;
    if (M < 0 || N < 0) return -2;
    if (M == 0 || N == 0) return 0;
    void *buf = need ? em_alloc_lines((size_t)need) : 0;
    if (need && !buf) return -3;
    em_prep p;
    em_prepare(&p, type, x, M, K, buf, passes);
    const uint8_t *W = (const uint8_t *)w;
    const int64_t chunks = (N + EM_ROWS_PER_CHUNK - 1) / EM_ROWS_PER_CHUNK;
    const int nth = em_threads(N * p.row_bytes), omp_default = omp_get_max_threads();
    #pragma omp parallel num_threads(nth ? nth : omp_default) if (nth != 1)
    {
        const int tiled = em_tiles_begin(&p);
        #pragma omp for schedule(static)
        for (int64_t c = 0; c < chunks; c++) {
            const int64_t n0 = c * EM_ROWS_PER_CHUNK, n1 = n0 + EM_ROWS_PER_CHUNK < N ? n0 + EM_ROWS_PER_CHUNK : N;
            em_rows(&p, W, M, N, n0, n1, y);
        }
        em_tiles_end(tiled);
    }
    free(buf);
    return 0;
}

/* xq (M rows of em_g8_row_bytes(K)) = x (M, K) quantized per 32 values for ember_gemm8. */
int EM_EXPORT(ember_q8_rows)(const float *x, int64_t M, int64_t K, uint8_t *xq) {
    if (M < 0 || K <= 0 || K % 32) return -2;
    const int64_t xrb = em_g8_row_bytes(K);
    const int nth = em_team(M * K, 1 << 15);
    #pragma omp parallel for schedule(static) num_threads(nth) if (nth > 1)
    for (int64_t m = 0; m < M; m++) em_g8_quantize_row(x + m * K, xq + m * xrb, K);
    return 0;
}

/* ember_gemm8's and ember_gemm16's driver (`bits` 8 or 16): -1 for a type this path lacks, -2
 * for a bad shape, -3 when out of memory. The threads share W's panels; each unpacks a panel into
 * its own scratch (codes, then scales and offsets, 64-byte aligned, then the unpacking's), which
 * then meets every row of x. */
static int em_gemm_panels(int bits, int type, const void *w, const void *xq, int64_t M, int64_t N, int64_t K,
                          float *y, int64_t ldy) {
    int elems, bytes;
    em_block_size(type, &elems, &bytes);
    if (!em_g8_unit(type) || !elems) return -1;
    if (M < 0 || N < 0 || K <= 0 || K % elems || K % EM_QK || ldy < N) return -2;
    if (M == 0 || N == 0) return 0;
#if defined(EM_AMX)
    const int tiles = em_amx_panel_type(type); /* amx.h: pairs of gemm8's panels, for both */
#else
    const int tiles = 0;
#endif
    const int U = bits == 8 ? em_g8_unit(type) : EM_QK, NR = tiles ? 2 * EM_G8_NR : bits == 8 ? EM_G8_NR : EM_G16_NR;
    const int code_bits = tiles ? 8 : bits;
    const int64_t row_bytes = K / elems * bytes, units = K / U, panels = (N + NR - 1) / NR;
    const size_t codes_bytes = (size_t)(K * NR * code_bits / 8), scales_bytes = (size_t)(2 * units * NR * 4);
    const size_t unpack_bytes = code_bits == 8 ? em_g8_pack_scratch(K) : em_g16_pack_scratch(K);
    const int nth = em_team(M * N * K, 1 << 18);
    uint8_t *split = 0; /* gemm16's x in the tiles: high and low bytes */
#if defined(EM_AMX)
    if (tiles && bits == 16) {
        split = (uint8_t *)em_alloc_lines((size_t)((M + 15) / 16 * 16 * 2 * K));
        if (!split) return -3;
        em_amx_split_q16((const em_block_q16 *)xq, M, K, split);
    }
#endif
    int failed = 0;
    #pragma omp parallel num_threads(nth) if (nth > 1)
    {
        uint8_t *buf = (uint8_t *)em_alloc_lines(codes_bytes + scales_bytes + unpack_bytes + 64);
        if (!buf) {
            #pragma omp atomic write
            failed = 1;
        }
        float *ps = (float *)(buf + codes_bytes), *po = ps + units * NR;
        uint8_t *unpack = (uint8_t *)(po + units * NR);
#if defined(EM_AMX)
        if (tiles) em_amx_panels_begin();
#endif
        #pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; p++) {
            if (!buf) continue;
            const int64_t n0 = p * NR;
            const int nr = N - n0 < NR ? (int)(N - n0) : NR;
            const uint8_t *W = (const uint8_t *)w + n0 * row_bytes;
#if defined(EM_AMX)
            if (tiles) {
                for (int h = 0; h < 2; h++) { /* its two panels: 16 rows, the rest, or none */
                    const int rows = nr <= 16 * h ? 0 : nr - 16 * h < 16 ? nr - 16 * h : 16;
                    uint8_t *codes = buf + h * K * EM_G8_NR;
                    em_g8_pack(type, W + h * 16 * row_bytes, row_bytes, rows, K, codes, ps + h * units * EM_G8_NR,
                               po + h * units * EM_G8_NR, unpack);
                    if (bits == 16) em_amx_centre_codes(type, codes, K);
                }
                if (bits == 8)
                    em_g8_panels_amx(buf, ps, po, K, (const uint8_t *)xq, em_g8_row_bytes(K), M, y + n0, ldy, nr);
                else
                    em_g16_panels_amx(buf, ps, po, em_g16_affine(type), K, split, (const em_block_q16 *)xq, M,
                                      y + n0, ldy, nr);
                continue;
            }
#endif
            if (bits == 8) {
                em_g8_pack(type, W, row_bytes, nr, K, buf, ps, po, unpack);
                em_g8_panel_of(type, buf, ps, po, U, K, (const uint8_t *)xq, em_g8_row_bytes(K), M, y + n0, ldy,
                               nr);
            } else {
                em_g16_pack(type, W, row_bytes, nr, K, (int16_t *)buf, ps, po, unpack);
                em_g16_panel((const int16_t *)buf, ps, po, em_g16_affine(type), K, (const em_block_q16 *)xq, units,
                             M, y + n0, ldy, nr);
            }
        }
#if defined(EM_AMX)
        if (tiles) _tile_release();
#endif
        free(buf);
    }
    free(split);
    return failed ? -3 : 0;
}

/* y (M, N; rows ldy floats apart) = x @ W^T in int8 (gemm8.h), x given as ember_q8_rows made
 * it; em_gemm_panels' codes. */
int EM_EXPORT(ember_gemm8)(int type, const void *w, const uint8_t *xq, int64_t M, int64_t N,
                           int64_t K, float *y, int64_t ldy) {
    return em_gemm_panels(8, type, w, xq, M, N, K, y, ldy);
}

/* xq (M rows of K / 32 int16 blocks) = x (M, K) quantized per 32 values for ember_gemm16. */
int EM_EXPORT(ember_q16_rows)(const float *x, int64_t M, int64_t K, em_block_q16 *xq) {
    if (M < 0 || K <= 0 || K % EM_QK) return -2;
    const int nth = em_team(M * K, 1 << 15);
    #pragma omp parallel for schedule(static) num_threads(nth) if (nth > 1)
    for (int64_t m = 0; m < M; m++) em_quantize_row_q16_to(x + m * K, xq + m * (K / EM_QK), K / EM_QK, EM_G16_LIMIT);
    return 0;
}

/* y (M, N; rows ldy floats apart) = x @ W^T in int16 (gemm16.h), x given as ember_q16_rows made
 * it; em_gemm_panels' codes. */
int EM_EXPORT(ember_gemm16)(int type, const void *w, const em_block_q16 *xq, int64_t M, int64_t N,
                            int64_t K, float *y, int64_t ldy) {
    return em_gemm_panels(16, type, w, xq, M, N, K, y, ldy);
}

int EM_EXPORT(ember_dequant)(int type, const void *w, float *out, int64_t rows, int64_t K) {
    int elems, bytes;
    em_block_size(type, &elems, &bytes);
    if (!elems) return -1;
    if (K % elems || rows < 0) return -2;
    const uint8_t *W = (const uint8_t *)w;
    const int64_t nb = K / elems, row_bytes = nb * bytes;
    const int nth = em_threads(rows * row_bytes), omp_default = omp_get_max_threads();
    const em_dequant_row krow = em_k_dequant_of(type);
    #pragma omp parallel for schedule(static) num_threads(nth ? nth : omp_default) if (nth != 1)
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *src = W + r * row_bytes;
        float *dst = out + r * K;
        if (type == EM_F16) {
            for (int64_t i = 0; i < K; i++) dst[i] = em_f16(src + 2 * i);
        } else if (type == EM_BF16) {
            for (int64_t i = 0; i < K; i++) dst[i] = em_bf16(src + 2 * i);
        } else if (krow) {
            krow(src, dst, K);
        } else {
            for (int64_t b = 0; b < nb; b++) em_dequant_block(type, src + b * bytes, dst + b * EM_QK);
        }
    }
    return 0;
}

int EM_EXPORT(ember_block_elems)(int type) {
    int elems, bytes;
    em_block_size(type, &elems, &bytes);
    return elems;
}


int EM_EXPORT(ember_attend)(int kv_type, const float *q, int64_t H, int64_t D, const void *k,
                            int64_t k_hs, int64_t k_cs, const void *v, int64_t v_hs, int64_t v_cs,
                            int64_t Hkv, int64_t Dv, int64_t S, const float *mask, float scale,
                            float *out) {
    if (kv_type < EM_KV_F32 || kv_type > EM_KV_BF16) return -1;
    if (H <= 0 || Hkv <= 0 || H % Hkv || S < 0 || D <= 0 || Dv <= 0) return -2;
    const int64_t group = H / Hkv;
    /* threads only where the work outweighs waking them */
    const int nth = em_team(S * (D + Dv) * H, 1 << 17);
    /* units of work: (KV head, tile of up to EM_ATTN_TILE of its query heads), each reading
     * its KV head's keys once; tiles small enough that every thread gets one */
    int64_t tile = (H + nth - 1) / nth;
    tile = tile < EM_ATTN_TILE ? tile : EM_ATTN_TILE;
    tile = tile < group ? tile : group;
    const int64_t tiles = (group + tile - 1) / tile, units = Hkv * tiles;
    const int64_t scratch = EM_ATTN_SCRATCH(tile, S > 0 ? S : 1); /* floats a unit */
    float *scores = (float *)em_alloc_lines((size_t)(units * scratch) * sizeof(float));
    if (!scores) return -3;
    #pragma omp parallel for schedule(static) num_threads(nth) if (nth > 1 && units > 1)
    for (int64_t u = 0; u < units; u++) {
        const int64_t g = u / tiles, h0 = g * group + (u % tiles) * tile;
        const int64_t nt = group - (h0 - g * group) < tile ? group - (h0 - g * group) : tile;
        em_attend_heads(kv_type, q + h0 * D, (int)nt, D, em_kv_row(kv_type, k, g * k_hs), k_cs,
                        em_kv_row(kv_type, v, g * v_hs), v_cs, Dv, S, mask, scale, scores + u * scratch,
                        out + h0 * Dv);
    }
    free(scores);
    return 0;
}

/* out (T, H, Dv) = one sequence's prompt attention under a causal mask (prompt_attend.h):
 * q (T, H, D), k (Hkv, S, D) and v (Hkv, S, Dv) contiguous float32, cells in order of position,
 * token t seeing cells 0..S - T + t, or with window > 0 the last `window` of them. One KV head at
 * a time: its keys transposed once, then its query heads' tiles of tokens shared among the
 * threads, the latest (the most cells, without a window) first. */
int EM_EXPORT(ember_prompt_attend)(const float *q, int64_t T, int64_t H, int64_t D, const float *k,
                                   const float *v, int64_t Hkv, int64_t S, int64_t Dv, float scale,
                                   int64_t window, float *out) {
    if (T <= 0 || H <= 0 || Hkv <= 0 || H % Hkv || D <= 0 || Dv <= 0 || S < T || window < 0) return -2;
    const int64_t group = H / Hkv, Sp = (S + EM_PA_KB - 1) / EM_PA_KB * EM_PA_KB;
    const int64_t tiles = (T + EM_PA_RT - 1) / EM_PA_RT, units = group * tiles;
    float *kt = (float *)em_alloc_lines((size_t)(D * Sp) * sizeof(float));
    if (!kt) return -3;
    const int nth = em_team(T * S * (D + Dv) * group / 2, 1 << 17);
    int failed = 0;
    for (int64_t g = 0; g < Hkv && !failed; g++) {
        #pragma omp parallel num_threads(nth) if (nth > 1)
        {
            #pragma omp for schedule(static) /* the threads share the transpose (then wait) */
            for (int64_t s0 = 0; s0 < Sp; s0 += 8) em_pa_transpose8(k + g * S * D, S, D, Sp, kt, s0);
            float *o = (float *)em_alloc_lines((size_t)(EM_PA_RT * (Dv + EM_PA_KB)) * sizeof(float));
            if (!o) {
                #pragma omp atomic write
                failed = 1;
            }
            #pragma omp for schedule(dynamic, 1)
            for (int64_t u = 0; u < units; u++) {
                if (!o) continue;
                const int64_t h = g * group + u % group, tile = tiles - 1 - u / group;
                em_pa_head(q + h * D, H * D, T, D, kt, Sp, v + g * S * Dv, Dv, S - T, window, scale, o,
                           o + EM_PA_RT * Dv, out + h * Dv, H * Dv, tile);
            }
            free(o);
        }
    }
    free(kt);
    return failed ? -3 : 0;
}

#include "layer.h" /* after the matmul pieces it uses */
#include "sample.h"

/* ids[g] = the argmax of row rows[g] of x (rows of V floats) as torch.argmax takes it (the first
 * of the largest, NaN the largest), through the row's block maxima (V / block floats a row, NaN
 * where the block holds one: torch's amax over each whole block) */
int EM_EXPORT(ember_argmax_rows)(const float *x, int64_t V, const float *maxima, int64_t block,
                                 const int64_t *rows, int64_t G, int64_t *ids) {
    if (V <= 0 || block <= 0 || G < 0) return -2;
    const int64_t nb = V / block;
    for (int64_t g = 0; g < G; g++) ids[g] = em_argmax_row(x + rows[g] * V, V, maxima + rows[g] * nb, block);
    return 0;
}

/* out (M, F; rows ldo >= F floats apart) = act(g) * u for each row [g | u] of gu (M rows of
 * ld >= 2F floats): a gated MLP's activation for a prompt's rows (layer.h's em_act_mul), the
 * rows shared among the threads. */
int EM_EXPORT(ember_act_mul)(int act, const float *gu, int64_t M, int64_t F, int64_t ld, float *out,
                             int64_t ldo) {
    if (act != EM_ACT_SILU && act != EM_ACT_GELU_TANH) return -1;
    if (M < 0 || F < 0 || ld < 2 * F || ldo < F) return -2;
    const int nth = em_team(M * F, 1 << 15);
    #pragma omp parallel for schedule(static) num_threads(nth) if (nth > 1)
    for (int64_t m = 0; m < M; m++) em_act_mul(act, gu + m * ld, gu + m * ld + F, F, out + m * ldo);
    return 0;
}

/* out (M, n; rows ldo apart) = x (M, n; rows ldx apart) / sqrt(mean(x^2) + eps), times w (n)
 * where given: RMSNorm over a prompt's rows, which torch's CPU op takes in five passes (pow,
 * mean, add, rsqrt, two products): Gemma 3's 512 x 640 took 74 us on 2 threads, 16 here. The
 * squares sum in 16 lanes, so the result differs from torch's by float32 rounding only (the
 * decode layer's em_rms_norm sums in sequence: one token's row is short, and its bits stay). */
int EM_EXPORT(ember_rms_norm)(const float *x, int64_t M, int64_t n, int64_t ldx, const float *w,
                              float eps, float *out, int64_t ldo) {
    if (M < 0 || n <= 0 || ldx < n || ldo < n) return -2;
    const int nth = em_team(M * n, 1 << 15);
    #pragma omp parallel for schedule(static) num_threads(nth) if (nth > 1)
    for (int64_t m = 0; m < M; m++) {
        const float *xm = x + m * ldx;
        float *om = out + m * ldo;
        float lanes[16] = {0};
        int64_t i = 0;
        for (; i + 16 <= n; i += 16)
            for (int j = 0; j < 16; j++) lanes[j] += xm[i + j] * xm[i + j];
        float ss = 0.0f;
        for (int j = 0; j < 16; j++) ss += lanes[j];
        for (; i < n; i++) ss += xm[i] * xm[i];
        const float r = 1.0f / sqrtf(ss / (float)n + eps);
        if (w)
            for (int64_t k = 0; k < n; k++) om[k] = xm[k] * r * w[k];
        else
            for (int64_t k = 0; k < n; k++) om[k] = xm[k] * r;
    }
    return 0;
}

/* out (M, H, D) = the H heads of D floats of each of x's M rows (ldx floats apart, the heads side
 * by side), RMS-normalised where `norm` (times qn for the first Hq heads and kn for the rest,
 * either NULL for none), rotated by RoPE over their first rope_dim values (cos, sin: (M,
 * rope_dim / 2)), the first Hq times q_scale: a prompt's q and k heads in one pass, where
 * torch took seven (norm, weight, rotation, scale) and 4% of Gemma 3's prefill. The decode
 * layer's own steps (em_rms_norm, em_rope), so a token's q and k keep their bits either way. */
int EM_EXPORT(ember_qk_rope)(const float *x, int64_t M, int64_t H, int64_t D, int64_t ldx, int64_t Hq,
                             int norm, const float *qn, const float *kn, float eps, const float *cos,
                             const float *sin, int64_t rope_dim, int neox, float q_scale, float *out) {
    if (M < 0 || H <= 0 || D <= 0 || ldx < H * D || Hq < 0 || Hq > H || rope_dim < 0 || rope_dim > D ||
        rope_dim % 2)
        return -2;
    const int nth = em_team(M * H * D, 1 << 15);
    #pragma omp parallel for schedule(static) num_threads(nth) if (nth > 1)
    for (int64_t m = 0; m < M; m++) {
        const float *c = cos + m * (rope_dim / 2), *s = sin + m * (rope_dim / 2);
        for (int64_t j = 0; j < H; j++) {
            const float *src = x + m * ldx + j * D;
            float *dst = out + (m * H + j) * D;
            if (norm)
                em_rms_norm(src, j < Hq ? qn : kn, D, eps, dst);
            else
                memcpy(dst, src, (size_t)D * sizeof(float));
            em_rope(dst, c, s, rope_dim, neox);
            if (j < Hq && q_scale != 1.0f)
                for (int64_t i = 0; i < D; i++) dst[i] *= q_scale;
        }
    }
    return 0;
}
