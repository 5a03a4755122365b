/* Dot products of one weight row in GGUF blocks against quantized activations, for the types
 * with 32-element blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL), and against float32 activations
 * for F16 and BF16; and each type's rows expanded to float32 (bit-equal to gguf-py).
 *
 * Activations are quantized per 32 values as llama.cpp's q8_0/q8_1 blocks are, but to int16:
 * one float scale d = max|x| / 32767, the codes round(x / d) in -32767..32767, and s = d *
 * sum(codes) for the types with an offset (w = d_w * q + m_w gives sum w x = d_w d_x sum(q c) +
 * m_w s). int16 codes cost the same instructions as int8 ones here (vpmaddwd on sign-extended
 * weight codes instead of vpmaddubsw + vpmaddwd) and keep results within ~1e-5 of float32
 * ones: with int8 codes (2^-8 steps) SmolLM2's greedy tokens left the reference's at a step
 * whose top-2 gap was 0.22 logits, beyond the 0.2 the tests allow.
 *
 * This header is compiled once per ISA (kernels.c under each ISA's flags); the path is picked
 * by the predefined macros: AVX-512 VNNI or AVX-VNNI (vpdpwssd), AVX2 (vpmaddwd), NEON, or
 * portable C.
 * The x86 and portable paths take the same steps: the same codes (round half to even), int32
 * lanes of four products each (exact), then the same float operations in the same order with
 * no fused multiply-add, so they give the same bits. The NEON copies (neon, neondot) take codes
 * to 32639 and one fused multiply-add of a block's whole sum: bits of their own, the same in
 * both (em_neon_dot_rows says why). The AVX-512 copy alone takes float32
 * activations instead (em_dotsf_T below: fewer instructions a row there, 1.2-1.5x the int16
 * path's speed with 2 to 8 rows of x), so its 32-element products differ in the last places.
 * Several rows of x take the lane kernels instead where kernels.c has them (vnni.h on the
 * avx512 copy, rows8.h on avx2 and avxvnni from 2-5 rows: x's codes the same, their own bits). */
#ifndef EMBER_SIMPLE_H
#define EMBER_SIMPLE_H

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#if defined(EMBER_PORTABLE) /* the generic copy: plain C even where SIMD is baseline (AArch64) */
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define EM_X86 1
#include <immintrin.h>
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define EM_VNNI 1
#endif
#elif defined(__ARM_NEON) && defined(__aarch64__)
#define EM_NEON 1
#include <arm_neon.h>
#endif

#define EM_QK 32
/* how far ahead a decode step's kernels ask for a weight row's bytes (kernels.c's
 * em_kernel_prefetches says when) */
#define EM_PF_AHEAD 4096
/* A decode step reads each weight byte once: its prefetches are non-temporal (prefetchnta), so
 * the streamed weights do not push out of the caches what the step reuses (the KV cache, the
 * activations, the interpreter's code and data between native calls). On the Zen 2 EPYC,
 * `bench_generate.py --runs 3` alternated with the build asking for L1-L3 (all temporal):
 * SmolLM2 decode 124-128 -> 138 tok/s (two runs each), Gemma 3 59.1 -> 63.4, Qwen 0.5B 36.2 ->
 * 36.6 (compute-bound). kquants.h's KQ_PREFETCH asks the same way. */
#define EM_PF_WEIGHT(p) __builtin_prefetch((p), 0, 0)
#define EM_DOTS 4 /* activation rows a weight row meets per pass */

typedef struct {
    float d;  /* scale */
    float s;  /* d * sum(qs) */
    int16_t qs[EM_QK];
} em_block_q16;

static const int8_t em_kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

/* ---- half and bfloat16 ---- */

static inline float em_f16_bits(uint16_t h) {
#if defined(EM_X86)
    return _cvtsh_ss(h);
#elif defined(EM_NEON)
    __fp16 f;
    memcpy(&f, &h, 2);
    return (float)f;
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        float f = (float)man * (1.0f / 16777216.0f); /* zero or subnormal: man * 2^-24, exact */
        memcpy(&bits, &f, 4);
        bits |= sign;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

static inline float em_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return em_f16_bits(h);
}

static inline float em_bf16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* float32 to float16 and bfloat16 bits, rounding to nearest even as torch's .to() does */
static inline uint16_t em_f16_from(float f) {
#if defined(EM_X86)
    return (uint16_t)_cvtss_sh(f, 0);
#elif defined(EM_NEON)
    __fp16 h = (__fp16)f;
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
#else
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    const uint32_t ax = x & 0x7fffffff;
    if (ax > 0x7f800000) return sign | 0x7e00; /* NaN */
    if (ax >= 0x477ff000) return sign | 0x7c00; /* rounds past 65504: infinity */
    if (ax < 0x38800000) /* below 2^-14: a subnormal half (exact scaling, then rint) */
        return sign | (uint16_t)rintf(fabsf(f) * 16777216.0f);
    uint32_t h = ((ax >> 23) - 112) << 10 | ((ax & 0x7fffff) >> 13);
    const uint32_t rest = ax & 0x1fff;
    h += rest > 0x1000 || (rest == 0x1000 && (h & 1));
    return sign | (uint16_t)h;
#endif
}

static inline uint16_t em_bf16_from(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40); /* NaN stays quiet */
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* ---- activations ---- */

/* codes up to `limit` in size (32767; gemm16.h's 16383 leaves room in its int32 sums) */
#if defined(EM_X86)
/* max |x| of 32 floats, NaN skipped (maxps returns its second operand when either is NaN), as
 * the portable loop's a > amax ? a : amax */
static inline float em_absmax32(const float *x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + 8 * i)), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    return _mm_cvtss_f32(h);
}
#endif

static inline void em_quantize_row_q16_to(const float *x, em_block_q16 *y, int64_t nb, const float limit) {
    for (int64_t b = 0; b < nb; b++, x += EM_QK) {
#if defined(EM_X86)
        const float amax = em_absmax32(x);
#else
        float amax = 0.0f;
        for (int j = 0; j < EM_QK; j++) { /* fmaxf's result (NaN skipped), without its libm call */
            const float a = fabsf(x[j]);
            amax = a > amax ? a : amax;
        }
#endif
        const float d = amax / limit, id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
#if defined(EM_X86)
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        for (int i = 0; i < 4; i++) /* cvtps rounds half to even, as lrintf below */
            q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), vid));
        __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        sum = _mm_cvtsi128_si32(s4);
        /* packs works within 128-bit lanes: put the 64-bit quarters back in order */
        const __m256i p01 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[0], q[1]), 0xd8);
        const __m256i p23 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q[2], q[3]), 0xd8);
        _mm256_storeu_si256((__m256i *)y[b].qs, p01);
        _mm256_storeu_si256((__m256i *)(y[b].qs + 16), p23);
#else
        for (int j = 0; j < EM_QK; j++) {
            const int q = (int)lrintf(x[j] * id);
            y[b].qs[j] = (int16_t)q;
            sum += q;
        }
#endif
        y[b].d = d;
        y[b].s = d * (float)sum;
    }
}

#if defined(EM_NEON)
/* The NEON copies' decode codes go to 32639 (d = max|x| / 32639): two signed bytes h and l,
 * c = 256 h + l, then hold every code, and neondot multiplies them in two sdot a half block
 * (em_neon_block_sum) instead of widening the weights to int16. neon keeps int16 codes, rounded
 * the same: both copies' sums are the same integers, and their outputs the same bits. */
