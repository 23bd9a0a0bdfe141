/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec_lhc_avx2.c - the AVX2 paths of the lhc method (codec_lhc.c chooses
 * them at run time, hg_codec_isa()): the bitmap index encoder, the sketch
 * cells of a batch of candidates (the sketch encode and the peel),
 * set_index's candidate list of a bitmap block and Bloom filter probing,
 * and the peel's passes over a block's cells (also the AVX-512 path's).
 * Each gives the same bits as its portable counterpart in codec_lhc.c.
 */
#include <string.h>

#include "avx2_pvt.h"
#include "codec_lhc_pvt.h"

__attribute__((target("avx2"))) size_t hg_lhc_bitmap_avx2(const float *x,
							  size_t len, uint8_t *out)
{
	const __m256i m = _mm256_set1_epi32(0x7FFFFFFF);
	const __m256i z = _mm256_setzero_si256();
	size_t i = 0;

	for (; i + 32 <= len; i += 32) {
		uint32_t w = 0;

		for (int k = 0; k < 4; k++) {
			__m256i a = _mm256_and_si256(
				_mm256_loadu_si256((const __m256i *)(x + i + 8 * k)),
				m);
			uint32_t zm = (uint32_t)_mm256_movemask_ps(
				_mm256_castsi256_ps(_mm256_cmpeq_epi32(a, z)));

			w |= (~zm & 0xFFu) << (8 * k);
		}
		memcpy(out + i / 8, &w, 4); /* bytes LSB first: little endian */
	}
	return i;
}

/*
 * Positions of the set bits of the first nwords 64-bit words of a bitmap,
 * ascending, at out; returns their count.  Each byte of the bitmap is an
 * 8-lane mask: its compressed lane indices plus the byte's first position
 * are the byte's positions, all 8 stored (out needs 8 entries of slack),
 * the output advancing by the count.  No branch on the bits.  Same list
 * as the scalar loop of codec_lhc.c and the AVX-512 VBMI2 one.
 */
__attribute__((target("avx2,bmi,bmi2,popcnt"))) uint32_t
hg_lhc_bitmap_positions_avx2(const uint8_t *idx, uint32_t nwords, uint16_t *out)
{
	const __m128i step = _mm_set1_epi16(8);
	__m128i base = _mm_setzero_si128();
	uint32_t c = 0;

	for (uint32_t w = 0; w < nwords; w++) {
		uint64_t v;

		memcpy(&v, idx + 8 * (size_t)w, 8); /* LSB first: little endian */
#pragma GCC unroll 8
		for (int k = 0; k < 8; k++) {
			uint32_t m = (uint32_t)(v >> (8 * k)) & 0xFFu;
			__m128i i8 = avx2_compress_idx(m);

			_mm_storeu_si128((__m128i *)(out + c),
					 _mm_add_epi16(_mm_cvtepu8_epi16(i8), base));
			c += (uint32_t)__builtin_popcount(m);
			base = _mm_add_epi16(base, step);
		}
	}
	return c;
}

/* Same bits as cells_portable, 4 elements per step (64-bit lanes, the
 * 64-bit multiplies emulated); the caller does the last n % 4. */
__attribute__((target("avx2,bmi,bmi2,popcnt"))) uint32_t
hg_lhc_cells_avx2(uint64_t key, uint64_t g0, uint32_t t, const uint16_t *pos,
		  uint32_t n, const struct cell_batch *cb)
{
	const __m256i base = _mm256_set1_epi64x(
		(long long)(key + HG_HASH_GOLDEN * (g0 + 1)));
	const __m256i f21 = _mm256_set1_epi64x(0x1FFFFF);
	const __m256i tv = _mm256_set1_epi64x(t);
	const __m128i t1 = _mm_set1_epi32((int)t);
	const __m128i t2 = _mm_set1_epi32((int)(2 * t));
	const __m256i z = _mm256_setzero_si256();
	const __m256i gl = _mm256_set1_epi64x(
		(long long)(HG_HASH_GOLDEN & 0xFFFFFFFFu));
	const __m256i gh = _mm256_set1_epi64x((long long)(HG_HASH_GOLDEN >> 32));
	uint32_t j = 0;

	for (; j + 4 <= n; j += 4) {
		uint64_t p4;
		__m256i p, h, f0, f1, f2;

		memcpy(&p4, pos + j, 8);
		/* key + (g0 + pos + 1) * GOLDEN = base + pos * GOLDEN */
		p = _mm256_cvtepu16_epi64(_mm_cvtsi64_si128((long long)p4));
		/* pos < 2^16: pos * GOLDEN in two 32-bit multiplies, not
		 * avx2_mullo64's three (the peel's AVX2 hashing 6-7% fewer
		 * TSC cycles at 2^24, 5%: docs/BENCHMARKS.md) */
		h = avx2_mix64(_mm256_add_epi64(
			base,
			_mm256_add_epi64(_mm256_mul_epu32(p, gl),
					 _mm256_slli_epi64(_mm256_mul_epu32(p, gh),
							   32))));
		f0 = _mm256_and_si256(h, f21);
		f1 = _mm256_and_si256(_mm256_srli_epi64(h, 21), f21);
		f2 = _mm256_and_si256(_mm256_srli_epi64(h, 42), f21);
		f0 = _mm256_srli_epi64(_mm256_mul_epu32(f0, tv), 21);
		f1 = _mm256_srli_epi64(_mm256_mul_epu32(f1, tv), 21);
		f2 = _mm256_srli_epi64(_mm256_mul_epu32(f2, tv), 21);
		_mm_storeu_si128((__m128i *)(cb->c0 + j), avx2_lo32(f0));
		_mm_storeu_si128((__m128i *)(cb->c1 + j),
				 _mm_add_epi32(avx2_lo32(f1), t1));
		_mm_storeu_si128((__m128i *)(cb->c2 + j),
				 _mm_add_epi32(avx2_lo32(f2), t2));
		/* sign: all ones iff bit 63 of h */
		_mm_storeu_si128((__m128i *)(cb->sm + j),
				 avx2_lo32(_mm256_cmpgt_epi64(z, h)));
	}
	_mm256_zeroupper();
	return j;
}

/* Same values as the deterministic loop of codec_lhc.c's signed_vals,
 * 8 elements per step; the caller does the last n % 8. */
__attribute__((target("avx2,bmi,bmi2,popcnt"))) uint32_t
hg_lhc_signed_avx2(const float *v, const uint32_t *sm, uint32_t n, double scale,
		   uint32_t *sv)
{
	const __m256d sc = _mm256_set1_pd(scale);
	const __m256 scf = _mm256_set1_ps((float)scale);
	const int f32 = hg_quant_f32_ok(scale);
	uint32_t j = 0;

	for (; j + 8 <= n; j += 8) {
		__m256 x = _mm256_loadu_ps(v + j);
		__m256i q = f32 ? avx2_quant8f(x, scf) : avx2_quant8(x, sc);
		__m256i s = _mm256_loadu_si256((const __m256i *)(sm + j));

		_mm256_storeu_si256((__m256i *)(sv + j),
				    _mm256_sub_epi32(_mm256_xor_si256(q, s), s));
	}
	_mm256_zeroupper();
	return j;
}

/* Host-order 32-bit cells to big-endian in place, 8 per step; returns
 * how many it did (the caller does the rest). */
__attribute__((target("avx2,bmi,bmi2,popcnt"))) size_t
hg_lhc_cells_be_avx2(uint8_t *cells, size_t nc)
{
	size_t k = 0;

	for (; k + 8 <= nc; k += 8) {
		__m256i *c = (__m256i *)(cells + 4 * k);

		_mm256_storeu_si256(c, avx2_bswap32(_mm256_loadu_si256(c)));
	}
	_mm256_zeroupper();
	return k;
}

/*
 * The three 21-bit fields of 8 elements' hash words (a: elements 0-3, b:
 * 4-7), in 32-bit lanes in element order, at f[0..2].
 */
__attribute__((target("avx2"))) static inline void
bloom_fields8(__m256i a, __m256i b, __m256i *f)
{
	const __m256i f21 = _mm256_set1_epi32(0x1FFFFF);
	/* low and high halves: a0 a1 b0 b1 | a2 a3 b2 b3, then in order */
	__m256i lo = _mm256_castps_si256(
		_mm256_shuffle_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b),
				  _MM_SHUFFLE(2, 0, 2, 0)));
	__m256i hi = _mm256_castps_si256(
		_mm256_shuffle_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b),
				  _MM_SHUFFLE(3, 1, 3, 1)));

	lo = _mm256_permute4x64_epi64(lo, _MM_SHUFFLE(3, 1, 2, 0));
	hi = _mm256_permute4x64_epi64(hi, _MM_SHUFFLE(3, 1, 2, 0));
	f[0] = _mm256_and_si256(lo, f21);
	f[1] = _mm256_and_si256(_mm256_or_si256(_mm256_srli_epi32(lo, 21),
						_mm256_slli_epi32(hi, 11)),
				f21);
	f[2] = _mm256_and_si256(_mm256_srli_epi32(hi, 10), f21);
}

