/* Helpers shared by the CPU kernels (the .c files next to this header): AVX2 detection, a horizontal sum, a vector
 * exp, and the rotate-half RoPE of one head. */
#ifndef HR_COMMON_H
#define HR_COMMON_H
#include <math.h>
#include <stdint.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HR_AVX2 1
#else
#define HR_AVX2 0
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
/* AVX2 + FMA code in a file built for the baseline: called only after a run-time check (native_*.c) or from code
 * compiled with those features (HR_AVX2) */
#define HR_T_AVX2 __attribute__((target("avx2,fma")))
/* exp (Cephes expf: range reduction by ln 2, degree-5 polynomial, ~1-2 ulp) over [-87.3, 88.4], inputs clamped
 * to that range: below it ~1e-38 instead of 0, so callers never pass -inf (attention passes score - running max,
 * SiLU passes -x) */
HR_T_AVX2 static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3365447505531f));
    __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
    fx = _mm256_floor_ps(fx);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    const __m256 z = _mm256_mul_ps(x, x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, z, _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    __m256i n = _mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127));
    return _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(n, 23)));
}
#endif

/* x * cos + roll(x, D/2) * sin_signed (the rotate-half RoPE of headroom.llm.model.apply_rotary) */
static inline void rope_row(const float *x, const float *c, const float *s, float *o, int64_t d) {
    const int64_t half = d / 2;
    for (int64_t i = 0; i < half; i++) o[i] = x[i] * c[i] + x[i + half] * s[i];
    for (int64_t i = half; i < d; i++) o[i] = x[i] * c[i] + x[i - half] * s[i];
}

#if HR_AVX2
static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#endif

/* RoPE on a step's fused q/k/v rows, k and v written into their cache slots (paged_attention.c). */
void hr_rope_write_kv(const float *qkv, int64_t num_tokens, int64_t num_heads, int64_t num_kv_heads,
                      int64_t head_dim, const float *cos_t, const float *sin_t, const int64_t *slot_mapping,
                      float *k_cache, float *v_cache, int64_t num_slots, float *q_out);

/* The `group` query heads sharing one kv head of one sequence, attended over its blocks (paged_attention.c). */
void hr_attend_one(const float *q, const float *k_head, const float *v_head, const int64_t *table, int64_t seq_len,
                   int64_t block_size, int64_t group, int64_t d, float scale, float *out, int vec);

#endif
