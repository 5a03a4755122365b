/* The 32-element types Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0, and the K-quant mixes' Q4_K, Q5_K and
 * Q6_K, against 1-16 rows of x (Q8_0: 2-16, Q6_K: 3-16) with AVX512-VNNI, 16 weight rows a
 * register: the avx512 copy of kernels.c takes these here, and the amx copy where its tiles do
 * not (fewer than 8 rows, Q6_K).
 *
 * A register's 16 lanes are a chunk's 16 weight rows, each lane 4 codes of its row: a block's 32
 * codes are 8 such registers, built from the 16 rows' bytes (loaded side by side and transposed in
 * registers, em_v16_load32, as rows8.h does on 8 rows) and unpacked once for every row of x. x is
 * quantized as the int16 path quantizes it (simple.h: per 32 values d = max|x| / 32767, codes c, s
 * = d * sum c), each code split into a signed high byte and an unsigned low one (c = 256 hi + lo).
 * One vpdpbusd multiplies 4 codes of 16 weight rows by 4 of x's high (or low) bytes, broadcast: 16
 * give a block's sum q hi and sum q lo of 16 weight rows exactly in int32, so 256 hi + lo is the
 * int16 path's sum q c (Q8_0's signed codes as q + 128 against the high bytes, then less 128 sum
 * hi; Q6_K's as q, then less 32 sum c; Q4_0's and Q5_0's less 8 and 16 sum c, their offsets).
 * Then, in float32, one chain a weight row and row of x: y += (d_w d_x) * sum, then y += m_w * s
 * where w = d_w q + m_w has an offset (Q4_1, Q5_1: the file's m; the K types' -dmin m): the same
 * steps as amx.h's tiles take, so the same bits. The K types' sub-blocks are blocks (Q4_K's and
 * Q5_K's 32 values, each with its scale d sc and offset; Q6_K's 16, two to a block, each with its
 * scale); their two q8_K passes do not apply here: int16 codes per 32 values are at least as
 * close. A one-pass K-type weight takes x as its one-row kernel does, q8_K's int8 codes (x8:
 * kernels.c's em_lanes_x8, in the avx512 copy; not the amx copy's, whose tiles take int16 codes),
 * held in hi: one vpdpbusd a register instead of two, the same float steps, and rows8.h's bits for
 * them (`bench_simple_types.py --k 2048 --mib 200 --rows 2 4 8 16 --passes 1 --lanes-x8 0|1
 * --types Q4_K Q5_K --runs 8`, the Zen 5, 2 threads, ns a block and row: Q4_K 0.35 -> 0.32 at 2
 * rows, 0.15 -> 0.12 at 8, 0.11 -> 0.08 at 16; Q5_K 0.42 -> 0.38, 0.17 -> 0.13, 0.12 -> 0.09).
 *
 * Until 2026-11-29 each register was one gather from the 16 rows, which AMD's CPUs run slowly; the
 * loads and transposes made the Zen 5's products from memory 1.3-1.9x as fast
 * (`bench_simple_types.py --k 640 --mib 100 --rows 1 2 4 8 16 --threads 2`, the build before
 * against this one, ns a block and row: Q4_0 2 rows 0.38 -> 0.26, 8 0.16 -> 0.12; Q5_0 0.47 ->
 * 0.29, 0.18 -> 0.13; Q8_0 0.58 -> 0.31, 0.22 -> 0.14; with `--k 3072 --mib 200 --passes 1 --types
 * Q4_K Q6_K`, 8 rows: Q4_K 0.12 -> 0.07, Q6_K 0.16 -> 0.10), and so one row of every type but Q8_0
 * and Q6_K takes them there too (em_vnni_least_rows).
 *
 * A row's steps do not depend on the rows beside it, so its bits are the same in any batch of
 * 1-16 (Q8_0: 2-16, Q6_K: 3-16). The float32 path it replaced widened each weight block to
 * floats, then took two fused multiply-adds a block and row of x: `bench_simple_types.py --k
 * 640 --mib 200 --threads 2 --rows 1 2 4 --isa avx512` against the build before (README and
 * docs/speed-log.md have the figures). */
#ifndef EMBER_VNNI_H
#define EMBER_VNNI_H

