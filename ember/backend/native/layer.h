/* One decoder layer for a few tokens (decode, small batches) in one call: what the Python layer
 * does in ~35 torch ops (norms, the four weight products, bias, q/k norms, RoPE, the KV cache
 * write, attention, the activation, residuals) in one OpenMP team, so a token's step costs a
 * call a layer, not ~1,000 dispatched ops. Included by kernels.c (once per ISA): it uses that
 * ISA's dot products and attention. The float steps follow the Python layer's order; only
 * accumulation orders differ (norms sum in sequence), so results agree to float32 rounding.
 *
 * The layer: h = norm(x); q, k, v = split(W_qkv h + bias); q, k = qk_norm per head; rotate
 * q, k; store k, v at the batch's cells; a = attention(q, cached k, v); x += post(W_o a);
 * h = norm(x); g, u = split(W_gate_up h); x += post(W_down act(g) * u). */
#ifndef EMBER_LAYER_H
#define EMBER_LAYER_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    int32_t type, passes; /* passes: of a K type's activations (kernels.c's em_prep) */
    const void *data;
    int64_t n, k; /* out, in */
} em_lin;

enum { EM_ACT_SILU = 0, EM_ACT_GELU_TANH = 1 };

/* Shared with ember/backend/layer.py (a ctypes Structure of the same fields, in order). */
typedef struct {
    int64_t M, C, H, Hkv, D, Dv, F, rope_dim;
    int32_t neox, act, kv_type, pad;
    float eps, scale; /* norms' epsilon; the attention scores' scale */
    const float *cos, *sin; /* (M, rope_dim / 2) */
    const float *attn_norm, *qkv_bias, *q_norm, *k_norm, *post_attn_norm, *ffn_norm, *post_ffn_norm;
    em_lin qkv[3], gate_up[2]; /* parts side by side (their n sum to the whole; unused: n 0) */
    em_lin out, down;
    void *kc, *vc; /* the layer's keys (Hkv, cells, D) and values, strides in elements */
    int64_t k_hs, k_cs, v_hs, v_cs;
    const int64_t *locs; /* (M) the cells the batch's keys and values go to */
    int64_t lo, S; /* attention sees cells lo .. lo + S */
    const float *mask; /* (M, S) additive, or NULL: every cell visible to every token */
    float *x; /* (M, C): the residual stream, in and out */
} em_layer;

static void em_rms_norm(const float *x, const float *w, int64_t n, float eps, float *out) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * r * (w ? w[i] : 1.0f);
}

/* x += y, y first normalized where `norm` (Gemma's post-attention and post-MLP norms) */
static void em_add_residual(float *x, float *y, const float *norm, int64_t n, float eps) {
    if (norm) em_rms_norm(y, norm, n, eps, y);
    for (int64_t i = 0; i < n; i++) x[i] = x[i] + y[i];
}

/* ggml's "normal" RoPE rotates adjacent pairs, NeoX the two halves of the rotated dims */
static void em_rope(float *x, const float *cos, const float *sin, int64_t dim, int neox) {
    const int64_t half = dim / 2;
    for (int64_t i = 0; i < half; i++) {
        const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        const float x0 = x[a], x1 = x[b];
        x[a] = x0 * cos[i] - x1 * sin[i];
        x[b] = x0 * sin[i] + x1 * cos[i];
    }
}

static void em_kv_store(int kv_type, void *base, int64_t offset, const float *src, int64_t n) {
    if (kv_type == EM_KV_F32) {
        float *d = (float *)base + offset;
        for (int64_t i = 0; i < n; i++) d[i] = src[i];
        return;
    }
    uint16_t *d = (uint16_t *)base + offset;
    for (int64_t i = 0; i < n; i++) d[i] = kv_type == EM_KV_F16 ? em_f16_from(src[i]) : em_bf16_from(src[i]);
}

static float em_act(int act, float g) {
    if (act == EM_ACT_GELU_TANH) {
        const float inner = 0.7978845608028654f * (g + 0.044715f * g * g * g);
        return 0.5f * g * (1.0f + tanhf(inner));
    }
    return g / (1.0f + expf(-g));
}

/* out[i] = act(g[i]) * u[i] for n values. The x86 paths take 8 at a time through one exp of a
 * value <= 0: with t = exp(-|z|), silu (z = g) and tanh-GELU (z = 2 * 0.79788 (g + 0.044715
 * g^3)) are both g * (z >= 0 ? 1 : t) / (1 + t), which also keeps GELU's small negative
 * outputs that 1 + tanhf rounds to 0. Per 8,192 values on one thread (a 3B model's layer; AVX2
 * Zen 3, a C loop): silu 34 -> 5 us, GELU 125 -> 6 us; within 3e-7 of float64 elsewhere. */
