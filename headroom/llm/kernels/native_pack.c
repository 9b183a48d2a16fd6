/* The VNNI path's weight layout, packed once at load (hr_pack_tensor), and the 8-bit-activation GEMM that reads it.
 *
 * A GGUF row is a run of blocks (d, [m,] 32 integers). The AVX-512 VNNI kernel wants each group of 8 blocks
 * TRANSPOSED: vector c holds dword c (integers 4c .. 4c+3) of blocks 0..7, so that lane l of a vpdpbusd accumulator
 * sums block l and no horizontal reduction is needed. Packed, per row, per group of nt blocks (8; the tail group has
 * nb % 8):
 *
 *   d[nt] fp16 | m[nt] fp16 (Q4_1 only) | the integers: Q4: 4 chunks of 4 * nt bytes, chunk c = bytes 4c..4c+3 of
 *   each block's nibbles (low nibbles = dword c, high nibbles = dword c + 4: one and / shift per vector); Q8_0: 8.
 *
 * Exactly the GGUF's bytes rearranged (a row is still nb * block bytes), so packing is one pass over the linears and
 * streams nothing extra; the tail group is read with masked loads. The activations' transposed copy (hr_qact.qt, the
 * tail group padded with zero blocks) comes from the quantiser. The fp32 ops are quant_blocks' contract unchanged:
 * v = (d_w * d_x) * (float)isum [+ m_w * s_x] into lane b % 8; the tail group's missing lanes are masked off (left
 * untouched), so the bits equal every other path's.
 *
 * 16-bit activations (the lm_head's; hr_qact.q16) run on the same layout as two byte planes, q = 256 * (hi - 128) + lo
 * (hr_split16_planes): lane l of three vpdpbusd chains (hi x w, lo x w, and 128 x w once per group and row) gives
 * block l's exact int32 sum, so the result equals the 16-bit reference's bit for bit.
 */
#include <string.h>

#include "native_packed.h"

/* bytes of w's packed layout, or -1 for a format that has none (F16 / F32) */
int64_t hr_packed_bytes(int64_t fmt, int64_t rows, int64_t cols) {
    if ((fmt != HR_Q4_0 && fmt != HR_Q4_1 && fmt != HR_Q8_0) || rows < 1 || cols < 1 || cols % HR_QK) return -1;
    return rows * hr_row_bytes(fmt, cols);
}

/* out [hr_packed_bytes] = w's blocks in the packed layout. Returns 0, or -2 for a format without one. */
int hr_pack_tensor(const hr_qtensor *w, uint8_t *out) {
    const int64_t total = hr_packed_bytes(w->fmt, w->rows, w->cols);
    if (total < 0 || !w->data || !out) return -2;
    const int64_t nb = w->cols / HR_QK, bb = block_bytes(w->fmt), rb = hr_row_bytes(w->fmt, w->cols);
    const int64_t q41 = w->fmt == HR_Q4_1, chunks = w->fmt == HR_Q8_0 ? 8 : 4, head = q41 ? 4 : 2;
    for (int64_t r = 0; r < w->rows; r++)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t l = b % 8, nt = b - l + 8 <= nb ? 8 : nb % 8;
            const uint8_t *blk = w->data + r * rb + b * bb;
            uint8_t *grp = out + r * rb + (b - l) * bb, *ints = grp + head * nt;
            memcpy(grp + 2 * l, blk, 2);
            if (q41) memcpy(grp + 2 * nt + 2 * l, blk + 2, 2);
            for (int64_t c = 0; c < chunks; c++) memcpy(ints + c * 4 * nt + 4 * l, blk + head + 4 * c, 4);
        }
    return 0;
}

#if HR_X86
/* chunk of nt dwords (masked when nt < 8: the tail group) */
__attribute__((always_inline)) T_VNNI static inline __m256i load_dwords(const uint8_t *p, int nt) {
    return nt == 8 ? _mm256_loadu_si256((const __m256i *)p) : _mm256_maskz_loadu_epi32((__mmask8)((1u << nt) - 1), p);
}

/* nt fp16 -> fp32 lanes (zeros past nt) */
__attribute__((always_inline)) T_VNNI static inline __m256 load_halves(const uint8_t *p, int nt) {
    return _mm256_cvtph_ps(nt == 8 ? _mm_loadu_si128((const __m128i *)p)
                                   : _mm_maskz_loadu_epi16((__mmask8)((1u << nt) - 1), p));
}

