/* Block-format GEMMs with wider activations than q8 (quant_blocks.reference_matmul's act_bits 16 and 32) on the GGUF
 * layout: the step runs down_proj and the lm_head on 16-bit inputs (HR_DOWN_BITS), where 8-bit inputs cost the
 * quality gate its top-1 agreement (docs/native_kernels.md); the VNNI path reads their packed layout instead
 * (native_pack.c), the scalar and AVX2 paths these.
 *
 * - 16 bits: per block the exact int32 dot of the weight integers and the int16 values (AVX2 vpmaddwd: |w x| * 2 <
 *   2^31), (float)isum rounded once, then dot_q_scalar's fp32 ops in its order; both SIMD paths run the AVX2 code
 *   (integer sums are exact, so the path cannot change a bit).
 * - fp32: the row dequantised (q * d, + m for Q4_1: quant_blocks.dequantize's two rounded ops), then the F32 dot
 *   (x[k] * w[k] into lane k % 8, the lane tree).
 */
#include "native_blocks.h"

/* weight integer j of a raw block (Q4_0 minus 8) */
static inline int block_int(const uint8_t *blk, int64_t fmt, int j) {
    if (fmt == HR_Q8_0) return (int8_t)blk[2 + j];
    const uint8_t byte = blk[(fmt == HR_Q4_1 ? 4 : 2) + (j & 15)];
    return (j < 16 ? byte & 15 : byte >> 4) - (fmt == HR_Q4_0 ? 8 : 0);
}

/* dot_q_scalar (native_gemm.c) with activation row i's 16-bit values, straight from the raw row */
static float dot_q16_scalar(const hr_qtensor *w, const uint8_t *row, const hr_qact *a, int64_t i) {
    const int64_t k = w->cols, nb = k / HR_QK, bb = block_bytes(w->fmt);
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bb;
        const int16_t *x = a->q16 + i * k + b * HR_QK;
        int32_t isum = 0;
        for (int j = 0; j < HR_QK; j++) isum += (int32_t)block_int(blk, w->fmt, j) * (int32_t)x[j];
        uint16_t h;
        memcpy(&h, blk, 2);
        float v = (hr_f16_to_f32(h) * a->d[i * nb + b]) * (float)isum;
        if (w->fmt == HR_Q4_1) memcpy(&h, blk + 2, 2), v = v + hr_f16_to_f32(h) * a->s[i * nb + b];
        acc[b & 7] = acc[b & 7] + v;
    }
    return lane_sum8(acc);
}

/* row of a block format -> fp32 wf [cols], scalar */
static void dequantize_row_scalar(const hr_qtensor *w, const uint8_t *row, float *wf) {
    const int64_t nb = w->cols / HR_QK, bb = block_bytes(w->fmt);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bb;
        uint16_t h;
        memcpy(&h, blk, 2);
        const float d = hr_f16_to_f32(h);
        float m = 0.0f;
        if (w->fmt == HR_Q4_1) memcpy(&h, blk + 2, 2), m = hr_f16_to_f32(h);
        for (int j = 0; j < HR_QK; j++) {
            float f = (float)block_int(blk, w->fmt, j) * d;
            if (w->fmt == HR_Q4_1) f = f + m;
            wf[b * HR_QK + j] = f;
        }
    }
}

#if HR_X86
/* one block's 32 weight integers (signed bytes, load_block's order) widened to two int16 vectors */
T_AVX2 static inline void widen16(__m256i wv, __m256i *lo, __m256i *hi) {
    *lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(wv));
    *hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(wv, 1));
}

/* the exact int32 lanes of one block's dot with 32 16-bit activations (|w x| * 2 < 2^31: vpmaddwd is exact) */
T_AVX2 static inline __m256i dot16(__m256i lo, __m256i hi, const int16_t *x) {
    return _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_loadu_si256((const __m256i *)x)),
                            _mm256_madd_epi16(hi, _mm256_loadu_si256((const __m256i *)(x + 16))));
}