#define EM_Q16_DECODE_LIMIT 32639.0f
#else
#define EM_Q16_DECODE_LIMIT 32767.0f
#endif
static void em_quantize_row_q16(const float *x, em_block_q16 *y, int64_t nb) {
    em_quantize_row_q16_to(x, y, nb, EM_Q16_DECODE_LIMIT);
#if defined(EM_NEON) && defined(__ARM_FEATURE_DOTPROD)
    for (int64_t b = 0; b < nb; b++) { /* qs as bytes: h of the 32 codes, then l */
        int8x16_t h[2], l[2];
        for (int i = 0; i < 2; i++) {
            const int16x8_t c0 = vld1q_s16(y[b].qs + 16 * i), c1 = vld1q_s16(y[b].qs + 16 * i + 8);
            const int16x8_t h0 = vshrq_n_s16(vaddq_s16(c0, vdupq_n_s16(128)), 8);
            const int16x8_t h1 = vshrq_n_s16(vaddq_s16(c1, vdupq_n_s16(128)), 8);
            h[i] = vcombine_s8(vmovn_s16(h0), vmovn_s16(h1));
            l[i] = vcombine_s8(vmovn_s16(vsubq_s16(c0, vshlq_n_s16(h0, 8))),
                               vmovn_s16(vsubq_s16(c1, vshlq_n_s16(h1, 8))));
        }
        int8_t *bytes = (int8_t *)y[b].qs;
        vst1q_s8(bytes, h[0]), vst1q_s8(bytes + 16, h[1]), vst1q_s8(bytes + 32, l[0]), vst1q_s8(bytes + 48, l[1]);
    }
#endif
}

/* ---- one block's codes as 32 int8 (portable and NEON paths) ---- */

static inline void em_codes_q4_0(const uint8_t *b, int8_t *q) {
    for (int j = 0; j < 16; j++) q[j] = (int8_t)((b[2 + j] & 15) - 8), q[j + 16] = (int8_t)((b[2 + j] >> 4) - 8);
}
static inline void em_codes_q4_1(const uint8_t *b, int8_t *q) {
    for (int j = 0; j < 16; j++) q[j] = (int8_t)(b[4 + j] & 15), q[j + 16] = (int8_t)(b[4 + j] >> 4);
}
static inline void em_codes_q5(const uint8_t *qh4, const uint8_t *qs, int offset, int8_t *q) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(((qs[j] & 15) | (((qh >> j) & 1) << 4)) - offset);
        q[j + 16] = (int8_t)(((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - offset);
    }
}
static inline void em_codes_q5_0(const uint8_t *b, int8_t *q) { em_codes_q5(b + 2, b + 6, 16, q); }
static inline void em_codes_q5_1(const uint8_t *b, int8_t *q) { em_codes_q5(b + 4, b + 8, 0, q); }
static inline void em_codes_q8_0(const uint8_t *b, int8_t *q) { memcpy(q, b + 2, 32); }
static inline void em_codes_iq4_nl(const uint8_t *b, int8_t *q) {
    for (int j = 0; j < 16; j++)
        q[j] = em_kvalues_iq4nl[b[2 + j] & 15], q[j + 16] = em_kvalues_iq4nl[b[2 + j] >> 4];
}
/* the signed codes of one block of a 32-element type (2 Q4_0, 3 Q4_1, 6 Q5_0, 7 Q5_1, 8 Q8_0,
 * else IQ4_NL) */
static inline void em_codes(int type, const uint8_t *b, int8_t *q) {
    switch (type) {
    case 2: em_codes_q4_0(b, q); break;
    case 3: em_codes_q4_1(b, q); break;
    case 6: em_codes_q5_0(b, q); break;
    case 7: em_codes_q5_1(b, q); break;
    case 8: em_codes_q8_0(b, q); break;
    default: em_codes_iq4_nl(b, q); break;
    }
}

/* ---- x86: one block's codes as a vector of 32 int8 (signed, or unsigned for affine types) ---- */
#if defined(EM_X86)
static inline float em_hsum8(__m256 x) {
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

/* A block's 32 codes as int16: elements 0..15 in lo, 16..31 in hi. The 4- and 5-bit types widen
 * their bytes once and split the nibbles in int16 lanes; Q8_0 and IQ4_NL widen int8 codes. */
typedef struct {
    __m256i lo, hi;
} em_w16;

static inline em_w16 em_w16_nibbles(const uint8_t *p, short offset) {
    const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    const __m256i o = _mm256_set1_epi16(offset);
    const em_w16 r = {_mm256_sub_epi16(_mm256_and_si256(bytes, _mm256_set1_epi16(15)), o),
                      _mm256_sub_epi16(_mm256_srli_epi16(bytes, 4), o)};
    return r;
}

/* 32 int16 codes times 32 int16 activations: 8 int32 lanes, lane i holding the products of
 * elements 2i, 2i+1, 16+2i and 17+2i (exact), as floats */
static inline __m256 em_dot_w16(em_w16 w, const int16_t *y) {
    const __m256i y0 = _mm256_loadu_si256((const __m256i *)y);
    const __m256i y1 = _mm256_loadu_si256((const __m256i *)(y + 16));
#if defined(EM_VNNI)
    const __m256i sum = _mm256_dpwssd_epi32(_mm256_madd_epi16(w.lo, y0), w.hi, y1);
#elif defined(__AVXVNNI__)
    const __m256i sum = _mm256_dpwssd_avx_epi32(_mm256_madd_epi16(w.lo, y0), w.hi, y1);
#else
    const __m256i sum = _mm256_add_epi32(_mm256_madd_epi16(w.lo, y0), _mm256_madd_epi16(w.hi, y1));
#endif
    return _mm256_cvtepi32_ps(sum);
}

static inline em_w16 em_w_q4_0(const uint8_t *b) { return em_w16_nibbles(b + 2, 8); }
static inline em_w16 em_w_q4_1(const uint8_t *b) { return em_w16_nibbles(b + 4, 0); }
/* Q5_0 and Q5_1 (qh: the fifth bits, 32 of them; qs: the nibbles): the nibbles widened once as
 * the 4-bit types', each half's fifth bits tested in int16 lanes against a broadcast of its 16-bit
 * word (lane j where bit j is set): the codes of widening their int8 bytes (the fifth bits spread
 * to bytes by vpshufb), three shuffles where that took six: the Zen 3's Q5_0 decode 3.0 -> 2.3 ns
 * a block and row in the caches (docs/speed-log.md, the forty-third session). Built on
 * em_w16_nibbles (its offset, then 16 added where the bit is set) it ran 2.6: kept apart. */
static inline em_w16 em_w16_q5(const uint8_t *qh, const uint8_t *qs, int offset) {
    const __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)qs));
    const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
                                          8192, 16384, (short)-32768);
    uint16_t h0, h1;
    memcpy(&h0, qh, 2);
    memcpy(&h1, qh + 2, 2);
    const __m256i set0 = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)h0), bit), bit);
    const __m256i set1 = _mm256_cmpeq_epi16(_mm256_and_si256(_mm256_set1_epi16((short)h1), bit), bit);
    const __m256i sixteen = _mm256_set1_epi16(16), n0 = _mm256_and_si256(bytes, _mm256_set1_epi16(15));
    const __m256i n1 = _mm256_srli_epi16(bytes, 4);
    if (offset) { /* (n | 16 b) - 16: n less 16 where the bit is clear */
        const em_w16 r = {_mm256_sub_epi16(n0, _mm256_andnot_si256(set0, sixteen)),
                          _mm256_sub_epi16(n1, _mm256_andnot_si256(set1, sixteen))};
        return r;
    }
    const em_w16 r = {_mm256_or_si256(n0, _mm256_and_si256(set0, sixteen)),
                      _mm256_or_si256(n1, _mm256_and_si256(set1, sixteen))};
    return r;
}
static inline em_w16 em_w_q5_0(const uint8_t *b) { return em_w16_q5(b + 2, b + 6, 1); }
static inline em_w16 em_w_q5_1(const uint8_t *b) { return em_w16_q5(b + 4, b + 8, 0); }
static inline em_w16 em_w_q8_0(const uint8_t *b) {
    const em_w16 r = {_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 2))),
                      _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 18)))};
    return r;
}
static inline em_w16 em_w_iq4_nl(const uint8_t *b) {
    const __m128i values = _mm_loadu_si128((const __m128i *)em_kvalues_iq4nl);
    const __m128i t = _mm_loadu_si128((const __m128i *)(b + 2)), m4 = _mm_set1_epi8(15);
    const em_w16 r = {_mm256_cvtepi8_epi16(_mm_shuffle_epi8(values, _mm_and_si128(t, m4))),
                      _mm256_cvtepi8_epi16(_mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(t, 4), m4)))};
    return r;
}

