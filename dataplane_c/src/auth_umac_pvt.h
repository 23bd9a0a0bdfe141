/* SPDX-License-Identifier: Apache-2.0 */
/*
 * UMAC-AES-128 with an 8-byte tag (RFC 4418's UMAC-64, two UHASH
 * iterations; PROTOCOL.md "Authentication", `umac`), the project's own
 * code (auth_umac*.c):
 *
 *   tag = UHASH(frame) xor half b of AES-128_{K'}(nonce - b || 0^32)
 *
 * (b the nonce's lowest bit), where UHASH is, per iteration i (0, 1), NH
 * of every 1024-byte chunk
 * (L1), a polynomial modulo 2^64 - 59 over the chunks' NH values (L2; a
 * frame of one chunk skips it) and an inner product modulo 2^36 - 5 (L3),
 * under keys that RFC 4418's KDF makes once per key (hg_umac_init).
 *
 * NH is the cost: per 32 bytes and iteration, four 32-bit additions and
 * four 32 x 32 -> 64-bit multiplies.  Four iterations (a 16-byte tag)
 * measured as slow as AES-GMAC's GHASH on AVX2 (an AMD EPYC, Zen 3:
 * gmac_bench 636 ns per 8224-byte tag against 625, 160 ns per 1056-byte
 * one against 97): NH's eight vector uops per 64 bytes and iteration
 * fill the four vector pipes.  Two forms give the same bits:
 *
 *   scalar  one 32-byte block at a time (auth_umac.c; the pclmul and
 *           portable MAC paths on a CPU without AVX2 or when forced)
 *   avx2    64 bytes a turn per ymm: the two blocks' first halves against
 *           their second halves (one cross-lane permute each, made once
 *           for both iterations), VPMULUDQ on the even and on the odd
 *           32-bit lanes, against key words laid out by block halves at
 *           key set-up, one copy for both iterations (nhe, nho;
 *           auth_umac_avx2.c; the avx2 and avx512 paths, and any CPU
 *           with AVX2 when HOMAGG_MAC_ISA is unset)
 *
 * The frame's 16-byte trailer is the tag followed by 8 zero bytes.
 *
 * Frames are at most 2^24 bytes, so L2 is POLY-64 only (RFC 4418 moves to
 * POLY-128 after 2^14 chunks); a longer message gets a tag that verifies
 * nothing.
 */
#ifndef HOMAGG_AUTH_UMAC_PVT_H
#define HOMAGG_AUTH_UMAC_PVT_H

#include <stddef.h>
#include <stdint.h>

#include <immintrin.h>

#define HG_UMAC_ITERS 2
#define HG_UMAC_CHUNK 1024
#define HG_UMAC_MAX_LEN (1u << 24) /* bytes; POLY-64 only up to here */
/* NH key words: a chunk's 256, and 4 more per further iteration */
#define HG_UMAC_L1_WORDS (HG_UMAC_CHUNK / 4 + 4 * (HG_UMAC_ITERS - 1))

/* One key's state; wiped by whoever frees it. */
struct hg_umac_key {
	uint8_t pdf_rk[11][16];        /* AES-128 round keys of K' */
	uint32_t l1[HG_UMAC_L1_WORDS]; /* NH key words (big-endian read) */
	/* the same words for the avx2 NH, once for both iterations: the
	 * first (nhe) and second (nho) four words of each 32-byte block's
	 * key, block after block.  Iteration 1's key is iteration 0's four
	 * words on, so a pair of blocks' x halves take nho under it where
	 * iteration 0's y halves do, and its y halves nhe one row on
	 * (auth_umac_avx2.c): half the bytes of a key per iteration, and
	 * three key loads per 64 bytes instead of four. */
	uint32_t nhe[HG_UMAC_CHUNK / 32 + 1][4];
	uint32_t nho[HG_UMAC_CHUNK / 32][4];
	uint64_t l2[HG_UMAC_ITERS];      /* POLY-64 keys, masked */
	uint64_t l2sq[HG_UMAC_ITERS];    /* their squares modulo 2^64 - 59 */
	uint64_t l3k1[HG_UMAC_ITERS][4]; /* L3 key words 4..7, mod 2^36-5
					     * (words 0..3 meet zeros) */
	uint32_t l3k2[HG_UMAC_ITERS];
	int avx2; /* NH form: 1 avx2, 0 scalar */
};

