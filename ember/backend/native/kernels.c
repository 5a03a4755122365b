/* Matrix products straight from GGUF blocks, with float32 activations (no bf16 rounding).
 *
 * y[m, n] = sum_k x[m, k] * W[n, k], where row n of W is K/32 blocks of ggml type Q4_0, Q4_1,
 * Q5_0 or Q8_0 in the file's own layout. Each output is computed the same way whatever the
 * number of rows, so a token's result never depends on the other tokens of its batch.
 * OpenMP splits the rows of W. ember_dequant expands rows to float32 for large batches.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define QK 32

static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* Codes of one block as 32 floats, and the block's scale and offset: w = d * c + m. */
static inline void unpack(int type, const uint8_t *b, float *c, float *d, float *m) {
    switch (type) {
    case 2: /* Q4_0: d, 16 bytes of nibbles; w = d * (q - 8) */
        *d = f16(b), *m = -8.0f * *d;
        for (int j = 0; j < 16; j++) c[j] = (float)(b[2 + j] & 15), c[j + 16] = (float)(b[2 + j] >> 4);
        break;
    case 3: /* Q4_1: d, m, 16 bytes of nibbles; w = d * q + m */
        *d = f16(b), *m = f16(b + 2);
        for (int j = 0; j < 16; j++) c[j] = (float)(b[4 + j] & 15), c[j + 16] = (float)(b[4 + j] >> 4);
        break;
    case 6: { /* Q5_0: d, 32 high bits, 16 bytes of nibbles; w = d * (q - 16) */
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        *d = f16(b), *m = -16.0f * *d;
        for (int j = 0; j < 16; j++) {
            c[j] = (float)((b[6 + j] & 15) | (((qh >> j) << 4) & 16));
            c[j + 16] = (float)((b[6 + j] >> 4) | ((qh >> (j + 12)) & 16));
        }
        break;
    }
    default: /* Q8_0: d, 32 signed bytes; w = d * q */
        *d = f16(b), *m = 0.0f;
        for (int j = 0; j < QK; j++) c[j] = (float)(int8_t)b[2 + j];
    }
}

static int block_bytes(int type) {
    switch (type) {
    case 2: return 18;
    case 3: return 20;
    case 6: return 22;
    case 8: return 34;
    default: return -1;
    }
}

#define MAX_M 8 /* rows of x per call: the accumulators of all of them stay on the stack */

/* One output row n of W against M rows of x; sums holds each x row's per-block sums. Each block
 * is unpacked once for all M rows (one read of W per step), and each (m, n) output adds the
 * same terms in the same order as it would alone. */
static inline void row_dot(int type, const uint8_t *row, const float *x, const float *sums,
                           float *y, int64_t M, int64_t N, int64_t K, int bytes) {
    int64_t nb = K / QK;
    if (M == 1) { /* decode: the accumulators stay in registers */
        float acc[QK] = {0}, off = 0.0f, c[QK], d, o;
        for (int64_t b = 0; b < nb; b++) {
            unpack(type, row + b * bytes, c, &d, &o);
            const float *xb = x + b * QK;
            for (int j = 0; j < QK; j++) acc[j] += d * (xb[j] * c[j]);
            off += o * sums[b];
        }
        float s = 0.0f;
        for (int j = 0; j < QK; j++) s += acc[j];
        y[0] = s + off;
        return;
    }
    float acc[MAX_M][QK], off[MAX_M], c[QK], d, o;
    memset(acc, 0, sizeof(acc));
    memset(off, 0, sizeof(off));
    for (int64_t b = 0; b < nb; b++) {
        unpack(type, row + b * bytes, c, &d, &o);
        for (int64_t m = 0; m < M; m++) {
            const float *xb = x + m * K + b * QK;
            for (int j = 0; j < QK; j++) acc[m][j] += d * (xb[j] * c[j]);
            off[m] += o * sums[m * nb + b];
        }
    }
    for (int64_t m = 0; m < M; m++) {
        float s = 0.0f;
        for (int j = 0; j < QK; j++) s += acc[m][j];
        y[m * N] = s + off[m];
    }
}

#ifdef __AVX512F__
/* Q8_0 against one row of x, four rows of W at a time: the x block is loaded once for all
 * four, and each row keeps two vector accumulators (the int8 -> float conversion is the cost). */
