/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The AES-GMAC main loop on zmm VPCLMULQDQ (auth_gmac_pvt.h): a 16-block
 * chunk is four 64-byte loads, each multiplied lane by lane with four
 * powers of H; the four lanes of the three sums are folded and reduced once.
 */
#include "auth_gmac_pvt.h"

#define GMAC_AVX512 \
	__attribute__((target("avx512f,avx512bw,avx2,vpclmulqdq,aes,pclmul,ssse3")))

GMAC_AVX512 static inline __m128i fold4(__m512i v)
{
	__m256i t = _mm256_xor_si256(_mm512_castsi512_si256(v),
				     _mm512_extracti64x4_epi64(v, 1));

	return _mm_xor_si128(_mm256_castsi256_si128(t),
			     _mm256_extracti128_si256(t, 1));
}

GMAC_AVX512 size_t hg_gmac_chunks_avx512(const struct hg_gmac_key *g,
					 __m128i *y, const uint8_t *data,
					 size_t len)
{
	const __m512i bs = _mm512_broadcast_i32x4(
		_mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
	__m512i h[4];
	__m128i acc = *y;
	size_t done = 0;

	for (int k = 0; k < 4; k++)
		h[k] = _mm512_loadu_si512((const void *)g->hpow[4 * k]);
	for (; done + 16 * HG_GMAC_CHUNK <= len; done += 16 * HG_GMAC_CHUNK) {
		__m512i lo = _mm512_setzero_si512(), mid = lo, hi = lo;

		for (int k = 0; k < 4; k++) {
			__m512i x = _mm512_shuffle_epi8(
				_mm512_loadu_si512((const void *)(data + done + 64 * k)), bs);

			if (k == 0)
				x = _mm512_xor_si512(x, _mm512_zextsi128_si512(acc));
			lo = _mm512_xor_si512(lo, _mm512_clmulepi64_epi128(x, h[k], 0x00));
			mid = _mm512_ternarylogic_epi64(
				mid, _mm512_clmulepi64_epi128(x, h[k], 0x01),
				_mm512_clmulepi64_epi128(x, h[k], 0x10), 0x96);
			hi = _mm512_xor_si512(hi, _mm512_clmulepi64_epi128(x, h[k], 0x11));
		}
		acc = ghash_reduce(fold4(lo), fold4(mid), fold4(hi));
	}
	*y = acc;
	return done;
}
