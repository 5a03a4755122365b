/* gemm8.h: a prompt's product with a weight kept as its GGUF blocks, in int8 (prefill).
 *
 * y (M, N) = x (M, K) @ W^T for many rows of x (M > 16), where the float32 path expands W and
 * multiplies in float32 (gemm.py). Here x is quantized per 32 values to int8 (llama.cpp's q8_0:
 * d = max|x| / 127, q = round(x / d)), and W, 16 rows at a time (a panel), is unpacked into
 * unsigned codes with a float scale s and offset o per unit of U values (U = 32, or 16 for
 * Q6_K's sub-blocks): w = s * code + o. Every type takes this one form:
 *   Q4_0, Q5_0, Q8_0, IQ4_NL  code = q + c (c = 8, 16, 128, 128), s = d, o = -c * d
 *   Q4_1, Q5_1                code = q, s = d, o = m
 *   Q4_K, Q5_K                code = q, s = d * scale, o = -dmin * min (32-value sub-blocks)
 *   Q6_K                      code = q, s = d * scale, o = -32 * s (16-value sub-blocks)
 * A panel's codes are interleaved four at a time: group g (values 4g..4g+3) of all 16 rows is
 * one 64-byte line, lane r holding row r's four codes, so one vpdpbusd (AVX512-VNNI) multiplies
 * four codes of 16 rows by four broadcast int8 of a row of x and adds them to 16 int32 sums.
 * Per unit and row of x: sum (exact in int32), then acc = fma(sum * dx, s, acc) and
 * acc = fma(o, dx * sum(q of the unit), acc). Eight rows of x share each line of codes.
 *
 * The AVX2 code (em_g8_panel_avx2, below) reads the same lines as two halves of 8 rows. The
 * portable C (em_g8_panel_generic) does the same float operations in the same order, so every
 * path gives the same bits; the AVX512-VNNI and AVX2 ones are fast. The int8 rounding of x is
 * llama.cpp's precision: weights.py gives this path, on the avx2 and avxvnni paths, the prompts
 * of the K-type weights whose x takes one q8_K pass (int8 already); the 32-element types' gate
 * and up, which it took until 2026-12-06, left Gemma 3's chats up to 5.8% of the largest logit
 * off (precision.py), and take gemm16 now (benchmarks and tests still ask for them here).
 */
#ifndef EMBER_GEMM8_H
#define EMBER_GEMM8_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "kquants.h"
#include "simple.h"

#define EM_G8_NR 16 /* weight rows a panel: one 512-bit register of lanes */
#define EM_G8_MR 8  /* rows of x a pass over a panel's codes */

/* the unit of a type (values a scale covers), 0 for a type this path lacks */
static inline int em_g8_unit(int type) {
    switch (type) {
    case 2: case 3: case 6: case 7: case 8: case 20: /* Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 IQ4_NL */
    case KQ_TYPE_Q4_K: case KQ_TYPE_Q5_K: return 32;
    case KQ_TYPE_Q6_K: return 16;
    default: return 0;
    }
}

/* A row of x quantized: K int8 codes, then K/32 floats d, K/32 floats d * sum(q of 32 values),
 * K/16 floats d * sum(q of 16 values). */
static inline int64_t em_g8_row_bytes(int64_t K) { return K + K / 32 * 8 + K / 16 * 4; }

/* Row i of quantized x: its codes, its d per 32 values, its d * sum(q) per unit of U values. */
typedef struct {
    const int8_t *q;
    const float *d, *sums;
} em_g8_xrow;

static inline em_g8_xrow em_g8_row(const uint8_t *row, int64_t K, int U) {
    const float *d = (const float *)(row + K);
    return (em_g8_xrow){(const int8_t *)row, d, d + K / 32 + (U == 16 ? K / 32 : 0)};
}