static void q8_rows4(const uint8_t *w, const float *x, float *y, int64_t nb) {
    const int64_t stride = nb * 34;
    __m512 acc[4][2];
    for (int r = 0; r < 4; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        __m512 x0 = _mm512_loadu_ps(x + b * QK), x1 = _mm512_loadu_ps(x + b * QK + 16);
        for (int r = 0; r < 4; r++) {
            const uint8_t *blk = w + r * stride + b * 34;
            __m512 d = _mm512_set1_ps(f16(blk));
            __m512 c0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2))));
            __m512 c1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18))));
            acc[r][0] = _mm512_fmadd_ps(_mm512_mul_ps(x0, c0), d, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(_mm512_mul_ps(x1, c1), d, acc[r][1]);
        }
    }
    for (int r = 0; r < 4; r++) y[r] = _mm512_reduce_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]));
}

/* Q8_0, one row of W against M rows of x: the block is converted once for all of them, and
 * each (m, n) output takes the same steps as in q8_rows4, so it is bit-equal to alone. */
static void q8_row_many(const uint8_t *w, const float *x, float *y, int64_t nb, int64_t M,
                        int64_t K, int64_t N) {
    __m512 acc[MAX_M][2];
    for (int64_t m = 0; m < M; m++) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = w + b * 34;
        __m512 d = _mm512_set1_ps(f16(blk));
        __m512 c0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2))));
        __m512 c1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18))));
        for (int64_t m = 0; m < M; m++) {
            const float *xb = x + m * K + b * QK;
            acc[m][0] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(xb), c0), d, acc[m][0]);
            acc[m][1] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(xb + 16), c1), d, acc[m][1]);
        }
    }
    for (int64_t m = 0; m < M; m++)
        y[m * N] = _mm512_reduce_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]));
}

static int q8_rows(const uint8_t *w, const float *x, float *y, int64_t M, int64_t N, int64_t K) {
    int64_t nb = K / QK;
    if (N % 4) return 0;
    if (M == 1) {
        #pragma omp parallel for schedule(static)
        for (int64_t n = 0; n < N; n += 4) q8_rows4(w + n * nb * 34, x, y + n, nb);
    } else {
        #pragma omp parallel for schedule(static)
        for (int64_t n = 0; n < N; n++) q8_row_many(w + n * nb * 34, x, y + n, nb, M, K, N);
    }
    return 1;
}
#endif

#ifdef __AVX512F__
/* unpack for AVX-512: the block's codes as two vectors (positions 0-15 and 16-31), never
 * written to memory. A stack array of codes made the speed depend on where the calling
 * thread's stack lies (store/load aliasing): twice slower on some threads than on others. */
static inline __attribute__((always_inline)) void unpack_v(int type, const uint8_t *b, __m512 *c0,
                                                           __m512 *c1, float *d, float *m) {
    __m512i lo, hi;
    const __m512i nibble = _mm512_set1_epi32(15), one = _mm512_set1_epi32(1);
    switch (type) {
    case 2:
    case 3: {
        __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + (type == 2 ? 2 : 4))));
        lo = _mm512_and_si512(v, nibble), hi = _mm512_srli_epi32(v, 4);
        *d = f16(b), *m = type == 2 ? -8.0f * *d : f16(b + 2);
        break;
    }
    case 6: {
        uint32_t qh;
        memcpy(&qh, b + 2, 4);
        const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512i bits = _mm512_set1_epi32((int)qh);
        __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 6)));
        __m512i h0 = _mm512_and_si512(_mm512_srlv_epi32(bits, lanes), one);
        __m512i h1 = _mm512_and_si512(_mm512_srlv_epi32(bits, _mm512_add_epi32(lanes, _mm512_set1_epi32(16))), one);
        lo = _mm512_or_si512(_mm512_and_si512(v, nibble), _mm512_slli_epi32(h0, 4));
        hi = _mm512_or_si512(_mm512_srli_epi32(v, 4), _mm512_slli_epi32(h1, 4));
        *d = f16(b), *m = -16.0f * *d;
        break;
    }
    default:
        lo = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 2)));
        hi = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b + 18)));
        *d = f16(b), *m = 0.0f;
    }
    *c0 = _mm512_cvtepi32_ps(lo), *c1 = _mm512_cvtepi32_ps(hi);
}