/* HR_ROW_Q with 16-bit activations (a->q16): each group of 8 blocks widened once for up to 64 rows; both SIMD
 * paths (integer sums are exact, so the path does not change a bit) */
__attribute__((always_inline)) T_AVX2 static inline void row_q16_body(const hr_qtensor *w, const uint8_t *row,
                                                                      const hr_qact *a, float *y, int64_t ldy,
                                                                      int64_t n, int accumulate) {
    const int64_t k = w->cols, nb = k / HR_QK, bb = block_bytes(w->fmt), full = nb / 8 * 8;
    const int q41 = w->fmt == HR_Q4_1;
    for (int64_t i0 = 0; i0 < a->m; i0 += HR_M_TILE) {
        const int64_t i1 = i0 + HR_M_TILE < a->m ? i0 + HR_M_TILE : a->m;
        __m256 acc[HR_M_TILE];
        for (int64_t i = i0; i < i1; i++) acc[i - i0] = _mm256_setzero_ps();
        for (int64_t b = 0; b < full; b += 8) {
            const uint8_t *g = row + b * bb;
            __m256i lo[8], hi[8], sums[8];
            for (int j = 0; j < 8; j++) widen16(load_block(g + j * bb, w->fmt), &lo[j], &hi[j]);
            __m256 dw, mw;
            load_scales(g, bb, &dw, &mw);
            for (int64_t i = i0; i < i1; i++) {
                const int16_t *x = a->q16 + i * k + b * HR_QK;
                for (int j = 0; j < 8; j++) sums[j] = dot16(lo[j], hi[j], x + j * HR_QK);
                __m256 v = _mm256_mul_ps(_mm256_mul_ps(dw, _mm256_loadu_ps(a->d + i * nb + b)),
                                         _mm256_cvtepi32_ps(reduce8(sums)));
                if (q41) v = _mm256_add_ps(v, _mm256_mul_ps(mw, _mm256_loadu_ps(a->s + i * nb + b)));
                acc[i - i0] = _mm256_add_ps(acc[i - i0], v);
            }
        }
        for (int64_t i = i0; i < i1; i++) {
            float l[8];
            _mm256_storeu_ps(l, acc[i - i0]);
            for (int64_t b = full; b < nb; b++) {
                const uint8_t *blk = row + b * bb;
                __m256i lo, hi;
                widen16(load_block(blk, w->fmt), &lo, &hi);
                uint16_t h;
                memcpy(&h, blk, 2);
                float v = (_cvtsh_ss(h) * a->d[i * nb + b]) * (float)hsum_i32(dot16(lo, hi, a->q16 + i * k + b * HR_QK));
                if (q41) memcpy(&h, blk + 2, 2), v = v + _cvtsh_ss(h) * a->s[i * nb + b];
                l[b & 7] = l[b & 7] + v;
            }
            const float v = lane_sum8(l);
            float *out = y + i * ldy + n;
            *out = accumulate ? *out + v : v;
        }
    }
}

/* the same code for each SIMD path: compiled for AVX-512VL it keeps the 16 widened weight vectors in registers */
T_AVX2 static void row_q16_avx2(const hr_qtensor *w, const uint8_t *row, const hr_qact *a, float *y, int64_t ldy,
                                int64_t n, int accumulate) {
    row_q16_body(w, row, a, y, ldy, n, accumulate);
}
T_VNNI static void row_q16_vnni(const hr_qtensor *w, const uint8_t *row, const hr_qact *a, float *y, int64_t ldy,
                                int64_t n, int accumulate) {
    row_q16_body(w, row, a, y, ldy, n, accumulate);
}


/* one raw block as fp32 f[0..3] (8 values each): q * d, + m for Q4_1 (dequantize_row_scalar's two rounded ops) */
__attribute__((always_inline)) T_AVX2 static inline void dequantize_block_avx2(const uint8_t *blk, int64_t fmt,
                                                                              __m256 *f) {
    const __m256i q = load_block(blk, fmt);
    uint16_t h;
    memcpy(&h, blk, 2);
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
    memcpy(&h, blk + 2, 2);
    const __m256 m = _mm256_set1_ps(_cvtsh_ss(h));
    const __m128i half[2] = {_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)};
    for (int j = 0; j < 4; j++) {
        const __m128i part = (j & 1) ? _mm_srli_si128(half[j >> 1], 8) : half[j >> 1];
        f[j] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part)), d);
        if (fmt == HR_Q4_1) f[j] = _mm256_add_ps(f[j], m);
    }
}