static void em_g8_quantize_row(const float *x, uint8_t *row, int64_t K) {
    int8_t *q = (int8_t *)row;
    float *d = (float *)(row + K), *s32 = d + K / 32, *s16 = s32 + K / 32;
    for (int64_t b = 0; b < K / 32; b++) {
        const float *xb = x + 32 * b;
        int sum[2] = {0, 0};
#if defined(EM_X86) /* the same codes as the loops below: rounding half to even, NaN/inf to 0 */
        const float amax = em_absmax32(xb);
        const float db = amax / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
        const __m256 vid = _mm256_set1_ps(id), lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
        __m256i v[4];
        for (int i = 0; i < 4; i++) {
            const __m256 f = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(xb + 8 * i), vid),
                                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m256 ok = _mm256_and_ps(_mm256_cmp_ps(f, lo, _CMP_GE_OQ), _mm256_cmp_ps(f, hi, _CMP_LE_OQ));
            v[i] = _mm256_cvtps_epi32(_mm256_and_ps(f, ok));
        }
        for (int h = 0; h < 2; h++) {
            __m256i t = _mm256_add_epi32(v[2 * h], v[2 * h + 1]);
            __m128i t4 = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
            t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0x4e));
            t4 = _mm_add_epi32(t4, _mm_shuffle_epi32(t4, 0xb1));
            sum[h] = _mm_cvtsi128_si32(t4);
        }
        /* packs works within 128-bit lanes: dwords 0-3 of each 8 come out in order after the permute */
        const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
        _mm256_storeu_si256((__m256i *)(q + 32 * b),
                            _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
#else
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float a = fabsf(xb[j]);
            amax = a > amax ? a : amax;
        }
        const float db = amax / 127.0f, id = db != 0.0f ? 1.0f / db : 0.0f;
        for (int j = 0; j < 32; j++) {
            const float f = rintf(xb[j] * id); /* half to even, as llama.cpp's vector path */
            const int v = f >= -127.0f && f <= 127.0f ? (int)f : 0; /* NaN/inf in x: 0 */
            q[32 * b + j] = (int8_t)v;
            sum[j / 16] += v;
        }
#endif
        d[b] = db;
        s32[b] = db * (float)(sum[0] + sum[1]);
        s16[2 * b] = db * (float)sum[0];
        s16[2 * b + 1] = db * (float)sum[1];
    }
}

/* One weight row (K values) as unsigned codes and, per unit, s and o (see the top). */
static void em_g8_unpack_row(int type, const uint8_t *w, int64_t K, uint8_t *code, float *s,
                             float *o) {
    if (type == KQ_TYPE_Q4_K || type == KQ_TYPE_Q5_K) {
        const int bytes = type == KQ_TYPE_Q4_K ? 144 : 176, five = type == KQ_TYPE_Q5_K;
        for (int64_t i = 0; i < K / KQ_QK; i++, w += bytes, code += KQ_QK) {
            const float d = kq_f16_at(w), dmin = kq_f16_at(w + 2);
            uint8_t sm[16];
            kq_scales_k4(w + 4, sm);
            const uint8_t *qh = w + 16, *qs = w + (five ? 48 : 16);
            for (int j = 0; j < 8; j++) {
                *s++ = d * (float)sm[j];
                *o++ = -(dmin * (float)sm[8 + j]);
                const uint8_t *q = qs + (j / 2) * 32;
                const int sh = 4 * (j % 2);
                for (int l = 0; l < 32; l++)
                    code[j * 32 + l] =
                        (uint8_t)(((q[l] >> sh) & 0xf) | (five ? ((qh[l] >> j) & 1) << 4 : 0));
            }
        }
        return;
    }
    if (type == KQ_TYPE_Q6_K) {
        for (int64_t i = 0; i < K / KQ_QK; i++, w += 210, code += KQ_QK) {
            const float d = kq_f16_at(w + 208);
            const int8_t *sc = (const int8_t *)(w + 192);
            for (int u = 0; u < 16; u++) s[u] = d * (float)sc[u], o[u] = -32.0f * s[u];
            for (int n = 0; n < 2; n++) { /* llama.cpp's order: 32 lanes at a time, vectorized */
                const uint8_t *ql = w + n * 64, *qh = w + 128 + n * 32;
                uint8_t *c = code + n * 128;
                for (int l = 0; l < 32; l++) {
                    c[l] = (uint8_t)((ql[l] & 0xf) | ((qh[l] & 3) << 4));
                    c[l + 32] = (uint8_t)((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4));
                    c[l + 64] = (uint8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
                    c[l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
                }
            }
            s += 16, o += 16;
        }
        return;
    }
    int bytes, offset = 0, affine = 0;
    switch (type) {
    case 2: bytes = 18, offset = 8; break;
    case 3: bytes = 20, affine = 1; break;
    case 6: bytes = 22, offset = 16; break;
    case 7: bytes = 24, affine = 1; break;
    case 8: bytes = 34, offset = 128; break;
    default: bytes = 18, offset = 128; break; /* IQ4_NL */
    }
    int8_t q[EM_QK];
    for (int64_t b = 0; b < K / EM_QK; b++, w += bytes, code += EM_QK) {
#if defined(__AVX2__)
        if (type != 8 && type != 20) { /* their codes are the nibbles (and fifth bits) themselves */
            const int qs_at = type == 3 ? 4 : type == 6 ? 6 : type == 7 ? 8 : 2;
            const __m128i qs = _mm_loadu_si128((const __m128i *)(w + qs_at));
            __m256i c = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(qs, 4), qs), _mm256_set1_epi8(15));
            if (type == 6 || type == 7) { /* bit j of qh: the fifth bit of code j */
                uint32_t qh;
                memcpy(&qh, w + qs_at - 4, 4);
                const __m256i spread = _mm256_shuffle_epi8(
                    _mm256_set1_epi32((int)qh), _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202,
                                                                  0x0303030303030303));
                const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
                c = _mm256_or_si256(c, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                                                        _mm256_set1_epi8(16)));
            }
            _mm256_storeu_si256((__m256i *)code, c);
        } else