static void em_act_mul(int act, const float *g, const float *u, int64_t n, float *out) {
    int64_t i = 0;
#if defined(EM_X86)
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        __m256 z = x;
        if (act == EM_ACT_GELU_TANH) {
            const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
            z = _mm256_mul_ps(_mm256_set1_ps(2.0f * 0.7978845608028654f),
                              _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x));
        }
        const __m256 t = em_exp8(_mm256_or_ps(z, sign)); /* exp(-|z|) */
        const __m256 num = _mm256_blendv_ps(one, t, z); /* z's sign bit picks t */
        const __m256 a = _mm256_div_ps(_mm256_mul_ps(x, num), _mm256_add_ps(one, t));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(a, _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < n; i++) out[i] = em_act(act, g[i]) * u[i];
}

#define EM_MAX_PARTS 3

/* Sums the parts' outputs; 0 if a part's input size is not `k` */
static int64_t em_parts_n(const em_lin *w, int parts, int64_t k) {
    int64_t n = 0;
    for (int i = 0; i < parts; i++) {
        if (w[i].n && w[i].k != k) return 0;
        n += w[i].n;
    }
    return n;
}

/* Sets up the preparation of x (rows of k values) for each part (a buffer of `stride` bytes each) */
static void em_setup_parts(em_prep *p, const em_lin *w, int parts, const float *x, int64_t M,
                           uint8_t *buf, int64_t stride) {
    for (int i = 0; i < parts; i++)
        if (w[i].n) em_prepare_setup(&p[i], w[i].type, x, M, w[i].k, buf + i * stride, w[i].passes);
}

/* Quantizes row m of x for each part em_setup_parts set up */
static void em_prepare_parts_row(const em_prep *p, const em_lin *w, int parts, int64_t m) {
    for (int i = 0; i < parts; i++)
        if (w[i].n) em_prepare_row(&p[i], m);
}

/* This thread's share of the team's loop over the rows of every part, each part into its own
 * columns of y (M, ldy); called inside the team (an orphaned `omp for`). */
static void em_team_rows(const em_prep *p, const em_lin *w, int parts, int64_t M, int64_t ldy,
                         float *y) {
    int64_t chunks[EM_MAX_PARTS] = {0}, total = 0;
    for (int i = 0; i < parts; i++) total += chunks[i] = (w[i].n + EM_ROWS_PER_CHUNK - 1) / EM_ROWS_PER_CHUNK;
    int tiled = 0; /* whether a part's products take the tiles (the amx copy) */
    for (int i = 0; i < parts && !tiled; i++)
        if (w[i].n) tiled = em_tiles_begin(&p[i]);
    #pragma omp for schedule(static)
    for (int64_t c = 0; c < total; c++) {
        int i = 0;
        int64_t cc = c, col = 0;
        while (cc >= chunks[i]) cc -= chunks[i], col += w[i].n, i++;
        const int64_t n0 = cc * EM_ROWS_PER_CHUNK;
        const int64_t n1 = n0 + EM_ROWS_PER_CHUNK < w[i].n ? n0 + EM_ROWS_PER_CHUNK : w[i].n;
        em_rows(&p[i], (const uint8_t *)w[i].data, M, ldy, n0, n1, y + col);
    }
    em_tiles_end(tiled);
}