/* The vectors of group gp (nt blocks), transposed: nv = 8 (chunk c in vector c, lane l = block l; a tail group of
 * other sizes with masked loads, against zero-padded activations), or nv = nt for a COMPACT tail group (nt 2 or 4,
 * HR_COMPACT_TAIL): its chunks are contiguous (chunk c at 4 * nt * c, as in every group), so nt vectors hold all 8
 * chunks with lane j belonging to block j % nt (the activations' tail group is stored the same way, native_quant.c)
 * and fold_tail sums the lanes of a block: a 2-block tail costs 2 vectors' work, not 8. wa unsigned for vpdpbusd, wv
 * the signed values (sign trick). */
__attribute__((always_inline)) T_VNNI static inline void unpack_group(const uint8_t *gp, int64_t fmt, int nt, int nv,
                                                                     __m256i *wa, __m256i *wv) {
    const int q8 = fmt == HR_Q8_0, io = (fmt == HR_Q4_1 ? 4 : 2) * nt, half = nv / 2;
    const __m256i low = _mm256_set1_epi8(15);
    for (int c = 0; c < (q8 ? nv : half); c++) {
        const uint8_t *p = gp + io + (nv == 8 ? 4 * nt : HR_QK) * c;
        const __m256i raw = nv == 8 ? load_dwords(p, nt) : _mm256_loadu_si256((const __m256i *)p);
        if (q8) {
            wv[c] = raw;
            continue;
        }
        wv[c] = _mm256_and_si256(raw, low);
        wv[c + half] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
    }
    for (int c = 0; c < nv; c++) {
        if (fmt == HR_Q4_0) wv[c] = _mm256_sub_epi8(wv[c], _mm256_set1_epi8(8));
        wa[c] = fmt == HR_Q4_1 ? wv[c] : _mm256_abs_epi8(wv[c]);
    }
}

/* lane l = block l's exact int32 dot with the transposed activations x (4 independent vpdpbusd chains), unfolded */
__attribute__((always_inline)) T_VNNI static inline __m256i group_dot(const __m256i *wa, const __m256i *wv,
                                                                     const int8_t *x, int q41, int nv) {
    __m256i s[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int c = 0; c < nv; c++) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x + c * HR_QK));
        if (!q41) xv = _mm256_sign_epi8(xv, wv[c]);
        s[c & 3] = _mm256_dpbusd_epi32(s[c & 3], wa[c], xv);
    }
    return _mm256_add_epi32(_mm256_add_epi32(s[0], s[1]), _mm256_add_epi32(s[2], s[3]));
}

/* 128 * (the sum of each block's weight integers) per lane: the bias of group_dot16's high plane */
__attribute__((always_inline)) T_VNNI static inline __m256i group_bias(const __m256i *wv, int nv) {
    __m256i s = _mm256_setzero_si256();
    for (int c = 0; c < nv; c++) s = _mm256_dpbusd_epi32(s, _mm256_set1_epi8((char)0x80), wv[c]);
    return s;
}

/* group_dot for 16-bit activations given as their two transposed byte planes (q = 256 * (xh - 128) + xl, both
 * unsigned): every vpdpbusd is an activation byte (u8) x a weight integer (s8), so lane l is block l's exact sum
 * 256 * (sum xh * w - bias) + sum xl * w (|each| < 2^21, no overflow); bias from group_bias */
__attribute__((always_inline)) T_VNNI static inline __m256i group_dot16(const __m256i *wv, const int8_t *xh,
                                                                       const int8_t *xl, __m256i bias, int nv) {
    __m256i h[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}, l[2] = {h[0], h[1]};
    for (int c = 0; c < nv; c++) {
        h[c & 1] = _mm256_dpbusd_epi32(h[c & 1], _mm256_loadu_si256((const __m256i *)(xh + c * HR_QK)), wv[c]);
        l[c & 1] = _mm256_dpbusd_epi32(l[c & 1], _mm256_loadu_si256((const __m256i *)(xl + c * HR_QK)), wv[c]);
    }
    const __m256i hi = _mm256_sub_epi32(_mm256_add_epi32(h[0], h[1]), bias);
    return _mm256_add_epi32(_mm256_slli_epi32(hi, 8), _mm256_add_epi32(l[0], l[1]));
}