#endif
        {
            em_codes(type, w, q);
            for (int j = 0; j < EM_QK; j++) code[j] = (uint8_t)(q[j] + offset);
        }
        const float d = em_f16(w);
        s[b] = d;
        o[b] = affine ? em_f16(w + 2) : -(float)offset * d;
    }
}

#if defined(__AVX2__)
/* 8 registers of 8 dwords, a[i] lane j = element j of row i, transposed: a[j] lane i */
static inline void em_g8_transpose8(__m256i *a) {
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) t[i] = _mm256_unpacklo_epi32(a[i], a[i + 1]), t[i + 1] = _mm256_unpackhi_epi32(a[i], a[i + 1]);
    for (int h = 0; h < 8; h += 4)
        for (int i = 0; i < 2; i++) {
            u[h + 2 * i] = _mm256_unpacklo_epi64(t[h + i], t[h + i + 2]);
            u[h + 2 * i + 1] = _mm256_unpackhi_epi64(t[h + i], t[h + i + 2]);
        }
    /* u[i] (i < 4): elements i and i + 4 of rows 0-3 (128-bit halves); u[i + 4]: of rows 4-7 */
    for (int i = 0; i < 4; i++) {
        a[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
        a[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
    }
}
#endif

/* Rows of `bytes` bytes (nr of them at `rows`, then zeros up to a multiple of 8) interleaved a
 * dword at a time: dword d of row r to lines[d * width + r]. With AVX2, 8 rows' 8 dwords at a
 * time, transposed in registers (one 4-byte store a dword was 15-30% of a panel's products). */
static void em_g8_lines(const uint8_t *rows, int nr, int64_t bytes, int width, int32_t *lines) {
#if defined(__AVX2__)
    for (int g = 0; g < (nr + 7) / 8; g++)
        for (int64_t d = 0; d < bytes / 4; d += 8) {
            __m256i a[8];
            for (int i = 0; i < 8; i++) a[i] = _mm256_loadu_si256((const __m256i *)(rows + (8 * g + i) * bytes + 4 * d));
            em_g8_transpose8(a);
            for (int p = 0; p < 8; p++) _mm256_storeu_si256((__m256i *)(lines + (d + p) * width + 8 * g), a[p]);
        }
#else
    for (int r = 0; r < nr; r++)
        for (int64_t d = 0; d < bytes / 4; d++) memcpy(lines + d * width + r, rows + r * bytes + 4 * d, 4);
#endif
}

/* Bytes of em_g8_pack's scratch for rows of K values */
static inline size_t em_g8_pack_scratch(int64_t K) { return (size_t)(2 * (K / 16) * 4 + EM_G8_NR * K); }

/* A panel: nr <= 16 weight rows (row_bytes apart) unpacked into `codes` (K / 4 lines of 64
 * bytes) and per unit 16 scales `ps` and 16 offsets `po`; the lanes past nr are zero.
 * `scratch`: em_g8_pack_scratch(K) bytes, 4-byte aligned. */
static void em_g8_pack(int type, const uint8_t *W, int64_t row_bytes, int nr, int64_t K, uint8_t *codes, float *ps,
                       float *po, void *scratch) {
    const int64_t units = K / em_g8_unit(type);
    float *rs = (float *)scratch, *ro = rs + K / 16;
    uint8_t *rows = (uint8_t *)(ro + K / 16); /* EM_G8_NR rows of K codes */
    if (nr < EM_G8_NR) {
        memset(codes, 0, (size_t)K * EM_G8_NR);
        memset(ps, 0, (size_t)units * EM_G8_NR * sizeof(float));
        memset(po, 0, (size_t)units * EM_G8_NR * sizeof(float));
        memset(rows + nr * K, 0, (size_t)(EM_G8_NR - nr) * K);
    }
    for (int r = 0; r < nr; r++) {
        em_g8_unpack_row(type, W + r * row_bytes, K, rows + r * K, rs, ro);
        for (int64_t u = 0; u < units; u++) ps[u * EM_G8_NR + r] = rs[u], po[u * EM_G8_NR + r] = ro[u];
    }
    em_g8_lines(rows, nr, K, EM_G8_NR, (int32_t *)codes);
}

/* y[m * ldy + r] for r < nr, m < M: the panel against M rows of quantized x (xrb bytes apart). */
__attribute__((unused)) static void em_g8_panel_generic(const uint8_t *codes, const float *ps, const float *po, int U,
                                int64_t K, const uint8_t *xq, int64_t xrb, int64_t M, float *y,
                                int64_t ldy, int nr) {
    const int64_t units = K / U;
    for (int64_t m = 0; m < M; m++) {
        const em_g8_xrow x = em_g8_row(xq + m * xrb, K, U);
        float acc[EM_G8_NR] = {0};
        for (int64_t u = 0; u < units; u++) {
            const int64_t k0 = u * U;
            for (int r = 0; r < EM_G8_NR; r++) {
                int32_t sum = 0;
                for (int j = 0; j < U; j++) {
                    const int64_t k = k0 + j;
                    sum += (int32_t)codes[(k / 4) * 64 + 4 * r + k % 4] * x.q[k];
                }
                const float t = (float)sum * x.d[k0 / 32];
                acc[r] = fmaf(t, ps[u * EM_G8_NR + r], acc[r]);
                acc[r] = fmaf(po[u * EM_G8_NR + r], x.sums[u], acc[r]);
            }
        }
        for (int r = 0; r < nr; r++) y[m * ldy + r] = acc[r];
    }
}

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define EM_G8_FAST 1
/* mr (<= EM_G8_MR) rows of x against the panel; inlined with a constant mr */
static inline __attribute__((always_inline)) void em_g8_tile(
    const uint8_t *codes, const float *ps, const float *po, int U, int64_t K, const uint8_t *xq,
    int64_t xrb, float *y, int64_t ldy, __mmask16 keep, const int mr) {
    const int64_t units = K / U;
    const int G = U / 4;
    em_g8_xrow x[EM_G8_MR];
    for (int i = 0; i < mr; i++) x[i] = em_g8_row(xq + i * xrb, K, U);
    __m512 acc[EM_G8_MR];
    for (int i = 0; i < mr; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t u = 0; u < units; u++) {
        const int64_t k0 = u * U;
        const uint8_t *cw = codes + k0 * EM_G8_NR;
        __m512i sum[EM_G8_MR];
        for (int i = 0; i < mr; i++) sum[i] = _mm512_setzero_si512();
        for (int g = 0; g < G; g++) {
            const __m512i w = _mm512_load_si512((const void *)(cw + g * 64));
            for (int i = 0; i < mr; i++) {
                int32_t four;
                memcpy(&four, x[i].q + k0 + 4 * g, 4);
                sum[i] = _mm512_dpbusd_epi32(sum[i], w, _mm512_set1_epi32(four));
            }
        }
        const __m512 s = _mm512_load_ps(ps + u * EM_G8_NR), o = _mm512_load_ps(po + u * EM_G8_NR);
        for (int i = 0; i < mr; i++) {
            const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(sum[i]), _mm512_set1_ps(x[i].d[k0 / 32]));
            acc[i] = _mm512_fmadd_ps(t, s, acc[i]);
            acc[i] = _mm512_fmadd_ps(o, _mm512_set1_ps(x[i].sums[u]), acc[i]);
        }
    }
    for (int i = 0; i < mr; i++) _mm512_mask_storeu_ps(y + i * ldy, keep, acc[i]);
}