/* u = the state of UMAC key (16 bytes), NH on avx2 if avx2.  Needs
 * AES-NI. */
void hg_umac_init(struct hg_umac_key *u, const uint8_t *key, int avx2);
/* tag = the 8-byte UMAC of data[0..len) under u with a nonce of
 * nonce_len (1..16) bytes, then 8 zero bytes. */
void hg_umac_tag(const struct hg_umac_key *u, const uint8_t *nonce,
		 size_t nonce_len, const uint8_t *data, size_t len, uint8_t *tag);
/* The same with the nonce given as the AES block RFC 4418's pad encrypts
 * (the nonce, its lowest bit cleared, then zeros) and that bit (half);
 * next (NULL: none): the data of the tag to come, prefetched while this
 * one's NH runs (avx2 form). */
void hg_umac_tag_block(const struct hg_umac_key *u, __m128i block,
		       unsigned half, const uint8_t *data, size_t len,
		       uint8_t *tag, const uint8_t *next);
/* The same tag's first 8 bytes as x86 reads them (the 8 after are 0):
 * what a receiver compares with the frame's trailer. */
uint64_t hg_umac_tag64(const struct hg_umac_key *u, __m128i block, unsigned half,
		       const uint8_t *data, size_t len, const uint8_t *next);

/*
 * y[t] = iteration t's L2 output (its low 64 bits: the high ones are 0 for
 * messages up to HG_UMAC_MAX_LEN) of data[0..len), t < HG_UMAC_ITERS:
 * the avx2 form of L1 and L2.
 */
void hg_umac_uhash_avx2(const struct hg_umac_key *u, const uint8_t *data,
			size_t len, uint64_t *y, const uint8_t *next);
/* h[t] = L1 of one chunk: NH of its clen bytes (zero-padded to 32) plus
 * its length in bits, t < HG_UMAC_ITERS; the avx2 form.  pf (NULL: none):
 * bytes prefetched a line per 64 bytes hashed (the next frame's). */
void hg_umac_chunk_avx2(const struct hg_umac_key *u, const uint8_t *m,
			size_t clen, uint64_t *h, const uint8_t *pf);

/*
 * Tags of messages that differ only in their first 32 bytes (an
 * aggregator's unicast copies of one result: the same payload, a header
 * per worker).  NH sums over 32-byte blocks, so the first chunk's NH is
 * the template header's block's plus the rest's; POLY-64 is a polynomial,
 * so the chunks after the first add a fixed term: per copy, one block of
 * NH, one multiply modulo 2^64 - 59, L3 and the pad.  The same bits as
 * hg_umac_tag().
 */
struct hg_umac_shared {
	uint64_t nh1[HG_UMAC_ITERS];  /* L1 of chunk 1 with the template */
	uint64_t hdr[HG_UMAC_ITERS];  /* NH of the template's first block */
	uint64_t base[HG_UMAC_ITERS]; /* k^C + sum over c >= 2 of k^(C-c) a_c */
	uint64_t kpow[HG_UMAC_ITERS]; /* k^(C-1) */
	size_t len;
	int fallback; /* a later chunk's L1 meets RFC 4418's marker */
};

/* sh = the shared part of data[0..len) (len >= 32) under u. */
void hg_umac_share(const struct hg_umac_key *u, const uint8_t *data, size_t len,
		   struct hg_umac_shared *sh);
/* hg_umac_tag_block() of data[0..sh->len), whose bytes from 32 on are the
 * template's. */
void hg_umac_tag_shared(const struct hg_umac_key *u,
			const struct hg_umac_shared *sh, __m128i block,
			unsigned half, const uint8_t *data, uint8_t *tag);

#define HG_UMAC_P64 0xFFFFFFFFFFFFFFC5ull /* 2^64 - 59 */

/* k y + m modulo 2^64 - 59 for k < 2^57 and any y, m < 2^64, the result
 * below 2^64 but not necessarily reduced: only 64-bit multiplies, the
 * 128-bit product's high half hi standing for 59 hi. */
