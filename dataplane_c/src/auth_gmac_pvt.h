/* SPDX-License-Identifier: Apache-2.0 */
/*
 * AES-GMAC of the project's own (auth_gmac*.c): AES-256 with AES-NI for the
 * hash key H = E_K(0) and the tag mask E_K(J0), GHASH over the additional
 * data with carry-less multiplies against precomputed powers H^144..H^1: up
 * to 144 blocks are multiplied each by its power and summed unreduced, then
 * reduced once, so the one dependent chain (the running hash into the next
 * 144 blocks) costs one reduction per 2304 bytes.  72, not 64, first: a
 * frame of a 1 KB payload (1056 bytes of header and payload, 66 blocks, and
 * the length block) then takes one reduction, not two (the second one's ~30
 * dependent instructions sat at the end of every tag).  144, not 72: an
 * 8 KB payload's frame (514 blocks and the length block) takes four, not
 * eight; each chunk's end (the lanes folded, the reduction, the loop's
 * start) cost about 6 ns on AMD Zen 4 (gmac_bench 8224 bytes: avx512
 * 334-337 -> 311-317 ns, avx2 511-512 -> 488, in bursts of 32 frames of 8
 * keys 360 -> 340 and 539 -> 524; BENCHMARKS.md "AMD Zen 4"), for 2304
 * bytes per table per key instead of 1152.  The multiply-and-sum loop has
 * three forms, all giving the same bits (HOMAGG_MAC_ISA, auth_gmac.c
 * "hg_mac_isa"):
 *
 *   pclmul   xmm PCLMULQDQ, one block per multiply     (auth_gmac.c)
 *   avx2     ymm VPCLMULQDQ, two blocks, three multiplies each
 *            (Karatsuba)                              (auth_gmac_avx2.c)
 *   avx512   zmm VPCLMULQDQ and GFNI, four blocks, masked tail, in the
 *            natural bit order (auth_gmac_avx512.c: no byte shuffle)
 *
 * Cost (build/release/tools/gmac_bench, best batch of 50 tags, the shared
 * 2-vCPU Intel Xeon VM under load, 2026-12-02), ns per tag of 32 / 1056 /
 * 8224 bytes: pclmul 12 / 89 / 609, avx2 13 / 55 / 334, avx512 17 / 46 /
 * 253 (with 64 blocks per reduction and a byte shuffle per 64 bytes; with
 * 72 and GFNI, three alternating runs of `gmac_bench 2000 1056 8224`
 * against that build, under load: 39.3 vs 46.2 ns at 1056 bytes, 225 vs
 * 252 ns at 8224); libsodium and OpenSSL (the portable path) 38 / 196 /
 * 704.  With two zmm groups a turn (four ternary XORs for eight
 * products, not six) and a chunk's products not waiting for the previous
 * chunk's reduction, avx512 29.3 vs 34.7 ns at 1056 bytes and 181-182 vs
 * 207 ns at 8224 (three alternating runs of `gmac_bench 2000 1056 8224`
 * against the build before, load average 4-5, 2026-12-02; BENCHMARKS.md
 * "8 KB: fewer vector uops").
 *
 * On an AMD EPYC (Zen 4) VM every VPCLMULQDQ, xmm, ymm or zmm, issues once
 * per 2 cycles (latency 4), so the multiplies alone bound an 8224-byte tag
 * at about 1133 ns on pclmul, 425 on avx2 and 283 on avx512; gmac_bench
 * there, 144 blocks per reduction: 1171-1175, 488 and 311-317 ns
 * (BENCHMARKS.md "AMD Zen 4", where Karatsuba on avx512 and on pclmul
 * measured slower there too).
 *
 * On pclmul and avx2, field elements are kept byte-reflected (the block's bytes reversed), so
 * that a carry-less product of two of them is the reflected product shifted
 * right by one bit: ghash_reduce() shifts the 256-bit sum of products left
 * by one and reduces it modulo x^128 + x^7 + x^2 + x + 1 (both linear, so a
 * sum of unreduced products is reduced once).
 */
#ifndef HOMAGG_AUTH_GMAC_PVT_H
#define HOMAGG_AUTH_GMAC_PVT_H

#include <stddef.h>
#include <stdint.h>

#include <immintrin.h>

#define HG_GMAC_CHUNK 144 /* blocks per reduction */
#define HG_GMAC_ROUNDS 14 /* AES-256 */

/* One key's precomputed state; wiped by whoever frees it. */
struct hg_gmac_key {
	uint8_t rk[HG_GMAC_ROUNDS + 1][16]; /* AES-256 round keys */
	uint8_t hpow[HG_GMAC_CHUNK][16];    /* H^144 .. H^1, reflected */
	uint8_t hnat[HG_GMAC_CHUNK][16];    /* the same, natural (avx512) */
	uint8_t hkar[HG_GMAC_CHUNK][16];    /* hpow's two halves XORed, in
					     * both halves (avx2's Karatsuba) */
};

/* An unreduced sum of products: the 64-bit halves' a0*b0, a1*b0 + a0*b1
 * and a1*b1 summed (ghash_reduce's arguments). */
