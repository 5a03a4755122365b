/* The 32-element types Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0, and the K-quant mixes' Q4_K, Q5_K and
 * Q6_K, against 2-16 rows of x with 256-bit registers, 8 weight rows a register: the avx2 and
 * avxvnni copies of kernels.c take these here (em_r8_least_rows says from how many rows). It is
 * vnni.h's layout on AVX2: vnni.h has 16 weight rows a 512-bit register, and needs AVX512-VNNI.
 *
 * A register's 8 lanes are 8 weight rows, each lane 2 codes of its row as int16. A block's 32
 * codes are 16 such registers, built from the 8 rows' bytes (loaded side by side and transposed
 * in registers: no gathers, which are slow on AMD's CPUs) and unpacked once for every row of x,
 * half a block (8 registers) at a time.
 * x is quantized as the int16 path quantizes it (simple.h's em_quantize_row_q16: per 32 values
 * d = max|x| / 32767, codes c, s = d * sum c), its codes laid out in the registers' pairs. Then
 * one vpmaddwd (AVX-VNNI: vpdpwssd) a register and row of x, its 2 codes of 8 weight rows times
 * 2 of x's, broadcast: 16 give a block's sum q c of 8 weight rows exactly in int32 (|q| <= 128,
 * |c| <= 32767: 32 products stay below 2^31), less Q4_0's and Q5_0's offsets (8 and 16 sum c)
 * and Q6_K's (32 sum c over each 16 values). Then vnni.h's float chain a weight row and row of
 * x: y += (d_w d_x) * sum, then y += m_w * s where w = d_w q + m_w has an offset (Q4_1, Q5_1:
 * the file's m; the K types' -dmin m). The integer sums are exact either way, so a row gives the
 * bits vnni.h and amx.h give it, on any of these paths and in any batch they take.
 *
 * Against simple.h's em_dots_T (2-4 rows of x, a weight row at a time, the codes in int16 too):
 * there each weight row and row of x took its own int32 lanes, their conversion to float and
 * a multiply-add a block; here 8 weight rows share them, and a block's codes are unpacked once
 * for 8-16 rows of x instead of 4 (README and docs/speed-log.md have the figures).
 *
 * A K type's one-pass weight (kernels.c's em_lanes_x8: q/k/v, gate/up and the head, whose
 * input is a normalized hidden state) takes x as q8_K's int8 codes instead (vnni.h alike), as
 * its one-row kernel and llama.cpp round it (em_r8_prepare_row_q8k): the half block's codes stay
 * bytes, 4 a lane, and meet x's 4 codes a lane in one vpmaddubsw (AVX-VNNI: vpdpbusd) where
 * int16 took two vpmaddwd, with no widening to pairs. The sums are exact again, so a row's bits
 * do not depend on its batch, and its codes are those it has alone: only the float steps' order
 * differs (the int16 codes had put a sequence in a batch int8's rounding away from itself
 * alone). ns a block and row from memory, one pass with int16 codes (or kquants.h's q8_K
 * kernel below em_r8_least_rows) against q8_K codes here (`bench_simple_types.py --k 2048 --mib 200 --rows 2
 * 3 4 8 16 --passes 1 --lanes-x8 0|1 --isa avx2 --types Q4_K Q5_K Q6_K --runs 8`, 2 threads,
 * the Zen 5 EPYC): Q4_K 2 rows 0.38 -> 0.30, 4 0.29 -> 0.20, 8 0.23 -> 0.15, 16 0.20 -> 0.13; Q5_K
 * 0.46 -> 0.36, 0.32 -> 0.24, 0.24 -> 0.17, 0.21 -> 0.14; Q6_K 3 rows 0.40 -> 0.31, 8 0.26 -> 0.19,
 * 16 0.22 -> 0.17, but at 2 rows its q8_K kernel's 0.31-0.33 against 0.39 here (a build taking
 * them from 2 rows: em_r8_least_rows_x8). The 32-element types keep int16 codes: where they
 * take int8 (x's q8_0 rounding, gemm8's) from 2 rows, Gemma 3's 15-token chat prompt, whose
 * prefill takes these kernels, left the reference's first logits by 12% of the largest. */
#ifndef EMBER_ROWS8_H
#define EMBER_ROWS8_H

