/* gemm16.h: a prompt's product with a weight kept as its GGUF blocks, x in int16 (prefill).
 *
 * y (M, N) = x (M, K) @ W^T for many rows of x (M > 16), for the weights whose input bears no
 * int8 rounding (gemm8.h takes the MLP's gate and up): the attention projections, the attention
 * output and the down projection. Where the float32 path expanded W and multiplied in float32,
 * here x is quantized per 32 values to int16 codes as the decode kernels quantize it (simple.h's
 * em_quantize_row_q16_to, but to 16383 where they take 32767: d = max|x| / 16383, s = d * the
 * sum of the codes; the product ~3e-5 from the float32 one), and W is unpacked a panel of
 * EM_G16_NR rows at a time into int16 codes with a float scale s and offset o per 32 values:
 *   Q4_0, Q5_0, Q8_0, IQ4_NL  code = q (signed, gemm8.h's code less its centre), s = d, o = 0
 *   Q4_1, Q5_1, Q4_K, Q5_K    code = q, s and o as gemm8.h's (o = m, or -dmin * min)
 *   Q6_K                      code = (q - 32) * sc (its 16-value sub-block's scale), s = d, o = 0
 * A panel's codes are interleaved two at a time: pair p (values 2p, 2p + 1) of every row is one
 * line, dword r holding row r's two codes, so one vpmaddwd (vpdpwssd with VNNI) multiplies two
 * codes of 8 or 16 rows by two broadcast codes of a row of x. Per 32 values and row of x: the
 * sum, exact in int32 (|code| <= 4096 and |x| <= 16383: 32 products stay below 2^31), then
 * acc = fma(sum * dx, s, acc) and, for the types with an offset, acc = fma(o, s_x, acc).
 *
 * Against the float32 matmul the products run at twice the width (int16 pairs where float32
 * took one value a lane); the broadcast codes of x are loads, which bound the tile: each line
 * meets EM_G16_MR rows of x, 16 weight rows a 256-bit pair of registers, 32 a 512-bit pair. The
 * portable C (em_g16_panel_generic) does the same float operations in the same order, so every
 * path gives the same bits. */
#ifndef EMBER_GEMM16_H
#define EMBER_GEMM16_H

#include <stdint.h>
#include <string.h>

#include "gemm8.h"
#include "simple.h"

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define EM_G16_NR 32 /* weight rows a panel: two registers of lanes */
#define EM_G16_MR 6  /* rows of x a pass over a panel's lines */
#elif defined(__AVXVNNI__)
#define EM_G16_NR 16
#define EM_G16_MR 3
#else /* AVX2 without VNNI (and the portable C): with the float accumulators in L1, 4 rows ran
       * 15-20% faster than 3 (`bench_gemm8.py --kernel gemm16 --isa avx2`, the Zen 5); AVX-VNNI's
       * 4 rows ran 25% slower than its 3 */
#define EM_G16_NR 16
#define EM_G16_MR 4
#endif

#define EM_G16_LIMIT 16383.0f /* x's codes at most this in size */

/* c where the type's unsigned codes (gemm8.h's) are q + c, else 0 (its offset o stays) */
static inline int em_g16_centre(int type) {
    switch (type) {
    case 2: return 8;              /* Q4_0 */
    case 6: return 16;             /* Q5_0 */
    case 8: case 20: return 128;   /* Q8_0, IQ4_NL */
    default: return 0;             /* Q4_1, Q5_1, Q4_K, Q5_K: w = s * q + o; Q6_K its own */
    }
}

/* Whether the type's weights have an offset o (w = s * code + o) */
static inline int em_g16_affine(int type) { return em_g16_centre(type) == 0 && type != KQ_TYPE_Q6_K; }

/* One weight row (K values) as int16 codes and, per 32 values, s and o (see the top); `row`
 * and `rs`, `ro` scratch of K bytes and K / 16 floats */
