/* One query token's attention over a range of a float KV cache (decode), read in place: keys and
 * values stay in the cache's type (f32, f16 or bf16) and are converted as they are loaded, so a
 * step never copies the cache to float32.
 *
 * em_attend_heads(kv_type, q, nt, D, k, k_cs, v, v_cs, Dv, S, mask, scale, scores, out): nt
 * query heads (q: nt rows of D floats) that share one KV head (k, v: its first cell; k_cs,
 * v_cs: elements between cells); mask (S) added to the scores (-inf hides a cell) or NULL;
 * scores: EM_ATTN_SCRATCH(nt, S) floats of scratch; out: nt rows of Dv floats. Each key and
 * each value is loaded once for the nt heads. A head whose cells are all hidden gets zeros.
 * With a mask, only the cells it shows are visited (listed first): several sequences' decode
 * steps share one range of cells whose tokens interleave, and visiting every cell of it had
 * made eight sequences' attention several times the work of their own cells.
 *
 * Float32 throughout (AVX2/AVX-512 paths: FMA and a polynomial exp within 2 ulp of expf), so
 * results match torch's float32 attention to ~1e-6 relative, not bit for bit. */
#ifndef EMBER_ATTEND_H
#define EMBER_ATTEND_H

#include <math.h>
#include <stdint.h>

#include "simple.h"

enum { EM_KV_F32 = 0, EM_KV_F16 = 1, EM_KV_BF16 = 2 };
#define EM_ATTN_TILE 4 /* query heads that share one pass over the keys */
/* floats: nt rows of scores, the cell list, a bit per cell (whether a head weighs it) */
#define EM_ATTN_SCRATCH(nt, S) (((nt) + 1) * (S) + ((S) + 31) / 32 + 1)

#if defined(__GNUC__)
#define EM_INLINE static inline __attribute__((always_inline))
#else
#define EM_INLINE static inline
#endif

EM_INLINE float em_kv_at(int kv_type, const void *p, int64_t i) {
    const uint8_t *b = (const uint8_t *)p;
    switch (kv_type) {
    case EM_KV_F16: return em_f16(b + 2 * i);
    case EM_KV_BF16: return em_bf16(b + 2 * i);
    default: return ((const float *)p)[i];
    }
}

EM_INLINE const void *em_kv_row(int kv_type, const void *base, int64_t offset) {
    return (const uint8_t *)base + offset * (kv_type == EM_KV_F32 ? 4 : 2);
}

#if defined(EM_X86)
EM_INLINE __m256 em_kv_load8(int kv_type, const void *p, int64_t i) {
    const void *at = em_kv_row(kv_type, p, i);
    switch (kv_type) {
    case EM_KV_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)at));
    case EM_KV_BF16:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)at)), 16));
    default: return _mm256_loadu_ps((const float *)at);
    }
}

#if defined(__AVX512F__)
EM_INLINE __m512 em_kv_load16(int kv_type, const void *p, int64_t i) {
    const void *at = em_kv_row(kv_type, p, i);
    switch (kv_type) {
    case EM_KV_F16: return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)at));
    case EM_KV_BF16:
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)at)), 16));
    default: return _mm512_loadu_ps((const float *)at);
    }
}

/* values i..i+8 of two rows, a and b, side by side: a's in the low lanes */
EM_INLINE __m512 em_kv_load8x2(int kv_type, const void *a, const void *b, int64_t i) {
    const void *pa = em_kv_row(kv_type, a, i), *pb = em_kv_row(kv_type, b, i);
    if (kv_type == EM_KV_F32)
        return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(_mm256_loadu_ps((const float *)pa))),
                                                   _mm256_castps_pd(_mm256_loadu_ps((const float *)pb)), 1));
    const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)pa)),
                                              _mm_loadu_si128((const __m128i *)pb), 1);
    if (kv_type == EM_KV_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

/* exp(x) for x <= 0 (scores minus their maximum): 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2],
 * p of degree 6 (Cephes' expf coefficients); below -87 it underflows to 0 */
EM_INLINE __m256 em_exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.0f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(x, lo);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}
#endif

/* Cells ahead whose key a score asks for. A decode step's cache comes from memory (every layer's
 * weights pass through the caches between two of its reads): the hardware prefetcher alone left
 * the 3B shape's attention (24 heads, 8 KV heads of 128, 576 f16 cells) at ~130 us a layer cold
 * against ~62 warm (benchmarks/bench_attention.py). */
#define EM_ATTN_PREFETCH_CELLS 32

