/* prompt_attend.h: one sequence's prompt attention under a plain causal mask, in one pass over
 * its keys: blocks of EM_PA_KB keys, each met by a tile of EM_PA_RT query rows (one query head,
 * consecutive tokens), with a running maximum and sum per row (flash attention's order), so no
 * row of scores is ever stored whole and nothing but the tile's weights leaves the registers.
 *
 * em_pa_head(q, qs, T, D, kt, Sp, v, Dv, first, window, scale, o, p, out, os, tile): the rows of
 * query tile `tile` (tokens EM_PA_RT * tile and on, T in all; q rows qs floats apart, D each)
 * against one KV head: kt its keys transposed (D rows of Sp >= S floats, see em_pa_transpose8),
 * v its values (S rows of Dv floats); token t sees cells 0..first + t, or with a sliding window
 * (window > 0) the last `window` of them, first + t - window + 1..first + t (cells in order of
 * position), and a tile meets only the blocks of keys some row of it sees; o (EM_PA_RT * Dv
 * floats) and p (EM_PA_RT * EM_PA_KB) are scratch; out rows os floats apart.
 *
 * Float32 throughout, with attend.h's exp (within 2 ulp of expf): results match torch's float32
 * attention to ~1e-6 relative, not bit for bit. */
#ifndef EMBER_PROMPT_ATTEND_H
#define EMBER_PROMPT_ATTEND_H

#include <math.h>
#include <stdint.h>

#include "attend.h"

#if defined(__AVX512F__)
#define EM_PA_KB 32 /* keys a block: two registers of scores a row */
#define EM_PA_RT 8  /* query rows a tile: 16 of AVX-512's 32 registers hold their scores */
#else
#define EM_PA_KB 16
/* 12 of AVX2's 16: with 4 rows (8) each accumulator's chain of multiply-adds waited on the last
 * one's latency; 6 ran 7-15% faster (`bench_prompt_attention.py`, avx2, the Zen 5 EPYC; 12 rows
 * on AVX-512 were slower than its 8) */
#define EM_PA_RT 6
#endif

