/* The 32-element types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL), Q4_K and Q5_K against 2-16 rows
 * of x in AMX's tiles (Intel's Xeons since Sapphire Rapids), and Q6_K against 6-16: the amx copy
 * of kernels.c (the avx512 one built with -mamx-tile -mamx-int8) takes these here, everything
 * else as avx512 does. Q4_K's and Q5_K's 32-value sub-blocks are blocks here, each with its scale
 * d sc and offset -dmin m (their 6-bit sc and m decoded for 16 rows at once). Q6_K's 16-value
 * sub-blocks, each with its int8 scale, take half a block's tiles each (signed codes q - 32, no
 * offset): twice the tile products of a block, so fewer than 6 rows keep the q8_K kernel.
 *
 * x is quantized as the int16 path quantizes it (simple.h: per 32 values d = max|x| / 32767,
 * codes c, s = d * sum c), each code split into a signed high byte and an unsigned low one
 * (c = 256 hi + lo), laid out as AMX's B operand: per block 8 rows of 4 k, the rows of x side by
 * side (NC columns: M rounded up to a power of two). A chunk of 16 weight rows is the A operand,
 * a block at a time: Q8_0's codes straight from the file, the others' unpacked to bytes (0..15
 * or 0..31; Q4_0's and Q5_0's less 8 and 16; IQ4_NL's table values). Two tile products a block
 * give sum q hi and sum q lo exactly in int32, so 256 hi + lo is the int16 path's sum q c; then
 * in float32, one chain a weight row and row of x: y += (d_w d_x) * sum, then where w = d_w q +
 * m_w has an offset (Q4_1, Q5_1: the file's m; the K types' -dmin m) y += m_w * s. The K
 * types' q8_K passes do not apply here: int16 codes per 32 values are at least as close as two.
 * A row's steps do not depend on the rows beside it, so its bits are the same in any batch of
 * 2-16.
 *
 * A block costs about the same whatever the rows (the tile products, the unpacking of 16 weight
 * rows): one row of x (a lone sequence's decode) stays on the avx512 path, faster there, so that
 * row's bits differ from its bits in a batch in the last places. Measured
 * on a Sapphire Rapids-class Xeon, 2 threads, weights from memory (`bench_simple_types.py --k 576
 * --mib 32 --rows 1 2 8`), ns a block and row, amx against avx512: Q4_1 1.36 / 1.07 (one row),
 * 0.65-0.69 / 0.65-0.67 (two), 0.25-0.29 / 0.36-0.37 (eight); Q8_0 1.05-1.09 / 1.14-1.19, 0.54-0.56
 * / 0.69-0.72, 0.21-0.24 / 0.35. Linux lends a process the tiles' state when asked (arch_prctl);
 * dispatch.c's ember_amx_permitted asks once. */
#ifndef EMBER_AMX_H
#define EMBER_AMX_H


#define EM_AMX_MIN_ROWS 2
/* Q6_K's sub-blocks take twice the tile products a block: fewer rows of x than these run faster
 * on the avx512 path's q8_K kernel (ns a block and row at 2, 4, 6 and 8 rows: 0.99, 0.53, 0.46,
 * 0.36 against 0.50, 0.50, 0.51, 0.53) */
#define EM_AMX_MIN_ROWS_Q6_K 6
#define EM_AMX_MAX_ROWS 16

int ember_amx_permitted(void); /* dispatch.c: whether Linux lent this process the tiles' state */

static int em_amx_ktype(int type) {
    return type == KQ_TYPE_Q4_K || type == KQ_TYPE_Q5_K || type == KQ_TYPE_Q6_K;
}
static int em_amx_type(int type) {
    return type == EM_Q4_0 || type == EM_Q4_1 || type == EM_Q5_0 || type == EM_Q5_1 || type == EM_Q8_0 ||
           type == EM_IQ4_NL || em_amx_ktype(type);
}

/* columns of B and C: rows of x side by side, M rounded up to a power of two */
static int64_t em_amx_cols(int64_t M) {
    int64_t nc = 1;
    while (nc < M) nc *= 2;
    return nc;
}