/* The fewest rows of x this kernel takes for `type`: where unpacking 8 weight rows' blocks costs
 * more than their products save, fewer rows keep simple.h's and kquants.h's kernels. Where it
 * crossed, ns a block and row from memory with 2, 3 and 4 rows (`bench_simple_types.py --k 640
 * --mib 200 --rows 2 3 4 --isa avx2`, K 2,048 for the K types; the Xeon): Q4_0 and Q4_1 0.75-0.81
 * against 0.65-0.71 at 2 rows, even at 3; Q6_K 0.87 against 0.72-0.80 at 2, 0.64 against 0.72 at
 * 3. One row keeps the others everywhere (Q4_0 1.79 against 0.97). Q5_0 and Q5_1 take these from
 * 2 rows since simple.h builds their codes in int16 lanes: on the Zen 3 EPYC (an AVX2-only CPU)
 * 0.83, 0.63 and 0.53 against 0.99, 0.78 and 0.71 at 2, 3 and 4 rows (Q5_0, 2 threads); the
 * Xeon's avx2 path had found them slower here (1.08 against 0.83 at 2, 0.68-0.70 against
 * 0.62-0.65 at 4, with their fifth bits spread a byte at a time there) but has AVX-512. */
static int64_t em_r8_least_rows(int type) {
    switch (type) {
    case EM_Q4_0:
    case EM_Q4_1:
    case KQ_TYPE_Q6_K: return 3;
    default: return 2; /* Q5_0, Q5_1, Q8_0, Q4_K, Q5_K */
    }
}

/* The fewest rows of x this kernel takes with x8 (a one-pass K type: x as q8_K's int8 codes),
 * where the rows it leaves take kquants.h's q8_K kernel: at 2 rows Q6_K's was the faster, Q4_K's
 * and Q5_K's not (the figures are at the top) */
static int64_t em_r8_least_rows_x8(int type) { return type == KQ_TYPE_Q6_K ? 3 : 2; }

/* A row's prepared block: x's codes in the registers' pairs (dword 2t + p holds the codes of
 * elements 4t + p and 4t + p + 2), d, s, and what the codes' offsets take from the sums (read
 * straight into a register's lanes): 8 and 16 times the sum of the codes (Q4_0, Q5_0), 32 times
 * that of the first 16 and of the last 16 (Q6_K's halves) */
enum { EM_R8_LESS_Q4_0, EM_R8_LESS_Q5_0, EM_R8_LESS_Q6_K };
typedef struct {
    int32_t pair[16];
    float d, s;
    int32_t less[4];
} em_r8_block;

static inline int32_t em_r8_hsum(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* Quantizes x's row (nb blocks) into xq, as simple.h's em_quantize_row_q16 (the same d, codes and
 * s) */
static void em_r8_prepare_row(em_r8_block *xq, const float *xm, int64_t nb) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; b++, xm += EM_QK) {
        em_block_q16 q;
        em_quantize_row_q16(xm, &q, 1);
        const __m256i c0 = _mm256_loadu_si256((const __m256i *)q.qs);
        const __m256i c1 = _mm256_loadu_si256((const __m256i *)(q.qs + 16));
        const int32_t first = em_r8_hsum(_mm256_madd_epi16(c0, ones)), last = em_r8_hsum(_mm256_madd_epi16(c1, ones));
        xq[b].less[EM_R8_LESS_Q4_0] = 8 * (first + last), xq[b].less[EM_R8_LESS_Q5_0] = 16 * (first + last);
        xq[b].less[EM_R8_LESS_Q6_K] = 32 * first, xq[b].less[EM_R8_LESS_Q6_K + 1] = 32 * last;
        /* each 4 codes (4t .. 4t + 3) as (4t, 4t + 2), (4t + 1, 4t + 3) */
        _mm256_storeu_si256((__m256i *)xq[b].pair, _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(c0, 0xd8), 0xd8));
        _mm256_storeu_si256((__m256i *)(xq[b].pair + 8),
                            _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(c1, 0xd8), 0xd8));
        xq[b].d = q.d, xq[b].s = q.s;
    }
}

/* x's row as a one-pass K-type weight's kernels take it at one row (kquants.h's q8_K: int8 codes
 * per 256 values, llama.cpp's rounding), laid out for the int8 lanes (x8): a superblock's codes
 * in order, 32 to each of its 8 blocks (dword 4h + t of pair: elements 16h + 4t .. 16h + 4t + 3
 * of the block, as a half's registers hold a weight row's), d the superblock's, s = d * sum c
 * of the block, and Q6_K's offset sums of each half. nb: blocks of 32 (whole superblocks). */
