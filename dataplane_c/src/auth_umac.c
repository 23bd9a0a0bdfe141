/* SPDX-License-Identifier: Apache-2.0 */
/*
 * UMAC-AES-128, 8-byte tags (auth_umac_pvt.h): the keys (RFC 4418's KDF,
 * AES-128 on AES-NI), the scalar NH, L2, L3 and the pad.
 */
#include <string.h>

#include <immintrin.h>

#include "auth_umac_pvt.h"

#define UMAC_AES __attribute__((target("aes,sse4.1")))

#define P36 0xFFFFFFFFBull      /* 2^36 - 5 */
#define P36_MASK 0xFFFFFFFFFull /* 2^36 - 1 */

static inline uint32_t be32_of(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
	       (uint32_t)p[2] << 8 | p[3];
}

static inline uint64_t be64_of(const uint8_t *p)
{
	return (uint64_t)be32_of(p) << 32 | be32_of(p + 4);
}

/* ---- AES-128 (FIPS-197) on AES-NI ---------------------------------------- */

UMAC_AES static inline __m128i aes128_step(__m128i k, __m128i assist)
{
	k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
	k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
	k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
	return _mm_xor_si128(k, _mm_shuffle_epi32(assist, 0xff));
}

/* aeskeygenassist needs its round constant as an immediate. */
#define AES128_ROUND(i, rcon)                                                  \
	rk[i] = aes128_step(rk[(i)-1], _mm_aeskeygenassist_si128(rk[(i)-1], rcon))

UMAC_AES static void aes128_expand(__m128i *rk, const uint8_t *key)
{
	rk[0] = _mm_loadu_si128((const __m128i *)key);
	AES128_ROUND(1, 0x01);
	AES128_ROUND(2, 0x02);
	AES128_ROUND(3, 0x04);
	AES128_ROUND(4, 0x08);
	AES128_ROUND(5, 0x10);
	AES128_ROUND(6, 0x20);
	AES128_ROUND(7, 0x40);
	AES128_ROUND(8, 0x80);
	AES128_ROUND(9, 0x1b);
	AES128_ROUND(10, 0x36);
}

UMAC_AES static inline __m128i aes128_block(const uint8_t (*rk)[16], __m128i x)
{
	x = _mm_xor_si128(x, _mm_loadu_si128((const __m128i *)rk[0]));
#pragma GCC unroll 9
	for (int r = 1; r < 10; r++)
		x = _mm_aesenc_si128(x, _mm_loadu_si128((const __m128i *)rk[r]));
	return _mm_aesenclast_si128(x, _mm_loadu_si128((const __m128i *)rk[10]));
}

/* RFC 4418 3.2.1: out = the first n bytes of AES_K(index || 1),
 * AES_K(index || 2), ... (64-bit big-endian halves). */
UMAC_AES static void kdf(const uint8_t (*rk)[16], uint8_t index, uint8_t *out,
			 size_t n)
{
	for (size_t i = 1, off = 0; off < n; i++, off += 16) {
		uint8_t t[16] = { 0 };

		t[7] = index;
		t[15] = (uint8_t)i; /* at most 16 blocks here */
		_mm_storeu_si128((__m128i *)t,
				 aes128_block(rk, _mm_loadu_si128(
							  (const __m128i *)t)));
		memcpy(out + off, t, n - off < 16 ? n - off : 16);
	}
}