/* The fewest rows of x this kernel takes for `type`. One row of Q8_0 keeps its float32 path,
 * which reads it from memory as fast (the Xeon: 1.30 against 1.55-1.64 ns a block, 200 MiB of
 * rows of 640 and 2,048; the Zen 5: 0.56-0.58 against 0.57, K = 640), and one or two of Q6_K its
 * q8_K kernel (the Xeon: 0.67-0.71 and 0.50 ns a block and row against 0.86-0.92 and 0.54, K =
 * 2,048; the Zen 5: 0.55 and 0.27 against 0.62 and 0.31, K = 3,072): Q6_K's unpacking is the
 * step there. Every other type takes it from one row, on the Zen 5 since its gathers gave way
 * to loads (em_v16_load16): one row of Q4_0 0.43-0.46 ns against simple.h's 0.48, Q4_1 0.41-0.42
 * against 0.54-0.55, Q5_0 0.53 against 0.78, Q5_1 0.43 against 0.75 (`bench_simple_types.py --k
 * 640 --mib 100 --rows 1 --threads 2`, 2026-11-29). */
static int64_t em_vnni_least_rows(int type) { return type == EM_Q8_0 ? 2 : type == KQ_TYPE_Q6_K ? 3 : 1; }

/* A row's prepared block: x's high bytes, low bytes, d, s, and the integer sums some types'
 * codes need: 32768 sum hi (Q8_0), sum c of the first 16 values and of all 32 (Q6_K) */
typedef struct {
    int8_t hi[32];
    uint8_t lo[32];
    float d, s;
    int32_t hi_sum, c_half, c_sum;
} em_vnni_block;

/* A block of 32 values of x as simple.h's em_quantize_row_q16 quantizes it: d, the codes as
 * int16 (one register), the sum of the first 16 codes and of all 32 (amx.h lays out the same) */
typedef struct {
    __m512i c;
    float d;
    int half, sum;
} em_q16_block512;
static inline em_q16_block512 em_quantize_block512(const float *x) {
    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    const float d = amax / 32767.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m512i c0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, _mm512_set1_ps(id)));
    const __m512i c1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, _mm512_set1_ps(id)));
    em_q16_block512 q;
    q.c = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi32_epi16(c0)), _mm512_cvtepi32_epi16(c1), 1);
    q.d = d, q.half = _mm512_reduce_add_epi32(c0), q.sum = q.half + _mm512_reduce_add_epi32(c1);
    return q;
}

/* Quantizes x's row (nb blocks) into xq, as simple.h's em_quantize_row_q16 (the same d, codes and
 * s) */
static void em_vnni_prepare_row(em_vnni_block *xq, const float *xm, int64_t nb) {
    for (int64_t b = 0; b < nb; b++, xm += EM_QK) {
        const em_q16_block512 q = em_quantize_block512(xm);
        const __m512i h = _mm512_srai_epi16(q.c, 8);
        _mm256_storeu_si256((__m256i *)xq[b].hi, _mm512_cvtepi16_epi8(h));
        _mm256_storeu_si256((__m256i *)xq[b].lo, _mm512_cvtepi16_epi8(q.c));
        const __m512i h32 = _mm512_add_epi32(_mm512_cvtepi16_epi32(_mm512_castsi512_si256(h)),
                                             _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(h, 1)));
        xq[b].d = q.d, xq[b].s = q.d * (float)q.sum;
        xq[b].hi_sum = 32768 * _mm512_reduce_add_epi32(h32), xq[b].c_half = q.half, xq[b].c_sum = q.sum;
    }
}

/* x's row as a one-pass K-type weight's one-row kernel takes it (kquants.h's q8_K: int8 codes
 * per 256 values, llama.cpp's rounding), for x8 (kernels.c's em_lanes_x8): each block's 32 codes
 * in hi, the superblock's d, s = d * sum c of the block, and Q6_K's sums of each half's codes.
 * One vpdpbusd a register then takes 4 codes of x where int16 codes took two. nb: blocks of 32
 * (whole superblocks). The amx copy has no use for it. */
static __attribute__((unused)) void em_vnni_prepare_row_q8k(em_vnni_block *xq, const float *xm, int64_t nb) {
    for (int64_t sb = 0; sb < nb / 8; sb++, xm += KQ_QK) {
        kq_block_q8_K q;
        kq_quantize_row_q8_K(xm, &q, KQ_QK);
        for (int j = 0; j < 8; j++) {
            em_vnni_block *b = xq + 8 * sb + j;
            memcpy(b->hi, q.qs + 32 * j, 32);
            memset(b->lo, 0, sizeof b->lo);
            b->c_half = q.bsums[2 * j], b->c_sum = q.bsums32[j], b->hi_sum = 0;
            b->d = q.d, b->s = q.d * (float)b->c_sum;
        }
    }
}

