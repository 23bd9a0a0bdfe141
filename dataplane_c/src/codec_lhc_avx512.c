/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec_lhc_avx512.c - the AVX-512 paths of the lhc method (codec_lhc.c
 * chooses them at run time, hg_codec_avx512()): the candidate list of a
 * bitmap block (VBMI2), the sketch cells of a batch of candidates, the
 * compaction of a block's non-zeros and Bloom probing.  Each gives the same bits as its
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

/* ---- Bloom probing ----------------------------------------------------- */

/* Filters of at most BLOOM_REG_BITS bits are probed from registers: each
 * 1024 bits (32 words) a pair of vectors, looked up with vpermt2d.  Larger
 * ones with a 32-bit gather. */
#define BLOOM_SEG_BITS 1024u
#define BLOOM_REG_SEGS 4
#define BLOOM_REG_BITS (BLOOM_REG_SEGS * BLOOM_SEG_BITS)

/* Elements per stage-1 chunk (its survivors' list lives on the stack). */
#define BLOOM_CHUNK512 1024

#define AVX512_BLOOM_FN                                                        \
	__attribute__((target("avx512f,avx512dq,popcnt"), always_inline)) static inline

/*
 * The three 21-bit fields of 16 elements' hash words (a: elements 0-7, b:
 * 8-15), in 32-bit lanes in element order, at f[0..2].
 */
AVX512_BLOOM_FN void bloom_fields16(__m512i a, __m512i b, __m512i *f)
{
	const __m512i f21 = _mm512_set1_epi32(0x1FFFFF);
	const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16,
					       18, 20, 22, 24, 26, 28, 30);
	const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
	__m512i lo = _mm512_permutex2var_epi32(a, even, b);
	__m512i hi = _mm512_permutex2var_epi32(a, odd, b);

	f[0] = _mm512_and_si512(lo, f21);
	/* bits 21-41: (lo >> 21 | hi << 11) & f21 */
	f[1] = _mm512_ternarylogic_epi32(_mm512_srli_epi32(lo, 21),
					 _mm512_slli_epi32(hi, 11), f21, 0xA8);
	f[2] = _mm512_and_si512(_mm512_srli_epi32(hi, 10), f21);
}

/*
 * The probe of field f in [0, bits): (f * bits) >> 21 as bloom_probes
 * computes it (codec_lhc.c), = (f * (bits / 64)) >> 15 exactly as bits is
 * a multiple of 64, which fits 32 bits when bits < BLOOM_VEC_BITS
 * (bv = bits / 64 in every lane).
 */
AVX512_BLOOM_FN __m512i bloom_probe16(__m512i f, __m512i bv)
{
	return _mm512_srli_epi32(_mm512_mullo_epi32(f, bv), 15);
}

/*
 * The lanes of the 16 probe positions p whose filter bit is set: word
 * p / 32 (little endian, as byte p / 8 holds bit p % 8), from the
 * registers t (nseg segments of 1024 bits) when nseg > 0, else gathered
 * from words.
 */
AVX512_BLOOM_FN __mmask16 bloom_hits16(const __m512i *t, int nseg,
				       const int *words, __m512i p)
{
	__m512i wi = _mm512_srli_epi32(p, 5), v;
	/* bit p % 32 (a rotate takes its count mod 32) */
	__m512i bit = _mm512_rolv_epi32(_mm512_set1_epi32(1), p);

	if (nseg == 0) {
		v = _mm512_i32gather_epi32(wi, words, 4);
	} else {
		/* vpermt2d reads the low 5 bits of wi: the word within
		 * the segment; p >= 1024 s picks segment s */
		v = _mm512_permutex2var_epi32(t[0], wi, t[1]);
		for (int s = 1; s < nseg; s++)
			v = _mm512_mask_mov_epi32(
				v,
				_mm512_cmpge_epu32_mask(
					p, _mm512_set1_epi32(
						   (int)(s * BLOOM_SEG_BITS))),
				_mm512_permutex2var_epi32(t[2 * s], wi,
							  t[2 * s + 1]));
	}
	return _mm512_test_epi32_mask(v, bit);
}

/* The 16 positions p (32-bit lanes) selected by m, stored in order as
 * 16-bit values at out (all 16 lanes stored); returns their number. */
