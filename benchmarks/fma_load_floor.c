/* The floor of the avx512 path's 32-element products with several rows of x: per 32 values and
 * row of x, two 512-bit multiply-adds, each with its 64-byte load of x from L1, and nothing
 * else (no weight to widen). What one core of this CPU takes for that is the least a block
 * and row can take in simple.h's float32-x kernel, whatever its widening costs.
 *
 *     gcc -O2 -mavx512f -mfma benchmarks/fma_load_floor.c -o /tmp/fma_load_floor && /tmp/fma_load_floor
 *
 * Set it beside `benchmarks/bench_simple_types.py --k 576 --mib 1 --threads 1 --rows 8`. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define K 576   /* SmolLM2's hidden size: 8 rows of x stay in L1 */
#define ROWS 8
#define REPS 200000L

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
    float *x = aligned_alloc(64, ROWS * K * sizeof(float));
    for (int i = 0; i < ROWS * K; i++) x[i] = 1e-3f * (float)(i % 7);
    __m512 acc[2 * ROWS], w0 = _mm512_set1_ps(0.5f), w1 = _mm512_set1_ps(0.25f);
    for (int i = 0; i < 2 * ROWS; i++) acc[i] = _mm512_setzero_ps();
    const double t0 = now();
    for (long r = 0; r < REPS; r++)
        for (int b = 0; b < K / 32; b++) {
            __asm__ volatile("" : "+v"(w0), "+v"(w1)); /* a fresh "weight" each block */
            for (int m = 0; m < ROWS; m++) {
                const float *xb = x + m * K + b * 32;
                acc[2 * m] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xb), acc[2 * m]);
                acc[2 * m + 1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xb + 16), acc[2 * m + 1]);
            }
        }
    const double seconds = now() - t0;
    float sum = 0.0f;
    for (int i = 0; i < 2 * ROWS; i++) sum += _mm512_reduce_add_ps(acc[i]);
    printf("%.3f ns a block and row (two 512-bit multiply-adds and their loads), one thread (%g)\n",
           seconds / (REPS * (K / 32.0) * ROWS) * 1e9, sum);
    free(x);
    return 0;
}