static inline __attribute__((always_inline)) void em_g8_rows(
    const uint8_t *codes, const float *ps, const float *po, const int U, int64_t K,
    const uint8_t *xq, int64_t xrb, int64_t M, float *y, int64_t ldy, __mmask16 keep) {
    int64_t m = 0;
    for (; m + EM_G8_MR <= M; m += EM_G8_MR)
        em_g8_tile(codes, ps, po, U, K, xq + m * xrb, xrb, y + m * ldy, ldy, keep, EM_G8_MR);
    for (; m < M; m++) em_g8_tile(codes, ps, po, U, K, xq + m * xrb, xrb, y + m * ldy, ldy, keep, 1);
}

/* the unit a constant in each copy, so that a unit's groups unroll */
static void em_g8_panel(const uint8_t *codes, const float *ps, const float *po, int U, int64_t K,
                        const uint8_t *xq, int64_t xrb, int64_t M, float *y, int64_t ldy, int nr) {
    const __mmask16 keep = (__mmask16)(nr >= EM_G8_NR ? 0xffff : (1u << nr) - 1);
    if (U == 32)
        em_g8_rows(codes, ps, po, 32, K, xq, xrb, M, y, ldy, keep);
    else
        em_g8_rows(codes, ps, po, 16, K, xq, xrb, M, y, ldy, keep);
}
#elif defined(__AVX2__) && defined(__FMA__)
#define EM_G8_FAST 1
/* AVX2 has no vpdpbusd: vpmaddubsw multiplies pairs of codes and x into int16 sums, several of
 * which add up in int16 before vpmaddwd widens them (exact while 2 * per * max code * 127 fits
 * int16: `per` groups of four values at a time), half a panel (8 rows) a ymm register. The
 * pair sums saturate for 8-bit codes (Q8_0, IQ4_NL): those take the portable C. AVX-VNNI (the
 * avxvnni copy) has the 256-bit vpdpbusd: one instruction for the three, exact for every code
 * width, the same int32 sums and so the same bits. */