UMAC_AES void hg_umac_init(struct hg_umac_key *u, const uint8_t *key, int avx2)
{
	__m128i rk[11];
	uint8_t mrk[11][16], buf[HG_UMAC_L1_WORDS * 4];

	memset(u, 0, sizeof(*u));
	aes128_expand(rk, key);
	memcpy(mrk, rk, sizeof(mrk));
	kdf((const uint8_t(*)[16])mrk, 0, buf, 16); /* K', the pad's key */
	aes128_expand(rk, buf);
	memcpy(u->pdf_rk, rk, sizeof(u->pdf_rk));
	kdf((const uint8_t(*)[16])mrk, 1, buf, sizeof(buf));
	for (size_t w = 0; w < HG_UMAC_L1_WORDS; w++)
		u->l1[w] = be32_of(buf + 4 * w);
	for (size_t b = 0; b <= HG_UMAC_CHUNK / 32; b++)
		for (size_t j = 0; j < 4; j++) {
			u->nhe[b][j] = u->l1[8 * b + j];
			if (b < HG_UMAC_CHUNK / 32)
				u->nho[b][j] = u->l1[8 * b + 4 + j];
		}
	kdf((const uint8_t(*)[16])mrk, 2, buf, 24 * HG_UMAC_ITERS);
	for (size_t t = 0; t < HG_UMAC_ITERS; t++)
		u->l2[t] = be64_of(buf + 24 * t) & 0x01FFFFFF01FFFFFFull;
	for (size_t t = 0; t < HG_UMAC_ITERS; t++)
		u->l2sq[t] = hg_umac_mul_p64(u->l2[t], u->l2[t]);
	kdf((const uint8_t(*)[16])mrk, 3, buf, 64 * HG_UMAC_ITERS);
	for (size_t t = 0; t < HG_UMAC_ITERS; t++)
		for (size_t j = 0; j < 4; j++)
			u->l3k1[t][j] = be64_of(buf + 64 * t + 8 * (4 + j)) % P36;
	kdf((const uint8_t(*)[16])mrk, 4, buf, 4 * HG_UMAC_ITERS);
	for (size_t t = 0; t < HG_UMAC_ITERS; t++)
		u->l3k2[t] = be32_of(buf + 4 * t);
	u->avx2 = avx2;
	/* the master key's schedule and the KDF's output leave no copy */
	memset(rk, 0, sizeof(rk));
	memset(mrk, 0, sizeof(mrk));
	memset(buf, 0, sizeof(buf));
	__asm__ volatile("" : : "r"(rk), "r"(mrk), "r"(buf) : "memory");
}

/* ---- L1 and L2, scalar -------------------------------------------------- */

/* a[t] += NH of the n bytes at m (a multiple of 32) from byte koff of
 * the chunk on, under iteration t's key. */
static void nh_scalar(const struct hg_umac_key *u, const uint8_t *m, size_t n,
		      size_t koff, uint64_t *a)
{
	for (size_t b = 0; b < n; b += 32) {
		uint32_t w[8];
		size_t kw = (koff + b) / 4;

		memcpy(w, m + b, 32); /* little-endian words (x86) */
		for (size_t t = 0; t < HG_UMAC_ITERS; t++) {
			const uint32_t *k = u->l1 + 4 * t + kw;
			uint64_t s = 0;

			for (size_t j = 0; j < 4; j++)
				s += (uint64_t)(uint32_t)(w[j] + k[j]) *
				     (uint32_t)(w[j + 4] + k[j + 4]);
			a[t] += s;
		}
	}
}

/* h[t] = L1 of one chunk of clen bytes at m: NH, zero-padded to 32
 * bytes, plus the length in bits. */
static void chunk_scalar(const struct hg_umac_key *u, const uint8_t *m,
			 size_t clen, uint64_t *h)
{
	size_t full = clen & ~(size_t)31;

	for (size_t t = 0; t < HG_UMAC_ITERS; t++)
		h[t] = (uint64_t)clen * 8;
	nh_scalar(u, m, full, 0, h);
	if (clen > full || !clen) { /* zero-padded to 32 bytes */
		uint8_t tail[32] = { 0 };

		memcpy(tail, m + full, clen - full);
		nh_scalar(u, tail, 32, full, h);
	}
}

static void chunk(const struct hg_umac_key *u, const uint8_t *m, size_t clen,
		  uint64_t *h)
{
	if (u->avx2)
		hg_umac_chunk_avx2(u, m, clen, h, NULL);
	else
		chunk_scalar(u, m, clen, h);
}

