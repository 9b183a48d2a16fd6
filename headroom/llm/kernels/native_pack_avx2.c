/* The AVX2 path's GEMM on the packed layout (hr_pack_tensor, native_pack.c: each group of 8 blocks transposed, so that
 * lane l of an accumulator is block l and no block needs a horizontal reduction, unlike the GGUF-layout loop's reduce8)
 * against the transposed activations (hr_qact.qt, and qtl for the 16-bit planes).
 *
 * - 8-bit inputs (x in [-127, 127]): vpmaddubsw(weights u8, x s8) gives int16 pair sums. |pair| <= 15 * 127 * 2 = 3810
 *   for Q4_1 and 8 * 127 * 2 = 2032 for Q4_0 (|w| x sign(x, w)), so a group's 8 chunks add up in int16 exactly
 *   (<= 30480) and one vpmaddwd(., 1) gives block l's int32 sum in lane l. Q8_0 (|w| <= 128, a pair up to 32512)
 *   widens every chunk.
 * - 16-bit inputs as the VNNI path's byte planes, q = 256 * (h - 128) + l (hr_split16_planes): vpmaddubsw(plane u8,
 *   weights s8), |pair| <= 255 * 15 * 2 = 7650 for Q4 weights, so 4 chunks per int16 sum (<= 30600); the bias
 *   128 * sum(w) per block adds the chunks as bytes (|sum| <= 120), then one vpmaddubsw(1, .) (bias128). Q8_0
 *   weights would saturate vpmaddubsw: the Q8_0 lm_head reads the 16-bit values themselves, transposed by 4
 *   (a->q16t, hr_transpose16), with each weight chunk widened to int16 once for 4 activation rows: vpmaddwd
 *   (|w x| * 2 < 2^24) into two int32 accumulators per row (blocks 0-3, 4-7, two lanes each), one vphaddd + vpermq
 *   at the group's end.
 *
 * Every block's int32 sum is exact, and the fp32 ops are every path's: v = (d_w * d_x) * (float)isum [+ m_w * s_x]
 * into lane b % 8 (a tail group's missing lanes left untouched), then lane_sum8's tree (store_sums), so the bits equal
 * the scalar reference's. Each (format, input width) pair is its own instance with both as compile-time constants.
 */
#include "native_packed.h"

#if HR_X86
/* lanes < nt all ones */
__attribute__((always_inline)) T_AVX2 static inline __m256i lanes(int nt) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(nt), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* nt dwords from p (zeros past nt; a masked load reads nothing past them) */
__attribute__((always_inline)) T_AVX2 static inline __m256i dwords(const uint8_t *p, int nt) {
    if (nt == 8) return _mm256_loadu_si256((const __m256i *)p);
    return _mm256_maskload_epi32((const int *)(const void *)p, lanes(nt));
}

/* nt floats from p (zeros past nt) */
__attribute__((always_inline)) T_AVX2 static inline __m256 floats(const float *p, int nt) {
    return nt == 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, lanes(nt));
}

/* nt fp16 of a packed group's d (or m) at p as fp32 (zeros past nt). Always one 16-byte load: from its d, and from
 * its m, a packed group holds at least 18 more bytes (2 nt of m and 16 nt of integers, or the integers alone), so
 * the load stays inside the group; the lanes past nt are masked off after the conversion. (Copying 2 nt bytes to
 * a zeroed stack buffer first stalled store forwarding on every tail group: ~30% of a Q4_1 decode GEMM on Zen 3.) */
__attribute__((always_inline)) T_AVX2 static inline __m256 halves(const uint8_t *p, int nt) {
    const __m256 v = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    return nt == 8 ? v : _mm256_and_ps(v, _mm256_castsi256_ps(lanes(nt)));
}

/* group gp's nv weight vectors (native_pack.c's unpack_group): wv the signed integers, wa the unsigned operand (Q4_1:
 * wv; the others |wv|, paired with sign(x, wv)) */
