/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The AES-GMAC main loop on ymm VPCLMULQDQ (auth_gmac_pvt.h), for CPUs with
 * VAES/VPCLMULQDQ at 256 bits and no AVX-512: a 16-block chunk is eight
 * 32-byte loads, each multiplied lane by lane with two powers of H; the two
 * lanes of the three sums are folded and reduced once.
 */
#include "auth_gmac_pvt.h"

#define GMAC_AVX2 __attribute__((target("avx2,vpclmulqdq,aes,pclmul,ssse3")))

GMAC_AVX2 static inline __m128i fold2(__m256i v)
{
	return _mm_xor_si128(_mm256_castsi256_si128(v),
			     _mm256_extracti128_si256(v, 1));
}

GMAC_AVX2 size_t hg_gmac_chunks_avx2(const struct hg_gmac_key *g, __m128i *y,
				     const uint8_t *data, size_t len)
{
	const __m256i bs = _mm256_broadcastsi128_si256(
		_mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
	__m256i h[8];
	__m128i acc = *y;
	size_t done = 0;

	for (int k = 0; k < 8; k++)
		h[k] = _mm256_loadu_si256((const __m256i *)g->hpow[2 * k]);
	for (; done + 16 * HG_GMAC_CHUNK <= len; done += 16 * HG_GMAC_CHUNK) {
		__m256i lo = _mm256_setzero_si256(), mid = lo, hi = lo;

		for (int k = 0; k < 8; k++) {
			__m256i x = _mm256_shuffle_epi8(
				_mm256_loadu_si256((const __m256i *)(data + done + 32 * k)), bs);

			if (k == 0)
				x = _mm256_xor_si256(x, _mm256_set_m128i(_mm_setzero_si128(), acc));
			lo = _mm256_xor_si256(lo, _mm256_clmulepi64_epi128(x, h[k], 0x00));
			mid = _mm256_xor_si256(mid, _mm256_xor_si256(
				_mm256_clmulepi64_epi128(x, h[k], 0x01),
				_mm256_clmulepi64_epi128(x, h[k], 0x10)));
			hi = _mm256_xor_si256(hi, _mm256_clmulepi64_epi128(x, h[k], 0x11));
		}
		acc = ghash_reduce(fold2(lo), fold2(mid), fold2(hi));
	}
	*y = acc;
	return done;
}
