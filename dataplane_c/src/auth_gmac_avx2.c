/* SPDX-License-Identifier: Apache-2.0 */
/*
 * AES-GMAC's multiply-and-sum on ymm VPCLMULQDQ (auth_gmac_pvt.h), for CPUs
 * with VPCLMULQDQ at 256 bits and no AVX-512: two blocks per 32-byte load,
 * each multiplied lane by lane with its power of H by Karatsuba's three
 * multiplies, not four: a0*b0, a1*b1 and (a0 + a1)*(b0 + b1), the last
 * against the key's precomputed b0 + b1 (hg_gmac_key.hkar); the middle term
 * a1*b0 + a0*b1 is that sum plus the other two, taken once at the end.  On
 * Intel the multiplies and the byte shuffle share port 5; the half swap that
 * makes a0 + a1 is an in-lane shuffle that has a second port.  An odd last
 * block on xmm; the two lanes of the sums folded at the end.
 */
#include "auth_gmac_pvt.h"

#define GMAC_AVX2 __attribute__((target("avx2,vpclmulqdq,aes,pclmul,ssse3")))

GMAC_AVX2 static inline __m128i fold2(__m256i v)
{
	return _mm_xor_si128(_mm256_castsi256_si128(v),
			     _mm256_extracti128_si256(v, 1));
}

/* x's two reflected blocks at p; xk's low halves their a0 + a1 */
#define KAR_LOAD(x, xk, p)                                                        \
	do {                                                                      \
		x = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(p)), \
					bs);                                      \
		xk = _mm256_xor_si256(x, _mm256_shuffle_epi32(x, 0x4e));          \
	} while (0)

GMAC_AVX2 void hg_gmac_mul_avx2(__m128i y, const uint8_t *blocks,
				const uint8_t (*hp)[16], const uint8_t (*hk)[16],
				size_t n, struct hg_gmac_sum *s, const uint8_t *pf)
{
	const __m256i bs = _mm256_broadcastsi128_si256(
		_mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
	__m256i lo = _mm256_setzero_si256(), mk = lo, hi = lo, x, xk, h, k;
	size_t i = 0;

	if (n >= 2) {
		__builtin_prefetch(pf, 0);
		__builtin_prefetch(pf + 64, 0);
		/* four blocks a turn, their products summed in pairs first;
		 * one line of pf (the next frame's) prefetched a turn */
		for (i = 2; i + 4 <= n; i += 4) {
			__m256i x2, xk2, h2, k2;

			__builtin_prefetch(pf + 16 * i + 128, 0);
			KAR_LOAD(x, xk, blocks + 16 * i);
			KAR_LOAD(x2, xk2, blocks + 16 * i + 32);
			h = _mm256_loadu_si256((const __m256i *)hp[i]);
			h2 = _mm256_loadu_si256((const __m256i *)hp[i + 2]);
			k = _mm256_loadu_si256((const __m256i *)hk[i]);
			k2 = _mm256_loadu_si256((const __m256i *)hk[i + 2]);
			lo = _mm256_xor_si256(
				lo,
				_mm256_xor_si256(_mm256_clmulepi64_epi128(x, h, 0x00),
						 _mm256_clmulepi64_epi128(x2, h2,
									  0x00)));
			hi = _mm256_xor_si256(
				hi,
				_mm256_xor_si256(_mm256_clmulepi64_epi128(x, h, 0x11),
						 _mm256_clmulepi64_epi128(x2, h2,
									  0x11)));
			mk = _mm256_xor_si256(
				mk,
				_mm256_xor_si256(_mm256_clmulepi64_epi128(xk, k, 0x00),
						 _mm256_clmulepi64_epi128(xk2, k2,
									  0x00)));
		}
		for (; i + 2 <= n; i += 2) {
			KAR_LOAD(x, xk, blocks + 16 * i);
			h = _mm256_loadu_si256((const __m256i *)hp[i]);
			k = _mm256_loadu_si256((const __m256i *)hk[i]);
			lo = _mm256_xor_si256(lo, _mm256_clmulepi64_epi128(x, h,
									   0x00));
			hi = _mm256_xor_si256(hi, _mm256_clmulepi64_epi128(x, h,
									   0x11));
			mk = _mm256_xor_si256(mk, _mm256_clmulepi64_epi128(xk, k,
									   0x00));
		}
		/* the first two blocks last: y, made by the reduction before,
		 * joins the sums after this chunk's other products */
		x = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)blocks),
					bs);
		x = _mm256_xor_si256(x, _mm256_zextsi128_si256(y));
		xk = _mm256_xor_si256(x, _mm256_shuffle_epi32(x, 0x4e));
		y = _mm_setzero_si128();
		h = _mm256_loadu_si256((const __m256i *)hp[0]);
		k = _mm256_loadu_si256((const __m256i *)hk[0]);
		lo = _mm256_xor_si256(lo, _mm256_clmulepi64_epi128(x, h, 0x00));
		hi = _mm256_xor_si256(hi, _mm256_clmulepi64_epi128(x, h, 0x11));
		mk = _mm256_xor_si256(mk, _mm256_clmulepi64_epi128(xk, k, 0x00));
	}
	s->lo = _mm_xor_si128(s->lo, fold2(lo));
	s->hi = _mm_xor_si128(s->hi, fold2(hi));
	/* the middle terms: (a0 + a1)(b0 + b1) + a0 b0 + a1 b1 */
	s->mid = _mm_xor_si128(s->mid,
			       fold2(_mm256_xor_si256(mk, _mm256_xor_si256(lo, hi))));
	if (i < n) /* one block left; y is still unused when n == 1 */
		hg_gmac_mul_pclmul(y, blocks + 16 * i, hp + i, 1, s);
}
