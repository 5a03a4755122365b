/* kquants.h: dot products of K-quant weight rows (ggml Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS)
 * with activations quantized to int8 per 256 values (q8_K), the way llama.cpp does it, plus
 * dequantization of the same rows to float32 (bit-exact against gguf-py's gguf.quants).
 *
 * Self-contained: include it from any C (or C++) file. Every function is static inline, prefix
 * kq_. The implementation is chosen at compile time from the target's predefined macros:
 *   AVX-512F+BW+VL  the x86 SIMD code below (256-bit vectors, EVEX-encoded by the compiler),
 *                   with AVX512-VNNI vpdpwssd where __AVX512VNNI__ (one instruction for each
 *                   vpmaddwd + vpaddd). Compiled and warning-free, NOT RUN: no AVX-512 CPU here.
 *   AVX2+FMA        the x86 SIMD code: vpmaddubsw of unsigned codes times int8 activations,
 *                   vpmaddwd by the sub-block scales, exact int32 sums per super-block, one
 *                   float FMA per super-block; offsets (Q3_K's -4, Q6_K's -32, the mins of
 *                   Q2_K/Q4_K/Q5_K) come from q8_K's bsums, not per value. With AVX-VNNI
 *                   (__AVXVNNI__: the avxvnni copy) vpdpwssd does each vpmaddwd + vpaddd,
 *                   as AVX512-VNNI's does above: the same sums.
 *   NEON (AArch64)  every K type in Advanced SIMD (kq_dot_*_neon below), with the dot product
 *                   instructions (sdot) where __ARM_FEATURE_DOTPROD (the neondot copy), tested
 *                   against the portable C under qemu (tests/backend/test_native_neon.py).
 *   anything else   portable C (kq_dot_*_generic, always compiled: it is the reference), written
 *                   so compilers vectorize it.
 * Every path computes the same per-block integer sums exactly (they are exact in int32); only
 * the float accumulation order differs, so the paths agree to ~1e-7 relative.
 * KQ_IMPL_NAME names the path compiled ("x86-avx512-vnni", "x86-avx512", "x86-avx2-vnni",
 * "x86-avx2", "neon-dotprod", "neon", "generic").
 *
 * Block layouts (bytes): exactly ggml's / GGUF's.
 *   Q2_K  84: scales[16] (lo nibble scale, hi nibble min), qs[64], d f16, dmin f16
 *   Q3_K 110: hmask[32], qs[64], scales[12] (16 x 6 bits, offset 32), d f16
 *   Q4_K 144: d f16, dmin f16, scales[12] (8 scales + 8 mins, 6 bits), qs[128]
 *   Q5_K 176: d f16, dmin f16, scales[12], qh[32], qs[128]
 *   Q6_K 210: ql[128], qh[64], scales[16] int8, d f16
 *   IQ4_XS 136: d f16, scales_h u16, scales_l[4], qs[128] (indices into the IQ4_NL table)
 * No load reads past the last block of a row, and nothing needs alignment.
 *
 * Float flags: -ffp-contract=* and kernels.c's relaxed set (-fassociative-math -fno-signed-zeros
 * -fno-trapping-math -fno-math-errno) leave every result unchanged (tested); not -ffast-math
 * (-freciprocal-math may turn q8_K's iscale = -127/max into -127 * (1/max)).
 *
 * Bench: benchmarks/bench_kquants.py, GB/s of weight bytes read, one thread, one row of x,
 * 4096 x 4096 weights (random valid blocks); gcc 12.2 -O3; AMD EPYC 7001 "Naples" (Zen 1,
 * family 23 model 1: 256-bit ops run as two 128-bit halves), 2 vCPUs shared with other
 * jobs (load average 5-7 while measuring, so these are low and noisy; in-cache figures from
 * --rows 256 in brackets). Command: PYTHONPATH=. .venv/bin/python benchmarks/bench_kquants.py
 *            generic          avx2
 *   Q2_K     0.3 (0.6)     3.9 (4.6)
 *   Q3_K     0.3 (0.8)     3.7 (4.2)
 *   Q4_K     1.1 (2.4)     6.0 (7.6)
 *   Q5_K     1.2 (2.4)     6.2 (7.6)
 *   Q6_K     0.8 (2.0)     7.1 (10.1)
 *   IQ4_XS   0.3 (0.7)     4.9 (6.0)
 * The 15 GB/s aim is not reached on this CPU: the AVX2 loop is llama.cpp's instruction mix
 * (per 32 weights one vpmaddubsw + one vpmaddwd, ~11 vector ops per 64 weights), and Zen 1
 * issues each 256-bit op as two; a plain 256-bit read loop over the same 9.4 MB reaches only
 * ~10.5 GB/s here. In L1/L2 (a C timing loop over kq_dot_*, 64 rows of 4096; TSC 2.0 GHz)
 * Q4_K takes ~37 TSC cycles per 256 weights, Q6_K ~42, Q2_K ~37, Q5_K ~48, IQ4_XS ~47, Q3_K ~52
 * (the same within noise under -mtune=znver1/haswell/skylake or -falign-loops=32; one quieter
 * moment gave 15-20% less across the board, so read all figures here as +-20%).
 * kq_dot_rows_* (several rows of x per weight row, bit-identical per row): Q4_K, Q5_K and Q6_K unpack
 * the weights once for 2 or 4 rows of x on x86 (2 on NEON): per x row, in cache, Q4_K 1.05x, Q6_K 1.2x.
 * With AVX-512 Q4_K and Q6_K take 512-bit registers (kq_dot_*_n_zmm, the same bits). On a 2-core Zen 5
 * EPYC, 2 threads, 512 rows of x times the 3B file's weights (GFLOPS,
 * `benchmarks/bench_prefill_kernels.py --model /tmp/llama3b-q4_k_m.gguf`, two alternating runs
 * each): Q4_K one pass 292-310 -> 324-343, two passes 148-156 -> 166-175; Q6_K two passes
 * 121-131 -> 151-163. Its decode step (two passes for the attention output and the down
 * projections) 50.4-51.8 -> 48.8-49.7 ms (`benchmarks/profile_decode.py --model
 * /tmp/llama3b-q4_k_m.gguf --context 128`). Still short of twice: the per-row scale and min
 * steps, not the products, take most of the instructions.
 */
#ifndef EMBER_KQUANTS_H
#define EMBER_KQUANTS_H
/* A decode step reads each weight row once, from memory: the x86 kernels ask for the bytes
 * KQ_PF_AHEAD past each block as they reach it (a 256-value block is 84-210 bytes, 2-4 lines),
 * so the requests run level with the products. Asking for a whole row before its products
 * (kernels.c's way for the 32-element types) held rows longer than ~4 KiB back: the 3B file's
 * down projections (8,192 values, 4.6-6.7 KB a row) read 31-32 GB/s that way and 40-48 GB/s
 * this way, and its decode step took 43-46 ms against 49-52 (a Zen 5 EPYC, 2 threads). */
#ifndef KQ_PF_AHEAD /* kernels.c: dispatch.c's ember_kq_pf_ahead, chosen for the CPU */
#define KQ_PF_AHEAD 4096
#endif
/* non-temporal (prefetchnta): the bytes are read once a step (simple.h's EM_PF_WEIGHT says why) */
#define KQ_PREFETCH(b, size)                                                                      \
    for (int pf_ = 0; pf_ < (size); pf_ += 64) __builtin_prefetch((const uint8_t *)(b) + KQ_PF_AHEAD + pf_, 0, 0)

#include <stdint.h>
#include <string.h>
#include <math.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define KQ_X86 1
#if defined(__AVX512VNNI__)
#define KQ_VNNI 1
#endif
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__)
#define KQ_X86 1
#include <immintrin.h>
#elif defined(__F16C__)
#include <immintrin.h>
#elif defined(__ARM_NEON) && defined(__aarch64__) && !defined(EMBER_PORTABLE)
#define KQ_NEON 1
#include <arm_neon.h>
#endif

#if defined(__F16C__)
#define KQ_F16C 1
#endif

#define KQ_QK 256

typedef struct {
    float d;
    int8_t qs[256];
    int16_t bsums[16];
    int16_t bsums32[8];
} kq_block_q8_K; /* activations: value j = d * qs[j]; bsums[g] = sum of qs[16g .. 16g+15];
                  * bsums32[j] = bsums[2j] + bsums[2j+1], the 32-value sums Q4_K's and Q5_K's
                  * mins meet: made once with the codes, not again for each weight row */

#define KQ_TYPE_Q2_K 10
#define KQ_TYPE_Q3_K 11
#define KQ_TYPE_Q4_K 12
#define KQ_TYPE_Q5_K 13
#define KQ_TYPE_Q6_K 14
#define KQ_TYPE_IQ4_XS 23

static inline int kq_block_bytes(int ggml_type) {
    switch (ggml_type) {
    case KQ_TYPE_Q2_K: return 84;
    case KQ_TYPE_Q3_K: return 110;
    case KQ_TYPE_Q4_K: return 144;
    case KQ_TYPE_Q5_K: return 176;
    case KQ_TYPE_Q6_K: return 210;
    case KQ_TYPE_IQ4_XS: return 136;
    default: return -1;
    }
}

static const int8_t kq_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                           1,    13,   25,  38,  53,  69,  89,  113};

/* ---------------------------------------------------------------- fp16 -> f32 */
static inline float kq_fp16_to_f32(uint16_t h) {
#if defined(KQ_F16C)
    return _cvtsh_ss(h);
#elif defined(KQ_NEON) /* AArch64 converts halves in one instruction (fcvt): the same values */
    __fp16 v;
    memcpy(&v, &h, 2);
    return (float)v;
#else
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, f;
    float r;
    if (exp == 0) {
        r = (float)man * 5.9604644775390625e-8f; /* man * 2^-24, exact */
        memcpy(&f, &r, 4);
        f |= sign;
    } else if (exp == 31) {
        f = sign | 0x7f800000u | (man << 13);
    } else {
        f = sign | ((exp + 112u) << 23) | (man << 13);
    }
    memcpy(&r, &f, 4);
    return r;
#endif
}

static inline float kq_f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return kq_fp16_to_f32(h);
}

/* Q4_K / Q5_K: 12 bytes -> 8 six-bit scales sc[0..7] then 8 mins m[0..7] (16 bytes out). */
static inline void kq_scales_k4(const uint8_t *s, uint8_t out[16]) {
    uint32_t u[4];
    memcpy(u, s, 12);
    const uint32_t k1 = 0x3f3f3f3fu, k2 = 0x0f0f0f0fu, k3 = 0x03030303u;
    u[3] = ((u[2] >> 4) & k2) | (((u[1] >> 6) & k3) << 4);
    const uint32_t mins_lo = u[1] & k1;
    u[1] = (u[2] & k2) | (((u[0] >> 6) & k3) << 4);
    u[2] = mins_lo;
    u[0] &= k1;
    memcpy(out, u, 16);
}