__attribute__((always_inline)) T_AVX2 static inline void unpack(const uint8_t *gp, const int64_t fmt, int nt,
                                                               const int nv, __m256i *wa, __m256i *wv) {
    const int q8 = fmt == HR_Q8_0, io = (fmt == HR_Q4_1 ? 4 : 2) * nt, half = nv / 2;
    for (int c = 0; c < (q8 ? nv : half); c++) {
        const uint8_t *p = gp + io + (nv == 8 ? 4 * nt : HR_QK) * c;
        const __m256i raw = nv == 8 ? dwords(p, nt) : _mm256_loadu_si256((const __m256i *)p);
        if (q8) {
            wv[c] = raw;
            continue;
        }
        wv[c] = _mm256_and_si256(raw, _mm256_set1_epi8(15));
        wv[c + half] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), _mm256_set1_epi8(15));
    }
    for (int c = 0; c < nv; c++) {
        if (fmt == HR_Q4_0) wv[c] = _mm256_sub_epi8(wv[c], _mm256_set1_epi8(8));
        wa[c] = fmt == HR_Q4_1 ? wv[c] : _mm256_abs_epi8(wv[c]);
    }
}

/* lane l = block l's exact int32 dot with the 8-bit transposed activations x (unfolded for compact tails) */
__attribute__((always_inline)) T_AVX2 static inline __m256i dot8(const __m256i *wa, const __m256i *wv, const int8_t *x,
                                                                const int64_t fmt, const int nv) {
    const __m256i one = _mm256_set1_epi16(1);
    __m256i s[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int c = 0; c < nv; c++) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(x + c * HR_QK));
        if (fmt != HR_Q4_1) xv = _mm256_sign_epi8(xv, wv[c]);
        const __m256i p = _mm256_maddubs_epi16(wa[c], xv);
        s[c & 1] = fmt == HR_Q8_0 ? _mm256_add_epi32(s[c & 1], _mm256_madd_epi16(p, one)) : _mm256_add_epi16(s[c & 1], p);
    }
    if (fmt == HR_Q8_0) return _mm256_add_epi32(s[0], s[1]);
    return _mm256_madd_epi16(_mm256_add_epi16(s[0], s[1]), one);
}

/* sum over chunks of vpmaddubsw(u[c] u8, wv[c] s8), widened every 4 chunks (Q4 weights: |pair| <= 7650) */
__attribute__((always_inline)) T_AVX2 static inline __m256i planesum(const int8_t *u, const __m256i *wv, const int nv) {
    const __m256i one = _mm256_set1_epi16(1);
    __m256i s32 = _mm256_setzero_si256();
    for (int c0 = 0; c0 < nv; c0 += 4) {
        __m256i s16 = _mm256_setzero_si256();
        for (int c = c0; c < c0 + 4 && c < nv; c++)
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(u + c * HR_QK)), wv[c]));
        s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(s16, one));
    }
    return s32;
}

/* planesum of a plane of 128s, 128 * (the sum of wv's bytes in each dword lane), in 9 instructions instead of 17: the
 * chunks add up as bytes (Q4 weights: |sum| <= 8 * 15 = 120 fits an int8), then one vpmaddubsw(1, .) and one
 * vpmaddwd(., 128); exact integers, so the same value */
__attribute__((always_inline)) T_AVX2 static inline __m256i bias128(const __m256i *wv, const int nv) {
    __m256i s = wv[0];
    if (nv == 8) {
        const __m256i a = _mm256_add_epi8(_mm256_add_epi8(wv[0], wv[1]), _mm256_add_epi8(wv[2], wv[3]));
        s = _mm256_add_epi8(a, _mm256_add_epi8(_mm256_add_epi8(wv[4], wv[5]), _mm256_add_epi8(wv[6], wv[7])));
    } else {
        for (int c = 1; c < nv; c++) s = _mm256_add_epi8(s, wv[c]);
    }
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), s), _mm256_set1_epi16(128));
}

/* dot8 for 16-bit activations as planes xh / xl: 256 * (sum xh * w - bias) + sum xl * w (bias: bias128) */
__attribute__((always_inline)) T_AVX2 static inline __m256i dot16(const __m256i *wv, const int8_t *xh, const int8_t *xl,
                                                                 __m256i bias, const int nv) {
    const __m256i hi = _mm256_sub_epi32(planesum(xh, wv, nv), bias);
    return _mm256_add_epi32(_mm256_slli_epi32(hi, 8), planesum(xl, wv, nv));
}

/* a compact tail (nt = 2 or 4 blocks, HR_COMPACT_TAIL) of Q8_0 x 16-bit: the weights' bytes and a->q16t's values in
 * the same order, 16 at a time; int32 lane j then always holds block (j / 2) % nt, folded into lane l = block l */