/* dequantize_row_scalar with AVX2 (the same two rounded ops per value) */
T_AVX2 static void dequantize_row_avx2(const hr_qtensor *w, const uint8_t *row, float *wf) {
    const int64_t nb = w->cols / HR_QK, bb = block_bytes(w->fmt);
    for (int64_t b = 0; b < nb; b++) {
        __m256 f[4];
        dequantize_block_avx2(row + b * bb, w->fmt, f);
        for (int j = 0; j < 4; j++) _mm256_storeu_ps(wf + b * HR_QK + 8 * j, f[j]);
    }
}

/* NR weight rows (rb bytes apart) against one fp32 activation row, dequantised in registers (quant_blocks'
 * dequantize: q * d, + m for Q4_1) and accumulated as dot_f32_avx2 does (x[k] * w[k] into lane k % 8): the NR
 * independent chains hide the add latency */
__attribute__((always_inline)) T_AVX2 static inline void rows_f32_avx2(const hr_qtensor *w, const uint8_t *row,
                                                                      int64_t rb, const float *x, float *out,
                                                                      const int nr) {
    const int64_t nb = w->cols / HR_QK, bb = block_bytes(w->fmt);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        __m256 xv[4];
        for (int j = 0; j < 4; j++) xv[j] = _mm256_loadu_ps(x + b * HR_QK + 8 * j);
        for (int r = 0; r < nr; r++) {
            __m256 f[4];
            dequantize_block_avx2(row + r * rb + b * bb, w->fmt, f);
            for (int j = 0; j < 4; j++) acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(xv[j], f[j]));
        }
    }
    for (int r = 0; r < nr; r++) {
        float l[8];
        _mm256_storeu_ps(l, acc[r]);
        out[r] = lane_sum8(l);
    }
}

/* rows_f32_avx2 for Q4_0 / Q4_1 on the VNNI path (AVX-512VL): each block's 16 possible values n * d [+ m] are built
 * once (the same two rounded ops per value as dequantize), then every weight is a vpermt2ps lookup indexed by its
 * raw nibble (the index's bits above 3 are ignored, so the low half needs no mask and the high half one shift) */
__attribute__((always_inline)) T_VNNI static inline void rows_f32_lut(const hr_qtensor *w, const uint8_t *row,
                                                                     int64_t rb, const float *x, float *out,
                                                                     const int nr) {
    const int64_t nb = w->cols / HR_QK, bb = block_bytes(w->fmt), q41 = w->fmt == HR_Q4_1;
    const __m256 lo_n = q41 ? _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7) : _mm256_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1);
    const __m256 hi_n = q41 ? _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15) : _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < nb; b++) {
        __m256 xv[4];
        for (int j = 0; j < 4; j++) xv[j] = _mm256_loadu_ps(x + b * HR_QK + 8 * j);
        for (int r = 0; r < nr; r++) {
            const uint8_t *blk = row + r * rb + b * bb, *qs = blk + (q41 ? 4 : 2);
            uint16_t h;
            memcpy(&h, blk, 2);
            const __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
            __m256 lo = _mm256_mul_ps(lo_n, d), hi = _mm256_mul_ps(hi_n, d);
            if (q41) {
                memcpy(&h, blk + 2, 2);
                const __m256 m = _mm256_set1_ps(_cvtsh_ss(h));
                lo = _mm256_add_ps(lo, m), hi = _mm256_add_ps(hi, m);
            }
            const __m256i i0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)qs));
            const __m256i i1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qs + 8)));
            const __m256i idx[4] = {i0, i1, _mm256_srli_epi32(i0, 4), _mm256_srli_epi32(i1, 4)};
            for (int j = 0; j < 4; j++)
                acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(xv[j], _mm256_permutex2var_ps(lo, idx[j], hi)));
        }
    }
    for (int r = 0; r < nr; r++) {
        float l[8];
        _mm256_storeu_ps(l, acc[r]);
        out[r] = lane_sum8(l);
    }
}

