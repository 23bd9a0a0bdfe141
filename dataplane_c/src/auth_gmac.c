/* SPDX-License-Identifier: Apache-2.0 */
/*
 * AES-GMAC (AES-256-GCM, empty plaintext, the frame as additional data) on
 * AES-NI and PCLMULQDQ: the key schedule and H powers made once per key,
 * the tag mask, the GHASH tail and the xmm main loop (auth_gmac_pvt.h);
 * which main loop runs is chosen here (hg_mac_isa()).
 *
 * A tag is GCM's (NIST SP 800-38D): H = E_K(0^128),
 * J0 = nonce || 0x00000001, S = GHASH_H(A || 0-pad || [8 len(A)]_64 || [0]_64),
 * tag = E_K(J0) xor S.  Nothing here depends on secret data for a branch
 * or an address.
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "auth_gmac_pvt.h"
#include "homagg/auth.h"

/* ---- the ISA path --------------------------------------------------------- */

/*
 * HOMAGG_MAC_ISA read at the first call, kept until hg_mac_isa_reload(),
 * like the codec's HOMAGG_CODEC_ISA.  INT_MIN: not read yet.
 */
static int mac_isa_cached = INT_MIN;

static bool mac_isa_cpu(int isa)
{
	__builtin_cpu_init();
	switch (isa) {
	case HG_MAC_ISA_PORTABLE:
		return true;
	case HG_MAC_ISA_PCLMUL:
		return __builtin_cpu_supports("aes") &&
		       __builtin_cpu_supports("pclmul") &&
		       __builtin_cpu_supports("ssse3");
	case HG_MAC_ISA_AVX2:
		return mac_isa_cpu(HG_MAC_ISA_PCLMUL) &&
		       __builtin_cpu_supports("avx2") &&
		       __builtin_cpu_supports("vpclmulqdq");
	case HG_MAC_ISA_AVX512:
		return mac_isa_cpu(HG_MAC_ISA_AVX2) &&
		       __builtin_cpu_supports("avx512f") &&
		       __builtin_cpu_supports("avx512bw") &&
		       __builtin_cpu_supports("avx512vl") &&
		       __builtin_cpu_supports("gfni");
	default:
		return false;
	}
}

static const char *const mac_isa_names[] = { "portable", "pclmul", "avx2",
					     "avx512" };
#define MAC_ISA_COUNT ((int)(sizeof(mac_isa_names) / sizeof(mac_isa_names[0])))

const char *hg_mac_isa_name(int isa)
{
	return isa >= 0 && isa < MAC_ISA_COUNT ? mac_isa_names[isa] : "?";
}

static int mac_isa_read(void)
{
	const char *v = getenv("HOMAGG_MAC_ISA");

	if (!v || !*v) {
		for (int isa = HG_MAC_ISA_AVX512; isa > HG_MAC_ISA_PORTABLE; isa--)
			if (mac_isa_cpu(isa))
				return isa;
		return HG_MAC_ISA_PORTABLE;
	}
	for (int isa = 0; isa < MAC_ISA_COUNT; isa++)
		if (strcmp(v, mac_isa_names[isa]) == 0)
			return mac_isa_cpu(isa) ? isa : -ENOTSUP;
	return -EINVAL;
}

bool hg_mac_isa_available(int isa)
{
	return mac_isa_cpu(isa);
}

int hg_mac_isa(void)
{
	int isa = __atomic_load_n(&mac_isa_cached, __ATOMIC_RELAXED);

	if (isa == INT_MIN) {
		isa = mac_isa_read();
		__atomic_store_n(&mac_isa_cached, isa, __ATOMIC_RELAXED);
	}
	return isa;
}

int hg_mac_isa_reload(void)
{
	int isa = mac_isa_read();

	__atomic_store_n(&mac_isa_cached, isa, __ATOMIC_RELAXED);
	return isa;
}

/* ---- AES-256 ------------------------------------------------------------- */

/* The FIPS-197 step of the AES-256 schedule: w[i..i+3] from w[i-8..i-5]
 * (prev) and the SubWord (RotWord) word broadcast in assist. */
GMAC_PCLMUL static inline __m128i aes_expand_step(__m128i prev, __m128i assist)
{
	prev = _mm_xor_si128(prev, _mm_slli_si128(prev, 4));
	prev = _mm_xor_si128(prev, _mm_slli_si128(prev, 8));
	return _mm_xor_si128(prev, assist);
}

