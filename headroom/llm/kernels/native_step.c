/* One whole model step on GGUF block-quantised weights, in one call (CPU): any flat mix of prefill chunks and
 * decodes of many sequences (native.py drives it).
 *
 * Per token: embedding row (dequantised), per layer RMSNorm, q/k/v (native_gemm.c), RoPE, K/V written into the
 * paged fp32 cache (TorchRunner's layout: [Hkv, num_slots, D] per layer), attention over the token's own sequence
 * positions [0, pos] through its block table, o-proj + residual, RMSNorm, gate/up, SiLU * up, down + residual; then
 * the final norm and the lm_head only for the rows that want logits.
 *
 * Batch invariance: every per-token computation reads only that token's row (and its own sequence's cache), in a
 * fixed order: the GEMMs' rows are independent (native_gemm.c), norms / quantisation / RoPE run per row, and each
 * query's attention walks its keys block by block from position 0. A step writes ALL its tokens' K/V of a layer
 * before any attention of that layer, so a chunk's queries see the chunk's own keys: whole and chunked prefill
 * give the same bits, alone or beside other sequences, on 1 or N threads.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "common.h"
#include "native.h"

/* Steps of at most this many tokens on 2+ threads give every thread its own copy of the activation buffers: each
 * thread norms / quantises / SiLUs every row itself (a few microseconds of duplicated work) instead of splitting the
 * rows and waiting at a barrier, which halves the step's barriers (each a futex wake-up under OMP_WAIT_POLICY=passive).
 * The ops per row are the same either way, so the bits are too. */
#define HR_PRIVATE_ROWS 8
/* down_proj's input bits: 16 (the packed 16-bit kernel; whole-corpus gate 97.40% top-1, +0.135% ppl) or 32 (fp32,
 * not quantised: 97.59%, +0.12%, ~3x slower at batch 1); docs/native_kernels.md, the quality section */
#define HR_DOWN_BITS 16

int hr_has_avx2(void);

typedef struct {
    const float *input_norm, *post_norm;   /* [hidden] RMSNorm weights */
    const float *q_bias, *k_bias, *v_bias; /* [H D], [Hkv D], [Hkv D], or NULL (Qwen2 has them) */
    hr_qtensor q, k, v, o, gate, up, down;
    float *k_cache, *v_cache; /* [Hkv, num_slots, D] fp32 */
} hr_native_layer;

typedef struct {
    int64_t num_layers, hidden, num_heads, num_kv_heads, head_dim, intermediate, vocab;
    int64_t num_slots, block_size, max_positions;
    float eps;
    hr_qtensor embed;                   /* [vocab, hidden], any format */
    const float *cos_table, *sin_table; /* [max_positions, D]: Rotary.cos and Rotary.sin_signed */
    const float *final_norm;            /* [hidden] */
    const hr_native_layer *layers;      /* [num_layers] */
    hr_qtensor lm_head;                 /* [vocab, hidden] (the embedding when tied) */
} hr_native_model;

