/* GEMM over GGUF block-quantised weights: y[M, N] = x[M, K] @ W^T, the arithmetic of headroom/llm/quant_blocks.py
 * bit for bit, on three paths chosen at run time (hr_native_isa_supported; compiled for the x86-64 baseline with
 * per-function `target` attributes, so one library runs everywhere; non-x86 builds keep the scalar path):
 *
 * - scalar: plain C;
 * - AVX2 (+F16C): per block, vpmaddubsw + vpmaddwd into 8 int32 lanes (signed weights: |w| x sign(x, w));
 * - AVX-512 VNNI (256-bit, needs AVX512VL): vpdpbusd straight from u8 x s8 (Q4_1 nibbles are unsigned; signed
 *   formats use the same |w| x sign(x, w) trick).
 *
 * Every path computes each block's EXACT int32 dot, reduces the int32 lanes exactly, then runs the same fp32 ops in
 * the same order: v = (d_w * d_x) * (float)isum [+ m_w * s_x], lane b % 8 += v, then the fixed lane tree. The SIMD
 * paths read a weight row straight from the GGUF bytes, 8 blocks at a time unpacked into registers (d and m in one
 * gather) and used for up to 64 activation rows before the next 8, so each weight block is streamed from memory once
 * per call. A weight with a packed layout (hr_qtensor.packed, native_pack.c: groups pre-transposed at load) runs
 * hr_gemm_rows_packed on the VNNI path and hr_gemm_rows_packed_avx2 (native_pack_avx2.c) on the AVX2 one; without one, with >= 2 activation rows the VNNI path transposes each 8-block
 * group in registers (the activations once at quantisation, native_quant.c) so that lane l of the vpdpbusd
 * accumulator IS block l's sum: no horizontal reduction. Output rows are split over the OpenMP team in
 * static chunks, so a result never depends on M, on the other rows, or on the thread count.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "native_packed.h"

#define HR_ROWS_PER_CHUNK 16


/* ---- scalar ---- */

/* one block row -> integers wq [nb * 32] (Q4_0 minus 8), d and m as fp32 [nb]; F16/F32 -> wf [cols] */
static void unpack_scalar(const hr_qtensor *w, const uint8_t *row, int8_t *wq, float *dw, float *mw, float *wf) {
    const int64_t k = w->cols, nb = k / HR_QK, bb = block_bytes(w->fmt);
    uint16_t h;
    if (w->fmt == HR_F32) {
        memcpy(wf, row, (size_t)k * sizeof(float));
        return;
    }
    if (w->fmt == HR_F16) {
        for (int64_t i = 0; i < k; i++) memcpy(&h, row + 2 * i, 2), wf[i] = hr_f16_to_f32(h);
        return;
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = row + b * bb;
        memcpy(&h, blk, 2);
        dw[b] = hr_f16_to_f32(h);
        if (w->fmt == HR_Q8_0) {
            memcpy(wq + b * HR_QK, blk + 2, HR_QK);
            continue;
        }
        if (w->fmt == HR_Q4_1) memcpy(&h, blk + 2, 2), mw[b] = hr_f16_to_f32(h);
        const uint8_t *qs = blk + (w->fmt == HR_Q4_1 ? 4 : 2);
        const int off = w->fmt == HR_Q4_0 ? 8 : 0;
        for (int j = 0; j < 16; j++) {
            wq[b * HR_QK + j] = (int8_t)((qs[j] & 15) - off);
            wq[b * HR_QK + j + 16] = (int8_t)((qs[j] >> 4) - off);
        }
    }
}


static float dot_q_scalar(int q41, const int8_t *wq, const float *dw, const float *mw, const int8_t *xq,
                          const float *dx, const float *sx, int64_t nb) {
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; b++) {
        int32_t isum = 0;
        for (int j = 0; j < HR_QK; j++) isum += (int32_t)wq[b * HR_QK + j] * (int32_t)xq[b * HR_QK + j];
        float v = (dw[b] * dx[b]) * (float)isum;
        if (q41) v = v + mw[b] * sx[b];
        acc[b & 7] = acc[b & 7] + v;
    }
    return lane_sum8(acc);
}


#if HR_X86
/* ---- AVX2 ---- */

/* an F16 / F32 row -> wf [cols] fp32 */
T_AVX2 static void unpack_plain_avx2(const hr_qtensor *w, const uint8_t *row, float *wf) {
    const int64_t k = w->cols;
    if (w->fmt == HR_F32) {
        memcpy(wf, row, (size_t)k * sizeof(float));
        return;
    }
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) _mm256_storeu_ps(wf + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * i))));
    for (uint16_t h; i < k; i++) memcpy(&h, row + 2 * i, 2), wf[i] = hr_f16_to_f32(h);
}





