/* int8 matrix products for generating on a CPU (gptkit/fast/int8_kernel.py compiles this
 * file for the machine it runs on and calls it through ctypes).
 *
 *   y[m][o] = xs[m] * ws[o] * sum_i xq[m][i] * q[o][i]  + bias[o]
 *
 * q (out, in) are a Linear's weights rounded to int8 per output row (w = ws * q, |q| <= 127);
 * xq (rows, in) are the inputs rounded to int8 per row the same way (x = xs * xq), so
 * each product is a sum of int8 * int8 in int32, exact. One token reads each weight
 * once: a quarter of float32's bytes.
 *
 * One formula, three instruction sets, the same int32 sums (so the same floats) on each:
 * - AVX-512 VNNI (Intel since Ice Lake servers, AMD Zen 4): vpdpbusd multiplies 64
 *   unsigned bytes by 64 signed bytes and adds each four neighbouring products into 16
 *   int32 sums, in one instruction. The inputs are made unsigned by adding 128:
 *   sum (xq + 128) q = sum xq q + 128 sum q, so the row sums of q (qsum, computed once)
 *   take the 128 back out.
 * - AVX-VNNI (Intel since Alder Lake): the same instruction on 32 bytes.
 * - AVX2 (most laptops): vpmaddubsw multiplies 32 unsigned by 32 signed bytes and adds
 *   neighbouring pairs into int16, which would overflow for unsigned bytes up to 255. So
 *   the unsigned side is |xq| (<= 127) and xq's sign moves onto q (vpsignb): each pair
 *   is at most 2 * 127 * 127 = 32,258 and fits; vpmaddwd then adds pairs into int32.
 *   (llama.cpp's q8_0 dot product on AVX2 uses the same two steps.) */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define ISA 3
#define OFFSET 128 /* the inputs are stored as unsigned bytes xq + 128 */

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

/* sum_i xq[i] * q[i] over one row (xq offset by 128), 64 bytes at a time (a masked load for the rest). */
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

#elif defined(__AVX2__)
#include <immintrin.h>

/* 32 floats (n of them, the rest read as 0) -> 32 int8 round(x / s), ties to even. */
static __m256i round_32(const float *x, int n, __m256 scale) {
    __m256i q[4];
    for (int k = 0; k < 4; k++) {
        int left = n - 8 * k;
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        q[k] = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_maskload_ps(x + 8 * k, mask), scale));
    }
    /* int32 -> int16 -> int8 packs within each 128-bit half; the permute puts the bytes back in order */
    __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    return _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

#if defined(__AVXVNNI__)
#define ISA 2
#define OFFSET 128
#else
#define ISA 1
#define OFFSET 0 /* AVX2 keeps the inputs signed */
#endif

/* One input row x (in,) -> xq (in,) as round(x / s) (+ OFFSET, as unsigned bytes); returns s. */
static float quantize_row(const float *x, int in, uint8_t *xq) {
    __m256 amax = _mm256_setzero_ps(), sign = _mm256_set1_ps(-0.0f);
    for (int i = 0; i < in; i += 8) {
        int left = in - i;
        __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        amax = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_maskload_ps(x + i, mask)), amax);
    }
    float top[8], best = 0.f;
    _mm256_storeu_ps(top, amax);
    for (int k = 0; k < 8; k++) best = top[k] > best ? top[k] : best;
    float s = best > 0.f ? best / 127.f : 1.f;
    __m256 scale = _mm256_set1_ps(s);
    __m256i offset = _mm256_set1_epi8((char)OFFSET);  /* + 128 on a byte: its top bit flipped */
    for (int i = 0; i < in; i += 32) {
        __m256i q = _mm256_xor_si256(round_32(x + i, in - i, scale), offset);
        if (in - i >= 32) {
            _mm256_storeu_si256((__m256i *)(xq + i), q);
        } else {
            uint8_t rest[32];
            _mm256_storeu_si256((__m256i *)rest, q);
            memcpy(xq + i, rest, (size_t)(in - i));
        }
    }
    return s;
}

static int32_t sum_lanes(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* sum_i xq[i] * q[i] over one row, 32 bytes at a time; the last in % 32 one by one. */
static int32_t dot(const uint8_t *xq, const int8_t *q, int in) {
    __m256i sums = _mm256_setzero_si256();
    int i = 0;
#if ISA == 2
    for (; i + 32 <= in; i += 32)
        sums = _mm256_dpbusd_avx_epi32(sums, _mm256_loadu_si256((const __m256i *)(xq + i)),
                                       _mm256_loadu_si256((const __m256i *)(q + i)));
#else
    const __m256i ones = _mm256_set1_epi16(1);
    for (; i + 32 <= in; i += 32) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(xq + i)), w = _mm256_loadu_si256((const __m256i *)(q + i));
        __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(w, x));  /* |x| * sign(x) w */
        sums = _mm256_add_epi32(sums, _mm256_madd_epi16(pairs, ones));
    }
#endif
    int32_t sum = sum_lanes(sums);
    for (; i < in; i++) sum += (OFFSET ? (int32_t)xq[i] : (int32_t)(int8_t)xq[i]) * q[i];
    return sum;
}
#endif

#ifdef ISA
/* Which instructions this library was built for: 3 AVX-512 VNNI, 2 AVX-VNNI, 1 AVX2, 0 none. */
int kernel_isa(void) { return ISA; }

/* x (rows, in) float32, q (out, in) int8, ws (out,), qsum (out,), bias (out,) or NULL
 * -> y (rows, out) float32. Returns 0, or -1 where the scratch memory is not there. */
int int8_linear(const float *x, int rows, int in, const int8_t *q, const float *ws, const int32_t *qsum,
                const float *bias, int out, float *y) {
    uint8_t *xq = malloc((size_t)rows * in);  /* the inputs as bytes, row by row */
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
            int32_t sum = dot(xq + (int64_t)m * in, row, in) - OFFSET * qsum[o];
            y[(int64_t)m * out + o] = (float)sum * xs[m] * ws[o] + (bias ? bias[o] : 0.f);
        }
    }
    free(xq);
    free(xs);
    return 0;
}
#else
int kernel_isa(void) { return 0; } /* built for a CPU without AVX2: not used */
#endif