/* group gp's exact block sums (lane l = block l) against activations x (xl: the low plane when wide) */
__attribute__((always_inline)) T_VNNI static inline __m256i group_isum(const uint8_t *gp, int64_t fmt, int nt, int nv,
                                                                      const int8_t *x, const int8_t *xl, int q41,
                                                                      int wide) {
    __m256i wa[8], wv[8];
    unpack_group(gp, fmt, nt, nv, wa, wv);
    return fold_tail(wide ? group_dot16(wv, x, xl, group_bias(wv, nv), nv) : group_dot(wa, wv, x, q41, nv), nv);
}

/* acc (lanes in mask) += (d_w * d_x) * (float)isum [+ m_w * s_x], the weights' scales dw (and mins mw) as fp32 */
__attribute__((always_inline)) T_VNNI static inline __m256 scale_add(__m256 acc, __m256 dw, __m256 mw, int q41, int nt,
                                                                    __m256i isum, __m256 dx, __m256 sx) {
    __m256 v = _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum));
    if (q41) v = _mm256_add_ps(v, _mm256_mul_ps(mw, sx));
    return nt == 8 ? _mm256_add_ps(acc, v) : _mm256_mask_add_ps(acc, (__mmask8)((1u << nt) - 1), acc, v);
}

/* scale_add for packed group gp (its d, then m for Q4_1, at the group's start) */
__attribute__((always_inline)) T_VNNI static inline __m256 group_fma(__m256 acc, const uint8_t *gp, int q41, int nt,
                                                                    __m256i isum, __m256 dx, __m256 sx) {
    return scale_add(acc, load_halves(gp, nt), q41 ? load_halves(gp + 2 * nt, nt) : _mm256_setzero_ps(), q41, nt,
                     isum, dx, sx);
}

/* group g (nt blocks, nv vectors) of NR packed weight rows (row_bytes apart) against the one activation row */
__attribute__((always_inline)) T_VNNI static inline void group_m1(const hr_qtensor *w, const uint8_t *prow,
                                                                 int64_t row_bytes, const hr_qact *a, int64_t g,
                                                                 const int nt, const int nv, __m256 *acc, const int nr,
                                                                 const int wide, const int64_t fmt) {
    const int64_t gb = 8 * block_bytes(fmt);
    const int q41 = fmt == HR_Q4_1;
    const __mmask8 mask = (__mmask8)((1u << nt) - 1);
    const __m256 dx = _mm256_maskz_loadu_ps(mask, a->d + g * 8);
    const __m256 sx = q41 ? _mm256_maskz_loadu_ps(mask, a->s + g * 8) : _mm256_setzero_ps();
    const int8_t *xt = a->qt + g * 8 * HR_QK, *xtl = wide ? a->qtl + g * 8 * HR_QK : NULL;
    for (int r = 0; r < nr; r++) {
        const uint8_t *gp = prow + r * row_bytes + g * gb;
        acc[r] = group_fma(acc[r], gp, q41, nt, group_isum(gp, fmt, nt, nv, xt, xtl, q41, wide), dx, sx);
    }
}

/* one activation row (decode): NR packed weight rows at a time, sharing the activation loads; NR independent chains;
 * wide: 16-bit activations (a->qt / a->qtl planes) */
__attribute__((always_inline)) T_VNNI static inline void rows_packed_m1(const hr_qtensor *w, const uint8_t *prow,
                                                                       int64_t row_bytes, const hr_qact *a, float *y,
                                                                       int64_t n, int accumulate, const int nr,
                                                                       const int wide, const int64_t fmt) {
    const int64_t nb = w->cols / HR_QK, full = nb / 8;
    const int tail = (int)(nb % 8);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t g = 0; g < full; g++) group_m1(w, prow, row_bytes, a, g, 8, 8, acc, nr, wide, fmt);
    if (tail && group_vectors(tail) == 4) group_m1(w, prow, row_bytes, a, full, tail, 4, acc, nr, wide, fmt);
    else if (tail && group_vectors(tail) == 2) group_m1(w, prow, row_bytes, a, full, tail, 2, acc, nr, wide, fmt);
    else if (tail) group_m1(w, prow, row_bytes, a, full, tail, 8, acc, nr, wide, fmt);
    store_sums(y + n, 1, acc, nr, accumulate);
}

/* two activation rows' 32-byte chunks (p0, p1) in one 512-bit vector */
__attribute__((always_inline)) T_VNNI static inline __m512i pair_epi8(const int8_t *p0, const int8_t *p1) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)p0)),
                              _mm256_loadu_si256((const __m256i *)p1), 1);
}

