/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec_union_avx2.c - the AVX2 paths of the union values phase and of the
 * bitmap-block decode (codec_union.c chooses them at run time,
 * hg_codec_isa() avx2); the same bits as the portable code and the
 * AVX-512 paths of codec_union_avx512.c, which they follow with 8 lanes
 * (the expand of lanes built by avx2_pvt.h).
 */
#include <string.h>

#include "avx2_pvt.h"
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

/* Lanes at..at+7 of out (nc lanes in all): a whole vector while it fits
 * (lanes past a word's candidates are rewritten by the next word's
 * stores), else masked. */
AVX2_FN void store_lanes(uint8_t *out, uint32_t at, uint32_t nc, __m256i q)
{
	uint8_t *o = out + 4 * (size_t)at;

	if (at + 8 <= nc)
		_mm256_storeu_si256((__m256i *)o, q);
	else
		_mm256_maskstore_epi32((int *)o,
				       avx2_lane_mask((1u << (nc - at)) - 1), q);
}

/* avx2_quant8, through float32 where hg_quant_f32_ok (f32). */
AVX2_FN __m256i quant8(__m256 x, __m256d sc, __m256 scf, int f32)
{
	return f32 ? avx2_quant8f(x, scf) : avx2_quant8(x, sc);
}

/*
 * A bitmap block, deterministic rounding, by 64-element words as
 * hg_union_bitmap_avx512 does it, 8 candidate lanes at a time: with G the
 * global word and L this worker's (L a subset of G), the k = |G|
 * candidates of the word take, in order, this worker's next |L| values at
 * the ranks pext(L, G) marks.  nc is the block's candidate count (out has
 * 4 nc bytes): whole vectors are stored while they fit, the last ones
 * masked.  v needs 8 readable floats past its last non-zero (the scan's
 * slack).  Returns the non-zeros consumed, or UINT32_MAX if L is not a
 * subset of G.
 */
__attribute__((target("avx2,bmi,bmi2,popcnt"))) uint32_t
hg_union_bitmap_avx2(const uint8_t *gbm, const uint8_t *lbm, uint32_t len,
		     const float *v, double scale, uint32_t nc, uint8_t *out)
{
	const __m256d sc = _mm256_set1_pd(scale);
	const __m256 scf = _mm256_set1_ps((float)scale);
	const int f32 = hg_quant_f32_ok(scale);
	const uint32_t words = (len + 63) / 64;
	uint32_t i = 0, j = 0;

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
			/* every candidate of the word is this worker's (all
			 * workers' positions alike): its next k values in
			 * order, no expansion */
			for (uint32_t u = 0; u < k; u += 8)
				store_lanes(out, j + u, nc,
					    avx2_bswap32(quant8(_mm256_loadu_ps(
									v + i + u),
								sc, scf, f32)));
			i += k;
			j += k;
			continue;
		}
		m = _pext_u64(lw, g);
		for (uint32_t u = 0; u < k; u += 8) {
			uint32_t em = (uint32_t)(m >> u) & 0xFFu;
			__m256i q = quant8(_mm256_loadu_ps(v + i), sc, scf, f32);

			q = _mm256_and_si256(_mm256_permutevar8x32_epi32(
						     q, avx2_perm(avx2_expand_idx(
								em))),
					     avx2_lane_mask(em));
			store_lanes(out, j + u, nc, avx2_bswap32(q));
			i += (uint32_t)__builtin_popcount(em);
		}
		j += k;
	}
	_mm256_zeroupper();
	return i;
}

/*
 * A bitmap block's output, 8 elements at a time, as hg_scatter_bitmap
 * (codec_union_avx512.c) does it: the next |m| int32 sums of in (nin in
 * all; big-endian lanes when be, else host order) scaled and rounded
 * once to float32 and expanded into their positions,
 * zeros elsewhere; every output element written once.  No branch on the
 * bits: a branch that stored zeros for 32 elements with no bit was
 * mispredicted at low densities (the scatter of NCF's bucket shape,
 * 3.85 M at 0.68 %, 1.09 -> 0.74 ms without it; 2^24 at 5 %, 3.9 -> 3.4
 * ms; AMD EPYC).  The tail (a short last block) goes element by element.
 */
__attribute__((target("avx2,bmi,bmi2,popcnt"))) void
hg_scatter_bitmap_avx2(const uint8_t *gbm, uint32_t len, const uint8_t *in,
		       uint32_t nin, bool be, double scale, float *y)
{
	const __m256d sc = _mm256_set1_pd(scale);
	const __m256 scf = _mm256_set1_ps((float)scale);
	/* float32 where that gives the float64 product's rounding, with half
	 * the conversions (union decode at 2^24, 5 %: 6.2 -> 5.3-5.5 ms on an
	 * AMD EPYC, docs/BENCHMARKS.md) */
	const bool f32 = hg_scale_f32_ok(scale);
	uint32_t i = 0, used = 0;

	for (; i + 32 <= len; i += 32) {
		uint32_t m32;

		memcpy(&m32, gbm + i / 8, 4); /* LSB first: little endian */
#pragma GCC unroll 4
		for (uint32_t q = 0; q < 4; q++) {
			uint32_t m = (m32 >> (8 * q)) & 0xFFu;
			uint32_t c = (uint32_t)__builtin_popcount(m);
			__m256i v;
			__m128 lo, hi;

			if (used + 8 <= nin)
				v = _mm256_loadu_si256((const __m256i *)in);
			else /* nothing past the sums is read */
				v = _mm256_maskload_epi32(
					(const int *)in,
					avx2_lane_mask((1u << (nin - used)) - 1));
			if (be)
				v = avx2_bswap32(v);
			if (f32) {
				_mm256_storeu_ps(
					y + i + 8 * q,
					_mm256_and_ps(_mm256_permutevar8x32_ps(
							      _mm256_mul_ps(_mm256_cvtepi32_ps(
										    v),
									    scf),
							      avx2_perm(avx2_expand_idx(
								      m))),
						      _mm256_castsi256_ps(
							      avx2_lane_mask(m))));
				in += 4 * c;
				used += c;
				continue;
			}
			lo = _mm256_cvtpd_ps(
				_mm256_mul_pd(_mm256_cvtepi32_pd(
						      _mm256_castsi256_si128(v)),
					      sc));
			hi = _mm256_cvtpd_ps(
				_mm256_mul_pd(_mm256_cvtepi32_pd(
						      _mm256_extracti128_si256(v, 1)),
					      sc));
			_mm256_storeu_ps(
				y + i + 8 * q,
				_mm256_and_ps(_mm256_permutevar8x32_ps(
						      _mm256_set_m128(hi, lo),
						      avx2_perm(avx2_expand_idx(m))),
					      _mm256_castsi256_ps(
						      avx2_lane_mask(m))));
			in += 4 * c;
			used += c;
		}
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