static inline int em_g8_code_bits(int type) {
    switch (type) {
    case 2: case 3: case KQ_TYPE_Q4_K: return 4;
    case 6: case 7: case KQ_TYPE_Q5_K: return 5;
    case KQ_TYPE_Q6_K: return 6;
    default: return 8;
    }
}

/* rows of x a pass, and halves of the panel (rows 0-7, 8-15: a register each) that each
 * broadcast of x meets: with both, AVX-VNNI's passes ran 10-15% faster than a half at a time
 * (whose broadcasts' loads bound it), AVX2's (its int16 sums in twice the registers) 10% slower
 * (`benchmarks/bench_gemm8.py`, the Zen 5 EPYC) */
#if defined(__AVXVNNI__)
#define EM_G8_MR2 3
#define EM_G8_HALVES 2
#else
#define EM_G8_MR2 3
#define EM_G8_HALVES 1
#endif
#if !defined(__AVXVNNI__)
/* Three rows' sums of a unit of 32 values against half a panel (sum[0..2]), four groups summed
 * in int16 a widening, in assembly: GCC 12 reloaded a group's codes for each row and spilled
 * sums, where this keeps the 9 registers it needs. */
#define EM_G8_ROW0(G, X, P) "vpbroadcastd 4*" #G "(%[" #X "]), %[b]\n\tvpmaddubsw %[b], %[w], %[" #P "]\n\t"
#define EM_G8_ROW(G, X, P)                                                                          \
    "vpbroadcastd 4*" #G "(%[" #X "]), %[b]\n\tvpmaddubsw %[b], %[w], %[t]\n\tvpaddw %[t], %[" #P     \
    "], %[" #P "]\n\t"