/* exact int32 dot of one block: u8 x s8 when the weights are unsigned (Q4_1), else |w| x sign(x, w) */
#define HR_DOT_AVX2(wa, wv, xv, q41)                                                                               \
    _mm256_madd_epi16(_mm256_maddubs_epi16(wa, (q41) ? (xv) : _mm256_sign_epi8(xv, wv)), _mm256_set1_epi16(1))
#define HR_DOT_VNNI(wa, wv, xv, q41)                                                                               \
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), wa, (q41) ? (xv) : _mm256_sign_epi8(xv, wv))

/* y[i, n] for one block-format weight row (raw bytes) and every activation row i: weights streamed straight from
 * the row, each group of 8 blocks unpacked into registers once and used for all rows; the ops of dot_q_scalar. */
#define HR_ROW_Q(NAME, TARGET, PREP, GROUP, XS, LDX, DOT)                                                                \
    TARGET static void NAME(const hr_qtensor *w, const uint8_t *row, const hr_qact *a, float *y, int64_t ldy,       \
                            int64_t n, int accumulate) {                                                           \
        const int64_t k = w->cols, nb = k / HR_QK, bb = block_bytes(w->fmt), full = nb / 8 * 8;                  \
        const int q41 = w->fmt == HR_Q4_1;                                                                         \
        for (int64_t i0 = 0; i0 < a->m; i0 += HR_M_TILE) {                                                         \
            const int64_t i1 = i0 + HR_M_TILE < a->m ? i0 + HR_M_TILE : a->m;                                      \
            __m256 acc[HR_M_TILE];                                                                                 \
            for (int64_t i = i0; i < i1; i++) acc[i - i0] = _mm256_setzero_ps();                                  \
            for (int64_t b = 0; b < full; b += 8) {                                                                \
                const uint8_t *g = row + b * bb;                                                                   \
                __m256i wv[8], wa[8];                                                                              \
                for (int j = 0; j < 8; j++) {                                                                      \
                    wv[j] = load_block(g + j * bb, w->fmt);                                                        \
                    wa[j] = q41 ? wv[j] : _mm256_abs_epi8(wv[j]);                                                  \
                }                                                                                                  \
                PREP(wa, wv, q41);                                                                                 \
                __m256 dw, mw;                                                                                     \
                load_scales(g, bb, &dw, &mw);                                                                      \
                for (int64_t i = i0; i < i1; i++) {                                                                \
                    const int8_t *x = a->XS + i * LDX + b * HR_QK;                                                   \
                    __m256 v = _mm256_mul_ps(_mm256_mul_ps(dw, _mm256_loadu_ps(a->d + i * nb + b)),                \
                                             _mm256_cvtepi32_ps(GROUP(wa, wv, x, q41)));                           \
                    if (q41) v = _mm256_add_ps(v, _mm256_mul_ps(mw, _mm256_loadu_ps(a->s + i * nb + b)));          \
                    acc[i - i0] = _mm256_add_ps(acc[i - i0], v);                                                   \
                }                                                                                                  \
            }                                                                                                      \
            for (int64_t i = i0; i < i1; i++) {                                                                    \
                float l[8];                                                                                        \
                _mm256_storeu_ps(l, acc[i - i0]);                                                                  \
                for (int64_t b = full; b < nb; b++) {                                                              \
                    const uint8_t *blk = row + b * bb;                                                             \
                    const __m256i wv = load_block(blk, w->fmt), wa = q41 ? wv : _mm256_abs_epi8(wv);               \
                    const __m256i xv = _mm256_loadu_si256((const __m256i *)(a->q + i * k + b * HR_QK));            \
                    uint16_t h;                                                                                    \
                    memcpy(&h, blk, 2);                                                                            \
                    float v = (_cvtsh_ss(h) * a->d[i * nb + b]) * (float)hsum_i32(DOT(wa, wv, xv, q41));           \
                    if (q41) memcpy(&h, blk + 2, 2), v = v + _cvtsh_ss(h) * a->s[i * nb + b];                      \
                    l[b & 7] = l[b & 7] + v;                                                                       \
                }                                                                                                  \
                const float v = lane_sum8(l);                                                                      \
                float *out = y + i * ldy + n;                                                                      \
                *out = accumulate ? *out + v : v;                                                                  \
            }                                                                                                      \
        }                                                                                                          \
    }