/* asks for the lines of `bytes` bytes at p (a hint: it never faults) */
EM_INLINE void em_prefetch_row(const void *p, int64_t bytes) {
    for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch((const uint8_t *)p + o);
}

#if defined(EM_X86)
/* the 8 sums of a[0..8) (a[c]'s 8 lanes each) in one register, lane c a[c]'s, each added in
 * em_hsum8's order ((x0 + x4) + (x2 + x6)) + ((x1 + x5) + (x3 + x7)): the same bits as 8 calls,
 * in 22 instructions where those took 48 */
EM_INLINE __m256 em_hsum8x8(const __m256 *a) {
    __m256 u[4], v[2];
    for (int i = 0; i < 4; i++) /* halves added: [r(a[2i]) | r(a[2i + 1])], r_k = x_k + x_k+4 */
        u[i] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x20),
                             _mm256_permute2f128_ps(a[2 * i], a[2 * i + 1], 0x31));
    for (int i = 0; i < 2; i++) /* r0 + r2, r1 + r3 of cells 4i, 4i + 2 | 4i + 1, 4i + 3 */
        v[i] = _mm256_add_ps(_mm256_shuffle_ps(u[2 * i], u[2 * i + 1], 0x44),
                             _mm256_shuffle_ps(u[2 * i], u[2 * i + 1], 0xEE));
    const __m256 w = _mm256_add_ps(_mm256_shuffle_ps(v[0], v[1], 0x88), _mm256_shuffle_ps(v[0], v[1], 0xDD));
    return _mm256_permutevar8x32_ps(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)); /* cells 0, 2, 4, 6 | 1, 3, 5, 7 */
}
#endif

/* scores of NT heads against the keys of cells cell(0..n): cell(i) = idx[i], or i without a
 * list; NT and kv_type are constants where inlined. With AVX2, 8 cells' products at a time, their
 * sums taken together (em_hsum8x8) and scaled and masked 8 at a time: the same bits as a cell
 * at a time, which had spent more on each head's sum than on its 8-16 multiply-adds (D = 64-128).
 * With AVX-512 a pass's two keys share a register (and the values' pass takes 32 lanes), each
 * lane's steps unchanged: the same bits, one multiply-add where two were (`bench_attention.py
 * --cells 1024 --threads 1`, us a layer warm / cold, alternated three times on a noisy Xeon:
 * Gemma 3 84-95 / 172-181 -> 62-76 / 153-168, SmolLM2 60-70 / 104-116 -> 54-70 / 102-112). */
EM_INLINE int64_t em_cell(const int32_t *idx, int64_t i) { return idx ? idx[i] : i; }

/* cell i's key row (cell(i)), after asking for a later cell's key and for cell i's value, which
 * the value pass reads next */
EM_INLINE const void *em_attn_key(int kv_type, const void *k, int64_t k_cs, const void *v, int64_t v_cs,
                                  int64_t D, int64_t Dv, const int32_t *idx, int64_t i, int64_t n) {
    const int64_t width = kv_type == EM_KV_F32 ? 4 : 2, s = em_cell(idx, i);
    if (i + EM_ATTN_PREFETCH_CELLS < n)
        em_prefetch_row(em_kv_row(kv_type, k, em_cell(idx, i + EM_ATTN_PREFETCH_CELLS) * k_cs), D * width);
    em_prefetch_row(em_kv_row(kv_type, v, s * v_cs), Dv * width);
    return em_kv_row(kv_type, k, s * k_cs);
}

/* r plus q . key over values d.. of D, a value at a time (the tail past D's multiple of 8) */
EM_INLINE float em_attn_tail(int kv_type, float r, const float *q, int64_t D, const void *ks, int64_t d) {
    for (; d < D; d++) r += q[d] * em_kv_at(kv_type, ks, d);
    return r;
}