/* Q3_K: 12 bytes -> 16 signed scales (six bits minus 32). */
static inline void kq_scales_q3(const uint8_t *s, int8_t out[16]) {
    uint32_t a[4];
    memcpy(a, s, 12);
    const uint32_t k1 = 0x03030303u, k2 = 0x0f0f0f0fu, t = a[2];
    a[2] = ((a[0] >> 4) & k2) | (((t >> 4) & k1) << 4);
    a[3] = ((a[1] >> 4) & k2) | (((t >> 6) & k1) << 4);
    a[0] = (a[0] & k2) | (((t >> 0) & k1) << 4);
    a[1] = (a[1] & k2) | (((t >> 2) & k1) << 4);
    uint8_t b[16];
    memcpy(b, a, 16);
    for (int i = 0; i < 16; i++) out[i] = (int8_t)(b[i] - 32);
}

/* IQ4_XS: scale of sub-block ib (0..7), minus 32. */
static inline int kq_scale_iq4xs(const uint8_t *blk, int ib) {
    uint16_t sh;
    memcpy(&sh, blk + 2, 2);
    return (((blk[4 + ib / 2] >> (4 * (ib % 2))) & 0xf) | (((sh >> (2 * ib)) & 3) << 4)) - 32;
}

/* ============================================================ q8_K and dequantization
 * No FMA contraction can change these results: every product in the dequantization is exact in
 * float32 (an fp16 d has 11 significant bits, a scale at most 8, a code at most 8: d*sc*q needs
 * at most 24), so d*sc*q - dmin*m rounds once however it is computed; and q8_K rounds with
 * rintf (no add that could fuse with the multiply). */
static inline int kq_nearest_int(float f) {
    return (int)rintf(f); /* round half to even, as llama.cpp's 1.5*2^23 trick */
}

/* As llama.cpp quantize_row_q8_K_ref: iscale = -127/max (max = the element of largest
 * magnitude, signed), q = min(127, round(iscale * x)), d = 1/iscale. */
static inline void kq_quantize_row_q8_K(const float *x, kq_block_q8_K *y, int64_t k) {
    const int64_t nb = k / KQ_QK;
    for (int64_t i = 0; i < nb; i++, x += KQ_QK) {
        float max = 0, amax = 0;
        for (int j = 0; j < KQ_QK; j++) {
            float ax = fabsf(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (!amax) {
            y[i].d = 0;
            memset(y[i].qs, 0, sizeof y[i].qs);
            memset(y[i].bsums, 0, sizeof y[i].bsums);
            memset(y[i].bsums32, 0, sizeof y[i].bsums32);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < KQ_QK; j++) {
            int v = kq_nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v < 127 ? v : 127);
        }
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += y[i].qs[16 * g + j];
            y[i].bsums[g] = (int16_t)s;
        }
        for (int j = 0; j < 8; j++) y[i].bsums32[j] = (int16_t)(y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]);
        y[i].d = 1 / iscale;
    }
}

/* Dequantization: the float operations of gguf.quants in its order (d*scale, then *q, then
 * minus dmin*min), so the results are bit-identical. */
static inline void kq_dequant_row_q2_K(const void *w, float *y, int64_t k) {
    const uint8_t *b = (const uint8_t *)w;
    for (int64_t i = 0; i < k / KQ_QK; i++, b += 84, y += KQ_QK) {
        const float d = kq_f16_at(b + 80), dmin = kq_f16_at(b + 82);
        for (int n = 0; n < 2; n++)
            for (int s = 0; s < 4; s++)
                for (int h = 0; h < 2; h++) {
                    const int is = n * 8 + s * 2 + h;
                    const float dl = d * (float)(b[is] & 0xf), ml = dmin * (float)(b[is] >> 4);
                    float *o = y + n * 128 + s * 32 + h * 16;
                    const uint8_t *q = b + 16 + n * 32 + h * 16;
                    for (int l = 0; l < 16; l++) {
                        float t = dl * (float)((q[l] >> (2 * s)) & 3);
                        o[l] = t - ml;
                    }
                }
    }
}

static inline void kq_dequant_row_q3_K(const void *w, float *y, int64_t k) {
    const uint8_t *b = (const uint8_t *)w;
    for (int64_t i = 0; i < k / KQ_QK; i++, b += 110, y += KQ_QK) {
        const float d = kq_f16_at(b + 108);
        int8_t sc[16];
        kq_scales_q3(b + 96, sc);
        for (int n = 0; n < 2; n++)
            for (int s = 0; s < 4; s++)
                for (int h = 0; h < 2; h++) {
                    const int is = n * 8 + s * 2 + h, g = n * 4 + s;
                    const float dl = d * (float)sc[is];
                    float *o = y + n * 128 + s * 32 + h * 16;
                    const uint8_t *q = b + 32 + n * 32 + h * 16, *hm = b + h * 16;
                    for (int l = 0; l < 16; l++) {
                        int v = ((q[l] >> (2 * s)) & 3) - (((hm[l] >> g) & 1) ? 0 : 4);
                        o[l] = dl * (float)v;
                    }
                }
    }
}

static inline void kq_dequant_row_q4_K(const void *w, float *y, int64_t k) {
    const uint8_t *b = (const uint8_t *)w;
    for (int64_t i = 0; i < k / KQ_QK; i++, b += 144, y += KQ_QK) {
        const float d = kq_f16_at(b), dmin = kq_f16_at(b + 2);
        uint8_t sm[16];
        kq_scales_k4(b + 4, sm);
        for (int j = 0; j < 8; j++) {
            const float dl = d * (float)sm[j], ml = dmin * (float)sm[8 + j];
            const uint8_t *q = b + 16 + (j / 2) * 32;
            const int sh = 4 * (j % 2);
            for (int l = 0; l < 32; l++) {
                float t = dl * (float)((q[l] >> sh) & 0xf);
                y[j * 32 + l] = t - ml;
            }
        }
    }
}

static inline void kq_dequant_row_q5_K(const void *w, float *y, int64_t k) {
    const uint8_t *b = (const uint8_t *)w;
    for (int64_t i = 0; i < k / KQ_QK; i++, b += 176, y += KQ_QK) {
        const float d = kq_f16_at(b), dmin = kq_f16_at(b + 2);
        uint8_t sm[16];
        kq_scales_k4(b + 4, sm);
        const uint8_t *qh = b + 16;
        for (int j = 0; j < 8; j++) {
            const float dl = d * (float)sm[j], ml = dmin * (float)sm[8 + j];
            const uint8_t *q = b + 48 + (j / 2) * 32;
            const int sh = 4 * (j % 2);
            for (int l = 0; l < 32; l++) {
                int v = ((q[l] >> sh) & 0xf) | (((qh[l] >> j) & 1) << 4);
                float t = dl * (float)v;
                y[j * 32 + l] = t - ml;
            }
        }
    }
}

static inline void kq_dequant_row_q6_K(const void *w, float *y, int64_t k) {
    const uint8_t *b = (const uint8_t *)w;
    for (int64_t i = 0; i < k / KQ_QK; i++, b += 210, y += KQ_QK) {
        const float d = kq_f16_at(b + 208);
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int n = 0; n < 2; n++)
            for (int s = 0; s < 4; s++)
                for (int h = 0; h < 2; h++) {
                    const float dl = d * (float)sc[n * 8 + s * 2 + h];
                    const uint8_t *ql = b + n * 64 + (s & 1) * 32 + h * 16;
                    const uint8_t *qh = b + 128 + n * 32 + h * 16;
                    float *o = y + n * 128 + s * 32 + h * 16;
                    for (int l = 0; l < 16; l++) {
                        int v = ((ql[l] >> (4 * (s >> 1))) & 0xf) | (((qh[l] >> (2 * s)) & 3) << 4);
                        o[l] = dl * (float)(v - 32);
                    }
                }
    }
}

static inline void kq_dequant_row_iq4_xs(const void *w, float *y, int64_t k) {
    const uint8_t *b = (const uint8_t *)w;
    for (int64_t i = 0; i < k / KQ_QK; i++, b += 136, y += KQ_QK) {
        const float d = kq_f16_at(b);
        for (int ib = 0; ib < 8; ib++) {
            const float dl = d * (float)kq_scale_iq4xs(b, ib);
            const uint8_t *q = b + 8 + ib * 16;
            for (int l = 0; l < 16; l++) {
                y[ib * 32 + l] = dl * (float)kq_iq4nl_values[q[l] & 0xf];
                y[ib * 32 + 16 + l] = dl * (float)kq_iq4nl_values[q[l] >> 4];
            }
        }
    }
}

/* ============================================================ portable dot products
 * Per super-block: the 256 codes are unpacked to int8 (simple loops a compiler vectorizes),
 * then exact int32 sums of scale * code * q8 per sub-block, then one float step. */
static inline int32_t kq_dot_i8(const int8_t *a, const int8_t *b, int n) {
    int32_t s = 0;
    for (int l = 0; l < n; l++) s += a[l] * b[l];
    return s;
}

/* 32 values in two halves of 16 with scales s0, s1: one loop of 32 with a per-element scale
 * (s0 for the first 16), which compilers vectorize as a whole */
static inline int32_t kq_dot_2x16(const int8_t *a, const int8_t *b, int s0, int s1) {
    int32_t t0 = 0, t1 = 0;
    for (int l = 0; l < 16; l++) {
        t0 += a[l] * b[l];
        t1 += a[16 + l] * b[16 + l];
    }
    return s0 * t0 + s1 * t1;
}

static inline float kq_dot_q2_K_generic(const void *w, const kq_block_q8_K *x, int64_t nb) {
    const uint8_t *b = (const uint8_t *)w;
    float sumf = 0;
    for (int64_t i = 0; i < nb; i++, b += 84) {
        int8_t q[256];
        for (int n = 0; n < 2; n++)
            for (int l = 0; l < 32; l++) {
                const uint8_t v = b[16 + n * 32 + l];
                q[n * 128 + l] = (int8_t)(v & 3);
                q[n * 128 + 32 + l] = (int8_t)((v >> 2) & 3);
                q[n * 128 + 64 + l] = (int8_t)((v >> 4) & 3);
                q[n * 128 + 96 + l] = (int8_t)(v >> 6);
            }
        int32_t sumi = 0, summ = 0;
        for (int g = 0; g < 16; g++) summ += (b[g] >> 4) * x[i].bsums[g];
        for (int g = 0; g < 16; g += 2)
            sumi += kq_dot_2x16(q + 16 * g, x[i].qs + 16 * g, b[g] & 0xf, b[g + 1] & 0xf);
        sumf += x[i].d * kq_f16_at(b + 80) * (float)sumi - x[i].d * kq_f16_at(b + 82) * (float)summ;
    }
    return sumf;
}