/* row_dot with the codes in registers; type and M are constants at each call site, so the
 * accumulators of all M rows stay in registers too. */
static inline __attribute__((always_inline)) void row_dot_v(int type, const uint8_t *row,
                                                            const float *x, const float *sums,
                                                            float *y, const int M, int64_t N,
                                                            int64_t K, int bytes) {
    int64_t nb = K / QK;
    __m512 acc[MAX_M][2];
    float off[MAX_M];
    for (int m = 0; m < M; m++) acc[m][0] = acc[m][1] = _mm512_setzero_ps(), off[m] = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        __m512 c0, c1;
        float d, o;
        unpack_v(type, row + b * bytes, &c0, &c1, &d, &o);
        const __m512 vd = _mm512_set1_ps(d);
        for (int m = 0; m < M; m++) {
            const float *xb = x + m * K + b * QK;
            acc[m][0] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(xb), c0), vd, acc[m][0]);
            acc[m][1] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(xb + 16), c1), vd, acc[m][1]);
            off[m] += o * sums[m * nb + b];
        }
    }
    for (int m = 0; m < M; m++)
        y[m * N] = _mm512_reduce_add_ps(_mm512_add_ps(acc[m][0], acc[m][1])) + off[m];
}

#define ROWS_V(T, MM)                                                                         \
    _Pragma("omp parallel for schedule(static)") for (int64_t n = 0; n < N; n++)               \
        row_dot_v(T, w + n * (K / QK) * bytes, x, sums, y + n, MM, N, K, bytes)
#define BY_M(T)                                                                               \
    switch (M) {                                                                              \
    case 1: ROWS_V(T, 1); break;                                                              \
    case 2: ROWS_V(T, 2); break;                                                              \
    case 3: ROWS_V(T, 3); break;                                                              \
    case 4: ROWS_V(T, 4); break;                                                              \
    case 5: ROWS_V(T, 5); break;                                                              \
    case 6: ROWS_V(T, 6); break;                                                              \
    case 7: ROWS_V(T, 7); break;                                                              \
    default: ROWS_V(T, 8);                                                                    \
    }
#endif

#define ROWS(T)                                                                               \
    _Pragma("omp parallel for schedule(static)") for (int64_t n = 0; n < N; n++)               \
        row_dot(T, w + n * (K / QK) * bytes, x, sums, y + n, M, N, K, bytes)

/* type: ggml numbering (2 Q4_0, 3 Q4_1, 6 Q5_0, 8 Q8_0); sums: (M, K/32) float scratch. */
int ember_qmatmul(int type, const uint8_t *w, const float *x, float *y, float *sums,
                  int64_t M, int64_t N, int64_t K) {
    int bytes = block_bytes(type);
    if (bytes < 0 || K % QK || M < 1 || M > MAX_M) return -1;
#ifdef __AVX512F__
    if (type == 8 && q8_rows(w, x, y, M, N, K)) return 0;
#endif
    for (int64_t i = 0; i < M * (K / QK); i++) {
        float s = 0.0f;
        for (int j = 0; j < QK; j++) s += x[i * QK + j];
        sums[i] = s;
    }
#ifdef __AVX512F__
    switch (type) {
    case 2: BY_M(2); break;
    case 3: BY_M(3); break;
    case 6: BY_M(6); break;
    default: BY_M(8);
    }
    return 0;
#endif
    switch (type) { /* constant type per loop, so each body is specialised */
    case 2: ROWS(2); break;
    case 3: ROWS(3); break;
    case 6: ROWS(6); break;
    default: ROWS(8);
    }
    return 0;
}

/* Rows of W expanded to float32: out (N, K). */
int ember_dequant(int type, const uint8_t *w, float *out, int64_t N, int64_t K) {
    int bytes = block_bytes(type);
    if (bytes < 0 || K % QK) return -1;
    int64_t nb = K / QK;
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < N * nb; i++) {
        float c[QK], d, m;
        unpack(type, w + i * bytes, c, &d, &m);
        for (int j = 0; j < QK; j++) out[i * QK + j] = d * c[j] + m;
    }
    return 0;
}