AVX512_BLOOM_FN uint32_t bloom_store16(__m512i p, __mmask16 m, uint16_t *out)
{
	_mm256_storeu_si256((__m256i *)out,
			    _mm512_cvtepi32_epi16(
				    _mm512_maskz_compress_epi32(m, p)));
	return (uint32_t)__builtin_popcount(m);
}

/*
 * The first hash words of the 16 elements at the 16-bit positions p16 of
 * a block whose hash input of element 0 is basev (key + (g0 + 1) * GOLDEN
 * in every lane): elements 0-7 at *wa, 8-15 at *wb.
 */
AVX512_BLOOM_FN void bloom_words16(__m512i basev, __m256i p16, __m512i *wa,
				   __m512i *wb)
{
	const __m512i gold = _mm512_set1_epi64((long long)HG_HASH_GOLDEN);

	/* key + (g0 + pos + 1) * GOLDEN = base + pos * GOLDEN */
	*wa = mix64_avx512(_mm512_add_epi64(
		basev, _mm512_mullo_epi64(_mm512_cvtepu16_epi64(
						  _mm256_castsi256_si128(p16)),
					  gold)));
	*wb = mix64_avx512(_mm512_add_epi64(
		basev, _mm512_mullo_epi64(_mm512_cvtepu16_epi64(
						  _mm256_extracti128_si256(p16, 1)),
					  gold)));
}

/*
 * hg_lhc_bloom_candidates_avx512 for a filter in nseg segments of
 * registers (0: gathered).  Stage 1: the three probes of the first hash
 * word of two groups of 16 elements a step, both hashed before either is
 * probed (the last group of a chunk alone), the survivors (about 1/8 in a
 * filter half full) listed; stage 2: the other probes of the survivors,
 * two groups of 16 a step, their first hash word recomputed.  Same
 * candidates, in the same order, as the portable loop.  3846144 elements
 * at 0.68 %, W = 4 (filters of about 1400 bits, two segments), best CPU
 * time of set_index with the library before (the AVX2 gather loop) and
 * after alternated in one process, shared Xeon under load: 8.9 ms before,
 * 4.7-4.9 ms after; two groups a step instead of one, AMD EPYC (Zen 4)
 * under load, median CPU time of set_index: 4.6 ms before, 4.1 after
 * (docs/BENCHMARKS.md "Bloom probing").
 */
