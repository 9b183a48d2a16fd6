/* The whole decode step of a Llama-family decoder with int8 weights, in one call (CPU).
 *
 * Built into the same library as paged_attention.c (headroom/llm/kernels/build.py) and driven by
 * int8_decode.py. A decode step of a few sequences is memory-bound: it reads every weight once (~135 MB in int8
 * for SmolLM2-135M) and does little arithmetic, so at batch 1 the torch module path spends more time in its
 * ~400 op dispatches than in the matmuls. Here one OpenMP parallel region runs every layer: the matmuls are
 * split by output rows across the threads, the small serial parts (RMSNorm, activation quantisation, RoPE)
 * run on one thread between barriers, attention is split over (sequence, kv head).
 *
 * Int8 linear (`q8`): weights are symmetric per-output-channel int8 (quant.quantize_weight_int8); each input
 * row is quantised on the fly, symmetric 8-bit with its own scale (amax / 127, values round(x * 127 / amax),
 * ties to even), so a row's output never depends on the other rows in the step. The int8 x int8 dot products
 * are exact int32 sums (AVX2: |x| times sign-adjusted w with vpmaddubsw, pairs <= 2 * 127 * 127, no
 * saturation), and y = (float)sum * x_scale * w_scale (+ bias), in that order: a torch reference doing the
 * same fp32 ops gets the same bits (tests/llm/kernels/test_int8_decode.py).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

typedef struct {
    const int8_t *weight; /* [out_features, in_features] row-major int8 */
    const float *scale;   /* [out_features]: weight ~= int8 * scale */
    const float *bias;    /* [out_features], or NULL */
    int64_t out_features, in_features;
} hr_q8_linear;

typedef struct {
    const float *input_norm, *post_norm; /* [hidden] RMSNorm weights */
    hr_q8_linear qkv;                    /* fused q, k, v: [(H + 2 Hkv) D, hidden] */
    hr_q8_linear o;                      /* [hidden, H D] */
    hr_q8_linear gate_up;                /* fused gate, up: [2 I, hidden] */
    hr_q8_linear down;                   /* [hidden, I] */
    float *k_cache, *v_cache;            /* [Hkv, num_slots, D] fp32 */
} hr_q8_layer;

typedef struct {
    int64_t num_layers, hidden, num_heads, num_kv_heads, head_dim, intermediate, vocab;
    int64_t num_slots, block_size, max_positions;
    float eps;                           /* RMSNorm epsilon */
    const float *embed;                  /* [vocab, hidden] fp32 */
    const float *cos_table, *sin_table;  /* [max_positions, D]: Rotary.cos and Rotary.sin_signed */
    const float *final_norm;             /* [hidden] */
    const hr_q8_layer *layers;           /* [num_layers] */
    hr_q8_linear lm_head;                /* [vocab, hidden] */
} hr_q8_decoder;

#define ROWS_PER_CHUNK 64 /* output rows per OpenMP work item */

/* q = round(x * 127 / amax) in [-127, 127], scale = amax / 127 (all zeros: scale 0) */
static void quantize_row(const float *x, int64_t k, int8_t *q, float *scale) {
    float amax = 0.0f;
    for (int64_t i = 0; i < k; i++) {
        const float a = fabsf(x[i]);
        amax = a > amax ? a : amax;
    }
    if (!(amax > 0.0f)) {
        memset(q, 0, (size_t)k);
        *scale = 0.0f;
        return;
    }
    const float inv = 127.0f / amax;
    for (int64_t i = 0; i < k; i++) {
        float v = nearbyintf(x[i] * inv);
        v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
        q[i] = (int8_t)v;
    }
    *scale = amax / 127.0f;
}

#if HR_AVX2
static inline int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* |x| * (w * sign(x)) summed in pairs (vpmaddubsw), then in fours into int32 (vpmaddwd) */
static inline __m256i dot32(__m256i acc, __m256i w, __m256i ax, __m256i x) {
    const __m256i p = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(w, x));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}
#endif

/* w . x over k (exact int32). One weight row at a time, read front to back: measured 2x faster than four rows
 * interleaved (which defeats the hardware prefetcher), and as fast as a plain read of the weights. */
static inline int32_t dot_row(const int8_t *w, const int8_t *x, int64_t k) {
#if HR_AVX2
    if (k % 32 == 0) {
        __m256i a0 = _mm256_setzero_si256(), a1 = a0;
        int64_t i = 0;
        for (; i + 64 <= k; i += 64) {
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(x + i));
            const __m256i x1 = _mm256_loadu_si256((const __m256i *)(x + i + 32));
            a0 = dot32(a0, _mm256_loadu_si256((const __m256i *)(w + i)), _mm256_sign_epi8(x0, x0), x0);
            a1 = dot32(a1, _mm256_loadu_si256((const __m256i *)(w + i + 32)), _mm256_sign_epi8(x1, x1), x1);
        }
        if (i < k) {
            const __m256i x0 = _mm256_loadu_si256((const __m256i *)(x + i));
            a0 = dot32(a0, _mm256_loadu_si256((const __m256i *)(w + i)), _mm256_sign_epi8(x0, x0), x0);
        }
        return hsum_epi32(_mm256_add_epi32(a0, a1));
    }