static void em_r8_prepare_row_q8k(em_r8_block *xq, const float *xm, int64_t nb) {
    for (int64_t sb = 0; sb < nb / 8; sb++, xm += KQ_QK) {
        kq_block_q8_K q;
        kq_quantize_row_q8_K(xm, &q, KQ_QK);
        for (int j = 0; j < 8; j++) {
            em_r8_block *b = xq + 8 * sb + j;
            memcpy(b->pair, q.qs + 32 * j, 32);
            const int32_t first = q.bsums[2 * j], last = q.bsums[2 * j + 1];
            b->less[EM_R8_LESS_Q4_0] = b->less[EM_R8_LESS_Q5_0] = 0; /* no K type reads them */
            b->less[EM_R8_LESS_Q6_K] = 32 * first, b->less[EM_R8_LESS_Q6_K + 1] = 32 * last;
            b->d = q.d, b->s = q.d * (float)q.bsums32[j];
        }
    }
}

/* ---- 8 weight rows' bytes side by side ---- */

/* The dword at off of each of the 8 rows at rp */
static inline __m256i em_r8_dword(const uint8_t *const *rp, int64_t off) {
    int32_t v[8];
    for (int r = 0; r < 8; r++) memcpy(&v[r], rp[r] + off, 4);
    return _mm256_setr_epi32(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
}

/* The 16 bytes at off of each of the 8 rows as 4 registers: t[i] lane r = row r's dword i */
static inline void em_r8_load16(const uint8_t *const *rp, int64_t off, __m256i *t) {
    __m256i a[4];
    for (int r = 0; r < 4; r++)
        a[r] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(rp[r] + off))),
                                       _mm_loadu_si128((const __m128i *)(rp[r + 4] + off)), 1);
    const __m256i u0 = _mm256_unpacklo_epi32(a[0], a[1]), u1 = _mm256_unpackhi_epi32(a[0], a[1]);
    const __m256i u2 = _mm256_unpacklo_epi32(a[2], a[3]), u3 = _mm256_unpackhi_epi32(a[2], a[3]);
    t[0] = _mm256_unpacklo_epi64(u0, u2), t[1] = _mm256_unpackhi_epi64(u0, u2);
    t[2] = _mm256_unpacklo_epi64(u1, u3), t[3] = _mm256_unpackhi_epi64(u1, u3);
}

/* The 32 bytes at off of each row: t[0..7] */
static inline void em_r8_load32(const uint8_t *const *rp, int64_t off, __m256i *t) {
    em_r8_load16(rp, off, t);
    em_r8_load16(rp, off + 16, t + 4);
}

/* Half a block's codes as bytes g[0..3] (byte i of a lane: element 4t + i of the half, 0..255)
 * to the registers' int16 pairs: w[2t] the elements 4t and 4t + 2, w[2t + 1] 4t + 1 and 4t + 3 */
static inline void em_r8_pairs(const __m256i *g, __m256i *w) {
    const __m256i even = _mm256_set1_epi16(0xff);
    for (int t = 0; t < 4; t++) w[2 * t] = _mm256_and_si256(g[t], even), w[2 * t + 1] = _mm256_srli_epi16(g[t], 8);
}
/* the same for signed bytes (Q8_0) */
static inline void em_r8_pairs_signed(const __m256i *g, __m256i *w) {
    for (int t = 0; t < 4; t++)
        w[2 * t] = _mm256_srai_epi16(_mm256_slli_epi16(g[t], 8), 8), w[2 * t + 1] = _mm256_srai_epi16(g[t], 8);
}

/* Half a block (w: its 8 pair registers) times x's (xp: that half's 8 pairs): int32 lanes of
 * 8 weight rows */
static inline __attribute__((always_inline)) __m256i em_r8_dot(const __m256i *w, const int32_t *xp) {
#if defined(__AVXVNNI__)
    __m256i a = _mm256_setzero_si256(), b = _mm256_setzero_si256();
    for (int r = 0; r < 8; r += 2) {
        a = _mm256_dpwssd_avx_epi32(a, w[r], _mm256_set1_epi32(xp[r]));
        b = _mm256_dpwssd_avx_epi32(b, w[r + 1], _mm256_set1_epi32(xp[r + 1]));
    }
    return _mm256_add_epi32(a, b);
#else
    __m256i p[4];
    for (int r = 0; r < 8; r += 2)
        p[r / 2] = _mm256_add_epi32(_mm256_madd_epi16(w[r], _mm256_set1_epi32(xp[r])),
                                    _mm256_madd_epi16(w[r + 1], _mm256_set1_epi32(xp[r + 1])));
    return _mm256_add_epi32(_mm256_add_epi32(p[0], p[1]), _mm256_add_epi32(p[2], p[3]));
#endif
}

