/* Helpers shared by the two kernels on the packed layout (native_pack.c: AVX-512 VNNI; native_pack_avx2.c: AVX2):
 * lane l of a group's accumulator is block l, so a group needs no horizontal reduction; these fold a compact tail's
 * lanes, and sum an output's eight lanes with lane_sum8's fixed tree (for eight outputs at once). AVX2 code, inlined
 * into either path. */
#ifndef HR_NATIVE_PACKED_H
#define HR_NATIVE_PACKED_H
#include "native_blocks.h"

/* transposed activation bytes swept per weight row: 3/4 of a 32 KB L1d (measured best of 8 - 48 KB, both SIMD paths) */
#define HR_ACT_TILE_BYTES 24576

/* activation rows per tile of a packed GEMM with k inputs (wide: 16-bit, two bytes per value): its transposed values stay
 * in L1 while a chunk of weight rows (HR_ROWS_PER_CHUNK, in L1 / L2) is swept over them */
static inline int64_t hr_act_tile_rows(int64_t k, int wide) {
    const int64_t fit = HR_ACT_TILE_BYTES / ((wide ? 2 : 1) * HR_QT_STRIDE(k));
    return fit < 1 ? 1 : (fit > HR_M_TILE ? HR_M_TILE : fit);
}

#if HR_X86
/* a compact tail's lanes summed per block (lane l < nv = block l; exact int32 adds); nv = 8: unchanged */
__attribute__((always_inline)) T_AVX2 static inline __m256i fold_tail(__m256i s, int nv) {
    if (nv == 8) return s;
    s = _mm256_add_epi32(s, _mm256_permute2x128_si256(s, s, 0x01));
    return nv == 2 ? _mm256_add_epi32(s, _mm256_shuffle_epi32(s, 0x4E)) : s;
}

/* the lane sums of v[0..7], lane j = lane_sum8(v[j]) bit for bit: the same tree ((l0 + l4) + (l2 + l6)) + ((l1 + l5)
 * + (l3 + l7)) for eight vectors at once (fp32 adds are commutative, so only the association matters) */
__attribute__((always_inline)) T_AVX2 static inline __m256 lane_sums8(const __m256 *v) {
    __m256 s[4], w[2];
    for (int p = 0; p < 4; p++) /* [a0+a4, a1+a5, a2+a6, a3+a7 | b0+b4, ...] for the pair a, b = v[2p], v[2p+1] */
        s[p] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * p], v[2 * p + 1], 0x20),
                             _mm256_permute2f128_ps(v[2 * p], v[2 * p + 1], 0x31));
    for (int p = 0; p < 2; p++) /* per 128-bit half: [x even, x odd, y even, y odd], even = (l0+l4)+(l2+l6) */
        w[p] = _mm256_add_ps(_mm256_shuffle_ps(s[2 * p], s[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm256_shuffle_ps(s[2 * p], s[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    /* even + odd: [v0, v2, v4, v6 | v1, v3, v5, v7], then in order */
    const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                   _mm256_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* out[j * stride] (+)= the lane sum of acc[j] for j < n (n <= 8) */
__attribute__((always_inline)) T_AVX2 static inline void store_sums(float *out, int64_t stride, const __m256 *acc,
                                                                   int n, int accumulate) {
    __m256 v[8];
    for (int j = 0; j < 8; j++) v[j] = j < n ? acc[j] : _mm256_setzero_ps();
    float l[8];
    _mm256_storeu_ps(l, lane_sums8(v));
    for (int j = 0; j < n; j++) out[j * stride] = accumulate ? out[j * stride] + l[j] : l[j];
}

/* vectors per group of nt blocks (unpack_group) */
static inline int group_vectors(int nt) { return HR_COMPACT_TAIL(nt) ? nt : 8; }

#endif

/* hr_gemm_rows_packed on the AVX2 path: 8-bit inputs (a->qt); 16-bit ones as the planes a->qt / a->qtl (Q4_0, Q4_1)
 * or a->q16t (Q8_0) */
void hr_gemm_rows_packed_avx2(const hr_qtensor *w, const hr_qact *a, float *y, int64_t ldy, int accumulate, int64_t n0,
                              int64_t n1);

#endif
