/* SPDX-License-Identifier: Apache-2.0 */
/*
 * UMAC's NH on AVX-512 (auth_umac_pvt.h): 128 bytes a turn, both
 * iterations from one pair of loads, as the AVX2 form does with 64.
 * Four 32-byte blocks A, B, C, D in two zmm become X = (A0..A3, B0..B3,
 * C0..C3, D0..D3) and Y = (A4..A7, ..., D4..D7) by one VSHUFI64X2 each;
 * the key words come from the same nhe / nho rows as the AVX2 form's,
 * four rows a load.  A chunk's last blocks (fewer than four, or a
 * partial one zero-padded to 32 bytes) are read with a byte mask and
 * their missing partners' products dropped with a lane mask.
 */
#include <immintrin.h>

#include "auth_umac_pvt.h"

#define UMAC_AVX512 __attribute__((target("avx512f,avx512bw")))

/* NH's products of x + kx and y + ky, summed in 64-bit lanes */
UMAC_AVX512 static inline __m512i nh_quad(__m512i x, __m512i y, __m512i kx,
					  __m512i ky)
{
	x = _mm512_add_epi32(x, kx);
	y = _mm512_add_epi32(y, ky);
	return _mm512_add_epi64(_mm512_mul_epu32(x, y),
				_mm512_mul_epu32(_mm512_srli_epi64(x, 32),
						 _mm512_srli_epi64(y, 32)));
}

/* a0, a1 += both iterations' NH of the four blocks from block 4q, read
 * from a (the first two) and b; keep: the 64-bit lanes that count */
UMAC_AVX512 static inline void nh_turn(const struct hg_umac_key *u, size_t q,
				       __m512i a, __m512i b, __mmask8 keep,
				       __m512i *a0, __m512i *a1)
{
	__m512i x = _mm512_shuffle_i64x2(a, b, 0x88); /* lanes 0, 2 of each */
	__m512i y = _mm512_shuffle_i64x2(a, b, 0xdd); /* lanes 1, 3 of each */
	__m512i ke = _mm512_loadu_si512(u->nhe[4 * q]);
	__m512i ko = _mm512_loadu_si512(u->nho[4 * q]);
	__m512i ke1 = _mm512_loadu_si512(u->nhe[4 * q + 1]);

	*a0 = _mm512_mask_add_epi64(*a0, keep, *a0, nh_quad(x, y, ke, ko));
	*a1 = _mm512_mask_add_epi64(*a1, keep, *a1, nh_quad(x, y, ko, ke1));
}

/* h[t] = L1 of one chunk (hg_umac_chunk_avx512), inlined into UHASH */
UMAC_AVX512 static inline __attribute__((always_inline)) void
chunk_nh(const struct hg_umac_key *u, const uint8_t *m, size_t clen,
	 uint64_t *h, const uint8_t *pf)
{
	size_t turns = clen / 128, rest = clen % 128;
	__m512i a0 = _mm512_setzero_si512(), a1 = a0;

	for (size_t q = 0; q < turns; q++) {
		const uint8_t *p = m + 128 * q;

		if (pf) {
			__builtin_prefetch(pf + 128 * q, 0);
			__builtin_prefetch(pf + 128 * q + 64, 0);
		}
		nh_turn(u, q, _mm512_loadu_si512(p), _mm512_loadu_si512(p + 64),
			0xff, &a0, &a1);
	}
	if (rest || !clen) { /* the last blocks, zero-padded to 32 bytes */
		const uint8_t *p = m + 128 * turns;
		size_t blocks = rest ? (rest + 31) / 32 : 1;
		__mmask64 lo = _cvtu64_mask64(rest >= 64 ? ~0ull :
						     (1ull << rest) - 1);
		__mmask64 hi = _cvtu64_mask64(rest > 64 ? (1ull << (rest - 64)) - 1 : 0);

		nh_turn(u, turns, _mm512_maskz_loadu_epi8(lo, p),
			_mm512_maskz_loadu_epi8(hi, p + 64),
			(__mmask8)((1u << (2 * blocks)) - 1), &a0, &a1);
	}
	h[0] = (uint64_t)_mm512_reduce_add_epi64(a0) + (uint64_t)clen * 8;
	h[1] = (uint64_t)_mm512_reduce_add_epi64(a1) + (uint64_t)clen * 8;
}

UMAC_AVX512 void hg_umac_chunk_avx512(const struct hg_umac_key *u,
				      const uint8_t *m, size_t clen, uint64_t *h,
				      const uint8_t *pf)
{
	chunk_nh(u, m, clen, h, pf);
}

UMAC_AVX512 void hg_umac_uhash_avx512(const struct hg_umac_key *u,
				      const uint8_t *data, size_t len,
				      uint64_t *y, const uint8_t *next)
{
	hg_umac_uhash_with(chunk_nh, u, data, len, y, next);
}
