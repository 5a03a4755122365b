/* AMX's tiles (Intel's Xeons since Sapphire Rapids) in the amx copy of kernels.c (the avx512 one
 * built with -mamx-tile -mamx-int8): a prompt's products (below: gemm8's and gemm16's panels,
 * every type but Q6_K), and Q4_K and Q5_K, the K-quant mixes' most common types, against 8-16
 * rows of x (here); fewer rows and every other type as the avx512 copy takes them (vnni.h, which
 * takes the same steps: the same bits). Their 32-value sub-blocks are blocks
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

/* ---- A prompt's products in the tiles: gemm8.h's and gemm16.h's panels ----
 *
 * A pair of gemm8.h's panels (em_g8_pack: 16 weight rows each, a 32-value block 8 lines of 64
 * bytes, line g holding the 16 rows' codes 4g..4g+3) is AMX's B operand as it stands; 16 rows of
 * x's codes of a block are the A operand, read where they lie (x's rows, xrb bytes apart). One
 * tile product a block gives the int32 sums that gemm8.h's vpdpbusd chains give (each exact), and
 * the float steps after it are em_g8_tile's (gemm8) and em_g16_tile's (gemm16) in the same order:
 * the same bits as the avx512 path. For gemm16, x's int16 codes c are split into a signed high byte
 * and an unsigned low one (c = 256 hi + lo) and the panels' codes are the signed ones gemm16.h
 * takes (gemm8's less the type's centre): sum = 256 (hi . w) + lo . w, exact in int32. Q6_K
 * (16-value units; int16 codes in gemm16) keeps the avx512 panels.
 *
 * The tiles do a block's 16 x 16 x 32 products in one instruction where vpdpbusd takes 128; the
 * float steps (a cvt, a mul and two FMAs a row of x and block) are what is left, and they bound
 * it: a block's products must leave the tiles before the next block's (the scales differ), so
 * each is stored and read back. On the Xeon of README's Speed section, one thread, a loop of four
 * tile products a block took 34 ns, their float steps alone 56 ns, both 91-100 ns, or 76 ns with
 * block u's steps between block u + 1's products and their stores (as here); gemm8's products
 * (512 rows of x) ran 1.1-1.2x as fast as the avx512 path's, gemm16's ~1.4x
 * (`benchmarks/bench_gemm8.py --threads 1 --isa amx|avx512 [--kernel gemm16]`). */

/* Tiles of the panels: 0 and 1 16 rows of x (32 codes of a block: two groups of rows for gemm8,
 * the high and low bytes of one group for gemm16), 2 and 3 a block of the two panels (8 lines of
 * 64 bytes), 4-7 products (16 rows of x by 16 weight rows, int32). */
static void em_amx_panels_begin(void) {
    em_tile_config t;
    memset(&t, 0, sizeof t);
    t.palette = 1;
    for (int i = 0; i <= 1; i++) t.rows[i] = 16, t.colsb[i] = EM_QK;
    for (int i = 2; i <= 3; i++) t.rows[i] = 8, t.colsb[i] = 64;
    for (int i = 4; i <= 7; i++) t.rows[i] = 16, t.colsb[i] = 64;
    __asm__ volatile("" : : "m"(t) : "memory"); /* as em_amx_begin's */
    _tile_loadconfig(&t);
}

/* Whether a prompt's products with `type` take the tiles: a 32-value unit whose codes fit a byte */
static int em_amx_panel_type(int type) { return em_g8_unit(type) == EM_QK && ember_amx_permitted(); }

/* acc (16 rows of x by a panel's 16 weight rows, in memory) += the products in c (with clo: 256 c
 * + clo) as em_g8_tile and em_g16_tile do: t = sum * dx, acc = fma(t, s, acc), then (where
 * `offsets`) acc = fma(o, sx, acc); row i's dx and sx at dx[i * step] and sx[i * step] */
static inline __attribute__((always_inline)) void em_amx_steps(float *acc, const int32_t *c, const int32_t *clo,
                                                               const float *ps, const float *po, const float *dx,
                                                               const float *sx, int64_t step, const int offsets) {
    const __m512 s = _mm512_load_ps(ps), o = _mm512_load_ps(po);
    for (int i = 0; i < 16; i++) {
        __m512i sum = _mm512_load_si512(c + 16 * i);
        if (clo) sum = _mm512_add_epi32(_mm512_slli_epi32(sum, 8), _mm512_load_si512(clo + 16 * i));
        const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(dx[i * step]));
        __m512 a = _mm512_fmadd_ps(t, s, _mm512_load_ps(acc + 16 * i));
        if (offsets) a = _mm512_fmadd_ps(o, _mm512_set1_ps(sx[i * step]), a);
        _mm512_store_ps(acc + 16 * i, a);
    }
}

/* keep[p]: which of panel p's 16 weight rows are present, nr of the pair's 32 */
static inline void em_amx_keep(int nr, __mmask16 *keep) {
    for (int p = 0; p < 2; p++) {
        const int rows = nr - 16 * p;
        keep[p] = (__mmask16)(rows >= 16 ? 0xffff : rows <= 0 ? 0 : (1u << rows) - 1);
    }
}

