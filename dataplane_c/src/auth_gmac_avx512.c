/* SPDX-License-Identifier: Apache-2.0 */
/*
 * AES-GMAC's GHASH on zmm VPCLMULQDQ and GFNI (auth_gmac_pvt.h): four
 * blocks per 64-byte load, each multiplied lane by lane with its power of
 * H; the last one to three blocks by a masked load (the masked-off lanes
 * read nothing and add nothing); the four lanes of the sums folded at the
 * end.
 */
#include "auth_gmac_pvt.h"

#define GMAC_AVX512                                                            \
	__attribute__((target("avx512f,avx512bw,avx2,vpclmulqdq,aes,pclmul,ssse3")))

GMAC_AVX512 static inline __m128i fold4(__m512i v)
{
	__m256i t = _mm256_xor_si256(_mm512_castsi512_si256(v),
				     _mm512_extracti64x4_epi64(v, 1));

	return _mm_xor_si128(_mm256_castsi256_si128(t),
			     _mm256_extracti128_si256(t, 1));
}

#define XOR3(a, b, c) _mm512_ternarylogic_epi64(a, b, c, 0x96)

/* ---- the tag in the natural bit order (GFNI) ----------------------------- */
/*
 * The reflected form above spends one byte shuffle (port 5, like the four
 * multiplies) per 64 bytes.  Here a field element is kept in the natural
 * order instead, bit i of the 128 the coefficient of x^i: a data block's
 * bytes keep their places and only the bits of each byte are reversed, by
 * GF2P8AFFINEQB (port 0), so port 5 does the multiplies alone (4 uops per
 * 64 bytes, not 5).  The same tag, bit for bit (tests/test_auth_gmac.py).
 */
#define GMAC_NAT                                                               \
	__attribute__((target(                                                 \
		"avx512f,avx512bw,avx512vl,gfni,avx2,vpclmulqdq,aes,pclmul,ssse3")))

/* GF2P8AFFINEQB's matrix that reverses the bits of each byte */
#define BITREV8 0x8040201008040201ll

GMAC_NAT static inline __m128i rev128(__m128i x)
{
	return _mm_gf2p8affine_epi64_epi8(x, _mm_set1_epi64x(BITREV8), 0);
}

/*
 * The natural-order product of an unreduced carry-less sum (lo, mid, hi as
 * in ghash_reduce): the 256 bits folded modulo x^128 + x^7 + x^2 + x + 1,
 * x^128 being 0x87: the top 64 bits (times x^192 = 0x87 x^64) first, then
 * the next 64 (times x^128 = 0x87).
 */
GMAC_NAT static inline __m128i nat_reduce(__m128i lo, __m128i mid, __m128i hi)
{
	const __m128i p = _mm_set_epi64x(0, 0x87);
	__m128i t;

	lo = _mm_xor_si128(lo, _mm_slli_si128(mid, 8));
	hi = _mm_xor_si128(hi, _mm_srli_si128(mid, 8));
	t = _mm_clmulepi64_si128(hi, p, 0x01); /* up to 71 bits */
	lo = _mm_xor_si128(lo, _mm_slli_si128(t, 8));
	hi = _mm_xor_si128(hi, _mm_srli_si128(t, 8));
	return _mm_xor_si128(lo, _mm_clmulepi64_si128(hi, p, 0x00));
}

#define NAT_STEP(x, h)                                                           \
	do {                                                                     \
		lo = _mm512_xor_si512(lo, _mm512_clmulepi64_epi128(x, h, 0x00)); \
		mid = XOR3(mid, _mm512_clmulepi64_epi128(x, h, 0x01),            \
			   _mm512_clmulepi64_epi128(x, h, 0x10));                \
		hi = _mm512_xor_si512(hi, _mm512_clmulepi64_epi128(x, h, 0x11)); \
	} while (0)

/*
 * *s += (y + b[0]) hp[0] + ... + b[n-1] hp[n-1], natural order, n >= 1,
 * the group with y last (y may still be in the making); meanwhile pf's
 * bytes at the same offsets, 128 bytes ahead (the next frame's; not NULL:
 * blocks again when there is none), are prefetched two lines a turn, as
 * fast as this loop reads its own.
 */
GMAC_NAT static void mul_nat(__m128i y, const uint8_t *blocks,
			     const uint8_t (*hp)[16], size_t n,
			     struct hg_gmac_sum *s, const uint8_t *pf)
{
	const __m512i rv = _mm512_set1_epi64(BITREV8);
	__m512i lo = _mm512_setzero_si512(), mid = lo, hi = lo, x, h;
	__m512i yy = _mm512_zextsi128_si512(y);
	size_t i = 0;

