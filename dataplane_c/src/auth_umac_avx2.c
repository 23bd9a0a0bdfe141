/* SPDX-License-Identifier: Apache-2.0 */
/*
 * UMAC's NH on AVX2 (auth_umac_pvt.h): 64 bytes a turn, both
 * iterations from one pair of loads.  Blocks A and B (32 bytes each,
 * eight 32-bit words) become X = (A0..A3, B0..B3) and Y = (A4..A7,
 * B4..B7); NH pairs word w with word w + 4, so after each iteration's key
 * is added VPMULUDQ of X and Y gives A0A4, A2A6, B0B4, B2B6 and, on both
 * shifted right by 32, A1A5, A3A7, B1B5, B3B7: every product of the two
 * blocks once, summed in 64-bit lanes (NH's sum is modulo 2^64).
 */
#include <string.h>

#include <immintrin.h>

#include "auth_umac_pvt.h"

#define UMAC_AVX2 __attribute__((target("avx2")))

/* NH's products of x + kx and y + ky, summed in 64-bit lanes */
UMAC_AVX2 static inline __m256i nh_pair(__m256i x, __m256i y, __m256i kx, __m256i ky)
{
	x = _mm256_add_epi32(x, kx);
	y = _mm256_add_epi32(y, ky);
	return _mm256_add_epi64(_mm256_mul_epu32(x, y),
				_mm256_mul_epu32(_mm256_srli_epi64(x, 32),
						 _mm256_srli_epi64(y, 32)));
}

/* a0, a1 += iteration 0's and 1's NH of pair p's halves x and y: under
 * iteration 0, x takes nhe rows 2p, 2p + 1 and y nho's; under iteration
 * 1 (four key words on), x takes nho's and y nhe rows 2p + 1, 2p + 2 */
UMAC_AVX2 static inline void nh_both(const struct hg_umac_key *u, size_t p,
				     __m256i x, __m256i y, __m256i keep,
				     __m256i *a0, __m256i *a1)
{
	__m256i ke = _mm256_loadu_si256((const __m256i *)u->nhe[2 * p]);
	__m256i ko = _mm256_loadu_si256((const __m256i *)u->nho[2 * p]);
	__m256i ke1 = _mm256_loadu_si256((const __m256i *)u->nhe[2 * p + 1]);

	*a0 = _mm256_add_epi64(*a0, _mm256_and_si256(keep, nh_pair(x, y, ke, ko)));
	*a1 = _mm256_add_epi64(*a1, _mm256_and_si256(keep, nh_pair(x, y, ko, ke1)));
}

UMAC_AVX2 static inline uint64_t lanes_sum(__m256i v)
{
	__m128i s = _mm_add_epi64(_mm256_castsi256_si128(v),
				  _mm256_extracti128_si256(v, 1));

	return (uint64_t)_mm_cvtsi128_si64(s) + (uint64_t)_mm_extract_epi64(s, 1);
}

/* a[t] += NH of the 64 * np + 32 * odd bytes at m, from pair p0 of the
 * chunk on (odd: a last block alone, its partner's lanes dropped). */
UMAC_AVX2 static inline void nh(const struct hg_umac_key *u, const uint8_t *m,
				size_t np, int odd, size_t p0, __m256i *a0,
				__m256i *a1, const uint8_t *pf)
{
	__m256i all = _mm256_set1_epi64x(-1);

	for (size_t j = 0, p = p0; j < np; j++, p++) {
		if (pf)
			__builtin_prefetch(pf + 64 * j, 0);
		__m256i a = _mm256_loadu_si256((const __m256i *)(m + 64 * j));
		__m256i b = _mm256_loadu_si256((const __m256i *)(m + 64 * j + 32));

		nh_both(u, p, _mm256_permute2x128_si256(a, b, 0x20),
			_mm256_permute2x128_si256(a, b, 0x31), all, a0, a1);
	}
	if (odd) {
		__m256i a = _mm256_loadu_si256((const __m256i *)(m + 64 * np));
		__m256i z = _mm256_setzero_si256();

		nh_both(u, p0 + np, _mm256_permute2x128_si256(a, z, 0x20),
			_mm256_permute2x128_si256(a, z, 0x31),
			_mm256_set_epi64x(0, 0, -1, -1), a0, a1);
	}
}

