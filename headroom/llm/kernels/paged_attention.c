/* Paged attention for the CPU decode step, reading K/V in place from the block pool.
 *
 * Built by headroom/llm/kernels/paged_attention.py with the system C compiler
 * (-O3 -march=native -ffp-contract=off -fopenmp: no fast-math, no implicit FMA contraction, so every
 * elementwise op is the IEEE op torch does) and loaded with ctypes. OpenMP calls resolve to the libgomp
 * torch already loaded (same soname), so the kernel shares torch's thread team and thread count.
 *
 * Cache layout (one layer): K and V are [num_kv_heads, num_slots, head_dim] fp32, slot = block * block_size
 * + offset, so a block's keys for one kv head are block_size contiguous rows.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common.h"

int hr_abi_version(void) { return 5; }

int hr_has_avx2(void) { return HR_AVX2; }

/* One step's fused q/k/v projection output [T, (H + 2 Hkv) * D] (contiguous): rotate q into q_out [T, H, D],
 * rotate k and copy v into their cache slots. cos / sin_signed: [T, D] rows for each token's position. */
void hr_rope_write_kv(const float *qkv, int64_t num_tokens, int64_t num_heads, int64_t num_kv_heads,
                      int64_t head_dim, const float *cos_t, const float *sin_t, const int64_t *slot_mapping,
                      float *k_cache, float *v_cache, int64_t num_slots, float *q_out) {
    const int64_t d = head_dim, row = (num_heads + 2 * num_kv_heads) * d;
    for (int64_t t = 0; t < num_tokens; t++) {
        const float *x = qkv + t * row, *c = cos_t + t * d, *s = sin_t + t * d;
        const int64_t slot = slot_mapping[t];
        for (int64_t h = 0; h < num_heads; h++) rope_row(x + h * d, c, s, q_out + (t * num_heads + h) * d, d);
        for (int64_t h = 0; h < num_kv_heads; h++) {
            rope_row(x + (num_heads + h) * d, c, s, k_cache + (h * num_slots + slot) * d, d);
            memcpy(v_cache + (h * num_slots + slot) * d, x + (num_heads + num_kv_heads + h) * d,
                   (size_t)d * sizeof(float));
        }
    }
}


static inline float dot(const float *a, const float *b, int64_t d, int vec) {
#if HR_AVX2
    if (vec) {
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 16 <= d; i += 16) {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
        }
        for (; i < d; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        return hsum256(_mm256_add_ps(acc0, acc1));
    }
#endif
    (void)vec;
    float s = 0.0f;
    for (int64_t i = 0; i < d; i++) s += a[i] * b[i];
    return s;
}

/* p[j] = exp(s[j] - m) for j < n (p and s hold at least round_up(n, 8) floats) */
static inline void exp_shifted(const float *s, float *p, int64_t n, float m, int vec) {
#if HR_AVX2
    if (vec) {
        const __m256 mv = _mm256_set1_ps(m);
        for (int64_t j = 0; j < n; j += 8)
            _mm256_storeu_ps(p + j, exp256(_mm256_sub_ps(_mm256_loadu_ps(s + j), mv)));
        return;
    }
#endif
    (void)vec;
    for (int64_t j = 0; j < n; j++) p[j] = expf(s[j] - m);
}

/* acc[i] = acc[i] * a + p * v[i] */
static inline void axpy(float *acc, const float *v, float p, int64_t d, int vec) {
#if HR_AVX2
    if (vec) {
        const __m256 pv = _mm256_set1_ps(p);
        for (int64_t i = 0; i < d; i += 8)
            _mm256_storeu_ps(acc + i, _mm256_fmadd_ps(pv, _mm256_loadu_ps(v + i), _mm256_loadu_ps(acc + i)));
        return;
    }
#endif
    (void)vec;
    for (int64_t i = 0; i < d; i++) acc[i] += p * v[i];
}