/* acc's 16 rows of x by 2 panels (acc[p]) to y; keep[p]: the panels' weight rows present */
static inline void em_amx_store(float (*acc)[256], float *y, int64_t ldy, int rows, const __mmask16 *keep) {
    for (int i = 0; i < rows; i++)
        for (int p = 0; p < 2; p++) _mm512_mask_storeu_ps(y + i * ldy + 16 * p, keep[p], _mm512_load_ps(acc[p] + 16 * i));
}

/* ng (1 or 2, a constant) groups of 16 rows of gemm8's x (xrb bytes apart) against two panels
 * (codes, ps and po: the second a panel on: K * 16 codes, K / 32 * 16 floats). Block u's float
 * steps run while the tiles make block u + 1's products, stored after them (see above). */
static inline __attribute__((always_inline)) void em_g8_amx(const uint8_t *codes, const float *ps, const float *po,
                                                            int64_t K, const uint8_t *xq, int64_t xrb, float *y,
                                                            int64_t ldy, const __mmask16 *keep, const int ng) {
    const int64_t units = K / EM_QK, pc = K * EM_G8_NR, pu = units * EM_G8_NR, step = xrb / 4;
    const float *d = (const float *)(xq + K), *sums = d + units; /* row 0's d and d * sum q a unit */
    int32_t c[2][4][256] __attribute__((aligned(64))); /* products of alternate blocks */
    float acc[4][256] __attribute__((aligned(64)));
    memset(acc, 0, sizeof acc);
    for (int64_t u = 0; u <= units; u++) {
        if (u < units) { /* block u's products */
            _tile_loadd(0, xq + u * EM_QK, xrb);
            _tile_loadd(2, codes + u * EM_QK * EM_G8_NR, 64);
            _tile_loadd(3, codes + pc + u * EM_QK * EM_G8_NR, 64);
            _tile_zero(4);
            _tile_zero(5);
            _tile_dpbsud(4, 0, 2);
            _tile_dpbsud(5, 0, 3);
            if (ng == 2) {
                _tile_loadd(1, xq + 16 * xrb + u * EM_QK, xrb);
                _tile_zero(6);
                _tile_zero(7);
                _tile_dpbsud(6, 1, 2);
                _tile_dpbsud(7, 1, 3);
            }
        }
        if (u > 0) { /* block u - 1's float steps */
            const int64_t b = u - 1;
            for (int g = 0; g < ng; g++)
                for (int p = 0; p < 2; p++)
                    em_amx_steps(acc[2 * g + p], c[b % 2][2 * g + p], 0, ps + p * pu + b * 16, po + p * pu + b * 16,
                                 d + 16 * g * step + b, sums + 16 * g * step + b, step, 1);
        }
        if (u < units) {
            _tile_stored(4, c[u % 2][0], 64);
            _tile_stored(5, c[u % 2][1], 64);
            if (ng == 2) {
                _tile_stored(6, c[u % 2][2], 64);
                _tile_stored(7, c[u % 2][3], 64);
            }
        }
    }
    for (int g = 0; g < ng; g++) em_amx_store(acc + 2 * g, y + 16 * g * ldy, ldy, 16, keep);
}

/* two of gemm8's panels (as em_g8_amx) against M rows of x: 32 or 16 at a time in the tiles, the
 * rest as the avx512 path takes them (em_g8_tile: the same bits); nr: the weight rows present */
static void em_g8_panels_amx(const uint8_t *codes, const float *ps, const float *po, int64_t K,
                             const uint8_t *xq, int64_t xrb, int64_t M, float *y, int64_t ldy, int nr) {
    __mmask16 keep[2];
    em_amx_keep(nr, keep);
    int64_t m = 0;
    for (; m + 32 <= M; m += 32) em_g8_amx(codes, ps, po, K, xq + m * xrb, xrb, y + m * ldy, ldy, keep, 2);
    for (; m + 16 <= M; m += 16) em_g8_amx(codes, ps, po, K, xq + m * xrb, xrb, y + m * ldy, ldy, keep, 1);
    for (int p = 0; p < 2 && keep[p]; p++) {
        const uint8_t *cp = codes + p * K * EM_G8_NR;
        const float *sp = ps + p * (K / EM_QK) * EM_G8_NR, *op = po + p * (K / EM_QK) * EM_G8_NR;
        int64_t r = m;
        for (; r + EM_G8_MR <= M; r += EM_G8_MR)
            em_g8_tile(cp, sp, op, EM_QK, K, xq + r * xrb, xrb, y + r * ldy + 16 * p, ldy, keep[p], EM_G8_MR);
        for (; r < M; r++) em_g8_tile(cp, sp, op, EM_QK, K, xq + r * xrb, xrb, y + r * ldy + 16 * p, ldy, keep[p], 1);
    }
}

/* gemm16's x (M rows of K / 32 em_block_q16) as the tiles take it: per row and block its 32
 * codes' high bytes, then their low bytes (2K bytes a row); rows M.. up to a multiple of 16 zero */
