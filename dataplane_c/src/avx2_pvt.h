/* SPDX-License-Identifier: Apache-2.0 */
/*
 * avx2_pvt.h - helpers of the codec's AVX2 paths (codec_*_avx2.c only:
 * every function here needs AVX2 and BMI2, which the avx2 path of
 * hg_codec_isa() requires).
 *
 * AVX2 has no compress or expand of lanes: both come from one
 * permutevar8x32 whose lane indices BMI2 builds from the 8-bit lane mask
 * (pdep spreads the mask to one byte per lane, pext / pdep pick the
 * indices), with no table to keep in cache.
 */
#ifndef HOMAGG_AVX2_PVT_H
#define HOMAGG_AVX2_PVT_H

#include <stdint.h>

#include <immintrin.h>

#define AVX2_FN                                                                \
	static inline                                                          \
		__attribute__((target("avx2,bmi,bmi2,popcnt"), always_inline))

/* 0xFF in byte j iff bit j of the 8-bit mask m. */
AVX2_FN uint64_t avx2_mask_bytes(uint32_t m)
{
	return _pdep_u64(m, 0x0101010101010101ull) * 0xFF;
}

/* Byte indices (one per lane) that compress the lanes of m to the front,
 * in order; the lanes past popcount(m) take index 0. */
AVX2_FN uint64_t avx2_compress_idx(uint32_t m)
{
	return _pext_u64(0x0706050403020100ull, avx2_mask_bytes(m));
}

/* Byte indices that expand the first popcount(m) lanes into the lanes of
 * m, in order (lane j of m takes the rank of j in m); other lanes 0. */
AVX2_FN uint64_t avx2_expand_idx(uint32_t m)
{
	return _pdep_u64(0x0706050403020100ull, avx2_mask_bytes(m));
}

/* The byte indices as a permutevar8x32 control. */
AVX2_FN __m256i avx2_perm(uint64_t idx)
{
	return _mm256_cvtepu8_epi32(_mm_cvtsi64_si128((long long)idx));
}

/* All ones in the 32-bit lanes of m, zero elsewhere. */
AVX2_FN __m256i avx2_lane_mask(uint32_t m)
{
	return _mm256_cvtepi8_epi32(
		_mm_cvtsi64_si128((long long)avx2_mask_bytes(m)));
}

/* Byte-swap of each 32-bit lane (the wire's big-endian int32). */
AVX2_FN __m256i avx2_bswap32(__m256i v)
{
	const __m256i s = _mm256_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8,
					   15, 14, 13, 12, 3, 2, 1, 0, 7, 6, 5,
					   4, 11, 10, 9, 8, 15, 14, 13, 12);

	return _mm256_shuffle_epi8(v, s);
}

/* a * b modulo 2^64 in each 64-bit lane (AVX2 has no 64-bit multiply):
 * lo(a) lo(b) + ((hi(a) lo(b) + lo(a) hi(b)) << 32). */
AVX2_FN __m256i avx2_mullo64(__m256i a, uint64_t b)
{
	const __m256i bl = _mm256_set1_epi64x((long long)(b & 0xFFFFFFFFu));
	const __m256i bh = _mm256_set1_epi64x((long long)(b >> 32));
	__m256i lo = _mm256_mul_epu32(a, bl);
	__m256i c = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), bl),
				     _mm256_mul_epu32(a, bh));

	return _mm256_add_epi64(lo, _mm256_slli_epi64(c, 32));
}

/* hg_mix64 (homagg/mix.h) of each 64-bit lane. */
AVX2_FN __m256i avx2_mix64(__m256i z)
{
	z = _mm256_xor_si256(z, _mm256_srli_epi64(z, 30));
	z = avx2_mullo64(z, 0xBF58476D1CE4E5B9ull);
	z = _mm256_xor_si256(z, _mm256_srli_epi64(z, 27));
	z = avx2_mullo64(z, 0x94D049BB133111EBull);
	return _mm256_xor_si256(z, _mm256_srli_epi64(z, 31));
}

/* The low 32 bits of the four 64-bit lanes of a, in order. */
AVX2_FN __m128i avx2_lo32(__m256i a)
{
	return _mm256_castsi256_si128(
		_mm256_permutevar8x32_epi32(a, _mm256_setr_epi32(0, 2, 4, 6, 0,
								 2, 4, 6)));
}

#endif /* HOMAGG_AVX2_PVT_H */
