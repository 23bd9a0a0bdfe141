/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec_scan_avx2.c - the AVX2 path of the one-pass scan (codec_scan.c
 * chooses it at run time, hg_codec_isa() avx2); same bits as the portable
 * code and the AVX-512 path.
 */
#include <string.h>

#include "avx2_pvt.h"
#include "codec_pvt.h"

/* Bytes ahead of the load that the scan prefetches (see hg_scan_avx2). */
#define SCAN_PREFETCH_AHEAD 2048

/* One vector v of 8 elements at block position i (i in every 16-bit lane
 * of *at, which advances by 8): its non-zero mask (returned: the bitmap
 * byte), positions and values compressed in registers by the mask, all 8
 * lanes stored at pos / val, absolute-value bits max-ed into *mx. */
AVX2_FN uint32_t scan8(__m256 v, __m128i *at, uint16_t *pos, float *val, __m256i *mx)
{
	const __m256i m = _mm256_set1_epi32(0x7FFFFFFF);
	__m256i a = _mm256_and_si256(_mm256_castps_si256(v), m);
	uint32_t nz = ~(uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(
			      _mm256_cmpeq_epi32(a, _mm256_setzero_si256()))) &
		      0xFFu;
	__m128i i8 = avx2_compress_idx(nz);

	*mx = _mm256_max_epu32(*mx, a);
	_mm256_storeu_ps(val,
			 _mm256_permutevar8x32_ps(v, _mm256_cvtepu8_epi32(i8)));
	_mm_storeu_si128((__m128i *)pos, _mm_add_epi16(_mm_cvtepu8_epi16(i8), *at));
	*at = _mm_add_epi16(*at, _mm_set1_epi16(8));
	return nz;
}

/*
 * The whole 8-element vectors of a block, as codec_scan.c's scan_tail does
 * them: each vector's non-zero mask is its bitmap byte; positions (16-bit)
 * and values are compressed in registers by that mask and all 8 lanes
 * stored, the output advancing by the count (pos / val need 8 entries of
 * slack).  Four vectors, two cache lines, a step (one 32-bit bitmap store).
 *
 * The loop is memory bound, and its compress code is long enough that the
 * out-of-order window holds only a few loads of the tensor at once (with
 * no prefetch, perf put more than half of its samples on the load's
 * first use): every step prefetches its two lines SCAN_PREFETCH_AHEAD
 * bytes ahead (past the block's end too: the next block's first lines; a
 * prefetch does not fault).  2^24 elements at 5 %, W = 4, best CPU time
 * of 5-7 runs on the shared Xeon under load: 13.0 ms without the
 * prefetch, 12.1 with it 1024 bytes ahead non-temporal, 6.2-8.9 with it
 * 2048 bytes ahead into all levels (the AVX-512 path 7.3-8.5 in the same
 * runs).  Four vectors a step with the lane indices from a table
 * (avx2_pvt.h), against two with them from pext / pdep: the scan of
 * `homagg bench codec` 3.95-3.98 -> 3.15-3.17 ms on an idle AMD EPYC (the
 * AVX-512 path 2.6 ms).
 */
__attribute__((target("avx2,bmi,bmi2,popcnt"))) uint32_t
hg_scan_avx2(const float *xb, uint32_t len8, uint16_t *pos, float *val,
	     uint8_t *bm, uint32_t *amax)
{
	__m256i mx = _mm256_setzero_si256();
	__m128i at = _mm_setzero_si128();
	uint32_t c = 0, lanes[8], r = *amax, i = 0;

	for (; i + 32 <= len8; i += 32) {
		const char *ahead = (const char *)(xb + i) + SCAN_PREFETCH_AHEAD;
		uint32_t n0, n1, n2, n3, bits;

		__builtin_prefetch(ahead, 0, 3);
		__builtin_prefetch(ahead + 64, 0, 3);
		/* written out: gcc 12 -O2 kept a loop over the four */
		n0 = scan8(_mm256_loadu_ps(xb + i), &at, pos + c, val + c, &mx);
		c += (uint32_t)__builtin_popcount(n0);
		n1 = scan8(_mm256_loadu_ps(xb + i + 8), &at, pos + c, val + c, &mx);
		c += (uint32_t)__builtin_popcount(n1);
		n2 = scan8(_mm256_loadu_ps(xb + i + 16), &at, pos + c, val + c,
			   &mx);
		c += (uint32_t)__builtin_popcount(n2);
		n3 = scan8(_mm256_loadu_ps(xb + i + 24), &at, pos + c, val + c,
			   &mx);
		c += (uint32_t)__builtin_popcount(n3);
		bits = n0 | n1 << 8 | n2 << 16 | n3 << 24;
		memcpy(bm + i / 8, &bits, 4); /* LSB first: little endian */
	}
	for (; i < len8; i += 8) {
		uint32_t n = scan8(_mm256_loadu_ps(xb + i), &at, pos + c,
				   val + c, &mx);

		c += (uint32_t)__builtin_popcount(n);
		bm[i / 8] = (uint8_t)n;
	}
	_mm256_storeu_si256((__m256i *)lanes, mx);
	for (int k = 0; k < 8; k++)
		r = lanes[k] > r ? lanes[k] : r;
	*amax = r;
	_mm256_zeroupper();
	return c;
}