#if defined(EM_X86) && defined(__AVX512F__)
/* attend.h's em_exp8 on 16 lanes */
EM_INLINE __m512 em_exp16(__m512 x) {
    const __m512 lo = _mm512_set1_ps(-87.0f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(x, lo);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps((__mmask16)~under, _mm512_mul_ps(p, _mm512_castsi512_ps(e)));
}
#endif

/* Cells s0..s0 + 7 of kt (D, Sp) = k (S, D) transposed, cells S..Sp zero: 8 cells at a time
 * (the threads share them), so that each pass over the D columns reads 8 rows */
static void em_pa_transpose8(const float *k, int64_t S, int64_t D, int64_t Sp, float *kt, int64_t s0) {
    const int64_t n = S - s0 < 8 ? (S - s0 > 0 ? S - s0 : 0) : 8;
    for (int64_t d = 0; d < D; d++) {
        float *row = kt + d * Sp + s0;
        for (int64_t i = 0; i < n; i++) row[i] = k[(s0 + i) * D + d];
        for (int64_t i = n; i < 8; i++) row[i] = 0.0f;
    }
}

/* What a row's sums so far are scaled by when its running maximum m becomes mnew: 0 at the
 * first block the row sees (m = -inf), and 1 exactly, without expf, where m holds */
static inline float em_pa_rescale(float m, float mnew) { return mnew == m ? 1.0f : expf(m - mnew); }

static void em_pa_head(const float *q, int64_t qs, int64_t T, int64_t D, const float *kt, int64_t Sp,
                       const float *v, int64_t Dv, int64_t first, int64_t window, float scale, float *o,
                       float *p, float *out, int64_t os, int64_t tile) {
    const int64_t t0 = tile * EM_PA_RT;
    const int nr = T - t0 < EM_PA_RT ? (int)(T - t0) : EM_PA_RT;
    const float *qr[EM_PA_RT]; /* rows past nr repeat the last: computed, never stored */
    for (int r = 0; r < EM_PA_RT; r++) qr[r] = q + (t0 + (r < nr ? r : nr - 1)) * qs;
    const int64_t lim0 = first + t0, last = lim0 + nr - 1; /* row r sees cells 0..lim0 + r */
    float m[EM_PA_RT], l[EM_PA_RT], corr[EM_PA_RT];
    for (int r = 0; r < EM_PA_RT; r++) m[r] = -INFINITY, l[r] = 0.0f;
    for (int64_t i = 0; i < EM_PA_RT * Dv; i++) o[i] = 0.0f;
    /* row r sees cells from low0 + r with a window (0 without), every row of the tile from high */
    const int64_t low0 = window > 0 ? lim0 - window + 1 : 0, high = low0 + EM_PA_RT - 1;
    for (int64_t j0 = low0 > 0 ? low0 / EM_PA_KB * EM_PA_KB : 0; j0 <= last; j0 += EM_PA_KB) {
        /* every row sees every cell of the block */
        const int whole = j0 + EM_PA_KB - 1 <= lim0 && (window <= 0 || j0 >= high);
#if defined(EM_X86) && defined(__AVX512F__)
        __m512 acc[EM_PA_RT][2];
        for (int r = 0; r < EM_PA_RT; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
        for (int64_t d = 0; d < D; d++) {
            const float *kd = kt + d * Sp + j0;
            const __m512 k0 = _mm512_loadu_ps(kd), k1 = _mm512_loadu_ps(kd + 16);
            for (int r = 0; r < EM_PA_RT; r++) {
                const __m512 b = _mm512_set1_ps(qr[r][d]);
                acc[r][0] = _mm512_fmadd_ps(b, k0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(b, k1, acc[r][1]);
            }
        }
        const __m512 vs = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
        const __m512 lane = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        for (int r = 0; r < EM_PA_RT; r++) {
            __m512 s0 = _mm512_mul_ps(acc[r][0], vs), s1 = _mm512_mul_ps(acc[r][1], vs);
            if (!whole) { /* -inf past the row's own cell, and before its window */
                const __m512 lim = _mm512_set1_ps((float)(lim0 + r - j0)), low = _mm512_set1_ps((float)(low0 + r - j0));
                const __m512 lane1 = _mm512_add_ps(lane, _mm512_set1_ps(16.0f));
                s0 = _mm512_mask_mov_ps(s0, _mm512_cmp_ps_mask(lane, lim, _CMP_GT_OQ), ninf);
                s1 = _mm512_mask_mov_ps(s1, _mm512_cmp_ps_mask(lane1, lim, _CMP_GT_OQ), ninf);
                if (window > 0) {
                    s0 = _mm512_mask_mov_ps(s0, _mm512_cmp_ps_mask(lane, low, _CMP_LT_OQ), ninf);
                    s1 = _mm512_mask_mov_ps(s1, _mm512_cmp_ps_mask(lane1, low, _CMP_LT_OQ), ninf);
                }
            }
            const float bmax = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
            float *pr = p + r * EM_PA_KB;
            if (bmax == -INFINITY) { /* a row whose cells all come later (or before its window) */
                _mm512_storeu_ps(pr, _mm512_setzero_ps()), _mm512_storeu_ps(pr + 16, _mm512_setzero_ps());
                corr[r] = 1.0f;
                continue;
            }
            const float mnew = bmax > m[r] ? bmax : m[r];
            corr[r] = em_pa_rescale(m[r], mnew);
            const __m512 mv = _mm512_set1_ps(mnew);
            const __m512 e0 = em_exp16(_mm512_sub_ps(s0, mv)), e1 = em_exp16(_mm512_sub_ps(s1, mv));
            _mm512_storeu_ps(pr, e0), _mm512_storeu_ps(pr + 16, e1);
            l[r] = l[r] * corr[r] + _mm512_reduce_add_ps(_mm512_add_ps(e0, e1));
            m[r] = mnew;
        }
#elif defined(EM_X86)
        __m256 acc[EM_PA_RT][2];
        for (int r = 0; r < EM_PA_RT; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (int64_t d = 0; d < D; d++) {
            const float *kd = kt + d * Sp + j0;
            const __m256 k0 = _mm256_loadu_ps(kd), k1 = _mm256_loadu_ps(kd + 8);
            for (int r = 0; r < EM_PA_RT; r++) {
                const __m256 b = _mm256_set1_ps(qr[r][d]);
                acc[r][0] = _mm256_fmadd_ps(b, k0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(b, k1, acc[r][1]);
            }
        }
        const __m256 vs = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
        const __m256 lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
        for (int r = 0; r < EM_PA_RT; r++) {
            __m256 s0 = _mm256_mul_ps(acc[r][0], vs), s1 = _mm256_mul_ps(acc[r][1], vs);
            if (!whole) { /* -inf past the row's own cell, and before its window */
                const __m256 lim = _mm256_set1_ps((float)(lim0 + r - j0)), low = _mm256_set1_ps((float)(low0 + r - j0));
                const __m256 lane1 = _mm256_add_ps(lane, _mm256_set1_ps(8.0f));
                s0 = _mm256_blendv_ps(s0, ninf, _mm256_cmp_ps(lane, lim, _CMP_GT_OQ));
                s1 = _mm256_blendv_ps(s1, ninf, _mm256_cmp_ps(lane1, lim, _CMP_GT_OQ));
                if (window > 0) {
                    s0 = _mm256_blendv_ps(s0, ninf, _mm256_cmp_ps(lane, low, _CMP_LT_OQ));
                    s1 = _mm256_blendv_ps(s1, ninf, _mm256_cmp_ps(lane1, low, _CMP_LT_OQ));
                }
            }
            __m256 mx = _mm256_max_ps(s0, s1);
            mx = _mm256_max_ps(mx, _mm256_permute2f128_ps(mx, mx, 1));
            mx = _mm256_max_ps(mx, _mm256_shuffle_ps(mx, mx, 0x4e));
            mx = _mm256_max_ps(mx, _mm256_shuffle_ps(mx, mx, 0xb1));
            const float bmax = _mm256_cvtss_f32(mx);
            float *pr = p + r * EM_PA_KB;
            if (bmax == -INFINITY) { /* a row whose cells all come later (or before its window) */
                _mm256_storeu_ps(pr, _mm256_setzero_ps()), _mm256_storeu_ps(pr + 8, _mm256_setzero_ps());
                corr[r] = 1.0f;
                continue;
            }
            const float mnew = bmax > m[r] ? bmax : m[r];
            corr[r] = em_pa_rescale(m[r], mnew);
            const __m256 mv = _mm256_set1_ps(mnew);
            const __m256 e0 = em_exp8(_mm256_sub_ps(s0, mv)), e1 = em_exp8(_mm256_sub_ps(s1, mv));
            _mm256_storeu_ps(pr, e0), _mm256_storeu_ps(pr + 8, e1);
            l[r] = l[r] * corr[r] + em_hsum8(_mm256_add_ps(e0, e1));
            m[r] = mnew;
        }
#else
        float s[EM_PA_RT][EM_PA_KB];
        for (int r = 0; r < EM_PA_RT; r++)
            for (int j = 0; j < EM_PA_KB; j++) s[r][j] = 0.0f;
        for (int64_t d = 0; d < D; d++)
            for (int r = 0; r < EM_PA_RT; r++)
                for (int j = 0; j < EM_PA_KB; j++) s[r][j] += qr[r][d] * kt[d * Sp + j0 + j];
        for (int r = 0; r < EM_PA_RT; r++) {
            float bmax = -INFINITY;
            for (int j = 0; j < EM_PA_KB; j++) {
                const int seen = j0 + j <= lim0 + r && (window <= 0 || j0 + j >= low0 + r);
                s[r][j] = whole || seen ? s[r][j] * scale : -INFINITY;
                bmax = s[r][j] > bmax ? s[r][j] : bmax;
            }
            float *pr = p + r * EM_PA_KB;
            if (bmax == -INFINITY) {
                for (int j = 0; j < EM_PA_KB; j++) pr[j] = 0.0f;
                corr[r] = 1.0f;
                continue;
            }
            const float mnew = bmax > m[r] ? bmax : m[r];
            corr[r] = em_pa_rescale(m[r], mnew);
            float sum = 0.0f;
            for (int j = 0; j < EM_PA_KB; j++) sum += pr[j] = expf(s[r][j] - mnew);
            l[r] = l[r] * corr[r] + sum;
            m[r] = mnew;
        }
#endif
        /* o = o * corr + p v over the block's cells (none past `last`, the last row's own) */
        const int64_t nk = last - j0 + 1 < EM_PA_KB ? last - j0 + 1 : EM_PA_KB;
        const float *vb = v + j0 * Dv;
        int64_t c = 0;
#if defined(EM_X86) && defined(__AVX512F__)
        for (; c + 32 <= Dv; c += 32) {
            __m512 a[EM_PA_RT][2];
            for (int r = 0; r < EM_PA_RT; r++) {
                const __m512 f = _mm512_set1_ps(corr[r]);
                a[r][0] = _mm512_mul_ps(_mm512_loadu_ps(o + r * Dv + c), f);
                a[r][1] = _mm512_mul_ps(_mm512_loadu_ps(o + r * Dv + c + 16), f);
            }
            for (int64_t j = 0; j < nk; j++) {
                const __m512 v0 = _mm512_loadu_ps(vb + j * Dv + c), v1 = _mm512_loadu_ps(vb + j * Dv + c + 16);
                for (int r = 0; r < EM_PA_RT; r++) {
                    const __m512 w = _mm512_set1_ps(p[r * EM_PA_KB + j]);
                    a[r][0] = _mm512_fmadd_ps(w, v0, a[r][0]);
                    a[r][1] = _mm512_fmadd_ps(w, v1, a[r][1]);
                }
            }
            for (int r = 0; r < EM_PA_RT; r++) {
                _mm512_storeu_ps(o + r * Dv + c, a[r][0]);
                _mm512_storeu_ps(o + r * Dv + c + 16, a[r][1]);
            }
        }
#endif
#if defined(EM_X86)
        for (; c + 16 <= Dv; c += 16) {
            __m256 a[EM_PA_RT][2];
            for (int r = 0; r < EM_PA_RT; r++) {
                const __m256 f = _mm256_set1_ps(corr[r]);
                a[r][0] = _mm256_mul_ps(_mm256_loadu_ps(o + r * Dv + c), f);
                a[r][1] = _mm256_mul_ps(_mm256_loadu_ps(o + r * Dv + c + 8), f);
            }
            for (int64_t j = 0; j < nk; j++) {
                const __m256 v0 = _mm256_loadu_ps(vb + j * Dv + c), v1 = _mm256_loadu_ps(vb + j * Dv + c + 8);
                for (int r = 0; r < EM_PA_RT; r++) {
                    const __m256 w = _mm256_set1_ps(p[r * EM_PA_KB + j]);
                    a[r][0] = _mm256_fmadd_ps(w, v0, a[r][0]);
                    a[r][1] = _mm256_fmadd_ps(w, v1, a[r][1]);
                }
            }
            for (int r = 0; r < EM_PA_RT; r++) {
                _mm256_storeu_ps(o + r * Dv + c, a[r][0]);
                _mm256_storeu_ps(o + r * Dv + c + 8, a[r][1]);
            }
        }
#endif
        for (; c < Dv; c++)
            for (int r = 0; r < EM_PA_RT; r++) {
                float a = o[r * Dv + c] * corr[r];
                for (int64_t j = 0; j < nk; j++) a += p[r * EM_PA_KB + j] * vb[j * Dv + c];
                o[r * Dv + c] = a;
            }
    }
    for (int r = 0; r < nr; r++) { /* every row sees its own cell: l > 0 */
        const float inv = 1.0f / l[r];
        for (int64_t c = 0; c < Dv; c++) out[(t0 + r) * os + c] = o[r * Dv + c] * inv;
    }
}

#endif