__attribute__((always_inline)) T_VNNI static inline __m512 pair_ps(const float *p0, const float *p1) {
    return _mm512_castsi512_ps(pair_epi8((const int8_t *)p0, (const int8_t *)p1));
}

__attribute__((always_inline)) T_VNNI static inline __m512i twice(__m256i v) { return _mm512_broadcast_i64x4(v); }

/* 16-bit inputs (down_proj, the lm_head): a full group (8 blocks) of nr weight rows against activation rows i0, i0 + 2,
 * ... two at a time in 512-bit vectors (row i in the low half, i + 1 in the high one, the weights in both): the same
 * integer sums and the same fp32 ops per lane as the 256-bit loop, with half its epilogue. Returns the first row it
 * left (the last one when i1 - i0 is odd). Measured on 8-bit inputs too: no faster there (their 256-bit loop folds the
 * activation loads into vpdpbusd, which pairing rows costs back), so only the wide inputs take it. */
__attribute__((always_inline)) T_VNNI static inline int64_t group_rows_x2(const hr_qact *a, int64_t i0, int64_t i1,
                                                                         int64_t g, int64_t nb, int64_t ldq,
                                                                         const __m256i (*wv)[8], const __m256i *bias,
                                                                         const __m256 *dw, const __m256 *mw,
                                                                         __m256 (*acc)[HR_M_TILE], const int nr,
                                                                         const int q41) {
    __m512i wz[2][8], bz[2];
    __m512 dz[2], mz[2];
    for (int r = 0; r < nr; r++) {
        for (int c = 0; c < 8; c++) wz[r][c] = twice(wv[r][c]);
        bz[r] = twice(bias[r]);
        dz[r] = _mm512_castsi512_ps(twice(_mm256_castps_si256(dw[r])));
        mz[r] = _mm512_castsi512_ps(twice(_mm256_castps_si256(mw[r])));
    }
    int64_t i = i0;
    for (; i + 2 <= i1; i += 2) {
        const int8_t *x0 = a->qt + i * ldq + g * 8 * HR_QK, *x1 = x0 + ldq;
        const int8_t *l0 = a->qtl + i * ldq + g * 8 * HR_QK, *l1 = l0 + ldq;
        __m512i s[2][2] = {{_mm512_setzero_si512(), _mm512_setzero_si512()},
                           {_mm512_setzero_si512(), _mm512_setzero_si512()}}; /* [r][0]: high plane, [r][1]: low */
        for (int c = 0; c < 8; c++) {
            const __m512i xh = pair_epi8(x0 + c * HR_QK, x1 + c * HR_QK);
            const __m512i xl = pair_epi8(l0 + c * HR_QK, l1 + c * HR_QK);
            for (int r = 0; r < nr; r++) {
                s[r][0] = _mm512_dpbusd_epi32(s[r][0], xh, wz[r][c]);
                s[r][1] = _mm512_dpbusd_epi32(s[r][1], xl, wz[r][c]);
            }
        }
        const __m512 dx = pair_ps(a->d + i * nb + g * 8, a->d + (i + 1) * nb + g * 8);
        const __m512 sx = q41 ? pair_ps(a->s + i * nb + g * 8, a->s + (i + 1) * nb + g * 8) : _mm512_setzero_ps();
        for (int r = 0; r < nr; r++) { /* 256 * (hi - bias) + lo, then scale_add's ops per lane */
            const __m512i hi = _mm512_slli_epi32(_mm512_sub_epi32(s[r][0], bz[r]), 8);
            __m512 v = _mm512_mul_ps(_mm512_mul_ps(dz[r], dx), _mm512_cvtepi32_ps(_mm512_add_epi32(hi, s[r][1])));
            if (q41) v = _mm512_add_ps(v, _mm512_mul_ps(mz[r], sx));
            float *pa = (float *)&acc[r][i - i0];
            _mm512_storeu_ps(pa, _mm512_add_ps(_mm512_loadu_ps(pa), v));
        }
    }
    return i;
}

/* group g (nt blocks, nv vectors) of nr packed weight rows against activation rows [i0, i1) into acc: the group
 * unpacked once, each activation vector loaded once for the nr rows */