static inline float kq_dot_q3_K_generic(const void *w, const kq_block_q8_K *x, int64_t nb) {
    const uint8_t *b = (const uint8_t *)w;
    float sumf = 0;
    for (int64_t i = 0; i < nb; i++, b += 110) {
        int8_t sc[16], q[256];
        kq_scales_q3(b + 96, sc);
        for (int n = 0; n < 2; n++)
            for (int l = 0; l < 32; l++) {
                const uint8_t v = b[32 + n * 32 + l], h = (uint8_t)(b[l] >> (4 * n));
                q[n * 128 + l] = (int8_t)((v & 3) | ((h & 1) << 2)) - 4;
                q[n * 128 + 32 + l] = (int8_t)(((v >> 2) & 3) | ((h & 2) << 1)) - 4;
                q[n * 128 + 64 + l] = (int8_t)(((v >> 4) & 3) | (h & 4)) - 4;
                q[n * 128 + 96 + l] = (int8_t)((v >> 6) | ((h >> 1) & 4)) - 4;
            }
        int32_t sumi = 0;
        for (int g = 0; g < 16; g += 2) sumi += kq_dot_2x16(q + 16 * g, x[i].qs + 16 * g, sc[g], sc[g + 1]);
        sumf += x[i].d * kq_f16_at(b + 108) * (float)sumi;
    }
    return sumf;
}

static inline float kq_dot_q4_K_generic(const void *w, const kq_block_q8_K *x, int64_t nb) {
    const uint8_t *b = (const uint8_t *)w;
    float sumf = 0;
    for (int64_t i = 0; i < nb; i++, b += 144) {
        uint8_t sm[16];
        int8_t q[256];
        kq_scales_k4(b + 4, sm);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                q[c * 64 + l] = (int8_t)(b[16 + c * 32 + l] & 0xf);
                q[c * 64 + 32 + l] = (int8_t)(b[16 + c * 32 + l] >> 4);
            }
        int32_t sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            summ += sm[8 + j] * x[i].bsums32[j];
            sumi += sm[j] * kq_dot_i8(q + 32 * j, x[i].qs + 32 * j, 32);
        }
        sumf += x[i].d * kq_f16_at(b) * (float)sumi - x[i].d * kq_f16_at(b + 2) * (float)summ;
    }
    return sumf;
}

static inline float kq_dot_q5_K_generic(const void *w, const kq_block_q8_K *x, int64_t nb) {
    const uint8_t *b = (const uint8_t *)w;
    float sumf = 0;
    for (int64_t i = 0; i < nb; i++, b += 176) {
        const uint8_t *qh = b + 16;
        uint8_t sm[16];
        int8_t q[256];
        kq_scales_k4(b + 4, sm);
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                q[c * 64 + l] = (int8_t)((b[48 + c * 32 + l] & 0xf) | (((qh[l] >> (2 * c)) & 1) << 4));
                q[c * 64 + 32 + l] = (int8_t)((b[48 + c * 32 + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4));
            }
        int32_t sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            summ += sm[8 + j] * x[i].bsums32[j];
            sumi += sm[j] * kq_dot_i8(q + 32 * j, x[i].qs + 32 * j, 32);
        }
        sumf += x[i].d * kq_f16_at(b) * (float)sumi - x[i].d * kq_f16_at(b + 2) * (float)summ;
    }
    return sumf;
}

static inline float kq_dot_q6_K_generic(const void *w, const kq_block_q8_K *x, int64_t nb) {
    const uint8_t *b = (const uint8_t *)w;
    float sumf = 0;
    for (int64_t i = 0; i < nb; i++, b += 210) {
        const int8_t *q8 = x[i].qs;
        const int8_t *sc = (const int8_t *)(b + 192);
        int32_t sumi = 0;
        for (int n = 0; n < 2; n++)
            for (int s = 0; s < 4; s++)
                for (int h = 0; h < 2; h++) {
                    const uint8_t *ql = b + n * 64 + (s & 1) * 32 + h * 16;
                    const uint8_t *qh = b + 128 + n * 32 + h * 16;
                    const int8_t *a = q8 + n * 128 + s * 32 + h * 16;
                    int32_t t = 0;
                    for (int l = 0; l < 16; l++)
                        t += ((((ql[l] >> (4 * (s >> 1))) & 0xf) | (((qh[l] >> (2 * s)) & 3) << 4)) - 32) * a[l];
                    sumi += sc[n * 8 + s * 2 + h] * t;
                }
        sumf += x[i].d * kq_f16_at(b + 208) * (float)sumi;
    }
    return sumf;
}

static inline float kq_dot_iq4_xs_generic(const void *w, const kq_block_q8_K *x, int64_t nb) {
    const uint8_t *b = (const uint8_t *)w;
    float sumf = 0;
    for (int64_t i = 0; i < nb; i++, b += 136) {
        const int8_t *q8 = x[i].qs;
        int32_t sumi = 0;
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *q = b + 8 + ib * 16;
            int32_t t = 0;
            for (int l = 0; l < 16; l++)
                t += kq_iq4nl_values[q[l] & 0xf] * q8[ib * 32 + l] + kq_iq4nl_values[q[l] >> 4] * q8[ib * 32 + 16 + l];
            sumi += kq_scale_iq4xs(b, ib) * t;
        }
        sumf += x[i].d * kq_f16_at(b) * (float)sumi;
    }
    return sumf;
}

/* ==================================================== x86: AVX2 (+ AVX-512 VNNI or AVX-VNNI) */
#if defined(KQ_X86)

/* acc + pairwise int16 products summed into int32 lanes */
#if defined(KQ_VNNI)
#define KQ_MADD_ACC(acc, a, b) _mm256_dpwssd_epi32((acc), (a), (b))
#elif defined(__AVXVNNI__)
#define KQ_MADD_ACC(acc, a, b) _mm256_dpwssd_avx_epi32((acc), (a), (b))
#else
#define KQ_MADD_ACC(acc, a, b) _mm256_add_epi32((acc), _mm256_madd_epi16((a), (b)))
#endif

static inline float kq_hsum256(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* kq_scales_k4 / kq_scales_q3 built in registers (a memcpy to the stack and a 16-byte reload
 * would stall on store forwarding) */
static inline __m128i kq_scales_k4_x86(const uint8_t *s) {
    uint32_t u0, u1, u2;
    memcpy(&u0, s, 4);
    memcpy(&u1, s + 4, 4);
    memcpy(&u2, s + 8, 4);
    const uint32_t k1 = 0x3f3f3f3fu, k2 = 0x0f0f0f0fu, k3 = 0x03030303u;
    return _mm_set_epi32((int)(((u2 >> 4) & k2) | (((u1 >> 6) & k3) << 4)), (int)(u1 & k1),
                         (int)((u2 & k2) | (((u0 >> 6) & k3) << 4)), (int)(u0 & k1));
}

static inline __m128i kq_scales_q3_x86(const uint8_t *s) {
    uint32_t a0, a1, t;
    memcpy(&a0, s, 4);
    memcpy(&a1, s + 4, 4);
    memcpy(&t, s + 8, 4);
    const uint32_t k1 = 0x03030303u, k2 = 0x0f0f0f0fu;
    const __m128i v = _mm_set_epi32((int)(((a1 >> 4) & k2) | (((t >> 6) & k1) << 4)),
                                    (int)(((a0 >> 4) & k2) | (((t >> 4) & k1) << 4)),
                                    (int)((a1 & k2) | (((t >> 2) & k1) << 4)), (int)((a0 & k2) | ((t & k1) << 4)));
    return _mm_sub_epi8(v, _mm_set1_epi8(32));
}

/* 16 int8 scales (one per 16 values) -> the two halves of their int16 widening, each broadcast
 * to both 128-bit lanes; kq_scale_pair(h, g) then gives, for the 32 values g (sub-blocks 2g and
 * 2g+1), scale 2g in the low lane and 2g+1 in the high lane: one in-lane byte shuffle. */
typedef struct {
    __m256i lo, hi;
} kq_scales16;

static inline kq_scales16 kq_scales16_x86(__m128i sc8) {
    const __m128i lo = _mm_cvtepi8_epi16(sc8), hi = _mm_cvtepi8_epi16(_mm_unpackhi_epi64(sc8, sc8));
    kq_scales16 r;
    r.lo = _mm256_set_m128i(lo, lo);
    r.hi = _mm256_set_m128i(hi, hi);
    return r;
}

static inline __m256i kq_scale_pair(const kq_scales16 *h, int g) {
    const int e = (2 * g) & 7;
    const __m256i idx = _mm256_set_m128i(_mm_set1_epi16((short)((2 * e + 3) << 8 | (2 * e + 2))),
                                         _mm_set1_epi16((short)((2 * e + 1) << 8 | (2 * e))));
    return _mm256_shuffle_epi8(g < 4 ? h->lo : h->hi, idx);
}

static inline float kq_dot_q2_K_x86(const void *w, const kq_block_q8_K *x, int64_t nb) {
    const uint8_t *b = (const uint8_t *)w;
    const __m256i m3 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0xf);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, b += 84) {
        KQ_PREFETCH(b, 84);
        const int8_t *q8 = x[i].qs;
        const __m128i mas = _mm_loadu_si128((const __m128i *)b);
        const __m128i sc8 = _mm_and_si128(mas, m4);
        const __m128i mn8 = _mm_and_si128(_mm_srli_epi16(mas, 4), m4);
        const __m256i prodm = _mm256_madd_epi16(_mm256_cvtepu8_epi16(mn8),
                                                _mm256_loadu_si256((const __m256i *)x[i].bsums));
        const kq_scales16 scs = kq_scales16_x86(sc8);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * kq_f16_at(b + 82)), _mm256_cvtepi32_ps(prodm), accm);
        __m256i sumi = _mm256_setzero_si256();
        for (int n = 0; n < 2; n++) {
            const __m256i q2 = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * n));
            const __m256i c0 = _mm256_and_si256(q2, m3);
            const __m256i c1 = _mm256_and_si256(_mm256_srli_epi16(q2, 2), m3);
            const __m256i c2 = _mm256_and_si256(_mm256_srli_epi16(q2, 4), m3);
            const __m256i c3 = _mm256_and_si256(_mm256_srli_epi16(q2, 6), m3);
            const int8_t *a = q8 + 128 * n;
            const __m256i p0 = _mm256_maddubs_epi16(c0, _mm256_loadu_si256((const __m256i *)(a + 0)));
            const __m256i p1 = _mm256_maddubs_epi16(c1, _mm256_loadu_si256((const __m256i *)(a + 32)));
            const __m256i p2 = _mm256_maddubs_epi16(c2, _mm256_loadu_si256((const __m256i *)(a + 64)));
            const __m256i p3 = _mm256_maddubs_epi16(c3, _mm256_loadu_si256((const __m256i *)(a + 96)));
            sumi = KQ_MADD_ACC(sumi, kq_scale_pair(&scs, 4 * n + 0), p0);
            sumi = KQ_MADD_ACC(sumi, kq_scale_pair(&scs, 4 * n + 1), p1);
            sumi = KQ_MADD_ACC(sumi, kq_scale_pair(&scs, 4 * n + 2), p2);
            sumi = KQ_MADD_ACC(sumi, kq_scale_pair(&scs, 4 * n + 3), p3);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * kq_f16_at(b + 80)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return kq_hsum256(acc) - kq_hsum256(accm);
}