/* Filters of at most BLOOM_REG_BITS8 bits are probed from registers: each
 * 256 bits (8 words) one vector, looked up with vpermd.  Larger ones with a
 * 32-bit gather. */
#define BLOOM_SEG_BITS8 256u
#define BLOOM_REG_SEGS8 6
#define BLOOM_REG_BITS8 (BLOOM_REG_SEGS8 * BLOOM_SEG_BITS8)

/* The lanes of b where the sign bit of sel is set, of a elsewhere. */
__attribute__((target("avx2"))) static inline __m256i
bloom_blend8(__m256i a, __m256i b, __m256i sel)
{
	return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(a),
						    _mm256_castsi256_ps(b),
						    _mm256_castsi256_ps(sel)));
}

/*
 * The filter bits at the probes of the fields f of 8 elements, in bit 0
 * of each lane: probe (f * bits) >> 21 as bloom_probes computes it
 * (codec_lhc.c), = (f * (bits / 64)) >> 15 exactly as bits is a multiple
 * of 64 (32 bits suffice below 2^17 bits; bv = bits / 64), then word
 * p / 32 of the filter's little-endian words (it holds bit p at p % 32, as
 * byte p / 8 holds it at p % 8).  With nseg > 0 the words are the
 * registers t (nseg segments of 8 words): vpermd picks word p / 32 % 8 of
 * every segment and a tree of blends on bits 3, 4 and 5 of p / 32 the
 * segment.  With nseg == 0 they are gathered from words.
 */
