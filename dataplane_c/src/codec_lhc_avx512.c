/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec_lhc_avx512.c - the AVX-512 paths of the lhc method (codec_lhc.c
 * chooses them at run time, hg_codec_avx512()): the candidate list of a
 * bitmap block (VBMI2), the sketch cells of a batch of candidates and the
 * compaction of a block's non-zeros.  Each gives the same bits as its
 * portable counterpart in codec_lhc.c.
 */
#include <string.h>

#include <immintrin.h>

#include "codec_lhc_pvt.h"

/*
 * Positions of the set bits of the first nwords 64-bit words of a bitmap,
 * ascending, at out; returns their count.  Each 32-bit half compresses a
 * vector of 32 positions in a register and stores all 32 lanes (out needs
 * CAND_SLACK entries of slack, codec_lhc.c).  Same list as the scalar loop.
 */
__attribute__((target("avx512f,avx512bw,avx512vbmi2"))) uint32_t
hg_lhc_bitmap_positions_vbmi2(const uint8_t *idx, uint32_t nwords, uint16_t *out)
{
	const __m512i step = _mm512_set1_epi16(32);
	__m512i p = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21,
				     20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10,
				     9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
	uint32_t c = 0;

	for (uint32_t w = 0; w < nwords; w++) {
		uint64_t v;
		__mmask32 lo, hi;

		memcpy(&v, idx + 8 * (size_t)w, 8); /* LSB first: little endian */
		lo = (__mmask32)v;
		hi = (__mmask32)(v >> 32);
		_mm512_storeu_si512((void *)(out + c),
				    _mm512_maskz_compress_epi16(lo, p));
		c += (uint32_t)__builtin_popcount(lo);
		p = _mm512_add_epi16(p, step);
		_mm512_storeu_si512((void *)(out + c),
				    _mm512_maskz_compress_epi16(hi, p));
		c += (uint32_t)__builtin_popcount(hi);
		p = _mm512_add_epi16(p, step);
	}
	return c;
}

__attribute__((target("avx512f,avx512dq"))) static inline __m512i
mix64_avx512(__m512i z)
{
	z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 30));
	z = _mm512_mullo_epi64(z, _mm512_set1_epi64(
					  (long long)0xBF58476D1CE4E5B9ull));
	z = _mm512_xor_si512(z, _mm512_srli_epi64(z, 27));
	z = _mm512_mullo_epi64(z, _mm512_set1_epi64(
					  (long long)0x94D049BB133111EBull));
	return _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
}

/* Same bits as cells_portable, 8 elements per step (64-bit lanes); the
 * caller does the last n % 8. */
__attribute__((target("avx512f,avx512dq"))) uint32_t
hg_lhc_cells_avx512(uint64_t key, uint64_t g0, uint32_t t, const uint16_t *pos,
		    uint32_t n, const struct cell_batch *cb)
{
	const __m512i base = _mm512_set1_epi64(
		(long long)(key + HG_HASH_GOLDEN * (g0 + 1)));
	const __m512i gold = _mm512_set1_epi64((long long)HG_HASH_GOLDEN);
	const __m512i f21 = _mm512_set1_epi64(0x1FFFFF);
	const __m512i tv = _mm512_set1_epi64(t);
	const __m256i t1 = _mm256_set1_epi32((int)t);
	const __m256i t2 = _mm256_set1_epi32((int)(2 * t));
	uint32_t j = 0;

	for (; j + 8 <= n; j += 8) {
		/* key + (g0 + pos + 1) * GOLDEN = base + pos * GOLDEN */
		__m512i p = _mm512_cvtepu16_epi64(
			_mm_loadu_si128((const __m128i *)(pos + j)));
		__m512i h = mix64_avx512(
			_mm512_add_epi64(base, _mm512_mullo_epi64(p, gold)));
		__m512i f0 = _mm512_and_si512(h, f21);
		__m512i f1 = _mm512_and_si512(_mm512_srli_epi64(h, 21), f21);
		__m512i f2 = _mm512_and_si512(_mm512_srli_epi64(h, 42), f21);
		__m256i s = _mm512_cvtepi64_epi32(_mm512_srai_epi64(h, 63));

		f0 = _mm512_srli_epi64(_mm512_mul_epu32(f0, tv), 21);
		f1 = _mm512_srli_epi64(_mm512_mul_epu32(f1, tv), 21);
		f2 = _mm512_srli_epi64(_mm512_mul_epu32(f2, tv), 21);
		_mm256_storeu_si256((__m256i *)(cb->c0 + j),
				    _mm512_cvtepi64_epi32(f0));
		_mm256_storeu_si256((__m256i *)(cb->c1 + j),
				    _mm256_add_epi32(_mm512_cvtepi64_epi32(f1), t1));
		_mm256_storeu_si256((__m256i *)(cb->c2 + j),
				    _mm256_add_epi32(_mm512_cvtepi64_epi32(f2), t2));
		_mm256_storeu_si256((__m256i *)(cb->sm + j), s);
	}
	/* gcc 12 leaves the upper vector state dirty here: the SSE code run
	 * afterwards (even the output pass of hg_lhc_decode) then paid a
	 * transition penalty, 2.3x on its time (measured with
	 * homagg.bench.codec_steps at 2^25) */
	_mm256_zeroupper();
	return j;
}

/* Same as compact_portable; i1 - i0 a multiple of 16.  pos needs 16 lanes
 * of slack past the last non-zero (whole vectors are stored). */
__attribute__((target("avx512f,avx512dq"))) uint32_t
hg_lhc_compact_avx512(const float *xb, uint32_t i0, uint32_t i1, uint16_t *pos,
		      uint32_t *amax)
{
	const __m512i m = _mm512_set1_epi32(0x7FFFFFFF);
	const __m512i step = _mm512_set1_epi32(16);
	__m512i idx = _mm512_add_epi32(_mm512_set1_epi32((int)i0),
				       _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7,
							 8, 9, 10, 11, 12, 13,
							 14, 15));
	__m512i mx = _mm512_setzero_si512();
	uint32_t c = 0;

	for (uint32_t i = i0; i < i1; i += 16) {
		__m512i a = _mm512_and_si512(_mm512_loadu_si512(
						     (const void *)(xb + i)),
					     m);
		__mmask16 nz = _mm512_test_epi32_mask(a, a);

		mx = _mm512_max_epu32(mx, a);
		/* compress in a register (a compressing store to memory is
		 * slow on some CPUs), store all 16 lanes, advance by the
		 * count */
		_mm256_storeu_si256((__m256i *)(pos + c),
				    _mm512_cvtepi32_epi16(
					    _mm512_maskz_compress_epi32(nz, idx)));
		c += (uint32_t)__builtin_popcount(nz);
		idx = _mm512_add_epi32(idx, step);
	}
	{
		uint32_t r = _mm512_reduce_max_epu32(mx);

		*amax = r > *amax ? r : *amax;
	}
	return c;
}