static inline float kq_dot_q3_K_x86(const void *w, const kq_block_q8_K *x, int64_t nb) {
    const uint8_t *b = (const uint8_t *)w;
    const __m256i m3 = _mm256_set1_epi8(3), m4 = _mm256_set1_epi8(4);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, b += 110) {
        KQ_PREFETCH(b, 110);
        const int8_t *q8 = x[i].qs;
        const __m128i sc8 = kq_scales_q3_x86(b + 96);
        /* codes are u - 4 with u = low two bits | high bit << 2 in 0..7: sum sc*u*q8 - 4*sum sc*bsum */
        const __m256i corr = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8),
                                               _mm256_loadu_si256((const __m256i *)x[i].bsums));
        const kq_scales16 scs = kq_scales16_x86(sc8);
        __m256i hb = _mm256_loadu_si256((const __m256i *)b);
        __m256i sumi = _mm256_setzero_si256();
        for (int n = 0; n < 2; n++) {
            const __m256i q3 = _mm256_loadu_si256((const __m256i *)(b + 32 + 32 * n));
            const int8_t *a = q8 + 128 * n;
            for (int s = 0; s < 4; s++) {
                const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q3, 2 * s), m3);
                const __m256i hi = _mm256_and_si256(_mm256_slli_epi16(hb, 2), m4);
                hb = _mm256_srli_epi16(hb, 1);
                const __m256i p = _mm256_maddubs_epi16(_mm256_or_si256(lo, hi),
                                                       _mm256_loadu_si256((const __m256i *)(a + 32 * s)));
                sumi = KQ_MADD_ACC(sumi, kq_scale_pair(&scs, 4 * n + s), p);
            }
        }
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(corr, 2));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * kq_f16_at(b + 108)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return kq_hsum256(acc);
}

static inline float kq_dot_q4_K_x86(const void *w, const kq_block_q8_K *x, int64_t nb) {
    const uint8_t *b = (const uint8_t *)w;
    const __m256i m4 = _mm256_set1_epi8(0xf);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < nb; i++, b += 144) {
        KQ_PREFETCH(b, 144);
        const int8_t *q8 = x[i].qs;
        const __m256i ms = _mm256_cvtepu8_epi16(kq_scales_k4_x86(b + 4));
        const __m128i bs32 = _mm_loadu_si128((const __m128i *)x[i].bsums32);
        const __m128i prodm = _mm_madd_epi16(_mm256_extracti128_si256(ms, 1), bs32);
        accm = _mm_fmadd_ps(_mm_set1_ps(x[i].d * kq_f16_at(b + 2)), _mm_cvtepi32_ps(prodm), accm);
        const __m256i scales = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(ms));
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            const __m256i sl = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)((4 * c + 1) << 8 | (4 * c))));
            const __m256i sh = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)((4 * c + 3) << 8 | (4 * c + 2))));
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * c));
            const __m256i lo = _mm256_and_si256(q4, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(q8 + 64 * c)));
            const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 64 * c + 32)));
            sumi = KQ_MADD_ACC(sumi, sl, pl);
            sumi = KQ_MADD_ACC(sumi, sh, ph);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * kq_f16_at(b)), _mm256_cvtepi32_ps(sumi), acc);
    }
    __m128 m = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return kq_hsum256(acc) - _mm_cvtss_f32(m);
}

static inline float kq_dot_q5_K_x86(const void *w, const kq_block_q8_K *x, int64_t nb) {
    const uint8_t *b = (const uint8_t *)w;
    const __m256i m4 = _mm256_set1_epi8(0xf), m16 = _mm256_set1_epi8(16);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < nb; i++, b += 176) {
        KQ_PREFETCH(b, 176);
        const int8_t *q8 = x[i].qs;
        const __m256i ms = _mm256_cvtepu8_epi16(kq_scales_k4_x86(b + 4));
        const __m128i bs32 = _mm_loadu_si128((const __m128i *)x[i].bsums32);
        const __m128i prodm = _mm_madd_epi16(_mm256_extracti128_si256(ms, 1), bs32);
        accm = _mm_fmadd_ps(_mm_set1_ps(x[i].d * kq_f16_at(b + 2)), _mm_cvtepi32_ps(prodm), accm);
        const __m256i scales = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(ms));
        __m256i hb = _mm256_loadu_si256((const __m256i *)(b + 16));
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            const __m256i sl = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)((4 * c + 1) << 8 | (4 * c))));
            const __m256i sh = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)((4 * c + 3) << 8 | (4 * c + 2))));
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(b + 48 + 32 * c));
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(q4, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m16));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4, 4), m4),
                                               _mm256_and_si256(_mm256_slli_epi16(hb, 3), m16));
            hb = _mm256_srli_epi16(hb, 2);
            const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(q8 + 64 * c)));
            const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 64 * c + 32)));
            sumi = KQ_MADD_ACC(sumi, sl, pl);
            sumi = KQ_MADD_ACC(sumi, sh, ph);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * kq_f16_at(b)), _mm256_cvtepi32_ps(sumi), acc);
    }
    __m128 m = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return kq_hsum256(acc) - _mm_cvtss_f32(m);
}

static inline float kq_dot_q6_K_x86(const void *w, const kq_block_q8_K *x, int64_t nb) {
    const uint8_t *b = (const uint8_t *)w;
    const __m256i m4 = _mm256_set1_epi8(0xf), m30 = _mm256_set1_epi8(0x30);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, b += 210) {
        KQ_PREFETCH(b, 210);
        const int8_t *q8 = x[i].qs;
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)(b + 192));
        /* codes are u - 32 with u in 0..63: sum sc*u*q8 - 32*sum sc*bsum */
        const __m256i corr = _mm256_madd_epi16(_mm256_cvtepi8_epi16(sc8),
                                               _mm256_loadu_si256((const __m256i *)x[i].bsums));
        const kq_scales16 scs = kq_scales16_x86(sc8);
        __m256i sumi = _mm256_setzero_si256();
        for (int n = 0; n < 2; n++) {
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(b + 64 * n));
            const __m256i l2 = _mm256_loadu_si256((const __m256i *)(b + 64 * n + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * n));
            const __m256i c0 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
            const __m256i c1 = _mm256_or_si256(_mm256_and_si256(l2, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
            const __m256i c2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(h, m30));
            const __m256i c3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l2, 4), m4),
                                               _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
            const int8_t *a = q8 + 128 * n;
            const __m256i p0 = _mm256_maddubs_epi16(c0, _mm256_loadu_si256((const __m256i *)(a + 0)));
            const __m256i p1 = _mm256_maddubs_epi16(c1, _mm256_loadu_si256((const __m256i *)(a + 32)));
            const __m256i p2 = _mm256_maddubs_epi16(c2, _mm256_loadu_si256((const __m256i *)(a + 64)));
            const __m256i p3 = _mm256_maddubs_epi16(c3, _mm256_loadu_si256((const __m256i *)(a + 96)));
            sumi = KQ_MADD_ACC(sumi, kq_scale_pair(&scs, 4 * n + 0), p0);
            sumi = KQ_MADD_ACC(sumi, kq_scale_pair(&scs, 4 * n + 1), p1);
            sumi = KQ_MADD_ACC(sumi, kq_scale_pair(&scs, 4 * n + 2), p2);
            sumi = KQ_MADD_ACC(sumi, kq_scale_pair(&scs, 4 * n + 3), p3);
        }
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(corr, 5));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * kq_f16_at(b + 208)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return kq_hsum256(acc);
}

static inline float kq_dot_iq4_xs_x86(const void *w, const kq_block_q8_K *x, int64_t nb) {
    const uint8_t *b = (const uint8_t *)w;
    const __m128i m4 = _mm_set1_epi8(0xf);
    const __m256i values = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)kq_iq4nl_values));
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, b += 136) {
        KQ_PREFETCH(b, 136);
        const int8_t *q8 = x[i].qs;
        uint16_t sh;
        memcpy(&sh, b + 2, 2);
        __m256i sumi = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
            const int ls1 = ((b[4 + p] & 0xf) | ((sh << 4) & 0x30)) - 32;
            const int ls2 = ((b[4 + p] >> 4) | ((sh << 2) & 0x30)) - 32;
            sh >>= 4;
            const __m128i qa = _mm_loadu_si128((const __m128i *)(b + 8 + 32 * p));
            const __m128i qb = _mm_loadu_si128((const __m128i *)(b + 24 + 32 * p));
            const __m256i k1 = _mm256_shuffle_epi8(
                values, _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qa, 4), m4), _mm_and_si128(qa, m4)));
            const __m256i k2 = _mm256_shuffle_epi8(
                values, _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qb, 4), m4), _mm_and_si128(qb, m4)));
            const __m256i a1 = _mm256_loadu_si256((const __m256i *)(q8 + 64 * p));
            const __m256i a2 = _mm256_loadu_si256((const __m256i *)(q8 + 64 * p + 32));
            const __m256i p1 = _mm256_maddubs_epi16(_mm256_sign_epi8(k1, k1), _mm256_sign_epi8(a1, k1));
            const __m256i p2 = _mm256_maddubs_epi16(_mm256_sign_epi8(k2, k2), _mm256_sign_epi8(a2, k2));
            sumi = KQ_MADD_ACC(sumi, _mm256_set1_epi16((short)ls1), p1);
            sumi = KQ_MADD_ACC(sumi, _mm256_set1_epi16((short)ls2), p2);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(x[i].d * kq_f16_at(b)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return kq_hsum256(acc);
}