/* Half a block's unsigned codes as bytes (v[0..3], byte i of a lane: element 4t + i of the
 * half, at most 63) times x's int8 codes (xc: that half's 4 dwords, at most 127 in size): int32
 * lanes of 8 weight rows, exact. vpmaddubsw's pairs stay below 2^15 (2 * 63 * 127); four of
 * them summed in int16 would not for Q6_K's 6-bit codes (q6), which widen two at a time (4- and
 * 5-bit codes: 4 * 2 * 31 * 127 < 2^15). */
static inline __attribute__((always_inline)) __m256i em_r8_dot8(const __m256i *v, const int32_t *xc, int q6) {
#if defined(__AVXVNNI__)
    (void)q6;
    __m256i a = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), v[0], _mm256_set1_epi32(xc[0]));
    __m256i b = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), v[1], _mm256_set1_epi32(xc[1]));
    a = _mm256_dpbusd_avx_epi32(a, v[2], _mm256_set1_epi32(xc[2]));
    b = _mm256_dpbusd_avx_epi32(b, v[3], _mm256_set1_epi32(xc[3]));
    return _mm256_add_epi32(a, b);
#else
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(v[0], _mm256_set1_epi32(xc[0])),
                                         _mm256_maddubs_epi16(v[1], _mm256_set1_epi32(xc[1])));
    const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(v[2], _mm256_set1_epi32(xc[2])),
                                         _mm256_maddubs_epi16(v[3], _mm256_set1_epi32(xc[3])));
    if (q6) return _mm256_add_epi32(_mm256_madd_epi16(p01, ones), _mm256_madd_epi16(p23, ones));
    return _mm256_madd_epi16(_mm256_add_epi16(p01, p23), ones);
#endif
}

/* Half h of a block's sums of 8 weight rows against a row of x: w holds the half's 8 int16 pair
 * registers (em_r8_dot), or with x8 its 4 registers of codes as bytes (em_r8_dot8) */
static inline __attribute__((always_inline)) __m256i em_r8_half_dot(const __m256i *w, int x8, int q6,
                                                                   const em_r8_block *xb, int h) {
    return x8 ? em_r8_dot8(w, xb->pair + 4 * h, q6) : em_r8_dot(w, xb->pair + 8 * h);
}

/* Half h of a block of 8 weight rows (w: its 8 pair registers, or with x8 its 4 of bytes:
 * em_r8_half_dot; the block's scales dw, offsets mw) against every row of x. The first half's
 * sums wait in part[m]; with the second's, acc[m] += (dw dx) sum, then mw s where offset. less:
 * the codes' offset, if any (xb's less[less]: Q4_0's and Q5_0's sum (q - 8) c and sum (q - 16)
 * c), else -1. xb: row 0's prepared block, rows nb apart. A half at a time, its registers stay
 * in registers for every row of x (AVX2 has 16). */
static inline __attribute__((always_inline)) void em_r8_half_rows(const __m256i *w, int x8, int h, __m256 dw,
                                                                 __m256 mw, int offset, int less,
                                                                 const em_r8_block *xb, int64_t nb, int64_t M,
                                                                 __m256i *part, float (*acc)[8]) {
    for (int64_t m = 0; m < M; m++, xb += nb) {
        const __m256i dot = em_r8_half_dot(w, x8, 0, xb, h);
        if (!h) {
            part[m] = dot;
            continue;
        }
        __m256i sum = _mm256_add_epi32(part[m], dot);
        if (less >= 0) sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(xb->less[less]));
        __m256 a = _mm256_load_ps(acc[m]);
        a = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xb->d)), _mm256_cvtepi32_ps(sum), a);
        if (offset) a = _mm256_fmadd_ps(mw, _mm256_set1_ps(xb->s), a);
        _mm256_store_ps(acc[m], a);
    }
}

/* Q6_K: half h of a block (16 values, w: codes q, 0..63, as em_r8_half_rows takes them; its
 * scales dw) against every row of x: acc[m] += (dw dx) (sum q c - 32 sum c) */