/* y = x / sqrt(mean(x^2) + eps) * w (sequential sum: a fixed order per row) */
static void rms_norm(const float *x, int64_t n, const float *w, float eps, float *y) {
    float ss = 0.0f;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

/* where a step's activations are quantised (q8 values, the VNNI path's transposed copy, 16-bit values, block
 * scales and sums). Inputs are 8-bit except down_proj's and the lm_head's (16-bit, HR_DOWN_BITS): 8 bits there
 * cost the quality gate its top-1 agreement (docs/native_kernels.md). */
typedef struct {
    int8_t *q, *qt, *qtl; /* qtl: the low plane of 16-bit values on the VNNI path (qt then holds the high one) */
    int16_t *q16, *q16t; /* q16t: the AVX2 path's transposed 16-bit values (hr_transpose16) */
    float *d, *s;
    int priv; /* this thread's own copy (every row done here, no barrier) or shared (rows split over the team) */
} act_bufs;

/* bits: 8, 16 or 32 (fp32, not quantised) */
static void bind(hr_qact *a, const float *x, int64_t m, int64_t k, const act_bufs *b, int bits) {
    a->x = x, a->q = bits == 32 ? NULL : b->q, a->qt = b->qt, a->q16 = bits == 16 ? b->q16 : NULL;
    a->d = b->d, a->s = b->s, a->m = m, a->k = k, a->qtl = bits == 16 ? b->qtl : NULL;
    a->q16t = bits == 16 ? b->q16t : NULL;
}

static void quantize_row_t(const float *x, int64_t t, int64_t k, const act_bufs *b, int64_t isa, int bits) {
    const int64_t nb = k / HR_QK;
    if (bits == 32) return;
    if (bits == 16) {
        hr_quantize_rows16_isa(x + t * k, 1, k, b->q16 + t * k, b->d + t * nb, b->s + t * nb, isa);
        if (isa != HR_ISA_SCALAR) /* the packed kernels' two byte planes */
            hr_split16_planes(b->q16 + t * k, 1, k, b->qt + t * HR_QT_STRIDE(k), b->qtl + t * HR_QT_STRIDE(k));
        if (isa == HR_ISA_AVX2) hr_transpose16(b->q16 + t * k, 1, k, b->q16t + t * HR_QT_STRIDE(k));
    } else hr_quantize_rows_isa(x + t * k, 1, k, b->q + t * k, b->d + t * nb, b->s + t * nb, b->qt + t * HR_QT_STRIDE(k), isa);
}

/* rows of src [T, k] -> an activation: every row on this thread (b->priv), else split over the team (implicit
 * barrier at the end) */
static void quantize_team(const float *src, int64_t T, int64_t k, hr_qact *a, const act_bufs *b, int64_t isa,
                          int bits) {
    bind(a, src, T, k, b, bits);
    if (b->priv) {
        for (int64_t t = 0; t < T; t++) quantize_row_t(src, t, k, b, isa, bits);
        return;
    }
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; t++) quantize_row_t(src, t, k, b, isa, bits);
}

/* RMSNorm of rows[r] of h (r < R; NULL: row r) into xn row r, quantised in the same pass (bits 8 or 16) */
static void norm_quantize_team(const float *h, const int64_t *rows, int64_t R, int64_t k, const float *w, float eps,
                               float *xn, hr_qact *a, const act_bufs *b, int64_t isa, int bits) {
    bind(a, xn, R, k, b, bits);
    if (b->priv) {
        for (int64_t r = 0; r < R; r++) {
            rms_norm(h + (rows ? rows[r] : r) * k, k, w, eps, xn + r * k);
            quantize_row_t(xn, r, k, b, isa, bits);
        }
        return;
    }
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; r++) {
        rms_norm(h + (rows ? rows[r] : r) * k, k, w, eps, xn + r * k);
        quantize_row_t(xn, r, k, b, isa, bits);
    }
}

/* out[i] = silu(g[i]) * u[i] over one row (out may be g): 8 at a time with the vector exp on a SIMD path, libm's expf
 * otherwise and for the tail (each element's ops depend only on its index and the path) */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
HR_T_AVX2 static int64_t silu_mul_avx2(float *out, const float *g, const float *u, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 e = exp256(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        const __m256 sv = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(sv, _mm256_loadu_ps(u + i)));
    }
    return i;
}
#endif