/* one fp32 activation row against Q4 rows [n0, n1) with rows_f32_lut, four weight rows at a time */
T_VNNI static void gemm_f32_lut(const hr_qtensor *w, const float *x, float *y, int accumulate, int64_t n0,
                                int64_t n1) {
    const int64_t rb = hr_row_bytes(w->fmt, w->cols);
    for (int64_t n = n0; n < n1;) {
        float v[4];
        const int nr = n1 - n >= 4 ? 4 : 1;
        if (nr == 4) rows_f32_lut(w, w->data + n * rb, rb, x, v, 4);
        else rows_f32_lut(w, w->data + n * rb, rb, x, v, 1);
        for (int r = 0; r < nr; r++) y[n + r] = accumulate ? y[n + r] + v[r] : v[r];
        n += nr;
    }
}

/* one dequantised row wf against activation rows i0 .. i0 + NR - 1 (independent chains), dot_f32_avx2's order */
__attribute__((always_inline)) T_AVX2 static inline void cols_f32_avx2(const float *wf, const float *x, int64_t k,
                                                                      float *out, const int nr) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t c = 0; c < k; c += 8) {
        const __m256 wv = _mm256_loadu_ps(wf + c);
        for (int r = 0; r < nr; r++) acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(_mm256_loadu_ps(x + r * k + c), wv));
    }
    for (int r = 0; r < nr; r++) {
        float l[8];
        _mm256_storeu_ps(l, acc[r]);
        out[r] = lane_sum8(l);
    }
}

/* two dequantised weight rows (wf, wf + k) against NX activation rows from x (k apart): 2 x NX independent chains,
 * each activation vector loaded once for both weight rows (dot_f32_avx2's order per output) */
__attribute__((always_inline)) T_VNNI static inline void tile_f32_2x(const float *wf, const float *x, int64_t k,
                                                                    float *out0, float *out1, const int nx) {
    __m256 acc[2][4];
    for (int r = 0; r < 4; r++) acc[0][r] = _mm256_setzero_ps(), acc[1][r] = _mm256_setzero_ps();
    for (int64_t c = 0; c < k; c += 8) {
        const __m256 w0 = _mm256_loadu_ps(wf + c), w1 = _mm256_loadu_ps(wf + k + c);
        for (int r = 0; r < nx; r++) {
            const __m256 xv = _mm256_loadu_ps(x + r * k + c);
            acc[0][r] = _mm256_add_ps(acc[0][r], _mm256_mul_ps(xv, w0));
            acc[1][r] = _mm256_add_ps(acc[1][r], _mm256_mul_ps(xv, w1));
        }
    }
    for (int r = 0; r < nx; r++) {
        float l[8];
        _mm256_storeu_ps(l, acc[0][r]);
        out0[r] = lane_sum8(l);
        _mm256_storeu_ps(l, acc[1][r]);
        out1[r] = lane_sum8(l);
    }
}

/* several activation rows on the VNNI path (32 vector registers): weight rows two at a time, dequantised once into
 * wf, against four activation rows at a time; returns the first row it left (n1 unless a pair did not fit) */
T_VNNI static int64_t gemm_f32_pairs(const hr_qtensor *w, const hr_qact *a, float *y, int64_t ldy, int accumulate,
                                     int64_t n0, int64_t n1, float *wf) {
    const int64_t k = w->cols, rb = hr_row_bytes(w->fmt, k);
    if (2 * k > HR_MAX_COLS) return n0;
    int64_t n = n0;
    for (; n + 2 <= n1; n += 2) {
        dequantize_row_avx2(w, w->data + n * rb, wf);
        dequantize_row_avx2(w, w->data + (n + 1) * rb, wf + k);
        for (int64_t i = 0; i < a->m;) {
            float v0[4], v1[4];
            const int nx = a->m - i >= 4 ? 4 : 1;
            if (nx == 4) tile_f32_2x(wf, a->x + i * k, k, v0, v1, 4);
            else tile_f32_2x(wf, a->x + i * k, k, v0, v1, 1);
            for (int r = 0; r < nx; r++) {
                float *o = y + (i + r) * ldy + n;
                o[0] = accumulate ? o[0] + v0[r] : v0[r];
                o[1] = accumulate ? o[1] + v1[r] : v1[r];
            }
            i += nx;
        }
    }
    return n;
}