#endif
    int32_t s = 0;
    for (int64_t i = 0; i < k; i++) s += (int32_t)w[i] * (int32_t)x[i];
    return s;
}

/* y[b, n] (= or +=) (float)(w_n . xq_b) * xs[b] * scale[n] (+ bias[n]) for rows n in [n0, n1), every b */
static void q8_rows(const hr_q8_linear *L, int64_t n0, int64_t n1, const int8_t *xq, const float *xs, int64_t num_rows,
                    float *y, int64_t ldy, int accumulate) {
    const int64_t k = L->in_features;
    for (int64_t n = n0; n < n1; n++) {
        const int8_t *w = L->weight + n * k; /* read from memory once, then from L1 for the other rows */
        for (int64_t b = 0; b < num_rows; b++) {
            float v = (float)dot_row(w, xq + b * k, k) * xs[b];
            v = v * L->scale[n];
            if (L->bias) v = v + L->bias[n];
            float *out = y + b * ldy + n;
            *out = accumulate ? *out + v : v;
        }
    }
}

/* The linear over all output rows, split across the enclosing parallel region's threads (orphaned `omp for`;
 * called by every thread of the team, or outside any region by one thread). */
static void q8_linear_team(const hr_q8_linear *L, const int8_t *xq, const float *xs, int64_t num_rows, float *y,
                           int64_t ldy, int accumulate) {
    const int64_t n = L->out_features, chunks = (n + ROWS_PER_CHUNK - 1) / ROWS_PER_CHUNK;
#pragma omp for schedule(static)
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t n1 = (c + 1) * ROWS_PER_CHUNK < n ? (c + 1) * ROWS_PER_CHUNK : n;
        q8_rows(L, c * ROWS_PER_CHUNK, n1, xq, xs, num_rows, y, ldy, accumulate);
    }
}

/* y [num_rows, out] = x [num_rows, in] @ W^T (+ bias), x quantised per row; returns 0, or -1 out of memory */
int hr_q8_linear_forward(const hr_q8_linear *L, int64_t num_rows, const float *x, float *y, int64_t num_threads) {
    int8_t *xq = malloc((size_t)(num_rows * L->in_features));
    float *xs = malloc((size_t)num_rows * sizeof(float));
    if (!xq || !xs) {
        free(xq), free(xs);
        return -1;
    }
    const int64_t k = L->in_features;
    for (int64_t b = 0; b < num_rows; b++) quantize_row(x + b * k, k, xq + b * k, xs + b);
#pragma omp parallel num_threads((int)num_threads)
    q8_linear_team(L, xq, xs, num_rows, y, L->out_features, 0);
    free(xq), free(xs);
    return 0;
}

/* RMSNorm of each row of h [num_rows, n] with weight w, then quantised: xq, xs */
static void norm_quantize(const float *h, int64_t num_rows, int64_t n, const float *w, float eps, float *tmp,
                          int8_t *xq, float *xs) {
    for (int64_t b = 0; b < num_rows; b++) {
        const float *x = h + b * n;
        float ss = 0.0f;
        for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
        const float r = 1.0f / sqrtf(ss / (float)n + eps);
        for (int64_t i = 0; i < n; i++) tmp[i] = x[i] * r * w[i];
        quantize_row(tmp, n, xq + b * n, xs + b);
    }
}

