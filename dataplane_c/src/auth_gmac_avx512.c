/* SPDX-License-Identifier: Apache-2.0 */
/*
 * AES-GMAC's multiply-and-sum on zmm VPCLMULQDQ (auth_gmac_pvt.h): four
 * blocks per 64-byte load, each multiplied lane by lane with its power of
 * H; the last one to three blocks by a masked load (the masked-off lanes
 * read nothing and add nothing); the four lanes of the sums folded at the
 * end.
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

#define XOR3(a, b, c) _mm512_ternarylogic_epi64(a, b, c, 0x96)

GMAC_AVX512 void hg_gmac_mul_avx512(__m128i y, const uint8_t *blocks,
				    const uint8_t (*hp)[16], size_t n,
				    struct hg_gmac_sum *s)
{
	const __m512i bs = _mm512_broadcast_i32x4(
		_mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
	__m512i lo = _mm512_zextsi128_si512(y), mid, hi, x, h;
	size_t i = 0;

	/* y joins the first block: (y + b0) h0 = y h0 + b0 h0, folded in
	 * below as one more lane-0 product */
	h = _mm512_zextsi128_si512(_mm_loadu_si128((const __m128i *)hp[0]));
	mid = XOR3(_mm512_setzero_si512(), _mm512_clmulepi64_epi128(lo, h, 0x01),
		   _mm512_clmulepi64_epi128(lo, h, 0x10));
	hi = _mm512_clmulepi64_epi128(lo, h, 0x11);
	lo = _mm512_clmulepi64_epi128(lo, h, 0x00);
	for (; i + 4 <= n; i += 4) {
		x = _mm512_shuffle_epi8(_mm512_loadu_si512((const void *)(blocks + 16 * i)), bs);
		h = _mm512_loadu_si512((const void *)hp[i]);
		lo = _mm512_xor_si512(lo, _mm512_clmulepi64_epi128(x, h, 0x00));
		mid = XOR3(mid, _mm512_clmulepi64_epi128(x, h, 0x01),
			   _mm512_clmulepi64_epi128(x, h, 0x10));
		hi = _mm512_xor_si512(hi, _mm512_clmulepi64_epi128(x, h, 0x11));
	}
	if (i < n) {
		__mmask8 m = (__mmask8)((1u << (2 * (n - i))) - 1);

		x = _mm512_shuffle_epi8(_mm512_maskz_loadu_epi64(m, blocks + 16 * i), bs);
		h = _mm512_maskz_loadu_epi64(m, hp[i]);
		lo = _mm512_xor_si512(lo, _mm512_clmulepi64_epi128(x, h, 0x00));
		mid = XOR3(mid, _mm512_clmulepi64_epi128(x, h, 0x01),
			   _mm512_clmulepi64_epi128(x, h, 0x10));
		hi = _mm512_xor_si512(hi, _mm512_clmulepi64_epi128(x, h, 0x11));
	}
	s->lo = _mm_xor_si128(s->lo, fold4(lo));
	s->mid = _mm_xor_si128(s->mid, fold4(mid));
	s->hi = _mm_xor_si128(s->hi, fold4(hi));
}