AVX512_BLOOM_FN uint32_t bloom_candidates16(uint64_t key, uint64_t g0,
					    uint32_t k, uint32_t bits,
					    const uint8_t *filt, uint32_t len16,
					    uint16_t *out, const int nseg)
{
	const __m512i gold = _mm512_set1_epi64((long long)HG_HASH_GOLDEN);
	const __m512i step = _mm512_set1_epi64((long long)(16 * HG_HASH_GOLDEN));
	const __m512i bv = _mm512_set1_epi32((int)(bits / 64));
	const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
					       11, 12, 13, 14, 15);
	const uint64_t base = key + (g0 + 1) * HG_HASH_GOLDEN;
	const __m512i basev = _mm512_set1_epi64((long long)base);
	const uint32_t k1 = k < 3 ? k : 3;
	const int *words = (const int *)filt;
	uint16_t surv[BLOOM_CHUNK512 + 32];
	__m512i t[2 * BLOOM_REG_SEGS];
	/* key + (g + 1) * GOLDEN for g = g0 + 0..7 and g0 + 8..15 */
	__m512i ga = _mm512_add_epi64(basev,
				      _mm512_mullo_epi64(_mm512_setr_epi64(0, 1, 2,
									   3, 4, 5,
									   6, 7),
							 gold));
	__m512i gb = _mm512_add_epi64(ga, _mm512_set1_epi64(
						  (long long)(8 * HG_HASH_GOLDEN)));
	uint32_t c = 0;

	for (int j = 0; j < 2 * nseg; j++) {
		uint32_t w0 = 16 * (uint32_t)j, nw = bits / 32;
		__mmask16 lm = w0 >= nw      ? 0 :
			       nw - w0 >= 16 ? 0xFFFF :
					       (__mmask16)((1u << (nw - w0)) - 1);

		t[j] = _mm512_maskz_loadu_epi32(lm, words + (lm ? w0 : 0));
	}
	for (uint32_t i0 = 0; i0 < len16; i0 += BLOOM_CHUNK512) {
		uint32_t i1 = len16 - i0 < BLOOM_CHUNK512 ? len16 :
							    i0 + BLOOM_CHUNK512;
		uint32_t ns = 0, i;

		/* stage 1: the probes of the first word, two groups of 16
		 * a step, both hashed before either is probed (the last
		 * group of a chunk alone) */
		for (i = i0; i + 32 <= i1; i += 32) {
			__m512i ga2 = _mm512_add_epi64(ga, step);
			__m512i gb2 = _mm512_add_epi64(gb, step);
			__m512i f[3], f2[3];
			__mmask16 m = 0xFFFF, m2 = 0xFFFF;

			bloom_fields16(mix64_avx512(ga), mix64_avx512(gb), f);
			bloom_fields16(mix64_avx512(ga2), mix64_avx512(gb2), f2);
			for (uint32_t r = 0; r < k1; r++) {
				m &= bloom_hits16(t, nseg, words,
						  bloom_probe16(f[r], bv));
				m2 &= bloom_hits16(t, nseg, words,
						   bloom_probe16(f2[r], bv));
			}
			ns += bloom_store16(_mm512_add_epi32(lane,
							     _mm512_set1_epi32(
								     (int)i)),
					    m, surv + ns);
			ns += bloom_store16(_mm512_add_epi32(lane,
							     _mm512_set1_epi32(
								     (int)i + 16)),
					    m2, surv + ns);
			ga = _mm512_add_epi64(ga2, step);
			gb = _mm512_add_epi64(gb2, step);
		}
		if (i < i1) {
			__m512i f[3];
			__mmask16 m = 0xFFFF;

			bloom_fields16(mix64_avx512(ga), mix64_avx512(gb), f);
			for (uint32_t r = 0; r < k1; r++)
				m &= bloom_hits16(t, nseg, words,
						  bloom_probe16(f[r], bv));
			ns += bloom_store16(_mm512_add_epi32(lane,
							     _mm512_set1_epi32(
								     (int)i)),
					    m, surv + ns);
			ga = _mm512_add_epi64(ga, step);
			gb = _mm512_add_epi64(gb, step);
		}
		if (k <= 3) {
			memcpy(out + c, surv, ns * sizeof(*surv));
			c += ns;
			continue;
		}
		/* stage 2: the other probes of the survivors, two groups of
		 * 16 a step as in stage 1 (the lanes past the last survivor
		 * zero, masked off) */
		for (uint32_t j = ns; j < ((ns + 31) & ~31u); j++)
			surv[j] = 0;
		for (uint32_t j = 0; j < ns; j += 32) {
			/* the lanes of both groups holding survivors */
			uint32_t lm = ns - j >= 32 ? ~0u : (1u << (ns - j)) - 1;
			__mmask16 m = (__mmask16)lm, m2 = (__mmask16)(lm >> 16);
			__m256i p16 = _mm256_loadu_si256(
				(const __m256i *)(surv + j));
			__m256i q16 = _mm256_loadu_si256(
				(const __m256i *)(surv + j + 16));
			__m512i wa, wb, xa, xb;

			bloom_words16(basev, p16, &wa, &wb);
			bloom_words16(basev, q16, &xa, &xb);
			for (uint32_t r0 = 3; r0 < k; r0 += 3) {
				__m512i f[3], f2[3];

				wa = mix64_avx512(_mm512_add_epi64(wa, gold));
				wb = mix64_avx512(_mm512_add_epi64(wb, gold));
				xa = mix64_avx512(_mm512_add_epi64(xa, gold));
				xb = mix64_avx512(_mm512_add_epi64(xb, gold));
				bloom_fields16(wa, wb, f);
				bloom_fields16(xa, xb, f2);
				for (uint32_t r = r0; r < k && r < r0 + 3; r++) {
					m &= bloom_hits16(t, nseg, words,
							  bloom_probe16(f[r - r0],
									bv));
					m2 &= bloom_hits16(t, nseg, words,
							   bloom_probe16(f2[r - r0],
									 bv));
				}
			}
			c += bloom_store16(_mm512_cvtepu16_epi32(p16), m, out + c);
			c += bloom_store16(_mm512_cvtepu16_epi32(q16), m2, out + c);
		}
	}
	return c;
}