/* h[t] = L1 of one chunk (hg_umac_chunk_avx2), inlined where the tag's
 * other steps can run beside it */
UMAC_AVX2 static inline __attribute__((always_inline)) void
chunk_nh(const struct hg_umac_key *u, const uint8_t *m, size_t clen,
	 uint64_t *h, const uint8_t *pf)
{
	size_t full = clen & ~(size_t)63, rest = clen - full;
	__m256i a0 = _mm256_setzero_si256(), a1 = a0;

	nh(u, m, full / 64, 0, 0, &a0, &a1, pf);
	if (rest == 32) { /* a whole block: read in place */
		nh(u, m + full, 0, 1, full / 64, &a0, &a1, NULL);
	} else if (rest || !clen) { /* zero-padded to 32 bytes */
		uint8_t tail[64] __attribute__((aligned(32))) = { 0 };

		memcpy(tail, m + full, rest);
		nh(u, tail, rest > 32, rest <= 32, full / 64, &a0, &a1, NULL);
	}
	h[0] = lanes_sum(a0) + (uint64_t)clen * 8;
	h[1] = lanes_sum(a1) + (uint64_t)clen * 8;
}

UMAC_AVX2 void hg_umac_chunk_avx2(const struct hg_umac_key *u, const uint8_t *m,
				  size_t clen, uint64_t *h, const uint8_t *pf)
{
	chunk_nh(u, m, clen, h, pf);
}

static inline size_t chunk_len(size_t left)
{
	return left < HG_UMAC_CHUNK ? left : HG_UMAC_CHUNK;
}

UMAC_AVX2 void hg_umac_uhash_avx2(const struct hg_umac_key *u, const uint8_t *data,
				  size_t len, uint64_t *y, const uint8_t *next)
{
	uint64_t y0, y1, h[2], g[2];
	size_t off, c2;

	if (len <= HG_UMAC_CHUNK) { /* L2 skipped: B = 0^64 || A */
		chunk_nh(u, data, len, y, next);
		return;
	}
	/* the first two chunks from y = 1 (hg_umac_poly64x2_from1); most
	 * frames have no more */
	c2 = chunk_len(len - HG_UMAC_CHUNK);
	chunk_nh(u, data, HG_UMAC_CHUNK, h, next);
	chunk_nh(u, data + HG_UMAC_CHUNK, c2, g,
		 next ? next + HG_UMAC_CHUNK : NULL);
	y0 = hg_umac_poly64x2_from1(u->l2[0], u->l2sq[0], h[0], g[0]);
	y1 = hg_umac_poly64x2_from1(u->l2[1], u->l2sq[1], h[1], g[1]);
	for (off = HG_UMAC_CHUNK + c2; off < len;) { /* two chunks a step */
		size_t c1 = chunk_len(len - off);

		chunk_nh(u, data + off, c1, h, next ? next + off : NULL);
		off += c1;
		if (off < len) {
			c2 = chunk_len(len - off);
			chunk_nh(u, data + off, c2, g, next ? next + off : NULL);
			off += c2;
			y0 = hg_umac_poly64x2(u->l2[0], u->l2sq[0], y0, h[0], g[0]);
			y1 = hg_umac_poly64x2(u->l2[1], u->l2sq[1], y1, h[1], g[1]);
		} else {
			y0 = hg_umac_poly64(u->l2[0], y0, h[0]);
			y1 = hg_umac_poly64(u->l2[1], y1, h[1]);
		}
	}
	y[0] = hg_umac_poly_end(y0);
	y[1] = hg_umac_poly_end(y1);
}