EM_INLINE void em_attn_scores(int kv_type, const float *q, const int NT, int64_t D, const void *k,
                              int64_t k_cs, const void *v, int64_t v_cs, int64_t Dv, int64_t n,
                              const int32_t *idx, const float *mask, float scale, float *scores) {
    int64_t i = 0;
#if defined(EM_X86)
    const int64_t D8 = D / 8 * 8;
    __m256 part[EM_ATTN_TILE][8]; /* a group's products before their sums */
    for (; i + 8 <= n; i += 8) {
        for (int c = 0; c < 8; c += 2) { /* two cells a pass: each load of q meets two keys */
            const void *ks[2];
            for (int e = 0; e < 2; e++) ks[e] = em_attn_key(kv_type, k, k_cs, v, v_cs, D, Dv, idx, i + c + e, n);
#if defined(__AVX512F__) /* the two keys' 8 values side by side in one register: the same lanes' steps */
            __m512 acc[EM_ATTN_TILE];
            for (int j = 0; j < NT; j++) acc[j] = _mm512_setzero_ps();
            for (int64_t d = 0; d < D8; d += 8) {
                const __m512 kk = em_kv_load8x2(kv_type, ks[0], ks[1], d);
                for (int j = 0; j < NT; j++) {
                    const __m256d qj = _mm256_loadu_pd((const double *)(q + j * D + d)); /* 8 floats, both halves */
                    acc[j] = _mm512_fmadd_ps(_mm512_castpd_ps(_mm512_broadcast_f64x4(qj)), kk, acc[j]);
                }
            }
            for (int j = 0; j < NT; j++)
                part[j][c] = _mm512_castps512_ps256(acc[j]),
                part[j][c + 1] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[j]), 1));
#else
            __m256 acc[EM_ATTN_TILE][2];
            for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
            for (int64_t d = 0; d < D8; d += 8) {
                const __m256 k0 = em_kv_load8(kv_type, ks[0], d), k1 = em_kv_load8(kv_type, ks[1], d);
                for (int j = 0; j < NT; j++) {
                    const __m256 qj = _mm256_loadu_ps(q + j * D + d);
                    acc[j][0] = _mm256_fmadd_ps(qj, k0, acc[j][0]);
                    acc[j][1] = _mm256_fmadd_ps(qj, k1, acc[j][1]);
                }
            }
            for (int j = 0; j < NT; j++) part[j][c] = acc[j][0], part[j][c + 1] = acc[j][1];
#endif
        }
        __m256 m = _mm256_setzero_ps();
        if (mask) {
            float mv[8];
            for (int c = 0; c < 8; c++) mv[c] = mask[em_cell(idx, i + c)];
            m = _mm256_loadu_ps(mv);
        }
        for (int j = 0; j < NT; j++) {
            __m256 r = em_hsum8x8(part[j]);
            if (D8 < D) { /* each cell's tail after its sum, as one cell at a time adds it */
                float h[8];
                _mm256_storeu_ps(h, r);
                for (int c = 0; c < 8; c++)
                    h[c] = em_attn_tail(kv_type, h[c], q + j * D, D,
                                        em_kv_row(kv_type, k, em_cell(idx, i + c) * k_cs), D8);
                r = _mm256_loadu_ps(h);
            }
            _mm256_storeu_ps(scores + j * n + i, _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(scale), r), m));
        }
    }
#endif
    for (; i < n; i++) {
        const void *ks = em_attn_key(kv_type, k, k_cs, v, v_cs, D, Dv, idx, i, n);
        float r[EM_ATTN_TILE] = {0.0f, 0.0f, 0.0f, 0.0f};
        int64_t d = 0;
#if defined(EM_X86)
        __m256 acc[EM_ATTN_TILE];
        for (int j = 0; j < NT; j++) acc[j] = _mm256_setzero_ps();
        for (; d + 8 <= D; d += 8) {
            const __m256 kx = em_kv_load8(kv_type, ks, d);
            for (int j = 0; j < NT; j++) acc[j] = _mm256_fmadd_ps(_mm256_loadu_ps(q + j * D + d), kx, acc[j]);
        }
        for (int j = 0; j < NT; j++) r[j] = em_hsum8(acc[j]);
#endif
        for (; d < D; d++) {
            const float kx = em_kv_at(kv_type, ks, d);
            for (int j = 0; j < NT; j++) r[j] += q[j * D + d] * kx;
        }
        const float m = mask ? mask[em_cell(idx, i)] : 0.0f;
        for (int j = 0; j < NT; j++) scores[j * n + i] = scale * r[j] + m;
    }
}

