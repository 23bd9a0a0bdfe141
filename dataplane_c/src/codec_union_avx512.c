/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec_union_avx512.c - the AVX-512 paths of the union values phase and of
 * the bitmap-block decode (codec_union.c chooses them at run time,
 * hg_codec_isa() avx512); same bits as the portable code.
 */
#include <string.h>

#include <immintrin.h>

#include "codec_lhc_pvt.h"

/* Word w of a block's bitmap of len bits (bits past len cleared); the
 * buffer has at least 8 readable bytes past the block's last byte. */
static inline uint64_t bm_word(const uint8_t *bm, uint32_t len, uint32_t w)
{
	uint64_t v;

	memcpy(&v, bm + 8 * (size_t)w, 8); /* LSB first: little endian */
	if (64 * w + 64 > len)
		v &= (1ull << (len - 64 * w)) - 1;
	return v;
}

static const uint8_t bswap32_idx[64] = {
	3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12,
	3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12,
	3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12,
	3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12,
};

/* Quantised int32 of 16 floats (times the scale, rounded to nearest even
 * like hg_rne: in float64, or in float32 where f32 says that gives the
 * same int32), byte-swapped to the wire's order. */
__attribute__((target("avx512f,avx512dq,avx512bw"))) static inline __m512i
quant16_be(__m512 x, __m512d sc, __m512 scf, int f32, __m512i bswap)
{
	__m256i lo, hi;

	/* float32 where the scale allows it (codec_pvt.h hg_quant_f32_ok) */
	if (f32)
		return _mm512_shuffle_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x, scf)),
					   bswap);
	lo = _mm512_cvtpd_epi32(
		_mm512_mul_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(x)), sc));
	hi = _mm512_cvtpd_epi32(
		_mm512_mul_pd(_mm512_cvtps_pd(_mm256_castpd_ps(
				      _mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))),
			      sc));
	return _mm512_shuffle_epi8(_mm512_inserti64x4(_mm512_castsi256_si512(lo),
						      hi, 1),
				   bswap);
}

/*
 * A bitmap block, deterministic rounding, by 64-element words: with G the
 * global word and L this worker's (L must be a subset of G), the k = |G|
 * candidates of the word take, in order, this worker's next |L| values at
 * the ranks pext(L, G) marks; 16 lanes at a time are quantised
 * (quant16_be), byte-swapped, expanded into their candidate lanes (zeros
 * elsewhere; a word of L = G needs no expansion) and stored into the
 * block's nc lanes.  v needs 16 readable floats past its last non-zero
 * (the scan's slack).  Returns the non-zeros consumed, or UINT32_MAX if L
 * is not a subset of G.
 */
__attribute__((target("avx512f,avx512dq,avx512bw,bmi2,popcnt"))) uint32_t
hg_union_bitmap_avx512(const uint8_t *gbm, const uint8_t *lbm, uint32_t len,
		       const float *v, double scale, uint32_t nc, uint8_t *out)
{
	const __m512d sc = _mm512_set1_pd(scale);
	const __m512 scf = _mm512_set1_ps((float)scale);
	const int f32 = hg_quant_f32_ok(scale);
	const __m512i bswap = _mm512_loadu_si512((const void *)bswap32_idx);
	const uint32_t words = (len + 63) / 64;
	uint32_t i = 0;
	size_t j = 0;

	for (uint32_t w = 0; w < words; w++) {
		uint64_t g = bm_word(gbm, len, w);
		uint64_t lw = bm_word(lbm, len, w);
		uint64_t m;
		uint32_t k;

		if (lw & ~g)
			return UINT32_MAX;
		if (!g)
			continue;
		k = (uint32_t)__builtin_popcountll(g);
		if (lw == g) {
			/* every candidate of the word is this worker's: its
			 * next k values in order, whole stores while they fit
			 * the block's nc lanes (lanes past k are rewritten by
			 * the next word's), no expansion */
			for (uint32_t u = 0; u < k; u += 16) {
				__m512i q = quant16_be(_mm512_loadu_ps(v + i + u),
						       sc, scf, f32, bswap);

				if (j + u + 16 <= nc)
					_mm512_storeu_si512(out + 4 * (j + u), q);
				else
					_mm512_mask_storeu_epi32(
						out + 4 * (j + u),
						(__mmask16)((1u << (nc - j - u)) - 1),
						q);
			}
			i += k;
			j += k;
			continue;
		}
		m = _pext_u64(lw, g);
		for (uint32_t u = 0; u < k; u += 16) {
			__mmask16 em = (__mmask16)(m >> u);
			uint32_t take = k - u < 16 ? k - u : 16;
			__m512i q = quant16_be(_mm512_loadu_ps(v + i), sc, scf,
					       f32, bswap);

			/* expanding the byte-swapped lanes: the same bytes */
			q = _mm512_maskz_expand_epi32(em, q);
			_mm512_mask_storeu_epi32(out + 4 * (j + u),
						 (__mmask16)((1u << take) - 1), q);
			i += (uint32_t)__builtin_popcount(em);
		}
		j += k;
	}
	_mm256_zeroupper();
	return i;
}