/* 8 blocks' exact sums, one block per vector reduced by reduce8 */
#define HR_GROUP_REDUCE(NAME, TARGET, DOT)                                                                         \
    TARGET static inline __m256i NAME(const __m256i *wa, const __m256i *wv, const int8_t *x, int q41) {            \
        __m256i s[8];                                                                                              \
        for (int j = 0; j < 8; j++) s[j] = DOT(wa[j], wv[j], _mm256_loadu_si256((const __m256i *)(x + j * HR_QK)), q41); \
        return reduce8(s);                                                                                         \
    }
HR_GROUP_REDUCE(group_avx2, T_AVX2, HR_DOT_AVX2)
HR_GROUP_REDUCE(group_vnni, T_VNNI, HR_DOT_VNNI)

/* 8 blocks' exact sums from TRANSPOSED groups (dword c of block l at dword c * 8 + l, see transpose8): lane l of
 * the vpdpbusd accumulators collects block l, no reduction needed */
T_VNNI static inline __m256i group_vnni_t(const __m256i *wa, const __m256i *wv, const int8_t *x, int q41) {
    __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
    for (int c = 0; c < 8; c += 2) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(x + c * HR_QK));
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(x + (c + 1) * HR_QK));
        if (!q41) x0 = _mm256_sign_epi8(x0, wv[c]), x1 = _mm256_sign_epi8(x1, wv[c + 1]);
        s0 = _mm256_dpbusd_epi32(s0, wa[c], x0);
        s1 = _mm256_dpbusd_epi32(s1, wa[c + 1], x1);
    }
    return _mm256_add_epi32(s0, s1);
}

#define HR_NO_PREP(wa, wv, q41) (void)0
#define HR_TRANSPOSE_PREP(wa, wv, q41) (transpose8(wa), (q41) ? (void)0 : transpose8(wv))
HR_ROW_Q(row_q_avx2, T_AVX2, HR_NO_PREP, group_avx2, q, k, HR_DOT_AVX2)
HR_ROW_Q(row_q_vnni, T_VNNI, HR_NO_PREP, group_vnni, q, k, HR_DOT_VNNI)
HR_ROW_Q(row_q_vnni_t, T_VNNI, HR_TRANSPOSE_PREP, group_vnni_t, qt, HR_QT_STRIDE(k), HR_DOT_VNNI)
#endif

/* rows [n0, n1) of y for every activation row, on path `isa` */
static void gemm_rows(const hr_qtensor *w, const hr_qact *a, float *y, int64_t ldy, int accumulate, int64_t isa,
                      int64_t n0, int64_t n1, int8_t *wq, float *dw, float *mw, float *wf) {
    const int64_t k = w->cols, nb = k / HR_QK, rb = hr_row_bytes(w->fmt, k);
    const int plain = w->fmt == HR_F32 || w->fmt == HR_F16, q41 = w->fmt == HR_Q4_1;
    /* the packed layout with 8-bit inputs (a->qt), or 16-bit ones as planes (a->qt / a->qtl) */
    if (!plain && w->packed && a->qt && (a->q16 ? a->qtl != NULL : a->q != NULL)) {
        if (isa == HR_ISA_AVX512VNNI) {
            hr_gemm_rows_packed(w, a, y, ldy, accumulate, n0, n1);
            return;
        }
        if (isa == HR_ISA_AVX2 && (!a->q16 || w->fmt != HR_Q8_0 || a->q16t)) { /* Q8_0: a->q16t, not the planes */
            hr_gemm_rows_packed_avx2(w, a, y, ldy, accumulate, n0, n1);
            return;
        }
    }
    if (!plain && (a->q16 || !a->q)) {
        hr_gemm_rows_wide(w, a, y, ldy, accumulate, isa, n0, n1, wf);
        return;
    }
    for (int64_t n = n0; n < n1; n++) {
        const uint8_t *row = w->data + n * rb;
#if HR_X86
        if (!plain && isa == HR_ISA_AVX512VNNI) {
            if (a->qt && a->m >= 2) row_q_vnni_t(w, row, a, y, ldy, n, accumulate); /* transposes pay off */
            else row_q_vnni(w, row, a, y, ldy, n, accumulate);
            continue;
        }
        if (!plain && isa == HR_ISA_AVX2) {
            row_q_avx2(w, row, a, y, ldy, n, accumulate);
            continue;
        }
        if (isa != HR_ISA_SCALAR) unpack_plain_avx2(w, row, wf);
        else
#endif
            unpack_scalar(w, row, wq, dw, mw, wf);
        for (int64_t i = 0; i < a->m; i++) {
            float v;
            if (plain) {
#if HR_X86
                if (isa != HR_ISA_SCALAR) v = dot_f32_avx2(a->x + i * k, wf, k);
                else
#endif
                    v = dot_f32_scalar(a->x + i * k, wf, k);
            } else {
                const int8_t *xq = a->q + i * k;
                const float *dx = a->d + i * nb, *sx = a->s + i * nb;
                v = dot_q_scalar(q41, wq, dw, mw, xq, dx, sx, nb);
            }
            float *out = y + i * ldy + n;
            *out = accumulate ? *out + v : v;
        }
    }
}