/* The `group` query heads sharing kv head `kv` of one sequence: online softmax over its blocks. */
void hr_attend_one(const float *q, const float *k_head, const float *v_head, const int64_t *table,
                       int64_t seq_len, int64_t block_size, int64_t group, int64_t d, float scale, float *out,
                       int vec) {
    const int64_t padded = (block_size + 7) / 8 * 8;
    float m[group], l[group], acc[group * d], s[group * padded], p[group * padded];
    for (int64_t g = 0; g < group; g++) m[g] = -INFINITY, l[g] = 0.0f;
    memset(acc, 0, sizeof(acc));
    memset(s, 0, sizeof(s));
    const int64_t num_blocks = (seq_len + block_size - 1) / block_size;
    for (int64_t blk = 0; blk < num_blocks; blk++) {
        const int64_t n = seq_len - blk * block_size < block_size ? seq_len - blk * block_size : block_size;
        const float *kb = k_head + table[blk] * block_size * d, *vb = v_head + table[blk] * block_size * d;
        for (int64_t j = 0; j < n; j++)
            for (int64_t g = 0; g < group; g++) s[g * padded + j] = dot(q + g * d, kb + j * d, d, vec) * scale;
        for (int64_t g = 0; g < group; g++) {
            float *sg = s + g * padded, *pg = p + g * padded, *ag = acc + g * d;
            float bm = sg[0];
            for (int64_t j = 1; j < n; j++) bm = sg[j] > bm ? sg[j] : bm;
            if (bm > m[g]) {  /* a new running max: rescale what was accumulated so far */
                if (l[g] > 0.0f) {
                    const float corr = expf(m[g] - bm);
                    l[g] *= corr;
                    for (int64_t i = 0; i < d; i++) ag[i] *= corr;
                }
                m[g] = bm;
            }
            exp_shifted(sg, pg, n, m[g], vec);
            for (int64_t j = 0; j < n; j++) l[g] += pg[j];
        }
        for (int64_t j = 0; j < n; j++)
            for (int64_t g = 0; g < group; g++) axpy(acc + g * d, vb + j * d, p[g * padded + j], d, vec);
    }
    for (int64_t g = 0; g < group; g++)
        for (int64_t i = 0; i < d; i++) out[g * d + i] = l[g] > 0.0f ? acc[g * d + i] / l[g] : 0.0f;
}

/* Decode attention: one query token per sequence. Query head h uses kv head h / (num_heads / num_kv_heads).
 * q: the query of sequence b is the row q_rows[b] of q (row stride q_row_stride floats, heads contiguous);
 * block_tables: [num_seqs, max_blocks]; seq_lens[b]: keys sequence b attends (the causal limit);
 * out: [num_seqs, num_heads * head_dim]. Work is split over (sequence, kv head) with OpenMP when the step
 * attends at least min_parallel_keys keys in total. */
void hr_paged_decode_attention(const float *q, int64_t q_row_stride, const int64_t *q_rows, int64_t num_seqs,
                               int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, const float *k_cache,
                               const float *v_cache, int64_t num_slots, const int64_t *block_tables,
                               int64_t max_blocks, const int64_t *seq_lens, int64_t block_size, float scale,
                               float *out, int64_t min_parallel_keys) {
    const int64_t group = num_heads / num_kv_heads, d = head_dim, tasks = num_seqs * num_kv_heads;
    const int vec = HR_AVX2 && d % 8 == 0;
    int64_t total_keys = 0;
    for (int64_t b = 0; b < num_seqs; b++) total_keys += seq_lens[b];
#pragma omp parallel for schedule(static, 1) if (total_keys * num_kv_heads >= min_parallel_keys)
    for (int64_t task = 0; task < tasks; task++) {
        const int64_t b = task / num_kv_heads, h = task % num_kv_heads;
        hr_attend_one(q + q_rows[b] * q_row_stride + h * group * d, k_cache + h * num_slots * d,
                   v_cache + h * num_slots * d, block_tables + b * max_blocks, seq_lens[b], block_size, group, d,
                   scale, out + (b * num_heads + h * group) * d, vec);
    }
}