static void em_g16_unpack_row(int type, const uint8_t *w, int64_t K, int16_t *code, float *s, float *o,
                              uint8_t *row, float *rs, float *ro) {
    em_g8_unpack_row(type, w, K, row, rs, ro);
    if (type == KQ_TYPE_Q6_K) { /* its 16-value sub-blocks' int8 scales go into the codes */
        for (int64_t i = 0; i < K / KQ_QK; i++, w += 210) {
            const int8_t *sc = (const int8_t *)(w + 192);
            for (int j = 0; j < KQ_QK / 16; j++)
                for (int l = 0; l < 16; l++) {
                    const int64_t k = i * KQ_QK + 16 * j + l;
                    code[k] = (int16_t)(((int16_t)row[k] - 32) * sc[j]);
                }
            const float d = kq_f16_at(w + 208);
            for (int j = 0; j < KQ_QK / EM_QK; j++) s[i * 8 + j] = d, o[i * 8 + j] = 0.0f;
        }
        return;
    }
    const int c = em_g16_centre(type);
    for (int64_t k = 0; k < K; k++) code[k] = (int16_t)(row[k] - c);
    for (int64_t u = 0; u < K / EM_QK; u++) s[u] = rs[u], o[u] = c ? 0.0f : ro[u];
}

/* Bytes of em_g16_pack's scratch for rows of K values */
static inline size_t em_g16_pack_scratch(int64_t K) {
    return (size_t)(2 * (K / 16) * 4 + 2 * (K / 32) * 4 + EM_G16_NR * K * 2 + K);
}

/* A panel: nr <= EM_G16_NR weight rows (row_bytes apart) unpacked into `codes` (K / 2 lines of
 * EM_G16_NR dwords) and per 32 values EM_G16_NR scales `ps` and offsets `po`; the lanes past nr
 * are zero. `scratch`: em_g16_pack_scratch(K) bytes, 4-byte aligned. The rows are unpacked
 * whole, then interleaved a pair (dword) at a time (gemm8.h's em_g8_lines). */
static void em_g16_pack(int type, const uint8_t *W, int64_t row_bytes, int nr, int64_t K, int16_t *codes,
                        float *ps, float *po, void *scratch) {
    const int64_t units = K / EM_QK;
    float *rs = (float *)scratch, *ro = rs + K / 16, *s = ro + K / 16, *o = s + units; /* gemm8's, then ours */
    int16_t *rows = (int16_t *)(o + units); /* EM_G16_NR rows of K codes */
    uint8_t *row = (uint8_t *)(rows + EM_G16_NR * K);
    if (nr < EM_G16_NR) {
        memset(codes, 0, (size_t)K * EM_G16_NR * sizeof(int16_t));
        memset(ps, 0, (size_t)units * EM_G16_NR * sizeof(float));
        memset(po, 0, (size_t)units * EM_G16_NR * sizeof(float));
    }
    for (int r = 0; r < nr; r++) {
        em_g16_unpack_row(type, W + r * row_bytes, K, rows + r * K, s, o, row, rs, ro);
        for (int64_t u = 0; u < units; u++) ps[u * EM_G16_NR + r] = s[u], po[u * EM_G16_NR + r] = o[u];
    }
    memset(rows + nr * K, 0, (size_t)(EM_G16_NR - nr) * K * sizeof(int16_t));
    em_g8_lines((const uint8_t *)rows, nr, 2 * K, EM_G16_NR, (int32_t *)codes);
}

/* the two int16 codes at c as one int32 */
static inline int32_t em_g16_pair(const int16_t *c) {
    int32_t two;
    memcpy(&two, c, 4);
    return two;
}

/* y[m * ldy + r] for r < nr, m < M: the panel against M rows of x (nb blocks apart); affine:
 * whether the type has offsets */
