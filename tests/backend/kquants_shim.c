/* Test shim: exports kquants.h's static functions as plain symbols for ctypes. */
#include "../../ember/backend/native/kquants.h"

#if defined(__GNUC__)
#define KQ_EXPORT __attribute__((visibility("default")))
#else
#define KQ_EXPORT
#endif

KQ_EXPORT const char *shim_impl(void) { return KQ_IMPL_NAME; }
KQ_EXPORT int shim_block_bytes(int t) { return kq_block_bytes(t); }
KQ_EXPORT int shim_q8_block_bytes(void) { return (int)sizeof(kq_block_q8_K); }
KQ_EXPORT void shim_quantize_q8_K(const float *x, kq_block_q8_K *y, int64_t k) { kq_quantize_row_q8_K(x, y, k); }

/* out[r] = dot(row r of w, x) for `rows` rows of k values */
KQ_EXPORT int shim_dot(int type, const void *w, const kq_block_q8_K *x, int64_t rows, int64_t k, float *out) {
    const int bb = kq_block_bytes(type);
    const int64_t nb = k / KQ_QK;
    if (bb < 0) return -1;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = (const uint8_t *)w + r * nb * bb;
        switch (type) {
        case KQ_TYPE_Q2_K: out[r] = kq_dot_q2_K(row, x, nb); break;
        case KQ_TYPE_Q3_K: out[r] = kq_dot_q3_K(row, x, nb); break;
        case KQ_TYPE_Q4_K: out[r] = kq_dot_q4_K(row, x, nb); break;
        case KQ_TYPE_Q5_K: out[r] = kq_dot_q5_K(row, x, nb); break;
        case KQ_TYPE_Q6_K: out[r] = kq_dot_q6_K(row, x, nb); break;
        default: out[r] = kq_dot_iq4_xs(row, x, nb); break;
        }
    }
    return 0;
}

/* the portable reference, whatever the ISA the shim was built for */
KQ_EXPORT int shim_dot_generic(int type, const void *w, const kq_block_q8_K *x, int64_t rows, int64_t k, float *out) {
    const int bb = kq_block_bytes(type);
    const int64_t nb = k / KQ_QK;
    if (bb < 0) return -1;
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = (const uint8_t *)w + r * nb * bb;
        switch (type) {
        case KQ_TYPE_Q2_K: out[r] = kq_dot_q2_K_generic(row, x, nb); break;
        case KQ_TYPE_Q3_K: out[r] = kq_dot_q3_K_generic(row, x, nb); break;
        case KQ_TYPE_Q4_K: out[r] = kq_dot_q4_K_generic(row, x, nb); break;
        case KQ_TYPE_Q5_K: out[r] = kq_dot_q5_K_generic(row, x, nb); break;
        case KQ_TYPE_Q6_K: out[r] = kq_dot_q6_K_generic(row, x, nb); break;
        default: out[r] = kq_dot_iq4_xs_generic(row, x, nb); break;
        }
    }
    return 0;
}

KQ_EXPORT int shim_dequant(int type, const void *w, float *y, int64_t k) {
    kq_dequant_fn f = kq_dequant_for_type(type);
    if (!f) return -1;
    f(w, y, k);
    return 0;
}

/* through the by-type table: must equal shim_dot */
KQ_EXPORT int shim_dot_table(int type, const void *w, const kq_block_q8_K *x, int64_t rows, int64_t k, float *out) {
    kq_dot_fn f = kq_dot_for_type(type);
    const int64_t nb = k / KQ_QK;
    if (!f) return -1;
    for (int64_t r = 0; r < rows; r++) out[r] = f((const uint8_t *)w + r * nb * kq_block_bytes(type), x, nb);
    return 0;
}

/* out[r * nx + j] = row r of w against activation row j (x rows k/256 blocks apart), through
 * kq_dot_rows_for_type */
KQ_EXPORT int shim_dot_rows(int type, const void *w, const kq_block_q8_K *x, int nx, int64_t rows, int64_t k, float *out) {
    kq_dot_rows_fn f = kq_dot_rows_for_type(type);
    const int64_t nb = k / KQ_QK;
    if (!f) return -1;
    for (int64_t r = 0; r < rows; r++) f((const uint8_t *)w + r * nb * kq_block_bytes(type), x, nb, nx, nb, out + r * nx);
    return 0;
}