static void uhash_scalar(const struct hg_umac_key *u, const uint8_t *data,
			 size_t len, uint64_t *y)
{
	uint64_t h[HG_UMAC_ITERS];
	size_t off = 0;

	if (len <= HG_UMAC_CHUNK) { /* L2 skipped: B = 0^64 || A */
		chunk_scalar(u, data, len, y);
		return;
	}
	for (size_t t = 0; t < HG_UMAC_ITERS; t++)
		y[t] = 1;
	do { /* two chunks a step (hg_umac_poly64x2) */
		size_t c1 = len - off < HG_UMAC_CHUNK ? len - off : HG_UMAC_CHUNK;

		chunk_scalar(u, data + off, c1, h);
		off += c1;
		if (off < len) {
			size_t c2 = len - off < HG_UMAC_CHUNK ? len - off :
								HG_UMAC_CHUNK;
			uint64_t g[HG_UMAC_ITERS];

			chunk_scalar(u, data + off, c2, g);
			off += c2;
			for (size_t t = 0; t < HG_UMAC_ITERS; t++)
				y[t] = hg_umac_poly64x2(u->l2[t], u->l2sq[t],
							y[t], h[t], g[t]);
		} else {
			for (size_t t = 0; t < HG_UMAC_ITERS; t++)
				y[t] = hg_umac_poly64(u->l2[t], y[t], h[t]);
		}
	} while (off < len);
	for (size_t t = 0; t < HG_UMAC_ITERS; t++)
		y[t] = hg_umac_poly_end(y[t]);
}

static uint64_t add_p64(uint64_t a, uint64_t b)
{
	uint64_t r = a + b;

	r = r < a ? r + 59 : r;
	return hg_umac_poly_end(r);
}

void hg_umac_share(const struct hg_umac_key *u, const uint8_t *data, size_t len,
		   struct hg_umac_shared *sh)
{
	uint64_t h[HG_UMAC_ITERS];
	size_t c1 = len < HG_UMAC_CHUNK ? len : HG_UMAC_CHUNK;

	memset(sh, 0, sizeof(*sh));
	sh->len = len;
	chunk(u, data, c1, sh->nh1);
	nh_scalar(u, data, 32, 0, sh->hdr);
	for (size_t t = 0; t < HG_UMAC_ITERS; t++) {
		sh->base[t] = 1; /* Horner from y = 1: the k^C term */
		sh->kpow[t] = 1;
	}
	if (len <= HG_UMAC_CHUNK)
		return;
	/* y = k^C + k^(C-1) a_1 + sum_{c>=2} k^(C-c) a_c: Horner over the
	 * chunks after the first, from y = k (the 1 times k) and a_1 = 0 */
	for (size_t t = 0; t < HG_UMAC_ITERS; t++)
		sh->base[t] = u->l2[t];
	for (size_t off = c1; off < len; off += HG_UMAC_CHUNK) {
		size_t clen = len - off < HG_UMAC_CHUNK ? len - off : HG_UMAC_CHUNK;

		chunk(u, data + off, clen, h);
		for (size_t t = 0; t < HG_UMAC_ITERS; t++) {
			if (h[t] >= 0xFFFFFFFF00000000ull)
				sh->fallback = 1;
			sh->base[t] = add_p64(hg_umac_mul_p64(sh->base[t], u->l2[t]),
					      h[t]);
			sh->kpow[t] = hg_umac_mul_p64(sh->kpow[t], u->l2[t]);
		}
	}
}

/* ---- the tag ------------------------------------------------------------- */

/* L3 of each iteration's y, masked by pad: the tag's 8 bytes as x86
 * reads them */
