/* How many of each 256-bit instruction the prompt kernels are made of one core issues a second:
 * the float32 multiply-add (attention, the float32 matmul), vpmaddwd and vpdpwssd (gemm16's
 * int16 pairs, without and with AVX-VNNI), vpmaddubsw and vpdpbusd (gemm8's int8), the adds
 * that follow vpmaddwd and vpmaddubsw without VNNI, vphaddd, a broadcast from memory (rows8.h's
 * x), and pairs of them, which tell whether two kinds share their execution ports. Twelve
 * independent registers a loop, so nothing waits on a result; the CPU needs AVX2, FMA and
 * AVX-VNNI.
 *
 *     gcc -O2 -fopenmp benchmarks/pipe_peaks.c -o /tmp/pipe_peaks && /tmp/pipe_peaks [threads]
 *
 * With 2 threads each figure is a core's, both cores running it at once. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define N 200000000L /* instructions a thread */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* one instruction a line: A names it with its inputs (ymm14, ymm15), R its output (or
 * accumulator) ymm(R) */
#define ONE(A, R) A " %%ymm" #R "\n"
#define IN2 " %%ymm14, %%ymm15,"
/* twelve of A, or A and B alternating (six each) */
#define TWELVE(A, B) \
    ONE(A, 0) ONE(B, 1) ONE(A, 2) ONE(B, 3) ONE(A, 4) ONE(B, 5) ONE(A, 6) ONE(B, 7) ONE(A, 8) ONE(B, 9) ONE(A, 10) ONE(B, 11)
#define CLOBBERS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11"

#define RUN(NAME, A, B)                                                   \
    do {                                                                  \
        const double t0 = now();                                          \
        _Pragma("omp parallel num_threads(threads)") for (long i = 0; i < N / 12; i++) \
            __asm__ volatile(TWELVE(A, B) ::: CLOBBERS);                  \
        printf("%-26s %6.2f G/s a core\n", NAME, N / (now() - t0) / 1e9); \
    } while (0)

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 2;
    printf("%d threads\n", threads);
    RUN("vfmadd231ps", "vfmadd231ps" IN2, "vfmadd231ps" IN2);
    RUN("vpmaddwd", "vpmaddwd" IN2, "vpmaddwd" IN2);
    RUN("vpdpwssd (AVX-VNNI)", "%{vex%} vpdpwssd" IN2, "%{vex%} vpdpwssd" IN2);
    RUN("vpmaddubsw", "vpmaddubsw" IN2, "vpmaddubsw" IN2);
    RUN("vpdpbusd (AVX-VNNI)", "%{vex%} vpdpbusd" IN2, "%{vex%} vpdpbusd" IN2);
    RUN("vpaddd", "vpaddd" IN2, "vpaddd" IN2);
    RUN("vfmadd231ps + vpmaddwd", "vfmadd231ps" IN2, "vpmaddwd" IN2);
    RUN("vpmaddwd + vpaddd", "vpmaddwd" IN2, "vpaddd" IN2);
    RUN("vpmaddwd + vcvtdq2ps", "vpmaddwd" IN2, "vcvtdq2ps %%ymm14,");
    RUN("vphaddd", "vphaddd" IN2, "vphaddd" IN2);
    RUN("vpmaddwd + vphaddd", "vpmaddwd" IN2, "vphaddd" IN2);
    RUN("vpbroadcastd m32", "vpbroadcastd (%%rsp),", "vpbroadcastd (%%rsp),");
    RUN("vpmaddwd + vpbroadcastd m32", "vpmaddwd" IN2, "vpbroadcastd (%%rsp),");
    RUN("vpaddd + vpbroadcastd m32", "vpaddd" IN2, "vpbroadcastd (%%rsp),");
    return 0;
}