__attribute__((target("avx2"), always_inline)) static inline __m256i
bloom_bit8(const __m256i *t, int nseg, const int *words, __m256i f, __m256i bv)
{
	__m256i p = _mm256_srli_epi32(_mm256_mullo_epi32(f, bv), 15);
	__m256i wi = _mm256_srli_epi32(p, 5), v;

	if (nseg == 0) {
		v = _mm256_i32gather_epi32(words, wi, 4);
	} else {
		/* bit 3 + j of the word index in the sign bit */
		__m256i s0 = _mm256_slli_epi32(wi, 28);
		__m256i s1 = _mm256_slli_epi32(wi, 27);
		__m256i s2 = _mm256_slli_epi32(wi, 26);
		__m256i v0 = _mm256_permutevar8x32_epi32(t[0], wi), v1 = v0,
			v2 = v0;

		if (nseg > 1)
			v0 = bloom_blend8(v0,
					  _mm256_permutevar8x32_epi32(t[1], wi),
					  s0);
		if (nseg > 2)
			v1 = _mm256_permutevar8x32_epi32(t[2], wi);
		if (nseg > 3)
			v1 = bloom_blend8(v1,
					  _mm256_permutevar8x32_epi32(t[3], wi),
					  s0);
		if (nseg > 4)
			v2 = _mm256_permutevar8x32_epi32(t[4], wi);
		if (nseg > 5)
			v2 = bloom_blend8(v2,
					  _mm256_permutevar8x32_epi32(t[5], wi),
					  s0);
		v = nseg > 2 ? bloom_blend8(v0, v1, s1) : v0;
		if (nseg > 4)
			v = bloom_blend8(v, v2, s2);
	}
	return _mm256_srlv_epi32(v, _mm256_and_si256(p, _mm256_set1_epi32(31)));
}

/* The 8-bit element mask of lanes whose bit 0 is set. */
__attribute__((target("avx2"))) static inline uint32_t bloom_mask8(__m256i hit)
{
	return (uint32_t)_mm256_movemask_ps(
		_mm256_castsi256_ps(_mm256_slli_epi32(hit, 31)));
}

/* Elements per stage-1 chunk of the Bloom probing (its survivors' list
 * lives on the stack). */
#define BLOOM_CHUNK 1024

/* The positions i + x of the lanes x of the 8-bit mask m, stored in order
 * at out (8 entries written); returns their count. */
__attribute__((target("avx2,bmi,bmi2,popcnt"), always_inline)) static inline uint32_t
bloom_store8(uint32_t m, uint32_t i, uint16_t *out)
{
	_mm_storeu_si128((__m128i *)out,
			 _mm_add_epi16(_mm_cvtepu8_epi16(avx2_compress_idx(m)),
				       _mm_set1_epi16((short)i)));
	return (uint32_t)__builtin_popcount(m);
}

/* The first hash words of the 8 elements at the 16-bit positions p8 of
 * a block whose hash input of element 0 is base (key + (g0 + 1) * GOLDEN):
 * elements 0-3 at *wa, 4-7 at *wb. */
__attribute__((target("avx2,bmi,bmi2,popcnt"), always_inline)) static inline void
bloom_words8(uint64_t base, __m128i p8, __m256i *wa, __m256i *wb)
{
	const __m256i b = _mm256_set1_epi64x((long long)base);

	/* key + (g0 + pos + 1) * GOLDEN = base + pos * GOLDEN */
	*wa = avx2_mix64(_mm256_add_epi64(b, avx2_mullo64(_mm256_cvtepu16_epi64(p8),
							  HG_HASH_GOLDEN)));
	*wb = avx2_mix64(
		_mm256_add_epi64(b, avx2_mullo64(_mm256_cvtepu16_epi64(
							 _mm_srli_si128(p8, 8)),
						 HG_HASH_GOLDEN)));
}

/* The 16-bit positions p8 of the lanes of the 8-bit mask m, stored in
 * order at out (8 entries written); returns their count. */
__attribute__((target("avx2,bmi,bmi2,popcnt"), always_inline)) static inline uint32_t
bloom_store_pos8(__m128i p8, uint32_t m, uint16_t *out)
{
	/* lane index x -> bytes 2x, 2x + 1: 514 x + 256 */
	_mm_storeu_si128(
		(__m128i *)out,
		_mm_shuffle_epi8(p8,
				 _mm_add_epi16(_mm_mullo_epi16(_mm_cvtepu8_epi16(avx2_compress_idx(
								       m)),
							       _mm_set1_epi16(514)),
					       _mm_set1_epi16(256))));
	return (uint32_t)__builtin_popcount(m);
}

/*
 * hg_lhc_bloom_candidates_avx2 for a filter in nseg segments of registers
 * (0: gathered).
 */