/* bytes a block of prepared x takes: hi and lo (8 rows of NC * 4 bytes), then 16 d and 16 s
 * (lane l holds column l % NC's: the float steps' lanes hold 16 / NC weight rows' columns) */
static int64_t em_amx_block_bytes(int64_t nc) { return 2 * 8 * nc * 4 + 2 * 16 * 4; }

/* Whether M rows of x against a weight of `type` take the tiles */
static int em_amx_takes(int type, int64_t M) {
    const int64_t least = type == KQ_TYPE_Q6_K ? EM_AMX_MIN_ROWS_Q6_K : EM_AMX_MIN_ROWS;
    return em_amx_type(type) && M >= least && M <= EM_AMX_MAX_ROWS && ember_amx_permitted();
}

/* Quantizes x's row m (nb blocks) into column m of the prepared blocks, as simple.h's
 * em_quantize_row_q16 (the same d, codes and s), in registers; the last row (m = M - 1) also
 * clears the columns of absent rows. */
static void em_amx_prepare_row(uint8_t *prep, const float *xm, int64_t nb, int64_t m, int64_t M) {
    const int64_t nc = em_amx_cols(M), bb = em_amx_block_bytes(nc), rb = nc * 4;
    /* dword r of a block's 32 bytes goes to row r of the tile: rb bytes apart */
    const __m256i rows =
        _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)rb));
    for (int64_t b = 0; b < nb; b++, xm += EM_QK) {
        uint8_t *hi = prep + b * bb, *lo = hi + 8 * rb;
        float *ds = (float *)(lo + 8 * rb), *ss = ds + 16;
        const __m512 x0 = _mm512_loadu_ps(xm), x1 = _mm512_loadu_ps(xm + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        const float d = amax / 32767.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m512i c0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, _mm512_set1_ps(id)));
        const __m512i c1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, _mm512_set1_ps(id)));
        const int sum = _mm512_reduce_add_epi32(_mm512_add_epi32(c0, c1));
        const __m256i c0w = _mm512_cvtepi32_epi16(c0), c1w = _mm512_cvtepi32_epi16(c1);
        const __m512i c = _mm512_inserti64x4(_mm512_castsi256_si512(c0w), c1w, 1);
        const __m256i h = _mm512_cvtepi16_epi8(_mm512_srai_epi16(c, 8)), l = _mm512_cvtepi16_epi8(c);
        _mm256_i32scatter_epi32(hi + m * 4, rows, h, 1);
        _mm256_i32scatter_epi32(lo + m * 4, rows, l, 1);
        for (int64_t j = m; j < 16; j += nc) ds[j] = d, ss[j] = d * (float)sum;
        if (m + 1 == M)
            for (int64_t a = M; a < nc; a++) {
                _mm256_i32scatter_epi32(hi + a * 4, rows, _mm256_setzero_si256(), 1);
                _mm256_i32scatter_epi32(lo + a * 4, rows, _mm256_setzero_si256(), 1);
                for (int64_t j = a; j < 16; j += nc) ds[j] = ss[j] = 0.0f;
            }
    }
}

typedef struct {
    uint8_t palette, start;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} em_tile_config;

/* This thread's tiles for NC columns: 0 the weights (16 rows of 32 codes), 1 and 2 x's high and
 * low bytes (8 rows of NC * 4), 3 and 4 the products (16 rows of NC int32); 5, 6 and 7 as 0, 1
 * and 2 for half a block (Q6_K's 16-value sub-blocks). */
static void em_amx_begin(int64_t nc) {
    em_tile_config t;
    memset(&t, 0, sizeof t);
    t.palette = 1;
    t.rows[0] = 16, t.colsb[0] = EM_QK;
    t.rows[5] = 16, t.colsb[5] = EM_QK / 2;
    for (int i = 1; i <= 2; i++) t.rows[i] = 8, t.colsb[i] = (uint16_t)(nc * 4);
    for (int i = 6; i <= 7; i++) t.rows[i] = 4, t.colsb[i] = (uint16_t)(nc * 4);
    for (int i = 3; i <= 4; i++) t.rows[i] = 16, t.colsb[i] = (uint16_t)(nc * 4);
    /* GCC 12's ldtilecfg does not tell the compiler it reads t: without this its stores went */
    __asm__ volatile("" : : "m"(t) : "memory");
    _tile_loadconfig(&t);
}