static inline uint64_t finish(const struct hg_umac_key *u, const uint64_t *y,
			      uint64_t pad)
{
	uint64_t t64 = 0;

#pragma GCC unroll 2
	for (size_t t = 0; t < HG_UMAC_ITERS; t++) {
		/* L3 over B = 0^64 || y: the four high 16-bit words are 0 */
		uint64_t s = (y[t] >> 48) * u->l3k1[t][0] +
			     ((y[t] >> 32) & 0xFFFF) * u->l3k1[t][1] +
			     ((y[t] >> 16) & 0xFFFF) * u->l3k1[t][2] +
			     (y[t] & 0xFFFF) * u->l3k1[t][3]; /* < 2^54 */
		uint32_t v;

		s = (s & P36_MASK) + 5 * (s >> 36); /* 2^36 = 5, < 2^37 */
		s = s >= P36 ? s - P36 : s;
		v = (uint32_t)s ^ u->l3k2[t];
		t64 |= (uint64_t)__builtin_bswap32(v) << (32 * t); /* big-endian */
	}
	return t64 ^ pad;
}

static inline void put_tag(uint64_t t64, uint8_t *tag)
{
	memcpy(tag, &t64, 8);
	memset(tag + 8, 0, 8);
}

UMAC_AES void hg_umac_tag(const struct hg_umac_key *u, const uint8_t *nonce,
			  size_t nonce_len, const uint8_t *data, size_t len,
			  uint8_t *tag)
{
	uint8_t n16[16] = { 0 };
	size_t nl = nonce_len > 16 ? 16 : nonce_len;
	unsigned half;

	/* RFC 4418 3.3.1 for 8-byte tags: the nonce's low bit picks the half
	 * of the block of the nonce with that bit cleared */
	memcpy(n16, nonce, nl);
	half = n16[nl - 1] & 1;
	n16[nl - 1] &= 0xFE;
	hg_umac_tag_block(u, _mm_loadu_si128((const __m128i *)n16), half, data,
			  len, tag, NULL);
}

UMAC_AES static inline uint64_t pad_of(const struct hg_umac_key *u,
				       __m128i block, unsigned half)
{
	block = aes128_block(u->pdf_rk, block);
	return (uint64_t)(half ? _mm_extract_epi64(block, 1) :
				 _mm_cvtsi128_si64(block));
}

UMAC_AES uint64_t hg_umac_tag64(const struct hg_umac_key *u, __m128i block,
				unsigned half, const uint8_t *data, size_t len,
				const uint8_t *next)
{
	uint64_t y[HG_UMAC_ITERS], pad = pad_of(u, block, half);

	if (len > HG_UMAC_MAX_LEN) /* not a frame: a tag verifying nothing */
		return ~pad;
	if (u->avx2)
		hg_umac_uhash_avx2(u, data, len, y, next);
	else
		uhash_scalar(u, data, len, y);
	return finish(u, y, pad);
}

UMAC_AES void hg_umac_tag_block(const struct hg_umac_key *u, __m128i block,
				unsigned half, const uint8_t *data, size_t len,
				uint8_t *tag, const uint8_t *next)
{
	put_tag(hg_umac_tag64(u, block, half, data, len, next), tag);
}

UMAC_AES void hg_umac_tag_shared(const struct hg_umac_key *u,
				 const struct hg_umac_shared *sh, __m128i block,
				 unsigned half, const uint8_t *data, uint8_t *tag)
{
	uint64_t y[HG_UMAC_ITERS], hb[HG_UMAC_ITERS] = { 0 }, pad;

	nh_scalar(u, data, 32, 0, hb);
	for (size_t t = 0; t < HG_UMAC_ITERS; t++) {
		uint64_t a1 = sh->nh1[t] - sh->hdr[t] + hb[t];

		if (sh->len <= HG_UMAC_CHUNK) {
			y[t] = a1; /* L2 skipped */
		} else if (sh->fallback || a1 >= 0xFFFFFFFF00000000ull) {
			hg_umac_tag_block(u, block, half, data, sh->len, tag, NULL);
			return;
		} else {
			y[t] = add_p64(sh->base[t],
				       hg_umac_mul_p64(sh->kpow[t], a1));
		}
	}
	pad = pad_of(u, block, half);
	put_tag(finish(u, y, pad), tag);
}