__attribute__((target("avx2,bmi,bmi2,popcnt"), always_inline)) static inline uint32_t
bloom_candidates8(uint64_t key, uint64_t g0, uint32_t k, uint32_t bits,
		  const uint8_t *filt, uint32_t len8, uint16_t *out, const int nseg)
{
	const __m256i gold = _mm256_set1_epi64x((long long)HG_HASH_GOLDEN);
	const __m256i step = _mm256_set1_epi64x((long long)(8 * HG_HASH_GOLDEN));
	const __m256i bv = _mm256_set1_epi32((int)(bits / 64));
	const __m256i one = _mm256_set1_epi32(1);
	const uint64_t base = key + (g0 + 1) * HG_HASH_GOLDEN;
	const uint32_t k1 = k < 3 ? k : 3;
	const int *words = (const int *)filt;
	uint16_t surv[BLOOM_CHUNK + 16];
	/* the filter's words, zero past its end, and its segments */
	uint32_t fw[BLOOM_REG_BITS8 / 32] = { 0 };
	__m256i t[BLOOM_REG_SEGS8];
	/* key + (g + 1) * GOLDEN for g = g0 + 0..3 and g0 + 4..7 */
	__m256i ga = _mm256_add_epi64(
		_mm256_set1_epi64x((long long)base),
		_mm256_setr_epi64x(0, (long long)HG_HASH_GOLDEN,
				   (long long)(2 * HG_HASH_GOLDEN),
				   (long long)(3 * HG_HASH_GOLDEN)));
	__m256i gb = _mm256_add_epi64(ga, _mm256_set1_epi64x(
						  (long long)(4 * HG_HASH_GOLDEN)));
	uint32_t c = 0;

	if (nseg > 0)
		memcpy(fw, filt, bits / 8);
	for (int j = 0; j < nseg; j++)
		t[j] = _mm256_loadu_si256((const __m256i *)(fw + 8 * j));
	for (uint32_t i0 = 0; i0 < len8; i0 += BLOOM_CHUNK) {
		uint32_t i1 = len8 - i0 < BLOOM_CHUNK ? len8 : i0 + BLOOM_CHUNK;
		uint32_t ns = 0, i;

		/* stage 1: the probes of the first word, two groups of 8
		 * a step, both hashed before either is probed (the last
		 * group of a chunk alone); 3846144 elements, filters of 1344
		 * bits: about 20 % less CPU than one group a step */
		for (i = i0; i + 16 <= i1; i += 16) {
			__m256i ga2 = _mm256_add_epi64(ga, step);
			__m256i gb2 = _mm256_add_epi64(gb, step);
			__m256i hit = one, hit2 = one, f[3], f2[3];

			bloom_fields8(avx2_mix64(ga), avx2_mix64(gb), f);
			bloom_fields8(avx2_mix64(ga2), avx2_mix64(gb2), f2);
			for (uint32_t r = 0; r < k1; r++) {
				hit = _mm256_and_si256(hit,
						       bloom_bit8(t, nseg, words,
								  f[r], bv));
				hit2 = _mm256_and_si256(hit2,
							bloom_bit8(t, nseg, words,
								   f2[r], bv));
			}
			ns += bloom_store8(bloom_mask8(hit), i, surv + ns);
			ns += bloom_store8(bloom_mask8(hit2), i + 8, surv + ns);
			ga = _mm256_add_epi64(ga2, step);
			gb = _mm256_add_epi64(gb2, step);
		}
		if (i < i1) {
			__m256i hit = one, f[3];

			bloom_fields8(avx2_mix64(ga), avx2_mix64(gb), f);
			for (uint32_t r = 0; r < k1; r++)
				hit = _mm256_and_si256(hit,
						       bloom_bit8(t, nseg, words,
								  f[r], bv));
			ns += bloom_store8(bloom_mask8(hit), i, surv + ns);
			ga = _mm256_add_epi64(ga, step);
			gb = _mm256_add_epi64(gb, step);
		}
		if (k <= 3) {
			memcpy(out + c, surv, ns * sizeof(*surv));
			c += ns;
			continue;
		}
		/* stage 2: the other probes of the survivors, two groups of 8
		 * a step as in stage 1 (the last groups padded with the last
		 * survivor, masked) */
		for (uint32_t j = ns; j < ((ns + 15) & ~15u); j++)
			surv[j] = ns ? surv[ns - 1] : 0;
		for (uint32_t j = 0; j < ns; j += 16) {
			__m128i p8 = _mm_loadu_si128((const __m128i *)(surv + j));
			__m128i q8 = _mm_loadu_si128(
				(const __m128i *)(surv + j + 8));
			__m256i wa, wb, xa, xb, hit = one, hit2 = one;
			uint32_t m, m2, left = ns - j;

			bloom_words8(base, p8, &wa, &wb);
			bloom_words8(base, q8, &xa, &xb);
			for (uint32_t r0 = 3; r0 < k; r0 += 3) {
				__m256i f[3], f2[3];

				wa = avx2_mix64(_mm256_add_epi64(wa, gold));
				wb = avx2_mix64(_mm256_add_epi64(wb, gold));
				xa = avx2_mix64(_mm256_add_epi64(xa, gold));
				xb = avx2_mix64(_mm256_add_epi64(xb, gold));
				bloom_fields8(wa, wb, f);
				bloom_fields8(xa, xb, f2);
				for (uint32_t r = r0; r < k && r < r0 + 3; r++) {
					hit = _mm256_and_si256(hit,
							       bloom_bit8(t, nseg,
									  words,
									  f[r - r0],
									  bv));
					hit2 = _mm256_and_si256(
						hit2, bloom_bit8(t, nseg, words,
								 f2[r - r0], bv));
				}
			}
			m = bloom_mask8(hit);
			m2 = bloom_mask8(hit2);
			if (left < 16)
				m2 = left <= 8 ? 0 : m2 & ((1u << (left - 8)) - 1);
			if (left < 8)
				m &= (1u << left) - 1;
			c += bloom_store_pos8(p8, m, out + c);
			c += bloom_store_pos8(q8, m2, out + c);
		}
	}
	_mm256_zeroupper();
	return c;
}