#define EM_G8_GROUP0(G) "vmovdqa 64*" #G "(%[cw]), %[w]\n\t" EM_G8_ROW0(G, x0, p0) EM_G8_ROW0(G, x1, p1) EM_G8_ROW0(G, x2, p2)
#define EM_G8_GROUP(G) "vmovdqa 64*" #G "(%[cw]), %[w]\n\t" EM_G8_ROW(G, x0, p0) EM_G8_ROW(G, x1, p1) EM_G8_ROW(G, x2, p2)
#define EM_G8_WIDEN0(P, S) "vpmaddwd %[ones], %[" #P "], %[" #S "]\n\t"
#define EM_G8_WIDEN(P, S) "vpmaddwd %[ones], %[" #P "], %[t]\n\tvpaddd %[t], %[" #S "], %[" #S "]\n\t"
static inline __attribute__((always_inline)) void em_g8_unit3(const uint8_t *cw, const int8_t *x0, const int8_t *x1,
                                                              const int8_t *x2, __m256i *sum) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i s0, s1, s2, p0, p1, p2, w, b, t;
    __asm__(EM_G8_GROUP0(0) EM_G8_GROUP(1) EM_G8_GROUP(2) EM_G8_GROUP(3)
            EM_G8_WIDEN0(p0, s0) EM_G8_WIDEN0(p1, s1) EM_G8_WIDEN0(p2, s2)
            EM_G8_GROUP0(4) EM_G8_GROUP(5) EM_G8_GROUP(6) EM_G8_GROUP(7)
            EM_G8_WIDEN(p0, s0) EM_G8_WIDEN(p1, s1) EM_G8_WIDEN(p2, s2)
            : [s0] "=&x"(s0), [s1] "=&x"(s1), [s2] "=&x"(s2), [p0] "=&x"(p0), [p1] "=&x"(p1), [p2] "=&x"(p2),
              [w] "=&x"(w), [b] "=&x"(b), [t] "=&x"(t)
            : [cw] "r"(cw), [x0] "r"(x0), [x1] "r"(x1), [x2] "r"(x2), [ones] "m"(ones)
            : "memory");
    sum[0] = s0, sum[1] = s1, sum[2] = s2;
}
#undef EM_G8_ROW0
#undef EM_G8_ROW
#undef EM_G8_GROUP0
#undef EM_G8_GROUP
#undef EM_G8_WIDEN0
#undef EM_G8_WIDEN
#endif

/* mr rows of x against nh halves of the panel (codes, ps and po at the first). The unit U and
 * `per` (groups of four values whose int16 sums add up before widening: at most 8 for 4-bit
 * codes, 4 for 5-bit, 2 for 6-bit, to stay exact) are constants where inlined, so a unit's
 * groups unroll into straight code. */
static inline __attribute__((always_inline)) void em_g8_tile2(
    const uint8_t *codes, const float *ps, const float *po, const int U, const int per, int64_t K,
    const uint8_t *xq, int64_t xrb, float *y, int64_t ldy, const __m256i *keep, const int nh, const int mr) {
    const int64_t units = K / U;
    const int G = U / 4;
    const __m256i ones = _mm256_set1_epi16(1);
    em_g8_xrow x[EM_G8_MR2];
    for (int i = 0; i < mr; i++) x[i] = em_g8_row(xq + i * xrb, K, U);
    __m256 acc[EM_G8_HALVES * EM_G8_MR2];
    for (int i = 0; i < nh * mr; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t u = 0; u < units; u++) {
        const int64_t k0 = u * U;
        const uint8_t *cw = codes + k0 * EM_G8_NR;
        __m256i sum[EM_G8_HALVES * EM_G8_MR2];
#if !defined(__AVXVNNI__)
        if (U == 32 && per == 4 && nh == 1 && mr == 3) /* the same sums, in assembly */
            em_g8_unit3(cw, x[0].q + k0, x[1].q + k0, x[2].q + k0, sum);
        else
#endif
        for (int g0 = 0; g0 < G; g0 += per) {
            __m256i part[EM_G8_HALVES * EM_G8_MR2];
            for (int g = g0; g < g0 + per; g++) {
                __m256i w[EM_G8_HALVES];
                for (int h = 0; h < nh; h++) w[h] = _mm256_load_si256((const __m256i *)(cw + g * 64 + 32 * h));
                for (int i = 0; i < mr; i++) {
                    int32_t four;
                    memcpy(&four, x[i].q + k0 + 4 * g, 4);
                    const __m256i xb = _mm256_set1_epi32(four);
                    for (int h = 0; h < nh; h++) {
                        const int a = nh * i + h;
#if defined(__AVXVNNI__) /* exact in int32 for every code width: no int16 sums */
                        sum[a] = _mm256_dpbusd_avx_epi32(g ? sum[a] : _mm256_setzero_si256(), w[h], xb);
#else
                        const __m256i p = _mm256_maddubs_epi16(w[h], xb);
                        part[a] = g > g0 ? _mm256_add_epi16(part[a], p) : p;
#endif
                    }
                }
            }
#if defined(__AVXVNNI__)
            (void)part, (void)ones;
#else
            for (int a = 0; a < nh * mr; a++) {
                const __m256i wide = _mm256_madd_epi16(part[a], ones);
                sum[a] = g0 ? _mm256_add_epi32(sum[a], wide) : wide;
            }
#endif
        }
        for (int h = 0; h < nh; h++) {
            const __m256 s = _mm256_load_ps(ps + u * EM_G8_NR + 8 * h), o = _mm256_load_ps(po + u * EM_G8_NR + 8 * h);
            for (int i = 0; i < mr; i++) {
                const int a = nh * i + h;
                const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(sum[a]), _mm256_set1_ps(x[i].d[k0 / 32]));
                acc[a] = _mm256_fmadd_ps(t, s, acc[a]);
                acc[a] = _mm256_fmadd_ps(o, _mm256_set1_ps(x[i].sums[u]), acc[a]);
            }
        }
    }
    for (int i = 0; i < mr; i++)
        for (int h = 0; h < nh; h++) _mm256_maskstore_ps(y + i * ldy + 8 * h, keep[h], acc[nh * i + h]);
}

