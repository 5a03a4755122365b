/* Q4_K and Q5_K, the K-quant mixes' most common types, against 8-16 rows of x in AMX's tiles
 * (Intel's Xeons since Sapphire Rapids): the amx copy of kernels.c (the avx512 one built with
 * -mamx-tile -mamx-int8) takes these here, fewer rows and every other type as the avx512 copy
 * does (vnni.h, which takes the same steps: the same bits). Their 32-value sub-blocks are blocks
 * here, each with its scale d sc and offset -dmin m (their 6-bit sc and m decoded for 16 rows at
 * once).
 *
 * x is quantized as the int16 path quantizes it (simple.h: per 32 values d = max|x| / 32767,
 * codes c, s = d * sum c), each code split into a signed high byte and an unsigned low one
 * (c = 256 hi + lo), laid out as AMX's B operand: per block 8 rows of 4 k, the rows of x side by
 * side (NC columns: M rounded up to a power of two). A chunk of 16 weight rows is the A operand,
 * a block at a time, its codes unpacked to bytes (0..31). Two tile products a block give sum q
 * hi and sum q lo exactly in int32, so 256 hi + lo is the int16 path's sum q c; then in float32,
 * one chain a weight row and row of x: y += (d_w d_x) * sum, then y += m_w * s. The q8_K passes
 * do not apply here: int16 codes per 32 values are at least as close as two.
 *
 * A block costs the tiles about the same whatever the rows (the tile products, the unpacking of
 * 16 weight rows), where vnni.h's cost grows with them. Eight and sixteen sequences of a
 * Llama-3.2-3B-shaped Q4_K_M file stepped 36.3-37.0 / 43.2-43.5 tok/s on vnni.h alone, 37.0-38.5 /
 * 48.2 with these (`bench_step.py --sequences 8 16`, 2 threads, the Xeon of README's Speed
 * section); the other types, and the small models, were as fast or faster on vnni.h (Gemma 3's
 * Q8_0 head: sixteen sequences 294-300 tok/s in the tiles, 335-339 there). Linux lends a process
 * the tiles' state when asked (arch_prctl); dispatch.c's ember_amx_permitted asks once. */
#ifndef EMBER_AMX_H
#define EMBER_AMX_H


/* fewer rows of x run as fast or faster on vnni.h (ns a block and row, K = 2,048, tiles against
 * vnni.h: Q4_K 0.59 / 0.37 at 2 rows, 0.33 / 0.28 at 4, 0.21 / 0.23 at 8) */
#define EM_AMX_MIN_ROWS 8
#define EM_AMX_MAX_ROWS 16

int ember_amx_permitted(void); /* dispatch.c: whether Linux lent this process the tiles' state */

static int em_amx_type(int type) { return type == KQ_TYPE_Q4_K || type == KQ_TYPE_Q5_K; }

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
    return em_amx_type(type) && M >= EM_AMX_MIN_ROWS && M <= EM_AMX_MAX_ROWS && ember_amx_permitted();
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
        const em_q16_block512 q = em_quantize_block512(xm); /* vnni.h */
        const __m256i h = _mm512_cvtepi16_epi8(_mm512_srai_epi16(q.c, 8)), l = _mm512_cvtepi16_epi8(q.c);
        _mm256_i32scatter_epi32(hi + m * 4, rows, h, 1);
        _mm256_i32scatter_epi32(lo + m * 4, rows, l, 1);
        for (int64_t j = m; j < 16; j += nc) ds[j] = q.d, ss[j] = q.d * (float)q.sum;
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
 * low bytes (8 rows of NC * 4), 3 and 4 the products (16 rows of NC int32). */