__attribute__((unused)) static void em_g16_panel_generic(const int16_t *codes, const float *ps, const float *po,
                                                         int affine, int64_t K, const em_block_q16 *xq,
                                                         int64_t nb, int64_t M, float *y, int64_t ldy, int nr) {
    const int U = EM_QK;
    for (int64_t m = 0; m < M; m++) {
        const em_block_q16 *x = xq + m * nb;
        float acc[EM_G16_NR] = {0};
        for (int64_t u = 0; u < K / U; u++) {
            const int64_t k0 = u * U;
            for (int r = 0; r < EM_G16_NR; r++) {
                int32_t sum = 0;
                for (int j = 0; j < U; j++) {
                    const int64_t k = k0 + j;
                    sum += (int32_t)codes[((k / 2) * EM_G16_NR + r) * 2 + k % 2] * x[k / EM_QK].qs[k % EM_QK];
                }
                const float t = (float)sum * x[u].d;
                acc[r] = fmaf(t, ps[u * EM_G16_NR + r], acc[r]);
                if (affine) acc[r] = fmaf(po[u * EM_G16_NR + r], x[u].s, acc[r]);
            }
        }
        for (int r = 0; r < nr; r++) y[m * ldy + r] = acc[r];
    }
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define EM_G16_FAST 1
/* Six rows' sums of a unit against the panel (sum[0..11]: rows 0-5, each two registers of 16
 * weight rows), vpdpwssd onto each sum in place, in assembly (three rows a statement: an asm
 * takes at most 30 operands): GCC 12 copied the sums between registers around the products,
 * ~12 moves a pair of values beside its 12 products. */
#define EM_G16_ROW(AT, S0, S1)                                                                       \
    "vpbroadcastd " AT ", %[b]\n\tvpdpwssd %[b], %[w0], %[" #S0 "]\n\tvpdpwssd %[b], %[w1], %[" #S1 "]\n\t"
#define EM_G16_ROWS3(X, A, B, C, D, E, F)                                                              \
    __asm__(EM_G16_ROW("(%[x])", A, B) EM_G16_ROW("(%[x],%[st],1)", C, D) EM_G16_ROW("(%[x],%[st],2)", E, F) \
            : [A] "+v"(A), [B] "+v"(B), [C] "+v"(C), [D] "+v"(D), [E] "+v"(E), [F] "+v"(F), [b] "=&v"(b)    \
            : [w0] "v"(w0), [w1] "v"(w1), [x] "r"(X), [st] "r"(st)                                       \
            : "memory")
static inline __attribute__((always_inline)) void em_g16_unit6(const int16_t *cw, const int16_t *const *xc,
                                                               __m512i *sum) {
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
    __m512i s8 = s0, s9 = s0, s10 = s0, s11 = s0, b;
    const int64_t st = (const char *)xc[1] - (const char *)xc[0]; /* rows of x equally apart */
#pragma GCC unroll 16
    for (int P = 0; P < EM_QK / 2; P++) {
        const __m512i w0 = _mm512_load_si512((const void *)(cw + P * 2 * EM_G16_NR));
        const __m512i w1 = _mm512_load_si512((const void *)(cw + P * 2 * EM_G16_NR + 32));
        EM_G16_ROWS3(xc[0] + 2 * P, s0, s1, s2, s3, s4, s5);
        EM_G16_ROWS3(xc[3] + 2 * P, s6, s7, s8, s9, s10, s11);
    }
    sum[0] = s0, sum[1] = s1, sum[2] = s2, sum[3] = s3, sum[4] = s4, sum[5] = s5;
    sum[6] = s6, sum[7] = s7, sum[8] = s8, sum[9] = s9, sum[10] = s10, sum[11] = s11;
}
#undef EM_G16_ROW
#undef EM_G16_ROWS3

/* mr (<= EM_G16_MR) rows of x against the panel (two registers of 16 rows a line); affine and
 * mr constants where inlined, so that a unit's lines unroll */
static inline __attribute__((always_inline)) void em_g16_tile(const int16_t *codes, const float *ps,
                                                              const float *po, const int affine,
                                                              int64_t K, const em_block_q16 *xq, int64_t nb,
                                                              float *y, int64_t ldy, int nr, const int mr) {
    __m512 acc[2 * EM_G16_MR];
    for (int i = 0; i < 2 * mr; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t u = 0; u < K / EM_QK; u++) {
        const int64_t k0 = u * EM_QK;
        const int16_t *cw = codes + k0 * EM_G16_NR;
        __m512i sum[2 * EM_G16_MR];
        for (int i = 0; i < 2 * mr; i++) sum[i] = _mm512_setzero_si512();
        const int16_t *xc[EM_G16_MR]; /* each row's codes of the unit */
        for (int i = 0; i < mr; i++) xc[i] = xq[i * nb + u].qs;
        if (mr == 6) /* the same sums, in assembly */
            em_g16_unit6(cw, xc, sum);
        else
        for (int p = 0; p < EM_QK / 2; p++) {
            const __m512i w0 = _mm512_load_si512((const void *)(cw + p * 2 * EM_G16_NR));
            const __m512i w1 = _mm512_load_si512((const void *)(cw + p * 2 * EM_G16_NR + 32));
            for (int i = 0; i < mr; i++) {
                const __m512i xb = _mm512_set1_epi32(em_g16_pair(xc[i] + 2 * p));
                sum[2 * i] = _mm512_dpwssd_epi32(sum[2 * i], w0, xb);
                sum[2 * i + 1] = _mm512_dpwssd_epi32(sum[2 * i + 1], w1, xb);
            }
        }
        for (int h = 0; h < 2; h++) {
            const __m512 s = _mm512_load_ps(ps + u * EM_G16_NR + 16 * h);
            const __m512 o = _mm512_load_ps(po + u * EM_G16_NR + 16 * h);
            for (int i = 0; i < mr; i++) {
                const em_block_q16 *xb = xq + i * nb + u;
                const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(sum[2 * i + h]), _mm512_set1_ps(xb->d));
                acc[2 * i + h] = _mm512_fmadd_ps(t, s, acc[2 * i + h]);
                if (affine) acc[2 * i + h] = _mm512_fmadd_ps(o, _mm512_set1_ps(xb->s), acc[2 * i + h]);
            }
        }
    }
    const __mmask16 keep0 = (__mmask16)(nr >= 16 ? 0xffff : (1u << nr) - 1);
    const __mmask16 keep1 = (__mmask16)(nr >= 32 ? 0xffff : nr <= 16 ? 0 : (1u << (nr - 16)) - 1);
    for (int i = 0; i < mr; i++) {
        _mm512_mask_storeu_ps(y + i * ldy, keep0, acc[2 * i]);
        _mm512_mask_storeu_ps(y + i * ldy + 16, keep1, acc[2 * i + 1]);
    }
}