/* ---- 16 weight rows' bytes side by side: loaded and transposed in registers, as rows8.h's 8
 * (gathers, which took each lane's dword alone, are slow on AMD's CPUs) ---- */

/* The 16 bytes at off of each of the 16 rows at rp as 4 registers: t[i] lane r = row r's dword i */
static inline __attribute__((always_inline)) void em_v16_load16(const uint8_t *const *rp, int64_t off,
                                                                __m512i *t) {
    __m512i a[4]; /* a[r]'s 128-bit chunk c: row r + 4c */
    for (int r = 0; r < 4; r++) {
        __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(rp[r] + off)));
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rp[r + 4] + off)), 1);
        v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rp[r + 8] + off)), 2);
        a[r] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rp[r + 12] + off)), 3);
    }
    const __m512i u0 = _mm512_unpacklo_epi32(a[0], a[1]), u1 = _mm512_unpackhi_epi32(a[0], a[1]);
    const __m512i u2 = _mm512_unpacklo_epi32(a[2], a[3]), u3 = _mm512_unpackhi_epi32(a[2], a[3]);
    t[0] = _mm512_unpacklo_epi64(u0, u2), t[1] = _mm512_unpackhi_epi64(u0, u2);
    t[2] = _mm512_unpacklo_epi64(u1, u3), t[3] = _mm512_unpackhi_epi64(u1, u3);
}

/* The 32 bytes at off of each of the 16 rows: t[0..7] */
static inline __attribute__((always_inline)) void em_v16_load32(const uint8_t *const *rp, int64_t off,
                                                                __m512i *t) {
    __m512i a[8]; /* a[r]'s 256-bit halves: rows r and r + 8 */
    for (int r = 0; r < 8; r++)
        a[r] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(rp[r] + off))),
                                  _mm256_loadu_si256((const __m256i *)(rp[r + 8] + off)), 1);
    __m512i s[8]; /* s[4q + k]'s chunk c: dword k + 4 (c % 2) of rows 4q..4q + 3 (c >= 2: 8 more) */
    for (int q = 0; q < 2; q++) {
        const __m512i *b = a + 4 * q;
        const __m512i u0 = _mm512_unpacklo_epi32(b[0], b[1]), u1 = _mm512_unpackhi_epi32(b[0], b[1]);
        const __m512i u2 = _mm512_unpacklo_epi32(b[2], b[3]), u3 = _mm512_unpackhi_epi32(b[2], b[3]);
        s[4 * q] = _mm512_unpacklo_epi64(u0, u2), s[4 * q + 1] = _mm512_unpackhi_epi64(u0, u2);
        s[4 * q + 2] = _mm512_unpacklo_epi64(u1, u3), s[4 * q + 3] = _mm512_unpackhi_epi64(u1, u3);
    }
    const __m512i first = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13); /* chunks 0 and 2 of each */
    const __m512i second = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15); /* chunks 1 and 3 */
    for (int k = 0; k < 4; k++) {
        t[k] = _mm512_permutex2var_epi64(s[k], first, s[4 + k]);
        t[k + 4] = _mm512_permutex2var_epi64(s[k], second, s[4 + k]);
    }
}

/* Q4_K and Q5_K: the 8 sub-blocks of 32 of the superblock at off of the 16 rows at rp as scales
 * dw[j] = d * sc_j and offsets mw[j] = -(dmin * m_j) of each row (kquants.h's kq_scales_k4 on 16
 * rows at once) */
static inline void em_kscales16(const uint8_t *const *rp, int64_t off, float dw[][16], float mw[][16]) {
    __m512i h[4]; /* d and dmin, then the 12 bytes of scales and offsets */
    em_v16_load16(rp, off, h);
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h[0]));
    const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(h[0], 16)));
    __m512i u0 = h[1], u1 = h[2], u2 = h[3];
    const __m512i k1 = _mm512_set1_epi32(0x3f3f3f3f), k2 = _mm512_set1_epi32(0x0f0f0f0f);
    const __m512i k3 = _mm512_set1_epi32(0x03030303);
    const __m512i u3 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), k2),
                                       _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), k3), 4));
    const __m512i mins_lo = _mm512_and_si512(u1, k1);
    u1 = _mm512_or_si512(_mm512_and_si512(u2, k2),
                         _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), k3), 4));
    u2 = mins_lo;
    u0 = _mm512_and_si512(u0, k1);
    const __m512i byte = _mm512_set1_epi32(0xff);
    for (int j = 0; j < 8; j++) { /* scales: bytes of u0 (0-3), u1 (4-7); offsets: u2, u3 */
        const __m512i sc = _mm512_and_si512(_mm512_srli_epi32(j < 4 ? u0 : u1, 8 * (j % 4)), byte);
        const __m512i m = _mm512_and_si512(_mm512_srli_epi32(j < 4 ? u2 : u3, 8 * (j % 4)), byte);
        _mm512_store_ps(dw[j], _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
        const __m512 ml = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m));
        _mm512_store_ps(mw[j], _mm512_sub_ps(_mm512_setzero_ps(), ml));
    }
}