/*
 * A bitmap block's output, 16 elements at a time: the next |m| int32 sums
 * (m = the 16 index bits; big-endian lanes when be, else host order) are
 * loaded (masked: nothing past the buffer is touched), scaled and rounded
 * once to float32 (as the scalar code: in float64, or where that gives the
 * same bits in float32) and expanded into their positions, zeros
 * elsewhere: every output element is written once.
 * The tail (a short last block) goes element by element.  Used by union
 * and lhc decode (codec_lhc_pvt.h).
 */
__attribute__((target("avx512f,avx512dq,avx512bw,popcnt"))) void
hg_scatter_bitmap(const uint8_t *gbm, uint32_t len, const uint8_t *in, bool be,
		  double scale, float *y)
{
	const __m512d sc = _mm512_set1_pd(scale);
	const __m512 scf = _mm512_set1_ps((float)scale);
	const __m512i bswap = _mm512_loadu_si512((const void *)bswap32_idx);
	const bool f32 = hg_scale_f32_ok(scale);
	uint32_t i = 0;

	for (; i + 16 <= len; i += 16) {
		uint16_t m;
		uint32_t c;
		__m512i v;
		__m256 lo, hi;

		memcpy(&m, gbm + i / 8, 2); /* LSB first: little endian */
		c = (uint32_t)__builtin_popcount(m);
		v = _mm512_maskz_loadu_epi32((__mmask16)((1u << c) - 1), in);
		if (be)
			v = _mm512_shuffle_epi8(v, bswap);
		if (f32) {
			_mm512_storeu_ps(y + i,
					 _mm512_maskz_expand_ps(
						 m, _mm512_mul_ps(_mm512_cvtepi32_ps(v),
								  scf)));
			in += 4 * c;
			continue;
		}
		lo = _mm512_cvtpd_ps(
			_mm512_mul_pd(_mm512_cvtepi32_pd(_mm512_castsi512_si256(v)),
				      sc));
		hi = _mm512_cvtpd_ps(
			_mm512_mul_pd(_mm512_cvtepi32_pd(
					      _mm512_extracti64x4_epi64(v, 1)),
				      sc));
		_mm512_storeu_ps(y + i,
				 _mm512_maskz_expand_ps(
					 m, _mm512_insertf32x8(_mm512_castps256_ps512(
								       lo),
							       hi, 1)));
		in += 4 * c;
	}
	_mm256_zeroupper();
	for (; i < len; i++) {
		float f = 0.0f;

		if (gbm[i >> 3] & (1u << (i & 7))) {
			uint32_t v;

			memcpy(&v, in, 4);
			v = be ? __builtin_bswap32(v) : v;
			f = (float)((double)(int32_t)v * scale);
			in += 4;
		}
		y[i] = f;
	}
}