/* Several activation rows against one weight row: the weights are unpacked once per block for
 * N rows of x (N = 2 or 4). Each row's result is bit-identical to kq_dot_*_x86 on that row
 * alone (the same float operations in the same order), so a token's output never depends on
 * the batch it is in. */
#if defined(__GNUC__)
#define KQ_ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define KQ_ALWAYS_INLINE inline
#endif

/* Q4_K's mins against one x row's block sums, added to accm: d_x * dmin * min_j * bsum32_j */
static inline __m128 kq_q4_K_mins(__m128 accm, __m128i mins, const kq_block_q8_K *xr, float dmw) {
    const __m128i bs32 = _mm_loadu_si128((const __m128i *)xr->bsums32);
    return _mm_fmadd_ps(_mm_set1_ps(xr->d * dmw), _mm_cvtepi32_ps(_mm_madd_epi16(mins, bs32)), accm);
}

/* a Q4_K row's result: its scaled sums less its mins */
static inline float kq_q4_K_result(__m256 acc, __m128 accm) {
    __m128 m = _mm_add_ps(accm, _mm_movehl_ps(accm, accm));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return kq_hsum256(acc) - _mm_cvtss_f32(m);
}

/* a Q6_K block's int32 sums less 32 x its scaled block sums of x (the codes' offset), times
 * d_x * d, added to acc */
static inline __m256 kq_q6_K_block(__m256 acc, __m256i sumi, __m256i sc16, const kq_block_q8_K *xr, float dw) {
    const __m256i corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256((const __m256i *)xr->bsums));
    const __m256i si = _mm256_sub_epi32(sumi, _mm256_slli_epi32(corr, 5));
    return _mm256_fmadd_ps(_mm256_set1_ps(xr->d * dw), _mm256_cvtepi32_ps(si), acc);
}

/* Q4_K (five = 0) and Q5_K (five = 1: the fifth bits in 32 bytes after the scales, bit c of
 * value l for chunk c), as kq_dot_q4_K_x86 and kq_dot_q5_K_x86 take them row by row; inlined
 * with a constant five. 256-bit registers in every x86 build: the AVX-512 one takes Q4_K's
 * rows on 512-bit ones (kq_dot_q4_K_n_zmm) and has no such copy for Q5_K. */
static KQ_ALWAYS_INLINE void kq_dot_k45_n_x86(const void *w, const kq_block_q8_K *x, int64_t xs, int64_t nb,
                                              float *out, const int N, const int five) {
    const uint8_t *b = (const uint8_t *)w;
    const int block = five ? 176 : 144, codes = five ? 48 : 16;
    const __m256i m4 = _mm256_set1_epi8(0xf), m16 = _mm256_set1_epi8(16);
    __m256 acc[4];
    __m128 accm[4];
    for (int r = 0; r < N; r++) acc[r] = _mm256_setzero_ps(), accm[r] = _mm_setzero_ps();
    for (int64_t i = 0; i < nb; i++, b += block) {
        KQ_PREFETCH(b, block);
        const __m256i ms = _mm256_cvtepu8_epi16(kq_scales_k4_x86(b + 4));
        const __m128i mins = _mm256_extracti128_si256(ms, 1);
        const float dw = kq_f16_at(b), dmw = kq_f16_at(b + 2);
        const __m256i scales = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(ms));
        __m256i hb = five ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
        __m256i sumi[4];
        for (int r = 0; r < N; r++) {
            accm[r] = kq_q4_K_mins(accm[r], mins, x + r * xs + i, dmw);
            sumi[r] = _mm256_setzero_si256();
        }
        for (int c = 0; c < 4; c++) {
            const __m256i sl = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)((4 * c + 1) << 8 | (4 * c))));
            const __m256i sh = _mm256_shuffle_epi8(scales, _mm256_set1_epi16((short)((4 * c + 3) << 8 | (4 * c + 2))));
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(b + codes + 32 * c));
            __m256i lo = _mm256_and_si256(q4, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            if (five) {
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4), m16));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hb, 3), m16));
                hb = _mm256_srli_epi16(hb, 2);
            }
            for (int r = 0; r < N; r++) {
                const int8_t *q8 = x[r * xs + i].qs;
                const __m256i pl = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(q8 + 64 * c)));
                const __m256i ph = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(q8 + 64 * c + 32)));
                sumi[r] = KQ_MADD_ACC(sumi[r], sl, pl);
                sumi[r] = KQ_MADD_ACC(sumi[r], sh, ph);
            }
        }
        for (int r = 0; r < N; r++)
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(x[r * xs + i].d * dw), _mm256_cvtepi32_ps(sumi[r]), acc[r]);
    }
    for (int r = 0; r < N; r++) out[r] = kq_q4_K_result(acc[r], accm[r]);
}

static KQ_ALWAYS_INLINE void kq_dot_q4_K_n_x86(const void *w, const kq_block_q8_K *x, int64_t xs, int64_t nb,
                                               float *out, const int N) {
    kq_dot_k45_n_x86(w, x, xs, nb, out, N, 0);
}

static KQ_ALWAYS_INLINE void kq_dot_q5_K_n_x86(const void *w, const kq_block_q8_K *x, int64_t xs, int64_t nb,
                                               float *out, const int N) {
    kq_dot_k45_n_x86(w, x, xs, nb, out, N, 1);
}

static KQ_ALWAYS_INLINE void kq_dot_q6_K_n_x86(const void *w, const kq_block_q8_K *x, int64_t xs, int64_t nb,
                                               float *out, const int N) {
    const uint8_t *b = (const uint8_t *)w;
    const __m256i m4 = _mm256_set1_epi8(0xf), m30 = _mm256_set1_epi8(0x30);
    __m256 acc[4];
    for (int r = 0; r < N; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, b += 210) {
        KQ_PREFETCH(b, 210);
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)(b + 192));
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        const kq_scales16 scs = kq_scales16_x86(sc8);
        const float dw = kq_f16_at(b + 208);
        __m256i sumi[4];
        for (int r = 0; r < N; r++) sumi[r] = _mm256_setzero_si256();
        for (int n = 0; n < 2; n++) {
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(b + 64 * n));
            const __m256i l2 = _mm256_loadu_si256((const __m256i *)(b + 64 * n + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * n));
            const __m256i c0 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
            const __m256i c1 = _mm256_or_si256(_mm256_and_si256(l2, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
            const __m256i c2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_and_si256(h, m30));
            const __m256i c3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l2, 4), m4),
                                               _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
            const __m256i s0 = kq_scale_pair(&scs, 4 * n + 0), s1 = kq_scale_pair(&scs, 4 * n + 1);
            const __m256i s2 = kq_scale_pair(&scs, 4 * n + 2), s3 = kq_scale_pair(&scs, 4 * n + 3);
            for (int r = 0; r < N; r++) {
                const int8_t *a = x[r * xs + i].qs + 128 * n;
                const __m256i p0 = _mm256_maddubs_epi16(c0, _mm256_loadu_si256((const __m256i *)(a + 0)));
                const __m256i p1 = _mm256_maddubs_epi16(c1, _mm256_loadu_si256((const __m256i *)(a + 32)));
                const __m256i p2 = _mm256_maddubs_epi16(c2, _mm256_loadu_si256((const __m256i *)(a + 64)));
                const __m256i p3 = _mm256_maddubs_epi16(c3, _mm256_loadu_si256((const __m256i *)(a + 96)));
                sumi[r] = KQ_MADD_ACC(sumi[r], s0, p0);
                sumi[r] = KQ_MADD_ACC(sumi[r], s1, p1);
                sumi[r] = KQ_MADD_ACC(sumi[r], s2, p2);
                sumi[r] = KQ_MADD_ACC(sumi[r], s3, p3);
            }
        }
        for (int r = 0; r < N; r++) acc[r] = kq_q6_K_block(acc[r], sumi[r], sc16, x + r * xs + i, dw);
    }
    for (int r = 0; r < N; r++) out[r] = kq_hsum256(acc[r]);
}

/* The same N-row products on 512-bit registers where the build has AVX-512 (BW for the byte
 * and word products): a register holds 64 consecutive weights (a 32-byte run's low and high
 * nibbles, or Q6_K's two 32-value runs) against 64 consecutive activations, so each x row
 * takes half the multiply instructions. The 16 int32 lanes fold to the 256-bit code's 8 before
 * any float operation: lane l and l + 8 hold exactly the products the 256-bit lane l sums, and
 * int32 sums are exact, so every result is bit-identical to kq_dot_*_x86. */
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define KQ_ZMM 1
#if defined(KQ_VNNI)
#define KQ_MADD_ACC512(acc, a, b) _mm512_dpwssd_epi32((acc), (a), (b))
#else
#define KQ_MADD_ACC512(acc, a, b) _mm512_add_epi32((acc), _mm512_madd_epi16((a), (b)))
#endif

static inline __m256i kq_fold512(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

/* word lanes 0-15 from element lo of v's words, 16-31 from element lo + 1 (vpermw) */
static inline __m512i kq_words2(__m512i v, int lo) {
    return _mm512_permutexvar_epi16(_mm512_inserti64x4(_mm512_set1_epi16((short)lo),
                                                       _mm256_set1_epi16((short)(lo + 1)), 1), v);
}

/* word lanes 8k..8k+7 from element lo + k of v's words, k = 0..3 */
static inline __m512i kq_words4(__m512i v, int lo) {
    const long long k1 = 0x0001000100010001LL;
    const __m512i idx = _mm512_set_epi64(3 * k1, 3 * k1, 2 * k1, 2 * k1, k1, k1, 0, 0);
    return _mm512_permutexvar_epi16(_mm512_add_epi16(idx, _mm512_set1_epi16((short)lo)), v);
}

static KQ_ALWAYS_INLINE void kq_dot_q4_K_n_zmm(const void *w, const kq_block_q8_K *x, int64_t xs, int64_t nb,
                                               float *out, const int N) {
    const uint8_t *b = (const uint8_t *)w;
    const __m512i m4 = _mm512_set1_epi8(0xf);
    __m256 acc[4];
    __m128 accm[4];
    for (int r = 0; r < N; r++) acc[r] = _mm256_setzero_ps(), accm[r] = _mm_setzero_ps();
    for (int64_t i = 0; i < nb; i++, b += 144) {
        KQ_PREFETCH(b, 144);
        const __m256i ms = _mm256_cvtepu8_epi16(kq_scales_k4_x86(b + 4));
        const __m128i mins = _mm256_extracti128_si256(ms, 1);
        const __m512i ms512 = _mm512_castsi256_si512(ms);
        const float dw = kq_f16_at(b), dmw = kq_f16_at(b + 2);
        __m512i sumi[4];
        for (int r = 0; r < N; r++) {
            accm[r] = kq_q4_K_mins(accm[r], mins, x + r * xs + i, dmw);
            sumi[r] = _mm512_setzero_si512();
        }
        for (int c = 0; c < 4; c++) {
            const __m512i sc = kq_words2(ms512, 2 * c);
            const __m256i q4 = _mm256_loadu_si256((const __m256i *)(b + 16 + 32 * c));
            const __m512i q = _mm512_and_si512(
                _mm512_inserti64x4(_mm512_castsi256_si512(q4), _mm256_srli_epi16(q4, 4), 1), m4);
            for (int r = 0; r < N; r++) {
                const __m512i a = _mm512_loadu_si512((const void *)(x[r * xs + i].qs + 64 * c));
                sumi[r] = KQ_MADD_ACC512(sumi[r], sc, _mm512_maddubs_epi16(q, a));
            }
        }
        for (int r = 0; r < N; r++)
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(x[r * xs + i].d * dw), _mm256_cvtepi32_ps(kq_fold512(sumi[r])),
                                     acc[r]);
    }
    for (int r = 0; r < N; r++) out[r] = kq_q4_K_result(acc[r], accm[r]);
}