/* Q6_K: the 16 sub-blocks' scales dw[j] = d * sc_j of the superblock at off of the 16 rows at rp */
static inline void em_q6scales16(const uint8_t *const *rp, int64_t off, float dw[][16]) {
    __m512i u[4]; /* scales 4g..4g+3: int8 at 192; d, the superblock's last 2 bytes, at 208 */
    em_v16_load16(rp, off + 192, u);
    __m512i tail[4]; /* read with the 14 bytes before it, inside the block */
    em_v16_load16(rp, off + 194, tail);
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(tail[3], 16)));
    for (int g = 0; g < 4; g++) {
        for (int k = 0; k < 4; k++) {
            const __m512i sc = _mm512_srai_epi32(_mm512_slli_epi32(u[g], 24 - 8 * k), 24);
            _mm512_store_ps(dw[4 * g + k], _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
        }
    }
}

static inline __m512i em_vnni_x4(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* One block of 16 weight rows (u: its codes as vpdpbusd's unsigned operand, v as its signed one;
 * scales dw, offsets mw) against every row of x: acc[m] += (dw dx) sum, then mw s where offset.
 * q8: Q8_0's u is q + 128; bias: the codes' (Q4_0's 8, Q5_0's 16: sum (q - bias) c, as amx.h's
 * signed codes). xb: row 0's prepared block, rows nb apart. */
static inline __attribute__((always_inline)) void em_vnni_block_rows(const __m512i *u, const __m512i *v,
                                                                     __m512 dw, __m512 mw, int offset, int q8,
                                                                     int bias, int x8, const em_vnni_block *xb,
                                                                     int64_t nb, int64_t M, float (*acc)[16]) {
    for (int64_t m = 0; m < M; m++, xb += nb) {
        __m512i hi = _mm512_setzero_si512(), lo = _mm512_setzero_si512();
        for (int t = 0; t < 8; t++) {
            hi = _mm512_dpbusd_epi32(hi, u[t], em_vnni_x4(xb->hi + 4 * t));
            if (!x8) lo = _mm512_dpbusd_epi32(lo, em_vnni_x4(xb->lo + 4 * t), v[t]); /* codes < 128: signed too */
        }
        __m512i sum = x8 ? hi : _mm512_add_epi32(_mm512_slli_epi32(hi, 8), lo); /* x8: hi holds the codes */
        if (q8) sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(xb->hi_sum));
        if (bias) sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(bias * xb->c_sum));
        __m512 a = _mm512_load_ps(acc[m]);
        a = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xb->d)), _mm512_cvtepi32_ps(sum), a);
        if (offset) a = _mm512_fmadd_ps(mw, _mm512_set1_ps(xb->s), a);
        _mm512_store_ps(acc[m], a);
    }
}

/* Q6_K: a block's two 16-value halves (v: codes q, 0..63), each with its scales (dwa, dwb),
 * against every row of x: acc[m] += (dwa dx) (sum q c - 32 sum c) over the first half, then the
 * same over the second */
