/* SPDX-License-Identifier: Apache-2.0 */
/*
 * avx2_pvt.h - helpers of the codec's AVX2 paths (codec_*_avx2.c only:
 * every function here needs AVX2 and BMI2, which the avx2 path of
 * hg_codec_isa() requires).
 *
 * AVX2 has no compress or expand of lanes: both come from one
 * permutevar8x32 whose lane indices a 2 KB table (avx2_tables.c) gives for
 * each 8-bit lane mask.  The table, not BMI2's pext / pdep of the mask
 * spread to bytes: a load instead of three dependent instructions
 * (docs/BENCHMARKS.md "The AVX2 hot loops again"), and pext / pdep are
 * microcoded on AMD CPUs before Zen 3.
 */
#ifndef HOMAGG_AVX2_PVT_H
#define HOMAGG_AVX2_PVT_H

#include <stdint.h>

#include <immintrin.h>

#define AVX2_FN                                                                \
	static inline                                                          \
		__attribute__((target("avx2,bmi,bmi2,popcnt"), always_inline))

extern const uint64_t hg_avx2_compress_tab[256];
extern const uint64_t hg_avx2_expand_tab[256];

/* Byte indices (one per lane, in the low 8 bytes) that compress the
 * lanes of m to the front, in order; the lanes past popcount(m) take
 * index 0.  Loaded into the vector directly (no move from a general
 * register). */
AVX2_FN __m128i avx2_compress_idx(uint32_t m)
{
	return _mm_loadl_epi64((const __m128i *)&hg_avx2_compress_tab[m & 0xFFu]);
}

/* Byte indices that expand the first popcount(m) lanes into the lanes of
 * m, in order (lane j of m takes the rank of j in m); other lanes 0. */
AVX2_FN __m128i avx2_expand_idx(uint32_t m)
{
	return _mm_loadl_epi64((const __m128i *)&hg_avx2_expand_tab[m & 0xFFu]);
}

/* The byte indices as a permutevar8x32 control. */
AVX2_FN __m256i avx2_perm(__m128i idx)
{
	return _mm256_cvtepu8_epi32(idx);
}

/* All ones in the 32-bit lanes of m, zero elsewhere. */
AVX2_FN __m256i avx2_lane_mask(uint32_t m)
{
	const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);

	return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)m), bit),
				  bit);
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

/* Quantised int32 of 8 floats: float64, times scale, rounded to nearest
 * even (the default MXCSR mode): hg_rne(x * scale) lane by lane while the
 * product fits an int32 (the callers' range check). */
AVX2_FN __m256i avx2_quant8(__m256 x, __m256d sc)
{
	__m128i lo = _mm256_cvtpd_epi32(
		_mm256_mul_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(x)), sc));
	__m128i hi = _mm256_cvtpd_epi32(
		_mm256_mul_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)), sc));

	return _mm256_set_m128i(hi, lo);
}

/* avx2_quant8 where hg_quant_f32_ok(scale): scf is the scale as a float. */
AVX2_FN __m256i avx2_quant8f(__m256 x, __m256 scf)
{
	return _mm256_cvtps_epi32(_mm256_mul_ps(x, scf));
}

/* The low 32 bits of the four 64-bit lanes of a, in order. */
AVX2_FN __m128i avx2_lo32(__m256i a)
{
	return _mm256_castsi256_si128(
		_mm256_permutevar8x32_epi32(a, _mm256_setr_epi32(0, 2, 4, 6, 0,
								 2, 4, 6)));
}

#endif /* HOMAGG_AVX2_PVT_H */