static KQ_ALWAYS_INLINE void kq_dot_q6_K_n_zmm(const void *w, const kq_block_q8_K *x, int64_t xs, int64_t nb,
                                               float *out, const int N) {
    const uint8_t *b = (const uint8_t *)w;
    const __m512i m4 = _mm512_set1_epi8(0xf), m30 = _mm512_set1_epi8(0x30);
    /* shifts of the high bits for the two 32-value runs of a register (the 256-bit code's
     * c0|c1 and c2|c3) */
    const __m512i shl01 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
    const __m512i shr23 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    __m256 acc[4];
    for (int r = 0; r < N; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, b += 210) {
        KQ_PREFETCH(b, 210);
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192)));
        const __m512i sc512 = _mm512_castsi256_si512(sc16);
        const float dw = kq_f16_at(b + 208);
        __m512i sumi[4];
        for (int r = 0; r < N; r++) sumi[r] = _mm512_setzero_si512();
        for (int n = 0; n < 2; n++) {
            const __m512i l = _mm512_loadu_si512((const void *)(b + 64 * n));
            const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 128 + 32 * n)));
            const __m512i z01 = _mm512_or_si512(_mm512_and_si512(l, m4),
                                                _mm512_and_si512(_mm512_sllv_epi16(h, shl01), m30));
            const __m512i z23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                                _mm512_and_si512(_mm512_srlv_epi16(h, shr23), m30));
            const __m512i s01 = kq_words4(sc512, 8 * n), s23 = kq_words4(sc512, 8 * n + 4);
            for (int r = 0; r < N; r++) {
                const int8_t *a = x[r * xs + i].qs + 128 * n;
                const __m512i p01 = _mm512_maddubs_epi16(z01, _mm512_loadu_si512((const void *)a));
                const __m512i p23 = _mm512_maddubs_epi16(z23, _mm512_loadu_si512((const void *)(a + 64)));
                sumi[r] = KQ_MADD_ACC512(sumi[r], s01, p01);
                sumi[r] = KQ_MADD_ACC512(sumi[r], s23, p23);
            }
        }
        for (int r = 0; r < N; r++)
            acc[r] = kq_q6_K_block(acc[r], kq_fold512(sumi[r]), sc16, x + r * xs + i, dw);
    }
    for (int r = 0; r < N; r++) out[r] = kq_hsum256(acc[r]);
}
#define KQ_N(name) kq_dot_##name##_n_zmm
#else
#define KQ_N(name) kq_dot_##name##_n_x86
#endif

#define KQ_ROWS_X86(name, n_rows)                                                                  \
    static inline void kq_dot_rows_##name##_x86(const void *w, const kq_block_q8_K *x, int64_t xs, int nx, \
                                                 int64_t nb, float *out) {                         \
        int r = 0;                                                                                 \
        for (; r + 4 <= nx; r += 4) n_rows(w, x + r * xs, xs, nb, out + r, 4);                     \
        for (; r + 2 <= nx; r += 2) n_rows(w, x + r * xs, xs, nb, out + r, 2);                     \
        if (r < nx) out[r] = kq_dot_##name##_x86(w, x + r * xs, nb);                             \
    }
KQ_ROWS_X86(q4_K, KQ_N(q4_K))
KQ_ROWS_X86(q5_K, kq_dot_q5_K_n_x86)
KQ_ROWS_X86(q6_K, KQ_N(q6_K))

#define KQ_IMPL(name) kq_dot_##name##_x86
#if defined(KQ_VNNI)
#define KQ_IMPL_NAME "x86-avx512-vnni"
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define KQ_IMPL_NAME "x86-avx512"
#elif defined(__AVXVNNI__)
#define KQ_IMPL_NAME "x86-avx2-vnni"
#else
#define KQ_IMPL_NAME "x86-avx2"
#endif

#elif defined(KQ_NEON)
/* ============================================================ AArch64: NEON
 * Q4_K, Q5_K and Q6_K (the K-quant mixes' types) in Advanced SIMD, the ARMv8.0 baseline: codes
 * unpacked 16 at a time in registers (no int8 buffer), vmull_s8/vmlal_s8 products of codes
 * and q8_K into int16 lanes (at most four a lane: 0 <= code <= 63, |q8| <= 127, so the lanes
 * stay below 2^15), widened in pairs (vpaddlq_s16), or with sdot in the neondot copy; each
 * sub-block's sum gathered by pairwise adds, then all of them times their scales in a few
 * vector multiplies. The same exact integer sums as the portable C, then its float step: the
 * same bits. Instructions a superblock, one row of 3,072 values, under qemu
 * (`benchmarks/neon_instructions.py`; neon / neondot), against the first NEON code's (a scalar
 * multiply-add per sub-block, the mins and the f16 scales in scalar code) or the portable C
 * that Q2_K, Q3_K and IQ4_XS took: Q4_K 196 -> 142 / 124, Q5_K 245 -> 196 / 174, Q6_K 240 -> 197
 * / 177, Q2_K 1,023 -> 153 / 131, Q3_K 1,028 -> 223 / 203, IQ4_XS 1,443 -> 187 / 148. */

#if defined(__ARM_FEATURE_DOTPROD)
/* The neondot copy (setup.py: -march=armv8.2-a+dotprod; dispatch.c runs it where the CPU has the
 * dot product instructions, ARMv8.2's FEAT_DotProd: Cortex-A55/A75 and later, Neoverse, Apple's
 * cores): sdot adds four int8 products into each int32 lane, 16 products an instruction, where
 * vmull/vmlal make 8 into int16 lanes that vpaddl then widens (5 instructions for 32 products
 * against 2). The lanes hold other partial sums than the plain copy's, but every sum is exact in
 * int32 and the callers only add the lanes up: the same integer sums, the same bits. */

/* int32x4 of the products of 32 codes (q0: values 0-15, q1: 16-31) and 32 int8 at a */
static inline int32x4_t kq_neon_dot32(int8x16_t q0, int8x16_t q1, const int8_t *a) {
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), q0, vld1q_s8(a)), q1, vld1q_s8(a + 16));
}

/* int32x4 of the products of 16 codes and 16 int8 at a */
static inline int32x4_t kq_neon_dot16(int8x16_t q, const int8_t *a) {
    return vdotq_s32(vdupq_n_s32(0), q, vld1q_s8(a));
}
#else
/* int32x4 of the products of 32 codes (q0: values 0-15, q1: 16-31) and 32 int8 at a */
static inline int32x4_t kq_neon_dot32(int8x16_t q0, int8x16_t q1, const int8_t *a) {
    const int8x16_t a0 = vld1q_s8(a), a1 = vld1q_s8(a + 16);
    int16x8_t p = vmull_s8(vget_low_s8(q0), vget_low_s8(a0));
    p = vmlal_high_s8(p, q0, a0);
    p = vmlal_s8(p, vget_low_s8(q1), vget_low_s8(a1));
    p = vmlal_high_s8(p, q1, a1);
    return vpaddlq_s16(p);
}

/* int32x4 of the products of 16 codes and 16 int8 at a */
static inline int32x4_t kq_neon_dot16(int8x16_t q, const int8_t *a) {
    const int8x16_t a0 = vld1q_s8(a);
    return vpaddlq_s16(vmlal_high_s8(vmull_s8(vget_low_s8(q), vget_low_s8(a0)), q, a0));
}
#endif

/* The sub-block sums of 4 dot vectors p[0..3] (each int32x4, whose lanes add up to its
 * sub-block's products): [S0, S1, S2, S3], pairwise adds in two levels */
static inline int32x4_t kq_neon_sums4(const int32x4_t *p) {
    return vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
}

/* Q4_K (five = 0) and Q5_K (five = 1: the fifth bits in qh, bit c of value l for chunk c)
 * against nr rows of x (xs blocks apart; nr 1 or 2, a constant as five is where inlined): each
 * block unpacked once for them, each row's sums and float steps as it has them alone. Scales
 * and mins as kq_scales_k4 gives them, 4 chunks of 32 bytes, sub-block 2c in the low nibbles,
 * 2c + 1 in the high ones. The 8 sub-blocks' sums meet their scales in two vector multiplies,
 * and the mins meet q8_K's 32-value sums in two. */