#elif defined(__AVX2__) && defined(__FMA__)
#define EM_G16_FAST 1
#if !defined(__AVXVNNI__)
/* Four rows' sums of a unit against the panel (sum[0..7]: rows 0-3, each two registers of 8
 * weight rows), vpmaddwd into one scratch register and vpaddd onto the sum, in assembly: GCC 12
 * kept each new sum in the product's register and copied it back, 8 register moves a pair of
 * values besides its 16 products and adds. `bench_gemm8.py --kernel gemm16 --isa avx2` (the
 * Xeon, alternated twice): 184-234 GFLOPS with the C loop, 246-289 with this. */
#define EM_G16_PAIR(P)                                                                                 \
    __asm__("vmovdqa %c[o0](%[cw]), %[w0]\n\t"                                                      \
            "vmovdqa %c[o1](%[cw]), %[w1]\n\t"                                                      \
            "vpbroadcastd %c[ox](%[x0]), %[b]\n\t"                                                  \
            "vpmaddwd %[b], %[w0], %[t]\n\t"                                                        \
            "vpaddd %[t], %[s0], %[s0]\n\t"                                                         \
            "vpmaddwd %[b], %[w1], %[t]\n\t"                                                        \
            "vpaddd %[t], %[s1], %[s1]\n\t"                                                         \
            "vpbroadcastd %c[ox](%[x1]), %[b]\n\t"                                                  \
            "vpmaddwd %[b], %[w0], %[t]\n\t"                                                        \
            "vpaddd %[t], %[s2], %[s2]\n\t"                                                         \
            "vpmaddwd %[b], %[w1], %[t]\n\t"                                                        \
            "vpaddd %[t], %[s3], %[s3]\n\t"                                                         \
            "vpbroadcastd %c[ox](%[x2]), %[b]\n\t"                                                  \
            "vpmaddwd %[b], %[w0], %[t]\n\t"                                                        \
            "vpaddd %[t], %[s4], %[s4]\n\t"                                                         \
            "vpmaddwd %[b], %[w1], %[t]\n\t"                                                        \
            "vpaddd %[t], %[s5], %[s5]\n\t"                                                         \
            "vpbroadcastd %c[ox](%[x3]), %[b]\n\t"                                                  \
            "vpmaddwd %[b], %[w0], %[t]\n\t"                                                        \
            "vpaddd %[t], %[s6], %[s6]\n\t"                                                         \
            "vpmaddwd %[b], %[w1], %[t]\n\t"                                                        \
            "vpaddd %[t], %[s7], %[s7]"                                                               \
            : [s0] "+x"(s0), [s1] "+x"(s1), [s2] "+x"(s2), [s3] "+x"(s3), [s4] "+x"(s4), [s5] "+x"(s5), \
              [s6] "+x"(s6), [s7] "+x"(s7), [w0] "=&x"(w0), [w1] "=&x"(w1), [b] "=&x"(b), [t] "=&x"(t)    \
            : [cw] "r"(cw), [x0] "r"(xc[0]), [x1] "r"(xc[1]), [x2] "r"(xc[2]), [x3] "r"(xc[3]),          \
              [o0] "i"((P) * 4 * EM_G16_NR), [o1] "i"((P) * 4 * EM_G16_NR + 32), [ox] "i"((P) * 4)        \
            : "memory")