/* A block's 32 codes of 16 bytes of nibbles (element j low, j + 16 high), through `table`
 * where given (IQ4_NL), with the fifth bits of qh (bit j for element j) where given */
static inline __m256i em_amx_nibbles(const uint8_t *q, const uint8_t *qh, const __m128i *table) {
    const __m128i low4 = _mm_set1_epi8(15), v = _mm_loadu_si128((const __m128i *)q);
    __m128i lo = _mm_and_si128(v, low4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low4);
    if (table) lo = _mm_shuffle_epi8(*table, lo), hi = _mm_shuffle_epi8(*table, hi);
    __m256i all = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
    if (qh) {
        uint32_t bits;
        memcpy(&bits, qh, 4);
        all = _mm256_or_si256(all, _mm256_and_si256(_mm256_movm_epi8(bits), _mm256_set1_epi8(16)));
    }
    return all;
}

/* The block at w (of the first of nr <= 16 weight rows, row_bytes apart) of each row as 32
 * bytes (codes; NULL: the scales alone), its scale (dw) and offset (mw); the codes signed for
 * Q8_0 and IQ4_NL, and for Q4_0 and Q5_0 less their offset (q - 8, q - 16: then no offset to add
 * a block and row) */
static inline __attribute__((always_inline)) void em_amx_unpack16(int type, const uint8_t *w,
                                                                  int64_t row_bytes, int64_t nr,
                                                                  uint8_t *codes, float *dw, float *mw) {
    const __m128i table = _mm_loadu_si128((const __m128i *)em_kvalues_iq4nl);
    /* each row's first 4 bytes: d, then m (Q4_1, Q5_1) or qh's first half */
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i at = _mm512_mullo_epi32(iota, _mm512_set1_epi32((int)row_bytes));
    const __mmask16 rows = (__mmask16)((1u << nr) - 1);
    const __m512i head = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), rows, at, w, 1);
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
    _mm512_store_ps(dw, d);
    switch (type) {
    case EM_Q4_1:
    case EM_Q5_1: /* m: the high half of each row's first 4 bytes */
        _mm512_store_ps(mw, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16))));
        break;
    default: _mm512_store_ps(mw, _mm512_setzero_ps());
    }
    if (!codes) return;
    for (int64_t n = 0; n < nr; n++, w += row_bytes) {
        __m256i c;
        switch (type) {
        case EM_Q8_0: c = _mm256_loadu_si256((const __m256i *)(w + 2)); break;
        case EM_Q4_0: c = _mm256_sub_epi8(em_amx_nibbles(w + 2, 0, 0), _mm256_set1_epi8(8)); break;
        case EM_Q4_1: c = em_amx_nibbles(w + 4, 0, 0); break;
        case EM_Q5_0: c = _mm256_sub_epi8(em_amx_nibbles(w + 6, w + 2, 0), _mm256_set1_epi8(16)); break;
        case EM_Q5_1: c = em_amx_nibbles(w + 8, w + 4, 0); break;
        default: c = em_amx_nibbles(w + 2, 0, &table); break; /* IQ4_NL */
        }
        _mm256_store_si256((__m256i *)(codes + n * EM_QK), c);
    }
}

/* Q4_K and Q5_K: the 8 sub-blocks of 32 of the superblock at w (of the first of nr <= 16 weight
 * rows) as scales dw[j] = d * sc_j and offsets mw[j] = -(dmin * m_j) of each row (kquants.h's
 * kq_scales_k4 on 16 rows at once; rows past nr: 0) */