static void em_amx_begin(int64_t nc) {
    em_tile_config t;
    memset(&t, 0, sizeof t);
    t.palette = 1;
    t.rows[0] = 16, t.colsb[0] = EM_QK;
    for (int i = 1; i <= 2; i++) t.rows[i] = 8, t.colsb[i] = (uint16_t)(nc * 4);
    for (int i = 3; i <= 4; i++) t.rows[i] = 16, t.colsb[i] = (uint16_t)(nc * 4);
    /* GCC 12's ldtilecfg does not tell the compiler it reads t: without this its stores went */
    __asm__ volatile("" : : "m"(t) : "memory");
    _tile_loadconfig(&t);
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

/* acc += the products in chi and clo (16 weight rows of NC columns, as stored): (dw dx) (256 hi +
 * lo), then mw s */
static inline __attribute__((always_inline)) void em_amx_accumulate(__m512 *acc, int64_t vecs, int64_t nc,
                                                                    const int32_t *chi, const int32_t *clo,
                                                                    const float *dw, const float *mw,
                                                                    const float *ds) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i lane_row = _mm512_srli_epi32(iota, __builtin_ctzll((unsigned long long)nc));
    const __m512 dx = _mm512_load_ps(ds), sx = _mm512_load_ps(ds + 16);
    const __m512 dw16 = _mm512_load_ps(dw), mw16 = _mm512_load_ps(mw);
    for (int64_t v = 0; v < vecs; v++) { /* lane l of v: weight row v * 16 / nc + l / nc, column l % nc */
        const __m512i h = _mm512_load_si512(chi + v * 16), l = _mm512_load_si512(clo + v * 16);
        const __m512 sum = _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(h, 8), l));
        const __m512i row = _mm512_add_epi32(_mm512_set1_epi32((int)(v * 16 / nc)), lane_row);
        acc[v] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_permutexvar_ps(row, dw16), dx), sum, acc[v]);
        acc[v] = _mm512_fmadd_ps(_mm512_permutexvar_ps(row, mw16), sx, acc[v]);
    }
}

/* y[m * ldy + n] = W[n] . x[m] for the M rows of x prepared in `prep` and the weight rows
 * n0..n1 (at most 16: a chunk), the tiles configured by em_amx_begin for M's columns. */
static void em_rows_amx(int type, const uint8_t *prep, const uint8_t *W, int64_t row_bytes,
                        int64_t nb, int64_t M, int64_t ldy, int64_t n0, int64_t n1, float *y) {
    const int64_t nc = em_amx_cols(M), bb = em_amx_block_bytes(nc), rb = nc * 4, nr = n1 - n0;
    const int64_t bytes = row_bytes / (nb / 8); /* a superblock's: its 8 sub-blocks are blocks */
    uint8_t codes[8][16 * EM_QK] __attribute__((aligned(64)));
    float dw[8][16] __attribute__((aligned(64))), mw[8][16] __attribute__((aligned(64)));
    int32_t chi[16 * 16] __attribute__((aligned(64))), clo[16 * 16] __attribute__((aligned(64)));
    if (nr < 16) /* absent rows: zero codes (em_kscales16 reads row n0's scales for them), outputs dropped */
        for (int s = 0; s < 8; s++) memset(codes[s] + nr * EM_QK, 0, (size_t)(16 - nr) * EM_QK);
    __m512 acc[16];
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
    const int64_t vecs = (nr * nc + 15) / 16;
    const uint8_t *w0 = W + n0 * row_bytes;
    const uint8_t *rp[16];
    for (int r = 0; r < 16; r++) rp[r] = w0 + (r < nr ? r : 0) * row_bytes;
    /* the 16 rows are read side by side, a block of each at a time, which the hardware's prefetch
     * does not follow: ask for the next chunk's rows (a thread's chunks follow each other in W),
     * a few lines each block, between the products */
    const int64_t lines = 16 * row_bytes / 64, per_block = (lines + nb - 1) / nb;
    const uint8_t *next = w0 + 16 * row_bytes;
    for (int64_t s0 = 0; s0 < nb; s0 += 8) { /* a superblock a pass, unpacked before its products */
        const uint8_t *sb = w0 + s0 / 8 * bytes;
        em_kscales16(rp, s0 / 8 * bytes, dw, mw);
        for (int64_t n = 0; n < nr; n++)
            for (int j = 0; j < 8; j++)
                _mm256_store_si256((__m256i *)(codes[j] + n * EM_QK), em_amx_kcodes(type, sb + n * row_bytes, j));
        for (int s = 0; s < 8; s++) {
            for (int64_t i = 0; i < per_block; i++, next += 64) __builtin_prefetch(next);
            const uint8_t *xb = prep + (s0 + s) * bb;
            _tile_loadd(0, codes[s], EM_QK);
            _tile_loadd(1, xb, rb);
            _tile_loadd(2, xb + 8 * rb, rb);
            _tile_zero(3);
            _tile_zero(4);
            _tile_dpbusd(3, 0, 1);
            _tile_dpbuud(4, 0, 2);
            _tile_stored(3, chi, rb);
            _tile_stored(4, clo, rb);
            em_amx_accumulate(acc, vecs, nc, chi, clo, dw[s], mw[s], (const float *)(xb + 16 * rb));
        }
    }
    float out[16 * 16] __attribute__((aligned(64)));
    for (int v = 0; v < 16; v++) _mm512_store_ps(out + v * 16, acc[v]);
    for (int64_t n = 0; n < nr; n++)
        for (int64_t m = 0; m < M; m++) y[m * ldy + n0 + n] = out[n * nc + m];
}

#endif /* EMBER_AMX_H */