/*
 * The candidates of a Bloom block: the elements i < len8 (a multiple of 8)
 * of the block whose k probes (bloom_probes in codec_lhc.c: a chain of
 * hash words, three 21-bit fields each) all hit a set bit of the filter
 * (bits bits at filt, a multiple of 64).  No branch on a probe: stage 1
 * tests the three probes of the first hash word of two groups of 8
 * elements a step (about 1/8 of the elements pass them in a filter half
 * full) and lists the survivors; stage 2 tests the other probes of the
 * survivors, two groups of 8 a step, recomputing their first hash word.
 * Same candidates, in the same order, as the element-by-element loop.
 * Positions appended at out (8 entries of slack); returns their count.
 *
 * A filter of at most BLOOM_REG_BITS8 bits (6 registers; a block of 4096
 * elements at 0.68 % per worker, W = 4, has 1344) is read from registers,
 * larger ones gathered.  100 blocks of 4096 elements, k = 8, the probing
 * alone of the loop before (gathered, one group of 8 a step) and this one
 * alternated 200 times in one process, AMD EPYC (Zen 4) under load, CPU
 * ms best / median: filters of 1344 bits 1.30 / 1.72 before, 0.92 / 1.06
 * after; 256 bits 1.26 / 1.42 and 0.65 / 0.71; 3968 bits (gathered in
 * both) 1.39 / 1.96 and 1.14 / 1.59 (docs/BENCHMARKS.md "Bloom probing").
 * With 7 or 8 registers (1600-2048 bits) the best was 2-6 % slower than
 * the gather.
 */
__attribute__((target("avx2,bmi,bmi2,popcnt"))) uint32_t
hg_lhc_bloom_candidates_avx2(uint64_t key, uint64_t g0, uint32_t k, uint32_t bits,
			     const uint8_t *filt, uint32_t len8, uint16_t *out)
{
	switch ((bits + BLOOM_SEG_BITS8 - 1) / BLOOM_SEG_BITS8) {
	case 1:
		return bloom_candidates8(key, g0, k, bits, filt, len8, out, 1);
	case 2:
		return bloom_candidates8(key, g0, k, bits, filt, len8, out, 2);
	case 3:
		return bloom_candidates8(key, g0, k, bits, filt, len8, out, 3);
	case 4:
		return bloom_candidates8(key, g0, k, bits, filt, len8, out, 4);
	case 5:
		return bloom_candidates8(key, g0, k, bits, filt, len8, out, 5);
	case 6:
		return bloom_candidates8(key, g0, k, bits, filt, len8, out, 6);
	default:
		return bloom_candidates8(key, g0, k, bits, filt, len8, out, 0);
	}
}

/*
 * The peel's passes over a block's cells (codec_lhc.c peel_block), 8 cells
 * per step; each does the whole groups of 8 of the nc cells (the caller
 * does the rest, the same way).
 *
 * hg_lhc_peel_load_avx2: cell[k] = the big-endian cell k of gcells, and
 * cid[k] = 0; returns the cells it did.
 */
__attribute__((target("avx2,bmi,bmi2,popcnt"))) uint32_t
hg_lhc_peel_load_avx2(const uint8_t *gcells, uint32_t nc, uint32_t *cell,
		      uint64_t *cid)
{
	const __m256i z = _mm256_setzero_si256();
	uint32_t k = 0;

	for (; k + 8 <= nc; k += 8) {
		_mm256_storeu_si256((__m256i *)(cell + k),
				    avx2_bswap32(_mm256_loadu_si256(
					    (const __m256i *)(gcells +
							      4 * (size_t)k))));
		_mm256_storeu_si256((__m256i *)(cid + k), z);
		_mm256_storeu_si256((__m256i *)(cid + k + 4), z);
	}
	_mm256_zeroupper();
	return k;
}

/* The low 32 bits (the counts) of cid[k .. k + 8), in order. */
__attribute__((target("avx2,bmi,bmi2,popcnt"), always_inline)) static inline __m256i
counts8(const uint64_t *cid)
{
	__m256 a = _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)cid));
	__m256 b = _mm256_castsi256_ps(
		_mm256_loadu_si256((const __m256i *)(cid + 4)));

	/* lanes k0 k1 k4 k5 | k2 k3 k6 k7, then the 64-bit pairs in order */
	return _mm256_permute4x64_epi64(_mm256_castps_si256(_mm256_shuffle_ps(
						a, b, _MM_SHUFFLE(2, 0, 2, 0))),
					_MM_SHUFFLE(3, 1, 2, 0));
}