__attribute__((always_inline)) T_VNNI static inline void group_rows(const hr_qtensor *w, const uint8_t *prow,
                                                                   int64_t rb, const hr_qact *a, int64_t i0,
                                                                   int64_t i1, int64_t g, int nt, const int nv,
                                                                   __m256 (*acc)[HR_M_TILE], const int nr,
                                                                   const int wide, const int64_t fmt) {
    const int64_t nb = w->cols / HR_QK, gb = 8 * block_bytes(fmt), ldq = HR_QT_STRIDE(w->cols);
    const int q41 = fmt == HR_Q4_1;
    const __mmask8 mask = (__mmask8)((1u << nt) - 1);
    __m256i wa[2][8], wv[2][8], bias[2];
    __m256 dw[2], mw[2]; /* the rows' block scales (and mins) as fp32, converted once for every activation row */
    for (int r = 0; r < nr; r++) {
        const uint8_t *gp = prow + r * rb + g * gb;
        unpack_group(gp, fmt, nt, nv, wa[r], wv[r]);
        if (wide) bias[r] = group_bias(wv[r], nv);
        dw[r] = load_halves(gp, nt);
        mw[r] = q41 ? load_halves(gp + 2 * nt, nt) : _mm256_setzero_ps();
    }
    int64_t i = i0;
    if (wide && nt == 8 && nv == 8)
        i = group_rows_x2(a, i0, i1, g, nb, ldq, (const __m256i(*)[8])wv, bias, dw, mw, acc, nr, q41);
    for (; i < i1; i++) {
        const int8_t *x = a->qt + i * ldq + g * 8 * HR_QK;
        __m256i s[2][2] = {{_mm256_setzero_si256(), _mm256_setzero_si256()},
                           {_mm256_setzero_si256(), _mm256_setzero_si256()}};
        for (int c = 0; c < nv && wide; c++) { /* s[r][0]: the high plane, s[r][1]: the low one */
            const __m256i xh = _mm256_loadu_si256((const __m256i *)(x + c * HR_QK));
            const __m256i xl = _mm256_loadu_si256((const __m256i *)(a->qtl + i * ldq + g * 8 * HR_QK + c * HR_QK));
            for (int r = 0; r < nr; r++) {
                s[r][0] = _mm256_dpbusd_epi32(s[r][0], xh, wv[r][c]);
                s[r][1] = _mm256_dpbusd_epi32(s[r][1], xl, wv[r][c]);
            }
        }
        for (int r = 0; r < nr && wide; r++) s[r][0] = _mm256_slli_epi32(_mm256_sub_epi32(s[r][0], bias[r]), 8);
        for (int c = 0; c < nv && !wide; c++) {
            const __m256i xv = _mm256_loadu_si256((const __m256i *)(x + c * HR_QK));
            for (int r = 0; r < nr; r++) {
                const __m256i xs = q41 ? xv : _mm256_sign_epi8(xv, wv[r][c]);
                s[r][c & 1] = _mm256_dpbusd_epi32(s[r][c & 1], wa[r][c], xs);
            }
        }
        const __m256 dx = _mm256_maskz_loadu_ps(mask, a->d + i * nb + g * 8);
        const __m256 sx = q41 ? _mm256_maskz_loadu_ps(mask, a->s + i * nb + g * 8) : _mm256_setzero_ps();
        for (int r = 0; r < nr; r++)
            acc[r][i - i0] = scale_add(acc[r][i - i0], dw[r], mw[r], q41, nt,
                                       fold_tail(_mm256_add_epi32(s[r][0], s[r][1]), nv), dx, sx);
    }
}

/* y[i, n .. n + nr - 1] for nr packed weight rows (rb bytes apart) and every activation row i (transposed q8 values in
 * a->qt, or with `wide` 16-bit planes in a->qt / a->qtl), activation rows [i0, i1) (at most HR_M_TILE) */
__attribute__((always_inline)) T_VNNI static inline void rows_packed(const hr_qtensor *w, const uint8_t *prow,
                                                                    int64_t rb, const hr_qact *a, float *y,
                                                                    int64_t ldy, int64_t n, int accumulate, int64_t i0,
                                                                    int64_t i1, const int nr, const int wide,
                                                                    const int64_t fmt) {
    const int64_t nb = w->cols / HR_QK;
    __m256 acc[2][HR_M_TILE];
    for (int r = 0; r < nr; r++)
        for (int64_t i = i0; i < i1; i++) acc[r][i - i0] = _mm256_setzero_ps();
    const int64_t full = nb / 8;
    const int tail = (int)(nb % 8);
    for (int64_t g = 0; g < full; g++) group_rows(w, prow, rb, a, i0, i1, g, 8, 8, acc, nr, wide, fmt);
    if (tail && group_vectors(tail) == 4) group_rows(w, prow, rb, a, i0, i1, full, tail, 4, acc, nr, wide, fmt);
    else if (tail && group_vectors(tail) == 2) group_rows(w, prow, rb, a, i0, i1, full, tail, 2, acc, nr, wide, fmt);
    else if (tail) group_rows(w, prow, rb, a, i0, i1, full, tail, 8, acc, nr, wide, fmt);
    for (int r = 0; r < nr; r++)
        for (int64_t i = i0; i < i1; i += 8)
            store_sums(y + i * ldy + n + r, ldy, &acc[r][i - i0], i1 - i < 8 ? (int)(i1 - i) : 8, accumulate);
}