static inline uint64_t hg_umac_mad_p64(uint64_t k, uint64_t y, uint64_t m)
{
	unsigned __int128 x = (unsigned __int128)k * y;      /* < 2^121 */
	uint64_t lo = (uint64_t)x, hi = (uint64_t)(x >> 64); /* hi < 2^57 */
	unsigned __int128 t = (unsigned __int128)lo + m + hi * 59; /* < 2^66 */
	uint64_t r = (uint64_t)t + (uint64_t)(t >> 64) * 59;

	return r < (uint64_t)t ? r + 59 : r; /* 2^64 = 59 */
}

/* RFC 4418 5.3.2, one word m of POLY-64 under k (< 2^57), y as
 * hg_umac_mad_p64() takes and gives it (hg_umac_poly_end() reduces it). */
static inline uint64_t hg_umac_poly64(uint64_t k, uint64_t y, uint64_t m)
{
	if (__builtin_expect(m >= 0xFFFFFFFF00000000ull, 0)) {
		/* the marker p - 1, then m - offset */
		y = hg_umac_mad_p64(k, y, HG_UMAC_P64 - 1);
		m -= 59;
	}
	return hg_umac_mad_p64(k, y, m);
}

/* y, a result of hg_umac_poly64(), reduced below 2^64 - 59 */
static inline uint64_t hg_umac_poly_end(uint64_t y)
{
	return y >= HG_UMAC_P64 ? y - HG_UMAC_P64 : y;
}

/* a b modulo 2^64 - 59 for any a, b < 2^64, reduced */
static inline uint64_t hg_umac_mul_p64(uint64_t a, uint64_t b)
{
	unsigned __int128 x = (unsigned __int128)a * b;
	unsigned __int128 t = (unsigned __int128)(uint64_t)x +
			      (unsigned __int128)(uint64_t)(x >> 64) * 59;
	uint64_t r = (uint64_t)t + (uint64_t)(t >> 64) * 59; /* t >> 64 < 2^7 */

	r = r < (uint64_t)t ? r + 59 : r;
	return hg_umac_poly_end(r);
}

/*
 * Two words m1, m2 of POLY-64 under k (< 2^57) with k2 = k^2 modulo
 * 2^64 - 59: k^2 y + k m1 + m2, the two Horner steps with one multiply on
 * the chain through y instead of two (the same value; RFC 4418's marker,
 * for a word of 2^64 - 2^32 or more, takes the steps one by one).  y and
 * the result as hg_umac_poly64() takes and gives them.
 */
static inline uint64_t hg_umac_poly64x2(uint64_t k, uint64_t k2, uint64_t y,
					uint64_t m1, uint64_t m2)
{
	uint64_t r, s, t;

	if (__builtin_expect((m1 >= 0xFFFFFFFF00000000ull) |
				     (m2 >= 0xFFFFFFFF00000000ull),
			     0))
		return hg_umac_poly64(k, hg_umac_poly64(k, y, m1), m2);
	r = hg_umac_mul_p64(k2, y);
	s = hg_umac_mad_p64(k, m1, m2);
	t = r + s;
	return t < r ? t + 59 : t; /* 2^64 = 59 */
}

/* hg_umac_poly64x2() from y = 1, POLY-64's start: k^2 + k m1 + m2, one
 * multiply fewer. */
static inline uint64_t hg_umac_poly64x2_from1(uint64_t k, uint64_t k2,
					      uint64_t m1, uint64_t m2)
{
	uint64_t s, t;

	if (__builtin_expect((m1 >= 0xFFFFFFFF00000000ull) |
				     (m2 >= 0xFFFFFFFF00000000ull),
			     0))
		return hg_umac_poly64(k, hg_umac_poly64(k, 1, m1), m2);
	s = hg_umac_mad_p64(k, m1, m2);
	t = s + k2;                /* k2 < 2^64 - 59 */
	return t < s ? t + 59 : t; /* 2^64 = 59 */
}

#endif /* HOMAGG_AUTH_UMAC_PVT_H */