/*
 * hg_lhc_peel_seed_avx2: the cells of count 1 (the low half of cid[k])
 * among the whole groups of 8, ascending, at queue; returns their number,
 * the cells it did in *done.  Whole vectors of 8 are stored (queue needs 8
 * entries of slack past the last).
 */
__attribute__((target("avx2,bmi,bmi2,popcnt"))) uint32_t
hg_lhc_peel_seed_avx2(const uint64_t *cid, uint32_t nc, uint32_t *queue,
		      uint32_t *done)
{
	const __m256i one = _mm256_set1_epi32(1), step = _mm256_set1_epi32(8);
	__m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
	uint32_t k = 0, t = 0;

	for (; k + 8 <= nc; k += 8) {
		uint32_t m = (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(
			_mm256_cmpeq_epi32(counts8(cid + k), one)));

		_mm256_storeu_si256((__m256i *)(queue + t),
				    _mm256_permutevar8x32_epi32(
					    idx, avx2_perm(avx2_compress_idx(m))));
		t += (uint32_t)__builtin_popcount(m);
		idx = _mm256_add_epi32(idx, step);
	}
	_mm256_zeroupper();
	*done = k;
	return t;
}

/*
 * hg_lhc_peel_bad_avx2: the OR of the cells of count 0 among the whole
 * groups of 8 (non-zero iff one of them has a value left); the cells it
 * did in *done.
 */
__attribute__((target("avx2,bmi,bmi2,popcnt"))) uint32_t
hg_lhc_peel_bad_avx2(const uint32_t *cell, const uint64_t *cid, uint32_t nc,
		     uint32_t *done)
{
	const __m256i z = _mm256_setzero_si256();
	__m256i acc = z;
	uint32_t k = 0, bad;

	for (; k + 8 <= nc; k += 8)
		acc = _mm256_or_si256(
			acc,
			_mm256_and_si256(_mm256_loadu_si256(
						 (const __m256i *)(cell + k)),
					 _mm256_cmpeq_epi32(counts8(cid + k), z)));
	bad = !_mm256_testz_si256(acc, acc);
	_mm256_zeroupper();
	*done = k;
	return bad;
}

/* MurmurHash3's 32-bit finaliser of 8 lanes (lhc_fmix32). */
__attribute__((target("avx2"), always_inline)) static inline __m256i
fmix32x8(__m256i h)
{
	h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
	h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0x85EBCA6Bu));
	h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
	h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0xC2B2AE35u));
	return _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
}

/* The split-block hash of 8 elements whose lo32(g) + ka are the lanes of
 * x: *h1, *h2 its words, returned the block index (h1 * nblk) >> 32 (two
 * vpmuludq for the 64-bit products). */
__attribute__((target("avx2"), always_inline)) static inline __m256i
split_hash8(__m256i x, __m256i sv, __m256i kb, __m256i nb, __m256i *h1, __m256i *h2)
{
	__m256i a = fmix32x8(_mm256_xor_si256(x, sv));
	__m256i pe = _mm256_srli_epi64(_mm256_mul_epu32(a, nb), 32);
	__m256i po = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), nb);

	*h1 = a;
	*h2 = fmix32x8(_mm256_xor_si256(a, kb));
	return _mm256_blend_epi32(pe, po, 0xAA);
}

/* The block index of 8 elements and their first hash word *h1 only
 * (split_hash8 without h2). */
__attribute__((target("avx2"), always_inline)) static inline __m256i
split_hash8_h1(__m256i x, __m256i sv, __m256i nb, __m256i *h1)
{
	__m256i a = fmix32x8(_mm256_xor_si256(x, sv));
	__m256i pe = _mm256_srli_epi64(_mm256_mul_epu32(a, nb), 32);
	__m256i po = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), nb);

	*h1 = a;
	return _mm256_blend_epi32(pe, po, 0xAA);
}

/* 1 << the bit of word w of 8 elements (lhc_split_bit). */
__attribute__((target("avx2"), always_inline)) static inline __m256i
split_bit8(__m256i h1, __m256i h2, const int w)
{
	__m256i f = w < 6 ? _mm256_srli_epi32(h2, 5 * w) :
			    _mm256_srli_epi32(h1, 5 * (w - 6));

	return _mm256_sllv_epi32(_mm256_set1_epi32(1),
				 _mm256_and_si256(f, _mm256_set1_epi32(31)));
}

/* Sets of 8 blocks the AVX2 split-block probing keeps in registers. */
#define SPLIT_SETS8 4

/* The missing bits of words w0 .. w1 - 1 of 8 elements (0 in a lane: all
 * set) whose block indexes are blk and hash words h1, h2, the filter in
 * registers t (split_candidates_reg8): nseg sets of 8 blocks, a word of
 * set s picked by vpermd, the sets by blends on bits 3 and 4 of blk. */