static inline __attribute__((always_inline)) void kq_dot_k45_neon_rows(const void *w, const kq_block_q8_K *x,
                                                                       int64_t xs, int64_t nb, const int five,
                                                                       const int nr, float *out) {
    const uint8_t *b = (const uint8_t *)w;
    const int64_t bytes = five ? 176 : 144, qs = five ? 48 : 16;
    const uint8x16_t m4 = vdupq_n_u8(0xf), b16 = vdupq_n_u8(16);
    float sumf[2] = {0.0f, 0.0f};
    for (int64_t i = 0; i < nb; i++, b += bytes) {
        uint8_t sm[16];
        kq_scales_k4(b + 4, sm);
        const uint8x16_t h0 = vld1q_u8(b + 16), h1 = vld1q_u8(b + 32); /* Q5_K's qh */
        int32x4_t p[2][8]; /* row r's sub-block j's products, in lanes */
        for (int c = 0; c < 4; c++) {
            const uint8x16_t v0 = vld1q_u8(b + qs + 32 * c), v1 = vld1q_u8(b + qs + 16 + 32 * c);
            uint8x16_t lo0 = vandq_u8(v0, m4), lo1 = vandq_u8(v1, m4);
            uint8x16_t hi0 = vshrq_n_u8(v0, 4), hi1 = vshrq_n_u8(v1, 4);
            if (five) { /* bit 2c of qh to 16 for the low nibbles, bit 2c + 1 for the high */
                const int8x16_t slo = vdupq_n_s8((int8_t)(4 - 2 * c)), shi = vdupq_n_s8((int8_t)(3 - 2 * c));
                lo0 = vorrq_u8(lo0, vandq_u8(vshlq_u8(h0, slo), b16));
                lo1 = vorrq_u8(lo1, vandq_u8(vshlq_u8(h1, slo), b16));
                hi0 = vorrq_u8(hi0, vandq_u8(vshlq_u8(h0, shi), b16));
                hi1 = vorrq_u8(hi1, vandq_u8(vshlq_u8(h1, shi), b16));
            }
            for (int r = 0; r < nr; r++) {
                const int8_t *q8 = x[r * xs + i].qs + 64 * c;
                p[r][2 * c] = kq_neon_dot32(vreinterpretq_s8_u8(lo0), vreinterpretq_s8_u8(lo1), q8);
                p[r][2 * c + 1] = kq_neon_dot32(vreinterpretq_s8_u8(hi0), vreinterpretq_s8_u8(hi1), q8 + 32);
            }
        }
        /* sum_j sc_j S_j and sum_j m_j bsums32_j, exact in int32 as the portable C's */
        const uint16x8_t sc = vmovl_u8(vld1_u8(sm));
        const int32x4_t sc0 = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(sc)));
        const int32x4_t sc1 = vreinterpretq_s32_u32(vmovl_high_u16(sc));
        const int16x8_t mins = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(sm + 8)));
        const float d = kq_f16_at(b), dmin = kq_f16_at(b + 2);
        for (int r = 0; r < nr; r++) {
            const kq_block_q8_K *xr = x + r * xs + i;
            const int32x4_t acc = vmlaq_s32(vmulq_s32(kq_neon_sums4(p[r]), sc0), kq_neon_sums4(p[r] + 4), sc1);
            const int16x8_t bs = vld1q_s16(xr->bsums32);
            const int32x4_t mm = vmlal_high_s16(vmull_s16(vget_low_s16(mins), vget_low_s16(bs)), mins, bs);
            const int32_t sumi = vaddvq_s32(acc), summ = vaddvq_s32(mm);
            sumf[r] += xr->d * d * (float)sumi - xr->d * dmin * (float)summ;
        }
    }
    for (int r = 0; r < nr; r++) out[r] = sumf[r];
}

static inline float kq_dot_q4_K_neon(const void *w, const kq_block_q8_K *x, int64_t nb) {
    float out;
    kq_dot_k45_neon_rows(w, x, 0, nb, 0, 1, &out);
    return out;
}
static inline float kq_dot_q5_K_neon(const void *w, const kq_block_q8_K *x, int64_t nb) {
    float out;
    kq_dot_k45_neon_rows(w, x, 0, nb, 1, 1, &out);
    return out;
}

/* sum_g sc_g S_g over 16 sub-blocks: p[g] their products in lanes, sc their 16 scales as int16
 * (two registers of 8), exact in int32 */
static inline int32x4_t kq_neon_scaled16(const int32x4_t *p, int16x8_t sc0, int16x8_t sc1) {
    int32x4_t acc = vmulq_s32(kq_neon_sums4(p), vmovl_s16(vget_low_s16(sc0)));
    acc = vmlaq_s32(acc, kq_neon_sums4(p + 4), vmovl_high_s16(sc0));
    acc = vmlaq_s32(acc, kq_neon_sums4(p + 8), vmovl_s16(vget_low_s16(sc1)));
    return vmlaq_s32(acc, kq_neon_sums4(p + 12), vmovl_high_s16(sc1));
}

/* sum_g c_g bsums_g over the 16 sub-blocks of 16 (c: two registers of 8 int16), exact */
static inline int32_t kq_neon_bsums16(const kq_block_q8_K *x, int16x8_t c0, int16x8_t c1) {
    const int16x8_t b0 = vld1q_s16(x->bsums), b1 = vld1q_s16(x->bsums + 8);
    int32x4_t t = vmull_s16(vget_low_s16(c0), vget_low_s16(b0));
    t = vmlal_high_s16(t, c0, b0);
    t = vmlal_s16(t, vget_low_s16(c1), vget_low_s16(b1));
    return vaddvq_s32(vmlal_high_s16(t, c1, b1));
}

/* Q6_K against nr rows of x (as kq_dot_k45_neon_rows): 16 sub-blocks of 16 codes q (0..63, the
 * value q - 32), their int8 scales at 192; the 16 sums of q times x meet the scales in four
 * vector multiplies (kq_neon_scaled16; a multiply-add by a broadcast scale each before), less
 * 32 sum_j sc_j bsums_j (q8_K's 16-value sums) for the offset */
static inline __attribute__((always_inline)) void kq_dot_q6_K_neon_rows(const void *w, const kq_block_q8_K *x,
                                                                        int64_t xs, int64_t nb, const int nr,
                                                                        float *out) {
    const uint8_t *b = (const uint8_t *)w;
    const uint8x16_t m4 = vdupq_n_u8(0xf), m3 = vdupq_n_u8(3);
    float sumf[2] = {0.0f, 0.0f};
    for (int64_t i = 0; i < nb; i++, b += 210) {
        int32x4_t p[2][16]; /* row r's sub-block n * 8 + s * 2 + h's products: the scales' order */
        for (int n = 0; n < 2; n++)
            for (int h = 0; h < 2; h++) { /* 16 values of each of the four groups s */
                const uint8x16_t l0 = vld1q_u8(b + n * 64 + h * 16), l1 = vld1q_u8(b + n * 64 + 32 + h * 16);
                const uint8x16_t qh = vld1q_u8(b + 128 + n * 32 + h * 16);
                const uint8x16_t u[4] = {
                    vorrq_u8(vandq_u8(l0, m4), vshlq_n_u8(vandq_u8(qh, m3), 4)),
                    vorrq_u8(vandq_u8(l1, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(qh, 2), m3), 4)),
                    vorrq_u8(vshrq_n_u8(l0, 4), vshlq_n_u8(vandq_u8(vshrq_n_u8(qh, 4), m3), 4)),
                    vorrq_u8(vshrq_n_u8(l1, 4), vshlq_n_u8(vshrq_n_u8(qh, 6), 4)),
                };
                for (int r = 0; r < nr; r++)
                    for (int s = 0; s < 4; s++)
                        p[r][n * 8 + s * 2 + h] =
                            kq_neon_dot16(vreinterpretq_s8_u8(u[s]), x[r * xs + i].qs + n * 128 + s * 32 + h * 16);
            }
        const int8x16_t sc = vld1q_s8((const int8_t *)(b + 192));
        const int16x8_t sc0 = vmovl_s8(vget_low_s8(sc)), sc1 = vmovl_high_s8(sc);
        const float d = kq_f16_at(b + 208);
        for (int r = 0; r < nr; r++) {
            const kq_block_q8_K *xr = x + r * xs + i;
            /* sub-block j's 16 values are q8_K's bsums[j]: sum_j sc_j (S_j - 32 bsums_j), exact */
            const int32_t sumi = vaddvq_s32(kq_neon_scaled16(p[r], sc0, sc1)) - 32 * kq_neon_bsums16(xr, sc0, sc1);
            sumf[r] += xr->d * d * (float)sumi;
        }
    }
    for (int r = 0; r < nr; r++) out[r] = sumf[r];
}

static inline float kq_dot_q6_K_neon(const void *w, const kq_block_q8_K *x, int64_t nb) {
    float out;
    kq_dot_q6_K_neon_rows(w, x, 0, nb, 1, &out);
    return out;
}

/* Several rows of x, two a pass over the weight row (a down projection's two q8_K passes, a
 * few sequences' rows), each bit-identical to its single call */
#define KQ_ROWS_NEON(name, two)                                                                    \
    static inline void kq_dot_rows_##name##_neon(const void *w, const kq_block_q8_K *x, int64_t xs, int nx, \
                                                  int64_t nb, float *out) {                        \
        int r = 0;                                                                                 \
        for (; r + 2 <= nx; r += 2) two;                                                           \
        if (r < nx) out[r] = kq_dot_##name##_neon(w, x + r * xs, nb);                            \
    }
KQ_ROWS_NEON(q4_K, kq_dot_k45_neon_rows(w, x + r * xs, xs, nb, 0, 2, out + r))
KQ_ROWS_NEON(q5_K, kq_dot_k45_neon_rows(w, x + r * xs, xs, nb, 1, 2, out + r))
KQ_ROWS_NEON(q6_K, kq_dot_q6_K_neon_rows(w, x + r * xs, xs, nb, 2, out + r))

/* p[8n + 2s + h]: the products of the 16 sub-blocks of 16 codes of Q2_K's and Q3_K's layout with
 * q8, in lanes. Sub-block 8n + 2s + h holds bits 2s..2s + 1 of bytes 16h..16h + 15 of the n-th
 * 32 at qs, and with hm (Q3_K's hmask) bit 4n + s of hm's bytes 16h..16h + 15 as bit 2. */
static inline __attribute__((always_inline)) void kq_neon_products_2bit(const uint8_t *qs, const uint8_t *hm,
                                                                        const int8_t *q8, int32x4_t *p) {
    const uint8x16_t m3 = vdupq_n_u8(3), four = vdupq_n_u8(4);
    for (int h = 0; h < 2; h++) {
        const uint8x16_t hb = hm ? vld1q_u8(hm + 16 * h) : vdupq_n_u8(0);
        for (int n = 0; n < 2; n++) {
            const uint8x16_t v = vld1q_u8(qs + n * 32 + h * 16);
            const uint8x16_t u[4] = {vandq_u8(v, m3), vandq_u8(vshrq_n_u8(v, 2), m3),
                                     vandq_u8(vshrq_n_u8(v, 4), m3), vshrq_n_u8(v, 6)};
            for (int s = 0; s < 4; s++) {
                uint8x16_t c = u[s];
                if (hm) /* bit 4n + s to bit 2 */
                    c = vorrq_u8(c, vandq_u8(vshlq_u8(hb, vdupq_n_s8((int8_t)(2 - 4 * n - s))), four));
                p[n * 8 + s * 2 + h] = kq_neon_dot16(vreinterpretq_s8_u8(c), q8 + n * 128 + s * 32 + h * 16);
            }
        }
    }
}

/* Q2_K: two-bit codes (kq_neon_products_2bit at 16), scale (low nibble) and min (high) of each
 * sub-block a byte at 0 */