static inline __attribute__((always_inline)) void em_r8_q6_half(const __m256i *w, int x8, int h, __m256 dw,
                                                               const em_r8_block *xb, int64_t nb, int64_t M,
                                                               float (*acc)[8]) {
    for (int64_t m = 0; m < M; m++, xb += nb) {
        const __m256i sum = _mm256_sub_epi32(em_r8_half_dot(w, x8, 1, xb, h),
                                             _mm256_set1_epi32(xb->less[EM_R8_LESS_Q6_K + h]));
        __m256 a = _mm256_load_ps(acc[m]);
        a = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xb->d)), _mm256_cvtepi32_ps(sum), a);
        _mm256_store_ps(acc[m], a);
    }
}

/* the low (high = 0) or high halves of 8 dwords as floats (f16 bits) */
static inline __m256 em_r8_f16(__m256i v, int high) {
    const __m256i halves = _mm256_shuffle_epi8(
        v, high ? _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1, 2, 3, 6, 7, 10, 11, 14,
                                   15, -1, -1, -1, -1, -1, -1, -1, -1)
                : _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8, 9, 12,
                                   13, -1, -1, -1, -1, -1, -1, -1, -1));
    return _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(halves, 0x08)));
}

/* Q4_K and Q5_K: the 8 sub-blocks of 32 of the superblock at off of the 8 rows as scales dw[j]
 * = d * sc_j and offsets mw[j] = -(dmin * m_j) (vnni.h's em_kscales16 on 8 rows) */
static inline void em_r8_kscales(const uint8_t *const *rp, int64_t off, float dw[][8], float mw[][8]) {
    const __m256i head = em_r8_dword(rp, off);
    const __m256 d = em_r8_f16(head, 0), dmin = em_r8_f16(head, 1);
    __m256i u0 = em_r8_dword(rp, off + 4), u1 = em_r8_dword(rp, off + 8), u2 = em_r8_dword(rp, off + 12);
    const __m256i k1 = _mm256_set1_epi32(0x3f3f3f3f), k2 = _mm256_set1_epi32(0x0f0f0f0f);
    const __m256i k3 = _mm256_set1_epi32(0x03030303);
    const __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), k2),
                                       _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u1, 6), k3), 4));
    const __m256i mins_lo = _mm256_and_si256(u1, k1);
    u1 = _mm256_or_si256(_mm256_and_si256(u2, k2),
                         _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(u0, 6), k3), 4));
    u2 = mins_lo;
    u0 = _mm256_and_si256(u0, k1);
    const __m256i byte = _mm256_set1_epi32(0xff);
    for (int j = 0; j < 8; j++) { /* scales: bytes of u0 (0-3), u1 (4-7); offsets: u2, u3 */
        const __m256i sc = _mm256_and_si256(_mm256_srli_epi32(j < 4 ? u0 : u1, 8 * (j % 4)), byte);
        const __m256i m = _mm256_and_si256(_mm256_srli_epi32(j < 4 ? u2 : u3, 8 * (j % 4)), byte);
        _mm256_store_ps(dw[j], _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc)));
        _mm256_store_ps(mw[j], _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(m))));
    }
}

/* Q6_K: the 16 sub-blocks' scales dw[j] = d * sc_j of the superblock at off of the 8 rows */
static inline void em_r8_q6scales(const uint8_t *const *rp, int64_t off, float dw[][8]) {
    /* d is the superblock's last 2 bytes: read with the 2 before them, inside the block */
    const __m256 d = em_r8_f16(em_r8_dword(rp, off + 206), 1);
    for (int g = 0; g < 4; g++) { /* scales 4g..4g+3: int8 at 192 */
        const __m256i u = em_r8_dword(rp, off + 192 + 4 * g);
        for (int k = 0; k < 4; k++) {
            const __m256i sc = _mm256_srai_epi32(_mm256_slli_epi32(u, 24 - 8 * k), 24);
            _mm256_store_ps(dw[4 * g + k], _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc)));
        }
    }
}

/* bit 4 of byte i of each lane where bit i (i < 4) of the lane's byte `at` shifted right by
 * `shift`: the fifth bits of 4 elements of Q5_0 and Q5_1 from their qh */