static inline void em_amx_kscales16(const uint8_t *w, int64_t row_bytes, int64_t nr, float dw[][16],
                                    float mw[][16]) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i at = _mm512_mullo_epi32(iota, _mm512_set1_epi32((int)row_bytes));
    const __m512i zero = _mm512_setzero_si512();
    const __mmask16 rows = (__mmask16)((1u << nr) - 1);
    const __m512i head = _mm512_mask_i32gather_epi32(zero, rows, at, w, 1);
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
    const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(head, 16)));
    __m512i u0 = _mm512_mask_i32gather_epi32(zero, rows, at, w + 4, 1);
    __m512i u1 = _mm512_mask_i32gather_epi32(zero, rows, at, w + 8, 1);
    __m512i u2 = _mm512_mask_i32gather_epi32(zero, rows, at, w + 12, 1);
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

/* sub-block j's 32 codes of a Q4_K or Q5_K superblock b */
static inline __m256i em_amx_kcodes(int type, const uint8_t *b, int j) {
    const uint8_t *q = b + (type == KQ_TYPE_Q5_K ? 48 : 16) + (j / 2) * 32;
    const __m256i low4 = _mm256_set1_epi8(15);
    const __m256i v = _mm256_loadu_si256((const __m256i *)q);
    __m256i c = _mm256_and_si256(_mm256_srli_epi16(v, 4 * (j % 2)), low4);
    if (type == KQ_TYPE_Q5_K) { /* the fifth bit: bit j of qh[l] */
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 16));
        const __m256i bit = _mm256_and_si256(_mm256_srli_epi16(qh, j), _mm256_set1_epi8(1));
        c = _mm256_or_si256(c, _mm256_slli_epi16(bit, 4));
    }
    return c;
}

/* Q6_K: the 16 sub-blocks' scales dw[j] = d * sc_j of the superblock at w, for 16 rows (rows past
 * nr: 0) */
static inline void em_amx_q6scales16(const uint8_t *w, int64_t row_bytes, int64_t nr, float dw[][16]) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i at = _mm512_mullo_epi32(iota, _mm512_set1_epi32((int)row_bytes));
    const __m512i zero = _mm512_setzero_si512();
    const __mmask16 rows = (__mmask16)((1u << nr) - 1);
    /* d is the superblock's last 2 bytes: read with the 2 before them, inside the block */
    const __m512i tail = _mm512_mask_i32gather_epi32(zero, rows, at, w + 206, 1);
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(tail, 16)));
    for (int g = 0; g < 4; g++) { /* scales 4g..4g+3: int8 at 192 */
        const __m512i u = _mm512_mask_i32gather_epi32(zero, rows, at, w + 192 + 4 * g, 1);
        for (int k = 0; k < 4; k++) {
            const __m512i sc = _mm512_srai_epi32(_mm512_slli_epi32(u, 24 - 8 * k), 24);
            _mm512_store_ps(dw[4 * g + k], _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
        }
    }
}

/* Q6_K: the 8 blocks of 32 signed codes (q - 32) of the superblock b, into row n of codes[j] */
static inline void em_amx_q6codes(const uint8_t *b, uint8_t codes[][16 * EM_QK], int64_t n) {
    const __m256i low4 = _mm256_set1_epi8(15), two = _mm256_set1_epi8(3), off = _mm256_set1_epi8(32);
    for (int h = 0; h < 2; h++) { /* each half: ql's 64 bytes, qh's 32 */
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)(b + 64 * h));
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(b + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b + 128 + 32 * h));
        for (int k = 0; k < 4; k++) { /* block 4h + k: ql's low (k < 2) or high nibbles, qh's bits 2k */
            const __m256i l = k & 1 ? l1 : l0;
            const __m256i q4 = _mm256_and_si256(k < 2 ? l : _mm256_srli_epi16(l, 4), low4);
            const __m256i q2 = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), two);
            const __m256i q = _mm256_sub_epi8(_mm256_or_si256(q4, _mm256_slli_epi16(q2, 4)), off);
            _mm256_store_si256((__m256i *)(codes[4 * h + k] + n * EM_QK), q);
        }
    }
}

/* acc += the products in chi and clo (16 weight rows of NC columns, as stored): (dw dx) (256 hi +
 * lo), then where offset, mw s */