__attribute__((target("avx512f,avx512dq,popcnt"))) uint32_t
hg_lhc_bloom_candidates_avx512(uint64_t key, uint64_t g0, uint32_t k,
			       uint32_t bits, const uint8_t *filt,
			       uint32_t len16, uint16_t *out)
{
	uint32_t nseg = (bits + BLOOM_SEG_BITS - 1) / BLOOM_SEG_BITS;

	switch (nseg) {
	case 1:
		return bloom_candidates16(key, g0, k, bits, filt, len16, out, 1);
	case 2:
		return bloom_candidates16(key, g0, k, bits, filt, len16, out, 2);
	case 3:
		return bloom_candidates16(key, g0, k, bits, filt, len16, out, 3);
	case 4:
		return bloom_candidates16(key, g0, k, bits, filt, len16, out, 4);
	default:
		return bloom_candidates16(key, g0, k, bits, filt, len16, out, 0);
	}
}

/* MurmurHash3's 32-bit finaliser of 16 lanes (lhc_fmix32). */
AVX512_BLOOM_FN __m512i fmix32x16(__m512i h)
{
	h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
	h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0x85EBCA6Bu));
	h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 13));
	h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0xC2B2AE35u));
	return _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
}

/* The split-block hash of 16 elements whose lo32(g) + ka are the lanes of
 * x: *h1, *h2 its words; returns the block index (h1 * nblk) >> 32. */
AVX512_BLOOM_FN __m512i split_hash16(__m512i x, __m512i sv, __m512i kb,
				     __m512i nb, __m512i *h1, __m512i *h2)
{
	__m512i a = fmix32x16(_mm512_xor_si512(x, sv));
	__m512i pe = _mm512_srli_epi64(_mm512_mul_epu32(a, nb), 32);
	__m512i po = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), nb);

	*h1 = a;
	*h2 = fmix32x16(_mm512_xor_si512(a, kb));
	return _mm512_mask_blend_epi32(0xAAAA, pe, po);
}

/* The block index of 16 elements and their first hash word *h1 only
 * (split_hash16 without h2). */
AVX512_BLOOM_FN __m512i split_hash16_h1(__m512i x, __m512i sv, __m512i nb,
					__m512i *h1)
{
	__m512i a = fmix32x16(_mm512_xor_si512(x, sv));
	__m512i pe = _mm512_srli_epi64(_mm512_mul_epu32(a, nb), 32);
	__m512i po = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), nb);

	*h1 = a;
	return _mm512_mask_blend_epi32(0xAAAA, pe, po);
}

/* Lanes of the 16 elements (blocks blk, hash words h1, h2) with a bit of
 * words w0 .. w1 - 1 missing, the filter's words in registers: t[w] word w
 * of blocks 0-15, t[8 + w] of blocks 16-31 (two sets: vpermt2d). */
AVX512_BLOOM_FN __mmask16 split_miss16(const __m512i t[16], const int nseg,
				       __m512i blk, __m512i h1, __m512i h2,
				       const int w0, const int w1)
{
	const __m512i one = _mm512_set1_epi32(1);
	const __m512i f31 = _mm512_set1_epi32(31);
	__m512i miss = _mm512_setzero_si512();

#pragma GCC unroll 8
	for (int w = w0; w < w1; w++) {
		__m512i f = w < 6 ? _mm512_srli_epi32(h2, 5 * w) :
				    _mm512_srli_epi32(h1, 5 * (w - 6));
		__m512i m = _mm512_sllv_epi32(one, _mm512_and_si512(f, f31));
		__m512i v = nseg > 1 ? _mm512_permutex2var_epi32(t[w], blk,
								 t[8 + w]) :
				       _mm512_permutexvar_epi32(blk, t[w]);

		miss = _mm512_ternarylogic_epi32(miss, v, m, 0xF2); /* miss | (m & ~v) */
	}
	return _mm512_test_epi32_mask(miss, miss);
}

/* Elements per stage-1 chunk (its survivors' list lives on the stack). */
#define SPLIT_CHUNK16 1024

/*
 * The candidates of a split-block filter of at most 32 blocks among the
 * first len16 elements (a multiple of 16; 16 entries of slack at out): as
 * the AVX2 path (codec_lhc_avx2.c split_candidates_reg8), 16 elements a
 * group, the filter transposed into registers (word w of 16 blocks in
 * one, vpermd; of 32 in two, vpermt2d), in two stages: words 6 and 7 of
 * every element (their bits are fields of h1: no h2), two groups a step,
 * the survivors listed (compressed, no branch); then words 0-5 of the
 * survivors, hashed again from their positions.  lo32(g0) + len16 must not pass 2^32.
 */