static inline __m256i em_r8_fifth(__m256i qh, int at, int shift) {
    const __m256i spread = _mm256_setr_epi8(at, at, at, at, 4 + at, 4 + at, 4 + at, 4 + at, 8 + at, 8 + at, 8 + at,
                                            8 + at, 12 + at, 12 + at, 12 + at, 12 + at, at, at, at, at, 4 + at,
                                            4 + at, 4 + at, 4 + at, 8 + at, 8 + at, 8 + at, 8 + at, 12 + at,
                                            12 + at, 12 + at, 12 + at);
    const __m256i bit = _mm256_set1_epi32((int)(0x08040201u << shift));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(qh, spread), bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

/* y[m * ldy + n] = W[n] . x[m] for the M rows of x prepared in xq (M rows of nb blocks) and the
 * weight rows n0..n1 (at most 8) */
static inline __attribute__((always_inline)) void em_rows_r8_group(int type, int x8, const em_r8_block *xq,
                                                                   const uint8_t *W, int64_t row_bytes, int64_t nb,
                                                                   int64_t M, int64_t ldy, int64_t n0, int64_t n1,
                                                                   float *y) {
    const int64_t nr = n1 - n0;
    const uint8_t *rp[8]; /* rows past nr read row n0 (in bounds), their sums not kept */
    for (int r = 0; r < 8; r++) rp[r] = W + (n0 + (r < nr ? r : 0)) * row_bytes;
    float acc[EM_LANES_MAX_ROWS][8] __attribute__((aligned(32)));
    for (int64_t m = 0; m < M; m++) _mm256_store_ps(acc[m], _mm256_setzero_ps());
    /* the 8 rows are read side by side, a block of each at a time: ask for the next group's
     * rows, a few lines each block (as vnni.h) */
    const int64_t lines = 8 * row_bytes / 64, per_block = (lines + nb - 1) / nb;
    const uint8_t *next = W + (n0 + 8) * row_bytes;
#define EM_R8_PREFETCH()                                                                           \
    for (int64_t i = 0; i < per_block; i++, next += 64) __builtin_prefetch(next)
    const __m256i low4 = _mm256_set1_epi8(15);
    __m256i part[EM_LANES_MAX_ROWS], g[8], v[4], w[8];
    if (em_lanes_ktype(type)) {
        const int64_t sbytes = row_bytes / (nb / 8);
        float dw[16][8] __attribute__((aligned(32))), mw[8][8] __attribute__((aligned(32)));
        for (int64_t sb = 0; sb < nb / 8; sb++) {
            const int64_t off = sb * sbytes;
            const em_r8_block *xb = xq + sb * 8;
            if (type == KQ_TYPE_Q6_K) {
                em_r8_q6scales(rp, off, dw);
                for (int h = 0; h < 2; h++) { /* ql's 64 bytes, qh's 32 */
                    __m256i qh[8];
                    em_r8_load32(rp, off + 128 + 32 * h, qh);
                    for (int k1 = 0; k1 < 2; k1++) {
                        em_r8_load32(rp, off + 64 * h + 32 * k1, g);
                        for (int k2 = 0; k2 < 2; k2++) { /* block 4h + k: low (k < 2) or high nibbles */
                            const int k = k1 + 2 * k2, j = 4 * h + k;
                            EM_R8_PREFETCH();
                            for (int half = 0; half < 2; half++) {
                                for (int t = 0; t < 4; t++) {
                                    const __m256i q4 =
                                        _mm256_and_si256(_mm256_srli_epi32(g[4 * half + t], 4 * k2), low4);
                                    const __m256i q2 = _mm256_and_si256(_mm256_srli_epi32(qh[4 * half + t], 2 * k),
                                                                        _mm256_set1_epi8(3));
                                    v[t] = _mm256_or_si256(q4, _mm256_slli_epi32(q2, 4));
                                }
                                if (!x8) em_r8_pairs(v, w); /* x8 takes the codes as bytes */
                                em_r8_q6_half(x8 ? v : w, x8, half, _mm256_load_ps(dw[2 * j + half]), xb + j, nb, M,
                                              acc);
                            }
                        }
                    }
                }
                continue;
            }
            em_r8_kscales(rp, off, dw, mw);
            __m256i q5[8];
            if (type == KQ_TYPE_Q5_K) em_r8_load32(rp, off + 16, q5);
            for (int p = 0; p < 4; p++) { /* sub-blocks 2p and 2p + 1: 32 bytes' low and high nibbles */
                em_r8_load32(rp, off + (type == KQ_TYPE_Q5_K ? 48 : 16) + 32 * p, g);
                for (int hn = 0; hn < 2; hn++) {
                    const int j = 2 * p + hn;
                    EM_R8_PREFETCH();
                    for (int half = 0; half < 2; half++) {
                        for (int t = 0; t < 4; t++) {
                            v[t] = _mm256_and_si256(_mm256_srli_epi32(g[4 * half + t], 4 * hn), low4);
                            if (type == KQ_TYPE_Q5_K) /* the fifth bit: bit j of qh[l] */
                                v[t] = _mm256_or_si256(
                                    v[t], _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(q5[4 * half + t], j),
                                                                             _mm256_set1_epi8(1)),
                                                            4));
                        }
                        if (!x8) em_r8_pairs(v, w); /* x8 takes the codes as bytes */
                        em_r8_half_rows(x8 ? v : w, x8, half, _mm256_load_ps(dw[j]), _mm256_load_ps(mw[j]), 1, -1,
                                        xb + j, nb, M, part, acc);
                    }
                }
            }
        }
    } else {
        const int64_t bytes = row_bytes / nb;
        const int offset = type == EM_Q4_1 || type == EM_Q5_1;
        const int less = type == EM_Q4_0 ? EM_R8_LESS_Q4_0 : type == EM_Q5_0 ? EM_R8_LESS_Q5_0 : -1;
        const int qs_at = type == EM_Q4_1 ? 4 : type == EM_Q5_0 ? 6 : type == EM_Q5_1 ? 8 : 2;
        const int qh_at = type == EM_Q5_0 ? 2 : type == EM_Q5_1 ? 4 : 0;
        for (int64_t b = 0; b < nb; b++) {
            const int64_t off = b * bytes;
            EM_R8_PREFETCH();
            __m256i head, qh = _mm256_setzero_si256();
            if (qh_at) { /* the block's first 16 bytes hold d (and m) and qh */
                em_r8_load16(rp, off, g);
                head = g[0];
                qh = qh_at == 4 ? g[1] : _mm256_or_si256(_mm256_srli_epi32(g[0], 16), _mm256_slli_epi32(g[1], 16));
            } else {
                head = em_r8_dword(rp, off);
            }
            const __m256 dw = em_r8_f16(head, 0), mw = em_r8_f16(head, 1);
            if (type == EM_Q8_0) {
                for (int half = 0; half < 2; half++) {
                    em_r8_load16(rp, off + qs_at + 16 * half, g);
                    em_r8_pairs_signed(g, w);
                    em_r8_half_rows(w, 0, half, dw, mw, 0, -1, xq + b, nb, M, part, acc);
                }
                continue;
            }
            em_r8_load16(rp, off + qs_at, g);
            /* unrolled, so that em_r8_fifth's shuffle controls are constants */
#pragma GCC unroll 2
            for (int half = 0; half < 2; half++) { /* elements j low nibbles, j + 16 high */
#pragma GCC unroll 4
                for (int t = 0; t < 4; t++) {
                    v[t] = _mm256_and_si256(_mm256_srli_epi32(g[t], 4 * half), low4);
                    if (qh_at) v[t] = _mm256_or_si256(v[t], em_r8_fifth(qh, 2 * half + t / 2, 4 * (t % 2)));
                }
                em_r8_pairs(v, w);
                em_r8_half_rows(w, 0, half, dw, mw, offset, less, xq + b, nb, M, part, acc);
            }
        }
    }
#undef EM_R8_PREFETCH
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < nr; n++) y[m * ldy + n0 + n] = acc[m][n];
}

/* y[m * ldy + n] = W[n] . x[m] for the weight rows n0..n1 (a chunk: at most 16), 8 at a time */
static void em_rows_r8(int type, int x8, const em_r8_block *xq, const uint8_t *W, int64_t row_bytes,
                       int64_t nb, int64_t M, int64_t ldy, int64_t n0, int64_t n1, float *y) {
    for (int64_t g0 = n0; g0 < n1; g0 += 8) {
        const int64_t g1 = g0 + 8 < n1 ? g0 + 8 : n1;
        if (x8) /* two copies of the group's code, each with its one kind of x */
            em_rows_r8_group(type, 1, xq, W, row_bytes, nb, M, ldy, g0, g1, y);
        else
            em_rows_r8_group(type, 0, xq, W, row_bytes, nb, M, ldy, g0, g1, y);
    }
}

#endif /* EMBER_ROWS8_H */
