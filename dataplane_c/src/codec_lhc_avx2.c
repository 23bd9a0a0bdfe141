/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec_lhc_avx2.c - the AVX2 path of the lhc index encoder (codec_lhc.c
 * chooses it at run time, hg_codec_avx2()); same bits as the portable code.
 */
#include <string.h>

#include <immintrin.h>

#include "codec_lhc_pvt.h"

__attribute__((target("avx2")))
size_t hg_lhc_bitmap_avx2(const float *x, size_t len, uint8_t *out)
{
	const __m256i m = _mm256_set1_epi32(0x7FFFFFFF);
	const __m256i z = _mm256_setzero_si256();
	size_t i = 0;

	for (; i + 32 <= len; i += 32) {
		uint32_t w = 0;

		for (int k = 0; k < 4; k++) {
			__m256i a = _mm256_and_si256(
				_mm256_loadu_si256(
					(const __m256i *)(x + i + 8 * k)),
				m);
			uint32_t zm = (uint32_t)_mm256_movemask_ps(
				_mm256_castsi256_ps(_mm256_cmpeq_epi32(a, z)));

			w |= (~zm & 0xFFu) << (8 * k);
		}
		memcpy(out + i / 8, &w, 4); /* bytes LSB first: little endian */
	}
	return i;
}