/* rows [n0, n1); wide: 16-bit activations (the planes a->qt / a->qtl), else 8-bit (a->qt) */
__attribute__((always_inline)) T_VNNI static inline void gemm_packed(const hr_qtensor *w, const hr_qact *a, float *y,
                                                                    int64_t ldy, int accumulate, int64_t n0,
                                                                    int64_t n1, const int wide, const int64_t fmt) {
    const int64_t row = hr_packed_bytes(fmt, 1, w->cols);
    if (a->m == 1) {
        int64_t n = n0;
        for (; n + 4 <= n1; n += 4) rows_packed_m1(w, w->packed + n * row, row, a, y, n, accumulate, 4, wide, fmt);
        for (; n < n1; n++) rows_packed_m1(w, w->packed + n * row, row, a, y, n, accumulate, 1, wide, fmt);
        return;
    }
    /* activation rows in tiles that stay in L1 (hr_act_tile_rows) while the call's weight rows are swept once per tile;
     * two rows' weights fit the registers when they are unsigned (Q4_1; signed formats keep wv too) or wide (wv only) */
    const int64_t mt = hr_act_tile_rows(w->cols, wide);
    for (int64_t i0 = 0; i0 < a->m; i0 += mt) {
        const int64_t i1 = i0 + mt < a->m ? i0 + mt : a->m;
        int64_t n = n0;
        for (; n + 2 <= n1 && (fmt == HR_Q4_1 || wide); n += 2)
            rows_packed(w, w->packed + n * row, row, a, y, ldy, n, accumulate, i0, i1, 2, wide, fmt);
        for (; n < n1; n++) rows_packed(w, w->packed + n * row, row, a, y, ldy, n, accumulate, i0, i1, 1, wide, fmt);
    }
}

/* Decode (M = 1): one instance per (format, input width), both compile-time constants inside, so the format's branches
 * vanish and the unpacked weights stay in registers (A/B: q / gate -12..-16% per call, lm_head -6%). M >= 2 keeps one
 * instance per width with the format read at run time: specialised, its Q8_0 lm_head measured 3% slower. */
T_VNNI static void gemm_packed_vnni(const hr_qtensor *w, const hr_qact *a, float *y, int64_t ldy, int accumulate,
                                    int64_t n0, int64_t n1) {
    const int wide = a->q16 != NULL;
    if (a->m != 1 && wide) gemm_packed(w, a, y, ldy, accumulate, n0, n1, 1, w->fmt);
    else if (a->m != 1) gemm_packed(w, a, y, ldy, accumulate, n0, n1, 0, w->fmt);
    else if (w->fmt == HR_Q4_1 && wide) gemm_packed(w, a, y, ldy, accumulate, n0, n1, 1, HR_Q4_1);
    else if (w->fmt == HR_Q4_1) gemm_packed(w, a, y, ldy, accumulate, n0, n1, 0, HR_Q4_1);
    else if (w->fmt == HR_Q8_0 && wide) gemm_packed(w, a, y, ldy, accumulate, n0, n1, 1, HR_Q8_0);
    else if (w->fmt == HR_Q8_0) gemm_packed(w, a, y, ldy, accumulate, n0, n1, 0, HR_Q8_0);
    else if (wide) gemm_packed(w, a, y, ldy, accumulate, n0, n1, 1, HR_Q4_0);
    else gemm_packed(w, a, y, ldy, accumulate, n0, n1, 0, HR_Q4_0);
}
#endif

void hr_gemm_rows_packed(const hr_qtensor *w, const hr_qact *a, float *y, int64_t ldy, int accumulate, int64_t n0,
                         int64_t n1) {
#if HR_X86
    gemm_packed_vnni(w, a, y, ldy, accumulate, n0, n1);
#else
    (void)w, (void)a, (void)y, (void)ldy, (void)accumulate, (void)n0, (void)n1;
#endif
}
