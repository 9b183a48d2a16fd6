/* Activation quantisation and the shared helpers of the native GGUF kernels: formats' row sizes, run-time path
 * support (cpuid), fp16 -> fp32, per-row q8 quantisation (headroom/llm/quant_blocks.py's contract: amax / 127
 * scale, rint ties-to-even, clamp to +-127, s = d * sum(q)) on the scalar and AVX2 paths, and the VNNI path's
 * transposed copy of the activations. */
#include <math.h>
#include <string.h>

#include "native.h"

int64_t hr_row_bytes(int64_t fmt, int64_t cols) {
    switch (fmt) {
    case HR_F32: return cols * 4;
    case HR_F16: return cols * 2;
    case HR_Q4_0: return cols % HR_QK ? -1 : cols / HR_QK * 18;
    case HR_Q4_1: return cols % HR_QK ? -1 : cols / HR_QK * 20;
    case HR_Q8_0: return cols % HR_QK ? -1 : cols / HR_QK * 34;
    default: return -1;
    }
}

int hr_native_isa_supported(int64_t isa) {
    if (isa == HR_ISA_SCALAR) return 1;
#if HR_X86
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    if (isa == HR_ISA_AVX2) return avx2;
    if (isa == HR_ISA_AVX512VNNI)
        return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
#endif
    return 0;
}

