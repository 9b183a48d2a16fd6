/* Shared by the native GGUF block-quant kernels (native_quant.c, native_gemm.c, native_step.c): weight tensors, quantised
 * activations, instruction-set selection. The arithmetic is headroom/llm/quant_blocks.py's contract, bit for bit. */
#ifndef HR_NATIVE_H
#define HR_NATIVE_H
#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HR_X86 1
#include <immintrin.h>
/* per-function targets: the library is built for the x86-64 baseline, these run after a cpuid check */
#define T_AVX2 __attribute__((target("avx2,fma,f16c")))
#define T_VNNI __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")))
#else
#define HR_X86 0
#endif
#define HR_MAX_COLS 16384 /* widest K a call accepts (per-thread row buffers live on the stack) */

enum { HR_F32 = 0, HR_F16 = 1, HR_Q4_0 = 2, HR_Q4_1 = 3, HR_Q8_0 = 4 };       /* weight formats */
enum { HR_ISA_SCALAR = 0, HR_ISA_AVX2 = 1, HR_ISA_AVX512VNNI = 2, HR_ISA_COUNT = 3 }; /* kernel paths */
#define HR_QK 32                                                                /* values per block */
/* bytes per row of hr_qact.qt: every group of 8 blocks transposed, the tail group padded with zero blocks */
#define HR_QT_STRIDE(k) ((((k) / HR_QK + 7) / 8) * 8 * HR_QK)
/* a tail group of nt blocks stored compact in hr_qact.qt / qtl (chunk c of block l at 4 * nt * c + 4 * l, as the packed
 * weights are) rather than padded to 8 blocks (native_pack.c) */
#define HR_COMPACT_TAIL(nt) ((nt) == 2 || (nt) == 4)

typedef struct {
    int64_t fmt;         /* HR_F32 ... HR_Q8_0 */
    int64_t rows, cols;  /* out x in */
    const uint8_t *data; /* rows * row_bytes, row-major (GGUF layout) */
    const uint8_t *packed; /* NULL, or the same weights in the SIMD paths' layout (hr_pack_tensor, native_pack.c) */
} hr_qtensor;

typedef struct {
    const float *x; /* [m, k] fp32 (F16/F32 weights read it directly) */
    int8_t *q;      /* [m, k] quantised values */
    int8_t *qt;     /* NULL, or [m, HR_QT_STRIDE(k)]: q with each group of 8 blocks transposed, the tail group padded
                       with zero blocks or compact (HR_COMPACT_TAIL) (the SIMD paths) */
    int16_t *q16;   /* NULL, or [m, k] 16-bit values: then block-format weights use these, not q (d, s match) */
    float *d, *s;   /* [m, k / 32] block scale and d * sum(q) */
    int64_t m, k;
    int8_t *qtl;    /* NULL, or (with q16, the SIMD paths) q16's low bytes transposed like qt; qt then holds its high
                       bytes + 128: q16 = 256 * (qt - 128) + qtl, both read as unsigned bytes (hr_split16_planes) */
    int16_t *q16t;  /* NULL, or (with q16, the AVX2 path) [m, HR_QT_STRIDE(k)]: q16 with each group of 8 blocks
                       transposed by 4 values (hr_transpose16) */
} hr_qact;

int64_t hr_row_bytes(int64_t fmt, int64_t cols);
int hr_native_isa_supported(int64_t isa);
/* x rows -> a (a->x, q, d, s allocated by the caller for a->m rows of a->k) */
void hr_quantize_rows(const float *x, int64_t m, int64_t k, int8_t *q, float *d, float *s);
/* the same with 16 bits (qmax 32767; every path runs this one) */
void hr_quantize_rows16(const float *x, int64_t m, int64_t k, int16_t *q, float *d, float *s);
/* the same on path isa (AVX2 on the SIMD paths; identical results for finite x) */
void hr_quantize_rows16_isa(const float *x, int64_t m, int64_t k, int16_t *q, float *d, float *s, int64_t isa);
/* the SIMD paths' planes of 16-bit values (hr_qact.qt / qtl) for m rows of k, HR_QT_STRIDE(k) apart */
void hr_split16_planes(const int16_t *q16, int64_t m, int64_t k, int8_t *qth, int8_t *qtl);
/* q16t [m, HR_QT_STRIDE(k)] = each group of 8 blocks of q16 transposed by 4 values: values 4c .. 4c + 3 of block l at
 * (8c + l) * 4 within the group (8 * 32 values); a tail group of nt blocks is compact ((nt * c + l) * 4, HR_COMPACT_TAIL:
 * the packed weights' order) or padded with zero blocks (the AVX2 path's Q8_0 lm_head) */
void hr_transpose16(const int16_t *q16, int64_t m, int64_t k, int16_t *q16t);
/* the same on path isa (identical results for finite x); qt (nullable) gets the SIMD paths' transposed copy */
void hr_quantize_rows_isa(const float *x, int64_t m, int64_t k, int8_t *q, float *d, float *s, int8_t *qt,
                          int64_t isa);
/* y[i, n] (= or +=) a_i . W_n for every row i < a->m and every n, split over the enclosing OpenMP team (orphaned
 * `omp for nowait`: call from every thread of the team, then `omp barrier` before reading y; or from one thread
 * outside any region). */
void hr_gemm_team(const hr_qtensor *w, const hr_qact *a, float *y, int64_t ldy, int accumulate, int64_t isa);
/* 0 when w is a well-formed tensor this library can run on path isa, else -2 */
int hr_check_tensor(const hr_qtensor *w, int64_t isa);
/* row r of w as fp32 [w->cols] (q * d, + m for Q4_1) */
void hr_dequantize_row(const hr_qtensor *w, int64_t r, float *out);
/* bytes of the packed layout of a rows x cols tensor of format fmt, or -1 where it has none (F16 / F32) */
int64_t hr_packed_bytes(int64_t fmt, int64_t rows, int64_t cols);
/* rows [n0, n1) of y from w->packed (VNNI path: 8-bit activations with a->qt, or 16-bit ones (a->q16) with the planes
 * a->qt / a->qtl; native_pack.c) */
void hr_gemm_rows_packed(const hr_qtensor *w, const hr_qact *a, float *y, int64_t ldy, int accumulate, int64_t n0,
                         int64_t n1);
/* fp32 value of one fp16 (exact) */
float hr_f16_to_f32(uint16_t h);

#if HR_X86
/* 8x8 dword transpose in place: afterwards r[c] holds dword c of the old r[0..7] */
T_AVX2 static inline void transpose8(__m256i *r) {
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]), t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]), u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]), u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int c = 0; c < 4; c++)
        r[c] = _mm256_permute2x128_si256(u[c], u[c + 4], 0x20), r[c + 4] = _mm256_permute2x128_si256(u[c], u[c + 4], 0x31);
}
#endif

#endif
