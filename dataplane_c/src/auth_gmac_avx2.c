/* SPDX-License-Identifier: Apache-2.0 */
/*
 * AES-GMAC's multiply-and-sum on ymm VPCLMULQDQ (auth_gmac_pvt.h), for CPUs
 * with VPCLMULQDQ at 256 bits and no AVX-512: two blocks per 32-byte load,
 * each multiplied lane by lane with its power of H, an odd last block on
 * xmm; the two lanes of the sums folded at the end.
 */
#include "auth_gmac_pvt.h"

#define GMAC_AVX2 __attribute__((target("avx2,vpclmulqdq,aes,pclmul,ssse3")))

GMAC_AVX2 static inline __m128i fold2(__m256i v)
{
	return _mm_xor_si128(_mm256_castsi256_si128(v),
			     _mm256_extracti128_si256(v, 1));
}

GMAC_AVX2 void hg_gmac_mul_avx2(__m128i y, const uint8_t *blocks,
				const uint8_t (*hp)[16], size_t n,
				struct hg_gmac_sum *s)
{
	const __m256i bs = _mm256_broadcastsi128_si256(
		_mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
	__m256i lo = _mm256_setzero_si256(), mid = lo, hi = lo, x, h;
	__m256i yy = _mm256_set_m128i(_mm_setzero_si128(), y);
	size_t i = 0;

	for (; i + 2 <= n; i += 2) {
		x = _mm256_shuffle_epi8(_mm256_loadu_si256(
						(const __m256i *)(blocks + 16 * i)),
					bs);
		x = _mm256_xor_si256(x, yy); /* y joins the first block */
		yy = _mm256_setzero_si256();
		h = _mm256_loadu_si256((const __m256i *)hp[i]);
		lo = _mm256_xor_si256(lo, _mm256_clmulepi64_epi128(x, h, 0x00));
		mid = _mm256_xor_si256(
			mid,
			_mm256_xor_si256(_mm256_clmulepi64_epi128(x, h, 0x01),
					 _mm256_clmulepi64_epi128(x, h, 0x10)));
		hi = _mm256_xor_si256(hi, _mm256_clmulepi64_epi128(x, h, 0x11));
	}
	s->lo = _mm_xor_si128(s->lo, fold2(lo));
	s->mid = _mm_xor_si128(s->mid, fold2(mid));
	s->hi = _mm_xor_si128(s->hi, fold2(hi));
	if (i < n) /* one block left; y is still unused when n == 1 */
		hg_gmac_mul_pclmul(_mm256_castsi256_si128(yy), blocks + 16 * i,
				   hp + i, 1, s);
}
