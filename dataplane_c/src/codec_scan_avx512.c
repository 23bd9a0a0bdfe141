/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec_scan_avx512.c - the AVX-512 path of the one-pass scan (codec_scan.c
 * chooses it at run time, hg_codec_avx512()); same bits as the portable
 * code.
 */
#include <string.h>

#include <immintrin.h>

#include "codec_pvt.h"

/*
 * The whole 16-element vectors of a block, as codec_scan.c's scan_tail
 * does them: each vector's non-zero mask is its 16 bitmap bits; positions
 * and values are compressed in registers (a compressing store to memory is
 * slow on some CPUs) and all 16 lanes stored, the output advancing by the
 * count.
 */
__attribute__((target("avx512f,avx512bw,avx512dq"))) uint32_t
hg_scan_avx512(const float *xb, uint32_t len16, uint16_t *pos, float *val,
	       uint8_t *bm, uint32_t *amax)
{
	const __m512i m = _mm512_set1_epi32(0x7FFFFFFF);
	const __m512i step = _mm512_set1_epi32(16);
	__m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
					12, 13, 14, 15);
	__m512i mx = _mm512_setzero_si512();
	uint32_t c = 0;

	for (uint32_t i = 0; i < len16; i += 16) {
		__m512 v = _mm512_loadu_ps(xb + i);
		__m512i a = _mm512_and_si512(_mm512_castps_si512(v), m);
		__mmask16 nz = _mm512_test_epi32_mask(a, a);
		uint16_t bits = (uint16_t)nz;

		mx = _mm512_max_epu32(mx, a);
		memcpy(bm + i / 8, &bits, 2); /* LSB first: little endian */
		_mm256_storeu_si256((__m256i *)(pos + c),
				    _mm512_cvtepi32_epi16(
					    _mm512_maskz_compress_epi32(nz, idx)));
		_mm512_storeu_ps(val + c, _mm512_maskz_compress_ps(nz, v));
		c += (uint32_t)__builtin_popcount(nz);
		idx = _mm512_add_epi32(idx, step);
	}
	{
		uint32_t r = _mm512_reduce_max_epu32(mx);

		*amax = r > *amax ? r : *amax;
	}
	/* leave no dirty upper state to the SSE code that follows */
	_mm256_zeroupper();
	return c;
}