int EM_EXPORT(ember_layer)(const em_layer *L, int threads) {
    const int64_t M = L->M, C = L->C, H = L->H, Hkv = L->Hkv, D = L->D, Dv = L->Dv, F = L->F;
    const int64_t nq = H * D, nk = Hkv * D, nqkv = nq + nk + Hkv * Dv, S = L->S;
    if (M <= 0 || H % Hkv || em_parts_n(L->qkv, 3, C) != nqkv || L->out.k != H * Dv ||
        L->out.n != C || em_parts_n(L->gate_up, 2, C) != 2 * F || L->down.n != C ||
        L->down.k != F || L->rope_dim > D || S <= 0)
        return -2;
    int64_t prep = 0; /* bytes of one part's prepared activations, the largest */
    const em_lin *lins[7] = {&L->qkv[0], &L->qkv[1], &L->qkv[2], &L->gate_up[0], &L->gate_up[1], &L->out, &L->down};
    for (int i = 0; i < 7; i++) {
        if (!lins[i]->n) continue;
        const int64_t b = em_prep_bytes(lins[i]->type, M, lins[i]->k, lins[i]->passes);
        if (b < 0) return (int)b;
        prep = b > prep ? b : prep;
    }
    prep = (prep + 63) & ~(int64_t)63;
    const int nth = threads > 0 ? threads : omp_get_max_threads();
    /* float scratch: h (M, max(C, F)), qkv (M, nqkv), att (M, H Dv), gu (M, 2F), y (M, C),
     * scores (threads, EM_ATTN_SCRATCH(tile, S)); then the prepared activations */
    /* each array on whole lines (em_alloc_lines): the products load their rows of x */
#define EM_LINES(floats) (((floats) + 15) & ~(int64_t)15)
    const int64_t wide = C > F ? C : F;
    const int64_t nh = EM_LINES(M * wide), nqkv_all = EM_LINES(M * nqkv), natt = EM_LINES(M * H * Dv);
    const int64_t ngu = EM_LINES(M * 2 * F), ny = EM_LINES(M * C);
    const int64_t nscores = EM_LINES((int64_t)nth * EM_ATTN_SCRATCH(EM_ATTN_TILE, S));
    const int64_t floats = nh + nqkv_all + natt + ngu + ny + nscores;
    float *h = (float *)em_alloc_lines((size_t)(floats * 4 + EM_MAX_PARTS * prep));
    if (!h) return -3;
    float *qkv = h + nh, *att = qkv + nqkv_all, *gu = att + natt, *y = gu + ngu;
    float *scores = y + ny;
    uint8_t *pbuf = (uint8_t *)(scores + nscores);
#undef EM_LINES
    /* each product's activations set up before the team starts (the buffers are known), so
     * the team prepares them a row at a time beside the per-row steps; the parts share pbuf,
     * one product after another */
    em_prep pq[3], po[1], pg[2], pd[1];
    em_setup_parts(pq, L->qkv, 3, h, M, pbuf, prep);
    em_setup_parts(po, &L->out, 1, att, M, pbuf, prep);
    em_setup_parts(pg, L->gate_up, 2, h, M, pbuf, prep);
    em_setup_parts(pd, &L->down, 1, h, M, pbuf, prep);
    /* units of attention: (token, KV head, tile of its query heads); tiles small enough that
     * every thread gets one (Gemma 3's one KV head of four query heads: two tiles of two) */
    int64_t tile = (M * H + nth - 1) / nth;
    tile = tile < EM_ATTN_TILE ? tile : EM_ATTN_TILE;
    const int64_t group = H / Hkv;
    tile = tile < group ? tile : group;
    const int64_t tiles = (group + tile - 1) / tile, units = M * Hkv * tiles;
    float *x = L->x;

    /* Every per-token step is an `omp for` over the tokens: a token's row takes the same steps
     * on whichever thread, so its bits do not change; with several tokens both threads work. */
    #pragma omp parallel num_threads(nth)
    {
        #pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) {
            em_rms_norm(x + m * C, L->attn_norm, C, L->eps, h + m * C);
            em_prepare_parts_row(pq, L->qkv, 3, m);
        }
        em_team_rows(pq, L->qkv, 3, M, nqkv, qkv);
        #pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) {
            float *r = qkv + m * nqkv;
            if (L->qkv_bias)
                for (int64_t i = 0; i < nqkv; i++) r[i] += L->qkv_bias[i];
            const float *c = L->cos + m * (L->rope_dim / 2), *s = L->sin + m * (L->rope_dim / 2);
            for (int64_t j = 0; j < H + Hkv; j++) { /* q heads, then k heads */
                float *head = r + j * D;
                const float *w = j < H ? L->q_norm : L->k_norm;
                if (L->q_norm) em_rms_norm(head, w, D, L->eps, head);
                em_rope(head, c, s, L->rope_dim, L->neox);
            }
            for (int64_t g = 0; g < Hkv; g++) { /* each token its own cell */
                em_kv_store(L->kv_type, L->kc, g * L->k_hs + L->locs[m] * L->k_cs, r + nq + g * D, D);
                em_kv_store(L->kv_type, L->vc, g * L->v_hs + L->locs[m] * L->v_cs, r + nq + nk + g * Dv, Dv);
            }
        }
        #pragma omp for schedule(static)
        for (int64_t u = 0; u < units; u++) {
            const int64_t m = u / (Hkv * tiles), g = (u / tiles) % Hkv;
            const int64_t h0 = g * group + (u % tiles) * tile;
            const int64_t nt = group - (h0 - g * group) < tile ? group - (h0 - g * group) : tile;
            em_attend_heads(L->kv_type, qkv + m * nqkv + h0 * D, (int)nt, D,
                            em_kv_row(L->kv_type, L->kc, g * L->k_hs + L->lo * L->k_cs), L->k_cs,
                            em_kv_row(L->kv_type, L->vc, g * L->v_hs + L->lo * L->v_cs), L->v_cs,
                            Dv, S, L->mask ? L->mask + m * S : 0, L->scale,
                            scores + (int64_t)omp_get_thread_num() * EM_ATTN_SCRATCH(EM_ATTN_TILE, S),
                            att + m * H * Dv + h0 * Dv);
        }
        #pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) em_prepare_parts_row(po, &L->out, 1, m);
        em_team_rows(po, &L->out, 1, M, C, y);
        #pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) {
            em_add_residual(x + m * C, y + m * C, L->post_attn_norm, C, L->eps);
            em_rms_norm(x + m * C, L->ffn_norm, C, L->eps, h + m * C);
            em_prepare_parts_row(pg, L->gate_up, 2, m);
        }
        em_team_rows(pg, L->gate_up, 2, M, 2 * F, gu);
        #pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) {
            em_act_mul(L->act, gu + m * 2 * F, gu + m * 2 * F + F, F, h + m * F);
            em_prepare_parts_row(pd, &L->down, 1, m);
        }
        em_team_rows(pd, &L->down, 1, M, C, y);
        #pragma omp for schedule(static)
        for (int64_t m = 0; m < M; m++) em_add_residual(x + m * C, y + m * C, L->post_ffn_norm, C, L->eps);
    }
    free(h);
    return 0;
}

#endif /* EMBER_LAYER_H */