__attribute__((target("avx2"), always_inline)) static inline __m256i
split_miss8(const __m256i t[SPLIT_SETS8][8], const int nseg, __m256i blk,
	    __m256i h1, __m256i h2, const int w0, const int w1)
{
	__m256i b3 = _mm256_slli_epi32(blk, 28); /* bit 3 as the sign */
	__m256i b4 = _mm256_slli_epi32(blk, 27); /* bit 4 as the sign */
	__m256i miss = _mm256_setzero_si256();

#pragma GCC unroll 8
	for (int w = w0; w < w1; w++) {
		__m256i v = _mm256_permutevar8x32_epi32(t[0][w], blk);

		if (nseg > 1)
			v = _mm256_castps_si256(_mm256_blendv_ps(
				_mm256_castsi256_ps(v),
				_mm256_castsi256_ps(
					_mm256_permutevar8x32_epi32(t[1][w], blk)),
				_mm256_castsi256_ps(b3)));
		if (nseg > 2) {
			__m256i u = _mm256_permutevar8x32_epi32(t[2][w], blk);

			if (nseg > 3)
				u = _mm256_castps_si256(_mm256_blendv_ps(
					_mm256_castsi256_ps(u),
					_mm256_castsi256_ps(
						_mm256_permutevar8x32_epi32(t[3][w],
									    blk)),
					_mm256_castsi256_ps(b3)));
			v = _mm256_castps_si256(
				_mm256_blendv_ps(_mm256_castsi256_ps(v),
						 _mm256_castsi256_ps(u),
						 _mm256_castsi256_ps(b4)));
		}
		miss = _mm256_or_si256(miss,
				       _mm256_andnot_si256(v, split_bit8(h1, h2,
									 w)));
	}
	return miss;
}

/* The 8-bit mask of the lanes of miss that are 0. */
__attribute__((target("avx2"), always_inline)) static inline uint32_t
split_hits8(__m256i miss)
{
	return (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(
		_mm256_cmpeq_epi32(miss, _mm256_setzero_si256())));
}

/* Stage 1 of the split-block probing tests words 6 and 7, whose bits are
 * fields of h1: it needs no h2.  About (fill)^2 of the elements survive
 * (a word of a filter at 12-16 bits per element is 40-50 % set: 16-25 %). */

/*
 * Split-block probing with the filter in registers, nseg (1 to 4) sets of
 * 8: register t[s][w] holds word w of blocks 8 s .. 8 s + 7, so that word
 * w of 8 elements' blocks is one vpermd by their block indexes per set
 * (and blends between the sets).  A word's bit of an element is a 5-bit field
 * of a hash word, 1 << that; no load, no branch on a bit.  Two stages, as
 * the Bloom probing: stage 1 hashes every element (h1 only), two groups of
 * 8 a step (both hashed before either is tested), tests words 6 and 7 and
 * lists the survivors; stage 2 hashes the survivors again from their
 * positions (h1 and h2) and tests words 0-5.  The candidates are the portable loop's, in order.
 */