__attribute__((always_inline)) T_AVX2 static inline __m256i dot16t_tail(const uint8_t *gp, const int nt,
                                                                       const int16_t *x) {
    __m256i s = _mm256_setzero_si256();
    for (int j = 0; j < 2 * nt; j++) {
        const __m256i w16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(gp + 2 * nt + 16 * j)));
        s = _mm256_add_epi32(s, _mm256_madd_epi16(w16, _mm256_loadu_si256((const __m256i *)(x + 16 * j))));
    }
    const __m256i h = _mm256_hadd_epi32(s, s); /* nt 2: [b0 b1 b0 b1 | b0 b1 b0 b1]; nt 4: [b0 b1 b0 b1 | b2 b3 b2 b3] */
    return nt == 2 ? _mm256_add_epi32(h, _mm256_permute2x128_si256(h, h, 0x01)) : _mm256_permute4x64_epi64(h, 0xE8);
}

/* Q8_0 x 16-bit: isum[r] (lane l = block l) of the group at gp (nt blocks) against R activation rows of a->q16t from
 * x, ldq values apart */
__attribute__((always_inline)) T_AVX2 static inline void dot16t(const uint8_t *gp, int nt, const int16_t *x,
                                                               int64_t ldq, const int R, __m256i *isum) {
    if (HR_COMPACT_TAIL(nt)) {
        for (int r = 0; r < R; r++) isum[r] = nt == 2 ? dot16t_tail(gp, 2, x + r * ldq) : dot16t_tail(gp, 4, x + r * ldq);
        return;
    }
    __m256i lo[4], hi[4];
    for (int r = 0; r < R; r++) lo[r] = hi[r] = _mm256_setzero_si256();
    for (int c = 0; c < 8; c++) {
        const __m256i raw = dwords(gp + 2 * nt + 4 * nt * c, nt); /* chunk c: dword l = block l's values 4c .. 4c+3 */
        const __m256i wl = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(raw));
        const __m256i wh = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(raw, 1));
        for (int r = 0; r < R; r++) {
            const int16_t *xr = x + r * ldq + c * HR_QK;
            lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(wl, _mm256_loadu_si256((const __m256i *)xr)));
            hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(wh, _mm256_loadu_si256((const __m256i *)(xr + 16))));
        }
    }
    for (int r = 0; r < R; r++) /* [b0 b1 b4 b5 | b2 b3 b6 b7] -> b0 .. b7 */
        isum[r] = _mm256_permute4x64_epi64(_mm256_hadd_epi32(lo[r], hi[r]), 0xD8);
}

/* acc (lanes < nt) += (d_w * d_x) * (float)isum [+ m_w * s_x] */
__attribute__((always_inline)) T_AVX2 static inline __m256 scale_add(__m256 acc, __m256 dw, __m256 mw, const int q41,
                                                                    int nt, __m256i isum, __m256 dx, __m256 sx) {
    __m256 v = _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum));
    if (q41) v = _mm256_add_ps(v, _mm256_mul_ps(mw, sx));
    const __m256 sum = _mm256_add_ps(acc, v);
    return nt == 8 ? sum : _mm256_blendv_ps(acc, sum, _mm256_castsi256_ps(lanes(nt)));
}

/* group g (nt blocks, nv vectors) of nr packed weight rows (rb bytes apart) against activation rows [i0, i1), into
 * acc[r][i - i0]: the group unpacked once per weight row, its scales converted once */