static inline __attribute__((always_inline)) void em_vnni_q6_rows(const __m512i *v, __m512 dwa, __m512 dwb,
                                                                  int x8, const em_vnni_block *xb, int64_t nb,
                                                                  int64_t M, float (*acc)[16]) {
    for (int64_t m = 0; m < M; m++, xb += nb) {
        __m512i hi[2], lo[2];
        for (int h = 0; h < 2; h++) {
            hi[h] = lo[h] = _mm512_setzero_si512();
            for (int t = 4 * h; t < 4 * h + 4; t++) {
                hi[h] = _mm512_dpbusd_epi32(hi[h], v[t], em_vnni_x4(xb->hi + 4 * t));
                if (!x8) lo[h] = _mm512_dpbusd_epi32(lo[h], em_vnni_x4(xb->lo + 4 * t), v[t]);
            }
        }
        const int32_t c[2] = {32 * xb->c_half, 32 * (xb->c_sum - xb->c_half)};
        const __m512 dx = _mm512_set1_ps(xb->d);
        __m512 a = _mm512_load_ps(acc[m]);
        for (int h = 0; h < 2; h++) {
            const __m512i codes = x8 ? hi[h] : _mm512_add_epi32(_mm512_slli_epi32(hi[h], 8), lo[h]);
            const __m512i sum = _mm512_sub_epi32(codes, _mm512_set1_epi32(c[h]));
            a = _mm512_fmadd_ps(_mm512_mul_ps(h ? dwb : dwa, dx), _mm512_cvtepi32_ps(sum), a);
        }
        _mm512_store_ps(acc[m], a);
    }
}

/* y[m * ldy + n] = W[n] . x[m] for the M rows of x prepared in xq (M rows of nb blocks) and the
 * weight rows n0..n1 (at most 16: a chunk). */