static inline __attribute__((always_inline)) void em_amx_accumulate(__m512 *acc, int64_t vecs, int64_t nc,
                                                                    const int32_t *chi, const int32_t *clo,
                                                                    const float *dw, const float *mw,
                                                                    const float *ds, int offset) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i lane_row = _mm512_srli_epi32(iota, __builtin_ctzll((unsigned long long)nc));
    const __m512 dx = _mm512_load_ps(ds), sx = _mm512_load_ps(ds + 16);
    const __m512 dw16 = _mm512_load_ps(dw), mw16 = _mm512_load_ps(mw);
    for (int64_t v = 0; v < vecs; v++) { /* lane l of v: weight row v * 16 / nc + l / nc, column l % nc */
        const __m512i h = _mm512_load_si512(chi + v * 16), l = _mm512_load_si512(clo + v * 16);
        const __m512 sum = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(h, 8), l));
        const __m512i row = _mm512_add_epi32(_mm512_set1_epi32((int)(v * 16 / nc)), lane_row);
        acc[v] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_permutexvar_ps(row, dw16), dx), sum, acc[v]);
        if (offset) acc[v] = _mm512_fmadd_ps(_mm512_permutexvar_ps(row, mw16), sx, acc[v]);
    }
}

/* blocks a pass unpacks before their tile products: their stores long done when the tiles load
 * them, and each weight row read EM_AMX_SEG blocks at a time */
#define EM_AMX_SEG 8

/* y[m * ldy + n] = W[n] . x[m] for the M rows of x prepared in `prep` and the weight rows
 * n0..n1 (at most 16: a chunk), the tiles configured by em_amx_begin for M's columns. */