__attribute__((always_inline)) T_AVX2 static inline void group_rows(const uint8_t *prow, int64_t rb, const hr_qact *a,
                                                                   int64_t i0, int64_t i1, int64_t g, int64_t nb,
                                                                   int nt, const int nv, __m256 (*acc)[HR_M_TILE],
                                                                   const int nr, const int wide, const int64_t fmt) {
    const int64_t gb = 8 * block_bytes(fmt), ldq = HR_QT_STRIDE(nb * HR_QK), q41 = fmt == HR_Q4_1;
    if (wide && fmt == HR_Q8_0) {
        for (int r = 0; r < nr; r++) {
            const uint8_t *gp = prow + r * rb + g * gb;
            const __m256 dw = halves(gp, nt), zero = _mm256_setzero_ps();
            const int16_t *x = a->q16t + g * 8 * HR_QK;
            __m256i isum[4];
            int64_t i = i0;
            for (; i + 4 <= i1; i += 4) {
                dot16t(gp, nt, x + i * ldq, ldq, 4, isum);
                for (int j = 0; j < 4; j++)
                    acc[r][i + j - i0] = scale_add(acc[r][i + j - i0], dw, zero, 0, nt, isum[j],
                                                   floats(a->d + (i + j) * nb + g * 8, nt), zero);
            }
            for (; i < i1; i++) {
                dot16t(gp, nt, x + i * ldq, ldq, 1, isum);
                acc[r][i - i0] = scale_add(acc[r][i - i0], dw, zero, 0, nt, isum[0], floats(a->d + i * nb + g * 8, nt),
                                           zero);
            }
        }
        return;
    }
    for (int r = 0; r < nr; r++) {
        const uint8_t *gp = prow + r * rb + g * gb;
        __m256i wa[8], wv[8];
        unpack(gp, fmt, nt, nv, wa, wv);
        const __m256i bias = wide ? bias128(wv, nv) : _mm256_setzero_si256();
        const __m256 dw = halves(gp, nt), mw = q41 ? halves(gp + 2 * nt, nt) : _mm256_setzero_ps();
        for (int64_t i = i0; i < i1; i++) {
            const int8_t *x = a->qt + i * ldq + g * 8 * HR_QK;
            const __m256i isum = wide ? dot16(wv, x, a->qtl + i * ldq + g * 8 * HR_QK, bias, nv) : dot8(wa, wv, x, fmt, nv);
            const __m256 dx = floats(a->d + i * nb + g * 8, nt);
            const __m256 sx = q41 ? floats(a->s + i * nb + g * 8, nt) : _mm256_setzero_ps();
            acc[r][i - i0] = scale_add(acc[r][i - i0], dw, mw, (int)q41, nt, fold_tail(isum, nv), dx, sx);
        }
    }
}

/* y[i, n] for activation rows [i0, i1) (M >= 2, i1 - i0 <= HR_M_TILE) */
__attribute__((always_inline)) T_AVX2 static inline void rows_packed(const hr_qtensor *w, const uint8_t *prow,
                                                                    const hr_qact *a, float *y, int64_t ldy, int64_t n,
                                                                    int accumulate, int64_t i0, int64_t i1,
                                                                    const int wide, const int64_t fmt) {
    const int64_t nb = w->cols / HR_QK, full = nb / 8;
    const int tail = (int)(nb % 8);
    __m256 acc[1][HR_M_TILE];
    for (int64_t i = i0; i < i1; i++) acc[0][i - i0] = _mm256_setzero_ps();
    for (int64_t g = 0; g < full; g++) group_rows(prow, 0, a, i0, i1, g, nb, 8, 8, acc, 1, wide, fmt);
    if (tail && group_vectors(tail) == 4) group_rows(prow, 0, a, i0, i1, full, nb, tail, 4, acc, 1, wide, fmt);
    else if (tail && group_vectors(tail) == 2) group_rows(prow, 0, a, i0, i1, full, nb, tail, 2, acc, 1, wide, fmt);
    else if (tail) group_rows(prow, 0, a, i0, i1, full, nb, tail, 8, acc, 1, wide, fmt);
    for (int64_t i = i0; i < i1; i += 8)
        store_sums(y + i * ldy + n, ldy, &acc[0][i - i0], i1 - i < 8 ? (int)(i1 - i) : 8, accumulate);
}

/* decode (M = 1): group g of NR packed weight rows against the one activation row, the accumulators in registers */
__attribute__((always_inline)) T_AVX2 static inline void group_m1(const uint8_t *prow, int64_t rb, const hr_qact *a,
                                                                 int64_t g, int nt, const int nv, __m256 *acc,
                                                                 const int nr, const int wide, const int64_t fmt) {
    const int64_t gb = 8 * block_bytes(fmt), q41 = fmt == HR_Q4_1;
    const __m256 dx = floats(a->d + g * 8, nt), sx = q41 ? floats(a->s + g * 8, nt) : _mm256_setzero_ps();
    const int8_t *x = a->qt + g * 8 * HR_QK, *xl = wide ? a->qtl + g * 8 * HR_QK : NULL;
    for (int r = 0; r < nr; r++) {
        const uint8_t *gp = prow + r * rb + g * gb;
        __m256i wa[8], wv[8], isum;
        if (wide && fmt == HR_Q8_0) {
            dot16t(gp, nt, a->q16t + g * 8 * HR_QK, 0, 1, &isum);
            acc[r] = scale_add(acc[r], halves(gp, nt), _mm256_setzero_ps(), 0, nt, isum, dx, sx);
            continue;
        }
        unpack(gp, fmt, nt, nv, wa, wv);
        isum = wide ? dot16(wv, x, xl, bias128(wv, nv), nv) : dot8(wa, wv, x, fmt, nv);
        const __m256 mw = q41 ? halves(gp + 2 * nt, nt) : _mm256_setzero_ps();
        acc[r] = scale_add(acc[r], halves(gp, nt), mw, (int)q41, nt, fold_tail(isum, nv), dx, sx);
    }
}