/* rows [n0, n1) for every activation row, fp32 activations: one row, four weight rows at a time, dequantised in
 * registers; more rows: each weight row dequantised once into wf, four activation rows at a time */
T_AVX2 static void gemm_f32_avx2(const hr_qtensor *w, const hr_qact *a, float *y, int64_t ldy, int accumulate,
                                 int64_t n0, int64_t n1, float *wf) {
    const int64_t k = w->cols, rb = hr_row_bytes(w->fmt, k);
    if (a->m > 1) {
        for (int64_t n = n0; n < n1; n++) {
            dequantize_row_avx2(w, w->data + n * rb, wf);
            for (int64_t i = 0; i < a->m;) {
                float v[4];
                const int nr = a->m - i >= 4 ? 4 : 1;
                if (nr == 4) cols_f32_avx2(wf, a->x + i * k, k, v, 4);
                else cols_f32_avx2(wf, a->x + i * k, k, v, 1);
                for (int r = 0; r < nr; r++) {
                    float *o = y + (i + r) * ldy + n;
                    *o = accumulate ? *o + v[r] : v[r];
                }
                i += nr;
            }
        }
        return;
    }
    for (int64_t i = 0; i < a->m; i++)
        for (int64_t n = n0; n < n1;) {
            float v[4];
            const int nr = n1 - n >= 4 ? 4 : 1;
            if (nr == 4) rows_f32_avx2(w, w->data + n * rb, rb, a->x + i * k, v, 4);
            else rows_f32_avx2(w, w->data + n * rb, rb, a->x + i * k, v, 1);
            for (int r = 0; r < nr; r++) {
                float *o = y + i * ldy + n + r;
                *o = accumulate ? *o + v[r] : v[r];
            }
            n += nr;
        }
}
#endif

void hr_gemm_rows_wide(const hr_qtensor *w, const hr_qact *a, float *y, int64_t ldy, int accumulate, int64_t isa,
                       int64_t n0, int64_t n1, float *wf) {
    const int64_t k = w->cols, rb = hr_row_bytes(w->fmt, k);
#if HR_X86
    if (isa == HR_ISA_AVX512VNNI && !a->q16 && a->m == 1 && w->fmt != HR_Q8_0) {
        gemm_f32_lut(w, a->x, y, accumulate, n0, n1);
        return;
    }
    if (isa == HR_ISA_AVX512VNNI && !a->q16 && a->m > 1) n0 = gemm_f32_pairs(w, a, y, ldy, accumulate, n0, n1, wf);
    if (isa != HR_ISA_SCALAR && !a->q16) {
        gemm_f32_avx2(w, a, y, ldy, accumulate, n0, n1, wf);
        return;
    }
#endif
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = w->data + n * rb;
#if HR_X86
        if (isa != HR_ISA_SCALAR && a->q16) {
            if (isa == HR_ISA_AVX512VNNI) row_q16_vnni(w, row, a, y, ldy, n, accumulate);
            else row_q16_avx2(w, row, a, y, ldy, n, accumulate);
            continue;
        }
#endif
        if (!a->q16) dequantize_row_scalar(w, row, wf);
        for (int64_t i = 0; i < a->m; i++) {
            const float v = a->q16 ? dot_q16_scalar(w, row, a, i) : dot_f32_scalar(a->x + i * k, wf, k);
            float *out = y + i * ldy + n;
            *out = accumulate ? *out + v : v;
        }
    }
}