/* [d_w x.d, m_w x.s, ., .]: a block's scale times the activations' and, for the affine types
 * (d and m adjacent halves), its offset times theirs; the same products as in scalar code */
static inline __m128 em_scales(const uint8_t *w, const em_block_q16 *x) {
    int32_t dm;
    memcpy(&dm, w, 4);
    const __m128 wf = _mm_cvtph_ps(_mm_cvtsi32_si128(dm));
    return _mm_mul_ps(wf, _mm_castpd_ps(_mm_load_sd((const double *)&x->d)));
}

/* One block of a weight row against one row of x: its products, times the block's scale, into
 * ACC; the scale products into OFF, whose lane 1 sums the offsets' (unused, and dropped by the
 * compiler, for the types without one). */
#define EM_DOT_BLOCK(T, w, x, ACC, OFF)                                                       \
    do {                                                                                      \
        const __m128 s_ = em_scales(w, x);                                                    \
        ACC = _mm256_add_ps(ACC, _mm256_mul_ps(_mm256_broadcastss_ps(s_), em_dot_w16(em_w_##T(w), (x)->qs))); \
        OFF = _mm_add_ps(OFF, s_);                                                            \
    } while (0)

/* Two blocks a step into two accumulators (even and odd blocks), so the adds overlap; the
 * offsets' sums build in lane 1 of two more, in block order as the portable code's. */
#define EM_DOT_X86(T, BYTES, AFFINE)                                                          \
    static inline __attribute__((always_inline)) float em_dot_pf_##T(                         \
        const uint8_t *w, const em_block_q16 *x, int64_t nb, const int PF) {                  \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                        \
        __m128 off0 = _mm_setzero_ps(), off1 = _mm_setzero_ps();                              \
        int64_t b = 0;                                                                        \
        for (; b + 1 < nb; b += 2, w += 2 * BYTES) {                                          \
            if (PF) EM_PF_WEIGHT(w + EM_PF_AHEAD);                                            \
            if (PF && 2 * BYTES > 64) EM_PF_WEIGHT(w + EM_PF_AHEAD + 64);                     \
            EM_DOT_BLOCK(T, w, x + b, acc0, off0);                                            \
            EM_DOT_BLOCK(T, w + BYTES, x + b + 1, acc1, off1);                                \
        }                                                                                     \
        if (b < nb) EM_DOT_BLOCK(T, w, x + b, acc0, off0);                                    \
        const float sum = em_hsum8(_mm256_add_ps(acc0, acc1));                                \
        if (!AFFINE) return sum;                                                              \
        return sum + (_mm_cvtss_f32(_mm_movehdup_ps(off0)) + _mm_cvtss_f32(_mm_movehdup_ps(off1))); \
    }                                                                                         \
    static float em_dot_##T(const uint8_t *w, const em_block_q16 *x, int64_t nb) {            \
        return em_dot_pf_##T(w, x, nb, 0);                                                    \
    }

/* One block of one weight row against NX rows of activations (x: the block in row 0; rows nb
 * blocks apart): the codes widened once for all rows, the block's scale times the rows' (and its
 * offset times theirs: lanes EM_DOTS.. of xs) in one multiply (em_scales' products, the same
 * bits), each row's products into its accumulator A0..A3, the offsets' into the upper lanes of
 * OFF. Named accumulators, not an array: GCC stored an array's to the stack at every block. */
#if EM_DOTS != 4
#error "EM_DOTS_BLOCK and the xs lanes are written for 4 rows of x"
#endif
#define EM_DOTS_BLOCK(T, AFFINE, w, x, xs, nb, NX, A0, A1, A2, A3, OFF)                      \
    do {                                                                                      \
        const em_w16 wv = em_w_##T(w);                                                        \
        int32_t dm;                                                                           \
        memcpy(&dm, w, 4);                                                                    \
        const __m256 wf = _mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi32_si128(dm)));        \
        const __m256 wd = AFFINE ? _mm256_permutevar8x32_ps(wf, _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0)) \
                                 : _mm256_broadcastss_ps(_mm256_castps256_ps128(wf));         \
        const __m256 s = _mm256_mul_ps(wd, _mm256_loadu_ps(xs));                              \
        float sc[2 * EM_DOTS] __attribute__((aligned(32)));                                   \
        _mm256_store_ps(sc, s); /* each row's scale broadcast from memory: a load, no shuffle */ \
        if (AFFINE) OFF = _mm256_add_ps(OFF, s);                                              \
        A0 = _mm256_add_ps(A0, _mm256_mul_ps(_mm256_broadcast_ss(sc), em_dot_w16(wv, (x)->qs))); \
        A1 = _mm256_add_ps(A1, _mm256_mul_ps(_mm256_broadcast_ss(sc + 1), em_dot_w16(wv, (x)[nb].qs))); \
        if (NX > 2) A2 = _mm256_add_ps(A2, _mm256_mul_ps(_mm256_broadcast_ss(sc + 2), em_dot_w16(wv, (x)[2 * nb].qs))); \
        if (NX > 3) A3 = _mm256_add_ps(A3, _mm256_mul_ps(_mm256_broadcast_ss(sc + 3), em_dot_w16(wv, (x)[3 * nb].qs))); \
    } while (0)

/* The dot products of one weight row with NX rows of activations (2 <= NX <= EM_DOTS, a constant
 * where inlined; xs: their blocks' scales side by side, em_prep's xs): each row sums as em_dot_T
 * does (even blocks, odd blocks, the offsets in block order), so the bits are those of NX calls
 * of it. Blocks go in pairs, each into its own accumulators: a branch on a block's parity had
 * left the offsets' sums on the stack. */