__attribute__((always_inline)) T_AVX2 static inline void rows_m1(const hr_qtensor *w, const uint8_t *prow, int64_t rb,
                                                                const hr_qact *a, float *y, int64_t n, int accumulate,
                                                                const int nr, const int wide, const int64_t fmt) {
    const int64_t nb = w->cols / HR_QK, full = nb / 8;
    const int tail = (int)(nb % 8);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t g = 0; g < full; g++) group_m1(prow, rb, a, g, 8, 8, acc, nr, wide, fmt);
    if (tail && group_vectors(tail) == 4) group_m1(prow, rb, a, full, tail, 4, acc, nr, wide, fmt);
    else if (tail && group_vectors(tail) == 2) group_m1(prow, rb, a, full, tail, 2, acc, nr, wide, fmt);
    else if (tail) group_m1(prow, rb, a, full, tail, 8, acc, nr, wide, fmt);
    store_sums(y + n, 1, acc, nr, accumulate);
}

/* rows [n0, n1) */
__attribute__((always_inline)) T_AVX2 static inline void gemm_packed(const hr_qtensor *w, const hr_qact *a, float *y,
                                                                    int64_t ldy, int accumulate, int64_t n0,
                                                                    int64_t n1, const int wide, const int64_t fmt) {
    const int64_t row = hr_packed_bytes(fmt, 1, w->cols);
    int64_t n = n0;
    if (a->m == 1) {
        for (; n + 4 <= n1; n += 4) rows_m1(w, w->packed + n * row, row, a, y, n, accumulate, 4, wide, fmt);
        for (; n < n1; n++) rows_m1(w, w->packed + n * row, row, a, y, n, accumulate, 1, wide, fmt);
        return;
    }
    /* activation rows in tiles that stay in L1 while the call's weight rows (a chunk of HR_ROWS_PER_CHUNK, in L1 / L2)
     * are swept once per tile */
    const int64_t mt = hr_act_tile_rows(w->cols, wide);
    for (int64_t i0 = 0; i0 < a->m; i0 += mt)
        for (n = n0; n < n1; n++) rows_packed(w, w->packed + n * row, a, y, ldy, n, accumulate, i0,
                                              i0 + mt < a->m ? i0 + mt : a->m, wide, fmt);
}

/* one instance per (format, input width) */
T_AVX2 static void gemm_packed_avx2(const hr_qtensor *w, const hr_qact *a, float *y, int64_t ldy, int accumulate,
                                    int64_t n0, int64_t n1) {
    const int wide = a->q16 != NULL;
    if (w->fmt == HR_Q4_1 && wide) gemm_packed(w, a, y, ldy, accumulate, n0, n1, 1, HR_Q4_1);
    else if (w->fmt == HR_Q4_1) gemm_packed(w, a, y, ldy, accumulate, n0, n1, 0, HR_Q4_1);
    else if (w->fmt == HR_Q4_0 && wide) gemm_packed(w, a, y, ldy, accumulate, n0, n1, 1, HR_Q4_0);
    else if (w->fmt == HR_Q4_0) gemm_packed(w, a, y, ldy, accumulate, n0, n1, 0, HR_Q4_0);
    else if (w->fmt == HR_Q8_0 && wide) gemm_packed(w, a, y, ldy, accumulate, n0, n1, 1, HR_Q8_0);
    else if (w->fmt == HR_Q8_0) gemm_packed(w, a, y, ldy, accumulate, n0, n1, 0, HR_Q8_0);
}
#endif

void hr_gemm_rows_packed_avx2(const hr_qtensor *w, const hr_qact *a, float *y, int64_t ldy, int accumulate, int64_t n0,
                              int64_t n1) {
#if HR_X86
    gemm_packed_avx2(w, a, y, ldy, accumulate, n0, n1);
#else
    (void)w, (void)a, (void)y, (void)ldy, (void)accumulate, (void)n0, (void)n1;
#endif
}