/* scores[0..S) = exp(scores - max), returning their sum (0 when every score is -inf) */
static inline float em_softmax_numerators(float *scores, int64_t S) {
    float max = -INFINITY;
    int64_t s = 0;
#if defined(EM_X86) /* maxps returns its second operand for a NaN, as the loop skips one */
    __m256 vm = _mm256_set1_ps(-INFINITY);
    for (; s + 8 <= S; s += 8) vm = _mm256_max_ps(_mm256_loadu_ps(scores + s), vm);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    max = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
#endif
    for (; s < S; s++) max = scores[s] > max ? scores[s] : max;
    if (max == -INFINITY) return 0.0f;
    s = 0;
    float sum = 0.0f;
#if defined(EM_X86)
    __m256 acc = _mm256_setzero_ps();
    const __m256 vmax = _mm256_set1_ps(max);
    for (; s + 8 <= S; s += 8) {
        const __m256 e = em_exp8(_mm256_sub_ps(_mm256_loadu_ps(scores + s), vmax));
        _mm256_storeu_ps(scores + s, e);
        acc = _mm256_add_ps(acc, e);
    }
    sum = em_hsum8(acc);
#endif
    for (; s < S; s++) {
        scores[s] = expf(scores[s] - max);
        sum += scores[s];
    }
    return sum;
}

/* out[j] = sum_i p_j[i] v[cell(i)] * inv[j] for NT heads (p_j: row j of p, n floats apart):
 * each value row is loaded once for all of them, 16 lanes of every head in registers at a time.
 * Every lane sums in the order of i, with the same fused steps as one head alone. */
EM_INLINE void em_attn_values(int kv_type, const float *p, const int NT, const float *inv,
                              const void *v, int64_t v_cs, int64_t Dv, int64_t n,
                              const int32_t *idx, uint8_t *seen, float *out) {
    int64_t c = 0;
#if defined(EM_X86)
    /* bit i of seen: whether a head weighs cell i (a hidden cell's weight, or one that underflowed,
     * is 0: the cell is skipped), found once for every 16 lanes of the values */
    int64_t i0 = 0;
    for (; i0 + 8 <= n; i0 += 8) {
        __m256 any = _mm256_setzero_ps();
        for (int j = 0; j < NT; j++)
            any = _mm256_or_ps(any, _mm256_cmp_ps(_mm256_loadu_ps(p + j * n + i0), _mm256_setzero_ps(), _CMP_NEQ_UQ));
        seen[i0 / 8] = (uint8_t)_mm256_movemask_ps(any);
    }
    for (; i0 < n; i0++) {
        int any = 0;
        for (int j = 0; j < NT; j++) any |= p[j * n + i0] != 0.0f;
        if (i0 % 8 == 0) seen[i0 / 8] = 0;
        seen[i0 / 8] |= (uint8_t)(any << (i0 % 8));
    }
#if defined(__AVX512F__)
    /* 32 lanes a pass in 512-bit registers: each lane's sum takes the steps it takes below */
    for (; c + 32 <= Dv; c += 32) {
        __m512 o[EM_ATTN_TILE][2];
        for (int j = 0; j < NT; j++) o[j][0] = o[j][1] = _mm512_setzero_ps();
        for (int64_t i = 0; i < n; i++) {
            if (!((seen[i / 8] >> (i % 8)) & 1)) continue;
            const void *vs = em_kv_row(kv_type, v, em_cell(idx, i) * v_cs + c);
            const __m512 v0 = em_kv_load16(kv_type, vs, 0), v1 = em_kv_load16(kv_type, vs, 16);
            for (int j = 0; j < NT; j++) {
                const __m512 w = _mm512_set1_ps(p[j * n + i]);
                o[j][0] = _mm512_fmadd_ps(w, v0, o[j][0]);
                o[j][1] = _mm512_fmadd_ps(w, v1, o[j][1]);
            }
        }
        for (int j = 0; j < NT; j++) {
            const __m512 sc = _mm512_set1_ps(inv[j]);
            _mm512_storeu_ps(out + j * Dv + c, _mm512_mul_ps(o[j][0], sc));
            _mm512_storeu_ps(out + j * Dv + c + 16, _mm512_mul_ps(o[j][1], sc));
        }
    }
#endif
    for (; c + 16 <= Dv; c += 16) {
        __m256 o[EM_ATTN_TILE][2];
        for (int j = 0; j < NT; j++) o[j][0] = o[j][1] = _mm256_setzero_ps();
        for (int64_t i = 0; i < n; i++) {
            if (!((seen[i / 8] >> (i % 8)) & 1)) continue; /* no head weighs it */
            const void *vs = em_kv_row(kv_type, v, em_cell(idx, i) * v_cs + c);
            const __m256 v0 = em_kv_load8(kv_type, vs, 0), v1 = em_kv_load8(kv_type, vs, 8);
            for (int j = 0; j < NT; j++) { /* a zero weight adds zero: no branch */
                const __m256 w = _mm256_set1_ps(p[j * n + i]);
                o[j][0] = _mm256_fmadd_ps(w, v0, o[j][0]);
                o[j][1] = _mm256_fmadd_ps(w, v1, o[j][1]);
            }
        }
        for (int j = 0; j < NT; j++) {
            const __m256 sc = _mm256_set1_ps(inv[j]);
            _mm256_storeu_ps(out + j * Dv + c, _mm256_mul_ps(o[j][0], sc));
            _mm256_storeu_ps(out + j * Dv + c + 8, _mm256_mul_ps(o[j][1], sc));
        }
    }
#endif
    if (c == Dv) return;
    for (int j = 0; j < NT; j++) {
        float *o = out + j * Dv;
        const float *pj = p + j * n;
        for (int64_t d = c; d < Dv; d++) o[d] = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            if (pj[i] == 0.0f) continue;
            const void *vs = em_kv_row(kv_type, v, em_cell(idx, i) * v_cs);
            for (int64_t d = c; d < Dv; d++) o[d] += pj[i] * em_kv_at(kv_type, vs, d);
        }
        for (int64_t d = c; d < Dv; d++) o[d] *= inv[j];
    }
}