__attribute__((target("avx2,bmi,bmi2,popcnt"), always_inline)) static inline uint32_t
split_candidates_reg8(uint64_t key, uint64_t g0, uint32_t nblk, const uint8_t *filt,
		      uint32_t len8, uint16_t *out, const int nseg)
{
	const __m256i kb = _mm256_set1_epi32((int)(uint32_t)(key >> 32));
	const __m256i sv = _mm256_set1_epi32((int)lhc_split_s(key, g0));
	const __m256i nb = _mm256_set1_epi32((int)nblk);
	const __m256i x0 = _mm256_set1_epi32((int)((uint32_t)g0 + (uint32_t)key));
	uint32_t tw[SPLIT_SETS8][8][8] = { { { 0 } } };
	uint16_t surv[BLOOM_CHUNK + 16];
	__m256i t[SPLIT_SETS8][8], x;
	uint32_t c = 0;

	for (uint32_t j = 0; j < nblk; j++)
		for (int w = 0; w < 8; w++)
			memcpy(&tw[j / 8][w][j % 8], filt + 32 * j + 4 * w, 4);
	for (int sg = 0; sg < nseg; sg++)
		for (int w = 0; w < 8; w++)
			t[sg][w] = _mm256_loadu_si256((const __m256i *)tw[sg][w]);
	x = _mm256_add_epi32(x0, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
	for (uint32_t i0 = 0; i0 < len8; i0 += BLOOM_CHUNK) {
		uint32_t i1 = len8 - i0 < BLOOM_CHUNK ? len8 : i0 + BLOOM_CHUNK;
		uint32_t ns = 0, i;

		for (i = i0; i + 16 <= i1; i += 16) {
			__m256i h1a, h1b, z = _mm256_setzero_si256();
			__m256i ba = split_hash8_h1(x, sv, nb, &h1a);
			__m256i bb = split_hash8_h1(
				_mm256_add_epi32(x, _mm256_set1_epi32(8)), sv,
				nb, &h1b);

			ns += bloom_store8(split_hits8(split_miss8(t, nseg, ba,
								   h1a, z, 6, 8)),
					   i, surv + ns);
			ns += bloom_store8(split_hits8(split_miss8(t, nseg, bb,
								   h1b, z, 6, 8)),
					   i + 8, surv + ns);
			x = _mm256_add_epi32(x, _mm256_set1_epi32(16));
		}
		if (i < i1) {
			__m256i h1, b = split_hash8_h1(x, sv, nb, &h1);

			ns += bloom_store8(split_hits8(
						   split_miss8(t, nseg, b, h1,
							       _mm256_setzero_si256(),
							       6, 8)),
					   i, surv + ns);
			x = _mm256_add_epi32(x, _mm256_set1_epi32(8));
		}
		/* stage 2: the survivors, two groups of 8 a step (the last
		 * padded with the last survivor, masked) */
		for (uint32_t j = ns; j < ((ns + 15) & ~15u); j++)
			surv[j] = ns ? surv[ns - 1] : 0;
		for (uint32_t j = 0; j < ns; j += 16) {
			__m128i p8 = _mm_loadu_si128((const __m128i *)(surv + j));
			__m128i q8 = _mm_loadu_si128(
				(const __m128i *)(surv + j + 8));
			__m256i h1a, h2a, h1b, h2b;
			__m256i ba = split_hash8(
				_mm256_add_epi32(x0, _mm256_cvtepu16_epi32(p8)),
				sv, kb, nb, &h1a, &h2a);
			__m256i bb = split_hash8(
				_mm256_add_epi32(x0, _mm256_cvtepu16_epi32(q8)),
				sv, kb, nb, &h1b, &h2b);
			uint32_t m = split_hits8(
				split_miss8(t, nseg, ba, h1a, h2a, 0, 6));
			uint32_t m2 = split_hits8(
				split_miss8(t, nseg, bb, h1b, h2b, 0, 6));
			uint32_t left = ns - j;

			if (left < 16)
				m2 = left <= 8 ? 0 : m2 & ((1u << (left - 8)) - 1);
			if (left < 8)
				m &= (1u << left) - 1;
			c += bloom_store_pos8(p8, m, out + c);
			c += bloom_store_pos8(q8, m2, out + c);
		}
	}
	return c;
}

/*
 * Split-block probing of a filter of more than 32 blocks: 8 elements
 * hashed per vector, then each element's eight bits made in one vector
 * (h2 in lanes 0-5, h1 in 6 and 7, shifted by each word's field, 1 <<
 * that) and tested against its block, one 32-byte load and vptest, no
 * branch.
 */
__attribute__((target("avx2,bmi,bmi2,popcnt"))) static uint32_t
split_candidates_load8(uint64_t key, uint64_t g0, uint32_t nblk,
		       const uint8_t *filt, uint32_t len8, uint16_t *out)
{
	const __m256i sh = _mm256_setr_epi32(0, 5, 10, 15, 20, 25, 0, 5);
	const __m256i one = _mm256_set1_epi32(1);
	const __m256i f31 = _mm256_set1_epi32(31);
	const __m256i kb = _mm256_set1_epi32((int)(uint32_t)(key >> 32));
	const __m256i sv = _mm256_set1_epi32((int)lhc_split_s(key, g0));
	const __m256i nb = _mm256_set1_epi32((int)nblk);
	__m256i x = _mm256_add_epi32(_mm256_set1_epi32((int)((uint32_t)g0 +
							     (uint32_t)key)),
				     _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
	uint32_t c = 0;

	for (uint32_t i = 0; i < len8; i += 8) {
		__m256i h1, h2;
		__m256i blk = _mm256_slli_epi32(split_hash8(x, sv, kb, nb, &h1, &h2),
						5);
		uint32_t off[8], a[8], b[8];

		_mm256_storeu_si256((__m256i *)off, blk);
		_mm256_storeu_si256((__m256i *)a, h1);
		_mm256_storeu_si256((__m256i *)b, h2);
		for (int e = 0; e < 8; e++) {
			__m256i hw = _mm256_blend_epi32(_mm256_set1_epi32((int)b[e]),
							_mm256_set1_epi32((int)a[e]),
							0xC0);
			__m256i m = _mm256_sllv_epi32(
				one,
				_mm256_and_si256(_mm256_srlv_epi32(hw, sh), f31));
			__m256i f = _mm256_loadu_si256(
				(const __m256i *)(filt + off[e]));

			out[c] = (uint16_t)(i + (uint32_t)e);
			c += (uint32_t)_mm256_testc_si256(f, m);
		}
		x = _mm256_add_epi32(x, _mm256_set1_epi32(8));
	}
	return c;
}

/* The candidates of a split-block filter (codec_lhc.c
 * split_candidates_portable) among the first len8 elements (8 entries of
 * slack at out); lo32(g0) + len8 must not pass 2^32 (hi32(g) is g0's for
 * every element). */
__attribute__((target("avx2,bmi,bmi2,popcnt"))) uint32_t
hg_lhc_split_candidates_avx2(uint64_t key, uint64_t g0, uint32_t nblk,
			     const uint8_t *filt, uint32_t len8, uint16_t *out)
{
	if (nblk <= 8)
		return split_candidates_reg8(key, g0, nblk, filt, len8, out, 1);
	if (nblk <= 16)
		return split_candidates_reg8(key, g0, nblk, filt, len8, out, 2);
	if (nblk <= 24)
		return split_candidates_reg8(key, g0, nblk, filt, len8, out, 3);
	if (nblk <= 32)
		return split_candidates_reg8(key, g0, nblk, filt, len8, out, 4);
	return split_candidates_load8(key, g0, nblk, filt, len8, out);
}
