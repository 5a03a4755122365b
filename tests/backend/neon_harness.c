/* Run by tests/backend/test_native_neon.py on AArch64 under qemu: the NEON copies of the
 * kernels (neon, and neondot where the emulated CPU has the dot product instructions) against
 * the portable one (same bits, one and two q8_K passes; the 32-element types within 1e-4, both
 * NEON copies the same bits) and against float64 (1e-4 of the largest output, for every type);
 * one row of x alone against its bits in a batch. Prints the ISA dispatch.c picks first. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <math.h>
int ember_matmul_generic(int, const void *, const float *, float *, int64_t, int64_t, int64_t, int);
int ember_matmul_neon(int, const void *, const float *, float *, int64_t, int64_t, int64_t, int);
int ember_matmul_neondot(int, const void *, const float *, float *, int64_t, int64_t, int64_t, int);
int ember_dequant_neondot(int, const void *, float *, int64_t, int64_t);
int ember_best_isa(void);
int ember_cpu_supports(int);
int ember_dequant_generic(int, const void *, float *, int64_t, int64_t);
int ember_dequant_neon(int, const void *, float *, int64_t, int64_t);
int ember_block_elems_generic(int);
static int bytes_of(int t) { switch (t) { case 1: case 30: return 2; case 2: return 18; case 3: return 20; case 6: return 22; case 7: return 24; case 8: return 34; case 20: return 18;
  case 10: return 84; case 11: return 110; case 12: return 144; case 13: return 176; case 14: return 210; case 23: return 136; } return 0; }
static uint16_t f16(float f) { /* crude: scale ~ small */ _Float16 h = (_Float16)f; uint16_t u; memcpy(&u, &h, 2); return u; }
int main(void) {
    int types[] = {1, 30, 2, 3, 6, 7, 8, 20, 10, 11, 12, 13, 14, 23};
    srand(1);
    int fails = 0;
    for (unsigned ti = 0; ti < sizeof types / sizeof *types; ti++) {
        int t = types[ti], el = ember_block_elems_generic(t), bb = bytes_of(t);
        int64_t N = 37, K = el == 256 ? 768 : (el == 1 ? 203 : 416), M = 5;
        int64_t rowb = K / el * bb;
        uint8_t *w = malloc(N * rowb);
        for (int64_t i = 0; i < N * rowb; i++) w[i] = rand() & 255;
        /* sane fp16 fields: for block types, every 2-byte-aligned field candidate; simply make all
           f16-looking data small by rewriting per type's scale offsets */
        for (int64_t b = 0; b < N * K / el; b++) {
            uint8_t *blk = w + b * bb;
            int offs[2] = {-1, -1};
            switch (t) { case 2: case 6: case 8: case 20: case 12 - 0: offs[0] = 0; if (t == 12) offs[1] = 2; break;
                case 3: case 7: case 13: offs[0] = 0; offs[1] = 2; break; case 10: offs[0] = 80; offs[1] = 82; break;
                case 11: offs[0] = 108; break; case 14: offs[0] = 208; break; case 23: offs[0] = 0; break; }
            if (t == 1) { uint16_t h = f16((rand() / (float)RAND_MAX - 0.5f)); memcpy(blk, &h, 2); }
            for (int o = 0; o < 2; o++) if (offs[o] >= 0) { uint16_t h = f16((rand() / (float)RAND_MAX - 0.5f) * 0.02f); memcpy(blk + offs[o], &h, 2); }
        }
        float *x = malloc(M * K * 4), *y0 = malloc(M * N * 4), *y1 = malloc(M * N * 4), *yneon = malloc(M * N * 4);
        float *yone = malloc(N * 4);
        /* the 32-element types: the NEON copies' own bits (simple.h), the same in both */
        const int simple32 = t == 2 || t == 3 || t == 6 || t == 7 || t == 8 || t == 20;
        float *d0 = malloc(N * K * 4), *d1 = malloc(N * K * 4);
        for (int64_t i = 0; i < M * K; i++) x[i] = rand() / (float)RAND_MAX - 0.5f;
        for (int copy = 0; copy < 2; copy++) for (int passes = 1; passes <= 2; passes++) {
        if (copy == 1 && !ember_cpu_supports(6)) continue; /* no sdot here: neondot would trap */
        int (*mm)(int, const void *, const float *, float *, int64_t, int64_t, int64_t, int) = copy ? ember_matmul_neondot : ember_matmul_neon;
        int (*dq)(int, const void *, float *, int64_t, int64_t) = copy ? ember_dequant_neondot : ember_dequant_neon;
        int r0 = ember_matmul_generic(t, w, x, y0, M, N, K, passes), r1 = mm(t, w, x, y1, M, N, K, passes);
        ember_dequant_generic(t, w, d0, N, K); dq(t, w, d1, N, K);
        double maxrel = 0, ref = 0; int same = memcmp(y0, y1, M * N * 4) == 0;
        for (int64_t i = 0; i < M * N; i++) { ref = fmax(ref, fabs(y0[i])); }
        for (int64_t i = 0; i < M * N; i++) maxrel = fmax(maxrel, fabs(y0[i] - y1[i]) / ref);
        /* exact check vs dequant for the generic: float64 of d0 @ x */
        double maxerr = 0;
        for (int64_t m = 0; m < M; m++) for (int64_t n = 0; n < N; n++) {
            double s = 0; for (int64_t k = 0; k < K; k++) s += (double)d0[n * K + k] * x[m * K + k];
            maxerr = fmax(maxerr, fabs(s - y1[m * N + n]) / ref);
        }
        int deq_same = memcmp(d0, d1, N * K * 4) == 0;
        /* one row of x (decode: two weight rows a pass for most 32-element types) gives the
         * bits that row has in a batch */
        const int r2 = mm(t, w, x, yone, 1, N, K, passes), alone_same = memcmp(yone, y1, N * 4) == 0;
        if (!copy) memcpy(yneon, y1, M * N * 4);
        const int copies_same = memcmp(yneon, y1, M * N * 4) == 0;
        printf("%s passes %d type %2d rc %d %d bit-identical %d maxrel %.2e deq-identical %d vs-float64 %.2e neon-identical %d alone-identical %d\n", copy ? "neondot" : "neon", passes, t, r0, r1, same, maxrel, deq_same, maxerr, copies_same, alone_same);
        /* the portable copy's bits (the 32-element types: neon's, and within 1e-4 of the
         * portable copy's, as close as float64); near float64 where x is as close (one q8_K pass is int8's) */
        if (r0 || r1 || r2 || !deq_same || !alone_same) fails++;
        if (simple32 ? !copies_same || maxrel > 1e-4 || maxerr > 1e-4 : !same || (passes == 2 && maxerr > 1e-4)) fails++;
        }
    }
    printf("best %d\n", ember_best_isa());
    printf("%s\n", fails ? "FAIL" : "OK");
    return fails != 0;
}