static void em_amx_split_q16(const em_block_q16 *xq, int64_t M, int64_t K, uint8_t *split) {
    const int64_t nb = K / EM_QK, padded = (M + 15) / 16 * 16;
    for (int64_t m = 0; m < padded; m++) {
        uint8_t *row = split + m * 2 * K;
        if (m >= M) {
            memset(row, 0, (size_t)(2 * K));
            continue;
        }
        for (int64_t b = 0; b < nb; b++) {
            const __m512i c = _mm512_loadu_si512((const void *)xq[m * nb + b].qs);
            _mm256_storeu_si256((__m256i *)(row + 64 * b), _mm512_cvtepi16_epi8(_mm512_srai_epi16(c, 8)));
            _mm256_storeu_si256((__m256i *)(row + 64 * b + 32), _mm512_cvtepi16_epi8(c));
        }
    }
}

/* a panel of em_g8_pack's codes as gemm16's signed ones: less the type's centre (gemm16.h) */
static void em_amx_centre_codes(int type, uint8_t *codes, int64_t K) {
    const int c = em_g16_centre(type);
    if (!c) return;
    const __m512i cc = _mm512_set1_epi8((char)c);
    for (int64_t i = 0; i < K * EM_G8_NR; i += 64)
        _mm512_store_si512((void *)(codes + i), _mm512_sub_epi8(_mm512_load_si512((const void *)(codes + i)), cc));
}

/* 16 rows of gemm16's x (split: em_amx_split_q16's rows; blocks: their d and s, rows from `rows`
 * on read as the last) against two panels (em_amx_centre_codes'; as em_g8_amx, block u's float
 * steps while the tiles make block u + 1's products) */
static inline __attribute__((always_inline)) void em_g16_amx(const uint8_t *codes, const float *ps, const float *po,
                                                             int64_t K, const uint8_t *split,
                                                             const em_block_q16 *blocks, int rows, float *y,
                                                             int64_t ldy, const __mmask16 *keep, const int offsets) {
    const int64_t nb = K / EM_QK, pc = K * EM_G8_NR, pu = nb * EM_G8_NR;
    int32_t c[2][4][256] __attribute__((aligned(64))); /* high and low products of each panel */
    float acc[2][256] __attribute__((aligned(64)));
    float d[2][16], s[2][16];
    memset(acc, 0, sizeof acc);
    for (int64_t u = 0; u <= nb; u++) {
        if (u < nb) {
            _tile_loadd(0, split + 64 * u, 2 * K);
            _tile_loadd(1, split + 64 * u + 32, 2 * K);
            _tile_loadd(2, codes + u * EM_QK * EM_G8_NR, 64);
            _tile_loadd(3, codes + pc + u * EM_QK * EM_G8_NR, 64);
            _tile_zero(4);
            _tile_zero(5);
            _tile_zero(6);
            _tile_zero(7);
            _tile_dpbssd(4, 0, 2);
            _tile_dpbusd(5, 1, 2);
            _tile_dpbssd(6, 0, 3);
            _tile_dpbusd(7, 1, 3);
            for (int i = 0; i < 16; i++) {
                const em_block_q16 *b = blocks + (i < rows ? i : rows - 1) * nb + u;
                d[u % 2][i] = b->d, s[u % 2][i] = b->s;
            }
        }
        if (u > 0) {
            const int64_t b = u - 1;
            for (int p = 0; p < 2; p++)
                em_amx_steps(acc[p], c[b % 2][2 * p], c[b % 2][2 * p + 1], ps + p * pu + b * 16, po + p * pu + b * 16,
                             d[b % 2], s[b % 2], 1, offsets);
        }
        if (u < nb) {
            _tile_stored(4, c[u % 2][0], 64);
            _tile_stored(5, c[u % 2][1], 64);
            _tile_stored(6, c[u % 2][2], 64);
            _tile_stored(7, c[u % 2][3], 64);
        }
    }
    em_amx_store(acc, y, ldy, rows, keep);
}

/* two panels (as em_g8_amx's) against M rows of gemm16's x, 16 at a time (the last rows'
 * padding in `split`); affine: whether the type has offsets */
static void em_g16_panels_amx(const uint8_t *codes, const float *ps, const float *po, int affine, int64_t K,
                              const uint8_t *split, const em_block_q16 *xq, int64_t M, float *y, int64_t ldy,
                              int nr) {
    __mmask16 keep[2];
    em_amx_keep(nr, keep);
    const int64_t nb = K / EM_QK;
    for (int64_t m = 0; m < M; m += 16) {
        const int rows = M - m < 16 ? (int)(M - m) : 16;
        if (affine)
            em_g16_amx(codes, ps, po, K, split + m * 2 * K, xq + m * nb, rows, y + m * ldy, ldy, keep, 1);
        else
            em_g16_amx(codes, ps, po, K, split + m * 2 * K, xq + m * nb, rows, y + m * ldy, ldy, keep, 0);
    }
}

#endif /* EMBER_AMX_H */