#define EM_DOTS_X86(T, BYTES, AFFINE)                                                         \
    static inline __attribute__((always_inline)) void em_dots_n_##T(                          \
        const uint8_t *w, const em_block_q16 *x, const float *xs, int64_t nb, const int NX,   \
        float *out) {                                                                         \
        __m256 e0 = _mm256_setzero_ps(), e1 = e0, e2 = e0, e3 = e0, o0 = e0, o1 = e0, o2 = e0, o3 = e0; \
        __m256 off_even = e0, off_odd = e0;                                                   \
        int64_t b = 0;                                                                        \
        for (; b + 1 < nb; b += 2) {                                                          \
            EM_DOTS_BLOCK(T, AFFINE, w + b * BYTES, x + b, xs + b * 2 * EM_DOTS, nb, NX, e0, e1, e2, e3, off_even); \
            EM_DOTS_BLOCK(T, AFFINE, w + (b + 1) * BYTES, x + b + 1, xs + (b + 1) * 2 * EM_DOTS, nb, NX, o0, o1, o2, o3, off_odd); \
        }                                                                                     \
        if (b < nb)                                                                           \
            EM_DOTS_BLOCK(T, AFFINE, w + b * BYTES, x + b, xs + b * 2 * EM_DOTS, nb, NX, e0, e1, e2, e3, off_even); \
        float oe[2 * EM_DOTS], oo[2 * EM_DOTS];                                               \
        _mm256_storeu_ps(oe, off_even);                                                       \
        _mm256_storeu_ps(oo, off_odd);                                                        \
        const __m256 sums[EM_DOTS] = {_mm256_add_ps(e0, o0), _mm256_add_ps(e1, o1), _mm256_add_ps(e2, o2), \
                                      _mm256_add_ps(e3, o3)};                                 \
        for (int m = 0; m < NX; m++) {                                                        \
            const float sum = em_hsum8(sums[m]);                                              \
            out[m] = AFFINE ? sum + (oe[EM_DOTS + m] + oo[EM_DOTS + m]) : sum;                \
        }                                                                                     \
    }                                                                                         \
    static void em_dots_##T(const uint8_t *w, const em_block_q16 *x, const float *xs, int64_t nb, \
                            int nx, int pf, float *out) {                                     \
        switch (xs ? nx : 1) {                                                                \
        case 4: em_dots_n_##T(w, x, xs, nb, 4, out); break;                                   \
        case 3: em_dots_n_##T(w, x, xs, nb, 3, out); break;                                   \
        case 2: em_dots_n_##T(w, x, xs, nb, 2, out); break;                                   \
        default:                                                                              \
            for (int m = 0; m < nx; m++)                                                      \
                out[m] = pf ? em_dot_pf_##T(w, x + m * nb, nb, 1) : em_dot_##T(w, x + m * nb, nb); \
        }                                                                                     \
    }
/* Two weight rows (w and w + stride) against one row of x, each row's steps those of em_dot_T (its
 * bits), the two rows' blocks interleaved. Decode's rows are short (SmolLM2's 576 values are 18
 * blocks), and a row alone spent ~1 ns of each block's ~2.7 on starting and ending its chains,
 * which out-of-order execution does not overlap with the next row's: two rows a pass give it
 * independent work and load each block of x once (docs/speed-log.md, the twenty-eighth session). */
#define EM_DOT2_X86(T, BYTES, AFFINE)                                                         \
    static inline __attribute__((always_inline)) void em_dot2_pf_##T(                         \
        const uint8_t *w, int64_t stride, const em_block_q16 *x, int64_t nb, const int PF, float *out) { \
        const uint8_t *v = w + stride;                                                        \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0;                           \
        __m128 ao0 = _mm_setzero_ps(), ao1 = ao0, bo0 = ao0, bo1 = ao0;                       \
        int64_t b = 0;                                                                        \
        for (; b + 1 < nb; b += 2, w += 2 * BYTES, v += 2 * BYTES) {                          \
            if (PF) EM_PF_WEIGHT(w + EM_PF_AHEAD), EM_PF_WEIGHT(v + EM_PF_AHEAD);             \
            if (PF && 2 * BYTES > 64)                                                         \
                EM_PF_WEIGHT(w + EM_PF_AHEAD + 64), EM_PF_WEIGHT(v + EM_PF_AHEAD + 64);       \
            EM_DOT_BLOCK(T, w, x + b, a0, ao0);                                               \
            EM_DOT_BLOCK(T, v, x + b, b0, bo0);                                               \
            EM_DOT_BLOCK(T, w + BYTES, x + b + 1, a1, ao1);                                   \
            EM_DOT_BLOCK(T, v + BYTES, x + b + 1, b1, bo1);                                   \
        }                                                                                     \
        if (b < nb) {                                                                         \
            EM_DOT_BLOCK(T, w, x + b, a0, ao0);                                               \
            EM_DOT_BLOCK(T, v, x + b, b0, bo0);                                               \
        }                                                                                     \
        const float sa = em_hsum8(_mm256_add_ps(a0, a1)), sb = em_hsum8(_mm256_add_ps(b0, b1)); \
        out[0] = AFFINE ? sa + (_mm_cvtss_f32(_mm_movehdup_ps(ao0)) + _mm_cvtss_f32(_mm_movehdup_ps(ao1))) : sa; \
        out[1] = AFFINE ? sb + (_mm_cvtss_f32(_mm_movehdup_ps(bo0)) + _mm_cvtss_f32(_mm_movehdup_ps(bo1))) : sb; \
    }                                                                                         \
    __attribute__((unused)) static void em_dot2_##T(const uint8_t *w, int64_t stride,          \
                                                    const em_block_q16 *x, int64_t nb, int pf, float *out) { \
        if (pf) em_dot2_pf_##T(w, stride, x, nb, 1, out);                                     \
        else em_dot2_pf_##T(w, stride, x, nb, 0, out);                                        \
    }
#define EM_DOT_SYM(T, BYTES) EM_DOT_X86(T, BYTES, 0) EM_DOTS_X86(T, BYTES, 0) EM_DOT2_X86(T, BYTES, 0)
#define EM_DOT_AFFINE(T, BYTES) EM_DOT_X86(T, BYTES, 1) EM_DOTS_X86(T, BYTES, 1) EM_DOT2_X86(T, BYTES, 1)

#else /* portable and NEON: codes to int8; the portable copy takes the x86 lanes and float steps */

/* lane[i] = the products of elements 2i, 2i+1, 16+2i and 17+2i (em_dot_i8i16's lanes) */
static inline void em_lanes8(const int8_t *q, const int16_t *y, float *lane) {
    for (int i = 0; i < 8; i++) {
        const int32_t s = (int32_t)q[2 * i] * y[2 * i] + (int32_t)q[2 * i + 1] * y[2 * i + 1] +
                          (int32_t)q[16 + 2 * i] * y[16 + 2 * i] + (int32_t)q[17 + 2 * i] * y[17 + 2 * i];
        lane[i] = (float)s;
    }
}

/* acc[i] += d * lane[i], rounded twice as _mm256_add_ps(acc, _mm256_mul_ps(d, lane)) */
static inline void em_acc8(float *acc, float d, const float *lane) {
    for (int i = 0; i < 8; i++) acc[i] = acc[i] + d * lane[i];
}

/* em_hsum8's order: the halves, then pairs */
static inline float em_hsum8s(const float *a) {
    const float r0 = a[4] + a[0], r1 = a[5] + a[1], r2 = a[6] + a[2], r3 = a[7] + a[3];
    return (r0 + r2) + (r1 + r3);
}

/* the x86 steps: even blocks into acc0, odd ones into acc1, offsets likewise */
#define EM_DOT_PORTABLE(T, BYTES, AFFINE)                                                     \
    static float em_dot_##T(const uint8_t *w, const em_block_q16 *x, int64_t nb) {            \
        float acc[2][8] = {{0}}, lane[8], off[2] = {0.0f, 0.0f}, s[8];                        \
        int8_t q[EM_QK];                                                                      \
        for (int64_t b = 0; b < nb; b++, w += BYTES) {                                        \
            em_codes_##T(w, q);                                                               \
            em_lanes8(q, x[b].qs, lane);                                                      \
            em_acc8(acc[b & 1], em_f16(w) * x[b].d, lane);                                    \
            if (AFFINE) off[b & 1] += em_f16(w + 2) * x[b].s;                                 \
        }                                                                                     \
        for (int l = 0; l < 8; l++) s[l] = acc[0][l] + acc[1][l];                             \
        const float sum = em_hsum8s(s);                                                       \
        return AFFINE ? sum + (off[0] + off[1]) : sum;                                        \
    }