static void silu_mul(float *out, const float *g, const float *u, int64_t n, int64_t isa) {
    int64_t i = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    if (isa != HR_ISA_SCALAR) i = silu_mul_avx2(out, g, u, n);
#endif
    (void)isa;
    for (; i < n; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* silu(g) * u over g's rows (down_proj's input), quantised to `bits` (16 or 32 = fp32 kept): into this thread's own
 * rows `mine` (b->priv), else in place over g, rows split over the team */
static void silu_quantize_team(float *g, const float *u, float *mine, int64_t T, int64_t k, hr_qact *a,
                               const act_bufs *b, int64_t isa, int bits) {
    float *dst = b->priv ? mine : g;
    bind(a, dst, T, k, b, bits);
    if (b->priv) {
        for (int64_t t = 0; t < T; t++) {
            silu_mul(mine + t * k, g + t * k, u + t * k, k, isa);
            quantize_row_t(mine, t, k, b, isa, bits);
        }
        return;
    }
#pragma omp for schedule(static)
    for (int64_t t = 0; t < T; t++) {
        silu_mul(g + t * k, g + t * k, u + t * k, k, isa);
        quantize_row_t(g, t, k, b, isa, bits);
    }
}

/* token t's heads of K/V group kh: the biases, RoPE of its q heads into qr and of its k head into the cache at `slot`,
 * its v head into the cache */
static void rope_group(const hr_native_model *m, const hr_native_layer *ly, int64_t t, int64_t kh, int64_t pos,
                       int64_t slot, float *qb, float *kb, float *vb, float *qr) {
    const int64_t D = m->head_dim, hd = m->num_heads * D, kvd = m->num_kv_heads * D;
    const int64_t group = m->num_heads / m->num_kv_heads;
    float *qt = qb + t * hd, *kt = kb + t * kvd, *vt = vb + t * kvd;
    const float *c = m->cos_table + pos * D, *sn = m->sin_table + pos * D;
    for (int64_t i = kh * group * D; ly->q_bias && i < (kh + 1) * group * D; i++) qt[i] = qt[i] + ly->q_bias[i];
    for (int64_t i = kh * D; ly->k_bias && i < (kh + 1) * D; i++) kt[i] = kt[i] + ly->k_bias[i];
    for (int64_t i = kh * D; ly->v_bias && i < (kh + 1) * D; i++) vt[i] = vt[i] + ly->v_bias[i];
    for (int64_t hh = kh * group; hh < (kh + 1) * group; hh++) rope_row(qt + hh * D, c, sn, qr + t * hd + hh * D, D);
    rope_row(kt + kh * D, c, sn, ly->k_cache + (kh * m->num_slots + slot) * D, D);
    memcpy(ly->v_cache + (kh * m->num_slots + slot) * D, vt + kh * D, (size_t)D * sizeof(float));
}

static int check_step(const hr_native_model *m, int64_t T, const int64_t *ids, const int64_t *pos,
                      const int64_t *seq_of, int64_t num_seqs, const int64_t *tables, int64_t max_blocks,
                      const int64_t *logit_rows, int64_t num_logits, int64_t isa) {
    const int64_t num_blocks = m->num_slots / m->block_size;
    if (T < 1 || num_seqs < 1 || max_blocks < 1 || num_logits < 0) return -2;
    if (hr_check_tensor(&m->embed, isa) || hr_check_tensor(&m->lm_head, isa)) return -2;
    for (int64_t t = 0; t < T; t++) {
        if (ids[t] < 0 || ids[t] >= m->vocab || pos[t] < 0 || pos[t] >= m->max_positions || seq_of[t] < 0 ||
            seq_of[t] >= num_seqs || pos[t] / m->block_size >= max_blocks)
            return -2;
        const int64_t *table = tables + seq_of[t] * max_blocks;
        for (int64_t b = 0; b <= pos[t] / m->block_size; b++)
            if (table[b] < 0 || table[b] >= num_blocks) return -2;
    }
    for (int64_t r = 0; r < num_logits; r++)
        if (logit_rows[r] < 0 || logit_rows[r] >= T) return -2;
    return 0;
}

/* A step of T tokens: token t is ids[t] at position pos[t] of sequence seq_of[t], whose block table is
 * tables[seq_of[t] * max_blocks ...]; logits [num_logits, vocab] for the tokens logit_rows[]. Returns 0; -1 out of
 * memory; -2 an id, position, sequence, block or row out of range, or a bad weight / path (nothing written); -3
 * cancelled: *cancel (NULL: never) was non-zero at the end of a layer, so the step stopped there (the logits are not
 * written; the step's tokens' K/V may be, in the slots the step was given). */
int hr_native_step(const hr_native_model *m, int64_t T, const int64_t *ids, const int64_t *pos, const int64_t *seq_of,
                   int64_t num_seqs, const int64_t *tables, int64_t max_blocks, const int64_t *logit_rows,
                   int64_t num_logits, float *logits, int64_t isa, int64_t num_threads, const int *cancel) {
    if (num_threads < 1 || check_step(m, T, ids, pos, seq_of, num_seqs, tables, max_blocks, logit_rows, num_logits, isa))
        return -2;
    const int64_t H = m->hidden, nh = m->num_heads, nkv = m->num_kv_heads, D = m->head_dim, I = m->intermediate;
    const int64_t hd = nh * D, kvd = nkv * D, group = nh / nkv, bs = m->block_size;
    const int64_t wide = I > hd ? (I > H ? I : H) : (hd > H ? hd : H);
    const int priv = T <= HR_PRIVATE_ROWS && num_threads > 1;
    const int64_t copies = priv ? num_threads : 1; /* of the activation buffers */
    const int64_t TR = T > num_logits ? T : num_logits, aw = TR * wide; /* activation rows (tokens or logit rows) */
    float *h = malloc((size_t)(T * H) * sizeof(float)), *xn = malloc((size_t)(copies * aw) * sizeof(float));
    float *qb = malloc((size_t)(T * hd) * sizeof(float)), *kb = malloc((size_t)(T * kvd) * sizeof(float));
    float *vb = malloc((size_t)(T * kvd) * sizeof(float)), *qr = malloc((size_t)(T * hd) * sizeof(float));
    float *g = malloc((size_t)(T * I) * sizeof(float)), *u = malloc((size_t)(T * I) * sizeof(float));
    const int64_t nbw = aw / HR_QK + 1, qtw = TR * HR_QT_STRIDE(wide);
    float *d = malloc((size_t)(copies * nbw) * sizeof(float)), *s = malloc((size_t)(copies * nbw) * sizeof(float));
    int64_t *slot = malloc((size_t)T * sizeof(int64_t));
    unsigned char *seen = calloc((size_t)num_seqs, 1);
    int8_t *q8 = malloc((size_t)(copies * aw)), *q8t = malloc((size_t)(copies * qtw));
    int8_t *q8tl = malloc((size_t)(copies * qtw));
    int16_t *q16 = malloc((size_t)(copies * aw) * sizeof(int16_t));
    int16_t *q16t = malloc((size_t)(copies * qtw) * sizeof(int16_t));
    int rc = 0;
    if (!h || !xn || !qb || !kb || !vb || !qr || !g || !u || !d || !s || !slot || !seen || !q8 || !q8t || !q8tl || !q16 || !q16t) {
        rc = -1;
        goto done;
    }
    for (int64_t l = 0; l < m->num_layers; l++) {
        const hr_native_layer *ly = &m->layers[l];
        const hr_qtensor *ws[7] = {&ly->q, &ly->k, &ly->v, &ly->o, &ly->gate, &ly->up, &ly->down};
        for (int i = 0; i < 7; i++)
            if (hr_check_tensor(ws[i], isa)) {
                rc = -2;
                goto done;
            }
    }
    for (int64_t t = 0; t < T; t++) slot[t] = tables[seq_of[t] * max_blocks + pos[t] / bs] * bs + pos[t] % bs;
    /* every token its sequence's only one in the step (decode): a query then needs no other token's K/V of this step,
     * so each attention task writes its own token's K/V first (one barrier less per layer) */
    int own = 1;
    for (int64_t t = 0; t < T; t++) own = own && !seen[seq_of[t]]++;
    const float scale = 1.0f / sqrtf((float)D);
    const int vec = isa != HR_ISA_SCALAR && hr_has_avx2() && D % 8 == 0;
    int stop = 0; /* written once, by the master thread before a layer's last barrier; read by all after it */
#pragma omp parallel num_threads((int)num_threads)
    {
        hr_qact a;
        const int64_t c = priv ? omp_get_thread_num() : 0; /* this thread's copy of the activation buffers */
        const act_bufs bufs = {q8 + c * aw,  q8t + c * qtw, q8tl + c * qtw, q16 + c * aw, q16t + c * qtw,
                               d + c * nbw, s + c * nbw,   priv};
        float *xs = xn + c * aw;
#pragma omp for schedule(static)
        for (int64_t t = 0; t < T; t++) hr_dequantize_row(&m->embed, ids[t], h + t * H);
        for (int64_t l = 0; l < m->num_layers; l++) {
            const hr_native_layer *ly = &m->layers[l];
            norm_quantize_team(h, NULL, T, H, ly->input_norm, m->eps, xs, &a, &bufs, isa, 8);
            hr_gemm_team(&ly->q, &a, qb, hd, 0, isa); /* q, k, v: no barrier between (independent outputs) */
            hr_gemm_team(&ly->k, &a, kb, kvd, 0, isa);
            hr_gemm_team(&ly->v, &a, vb, kvd, 0, isa);
#pragma omp barrier
            if (!own) {
#pragma omp for schedule(static)
                for (int64_t t = 0; t < T; t++)
                    for (int64_t kh = 0; kh < nkv; kh++) rope_group(m, ly, t, kh, pos[t], slot[t], qb, kb, vb, qr);
            }
            /* every K/V of the step is written (the barrier above, or this task's own) before any query attends */
#pragma omp for schedule(dynamic, 1)
            for (int64_t task = 0; task < T * nkv; task++) {
                const int64_t t = task / nkv, kh = task % nkv;
                if (own) rope_group(m, ly, t, kh, pos[t], slot[t], qb, kb, vb, qr);
                hr_attend_one(qr + t * hd + kh * group * D, ly->k_cache + kh * m->num_slots * D,
                              ly->v_cache + kh * m->num_slots * D, tables + seq_of[t] * max_blocks, pos[t] + 1, bs,
                              group, D, scale, qb + t * hd + kh * group * D, vec);
            }
            quantize_team(qb, T, hd, &a, &bufs, isa, 8);
            hr_gemm_team(&ly->o, &a, h, H, 1, isa);
#pragma omp barrier
            norm_quantize_team(h, NULL, T, H, ly->post_norm, m->eps, xs, &a, &bufs, isa, 8);
            hr_gemm_team(&ly->gate, &a, g, I, 0, isa);
            hr_gemm_team(&ly->up, &a, u, I, 0, isa);
#pragma omp barrier
            silu_quantize_team(g, u, xs, T, I, &a, &bufs, isa, HR_DOWN_BITS);
            hr_gemm_team(&ly->down, &a, h, H, 1, isa);
#pragma omp master
            if (cancel && __atomic_load_n(cancel, __ATOMIC_ACQUIRE)) __atomic_store_n(&stop, 1, __ATOMIC_RELAXED);
#pragma omp barrier
            if (__atomic_load_n(&stop, __ATOMIC_RELAXED)) break; /* every thread leaves at the same layer */
        }
        if (num_logits > 0 && !__atomic_load_n(&stop, __ATOMIC_RELAXED)) {
            norm_quantize_team(h, logit_rows, num_logits, H, m->final_norm, m->eps, xs, &a, &bufs, isa, 16);
            hr_gemm_team(&m->lm_head, &a, logits, m->vocab, 0, isa);
        }
    }
    if (stop) rc = -3;
done:
    free(h), free(xn), free(qb), free(kb), free(vb), free(qr), free(g), free(u), free(d), free(s);
    free(slot), free(seen), free(q8), free(q8t), free(q8tl), free(q16), free(q16t);
    return rc;
}
