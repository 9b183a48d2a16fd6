/* Shared by the native GGUF block-quant kernels (native_gemm.c, native_step.c): weight tensors, quantised
 * activations, instruction-set selection. The arithmetic is headroom/llm/quant_blocks.py's contract, bit for bit. */
#ifndef HR_NATIVE_H
#define HR_NATIVE_H
#include <stdint.h>

enum { HR_F32 = 0, HR_F16 = 1, HR_Q4_0 = 2, HR_Q4_1 = 3, HR_Q8_0 = 4 };       /* weight formats */
enum { HR_ISA_SCALAR = 0, HR_ISA_AVX2 = 1, HR_ISA_AVX512VNNI = 2, HR_ISA_COUNT = 3 }; /* kernel paths */
#define HR_QK 32                                                                /* values per block */

typedef struct {
    int64_t fmt;         /* HR_F32 ... HR_Q8_0 */
    int64_t rows, cols;  /* out x in */
    const uint8_t *data; /* rows * row_bytes, row-major (GGUF layout) */
} hr_qtensor;

typedef struct {
    const float *x; /* [m, k] fp32 (F16/F32 weights read it directly) */
    int8_t *q;      /* [m, k] quantised values */
    float *d, *s;   /* [m, k / 32] block scale and d * sum(q) */
    int64_t m, k;
} hr_qact;

int64_t hr_row_bytes(int64_t fmt, int64_t cols);
int hr_native_isa_supported(int64_t isa);
/* x rows -> a (a->x, q, d, s allocated by the caller for a->m rows of a->k) */
void hr_quantize_rows(const float *x, int64_t m, int64_t k, int8_t *q, float *d, float *s);
/* y[i, n] (= or +=) a_i . W_n for every row i < a->m and every n, split over the enclosing OpenMP team (orphaned
 * `omp for`; call from every thread of the team, or from one thread outside any region). */
void hr_gemm_team(const hr_qtensor *w, const hr_qact *a, float *y, int64_t ldy, int accumulate, int64_t isa);
/* 0 when w is a well-formed tensor this library can run on path isa, else -2 */
int hr_check_tensor(const hr_qtensor *w, int64_t isa);
/* row r of w as fp32 [w->cols] (q * d, + m for Q4_1) */
void hr_dequantize_row(const hr_qtensor *w, int64_t r, float *out);
/* fp32 value of one fp16 (exact) */
float hr_f16_to_f32(uint16_t h);

#endif