#define EM_DOTS_PORTABLE(T)                                                                   \
    static void em_dots_##T(const uint8_t *w, const em_block_q16 *x, const float *xs, int64_t nb, \
                            int nx, int pf, float *out) {                                     \
        (void)xs, (void)pf; /* the portable code is compute-bound */                          \
        for (int m = 0; m < nx; m++) out[m] = em_dot_##T(w, x + m * nb, nb);                  \
    }
#if defined(EM_NEON)
/* NEON: a block's codes unpacked in registers (the portable code's went through memory, and the
 * fifth bits a bit at a time), its products summed exactly (em_neon_block_sum), one fused
 * multiply-add a block (em_neon_dot_rows). */

/* em_codes_T as two int8x16: elements 0-15 (lo) and 16-31 (hi) */
static inline void em_neon_nibbles(const uint8_t *qs, int offset, int8x16_t *lo, int8x16_t *hi) {
    const uint8x16_t v = vld1q_u8(qs);
    *lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(15))), vdupq_n_s8((int8_t)offset));
    *hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8((int8_t)offset));
}
/* The fifth bits of 8 elements from their byte v of qh: byte i of em_fifth_set[v] is 16 where
 * bit i of v is set, of em_fifth_clear[v] where it is clear (llama.cpp's table_b2b_0 and
 * table_b2b_1). Two table loads a half block where the bits had taken four vector operations
 * (a lookup, a test, two masks): cycles a block on llvm-mca's models (`neon_instructions.py
 * --mca`) for Q5_0, Cortex-A72 / Neoverse N1 / Apple M1, 19.7 / 12.6 / 8.7 -> 17.0 / 8.9 / 7.7,
 * the same bits. */
#define EM_FIFTH_BIT(v, i) ((uint64_t)(((v) >> (i)) & 1) << (8 * (i) + 4))
#define EM_FIFTH(v, flip)                                                                      \
    ((EM_FIFTH_BIT(v, 0) | EM_FIFTH_BIT(v, 1) | EM_FIFTH_BIT(v, 2) | EM_FIFTH_BIT(v, 3) |      \
      EM_FIFTH_BIT(v, 4) | EM_FIFTH_BIT(v, 5) | EM_FIFTH_BIT(v, 6) | EM_FIFTH_BIT(v, 7)) ^ (flip))
#define EM_FIFTH4(v, f) EM_FIFTH(v, f), EM_FIFTH(v + 1, f), EM_FIFTH(v + 2, f), EM_FIFTH(v + 3, f)
#define EM_FIFTH16(v, f) EM_FIFTH4(v, f), EM_FIFTH4(v + 4, f), EM_FIFTH4(v + 8, f), EM_FIFTH4(v + 12, f)
#define EM_FIFTH64(v, f) EM_FIFTH16(v, f), EM_FIFTH16(v + 16, f), EM_FIFTH16(v + 32, f), EM_FIFTH16(v + 48, f)
#define EM_FIFTH256(f) {EM_FIFTH64(0, f), EM_FIFTH64(64, f), EM_FIFTH64(128, f), EM_FIFTH64(192, f)}
static const uint64_t em_fifth_set[256] = EM_FIFTH256(0), em_fifth_clear[256] = EM_FIFTH256(0x1010101010101010ull);
/* elements 0-15 (lo) and 16-31 (hi) of a block's fifth bits (qh4: its 32), from the table */
static inline void em_neon_fifth(const uint64_t *table, const uint8_t *qh4, uint8x16_t *lo, uint8x16_t *hi) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    *lo = vreinterpretq_u8_u64(vcombine_u64(vld1_u64(table + (qh & 0xff)), vld1_u64(table + ((qh >> 8) & 0xff))));
    *hi = vreinterpretq_u8_u64(vcombine_u64(vld1_u64(table + ((qh >> 16) & 0xff)), vld1_u64(table + (qh >> 24))));
}
/* Q5_0: the nibble less 16 where the fifth bit is clear; Q5_1: the nibble with it */
static inline void em_neon_q5(const uint8_t *qh4, const uint8_t *qs, int offset, int8x16_t *lo, int8x16_t *hi) {
    uint8x16_t f0, f1;
    em_neon_fifth(offset ? em_fifth_clear : em_fifth_set, qh4, &f0, &f1);
    const uint8x16_t v = vld1q_u8(qs), l = vandq_u8(v, vdupq_n_u8(15)), h = vshrq_n_u8(v, 4);
    *lo = vreinterpretq_s8_u8(offset ? vsubq_u8(l, f0) : vorrq_u8(l, f0));
    *hi = vreinterpretq_s8_u8(offset ? vsubq_u8(h, f1) : vorrq_u8(h, f1));
}
static inline void em_nq_q4_0(const uint8_t *b, int8x16_t *lo, int8x16_t *hi) { em_neon_nibbles(b + 2, 8, lo, hi); }
static inline void em_nq_q4_1(const uint8_t *b, int8x16_t *lo, int8x16_t *hi) { em_neon_nibbles(b + 4, 0, lo, hi); }
static inline void em_nq_q5_0(const uint8_t *b, int8x16_t *lo, int8x16_t *hi) { em_neon_q5(b + 2, b + 6, 16, lo, hi); }
static inline void em_nq_q5_1(const uint8_t *b, int8x16_t *lo, int8x16_t *hi) { em_neon_q5(b + 4, b + 8, 0, lo, hi); }
static inline void em_nq_q8_0(const uint8_t *b, int8x16_t *lo, int8x16_t *hi) {
    *lo = vld1q_s8((const int8_t *)b + 2), *hi = vld1q_s8((const int8_t *)b + 18);
}
static inline void em_nq_iq4_nl(const uint8_t *b, int8x16_t *lo, int8x16_t *hi) {
    const int8x16_t values = vld1q_s8(em_kvalues_iq4nl);
    const uint8x16_t v = vld1q_u8(b + 2);
    *lo = vqtbl1q_s8(values, vandq_u8(v, vdupq_n_u8(15))), *hi = vqtbl1q_s8(values, vshrq_n_u8(v, 4));
}

/* A block's sum of products with x's codes (lo: the weight codes of elements 0-15, hi: 16-31),
 * exact, as four int32 lanes (their grouping differs between the copies; their total does not) */
static inline int32x4_t em_neon_block_sum(int8x16_t lo, int8x16_t hi, const em_block_q16 *xb) {
#if defined(__ARM_FEATURE_DOTPROD)
    const int8x16x4_t c = vld1q_s8_x4((const int8_t *)xb->qs); /* h of 0-15, 16-31, then l */
    const int32x4_t h = vdotq_s32(vdotq_s32(vdupq_n_s32(0), lo, c.val[0]), hi, c.val[1]);
    return vdotq_s32(vdotq_s32(vshlq_n_s32(h, 8), lo, c.val[2]), hi, c.val[3]);
#else
    const int16x8x4_t y = vld1q_s16_x4(xb->qs);
    const int16x8_t w0 = vmovl_s8(vget_low_s8(lo)), w1 = vmovl_high_s8(lo);
    const int16x8_t w2 = vmovl_s8(vget_low_s8(hi)), w3 = vmovl_high_s8(hi);
    int32x4_t a = vmull_s16(vget_low_s16(w0), vget_low_s16(y.val[0])), b = vmull_high_s16(w0, y.val[0]);
    a = vmlal_s16(a, vget_low_s16(w1), vget_low_s16(y.val[1])), b = vmlal_high_s16(b, w1, y.val[1]);
    a = vmlal_s16(a, vget_low_s16(w2), vget_low_s16(y.val[2])), b = vmlal_high_s16(b, w2, y.val[2]);
    a = vmlal_s16(a, vget_low_s16(w3), vget_low_s16(y.val[3])), b = vmlal_high_s16(b, w3, y.val[3]);
    return vaddq_s32(a, b);
#endif
}