static void em_rows_amx(int type, const uint8_t *prep, const uint8_t *W, int64_t row_bytes,
                        int64_t nb, int64_t M, int64_t ldy, int64_t n0, int64_t n1, float *y) {
    const int64_t nc = em_amx_cols(M), bb = em_amx_block_bytes(nc), rb = nc * 4, nr = n1 - n0;
    const int ktype = em_amx_ktype(type); /* blocks are the sub-blocks of 256-value superblocks */
    const int64_t bytes = ktype ? row_bytes / (nb / 8) : row_bytes / nb; /* a superblock's, or block's */
    const int q6 = type == KQ_TYPE_Q6_K; /* signed codes, a scale each 16 values */
    const int signed_codes = type == EM_Q8_0 || type == EM_IQ4_NL || type == EM_Q4_0 || type == EM_Q5_0 || q6;
    const int offset = !signed_codes;
    const int direct = type == EM_Q8_0 && nr == 16; /* Q8_0's codes tiled straight from the file */
    uint8_t codes[EM_AMX_SEG][16 * EM_QK] __attribute__((aligned(64)));
    /* a block's scales and offsets (Q6_K: dw a half block's) */
    float dw[2 * EM_AMX_SEG][16] __attribute__((aligned(64))), mw[EM_AMX_SEG][16] __attribute__((aligned(64)));
    int32_t chi[16 * 16] __attribute__((aligned(64))), clo[16 * 16] __attribute__((aligned(64)));
    if (nr < 16) /* absent rows: zero codes (and scales: em_amx_unpack16), outputs dropped */
        for (int s = 0; s < EM_AMX_SEG; s++) memset(codes[s] + nr * EM_QK, 0, (size_t)(16 - nr) * EM_QK);
    __m512 acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    const int64_t vecs = (nr * nc + 15) / 16;
    const uint8_t *w0 = W + n0 * row_bytes;
    /* the 16 rows are read side by side, a block of each at a time, which the hardware's prefetch
     * does not follow: ask for the next chunk's rows (a thread's chunks follow each other in W),
     * a few lines each block, between the products */
    const int64_t lines = 16 * row_bytes / 64, per_block = (lines + nb - 1) / nb;
    const uint8_t *next = w0 + 16 * row_bytes;
    for (int64_t s0 = 0; s0 < nb; s0 += EM_AMX_SEG) {
        const int64_t segs = nb - s0 < EM_AMX_SEG ? nb - s0 : EM_AMX_SEG;
        if (ktype) { /* a pass is a superblock (nb a multiple of 8) */
            const uint8_t *sb = w0 + s0 / 8 * bytes;
            if (q6) {
                em_amx_q6scales16(sb, row_bytes, nr, dw);
                for (int64_t n = 0; n < nr; n++) em_amx_q6codes(sb + n * row_bytes, codes, n);
            } else {
                em_amx_kscales16(sb, row_bytes, nr, dw, mw);
                for (int64_t n = 0; n < nr; n++)
                    for (int j = 0; j < 8; j++)
                        _mm256_store_si256((__m256i *)(codes[j] + n * EM_QK),
                                           em_amx_kcodes(type, sb + n * row_bytes, j));
            }
        }
        for (int64_t s = 0; s < segs && !ktype; s++) {
            const uint8_t *wb = w0 + (s0 + s) * bytes;
            uint8_t *cs = direct ? 0 : codes[s];
            switch (type) { /* each type's own loop */
#define EM_AMX_UNPACK(T) em_amx_unpack16(T, wb, row_bytes, nr, cs, dw[s], mw[s])
            case EM_Q4_0: EM_AMX_UNPACK(EM_Q4_0); break;
            case EM_Q4_1: EM_AMX_UNPACK(EM_Q4_1); break;
            case EM_Q5_0: EM_AMX_UNPACK(EM_Q5_0); break;
            case EM_Q5_1: EM_AMX_UNPACK(EM_Q5_1); break;
            case EM_Q8_0: EM_AMX_UNPACK(EM_Q8_0); break;
            default: EM_AMX_UNPACK(EM_IQ4_NL);
#undef EM_AMX_UNPACK
            }
        }
        for (int64_t s = 0; s < segs; s++) {
            const int64_t b = s0 + s;
            for (int64_t i = 0; i < per_block; i++, next += 64) __builtin_prefetch(next);
            const uint8_t *xb = prep + b * bb;
            const float *ds = (const float *)(xb + 16 * rb);
            if (q6) { /* two halves of 16 values (4 rows of B each), each with its scales */
                for (int t = 0; t < 2; t++) {
                    _tile_loadd(5, codes[s] + t * EM_QK / 2, EM_QK);
                    _tile_loadd(6, xb + t * 4 * rb, rb);
                    _tile_loadd(7, xb + (8 + t * 4) * rb, rb);
                    _tile_zero(3);
                    _tile_zero(4);
                    _tile_dpbssd(3, 5, 6);
                    _tile_dpbsud(4, 5, 7);
                    _tile_stored(3, chi, rb);
                    _tile_stored(4, clo, rb);
                    em_amx_accumulate(acc, vecs, nc, chi, clo, dw[2 * s + t], mw[0], ds, 0);
                }
                continue;
            }
            if (direct)
                _tile_loadd(0, w0 + b * bytes + 2, row_bytes);
            else
                _tile_loadd(0, codes[s], EM_QK);
            _tile_loadd(1, xb, rb);
            _tile_loadd(2, xb + 8 * rb, rb);
            _tile_zero(3);
            _tile_zero(4);
            if (signed_codes) {
                _tile_dpbssd(3, 0, 1);
                _tile_dpbsud(4, 0, 2);
            } else {
                _tile_dpbusd(3, 0, 1);
                _tile_dpbuud(4, 0, 2);
            }
            _tile_stored(3, chi, rb);
            _tile_stored(4, clo, rb);
            em_amx_accumulate(acc, vecs, nc, chi, clo, dw[s], mw[s], ds, offset);
        }
    }
    float out[16 * 16] __attribute__((aligned(64)));
    for (int v = 0; v < 16; v++) _mm512_store_ps(out + v * 16, acc[v]);
    for (int64_t n = 0; n < nr; n++)
        for (int64_t m = 0; m < M; m++) y[m * ldy + n0 + n] = out[n * nc + m];
}

#endif /* EMBER_AMX_H */