static inline float kq_dot_q2_K_neon(const void *w, const kq_block_q8_K *x, int64_t nb) {
    const uint8_t *b = (const uint8_t *)w;
    float sumf = 0;
    for (int64_t i = 0; i < nb; i++, b += 84) {
        int32x4_t p[16];
        kq_neon_products_2bit(b + 16, 0, x[i].qs, p);
        const uint8x16_t sm = vld1q_u8(b);
        const uint8x16_t sc = vandq_u8(sm, vdupq_n_u8(0xf)), mn = vshrq_n_u8(sm, 4);
        const int16x8_t sc0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(sc)));
        const int16x8_t sc1 = vreinterpretq_s16_u16(vmovl_high_u8(sc));
        const int16x8_t mn0 = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mn)));
        const int16x8_t mn1 = vreinterpretq_s16_u16(vmovl_high_u8(mn));
        const int32_t sumi = vaddvq_s32(kq_neon_scaled16(p, sc0, sc1)), summ = kq_neon_bsums16(x + i, mn0, mn1);
        sumf += x[i].d * kq_f16_at(b + 80) * (float)sumi - x[i].d * kq_f16_at(b + 82) * (float)summ;
    }
    return sumf;
}

/* Q3_K: three-bit codes u (0..7, the value u - 4: kq_neon_products_2bit at 32 with hmask at 0),
 * six-bit signed scales (kq_scales_q3); the -4 from q8_K's 16-value sums */
static inline float kq_dot_q3_K_neon(const void *w, const kq_block_q8_K *x, int64_t nb) {
    const uint8_t *b = (const uint8_t *)w;
    float sumf = 0;
    for (int64_t i = 0; i < nb; i++, b += 110) {
        int8_t scales[16];
        kq_scales_q3(b + 96, scales);
        int32x4_t p[16];
        kq_neon_products_2bit(b + 32, b, x[i].qs, p);
        const int8x16_t sc = vld1q_s8(scales);
        const int16x8_t sc0 = vmovl_s8(vget_low_s8(sc)), sc1 = vmovl_high_s8(sc);
        const int32_t sumi = vaddvq_s32(kq_neon_scaled16(p, sc0, sc1)) - 4 * kq_neon_bsums16(x + i, sc0, sc1);
        sumf += x[i].d * kq_f16_at(b + 108) * (float)sumi;
    }
    return sumf;
}

/* IQ4_XS: 8 sub-blocks of 32, each 16 bytes of nibbles (values 0-15 low, 16-31 high) mapped by
 * the IQ4_NL table, six-bit scales minus 32 (kq_scale_iq4xs). Two products a lane at most on
 * plain NEON: the values reach 127, so each 16-value half is its own product. */
static inline float kq_dot_iq4_xs_neon(const void *w, const kq_block_q8_K *x, int64_t nb) {
    const uint8_t *b = (const uint8_t *)w;
    const int8x16_t values = vld1q_s8(kq_iq4nl_values);
    const uint8x16_t m4 = vdupq_n_u8(0xf);
    float sumf = 0;
    for (int64_t i = 0; i < nb; i++, b += 136) {
        const int8_t *q8 = x[i].qs;
        int32x4_t p[8];
        int32_t scales[8];
        for (int ib = 0; ib < 8; ib++) {
            const uint8x16_t v = vld1q_u8(b + 8 + ib * 16);
            p[ib] = vaddq_s32(kq_neon_dot16(vqtbl1q_s8(values, vandq_u8(v, m4)), q8 + ib * 32),
                              kq_neon_dot16(vqtbl1q_s8(values, vshrq_n_u8(v, 4)), q8 + ib * 32 + 16));
            scales[ib] = kq_scale_iq4xs(b, ib);
        }
        int32x4_t acc = vmulq_s32(kq_neon_sums4(p), vld1q_s32(scales));
        acc = vmlaq_s32(acc, kq_neon_sums4(p + 4), vld1q_s32(scales + 4));
        sumf += x[i].d * kq_f16_at(b) * (float)vaddvq_s32(acc);
    }
    return sumf;
}

#define KQ_IMPL(name) kq_dot_##name##_neon
#if defined(__ARM_FEATURE_DOTPROD)
#define KQ_IMPL_NAME "neon-dotprod"
#else
#define KQ_IMPL_NAME "neon"
#endif

#else /* portable */

#define KQ_IMPL(name) kq_dot_##name##_generic
#define KQ_IMPL_NAME "generic"

#endif

/* ============================================================ public dot products */
static inline float kq_dot_q2_K(const void *w, const kq_block_q8_K *x, int64_t nb) { return KQ_IMPL(q2_K)(w, x, nb); }
static inline float kq_dot_q3_K(const void *w, const kq_block_q8_K *x, int64_t nb) { return KQ_IMPL(q3_K)(w, x, nb); }
static inline float kq_dot_q4_K(const void *w, const kq_block_q8_K *x, int64_t nb) { return KQ_IMPL(q4_K)(w, x, nb); }
static inline float kq_dot_q5_K(const void *w, const kq_block_q8_K *x, int64_t nb) { return KQ_IMPL(q5_K)(w, x, nb); }
static inline float kq_dot_q6_K(const void *w, const kq_block_q8_K *x, int64_t nb) { return KQ_IMPL(q6_K)(w, x, nb); }
static inline float kq_dot_iq4_xs(const void *w, const kq_block_q8_K *x, int64_t nb) { return KQ_IMPL(iq4_xs)(w, x, nb); }

/* ============================================================ several rows of x
 * out[r] = kq_dot_<type>(w, x + r * x_stride, nb) for r < nx, each bit-identical to that single
 * call; faster where the weights are unpacked once for several rows (Q4_K, Q5_K, Q6_K on x86 and
 * NEON). */
#define KQ_ROWS_LOOP(name)                                                                         \
    static inline void kq_dot_rows_##name##_loop(const void *w, const kq_block_q8_K *x, int64_t xs, int nx, \
                                                  int64_t nb, float *out) {                        \
        for (int r = 0; r < nx; r++) out[r] = kq_dot_##name(w, x + r * xs, nb);                  \
    }
KQ_ROWS_LOOP(q2_K)
KQ_ROWS_LOOP(q3_K)
KQ_ROWS_LOOP(q4_K)
KQ_ROWS_LOOP(q5_K)
KQ_ROWS_LOOP(q6_K)
KQ_ROWS_LOOP(iq4_xs)

#if defined(KQ_X86)
#define KQ_ROWS_Q4_K kq_dot_rows_q4_K_x86
#define KQ_ROWS_Q5_K kq_dot_rows_q5_K_x86
#define KQ_ROWS_Q6_K kq_dot_rows_q6_K_x86
#elif defined(KQ_NEON)
#define KQ_ROWS_Q4_K kq_dot_rows_q4_K_neon
#define KQ_ROWS_Q5_K kq_dot_rows_q5_K_neon
#define KQ_ROWS_Q6_K kq_dot_rows_q6_K_neon
#else
#define KQ_ROWS_Q4_K kq_dot_rows_q4_K_loop
#define KQ_ROWS_Q5_K kq_dot_rows_q5_K_loop
#define KQ_ROWS_Q6_K kq_dot_rows_q6_K_loop
#endif

typedef void (*kq_dot_rows_fn)(const void *w, const kq_block_q8_K *x, int64_t x_stride, int nx, int64_t nb,
                               float *out);

static inline void kq_dot_rows_q2_K(const void *w, const kq_block_q8_K *x, int64_t xs, int nx, int64_t nb, float *out) { kq_dot_rows_q2_K_loop(w, x, xs, nx, nb, out); }
static inline void kq_dot_rows_q3_K(const void *w, const kq_block_q8_K *x, int64_t xs, int nx, int64_t nb, float *out) { kq_dot_rows_q3_K_loop(w, x, xs, nx, nb, out); }
static inline void kq_dot_rows_q4_K(const void *w, const kq_block_q8_K *x, int64_t xs, int nx, int64_t nb, float *out) { KQ_ROWS_Q4_K(w, x, xs, nx, nb, out); }
static inline void kq_dot_rows_q5_K(const void *w, const kq_block_q8_K *x, int64_t xs, int nx, int64_t nb, float *out) { KQ_ROWS_Q5_K(w, x, xs, nx, nb, out); }
static inline void kq_dot_rows_q6_K(const void *w, const kq_block_q8_K *x, int64_t xs, int nx, int64_t nb, float *out) { KQ_ROWS_Q6_K(w, x, xs, nx, nb, out); }
static inline void kq_dot_rows_iq4_xs(const void *w, const kq_block_q8_K *x, int64_t xs, int nx, int64_t nb, float *out) { kq_dot_rows_iq4_xs_loop(w, x, xs, nx, nb, out); }

static inline kq_dot_rows_fn kq_dot_rows_for_type(int ggml_type) {
    switch (ggml_type) {
    case KQ_TYPE_Q2_K: return kq_dot_rows_q2_K;
    case KQ_TYPE_Q3_K: return kq_dot_rows_q3_K;
    case KQ_TYPE_Q4_K: return kq_dot_rows_q4_K;
    case KQ_TYPE_Q5_K: return kq_dot_rows_q5_K;
    case KQ_TYPE_Q6_K: return kq_dot_rows_q6_K;
    case KQ_TYPE_IQ4_XS: return kq_dot_rows_iq4_xs;
    default: return 0;
    }
}

/* by ggml type id; NULL for a type this header does not handle */
typedef float (*kq_dot_fn)(const void *w, const kq_block_q8_K *x, int64_t nb);
typedef void (*kq_dequant_fn)(const void *w, float *y, int64_t k);

static inline kq_dot_fn kq_dot_for_type(int ggml_type) {
    switch (ggml_type) {
    case KQ_TYPE_Q2_K: return kq_dot_q2_K;
    case KQ_TYPE_Q3_K: return kq_dot_q3_K;
    case KQ_TYPE_Q4_K: return kq_dot_q4_K;
    case KQ_TYPE_Q5_K: return kq_dot_q5_K;
    case KQ_TYPE_Q6_K: return kq_dot_q6_K;
    case KQ_TYPE_IQ4_XS: return kq_dot_iq4_xs;
    default: return 0;
    }
}

static inline kq_dequant_fn kq_dequant_for_type(int ggml_type) {
    switch (ggml_type) {
    case KQ_TYPE_Q2_K: return kq_dequant_row_q2_K;
    case KQ_TYPE_Q3_K: return kq_dequant_row_q3_K;
    case KQ_TYPE_Q4_K: return kq_dequant_row_q4_K;
    case KQ_TYPE_Q5_K: return kq_dequant_row_q5_K;
    case KQ_TYPE_Q6_K: return kq_dequant_row_q6_K;
    case KQ_TYPE_IQ4_XS: return kq_dequant_row_iq4_xs;
    default: return 0;
    }
}

#endif /* EMBER_KQUANTS_H */