/* aeskeygenassist needs its round constant as an immediate. */
#define AES_ROUND_PAIR(i, rcon)                                                           \
	do {                                                                              \
		a = aes_expand_step(a,                                                    \
				    _mm_shuffle_epi32(_mm_aeskeygenassist_si128(b, rcon), \
						      0xff));                             \
		rk[i] = a;                                                                \
		if ((i) + 1 <= HG_GMAC_ROUNDS) {                                          \
			b = aes_expand_step(                                              \
				b,                                                        \
				_mm_shuffle_epi32(_mm_aeskeygenassist_si128(a, 0),        \
						  0xaa));                                 \
			rk[(i) + 1] = b;                                                  \
		}                                                                         \
	} while (0)

GMAC_PCLMUL static void aes256_expand(__m128i *rk, const uint8_t *key)
{
	__m128i a = _mm_loadu_si128((const __m128i *)key);
	__m128i b = _mm_loadu_si128((const __m128i *)(key + 16));

	rk[0] = a;
	rk[1] = b;
	AES_ROUND_PAIR(2, 0x01);
	AES_ROUND_PAIR(4, 0x02);
	AES_ROUND_PAIR(6, 0x04);
	AES_ROUND_PAIR(8, 0x08);
	AES_ROUND_PAIR(10, 0x10);
	AES_ROUND_PAIR(12, 0x20);
	AES_ROUND_PAIR(14, 0x40);
}

GMAC_PCLMUL static inline __m128i aes256_block(const struct hg_gmac_key *g,
					       __m128i x)
{
	x = _mm_xor_si128(x, _mm_loadu_si128((const __m128i *)g->rk[0]));
#pragma GCC unroll 13
	for (int r = 1; r < HG_GMAC_ROUNDS; r++)
		x = _mm_aesenc_si128(x, _mm_loadu_si128((const __m128i *)g->rk[r]));
	return _mm_aesenclast_si128(x,
				    _mm_loadu_si128(
					    (const __m128i *)g->rk[HG_GMAC_ROUNDS]));
}

/* ---- GHASH --------------------------------------------------------------- */

GMAC_PCLMUL static inline __m128i gf_mul(__m128i a, __m128i b)
{
	return ghash_reduce(_mm_clmulepi64_si128(a, b, 0x00),
			    _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x01),
					  _mm_clmulepi64_si128(a, b, 0x10)),
			    _mm_clmulepi64_si128(a, b, 0x11));
}

GMAC_PCLMUL void hg_gmac_init(struct hg_gmac_key *g, const uint8_t *key)
{
	__m128i rk[HG_GMAC_ROUNDS + 1], h, p;

	aes256_expand(rk, key);
	memcpy(g->rk, rk, sizeof(g->rk));
	h = gmac_bswap(aes256_block(g, _mm_setzero_si128()));
	p = h;
	for (int i = HG_GMAC_CHUNK - 1; i >= 0; i--) { /* hpow[i] = H^(144-i) */
		_mm_storeu_si128((__m128i *)g->hpow[i], p);
		p = gf_mul(p, h);
	}
	for (int i = 0; i < HG_GMAC_CHUNK; i++) {
		p = _mm_loadu_si128((const __m128i *)g->hpow[i]);
		p = _mm_xor_si128(p, _mm_shuffle_epi32(p, 0x4e));
		_mm_storeu_si128((__m128i *)g->hkar[i], p);
	}
	/* natural order: bit i of the 128 is the coefficient of x^i, the
	 * reflected one's bits in reverse (byte k = byte 15 - k reversed) */
	for (int i = 0; i < HG_GMAC_CHUNK; i++)
		for (int k = 0; k < 16; k++) {
			uint8_t b = g->hpow[i][15 - k], r = 0;

			for (int bit = 0; bit < 8; bit++)
				r |= (uint8_t)(((b >> bit) & 1) << (7 - bit));
			g->hnat[i][k] = r;
		}
	/* the stack copies of the schedule and of H */
	hg_auth_wipe(rk, sizeof(rk));
	h = p = _mm_setzero_si128();
	__asm__ volatile("" : : "x"(h), "x"(p) : "memory");
}

GMAC_PCLMUL static inline void mul_add(__m128i x, __m128i h, struct hg_gmac_sum *s)
{
	s->lo = _mm_xor_si128(s->lo, _mm_clmulepi64_si128(x, h, 0x00));
	s->mid = _mm_xor_si128(s->mid,
			       _mm_xor_si128(_mm_clmulepi64_si128(x, h, 0x01),
					     _mm_clmulepi64_si128(x, h, 0x10)));
	s->hi = _mm_xor_si128(s->hi, _mm_clmulepi64_si128(x, h, 0x11));
}