struct hg_gmac_sum {
	__m128i lo, mid, hi;
};

#define GMAC_PCLMUL __attribute__((target("aes,pclmul,ssse3")))

GMAC_PCLMUL static inline __m128i gmac_bswap(__m128i x)
{
	return _mm_shuffle_epi8(x, _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
						10, 11, 12, 13, 14, 15));
}

/*
 * The reflected GHASH product of an unreduced carry-less sum: lo, mid, hi
 * are the sums of a0*b0, a1*b0 + a0*b1 and a1*b1 (64-bit halves).
 */
GMAC_PCLMUL static inline __m128i ghash_reduce(__m128i lo, __m128i mid, __m128i hi)
{
	__m128i c, d, t;

	lo = _mm_xor_si128(lo, _mm_slli_si128(mid, 8));
	hi = _mm_xor_si128(hi, _mm_srli_si128(mid, 8));
	/* (hi:lo) <<= 1, across the 32-bit lanes and the two halves */
	c = _mm_srli_epi32(lo, 31);
	d = _mm_srli_epi32(hi, 31);
	lo = _mm_slli_epi32(lo, 1);
	hi = _mm_slli_epi32(hi, 1);
	t = _mm_srli_si128(c, 12);
	d = _mm_slli_si128(d, 4);
	c = _mm_slli_si128(c, 4);
	lo = _mm_or_si128(lo, c);
	hi = _mm_or_si128(hi, _mm_or_si128(d, t));
	/* fold lo into hi: first the bits that cross 128, then the rest */
	c = _mm_xor_si128(_mm_xor_si128(_mm_slli_epi32(lo, 31),
					_mm_slli_epi32(lo, 30)),
			  _mm_slli_epi32(lo, 25));
	d = _mm_srli_si128(c, 4);
	lo = _mm_xor_si128(lo, _mm_slli_si128(c, 12));
	t = _mm_xor_si128(_mm_xor_si128(_mm_srli_epi32(lo, 1),
					_mm_srli_epi32(lo, 2)),
			  _mm_xor_si128(_mm_srli_epi32(lo, 7), d));
	return _mm_xor_si128(hi, _mm_xor_si128(lo, t));
}

/*
 * s += (y + b[0]) hp[0] + b[1] hp[1] + ... + b[n-1] hp[n-1], unreduced, for
 * n raw 16-byte blocks b at blocks and n reflected powers hp (n >= 1).
 */
void hg_gmac_mul_pclmul(__m128i y, const uint8_t *blocks,
			const uint8_t (*hp)[16], size_t n, struct hg_gmac_sum *s);
/* The same on ymm by Karatsuba (hk: the hkar rows of hp's powers); pf's
 * bytes at the same offsets (the next frame's, not NULL) are prefetched
 * a line per 64 bytes multiplied, 128 bytes ahead. */
void hg_gmac_mul_avx2(__m128i y, const uint8_t *blocks, const uint8_t (*hp)[16],
		      const uint8_t (*hk)[16], size_t n, struct hg_gmac_sum *s,
		      const uint8_t *pf);

/* g = the state of AES-256 key (32 bytes).  Needs AES-NI and PCLMULQDQ. */
void hg_gmac_init(struct hg_gmac_key *g, const uint8_t *key);
/* tag = AES-GCM's tag under g with the pre-counter block j0 (the 12-byte
 * nonce, then 0x00000001), an empty plaintext and data[0..len) as
 * additional data, multiplied on path isa (HG_MAC_ISA_PCLMUL, _AVX2 or
 * _AVX512). */
void hg_gmac_tag(const struct hg_gmac_key *g, int isa, __m128i j0,
		 const uint8_t *data, size_t len, uint8_t *tag);

/* The avx512 path's tag (auth_gmac_avx512.c), E_K(J0) given: GHASH in
 * the natural bit order, no byte shuffles. */
void hg_gmac_tag_avx512(const struct hg_gmac_key *g, __m128i mask,
			const uint8_t *data, size_t len, uint8_t *tag,
			const uint8_t *next);
/*
 * The same tag with E_K(J0) given (mask), e.g. from hg_gmac_masks().
 * next (NULL: none): the data of the tag to come, prefetched while this
 * one's GHASH runs (a frame from the NIC or another core is not in this
 * core's caches; the next frame's first use is its tag).
 */
void hg_gmac_tag_masked(const struct hg_gmac_key *g, int isa, __m128i mask,
			const uint8_t *data, size_t len, uint8_t *tag,
			const uint8_t *next);
/* mask[i] = E_K(j0[i]) under key g[i], i < n: the blocks of a burst
 * pipelined through AES-NI together. */
void hg_gmac_masks(const struct hg_gmac_key *const *g, const __m128i *j0,
		   __m128i *mask, size_t n)
	__attribute__((access(read_only, 1, 4), access(read_only, 2, 4),
		       access(write_only, 3, 4)));

#endif /* HOMAGG_AUTH_GMAC_PVT_H */
