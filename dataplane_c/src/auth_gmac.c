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
		       __builtin_cpu_supports("avx512bw");
	default:
		return false;
	}
}

static int mac_isa_read(void)
{
	static const char *const names[] = { "portable", "pclmul", "avx2",
					     "avx512" };
	const char *v = getenv("HOMAGG_MAC_ISA");

	if (!v || !*v) {
		for (int isa = HG_MAC_ISA_AVX512; isa > HG_MAC_ISA_PORTABLE; isa--)
			if (mac_isa_cpu(isa))
				return isa;
		return HG_MAC_ISA_PORTABLE;
	}
	for (int isa = 0; isa < (int)(sizeof(names) / sizeof(names[0])); isa++)
		if (strcmp(v, names[isa]) == 0)
			return mac_isa_cpu(isa) ? isa : -ENOTSUP;
	return -EINVAL;
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
#define AES_ROUND_PAIR(i, rcon)                                              \
	do {                                                                  \
		a = aes_expand_step(a, _mm_shuffle_epi32(                     \
			_mm_aeskeygenassist_si128(b, rcon), 0xff));           \
		rk[i] = a;                                                    \
		if ((i) + 1 <= HG_GMAC_ROUNDS) {                              \
			b = aes_expand_step(b, _mm_shuffle_epi32(             \
				_mm_aeskeygenassist_si128(a, 0), 0xaa));      \
			rk[(i) + 1] = b;                                      \
		}                                                             \
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
	for (int r = 1; r < HG_GMAC_ROUNDS; r++)
		x = _mm_aesenc_si128(x, _mm_loadu_si128((const __m128i *)g->rk[r]));
	return _mm_aesenclast_si128(
		x, _mm_loadu_si128((const __m128i *)g->rk[HG_GMAC_ROUNDS]));
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
	for (int i = HG_GMAC_CHUNK - 1; i >= 0; i--) {  /* hpow[i] = H^(16-i) */
		_mm_storeu_si128((__m128i *)g->hpow[i], p);
		p = gf_mul(p, h);
	}
	/* the stack copies of the schedule and of H */
	hg_auth_wipe(rk, sizeof(rk));
	h = p = _mm_setzero_si128();
	__asm__ volatile("" : : "x"(h), "x"(p) : "memory");
}

GMAC_PCLMUL __m128i hg_gmac_blocks_pclmul(const struct hg_gmac_key *g,
					  __m128i y, const uint8_t *blocks,
					  size_t n)
{
	const uint8_t (*hp)[16] = g->hpow + HG_GMAC_CHUNK - n;
	__m128i lo = _mm_setzero_si128(), mid = lo, hi = lo;

	for (size_t i = 0; i < n; i++) {
		__m128i x = gmac_bswap(_mm_loadu_si128((const __m128i *)(blocks + 16 * i)));
		__m128i h = _mm_loadu_si128((const __m128i *)hp[i]);

		if (i == 0)
			x = _mm_xor_si128(x, y);
		lo = _mm_xor_si128(lo, _mm_clmulepi64_si128(x, h, 0x00));
		mid = _mm_xor_si128(mid, _mm_xor_si128(_mm_clmulepi64_si128(x, h, 0x01),
						       _mm_clmulepi64_si128(x, h, 0x10)));
		hi = _mm_xor_si128(hi, _mm_clmulepi64_si128(x, h, 0x11));
	}
	return ghash_reduce(lo, mid, hi);
}

GMAC_PCLMUL size_t hg_gmac_chunks_pclmul(const struct hg_gmac_key *g,
					 __m128i *y, const uint8_t *data,
					 size_t len)
{
	size_t done = 0;

	for (; done + 16 * HG_GMAC_CHUNK <= len; done += 16 * HG_GMAC_CHUNK)
		*y = hg_gmac_blocks_pclmul(g, *y, data + done, HG_GMAC_CHUNK);
	return done;
}

GMAC_PCLMUL void hg_gmac_tag(const struct hg_gmac_key *g, int isa,
			     const uint8_t *nonce, const uint8_t *data,
			     size_t len, uint8_t *tag)
{
	/* the tail: < 16 blocks of data, zero-padded, and the length block */
	uint8_t tail[(HG_GMAC_CHUNK + 1) * 16];
	__m128i y = _mm_setzero_si128(), j0;
	size_t done, rest, nb;
	uint64_t bits = (uint64_t)len * 8;

	if (isa == HG_MAC_ISA_AVX512)
		done = hg_gmac_chunks_avx512(g, &y, data, len);
	else if (isa == HG_MAC_ISA_AVX2)
		done = hg_gmac_chunks_avx2(g, &y, data, len);
	else
		done = hg_gmac_chunks_pclmul(g, &y, data, len);
	rest = len - done;
	nb = (rest + 15) / 16;
	memcpy(tail, data + done, rest);
	memset(tail + rest, 0, nb * 16 - rest + 16);
	for (int i = 0; i < 8; i++)     /* [8 len(A)]_64 || [0]_64 */
		tail[nb * 16 + i] = (uint8_t)(bits >> (56 - 8 * i));
	nb++;
	if (nb > HG_GMAC_CHUNK) {
		y = hg_gmac_blocks_pclmul(g, y, tail, HG_GMAC_CHUNK);
		y = hg_gmac_blocks_pclmul(g, y, tail + 16 * HG_GMAC_CHUNK,
					  nb - HG_GMAC_CHUNK);
	} else {
		y = hg_gmac_blocks_pclmul(g, y, tail, nb);
	}
	/* J0 = nonce || 0x00000001 */
	memcpy(tail, nonce, 12);
	tail[12] = tail[13] = tail[14] = 0;
	tail[15] = 1;
	j0 = aes256_block(g, _mm_loadu_si128((const __m128i *)tail));
	_mm_storeu_si128((__m128i *)tag, _mm_xor_si128(gmac_bswap(y), j0));
}
