/* Block helpers shared by the native GEMMs (native_gemm.c: 8-bit activations; native_gemm_wide.c: 16-bit and fp32
 * ones): the fixed lane tree, block sizes, the scalar / AVX2 fp32 dots, and the AVX2 block loads. */
#ifndef HR_NATIVE_BLOCKS_H
#define HR_NATIVE_BLOCKS_H
#include <string.h>

#include "native.h"

#define HR_M_TILE 64 /* activation rows whose accumulators stay in L1 while a weight row is swept */

static inline float lane_sum8(const float *a) {
    const float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
    return (s0 + s2) + (s1 + s3);
}

static inline int64_t block_bytes(int64_t fmt) { return fmt == HR_Q4_1 ? 20 : (fmt == HR_Q4_0 ? 18 : 34); }

static inline float dot_f32_scalar(const float *x, const float *w, int64_t k) {
    float acc[8] = {0};
    for (int64_t i = 0; i < k; i++) acc[i & 7] = acc[i & 7] + x[i] * w[i];
    return lane_sum8(acc);
}

#if HR_X86
/* eight int32x8 vectors -> their eight horizontal sums (exact) */
T_AVX2 static inline __m256i reduce8(const __m256i *s) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(s[4], s[5]), _mm256_hadd_epi32(s[6], s[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

T_AVX2 static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

T_AVX2 static inline float dot_f32_avx2(const float *x, const float *w, int64_t k) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(w + i)));
    float a[8];
    _mm256_storeu_ps(a, acc);
    for (; i < k; i++) a[i & 7] = a[i & 7] + x[i] * w[i];
    return lane_sum8(a);
}

/* The integers of the raw block at `blk` in one vector: Q4 nibbles (low halves, then high halves; Q4_0 minus 8), or
 * Q8_0's bytes. */
T_AVX2 static inline __m256i load_block(const uint8_t *blk, int64_t fmt) {
    if (fmt == HR_Q8_0) return _mm256_loadu_si256((const __m256i *)(blk + 2));
    /* the 16 bytes in both halves, the high half shifted right by 4, then the low nibble of every byte */
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + (fmt == HR_Q4_1 ? 4 : 2))));
    const __m256i q = _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(15));
    return fmt == HR_Q4_0 ? _mm256_sub_epi8(q, _mm256_set1_epi8(8)) : q;
}

/* d and m (fp16 at bytes 0 and 2 of each block) of the 8 blocks from `g`, bb bytes apart, as fp32 (one gather) */
T_AVX2 static inline void load_scales(const uint8_t *g, int64_t bb, __m256 *dw, __m256 *mw) {
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)bb));
    const __m256i raw = _mm256_i32gather_epi32((const int *)(const void *)g, idx, 1);
    const __m256i lo = _mm256_and_si256(raw, _mm256_set1_epi32(0xFFFF)), hi = _mm256_srli_epi32(raw, 16);
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8); /* [d0..d7 | m0..m7] */
    *dw = _mm256_cvtph_ps(_mm256_castsi256_si128(p));
    *mw = _mm256_cvtph_ps(_mm256_extracti128_si256(p, 1));
}
#endif

/* the block-format rows [n0, n1) of y with 16-bit (a->q16) or fp32 (a->q == NULL) activations (native_gemm_wide.c);
 * wf: a per-thread row buffer of HR_MAX_COLS floats */
void hr_gemm_rows_wide(const hr_qtensor *w, const hr_qact *a, float *y, int64_t ldy, int accumulate, int64_t isa,
                       int64_t n0, int64_t n1, float *wf);

#endif