/* NT heads (a constant where inlined): the cells the mask shows, their scores, softmax
 * numerators, then the values. scores: EM_ATTN_SCRATCH(NT, S) floats. */
EM_INLINE void em_attend_tile(int kv_type, const float *q, const int NT, int64_t D, const void *k,
                              int64_t k_cs, const void *v, int64_t v_cs, int64_t Dv, int64_t S,
                              const float *mask, float scale, float *scores, float *out) {
    int32_t *idx = 0;
    int64_t n = S;
    if (mask) { /* the cell list after the NT rows of scores */
        idx = (int32_t *)(scores + NT * S), n = 0;
        for (int64_t s = 0; s < S; s++)
            if (mask[s] != -INFINITY) idx[n++] = (int32_t)s;
        /* a mask that hides no cell (one sequence's decode step) visits them all in order, as
         * the list would, without reading it: 15-20% of SmolLM2's attention on the Zen 2 */
        if (n == S) idx = 0;
    }
    em_attn_scores(kv_type, q, NT, D, k, k_cs, v, v_cs, Dv, n, idx, mask, scale, scores);
    float inv[EM_ATTN_TILE];
    for (int j = 0; j < NT; j++) {
        float *p = scores + j * n;
        const float total = em_softmax_numerators(p, n);
        inv[j] = total == 0.0f ? 0.0f : 1.0f / total;
        if (total == 0.0f) /* every score -inf: zeros */
            for (int64_t i = 0; i < n; i++) p[i] = 0.0f;
    }
    em_attn_values(kv_type, scores, NT, inv, v, v_cs, Dv, n, idx, (uint8_t *)(scores + (NT + 1) * S), out);
}

EM_INLINE void em_attend_typed(int kv_type, const float *q, int nt, int64_t D, const void *k,
                               int64_t k_cs, const void *v, int64_t v_cs, int64_t Dv, int64_t S,
                               const float *mask, float scale, float *scores, float *out) {
    switch (nt) { /* constant tile sizes: the accumulators stay in registers */
    case 4: em_attend_tile(kv_type, q, 4, D, k, k_cs, v, v_cs, Dv, S, mask, scale, scores, out); break;
    case 3: em_attend_tile(kv_type, q, 3, D, k, k_cs, v, v_cs, Dv, S, mask, scale, scores, out); break;
    case 2: em_attend_tile(kv_type, q, 2, D, k, k_cs, v, v_cs, Dv, S, mask, scale, scores, out); break;
    default: em_attend_tile(kv_type, q, 1, D, k, k_cs, v, v_cs, Dv, S, mask, scale, scores, out); break;
    }
}

static void em_attend_heads(int kv_type, const float *q, int nt, int64_t D, const void *k, int64_t k_cs,
                            const void *v, int64_t v_cs, int64_t Dv, int64_t S, const float *mask,
                            float scale, float *scores, float *out) {
    switch (kv_type) { /* a constant type: its loads inline without a branch */
    case EM_KV_F16: em_attend_typed(EM_KV_F16, q, nt, D, k, k_cs, v, v_cs, Dv, S, mask, scale, scores, out); break;
    case EM_KV_BF16: em_attend_typed(EM_KV_BF16, q, nt, D, k, k_cs, v, v_cs, Dv, S, mask, scale, scores, out); break;
    default: em_attend_typed(EM_KV_F32, q, nt, D, k, k_cs, v, v_cs, Dv, S, mask, scale, scores, out); break;
    }
}

#endif