typedef void (*em_neon_codes_fn)(const uint8_t *, int8x16_t *, int8x16_t *);

/* Block b into the accumulator of parity P (even blocks 0, odd 1) of each pair of a weight row
 * and a row of x: the block's whole sum as one integer, then one fused multiply-add by d_w d_x
 * (the x86 copies' eight lanes would take twice the float steps in 128-bit registers) */
#define EM_NEON_BLOCK(P)                                                                      \
    do {                                                                                      \
        for (int i = 0; i < nw; i++) {                                                        \
            const uint8_t *wi = w + i * stride;                                               \
            int8x16_t lo, hi;                                                                 \
            codes(wi, &lo, &hi);                                                              \
            const float dw = em_f16(wi);                                                      \
            for (int r = 0; r < nr; r++) {                                                    \
                const em_block_q16 *xb = x + r * nb + b;                                      \
                const int32_t sum = vaddvq_s32(em_neon_block_sum(lo, hi, xb));                \
                acc[i + r][P] = fmaf(dw * xb->d, (float)sum, acc[i + r][P]);                  \
                if (affine) off[i + r][P] += em_f16(wi + 2) * xb->s;                          \
            }                                                                                 \
        }                                                                                     \
    } while (0)

/* nw weight rows (stride bytes apart) against nr rows of x (nb blocks apart), nw * nr <= 2 (the
 * sizes, codes, the type's em_nq_T, and affine constants where inlined): two rows of x a pass
 * unpack a weight block once for both, two weight rows a pass (decode) load each block of x
 * once for both and give out-of-order cores two independent chains. Each pair's steps are those
 * it takes alone (its bits depend neither on its batch nor on the pass): even blocks into one
 * accumulator, odd ones into another. The portable copy's bits are not kept (its eight lanes
 * and unfused steps, with codes to 32767). Instructions a block, one row of 3,072 values under
 * qemu (`benchmarks/neon_instructions.py --llama-cpp`), the eight lanes' steps -> these, neon /
 * neondot: Q4_0 34 / 34 -> 29 / 22, Q4_1 37 / 37 -> 33 / 25, Q5_0 45 / 45 -> 40 / 33, Q8_0
 * 31 / 31 -> 26 / 19 (a row's share where a call takes two rows of x: 26 / 18, 30 / 20, 33 / 23,
 * 23 / 16; two weight rows: 28 / 21, 33 / 24, 39 / 32); llama.cpp's, x in int8 (q8_0, q8_1),
 * one row a call: 30 / 22, 34 / 26, 43 / 35, 27 / 19. Two weight rows a pass, in cycles a block
 * and row on llvm-mca's models (`--mca`), one row -> two, Q4_0 and Q5_0: Cortex-A72 13.0 ->
 * 12.2 and 17.0 -> 14.9, Cortex-A55 34.8 -> 30.1 and 43.7 -> 36.3, Apple M1 5.5 -> 5.2 and 7.7
 * -> 6.6, Neoverse N1 the same (7.8-7.9, 8.9). */
static inline __attribute__((always_inline)) void em_neon_dot_rows(const em_neon_codes_fn codes, const int64_t bytes,
                                                                   const int affine, const uint8_t *w,
                                                                   const int64_t stride, const int nw,
                                                                   const em_block_q16 *x, int64_t nb,
                                                                   const int nr, float *out) {
    float acc[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}}, off[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    int64_t b = 0;
    for (; b + 1 < nb; b++, w += bytes) {
        EM_NEON_BLOCK(0);
        b++, w += bytes;
        EM_NEON_BLOCK(1);
    }
    if (b < nb) EM_NEON_BLOCK(0);
    for (int r = 0; r < nw * nr; r++) {
        const float sum = acc[r][0] + acc[r][1];
        out[r] = affine ? sum + (off[r][0] + off[r][1]) : sum;
    }
}
#undef EM_NEON_BLOCK

#define EM_DOT_NEON(T, BYTES, AFFINE)                                                         \
    static float em_dot_##T(const uint8_t *w, const em_block_q16 *x, int64_t nb) {            \
        float out;                                                                            \
        em_neon_dot_rows(em_nq_##T, BYTES, AFFINE, w, 0, 1, x, nb, 1, &out);                  \
        return out;                                                                           \
    }                                                                                         \
    static void em_dots_##T(const uint8_t *w, const em_block_q16 *x, const float *xs, int64_t nb, \
                            int nx, int pf, float *out) {                                     \
        (void)xs, (void)pf; /* two rows a pass over the weight row, then one */               \
        int m = 0;                                                                            \
        for (; m + 1 < nx; m += 2) em_neon_dot_rows(em_nq_##T, BYTES, AFFINE, w, 0, 1, x + m * nb, nb, 2, out + m); \
        if (m < nx) out[m] = em_dot_##T(w, x + m * nb, nb);                                   \
    }                                                                                         \
    __attribute__((unused)) static void em_dot2_##T(const uint8_t *w, int64_t stride,          \
                                                    const em_block_q16 *x, int64_t nb, int pf, float *out) { \
        (void)pf; /* the caller asks for the rows ahead */                                    \
        em_neon_dot_rows(em_nq_##T, BYTES, AFFINE, w, stride, 2, x, nb, 1, out);              \
    }
#define EM_DOT_SYM(T, BYTES) EM_DOT_NEON(T, BYTES, 0)
#define EM_DOT_AFFINE(T, BYTES) EM_DOT_NEON(T, BYTES, 1)
#else
#define EM_DOT_SYM(T, BYTES) EM_DOT_PORTABLE(T, BYTES, 0) EM_DOTS_PORTABLE(T)
#define EM_DOT_AFFINE(T, BYTES) EM_DOT_PORTABLE(T, BYTES, 1) EM_DOTS_PORTABLE(T)
#endif
#endif

EM_DOT_SYM(q4_0, 18)
EM_DOT_AFFINE(q4_1, 20)
EM_DOT_SYM(q5_0, 22)
EM_DOT_AFFINE(q5_1, 24)
EM_DOT_SYM(q8_0, 34)
EM_DOT_SYM(iq4_nl, 18)

/* ---- AVX-512: the 32-element types against float32 activations ----
 * With 512-bit registers a block is two vectors of 16 values, and float32 activations cost fewer
 * instructions a row than int16 codes: each weight block is widened to its float32 values once
 * (d * q, or d * q + m rounded once for the affine types), then every activation row takes two
 * fused multiply-adds, one into each of its two accumulators (the block's first and last 16
 * values). No activation is quantized, so the results are closer to float32 than the int16
 * path's, but not its bits: this ISA's 32-element products differ from avx2's and generic's in
 * the last places. A row's steps do not depend on the rows beside it. */
#if defined(EM_X86) && defined(__AVX512F__) && defined(__AVX512BW__)
#define EM_FLOAT_X 1
#define EM_XROWS 8 /* rows of x a pass (4 with two weight rows) */

typedef struct {
    __m512 lo, hi; /* elements 0..15, 16..31 */
} em_wf;

/* Every half's float32 value, for the blocks' scales: broadcast from memory, a scale costs a
 * load, where widening it in registers took three vector operations (broadcast, convert: two),
 * all on the two ports Intel's cores run 512-bit operations on, beside the multiply-adds. The
 * same values as the conversion (a half's float32 value is exact). Filled on the first call
 * of this copy (em_f32x_dots_of), so only on a CPU that runs it. */
static float em_f16_values[65536];
static pthread_once_t em_f16_values_once = PTHREAD_ONCE_INIT;
static void em_f16_values_fill(void) {
    for (uint32_t h = 0; h < 65536; h++) em_f16_values[h] = em_f16_bits((uint16_t)h);
}

/* a half at p in all 16 lanes */
static inline __m512 em_f16x16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm512_set1_ps(em_f16_values[h]);
}