GMAC_PCLMUL void hg_gmac_mul_pclmul(__m128i y, const uint8_t *blocks,
				    const uint8_t (*hp)[16], size_t n,
				    struct hg_gmac_sum *s)
{
	mul_add(_mm_xor_si128(y, gmac_bswap(_mm_loadu_si128((const __m128i *)blocks))),
		_mm_loadu_si128((const __m128i *)hp[0]), s);
	for (size_t i = 1; i < n; i++)
		mul_add(gmac_bswap(_mm_loadu_si128(
				(const __m128i *)(blocks + 16 * i))),
			_mm_loadu_si128((const __m128i *)hp[i]), s);
}

/* Prefetch bytes [0, len) of p (NULL: nothing), for reading. */
static inline void prefetch_lines(const uint8_t *p, size_t len)
{
	if (p)
		for (size_t off = 0; off < len; off += 64)
			__builtin_prefetch(p + off, 0);
}

/*
 * s += (y + b[0]) hp[0] + b[1] hp[1] + ... + b[n-1] hp[n-1] on path isa
 * (pclmul or avx2); y is 0 for the first chunk (first).  pclmul multiplies the blocks without y, which joins
 * the sums after them (y hp[0], one more product): the chunk's multiplies
 * need not wait for the reduction that made y.  avx2 adds y to the first
 * block and multiplies that pair last, after the chunk's other blocks: no
 * extra product (it measured slower, gmac_bench 8224 bytes,
 * docs/BENCHMARKS.md), and the chunk's other multiplies do not wait for
 * the reduction that made y (gmac_bench on AMD Zen 4, docs/BENCHMARKS.md
 * "AMD Zen 4": 8224 bytes 523 -> 511 ns; 1056 bytes, one chunk and y 0,
 * 92 -> 76-84 ns, a gain not explained by y).  The
 * avx2 loop prefetches the next frame's lines (pf) as it goes, the pclmul
 * one finds a chunk's lines prefetched before it.
 */
GMAC_PCLMUL static inline void gmac_chunk(const struct hg_gmac_key *g, int isa,
					  __m128i y, const uint8_t *blocks,
					  const uint8_t (*hp)[16], size_t n,
					  struct hg_gmac_sum *s,
					  const uint8_t *pf, bool first)
{
	if (isa == HG_MAC_ISA_AVX2) {
		hg_gmac_mul_avx2(y, blocks, hp, g->hkar + (hp - g->hpow), n, s,
				 pf ? pf : blocks);
		return;
	}
	prefetch_lines(pf, 16 * n);
	hg_gmac_mul_pclmul(_mm_setzero_si128(), blocks, hp, n, s);
	if (!first)
		mul_add(y, _mm_loadu_si128((const __m128i *)hp[0]), s);
}

/*
 * pshufb masks: tail_shuf[p] turns the last 16 bytes of the data, whose
 * last p bytes are a partial block, into that block zero-padded and
 * reflected (byte j = data byte 15 - j of the block, or 0).
 */
#define TAIL_BYTE(p, j) ((15 - (j)) < (p) ? 16 - (p) + 15 - (j) : 0x80)
#define TAIL_ROW(p)                                                            \
	{                                                                      \
		TAIL_BYTE(p, 0), TAIL_BYTE(p, 1), TAIL_BYTE(p, 2),             \
			TAIL_BYTE(p, 3), TAIL_BYTE(p, 4), TAIL_BYTE(p, 5),     \
			TAIL_BYTE(p, 6), TAIL_BYTE(p, 7), TAIL_BYTE(p, 8),     \
			TAIL_BYTE(p, 9), TAIL_BYTE(p, 10), TAIL_BYTE(p, 11),   \
			TAIL_BYTE(p, 12), TAIL_BYTE(p, 13), TAIL_BYTE(p, 14),  \
			TAIL_BYTE(p, 15)                                       \
	}
static const uint8_t tail_shuf[16][16] __attribute__((aligned(16))) = {
	TAIL_ROW(0),  TAIL_ROW(1),  TAIL_ROW(2),  TAIL_ROW(3),
	TAIL_ROW(4),  TAIL_ROW(5),  TAIL_ROW(6),  TAIL_ROW(7),
	TAIL_ROW(8),  TAIL_ROW(9),  TAIL_ROW(10), TAIL_ROW(11),
	TAIL_ROW(12), TAIL_ROW(13), TAIL_ROW(14), TAIL_ROW(15),
};

/* The partial last block (p = len % 16 > 0 bytes), reflected, read
 * without touching a byte outside data[0..len). */
GMAC_PCLMUL static inline __m128i partial_block(const uint8_t *data, size_t len,
						size_t p)
{
	uint8_t b[16] = { 0 };

	if (len >= 16) /* one load, shifted in a register */
		return _mm_shuffle_epi8(_mm_loadu_si128(
						(const __m128i *)(data + len - 16)),
					_mm_load_si128(
						(const __m128i *)tail_shuf[p]));
	memcpy(b, data, len);
	return gmac_bswap(_mm_loadu_si128((const __m128i *)b));
}