/* act[b, i] = silu(gu[b, i]) * gu[b, I + i], split across the team */
static void silu_mul_team(const float *gu, int64_t num_rows, int64_t inter, float *act) {
    const int64_t per_row = (inter + 7) / 8, tasks = num_rows * per_row;
#pragma omp for schedule(static)
    for (int64_t t = 0; t < tasks; t++) {
        const int64_t b = t / per_row, i0 = (t % per_row) * 8;
        const float *g = gu + b * 2 * inter, *u = g + inter;
        float *a = act + b * inter;
#if HR_AVX2
        if (i0 + 8 <= inter) {
            const __m256 gv = _mm256_loadu_ps(g + i0);
            const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
            const __m256 s = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
            _mm256_storeu_ps(a + i0, _mm256_mul_ps(s, _mm256_loadu_ps(u + i0)));
            continue;
        }
#endif
        for (int64_t i = i0; i < inter && i < i0 + 8; i++) a[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* One decode step: sequence b has token ids[b] at positions[b], written to cache slot slots[b], and attends
 * seq_lens[b] keys through block_tables[b * max_blocks ...]. Writes logits [num_seqs, vocab].
 * Returns 0; -1 out of memory; -2 an id, position, slot or block out of range (nothing written). */
int hr_q8_decode_step(const hr_q8_decoder *m, int64_t num_seqs, const int64_t *ids, const int64_t *positions,
                      const int64_t *slots, const int64_t *block_tables, int64_t max_blocks, const int64_t *seq_lens,
                      float *logits, int64_t num_threads) {
    const int64_t B = num_seqs, H = m->hidden, nh = m->num_heads, nkv = m->num_kv_heads, D = m->head_dim;
    const int64_t I = m->intermediate, nqkv = (nh + 2 * nkv) * D, hd = nh * D, group = nh / nkv;
    const int64_t num_blocks = m->num_slots / m->block_size;
    for (int64_t b = 0; b < B; b++) {
        if (ids[b] < 0 || ids[b] >= m->vocab || positions[b] < 0 || positions[b] >= m->max_positions ||
            slots[b] < 0 || slots[b] >= m->num_slots || seq_lens[b] < 1 || seq_lens[b] > max_blocks * m->block_size)
            return -2;
        for (int64_t blk = 0; blk < (seq_lens[b] + m->block_size - 1) / m->block_size; blk++)
            if (block_tables[b * max_blocks + blk] < 0 || block_tables[b * max_blocks + blk] >= num_blocks) return -2;
    }
    const int64_t widest = I > hd ? (I > H ? I : H) : (hd > H ? hd : H);
    float *h = malloc((size_t)(B * H) * sizeof(float)), *tmp = malloc((size_t)widest * sizeof(float));
    float *qkv = malloc((size_t)(B * nqkv) * sizeof(float)), *q = malloc((size_t)(B * hd) * sizeof(float));
    float *attn = malloc((size_t)(B * hd) * sizeof(float)), *gu = malloc((size_t)(B * 2 * I) * sizeof(float));
    float *act = malloc((size_t)(B * I) * sizeof(float)), *xs = malloc((size_t)B * sizeof(float));
    int8_t *xq = malloc((size_t)(B * widest));
    int rc = 0;
    if (!h || !tmp || !qkv || !q || !attn || !gu || !act || !xs || !xq) {
        rc = -1;
        goto done;
    }
    const float scale = 1.0f / sqrtf((float)D);
    const int vec = HR_AVX2 && D % 8 == 0;
#pragma omp parallel num_threads((int)num_threads)
    {
#pragma omp single
        for (int64_t b = 0; b < B; b++) memcpy(h + b * H, m->embed + ids[b] * H, (size_t)H * sizeof(float));
        for (int64_t l = 0; l < m->num_layers; l++) {
            const hr_q8_layer *ly = &m->layers[l];
#pragma omp single
            norm_quantize(h, B, H, ly->input_norm, m->eps, tmp, xq, xs);
            q8_linear_team(&ly->qkv, xq, xs, B, qkv, nqkv, 0);
#pragma omp single
            for (int64_t b = 0; b < B; b++)
                hr_rope_write_kv(qkv + b * nqkv, 1, nh, nkv, D, m->cos_table + positions[b] * D,
                                 m->sin_table + positions[b] * D, slots + b, ly->k_cache, ly->v_cache, m->num_slots,
                                 q + b * hd);
#pragma omp for schedule(static, 1)
            for (int64_t t = 0; t < B * nkv; t++) {
                const int64_t b = t / nkv, kh = t % nkv;
                hr_attend_one(q + b * hd + kh * group * D, ly->k_cache + kh * m->num_slots * D,
                              ly->v_cache + kh * m->num_slots * D, block_tables + b * max_blocks, seq_lens[b],
                              m->block_size, group, D, scale, attn + b * hd + kh * group * D, vec);
            }
#pragma omp single
            for (int64_t b = 0; b < B; b++) quantize_row(attn + b * hd, hd, xq + b * hd, xs + b);
            q8_linear_team(&ly->o, xq, xs, B, h, H, 1);
#pragma omp single
            norm_quantize(h, B, H, ly->post_norm, m->eps, tmp, xq, xs);
            q8_linear_team(&ly->gate_up, xq, xs, B, gu, 2 * I, 0);
            silu_mul_team(gu, B, I, act);
#pragma omp single
            for (int64_t b = 0; b < B; b++) quantize_row(act + b * I, I, xq + b * I, xs + b);
            q8_linear_team(&ly->down, xq, xs, B, h, H, 1);
        }
#pragma omp single
        norm_quantize(h, B, H, m->final_norm, m->eps, tmp, xq, xs);
        q8_linear_team(&m->lm_head, xq, xs, B, logits, m->vocab, 0);
    }
done:
    free(h), free(tmp), free(qkv), free(q), free(attn), free(gu), free(act), free(xs), free(xq);
    return rc;
}