static inline __attribute__((always_inline)) void em_rows_vnni_of(int type, int x8, const em_vnni_block *xq,
                                                                  const uint8_t *W, int64_t row_bytes, int64_t nb,
                                                                  int64_t M, int64_t ldy, int64_t n0, int64_t n1,
                                                                  float *y) {
    const int64_t nr = n1 - n0;
    const __m512i low4 = _mm512_set1_epi8(15);
    float acc[EM_LANES_MAX_ROWS][16] __attribute__((aligned(64)));
    for (int64_t m = 0; m < M; m++) _mm512_store_ps(acc[m], _mm512_setzero_ps());
    const uint8_t *w0 = W + n0 * row_bytes;
    const uint8_t *rp[16]; /* rows past nr read row n0 (in bounds), their sums not kept */
    for (int r = 0; r < 16; r++) rp[r] = w0 + (r < nr ? r : 0) * row_bytes;
    /* the 16 rows are read side by side, a block of each at a time, which the hardware's prefetch
     * does not follow: ask for the next chunk's rows, a few lines each block (as amx.h) */
    const int64_t lines = 16 * row_bytes / 64, per_block = (lines + nb - 1) / nb;
    const uint8_t *next = w0 + 16 * row_bytes;
#define EM_VNNI_PREFETCH()                                                                         \
    for (int64_t i = 0; i < per_block; i++, next += 64) __builtin_prefetch(next)
    __m512i g[8], v[8], u[8];
    if (em_lanes_ktype(type)) {
        const int64_t sbytes = row_bytes / (nb / 8);
        float dw[16][16] __attribute__((aligned(64))), mw[8][16] __attribute__((aligned(64)));
        for (int64_t sb = 0; sb < nb / 8; sb++) {
            const int64_t off = sb * sbytes;
            const em_vnni_block *xb = xq + sb * 8;
            if (type == KQ_TYPE_Q6_K) {
                em_q6scales16(rp, off, dw);
                for (int h = 0; h < 2; h++) { /* ql's 64 bytes, qh's 32 */
                    __m512i qh[8];
                    em_v16_load32(rp, off + 128 + 32 * h, qh);
                    for (int k1 = 0; k1 < 2; k1++) {
                        em_v16_load32(rp, off + 64 * h + 32 * k1, g);
                        for (int k2 = 0; k2 < 2; k2++) { /* block 4h + k: low (k < 2) or high nibbles */
                            const int k = k1 + 2 * k2, j = 4 * h + k;
                            EM_VNNI_PREFETCH();
                            for (int t = 0; t < 8; t++) {
                                const __m512i q4 = _mm512_and_si512(_mm512_srli_epi32(g[t], 4 * k2), low4);
                                const __m512i q2 = _mm512_and_si512(_mm512_srli_epi32(qh[t], 2 * k),
                                                                    _mm512_set1_epi8(3));
                                v[t] = _mm512_or_si512(q4, _mm512_slli_epi32(q2, 4));
                            }
                            em_vnni_q6_rows(v, _mm512_load_ps(dw[2 * j]), _mm512_load_ps(dw[2 * j + 1]), x8,
                                            xb + j, nb, M, acc);
                        }
                    }
                }
                continue;
            }
            em_kscales16(rp, off, dw, mw);
            __m512i q5[8];
            if (type == KQ_TYPE_Q5_K) em_v16_load32(rp, off + 16, q5);
            for (int p = 0; p < 4; p++) { /* sub-blocks 2p and 2p + 1: 32 bytes' low and high nibbles */
                em_v16_load32(rp, off + (type == KQ_TYPE_Q5_K ? 48 : 16) + 32 * p, g);
                for (int hn = 0; hn < 2; hn++) {
                    const int j = 2 * p + hn;
                    EM_VNNI_PREFETCH();
                    for (int t = 0; t < 8; t++) {
                        v[t] = _mm512_and_si512(_mm512_srli_epi32(g[t], 4 * hn), low4);
                        if (type == KQ_TYPE_Q5_K) /* the fifth bit: bit j of qh[l] */
                            v[t] = _mm512_or_si512(
                                v[t], _mm512_slli_epi32(
                                          _mm512_and_si512(_mm512_srli_epi32(q5[t], j), _mm512_set1_epi8(1)), 4));
                    }
                    em_vnni_block_rows(v, v, _mm512_load_ps(dw[j]), _mm512_load_ps(mw[j]), 1, 0, 0, x8,
                                       xb + j, nb, M, acc);
                }
            }
        }
    } else {
        const int64_t bytes = row_bytes / nb;
        const int q8 = type == EM_Q8_0, offset = type == EM_Q4_1 || type == EM_Q5_1;
        const int bias = type == EM_Q4_0 ? 8 : type == EM_Q5_0 ? 16 : 0;
        const int qs_at = type == EM_Q4_1 ? 4 : type == EM_Q5_0 ? 6 : type == EM_Q5_1 ? 8 : 2;
        const int qh_at = type == EM_Q5_0 ? 2 : type == EM_Q5_1 ? 4 : 0;
        /* the fifth bits: 4 bits of qh to bit 4 of each of a dword's bytes */
        const __m512i spread =
            _mm512_setr_epi32(0x00000000, 0x00000010, 0x00001000, 0x00001010, 0x00100000, 0x00100010,
                              0x00101000, 0x00101010, 0x10000000, 0x10000010, 0x10001000, 0x10001010,
                              0x10100000, 0x10100010, 0x10101000, 0x10101010);
        for (int64_t b = 0; b < nb; b++) {
            EM_VNNI_PREFETCH();
            const int64_t off = b * bytes;
            em_v16_load16(rp, off, g); /* the block's first 16 bytes: d (and m), and qh */
            const __m512i head = g[0];
            const __m512i qh =
                qh_at == 4 ? g[1] : _mm512_or_si512(_mm512_srli_epi32(g[0], 16), _mm512_slli_epi32(g[1], 16));
            const __m512 dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
            const __m512 mw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16)));
            if (q8) { /* v[t]: codes 4t..4t+3 of each of the 16 rows */
                em_v16_load32(rp, off + qs_at, v);
                for (int t = 0; t < 8; t++) u[t] = _mm512_xor_si512(v[t], _mm512_set1_epi8((char)0x80));
                em_vnni_block_rows(u, v, dw, mw, 0, 1, 0, 0, xq + b, nb, M, acc);
                continue;
            }
            em_v16_load16(rp, off + qs_at, g);
            for (int t = 0; t < 4; t++) { /* elements j low, j + 16 high */
                v[t] = _mm512_and_si512(g[t], low4);
                v[t + 4] = _mm512_and_si512(_mm512_srli_epi32(g[t], 4), low4);
            }
            if (qh_at)
                for (int t = 0; t < 8; t++)
                    v[t] = _mm512_or_si512(v[t], _mm512_permutexvar_epi32(_mm512_srli_epi32(qh, 4 * t), spread));
            em_vnni_block_rows(v, v, dw, mw, offset, 0, bias, 0, xq + b, nb, M, acc);
        }
    }
#undef EM_VNNI_PREFETCH
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < nr; n++) y[m * ldy + n0 + n] = acc[m][n];
}

/* em_rows_vnni_of, its code copied for each kind of x (x8: q8_K's codes, kernels.c's
 * em_lanes_x8; else int16's) */
static void em_rows_vnni(int type, int x8, const em_vnni_block *xq, const uint8_t *W, int64_t row_bytes,
                         int64_t nb, int64_t M, int64_t ldy, int64_t n0, int64_t n1, float *y) {
    if (x8)
        em_rows_vnni_of(type, 1, xq, W, row_bytes, nb, M, ldy, n0, n1, y);
    else
        em_rows_vnni_of(type, 0, xq, W, row_bytes, nb, M, ldy, n0, n1, y);
}

#endif /* EMBER_VNNI_H */