	if (n >= 4) {
		/* two groups a turn: their eight products go into the three
		 * sums by four ternary XORs, not six */
		for (i = 4; i + 8 <= n; i += 8) {
			__m512i x2, h2;

			__builtin_prefetch(pf + 16 * i + 128, 0);
			__builtin_prefetch(pf + 16 * i + 192, 0);
			x = _mm512_gf2p8affine_epi64_epi8(
				_mm512_loadu_si512((const void *)(blocks + 16 * i)),
				rv, 0);
			x2 = _mm512_gf2p8affine_epi64_epi8(
				_mm512_loadu_si512(
					(const void *)(blocks + 16 * i + 64)),
				rv, 0);
			h = _mm512_loadu_si512((const void *)hp[i]);
			h2 = _mm512_loadu_si512((const void *)hp[i + 4]);
			lo = XOR3(lo, _mm512_clmulepi64_epi128(x, h, 0x00),
				  _mm512_clmulepi64_epi128(x2, h2, 0x00));
			mid = XOR3(mid, _mm512_clmulepi64_epi128(x, h, 0x01),
				   _mm512_clmulepi64_epi128(x, h, 0x10));
			mid = XOR3(mid, _mm512_clmulepi64_epi128(x2, h2, 0x01),
				   _mm512_clmulepi64_epi128(x2, h2, 0x10));
			hi = XOR3(hi, _mm512_clmulepi64_epi128(x, h, 0x11),
				  _mm512_clmulepi64_epi128(x2, h2, 0x11));
		}
		for (; i + 4 <= n; i += 4) {
			x = _mm512_gf2p8affine_epi64_epi8(
				_mm512_loadu_si512((const void *)(blocks + 16 * i)),
				rv, 0);
			h = _mm512_loadu_si512((const void *)hp[i]);
			NAT_STEP(x, h);
		}
		/* the first group last: y, made by the reduction before,
		 * joins the sums after this chunk's other products */
		x = _mm512_gf2p8affine_epi64_epi8(_mm512_loadu_si512(
							  (const void *)blocks),
						  rv, 0);
		x = _mm512_xor_si512(x, yy);
		h = _mm512_loadu_si512((const void *)hp[0]);
		NAT_STEP(x, h);
		yy = _mm512_setzero_si512();
	}
	if (i < n) {
		__mmask8 m = (__mmask8)((1u << (2 * (n - i))) - 1);

		x = _mm512_gf2p8affine_epi64_epi8(
			_mm512_maskz_loadu_epi64(m, blocks + 16 * i), rv, 0);
		x = _mm512_xor_si512(x, yy);
		h = _mm512_maskz_loadu_epi64(m, hp[i]);
		NAT_STEP(x, h);
	}
	s->lo = _mm_xor_si128(s->lo, fold4(lo));
	s->mid = _mm_xor_si128(s->mid, fold4(mid));
	s->hi = _mm_xor_si128(s->hi, fold4(hi));
}

GMAC_NAT static inline void nat_mul_add(__m128i x, const uint8_t *h,
					struct hg_gmac_sum *s)
{
	__m128i hh = _mm_loadu_si128((const __m128i *)h);

	s->lo = _mm_xor_si128(s->lo, _mm_clmulepi64_si128(x, hh, 0x00));
	s->mid = _mm_xor_si128(s->mid,
			       _mm_xor_si128(_mm_clmulepi64_si128(x, hh, 0x01),
					     _mm_clmulepi64_si128(x, hh, 0x10)));
	s->hi = _mm_xor_si128(s->hi, _mm_clmulepi64_si128(x, hh, 0x11));
}

/* hg_gmac_tag_masked()'s chunks, partial block and length block, here in
 * the natural order against g->hnat. */
GMAC_NAT void hg_gmac_tag_avx512(const struct hg_gmac_key *g, __m128i mask,
				 const uint8_t *data, size_t len, uint8_t *tag,
				 const uint8_t *next)
{
	const uint8_t *pf = next ? next : data;
	const uint8_t(*hend)[16] = g->hnat + HG_GMAC_CHUNK;
	size_t full = len / 16, part = len % 16, t = part ? 2 : 1, pos = 0, k;
	struct hg_gmac_sum s;
	__m128i y = _mm_setzero_si128();

	/* The hash so far (y) joins a chunk's first group, which mul_nat()
	 * multiplies last: the chunk's other multiplies need not wait for the
	 * reduction before it, and no extra product is spent on y (the
	 * separate y times the chunk's first power cost 4 xmm multiplies a
	 * chunk, 8 cycles on AMD Zen 4). */
	while (full - pos + t > HG_GMAC_CHUNK) {
		k = full - pos < HG_GMAC_CHUNK ? full - pos : HG_GMAC_CHUNK;
		s.lo = s.mid = s.hi = _mm_setzero_si128();
		mul_nat(y, data + 16 * pos, hend - k, k, &s, pf + 16 * pos);
		y = nat_reduce(s.lo, s.mid, s.hi);
		pos += k;
	}
	k = full - pos;
	s.lo = s.mid = s.hi = _mm_setzero_si128();
	if (k) {
		mul_nat(y, data + 16 * pos, hend - k - t, k, &s, pf + 16 * pos);
		y = _mm_setzero_si128();
	}
	if (part) { /* zero-padded: a masked load reads only its bytes */
		__m128i b = _mm_maskz_loadu_epi8((__mmask16)((1u << part) - 1),
						 data + 16 * full);

		nat_mul_add(_mm_xor_si128(y, rev128(b)), hend[-2], &s);
		y = _mm_setzero_si128();
	}
	/* the length block [8 len(A)]_64 || [0]_64: its bytes, bits reversed */
	nat_mul_add(_mm_xor_si128(y, rev128(_mm_set_epi64x(0, (long long)__builtin_bswap64(
								      (uint64_t)len *
								      8)))),
		    hend[-1], &s);
	y = nat_reduce(s.lo, s.mid, s.hi);
	_mm_storeu_si128((__m128i *)tag, _mm_xor_si128(rev128(y), mask));
}
