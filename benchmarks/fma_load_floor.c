/* The floor of the avx512 path's 32-element products with several rows of x: per 32 values and
 * row of x, two 512-bit multiply-adds, each with its 64-byte load of x from L1, and nothing
 * else (no weight to widen). What one core of this CPU takes for that is the least a block
 * and row can take in simple.h's float32-x kernel, whatever its widening costs.
 *
 *     gcc -O2 -mavx512f -mfma benchmarks/fma_load_floor.c -o /tmp/fma_load_floor && /tmp/fma_load_floor
 *
 * Set it beside `benchmarks/bench_simple_types.py --k 576 --mib 1 --threads 1 --rows 8`. The 16
 * accumulators are named variables: kept in an array, GCC held them in memory, and the loop
 * measured a store and reload per multiply-add (0.76-0.91 ns on the Xeon of 2026-11-28, against
 * 0.42 in registers). */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define K 576 /* SmolLM2's hidden size: 8 rows of x stay in L1 */
#define ROWS 8
#define REPS 200000L

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* row m of x against the block's two "weight" vectors, into its two accumulators */
#define ROW(m, lo, hi)                                                                        \
    lo = _mm512_fmadd_ps(w0, _mm512_load_ps(xb + (m) * K), lo);                               \
    hi = _mm512_fmadd_ps(w1, _mm512_load_ps(xb + (m) * K + 16), hi)

int main(void) {
    float *x = aligned_alloc(64, ROWS * K * sizeof(float));
    for (int i = 0; i < ROWS * K; i++) x[i] = 1e-3f * (float)(i % 7);
    __m512 w0 = _mm512_set1_ps(0.5f), w1 = _mm512_set1_ps(0.25f);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    __m512 a8 = a0, a9 = a0, a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0;
    const double t0 = now();
    for (long r = 0; r < REPS; r++)
        for (int b = 0; b < K / 32; b++) {
            __asm__ volatile("" : "+v"(w0), "+v"(w1)); /* a fresh "weight" each block */
            const float *xb = x + b * 32;
            ROW(0, a0, a1);
            ROW(1, a2, a3);
            ROW(2, a4, a5);
            ROW(3, a6, a7);
            ROW(4, a8, a9);
            ROW(5, a10, a11);
            ROW(6, a12, a13);
            ROW(7, a14, a15);
        }
    const double seconds = now() - t0;
    const __m512 s = _mm512_add_ps(
        _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                      _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7))),
        _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)),
                      _mm512_add_ps(_mm512_add_ps(a12, a13), _mm512_add_ps(a14, a15))));
    printf("%.3f ns a block and row (two 512-bit multiply-adds and their loads), one thread (%g)\n",
           seconds / (REPS * (K / 32.0) * ROWS) * 1e9, _mm512_reduce_add_ps(s));
    free(x);
    return 0;
}