static inline em_wf em_wf_of(__m512i lo, __m512i hi, const uint8_t *b, int affine) {
    const __m512 d = em_f16x16(b), qlo = _mm512_cvtepi32_ps(lo), qhi = _mm512_cvtepi32_ps(hi);
    if (!affine) {
        const em_wf r = {_mm512_mul_ps(d, qlo), _mm512_mul_ps(d, qhi)};
        return r;
    }
    const __m512 m = em_f16x16(b + 2); /* d * q + m rounded once */
    const em_wf r = {_mm512_fmadd_ps(d, qlo, m), _mm512_fmadd_ps(d, qhi, m)};
    return r;
}

static inline __m512i em_bytes16(const uint8_t *p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}

/* 16 bytes of nibbles: the low ones (elements 0..15) and the high ones (16..31) */
#define EM_NIBBLES(p, lo, hi)                                                                 \
    const __m512i bytes_ = em_bytes16(p);                                                     \
    __m512i lo = _mm512_and_si512(bytes_, _mm512_set1_epi32(15)), hi = _mm512_srli_epi32(bytes_, 4)

/* A 4-bit type's 16 weight values for this block's scale (and offset), one multiply(-add),
 * then each element's picked by its nibble (vpermps reads an index's low 4 bits, so the low
 * nibble needs no mask): the values the conversion of each code gave, in fewer operations. */
static inline em_wf em_wf_table4(const uint8_t *nibbles, __m512 values) {
    const __m512i bytes = em_bytes16(nibbles);
    const em_wf r = {_mm512_permutexvar_ps(bytes, values),
                     _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), values)};
    return r;
}
static inline em_wf em_wf_q4_0(const uint8_t *b) {
    const __m512 codes = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    return em_wf_table4(b + 2, _mm512_mul_ps(em_f16x16(b), codes));
}
static inline em_wf em_wf_q4_1(const uint8_t *b) { /* d * q + m rounded once */
    const __m512 codes = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return em_wf_table4(b + 4, _mm512_fmadd_ps(em_f16x16(b), codes, em_f16x16(b + 2)));
}
/* the fifth bits (qh, bit j for element j) as 16, then the offset */
static inline em_wf em_wf_q5(const uint8_t *b, const uint8_t *qh4, const uint8_t *qs, int offset, int affine) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    EM_NIBBLES(qs, lo, hi);
    const __m512i sixteen = _mm512_set1_epi32(16), o = _mm512_set1_epi32(offset);
    lo = _mm512_mask_or_epi32(lo, (__mmask16)(qh & 0xffff), lo, sixteen);
    hi = _mm512_mask_or_epi32(hi, (__mmask16)(qh >> 16), hi, sixteen);
    return em_wf_of(_mm512_sub_epi32(lo, o), _mm512_sub_epi32(hi, o), b, affine);
}
static inline em_wf em_wf_q5_0(const uint8_t *b) { return em_wf_q5(b, b + 2, b + 6, 16, 0); }
static inline em_wf em_wf_q5_1(const uint8_t *b) { return em_wf_q5(b, b + 4, b + 8, 0, 1); }
static inline em_wf em_wf_q8_0(const uint8_t *b) {
    const __m512i lo = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)));
    const __m512i hi = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 18)));
    return em_wf_of(lo, hi, b, 0);
}
static inline em_wf em_wf_iq4_nl(const uint8_t *b) {
    const __m512 codes = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)em_kvalues_iq4nl)));
    return em_wf_table4(b + 2, _mm512_mul_ps(em_f16x16(b), codes));
}

/* The sum of v's 16 lanes, in a fixed tree: the halves, then the quarters, then lanes 0+2 and
 * 1+3, then those two. em_sum16x8 sums eight vectors in the same tree at once, so a product's
 * bits do not depend on how many rows shared its call. */