void hr_gemm_team(const hr_qtensor *w, const hr_qact *a, float *y, int64_t ldy, int accumulate, int64_t isa) {
    _Alignas(64) int8_t wq[HR_MAX_COLS];
    _Alignas(64) float wf[HR_MAX_COLS];
    float dw[HR_MAX_COLS / HR_QK], mw[HR_MAX_COLS / HR_QK];
    const int64_t chunks = (w->rows + HR_ROWS_PER_CHUNK - 1) / HR_ROWS_PER_CHUNK;
#pragma omp for schedule(static) nowait
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t n0 = c * HR_ROWS_PER_CHUNK, n1 = n0 + HR_ROWS_PER_CHUNK < w->rows ? n0 + HR_ROWS_PER_CHUNK : w->rows;
        gemm_rows(w, a, y, ldy, accumulate, isa, n0, n1, wq, dw, mw, wf);
    }
}


/* y [m, w->rows] = x [m, w->cols] @ W^T with act_bits (8, 16 or 32) activations for block formats (tests, benchmarks).
 * Returns 0; -1 out of memory; -2 bad arguments. */
int hr_native_gemm(const hr_qtensor *w, const float *x, int64_t m, float *y, int64_t isa, int64_t num_threads,
                   int64_t act_bits) {
    if (hr_check_tensor(w, isa) != 0 || m < 0 || num_threads < 1 || (act_bits != 8 && act_bits != 16 && act_bits != 32))
        return -2;
    const int64_t k = w->cols, nb = k / HR_QK;
    hr_qact a = {x, NULL, NULL, NULL, NULL, NULL, m, k};
    int8_t *q = NULL, *qt = NULL, *qtl = NULL;
    int16_t *q16 = NULL, *q16t = NULL;
    float *d = NULL, *s = NULL;
    if (w->fmt != HR_F32 && w->fmt != HR_F16 && act_bits != 32) {
        q = malloc((size_t)(m * k) + 1), qt = malloc((size_t)(m * HR_QT_STRIDE(k)) + 1);
        qtl = malloc((size_t)(m * HR_QT_STRIDE(k)) + 1), q16 = malloc((size_t)(m * k + 1) * sizeof(int16_t));
        d = malloc((size_t)(m * nb + 1) * sizeof(float)), s = malloc((size_t)(m * nb + 1) * sizeof(float));
        q16t = malloc((size_t)(m * HR_QT_STRIDE(k) + 1) * sizeof(int16_t));
        if (!q || !qt || !qtl || !q16 || !d || !s || !q16t) {
            free(q), free(qt), free(qtl), free(q16), free(d), free(s), free(q16t);
            return -1;
        }
        if (act_bits == 16) hr_quantize_rows16_isa(x, m, k, q16, d, s, isa), a.q16 = q16;
        else hr_quantize_rows_isa(x, m, k, q, d, s, qt, isa);
        if (act_bits == 16 && isa != HR_ISA_SCALAR) hr_split16_planes(q16, m, k, qt, qtl), a.qtl = qtl;
        if (act_bits == 16 && isa == HR_ISA_AVX2) hr_transpose16(q16, m, k, q16t), a.q16t = q16t;
        a.q = q, a.qt = qt, a.d = d, a.s = s;
    }
#pragma omp parallel num_threads((int)num_threads)
    hr_gemm_team(w, &a, y, w->rows, 0, isa);
    free(q), free(qt), free(qtl), free(q16), free(d), free(s), free(q16t);
    return 0;
}

/* Row `r` of W as fp32 (the embedding lookup): q * d (+ m for Q4_1), as quant_blocks.dequantize does. */
void hr_dequantize_row(const hr_qtensor *w, int64_t r, float *out) {
    int8_t wq[HR_MAX_COLS];
    float dw[HR_MAX_COLS / HR_QK], mw[HR_MAX_COLS / HR_QK];
    const uint8_t *row = w->data + r * hr_row_bytes(w->fmt, w->cols);
    unpack_scalar(w, row, wq, dw, mw, out);
    if (w->fmt == HR_F32 || w->fmt == HR_F16) return;
    for (int64_t i = 0; i < w->cols; i++) {
        out[i] = (float)wq[i] * dw[i / HR_QK];
        if (w->fmt == HR_Q4_1) out[i] = out[i] + mw[i / HR_QK];
    }
}