/* nh halves of the panel (from codes, ps and po) against every row of x */
static inline __attribute__((always_inline)) void em_g8_rows_avx2(
    const uint8_t *c, const float *s, const float *o, const int U, const int per, int64_t K,
    const uint8_t *xq, int64_t xrb, int64_t M, float *y, int64_t ldy, const __m256i *keep, const int nh) {
    int64_t m = 0;
    for (; m + EM_G8_MR2 <= M; m += EM_G8_MR2)
        em_g8_tile2(c, s, o, U, per, K, xq + m * xrb, xrb, y + m * ldy, ldy, keep, nh, EM_G8_MR2);
    for (; m < M; m++) em_g8_tile2(c, s, o, U, per, K, xq + m * xrb, xrb, y + m * ldy, ldy, keep, nh, 1);
}

/* U and per as em_g8_panel_of finds them; EM_G8_HALVES halves of the panel a pass. (Taking K
 * 512 values at a time, so that the panel's codes stay in L1, was slower.) */
static void em_g8_panel_avx2(const uint8_t *codes, const float *ps, const float *po, int U,
                             int per, int64_t K, const uint8_t *xq, int64_t xrb, int64_t M,
                             float *y, int64_t ldy, int nr) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i keep[2] = {_mm256_cmpgt_epi32(_mm256_set1_epi32(nr), lane),
                             _mm256_cmpgt_epi32(_mm256_set1_epi32(nr - 8), lane)};
    for (int h = 0; h < 2 && 8 * h < nr; h += EM_G8_HALVES) {
        const uint8_t *c = codes + 32 * h;
        const float *s = ps + 8 * h, *o = po + 8 * h;
        float *yh = y + 8 * h;
        if (U == 32) /* 4 groups a widening (5-bit codes' most): 4-bit ones ran 15-25% slower with all 8 */
            em_g8_rows_avx2(c, s, o, 32, 4, K, xq, xrb, M, yh, ldy, keep + h, EM_G8_HALVES);
        else if (per >= 4)
            em_g8_rows_avx2(c, s, o, 16, 4, K, xq, xrb, M, yh, ldy, keep + h, EM_G8_HALVES);
        else
            em_g8_rows_avx2(c, s, o, 16, 2, K, xq, xrb, M, yh, ldy, keep + h, EM_G8_HALVES);
    }
}

static void em_g8_panel_of(int type, const uint8_t *codes, const float *ps, const float *po, int U,
                           int64_t K, const uint8_t *xq, int64_t xrb, int64_t M, float *y,
                           int64_t ldy, int nr) {
#if defined(__AVXVNNI__)
    (void)type;
    em_g8_panel_avx2(codes, ps, po, U, U / 4, K, xq, xrb, M, y, ldy, nr);
#else
    const int bits = em_g8_code_bits(type);
    if (bits > 6) {
        em_g8_panel_generic(codes, ps, po, U, K, xq, xrb, M, y, ldy, nr);
        return;
    }
    const int per = 16383 / (127 * ((1 << bits) - 1)); /* groups a sum of int16 holds exactly */
    em_g8_panel_avx2(codes, ps, po, U, per, K, xq, xrb, M, y, ldy, nr);
#endif
}
#define EM_G8_PANEL_OF 1
#else
#define em_g8_panel em_g8_panel_generic
#endif
#if !defined(EM_G8_PANEL_OF)
#define em_g8_panel_of(type, ...) em_g8_panel(__VA_ARGS__)
#endif


#endif