static inline float em_sum16(__m512 v) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    const __m128 p = _mm_add_ps(q, _mm_shuffle_ps(q, q, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_cvtss_f32(_mm_add_ss(p, _mm_shuffle_ps(p, p, _MM_SHUFFLE(3, 2, 0, 1))));
}

/* out[i] = em_sum16(v[i]) for i < 8, with a third of the instructions of eight calls */
static inline void em_sum16x8(const __m512 *v, float *out) {
    __m512 h[4], q[2];
    for (int i = 0; i < 4; i++) /* [v[2i] halves summed, v[2i+1] halves summed] */
        h[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 2; i++) /* 128-bit lane j: v[4i + j]'s quarters summed */
        q[i] = _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    /* lane j: v[j]'s 0+2 and 1+3, then v[4 + j]'s */
    const __m512 p = _mm512_add_ps(_mm512_shuffle_ps(q[0], q[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_ps(q[0], q[1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 r = _mm512_add_ps(p, _mm512_shuffle_ps(p, p, _MM_SHUFFLE(2, 3, 0, 1)));
    const __m512i pick = _mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm256_storeu_ps(out, _mm512_castps512_ps256(_mm512_permutexvar_ps(pick, r)));
}

/* NW weight rows (w, w + row_bytes) against NX rows of x (row m at x + m * K), NW <= 2 and
 * NX <= EM_XROWS (4 with two weight rows: 16 accumulators either way), constants in each case;
 * out[i * NX + m] = W[i] . x[m]. Each dot product
 * takes the same steps whatever NW and NX are. PF (taken for one row of each, pf): ask for the
 * row's bytes EM_PF_AHEAD ahead as the blocks go, about once a 64-byte line (decode: the rows
 * come from memory). */
#define EM_DOTF_STEPS(T, BYTES, NW, NX, PF)                                                   \
    do { /* the accumulators sized for this case alone, so they stay in registers */         \
        __m512 lo[NW * NX], hi[NW * NX];                                                      \
        for (int i = 0; i < NW * NX; i++) lo[i] = hi[i] = _mm512_setzero_ps();                \
        if (K < EM_QK) __builtin_unreachable(); /* em_dotsf_T answers K = 0 itself */         \
        for (int64_t b = 0; b < K / EM_QK; b++) {                                             \
            for (int i = 0; i < NW; i++) {                                                    \
                if (PF && b % (64 / BYTES) == 0) EM_PF_WEIGHT(w + i * row_bytes + EM_PF_AHEAD); \
                const em_wf wf = em_wf_##T(w + i * row_bytes);                                \
                for (int m = 0; m < NX; m++) {                                                \
                    const float *xb = x + m * K + b * EM_QK;                                  \
                    lo[i * NX + m] = _mm512_fmadd_ps(wf.lo, _mm512_loadu_ps(xb), lo[i * NX + m]); \
                    hi[i * NX + m] = _mm512_fmadd_ps(wf.hi, _mm512_loadu_ps(xb + 16), hi[i * NX + m]); \
                }                                                                             \
            }                                                                                 \
            w += BYTES;                                                                       \
        }                                                                                     \
        if (NW * NX == 1) {                                                                   \
            out[0] = em_sum16(_mm512_add_ps(lo[0], hi[0]));                                   \
        } else {                                                                              \
            __m512 v[8];                                                                      \
            float sums[8];                                                                    \
            for (int i = 0; i < 8; i++)                                                       \
                v[i] = i < NW * NX ? _mm512_add_ps(lo[i], hi[i]) : _mm512_setzero_ps();       \
            em_sum16x8(v, sums);                                                              \
            for (int i = 0; i < NW * NX; i++) out[i] = sums[i];                               \
        }                                                                                     \
    } while (0)
#define EM_DOTF(T, BYTES)                                                                     \
    static void em_dotsf_##T(const uint8_t *w, int64_t row_bytes, const float *x, int64_t K, int nw, \
                             int nx, int pf, float *out) {                                    \
        if (K < EM_QK) {                                                                      \
            for (int i = 0; i < nw * nx; i++) out[i] = 0.0f;                                  \
            return;                                                                           \
        }                                                                                     \
        switch (pf && nw * nx == 1 ? 0 : nw * 8 + nx) {                                       \
        case 0: EM_DOTF_STEPS(T, BYTES, 1, 1, 1); break;                                      \
        case 20: EM_DOTF_STEPS(T, BYTES, 2, 4, 0); break;                                     \
        case 19: EM_DOTF_STEPS(T, BYTES, 2, 3, 0); break;                                     \
        case 18: EM_DOTF_STEPS(T, BYTES, 2, 2, 0); break;                                     \
        case 17: EM_DOTF_STEPS(T, BYTES, 2, 1, 0); break;                                     \
        case 16: EM_DOTF_STEPS(T, BYTES, 1, 8, 0); break;                                     \
        case 15: EM_DOTF_STEPS(T, BYTES, 1, 7, 0); break;                                     \
        case 14: EM_DOTF_STEPS(T, BYTES, 1, 6, 0); break;                                     \
        case 13: EM_DOTF_STEPS(T, BYTES, 1, 5, 0); break;                                     \
        case 12: EM_DOTF_STEPS(T, BYTES, 1, 4, 0); break;                                     \
        case 11: EM_DOTF_STEPS(T, BYTES, 1, 3, 0); break;                                     \
        case 10: EM_DOTF_STEPS(T, BYTES, 1, 2, 0); break;                                     \
        default: EM_DOTF_STEPS(T, BYTES, 1, 1, 0);                                            \
        }                                                                                     \
    }
EM_DOTF(q4_0, 18)
EM_DOTF(q4_1, 20)
EM_DOTF(q5_0, 22)
EM_DOTF(q5_1, 24)
EM_DOTF(q8_0, 34)
EM_DOTF(iq4_nl, 18)
#endif

/* ---- F16 and BF16 weights against float32 activations ----
 * Every path takes the same float steps: two 8-lane accumulators over 16 values at a time
 * (multiply, then add: no fused ops), em_hsum8's order, then the tail in sequence. */

#if defined(EM_X86)
#define EM_FLOAT_DOT(NAME, LOAD8, ONE)                                                        \
    static inline __attribute__((always_inline)) float NAME##_n(const uint8_t *w, const float *x, \
                                                                int64_t k, const int PF) {    \
        int64_t i = 0;                                                                        \
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();                           \
        for (; i + 16 <= k; i += 16) {                                                        \
            if (PF && !(i & 16)) EM_PF_WEIGHT(w + 2 * i + EM_PF_AHEAD);                       \
            a0 = _mm256_add_ps(a0, _mm256_mul_ps(LOAD8(w + 2 * i), _mm256_loadu_ps(x + i)));  \
            a1 = _mm256_add_ps(a1, _mm256_mul_ps(LOAD8(w + 2 * i + 16), _mm256_loadu_ps(x + i + 8))); \
        }                                                                                     \
        float acc = em_hsum8(_mm256_add_ps(a0, a1));                                          \
        for (; i < k; i++) acc += ONE(w + 2 * i) * x[i];                                      \
        return acc;                                                                           \
    }                                                                                         \
    static float NAME(const uint8_t *w, const float *x, int64_t k) { return NAME##_n(w, x, k, 0); } \
    static float NAME##_pf(const uint8_t *w, const float *x, int64_t k) { return NAME##_n(w, x, k, 1); }
static inline __m256 em_load8_f16(const uint8_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline __m256 em_load8_bf16(const uint8_t *p) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}
EM_FLOAT_DOT(em_dot_f16, em_load8_f16, em_f16)
EM_FLOAT_DOT(em_dot_bf16, em_load8_bf16, em_bf16)
#else
#define EM_FLOAT_DOT(NAME, ONE)                                                               \
    static float NAME(const uint8_t *w, const float *x, int64_t k) {                          \
        int64_t i = 0;                                                                        \
        float a0[8] = {0}, a1[8] = {0}, s[8];                                                 \
        for (; i + 16 <= k; i += 16) {                                                        \
            float w0[8], w1[8];                                                               \
            for (int l = 0; l < 8; l++) w0[l] = ONE(w + 2 * (i + l)), w1[l] = ONE(w + 2 * (i + 8 + l)); \
            for (int l = 0; l < 8; l++) a0[l] = a0[l] + w0[l] * x[i + l];                     \
            for (int l = 0; l < 8; l++) a1[l] = a1[l] + w1[l] * x[i + 8 + l];                 \
        }                                                                                     \
        for (int l = 0; l < 8; l++) s[l] = a0[l] + a1[l];                                     \
        float acc = em_hsum8s(s);                                                             \
        for (; i < k; i++) acc += ONE(w + 2 * i) * x[i];                                      \
        return acc;                                                                           \
    }                                                                                         \
    static float NAME##_pf(const uint8_t *w, const float *x, int64_t k) { return NAME(w, x, k); }
EM_FLOAT_DOT(em_dot_f16, em_f16)
EM_FLOAT_DOT(em_dot_bf16, em_bf16)
#endif

/* ---- rows expanded to float32, as gguf-py computes them (float32 products, no fused ops) ---- */

#if defined(EM_X86)
/* 16 int16 codes to d * code (+ m): the float steps of the scalar loop below, 8 lanes at a time */
static inline void em_dequant16(__m256i codes, __m256 d, __m256 m, int affine, float *out) {
    const __m256 lo = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(codes))));
    const __m256 hi = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(codes, 1))));
    _mm256_storeu_ps(out, affine ? _mm256_add_ps(lo, m) : lo);
    _mm256_storeu_ps(out + 8, affine ? _mm256_add_ps(hi, m) : hi);
}
#endif

static void em_dequant_block(int type, const uint8_t *b, float *out) {
    const float d = em_f16(b);
#if defined(EM_X86) /* the int16 codes the dot products widen (2x the scalar loop's values a second) */
    em_w16 w;
    switch (type) {
    case 2: w = em_w_q4_0(b); break;
    case 3: w = em_w_q4_1(b); break;
    case 6: w = em_w_q5_0(b); break;
    case 7: w = em_w_q5_1(b); break;
    case 8: w = em_w_q8_0(b); break;
    default: w = em_w_iq4_nl(b); break;
    }
    const int affine = type == 3 || type == 7;
    const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(affine ? em_f16(b + 2) : 0.0f);
    em_dequant16(w.lo, dv, mv, affine, out);
    em_dequant16(w.hi, dv, mv, affine, out + 16);
#else
    int8_t q[EM_QK];
    em_codes(type, b, q);
    if (type == 3 || type == 7) {
        const float m = em_f16(b + 2);
        /* two roundings, as numpy: the build passes -ffp-contract=off, so never one fma */
        for (int j = 0; j < EM_QK; j++) out[j] = d * (float)q[j] + m;
    } else {
        for (int j = 0; j < EM_QK; j++) out[j] = d * (float)q[j];
    }
#endif
}

#endif