static inline __attribute__((always_inline)) void em_g16_unit4(const int16_t *cw, const int16_t *const *xc,
                                                               __m256i *sum) {
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0, s6 = s0, s7 = s0;
    __m256i w0, w1, b, t;
    EM_G16_PAIR(0); EM_G16_PAIR(1); EM_G16_PAIR(2); EM_G16_PAIR(3); EM_G16_PAIR(4); EM_G16_PAIR(5);
    EM_G16_PAIR(6); EM_G16_PAIR(7); EM_G16_PAIR(8); EM_G16_PAIR(9); EM_G16_PAIR(10); EM_G16_PAIR(11);
    EM_G16_PAIR(12); EM_G16_PAIR(13); EM_G16_PAIR(14); EM_G16_PAIR(15);
    sum[0] = s0, sum[1] = s1, sum[2] = s2, sum[3] = s3, sum[4] = s4, sum[5] = s5, sum[6] = s6, sum[7] = s7;
}
#undef EM_G16_PAIR
#endif
/* mr (<= EM_G16_MR) rows of x against the panel (two registers of 8 rows a line); AVX-VNNI's
 * vpdpwssd where this copy has it, else vpmaddwd and an add: the same int32 sums. The float
 * accumulators stay in L1, met once a unit, so that 4 rows' sums fit AVX2's 16 registers. */
