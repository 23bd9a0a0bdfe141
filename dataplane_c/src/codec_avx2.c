/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec_avx2.c - the AVX2 paths of codec.c (block scan, quantisation,
 * dequantisation), chosen at run time (hg_codec_avx2()); each does the
 * whole vectors of a block and returns how many elements it did, codec.c's
 * portable code does the rest.  Same bits as the portable code: the
 * conversions use the default round-to-nearest-even mode like the scalar
 * code.
 */
#include <immintrin.h>

#include "codec_pvt.h"

__attribute__((target("avx2"))) size_t
hg_absmax_nnz_avx2(const float *x, size_t len, uint32_t *absmax, uint32_t *nnz)
{
	const __m256i m = _mm256_set1_epi32(0x7FFFFFFF);
	const __m256i z = _mm256_setzero_si256();
	__m256i mx0 = z, mx1 = z, zc0 = z, zc1 = z;
	uint32_t lanes[8], zeros = 0, mx = 0;
	size_t i = 0;

	for (; i + 16 <= len; i += 16) {
		__m256i a = _mm256_and_si256(_mm256_loadu_si256(
						     (const __m256i *)(x + i)),
					     m);
		__m256i b = _mm256_and_si256(_mm256_loadu_si256(
						     (const __m256i *)(x + i + 8)),
					     m);

		mx0 = _mm256_max_epu32(mx0, a);
		mx1 = _mm256_max_epu32(mx1, b);
		zc0 = _mm256_sub_epi32(zc0, _mm256_cmpeq_epi32(a, z));
		zc1 = _mm256_sub_epi32(zc1, _mm256_cmpeq_epi32(b, z));
	}
	_mm256_storeu_si256((__m256i *)lanes, _mm256_max_epu32(mx0, mx1));
	for (int k = 0; k < 8; k++)
		mx = lanes[k] > mx ? lanes[k] : mx;
	_mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi32(zc0, zc1));
	for (int k = 0; k < 8; k++)
		zeros += lanes[k];
	*absmax = mx;
	*nnz = (uint32_t)(i - zeros);
	return i;
}

__attribute__((target("avx2"))) size_t hg_quant_avx2(const float *x, size_t len,
						     int8_t code, int shift,
						     uint8_t *out, bool *bad)
{
	const uint32_t lim = hg_code_limit_bits(code);
	const __m256i m = _mm256_set1_epi32(0x7FFFFFFF);
	const __m256i limv = _mm256_set1_epi32((int32_t)(lim - 1));
	const double sd = hg_pow2(shift);
	const __m256d scale = _mm256_set1_pd(sd);
	const __m256 scf = _mm256_set1_ps((float)sd);
	const __m256i bswap = _mm256_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10,
					       9, 8, 15, 14, 13, 12, 3, 2, 1, 0,
					       7, 6, 5, 4, 11, 10, 9, 8, 15, 14,
					       13, 12);
	__m256i over = _mm256_setzero_si256();
	size_t i = 0;

	/* float32 where that gives hg_rne's int32: eight lanes a step */
	if (hg_quant_f32_ok(sd)) {
		for (; i + 8 <= len; i += 8) {
			__m256 v = _mm256_loadu_ps(x + i);
			__m256i a = _mm256_and_si256(_mm256_castps_si256(v), m);

			over = _mm256_or_si256(over, _mm256_cmpgt_epi32(a, limv));
			_mm256_storeu_si256(
				(__m256i *)(out + 4 * i),
				_mm256_shuffle_epi8(_mm256_cvtps_epi32(
							    _mm256_mul_ps(v, scf)),
						    bswap));
		}
		*bad = !_mm256_testz_si256(over, over);
		return i;
	}
	for (; i + 8 <= len; i += 8) {
		__m256 v = _mm256_loadu_ps(x + i);
		__m256i a = _mm256_and_si256(_mm256_castps_si256(v), m);
		__m128i lo, hi;

		over = _mm256_or_si256(over, _mm256_cmpgt_epi32(a, limv));
		/* cvtpd_epi32 rounds to nearest even (default MXCSR) */
		lo = _mm256_cvtpd_epi32(
			_mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(v)),
				      scale));
		hi = _mm256_cvtpd_epi32(
			_mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)),
				      scale));
		_mm256_storeu_si256((__m256i *)(out + 4 * i),
				    _mm256_shuffle_epi8(_mm256_set_m128i(hi, lo),
							bswap));
	}
	*bad = !_mm256_testz_si256(over, over);
	return i;
}

__attribute__((target("avx2"))) size_t
hg_dequant_avx2(const uint8_t *in, size_t len, int shift, float *y)
{
	const double sd = hg_pow2(-shift);
	const __m256d scale = _mm256_set1_pd(sd);
	const __m256 scf = _mm256_set1_ps((float)sd);
	const __m256i bswap = _mm256_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10,
					       9, 8, 15, 14, 13, 12, 3, 2, 1, 0,
					       7, 6, 5, 4, 11, 10, 9, 8, 15, 14,
					       13, 12);
	size_t i = 0;

	/* float32 where that gives the float64 product's rounding */
	if (hg_scale_f32_ok(sd)) {
		for (; i + 8 <= len; i += 8) {
			__m256i v = _mm256_shuffle_epi8(
				_mm256_loadu_si256((const __m256i *)(in + 4 * i)),
				bswap);

			_mm256_storeu_ps(y + i,
					 _mm256_mul_ps(_mm256_cvtepi32_ps(v), scf));
		}
		return i;
	}
	for (; i + 8 <= len; i += 8) {
		__m256i v = _mm256_shuffle_epi8(_mm256_loadu_si256((
							const __m256i *)(in + 4 * i)),
						bswap);
		/* both conversions are exact or round once, like the scalar */
		__m128 lo = _mm256_cvtpd_ps(
			_mm256_mul_pd(_mm256_cvtepi32_pd(_mm256_castsi256_si128(v)),
				      scale));
		__m128 hi = _mm256_cvtpd_ps(
			_mm256_mul_pd(_mm256_cvtepi32_pd(
					      _mm256_extracti128_si256(v, 1)),
				      scale));

		_mm256_storeu_ps(y + i, _mm256_set_m128(hi, lo));
	}
	return i;
}