/*
 * The data's full blocks go to the path's multiply straight from the frame,
 * at most HG_GMAC_CHUNK per reduction, each chunk against the last powers
 * of the table (H^k .. H^1); a partial last block and the length block are
 * made in registers (no store to reload) and join the last reduction.
 */
GMAC_PCLMUL void hg_gmac_tag(const struct hg_gmac_key *g, int isa, __m128i j0,
			     const uint8_t *data, size_t len, uint8_t *tag)
{
	/* E_K(J0) first: its rounds run beside the GHASH */
	hg_gmac_tag_masked(g, isa, aes256_block(g, j0), data, len, tag, NULL);
}

/*
 * E_K(J0) of n frames, each under its own key: eight blocks' rounds
 * interleaved, so the AES unit pipelines them (one block's 14 rounds are a
 * dependent chain of about 14 x 4 cycles; eight independent ones issue a
 * round every cycle or two).
 */
#define MASK_LANES 8
GMAC_PCLMUL void hg_gmac_masks(const struct hg_gmac_key *const *g,
			       const __m128i *j0, __m128i *mask, size_t n)
{
	size_t i = 0;

	for (; i + MASK_LANES <= n; i += MASK_LANES) {
		__m128i x[MASK_LANES];

#pragma GCC unroll 8
		for (int l = 0; l < MASK_LANES; l++)
			x[l] = _mm_xor_si128(j0[i + l],
					     _mm_loadu_si128(
						     (const __m128i *)g[i + l]->rk[0]));
#pragma GCC unroll 13
		for (int r = 1; r < HG_GMAC_ROUNDS; r++)
#pragma GCC unroll 8
			for (int l = 0; l < MASK_LANES; l++)
				x[l] = _mm_aesenc_si128(
					x[l],
					_mm_loadu_si128(
						(const __m128i *)g[i + l]->rk[r]));
#pragma GCC unroll 8
		for (int l = 0; l < MASK_LANES; l++)
			mask[i + l] = _mm_aesenclast_si128(
				x[l],
				_mm_loadu_si128((const __m128i *)g[i + l]
							->rk[HG_GMAC_ROUNDS]));
	}
	for (; i < n; i++)
		mask[i] = aes256_block(g[i], j0[i]);
}

GMAC_PCLMUL void hg_gmac_tag_masked(const struct hg_gmac_key *g, int isa,
				    __m128i mask, const uint8_t *data,
				    size_t len, uint8_t *tag, const uint8_t *next)
{
	if (isa == HG_MAC_ISA_AVX512) {
		hg_gmac_tag_avx512(g, mask, data, len, tag, next);
		return;
	}
	const uint8_t(*hend)[16] = g->hpow + HG_GMAC_CHUNK;
	size_t full = len / 16, part = len % 16, t = part ? 2 : 1, pos = 0, k;
	struct hg_gmac_sum s;
	__m128i y = _mm_setzero_si128();

	/* y, the hash so far, joins each chunk (gmac_chunk) */
	while (full - pos + t > HG_GMAC_CHUNK) {
		k = full - pos < HG_GMAC_CHUNK ? full - pos : HG_GMAC_CHUNK;
		s.lo = s.mid = s.hi = _mm_setzero_si128();
		gmac_chunk(g, isa, y, data + 16 * pos, hend - k, k, &s,
			   next ? next + 16 * pos : NULL, pos == 0);
		y = ghash_reduce(s.lo, s.mid, s.hi);
		pos += k;
	}
	k = full - pos;
	s.lo = s.mid = s.hi = _mm_setzero_si128();
	if (k) {
		gmac_chunk(g, isa, y, data + 16 * pos, hend - k - t, k, &s,
			   next ? next + 16 * pos : NULL, pos == 0);
		y = _mm_setzero_si128();
	}
	if (part) {
		mul_add(_mm_xor_si128(y, partial_block(data, len, part)),
			_mm_loadu_si128((const __m128i *)hend[-2]), &s);
		y = _mm_setzero_si128();
	}
	/* the length block [8 len(A)]_64 || [0]_64, reflected */
	mul_add(_mm_xor_si128(y, _mm_set_epi64x((long long)((uint64_t)len * 8), 0)),
		_mm_loadu_si128((const __m128i *)hend[-1]), &s);
	y = ghash_reduce(s.lo, s.mid, s.hi);
	_mm_storeu_si128((__m128i *)tag, _mm_xor_si128(gmac_bswap(y), mask));
}