static inline __attribute__((always_inline)) void em_g16_tile(const int16_t *codes, const float *ps,
                                                              const float *po, const int affine,
                                                              int64_t K, const em_block_q16 *xq, int64_t nb,
                                                              float *y, int64_t ldy, int nr, const int mr) {
    float acc[2 * EM_G16_MR][8] __attribute__((aligned(32)));
    for (int i = 0; i < 2 * mr; i++) _mm256_store_ps(acc[i], _mm256_setzero_ps());
    for (int64_t u = 0; u < K / EM_QK; u++) {
        const int64_t k0 = u * EM_QK;
        const int16_t *cw = codes + k0 * EM_G16_NR;
        __m256i sum[2 * EM_G16_MR];
        for (int i = 0; i < 2 * mr; i++) sum[i] = _mm256_setzero_si256();
        const int16_t *xc[EM_G16_MR]; /* each row's codes of the unit */
        for (int i = 0; i < mr; i++) xc[i] = xq[i * nb + u].qs;
#if !defined(__AVXVNNI__)
        if (mr == 4) /* the same sums, in assembly */
            em_g16_unit4(cw, xc, sum);
        else
#endif
        for (int p = 0; p < EM_QK / 2; p++) {
            const __m256i w0 = _mm256_load_si256((const __m256i *)(cw + p * 2 * EM_G16_NR));
            const __m256i w1 = _mm256_load_si256((const __m256i *)(cw + p * 2 * EM_G16_NR + 16));
            for (int i = 0; i < mr; i++) {
                const __m256i xb = _mm256_set1_epi32(em_g16_pair(xc[i] + 2 * p));
#if defined(__AVXVNNI__)
                sum[2 * i] = _mm256_dpwssd_avx_epi32(sum[2 * i], w0, xb);
                sum[2 * i + 1] = _mm256_dpwssd_avx_epi32(sum[2 * i + 1], w1, xb);
#else
                sum[2 * i] = _mm256_add_epi32(sum[2 * i], _mm256_madd_epi16(w0, xb));
                sum[2 * i + 1] = _mm256_add_epi32(sum[2 * i + 1], _mm256_madd_epi16(w1, xb));
#endif
            }
        }
        for (int h = 0; h < 2; h++) {
            const __m256 s = _mm256_load_ps(ps + u * EM_G16_NR + 8 * h);
            const __m256 o = _mm256_load_ps(po + u * EM_G16_NR + 8 * h);
            for (int i = 0; i < mr; i++) {
                const em_block_q16 *xb = xq + i * nb + u;
                const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(sum[2 * i + h]), _mm256_set1_ps(xb->d));
                __m256 a = _mm256_fmadd_ps(t, s, _mm256_load_ps(acc[2 * i + h]));
                if (affine) a = _mm256_fmadd_ps(o, _mm256_set1_ps(xb->s), a);
                _mm256_store_ps(acc[2 * i + h], a);
            }
        }
    }
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i keep0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr), lane);
    const __m256i keep1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr - 8), lane);
    for (int i = 0; i < mr; i++) {
        _mm256_maskstore_ps(y + i * ldy, keep0, _mm256_load_ps(acc[2 * i]));
        _mm256_maskstore_ps(y + i * ldy + 8, keep1, _mm256_load_ps(acc[2 * i + 1]));
    }
}
#endif

#if defined(EM_G16_FAST)
/* Every row of x against the panel, EM_G16_MR at a time */
static inline __attribute__((always_inline)) void em_g16_rows(const int16_t *codes, const float *ps,
                                                              const float *po, const int affine, int64_t K,
                                                              const em_block_q16 *xq, int64_t nb, int64_t M,
                                                              float *y, int64_t ldy, int nr) {
    int64_t m = 0;
    for (; m + EM_G16_MR <= M; m += EM_G16_MR)
        em_g16_tile(codes, ps, po, affine, K, xq + m * nb, nb, y + m * ldy, ldy, nr, EM_G16_MR);
    for (; m < M; m++) em_g16_tile(codes, ps, po, affine, K, xq + m * nb, nb, y + m * ldy, ldy, nr, 1);
}
#endif

/* The panel against every row of x; a copy with offsets and one without, so that each unrolls */
static void em_g16_panel(const int16_t *codes, const float *ps, const float *po, int affine, int64_t K,
                         const em_block_q16 *xq, int64_t nb, int64_t M, float *y, int64_t ldy, int nr) {
#if defined(EM_G16_FAST)
    if (affine)
        em_g16_rows(codes, ps, po, 1, K, xq, nb, M, y, ldy, nr);
    else
        em_g16_rows(codes, ps, po, 0, K, xq, nb, M, y, ldy, nr);
#else
    em_g16_panel_generic(codes, ps, po, affine, K, xq, nb, M, y, ldy, nr);
#endif
}

#endif /* EMBER_GEMM16_H */
