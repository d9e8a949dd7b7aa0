/* int8 matrix products for generating on a CPU with AVX-512 VNNI (gptkit/fast/int8_kernel.py
 * compiles this file for the machine it runs on and calls it through ctypes).
 *
 *   y[m][o] = xs[m] * ws[o] * sum_i xq[m][i] * q[o][i]  + bias[o]
 *
 * q (out, in) are a Linear's weights rounded to int8 per output row (w = ws * q);
 * xq (rows, in) are the inputs rounded to int8 per row the same way (x = xs * xq), so
 * each product is a sum of int8 * int8 in int32, exact. One token reads each weight
 * once: a quarter of float32's bytes.
 *
 * VNNI's vpdpbusd multiplies 64 unsigned bytes by 64 signed bytes and adds each four
 * neighbouring products into 16 int32 sums, in one instruction. The inputs are made
 * unsigned by adding 128: sum (xq + 128) q = sum xq q + 128 sum q, so the row sums
 * of q (qsum, computed once) take the 128 back out. */

#include <stdint.h>
#include <stdlib.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>

int has_vnni(void) { return 1; }

/* The first n of 16 lanes (all 16 where n >= 16): which lanes a masked load or store touches. */
static __mmask16 lanes(int n) { return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1); }

/* One input row x (in,) -> xq (in,) as unsigned bytes round(x / s) + 128; returns s.
 * 16 floats at a time: the largest |x| first (s = that / 127), then each x / s rounded to
 * the nearest integer, ties to even (the CPU's default rounding, as lrintf), plus 128. */
static float quantize_row(const float *x, int in, uint8_t *xq) {
    __m512 amax = _mm512_setzero_ps();
    for (int i = 0; i < in; i += 16)  /* |x| as max_ps's first operand: a NaN there is passed over */
        amax = _mm512_max_ps(_mm512_abs_ps(_mm512_maskz_loadu_ps(lanes(in - i), x + i)), amax);
    float top = _mm512_reduce_max_ps(amax);
    float s = top > 0.f ? top / 127.f : 1.f;
    __m512 scale = _mm512_set1_ps(s);
    __m512i offset = _mm512_set1_epi32(128);
    for (int i = 0; i < in; i += 16) {
        __m512i q = _mm512_cvtps_epi32(_mm512_div_ps(_mm512_maskz_loadu_ps(lanes(in - i), x + i), scale));
        _mm512_mask_cvtepi32_storeu_epi8(xq + i, lanes(in - i), _mm512_add_epi32(q, offset));
    }
    return s;
}

/* sum_i xq[i] * q[i] over one row, 64 bytes at a time (a masked load for the rest). */
static int32_t dot(const uint8_t *xq, const int8_t *q, int in) {
    __m512i sums = _mm512_setzero_si512();
    int i = 0;
    for (; i + 64 <= in; i += 64)
        sums = _mm512_dpbusd_epi32(sums, _mm512_loadu_si512(xq + i), _mm512_loadu_si512(q + i));
    if (i < in) {
        __mmask64 rest = ~0ULL >> (64 - (in - i));
        sums = _mm512_dpbusd_epi32(sums, _mm512_maskz_loadu_epi8(rest, xq + i),
                                   _mm512_maskz_loadu_epi8(rest, q + i));
    }
    return _mm512_reduce_add_epi32(sums);
}

/* x (rows, in) float32, q (out, in) int8, ws (out,), qsum (out,), bias (out,) or NULL
 * -> y (rows, out) float32. Returns 0, or -1 where the scratch memory is not there. */
int int8_linear(const float *x, int rows, int in, const int8_t *q, const float *ws, const int32_t *qsum,
                const float *bias, int out, float *y) {
    uint8_t *xq = malloc((size_t)rows * in);  /* the inputs as unsigned bytes, row by row */
    float *xs = malloc((size_t)rows * sizeof(float));  /* and each row's scale */
    if (!xq || !xs) {
        free(xq);
        free(xs);
        return -1;
    }
    for (int m = 0; m < rows; m++) xs[m] = quantize_row(x + (int64_t)m * in, in, xq + (int64_t)m * in);
    for (int o = 0; o < out; o++) {  /* each weight row is read from memory once, for every input row */
        const int8_t *row = q + (int64_t)o * in;
        for (int m = 0; m < rows; m++) {
            int32_t sum = dot(xq + (int64_t)m * in, row, in) - 128 * qsum[o];
            y[(int64_t)m * out + o] = (float)sum * xs[m] * ws[o] + (bias ? bias[o] : 0.f);
        }
    }
    free(xq);
    free(xs);
    return 0;
}
#else
int has_vnni(void) { return 0; } /* built for a CPU without AVX-512 VNNI: not used */
#endif
