/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec_scan_avx2.c - the AVX2 path of the one-pass scan (codec_scan.c
 * chooses it at run time, hg_codec_isa() avx2); same bits as the portable
 * code and the AVX-512 path.
 */
#include <string.h>

#include "avx2_pvt.h"
#include "codec_pvt.h"

/*
 * The whole 8-element vectors of a block, as codec_scan.c's scan_tail does
 * them: each vector's non-zero mask is its bitmap byte; positions (16-bit)
 * and values are compressed in registers by that mask and all 8 lanes
 * stored, the output advancing by the count (pos / val need 8 entries of
 * slack).
 */
__attribute__((target("avx2,bmi,bmi2,popcnt")))
uint32_t hg_scan_avx2(const float *xb, uint32_t len8, uint16_t *pos,
		      float *val, uint8_t *bm, uint32_t *amax)
{
	const __m256i m = _mm256_set1_epi32(0x7FFFFFFF);
	const __m256i z = _mm256_setzero_si256();
	__m256i mx = z;
	uint32_t c = 0, lanes[8], r = *amax;

	for (uint32_t i = 0; i < len8; i += 8) {
		__m256 v = _mm256_loadu_ps(xb + i);
		__m256i a = _mm256_and_si256(_mm256_castps_si256(v), m);
		uint32_t nz = ~(uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(
				      _mm256_cmpeq_epi32(a, z))) & 0xFFu;
		uint64_t idx = avx2_compress_idx(nz);
		__m128i i8 = _mm_cvtsi64_si128((long long)idx);

		mx = _mm256_max_epu32(mx, a);
		bm[i / 8] = (uint8_t)nz;
		_mm256_storeu_ps(val + c, _mm256_permutevar8x32_ps(
						  v, _mm256_cvtepu8_epi32(i8)));
		_mm_storeu_si128((__m128i *)(pos + c),
				 _mm_add_epi16(_mm_cvtepu8_epi16(i8),
					       _mm_set1_epi16((short)i)));
		c += (uint32_t)__builtin_popcount(nz);
	}
	_mm256_storeu_si256((__m256i *)lanes, mx);
	for (int k = 0; k < 8; k++)
		r = lanes[k] > r ? lanes[k] : r;
	*amax = r;
	_mm256_zeroupper();
	return c;
}