float hr_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0 && man == 0) {
        bits = sign;
    } else if (exp == 0) { /* subnormal: normalise */
        uint32_t e = 0;
        while (!(man & 0x400)) man <<= 1, e++;
        bits = sign | ((113 - e) << 23) | ((man & 0x3ff) << 13);
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* id = qmax / amax, d = amax / qmax (both 0 when amax is 0 or qmax / amax overflows) */
static inline void block_scales_q(float amax, float qmax, float *id, float *db) {
    *id = amax > 0.0f ? qmax / amax : 0.0f;
    if (*id > 3.40282347e38f) *id = 0.0f;
    *db = *id > 0.0f ? amax / qmax : 0.0f;
}


#if HR_X86
/* hr_quantize_rows (q8 != NULL) or hr_quantize_rows16 (q16) for finite x with AVX2: the same ops (max is exact,
 * vroundps = rint) */
T_AVX2 static void quantize_rows_avx2(const float *x, int64_t m, int64_t k, float qmax, int8_t *q, int16_t *q16,
                                      float *d, float *s) {
    const int64_t nb = k / HR_QK;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), lim = _mm256_set1_ps(qmax);
    for (int64_t i = 0; i < m; i++)
        for (int64_t b = 0; b < nb; b++) {
            const float *xb = x + i * k + b * HR_QK;
            __m256 v[4], mx = _mm256_setzero_ps();
            for (int j = 0; j < 4; j++) v[j] = _mm256_loadu_ps(xb + 8 * j), mx = _mm256_max_ps(_mm256_and_ps(v[j], absmask), mx);
            __m128 h = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
            h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            h = _mm_max_ss(h, _mm_movehdup_ps(h));
            float id, db;
            block_scales_q(_mm_cvtss_f32(h), qmax, &id, &db);
            __m256i r[4], sum = _mm256_setzero_si256();
            for (int j = 0; j < 4; j++) {
                __m256 t = _mm256_round_ps(_mm256_mul_ps(v[j], _mm256_set1_ps(id)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                t = _mm256_max_ps(_mm256_min_ps(t, lim), _mm256_sub_ps(_mm256_setzero_ps(), lim));
                r[j] = _mm256_cvtps_epi32(t);
                sum = _mm256_add_epi32(sum, r[j]);
            }
            const __m256i w0 = _mm256_packs_epi32(r[0], r[1]), w1 = _mm256_packs_epi32(r[2], r[3]);
            if (q16) {
                _mm256_storeu_si256((__m256i *)(q16 + i * k + b * HR_QK), _mm256_permute4x64_epi64(w0, 0xD8));
                _mm256_storeu_si256((__m256i *)(q16 + i * k + b * HR_QK + 16), _mm256_permute4x64_epi64(w1, 0xD8));
            } else {
                _mm256_storeu_si256((__m256i *)(q + i * k + b * HR_QK),
                                    _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w0, w1),
                                                                _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
            }
            __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
            d[i * nb + b] = db;
            s[i * nb + b] = db * (float)_mm_cvtsi128_si32(t);
        }
}
#endif

#if HR_X86
/* qt = q with every group of 8 blocks transposed (transpose8), rows HR_QT_STRIDE(k) apart; the tail group is
 * padded with zero blocks, or compact (HR_COMPACT_TAIL: chunk c of block l at 4 * nt * c + 4 * l) */
T_AVX2 static void transpose_groups(const int8_t *q, int8_t *qt, int64_t m, int64_t k) {
    const int64_t nb = k / HR_QK, groups = (nb + 7) / 8;
    for (int64_t i = 0; i < m; i++)
        for (int64_t g = 0; g < groups; g++) {
            const int8_t *src = q + i * k + g * 8 * HR_QK;
            int8_t *dst = qt + i * HR_QT_STRIDE(k) + g * 8 * HR_QK;
            const int64_t nt = nb - g * 8 < 8 ? nb - g * 8 : 8;
            if (HR_COMPACT_TAIL(nt)) {
                for (int64_t c = 0; c < 8; c++)
                    for (int64_t l = 0; l < nt; l++) memcpy(dst + 4 * nt * c + 4 * l, src + l * HR_QK + 4 * c, 4);
                continue;
            }
            __m256i r[8];
            for (int j = 0; j < 8; j++)
                r[j] = g * 8 + j < nb ? _mm256_loadu_si256((const __m256i *)(src + j * HR_QK)) : _mm256_setzero_si256();
            transpose8(r);
            for (int j = 0; j < 8; j++) _mm256_storeu_si256((__m256i *)(dst + j * HR_QK), r[j]);
        }
}
#endif

void hr_split16_planes(const int16_t *q16, int64_t m, int64_t k, int8_t *qth, int8_t *qtl) {
#if HR_X86
    int8_t hi[HR_MAX_COLS], lo[HR_MAX_COLS];
    for (int64_t i = 0; i < m; i++) {
        const int16_t *q = q16 + i * k;
        for (int64_t j = 0; j < k; j++) {
            const int32_t v = q[j] + 32768; /* [1, 65535]: hi = v >> 8 = (q >> 8) + 128, lo = q & 255 */
            hi[j] = (int8_t)(uint8_t)(v >> 8), lo[j] = (int8_t)(uint8_t)(v & 255);
        }
        transpose_groups(hi, qth + i * HR_QT_STRIDE(k), 1, k);
        transpose_groups(lo, qtl + i * HR_QT_STRIDE(k), 1, k);
    }
#else
    (void)q16, (void)m, (void)k, (void)qth, (void)qtl;
#endif
}

void hr_transpose16(const int16_t *q16, int64_t m, int64_t k, int16_t *q16t) {
    const int64_t nb = k / HR_QK, stride = HR_QT_STRIDE(k);
    for (int64_t i = 0; i < m; i++)
        for (int64_t g = 0; g < stride / (8 * HR_QK); g++) {
            const int64_t nt = nb - g * 8 < 8 ? nb - g * 8 : 8, w = HR_COMPACT_TAIL(nt) ? nt : 8;
            for (int64_t l = 0; l < w; l++)
                for (int64_t c = 0; c < 8; c++) {
                    int16_t *dst = q16t + i * stride + g * 8 * HR_QK + (w * c + l) * 4;
                    if (l < nt) memcpy(dst, q16 + i * k + (g * 8 + l) * HR_QK + 4 * c, 4 * sizeof(int16_t));
                    else memset(dst, 0, 4 * sizeof(int16_t));
                }
        }
}

void hr_quantize_rows_isa(const float *x, int64_t m, int64_t k, int8_t *q, float *d, float *s, int8_t *qt,
                          int64_t isa) {
#if HR_X86
    if (isa != HR_ISA_SCALAR) {
        quantize_rows_avx2(x, m, k, 127.0f, q, NULL, d, s);
        if (qt) transpose_groups(q, qt, m, k);
        return;
    }
#endif
    (void)qt;
    (void)isa;
    hr_quantize_rows(x, m, k, q, d, s);
}

/* one block of 32 values -> the rounded, clamped integers in v (as floats); returns sum(q), sets d */
static int32_t quantize_block(const float *xb, float qmax, float *v, float *d) {
    float amax = 0.0f;
    for (int j = 0; j < HR_QK; j++) {
        const float a = fabsf(xb[j]);
        amax = a > amax ? a : amax;
    }
    float id;
    block_scales_q(amax, qmax, &id, d);
    int32_t sum = 0;
    for (int j = 0; j < HR_QK; j++) {
        float t = xb[j] * id;
        t = (t + 12582912.0f) - 12582912.0f; /* rint, ties to even (|t| <= 32767.x < 2^22) */
        v[j] = t > qmax ? qmax : (t < -qmax ? -qmax : (t == t ? t : 0.0f));
        sum += (int32_t)v[j];
    }
    return sum;
}

/* rows of x -> q8 (when q8) or q16 integers with qmax, d and s */
static void quantize_rows_q(const float *x, int64_t m, int64_t k, float qmax, int8_t *q8, int16_t *q16, float *d,
                            float *s) {
    const int64_t nb = k / HR_QK;
    float v[HR_QK], db;
    for (int64_t i = 0; i < m; i++)
        for (int64_t b = 0; b < nb; b++) {
            const int64_t at = i * k + b * HR_QK;
            const int32_t sum = quantize_block(x + at, qmax, v, &db);
            for (int j = 0; j < HR_QK; j++)
                if (q8) q8[at + j] = (int8_t)v[j];
                else q16[at + j] = (int16_t)v[j];
            d[i * nb + b] = db;
            s[i * nb + b] = db * (float)sum;
        }
}

void hr_quantize_rows(const float *x, int64_t m, int64_t k, int8_t *q, float *d, float *s) {
    quantize_rows_q(x, m, k, 127.0f, q, NULL, d, s);
}

void hr_quantize_rows16(const float *x, int64_t m, int64_t k, int16_t *q, float *d, float *s) {
    quantize_rows_q(x, m, k, 32767.0f, NULL, q, d, s);
}

void hr_quantize_rows16_isa(const float *x, int64_t m, int64_t k, int16_t *q, float *d, float *s, int64_t isa) {
#if HR_X86
    if (isa != HR_ISA_SCALAR) {
        quantize_rows_avx2(x, m, k, 32767.0f, NULL, q, d, s);
        return;
    }
#endif
    (void)isa;
    hr_quantize_rows16(x, m, k, q, d, s);
}

/* Checks shared by the exported entry points: 0 ok, -2 bad weight / width / path. */
int hr_check_tensor(const hr_qtensor *w, int64_t isa) {
    if (hr_row_bytes(w->fmt, w->cols) < 0 || w->cols < 1 || w->cols > HR_MAX_COLS || w->rows < 1 || !w->data)
        return -2;
    return isa >= 0 && isa < HR_ISA_COUNT && hr_native_isa_supported(isa) ? 0 : -2;
}
