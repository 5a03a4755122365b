/* The sampler's argmax over rows of a batch's logits (ember/sample/topk.py's argmax_rows), found
 * through their block maxima: torch took ~10 small operators, run cold after the head's weights
 * had passed through the caches (0.45 ms of eight Gemma 3 rows' step, 0.14 here). The maxima
 * stay torch's amax: a native pass read the logits no faster (both ~0.25 ms for 8 rows of 262,144
 * in the caches, 0.8-0.9 from memory, where the head leaves them). */
#ifndef EMBER_SAMPLE_H
#define EMBER_SAMPLE_H

#include <math.h>
#include <stdint.h>

/* torch.argmax's rule over p[0..n) from `best` at `at` (at < 0: none yet): the first of the
 * largest, a NaN the largest of all */
static void em_argmax_scan(const float *p, int64_t n, int64_t base, float *best, int64_t *at) {
    for (int64_t i = 0; i < n; i++) {
        if (*at >= 0 && *best != *best) return; /* a NaN came first */
        if (*at < 0 || p[i] > *best || p[i] != p[i]) *best = p[i], *at = base + i;
    }
}

/* the argmax of row x (V floats) through its block maxima (V / block of them): the first block
 * holding the row's largest value, then that block and the tail past the last whole block */
static int64_t em_argmax_row(const float *x, int64_t V, const float *maxima, int64_t block) {
    const int64_t nb = V / block;
    float best = 0.0f;
    int64_t at = -1;
    if (nb == 0) {
        em_argmax_scan(x, V, 0, &best, &at);
        return at;
    }
    em_argmax_scan(maxima, nb, 0, &best, &at);
    const int64_t b = at;
    at = -1;
    em_argmax_scan(x + b * block, block, b * block, &best, &at);
    em_argmax_scan(x + nb * block, V - nb * block, nb * block, &best, &at);
    return at;
}

#endif /* EMBER_SAMPLE_H */