AVX512_BLOOM_FN uint32_t split_candidates_reg16(uint64_t key, uint64_t g0,
						uint32_t nblk, const uint8_t *filt,
						uint32_t len16, uint16_t *out,
						const int nseg)
{
	const __m512i kb = _mm512_set1_epi32((int)(uint32_t)(key >> 32));
	const __m512i sv = _mm512_set1_epi32((int)lhc_split_s(key, g0));
	const __m512i nb = _mm512_set1_epi32((int)nblk);
	const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
					       11, 12, 13, 14, 15);
	const __m512i x0 = _mm512_set1_epi32((int)((uint32_t)g0 + (uint32_t)key));
	uint32_t tw[16][16] = { { 0 } };
	uint16_t surv[SPLIT_CHUNK16 + 32];
	__m512i t[16], x;
	uint32_t c = 0;

	for (uint32_t j = 0; j < nblk; j++)
		for (int w = 0; w < 8; w++)
			memcpy(&tw[8 * (j / 16) + w][j % 16],
			       filt + 32 * j + 4 * w, 4);
	for (int r = 0; r < 16; r++)
		t[r] = _mm512_loadu_si512(tw[r]);
	x = _mm512_add_epi32(x0, lane);
	for (uint32_t i0 = 0; i0 < len16; i0 += SPLIT_CHUNK16) {
		uint32_t i1 = len16 - i0 < SPLIT_CHUNK16 ? len16 :
							   i0 + SPLIT_CHUNK16;
		uint32_t ns = 0, i;

		for (i = i0; i + 32 <= i1; i += 32) {
			const __m512i z = _mm512_setzero_si512();
			__m512i h1a, h1b;
			__m512i ba = split_hash16_h1(x, sv, nb, &h1a);
			__m512i bb = split_hash16_h1(
				_mm512_add_epi32(x, _mm512_set1_epi32(16)), sv,
				nb, &h1b);
			__mmask16 ma = (__mmask16)~split_miss16(t, nseg, ba,
								h1a, z, 6, 8);
			__mmask16 mb = (__mmask16)~split_miss16(t, nseg, bb,
								h1b, z, 6, 8);

			ns += bloom_store16(_mm512_add_epi32(lane,
							     _mm512_set1_epi32(
								     (int)i)),
					    ma, surv + ns);
			ns += bloom_store16(_mm512_add_epi32(lane,
							     _mm512_set1_epi32((
								     int)(i + 16))),
					    mb, surv + ns);
			x = _mm512_add_epi32(x, _mm512_set1_epi32(32));
		}
		if (i < i1) {
			__m512i h1, b = split_hash16_h1(x, sv, nb, &h1);
			__mmask16 m = (__mmask16)~split_miss16(t, nseg, b, h1,
							       _mm512_setzero_si512(),
							       6, 8);

			ns += bloom_store16(_mm512_add_epi32(lane,
							     _mm512_set1_epi32(
								     (int)i)),
					    m, surv + ns);
			x = _mm512_add_epi32(x, _mm512_set1_epi32(16));
		}
		/* stage 2: the survivors, 16 a group (the last masked) */
		for (uint32_t j = 0; j < ns; j += 16) {
			__m512i p = _mm512_cvtepu16_epi32(
				_mm256_loadu_si256((const __m256i *)(surv + j)));
			__m512i h1, h2,
				b = split_hash16(_mm512_add_epi32(x0, p), sv,
						 kb, nb, &h1, &h2);
			uint32_t left = ns - j;
			__mmask16 m = (__mmask16)~split_miss16(t, nseg, b, h1,
							       h2, 0, 6);

			if (left < 16)
				m &= (__mmask16)((1u << left) - 1);
			c += bloom_store16(p, m, out + c);
		}
	}
	return c;
}

/* The candidates of a split-block filter of at most 32 blocks (see
 * split_candidates_reg16); larger filters take the AVX2 path. */
__attribute__((target("avx512f,avx512dq,popcnt"))) uint32_t
hg_lhc_split_candidates_avx512(uint64_t key, uint64_t g0, uint32_t nblk,
			       const uint8_t *filt, uint32_t len16, uint16_t *out)
{
	if (nblk <= 16)
		return split_candidates_reg16(key, g0, nblk, filt, len16, out, 1);
	return split_candidates_reg16(key, g0, nblk, filt, len16, out, 2);
}
