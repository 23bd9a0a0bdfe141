/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Keys and MACs of authenticated jobs (homagg/auth.h): the KDF and BLAKE2b
 * on libsodium, AES-GMAC on the path of hg_mac_isa() (auth_gmac.c), UMAC
 * with NH in that path's form (auth_umac.c).
 *
 * Cost: one MAC pass over header + payload per frame checked or sent.
 * On the project's own paths (pclmul, avx2, avx512) auth_gmac_pvt.h and
 * docs/BENCHMARKS.md "AES-GMAC per path" have the cost.  On the portable
 * path AES-GMAC is
 * computed by libsodium (crypto_aead_aes256gcm: AES-NI and a
 * 4-block PCLMULQDQ GHASH, ~30 ns of fixed cost) for frames shorter than
 * HG_GMAC_EVP_MIN bytes and by OpenSSL's libcrypto (EVP AES-256-GCM, whose
 * GHASH of the additional data runs on VPCLMULQDQ where the CPU has it,
 * but costs ~400 ns per call) from there on: the same function, so the
 * choice is not on the wire.  Measured best of 7 in one run on the shared
 * development VM under load (Intel Xeon, AVX-512), ns per MAC:
 *   bytes      libsodium  libcrypto  BLAKE2b
 *   32         33         389        982
 *   1056       827        760        6301
 *   4128       2009       390        21059
 *   8224       3346       676        36880
 * docs/SWITCH.md "Authentication" has the engine's rates on this path.
 */

/* Frames of at least this many bytes (header + payload) go to libcrypto. */
#define HG_GMAC_EVP_MIN 2048
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <sodium.h>

#include "auth_pvt.h"
#include "homagg/client.h"
#include "homagg/codec.h"
#include "homagg/engine.h"
#include "homagg/wire.h"

#define KDF_CONTEXT "homaggv3"

_Static_assert(HG_AUTH_SECRET_LEN == crypto_kdf_KEYBYTES, "secret length");
/* The config structs spell the length out (cffi parses them). */
_Static_assert(sizeof(((struct hg_job_config *)0)->secret) == HG_AUTH_SECRET_LEN &&
		       sizeof(((struct hg_client_config *)0)->secret) ==
			       HG_AUTH_SECRET_LEN,
	       "secret fields");
_Static_assert(sizeof(KDF_CONTEXT) - 1 == crypto_kdf_CONTEXTBYTES, "KDF context");
_Static_assert(HG_MAC_LEN >= crypto_generichash_BYTES_MIN &&
		       HG_MAC_LEN <= crypto_generichash_BYTES_MAX,
	       "MAC length");
_Static_assert(HG_MAC_LEN == crypto_aead_aes256gcm_ABYTES, "GCM tag length");
_Static_assert(HG_AUTH_KEY_LEN == crypto_aead_aes256gcm_KEYBYTES, "GCM key");
_Static_assert(HG_AUTH_NONCE_LEN == crypto_aead_aes256gcm_NPUBBYTES, "GCM nonce");
_Static_assert(HG_AUTH_KEY_LEN >= crypto_generichash_KEYBYTES_MIN &&
		       HG_AUTH_KEY_LEN <= crypto_generichash_KEYBYTES_MAX,
	       "key length");

bool hg_auth_mac_available(uint32_t alg)
{
	if (sodium_init() < 0)
		return false;
	if (alg == HG_MAC_BLAKE2B)
		return true;
	if (alg == HG_MAC_AES_GMAC)
		return crypto_aead_aes256gcm_is_available() == 1;
	if (alg == HG_MAC_UMAC) {
		__builtin_cpu_init();
		return __builtin_cpu_supports("aes");
	}
	return false;
}

uint32_t hg_auth_default_mac(void)
{
	if (sodium_init() < 0)
		return 0;
	return hg_auth_mac_available(HG_MAC_UMAC) ? HG_MAC_UMAC : HG_MAC_BLAKE2B;
}

int hg_auth_derive_key(const uint8_t *secret, uint32_t job, uint32_t id,
		       uint8_t *key)
{
	if (!secret || !key ||
	    (id >= HG_MAX_WORKERS && id != HG_AUTH_KEY_AGGREGATOR))
		return -EINVAL;
	/* Idempotent and thread-safe; picks the fastest code for the CPU. */
	if (sodium_init() < 0)
		return -ENOTSUP;
	if (crypto_kdf_derive_from_key(key, HG_AUTH_KEY_LEN,
				       ((uint64_t)job << 32) | id, KDF_CONTEXT,
				       secret) != 0)
		return -EINVAL;
	return 0;
}

void hg_auth_nonce(const uint8_t *hdr, uint32_t dir, uint64_t counter, uint8_t *n)
{
	n[0] = hdr[23]; /* shard */
	n[1] = (uint8_t)dir;
	for (int i = 0; i < 6; i++) /* counter, low 48 bits, big-endian */
		n[2 + i] = (uint8_t)(counter >> (40 - 8 * i));
	memcpy(n + 8, hdr + 24, 4); /* incarnation as sent */
}

/*
 * GCM's pre-counter block J0 = hg_auth_nonce() || 0x00000001, made in a
 * register from the header (the nonce's bytes stored one by one and read
 * back as a vector would stall the store buffer on every frame).
 */
/* The nonce's first 8 bytes as a little-endian word: shard, dir, the
 * counter's 48 bits big-endian; *inc = its last 4, the incarnation. */
static inline uint64_t nonce_lo(const uint8_t *hdr, uint32_t dir,
				uint64_t counter, uint32_t *inc)
{
	memcpy(inc, hdr + 24, 4); /* incarnation as sent */
	return hdr[23] | (uint64_t)(uint8_t)dir << 8 |
	       __builtin_bswap64(counter << 16) << 16;
}

static inline __m128i gmac_j0(const uint8_t *hdr, uint32_t dir, uint64_t counter)
{
	uint32_t inc;
	uint64_t lo = nonce_lo(hdr, dir, counter, &inc);

	return _mm_set_epi64x((long long)(inc | 1ull << 56), (long long)lo);
}

/*
 * UMAC's NH on AVX2: on the avx2 and avx512 paths, and where the CPU has
 * AVX2 without the VPCLMULQDQ of the avx2 path (its default path is then
 * pclmul) unless HOMAGG_MAC_ISA forces a path; scalar otherwise.
 */
static bool umac_avx2(int isa)
{
	const char *v = getenv("HOMAGG_MAC_ISA");

	if (isa >= HG_MAC_ISA_AVX2)
		return true;
	__builtin_cpu_init();
	return (!v || !*v) && __builtin_cpu_supports("avx2");
}

int hg_mac_key_init(struct hg_mac_key *k, uint32_t alg, const uint8_t *key)
{
	if (!k || !key)
		return -EINVAL;
	memset(k, 0, sizeof(*k));
	if (!hg_auth_mac_available(alg))
		return -ENOTSUP;
	k->alg = alg;
	if (alg == HG_MAC_BLAKE2B) {
		memcpy(k->key, key, HG_AUTH_KEY_LEN);
		return 0;
	}
	k->isa = hg_mac_isa();
	if (k->isa < 0) { /* HOMAGG_MAC_ISA refused */
		int rc = k->isa;

		hg_mac_key_release(k);
		return rc;
	}
	if (alg == HG_MAC_UMAC) { /* the key's first 16 bytes */
		hg_umac_init(&k->umac, key, umac_avx2(k->isa));
		return 0;
	}
	if (k->isa != HG_MAC_ISA_PORTABLE) {
		hg_gmac_init(&k->gmac, key);
		return 0;
	}
	crypto_aead_aes256gcm_beforenm(&k->aes, key);
	k->evp = EVP_CIPHER_CTX_new();
	if (!k->evp ||
	    EVP_EncryptInit_ex(k->evp, EVP_aes_256_gcm(), NULL, key, NULL) != 1) {
		hg_mac_key_release(k);
		return -ENOMEM;
	}
	return 0;
}

void hg_mac_key_release(struct hg_mac_key *k)
{
	if (!k)
		return;
	if (k->evp)
		EVP_CIPHER_CTX_free(k->evp); /* wipes its key schedule */
	sodium_memzero(k, sizeof(*k));
}

int hg_mac_key_derive(struct hg_mac_key *k, uint32_t alg, const uint8_t *secret,
		      uint32_t job, uint32_t id)
{
	uint8_t key[HG_AUTH_KEY_LEN];
	int rc = hg_auth_derive_key(secret, job, id, key);

	if (!rc)
		rc = hg_mac_key_init(k, alg, key);
	sodium_memzero(key, sizeof(key));
	return rc;
}

/* mac = the AES-GCM tag under k's key of nonce, an empty plaintext and
 * data[0..len) as additional data, on k's path. */
static void gmac_tag(const struct hg_mac_key *k, const uint8_t *nonce,
		     const uint8_t *data, size_t len, uint8_t *mac)
{
	uint8_t none[1] = { 0 };
	unsigned long long maclen;

	if (k->isa != HG_MAC_ISA_PORTABLE) {
		uint8_t j0[16] = { 0 };

		memcpy(j0, nonce, HG_AUTH_NONCE_LEN);
		j0[15] = 1;
		hg_gmac_tag(&k->gmac, k->isa,
			    _mm_loadu_si128((const __m128i *)j0), data, len, mac);
		return;
	}
	if (len >= HG_GMAC_EVP_MIN && k->evp) {
		int n;

		/* cannot fail on a context made by hg_mac_key_init with a
		 * 12-byte nonce; a failure leaves a tag that verifies nothing */
		if (EVP_EncryptInit_ex(k->evp, NULL, NULL, NULL, nonce) != 1 ||
		    EVP_EncryptUpdate(k->evp, NULL, &n, data, (int)len) != 1 ||
		    EVP_EncryptFinal_ex(k->evp, none, &n) != 1 ||
		    EVP_CIPHER_CTX_ctrl(k->evp, EVP_CTRL_AEAD_GET_TAG,
					HG_MAC_LEN, mac) != 1)
			randombytes_buf(mac, HG_MAC_LEN);
		return;
	}
	crypto_aead_aes256gcm_encrypt_detached_afternm(none, mac, &maclen, none,
						       0, data, len, NULL,
						       nonce, &k->aes);
}

/* UMAC's pad block for a frame: hg_auth_nonce() || 0^32 made in a
 * register, as gmac_j0(), the nonce's lowest bit (the incarnation's) in
 * *half and cleared */
static inline __m128i umac_block(const uint8_t *hdr, uint32_t dir,
				 uint64_t counter, unsigned *half)
{
	uint32_t inc;
	uint64_t lo = nonce_lo(hdr, dir, counter, &inc);

	*half = inc >> 24 & 1;
	return _mm_set_epi64x((long long)(inc & ~(1u << 24)), (long long)lo);
}

/* A UMAC trailer (tag64 as x86 reads it, then 8 zero bytes) equals the
 * frame's 16 bytes at mac: all of them compared, in time independent of
 * where they differ, as crypto_verify_16() but without its call. */
static inline bool umac_trailer_ok(uint64_t tag64, const uint8_t *mac)
{
	uint64_t m0, m1;

	memcpy(&m0, mac, 8);
	memcpy(&m1, mac + 8, 8);
	return ((m0 ^ tag64) | m1) == 0;
}

void hg_mac_key_share(const struct hg_mac_key *k, const uint8_t *data,
		      size_t len, struct hg_mac_shared *s)
{
	s->k = NULL;
	if (k->alg != HG_MAC_UMAC || len < HG_HDR_LEN || len > HG_UMAC_MAX_LEN)
		return;
	hg_umac_share(&k->umac, data, len, &s->umac);
	s->k = k;
}

void hg_mac_key_sign_shared(const struct hg_mac_key *k,
			    const struct hg_mac_shared *s, uint32_t dir,
			    uint64_t counter, const uint8_t *data, size_t len,
			    uint8_t *mac)
{
	unsigned half;
	__m128i block;

	if (!s || s->k != k || s->umac.len != len || (counter >> 48)) {
		hg_mac_key_sign(k, dir, counter, data, len, mac);
		return;
	}
	block = umac_block(data, dir, counter, &half);
	hg_umac_tag_shared(&k->umac, &s->umac, block, half, data, mac);
}

void hg_mac_key_sign(const struct hg_mac_key *k, uint32_t dir, uint64_t counter,
		     const uint8_t *data, size_t len, uint8_t *mac)
{
	if (k->alg == HG_MAC_UMAC) {
		unsigned half;
		__m128i block;

		if (counter >> 48) { /* as AES-GMAC's */
			randombytes_buf(mac, HG_MAC_LEN);
			return;
		}
		block = umac_block(data, dir, counter, &half);
		hg_umac_tag_block(&k->umac, block, half, data, len, mac, NULL);
	} else if (k->alg == HG_MAC_AES_GMAC) {
		uint8_t nonce[HG_AUTH_NONCE_LEN];

		/* A counter past 48 bits would repeat a nonce: such a frame
		 * gets a MAC that verifies nothing (PROTOCOL.md "Nonce"). */
		if (counter >> 48) {
			randombytes_buf(mac, HG_MAC_LEN);
			return;
		}
		/* GMAC: nothing encrypted, everything authenticated */
		if (k->isa != HG_MAC_ISA_PORTABLE) {
			hg_gmac_tag(&k->gmac, k->isa,
				    gmac_j0(data, dir, counter), data, len, mac);
			return;
		}
		hg_auth_nonce(data, dir, counter, nonce);
		gmac_tag(k, nonce, data, len, mac);
	} else {
		crypto_generichash(mac, HG_MAC_LEN, data, len, k->key,
				   HG_AUTH_KEY_LEN);
	}
}

/* Whether a UMAC frame's trailer is its tag (next: the frame to prefetch
 * while this one's NH runs, or NULL).  Only for a counter below 2^48:
 * above, hg_mac_key_sign() gives a random MAC, which verifies nothing. */
static inline bool umac_check(const struct hg_mac_key *k, uint32_t dir,
			      uint64_t counter, const uint8_t *data, size_t len,
			      const uint8_t *mac, const uint8_t *next)
{
	unsigned half;
	__m128i block = umac_block(data, dir, counter, &half);

	return umac_trailer_ok(hg_umac_tag64(&k->umac, block, half, data, len, next),
			       mac);
}

bool hg_mac_key_check(const struct hg_mac_key *k, uint32_t dir, uint64_t counter,
		      const uint8_t *data, size_t len, const uint8_t *mac)
{
	uint8_t want[HG_MAC_LEN];

	if (k->alg == HG_MAC_UMAC && !(counter >> 48))
		return umac_check(k, dir, counter, data, len, mac, NULL);
	hg_mac_key_sign(k, dir, counter, data, len, want);
	return crypto_verify_16(want, mac) == 0;
}

/* Up to this many AES-GMAC requests share one hg_gmac_masks() call. */
#define CHECK_BATCH 32

/*
 * The requests on the project's own AES-GMAC paths, CHECK_BATCH at a time:
 * their E_K(J0) together (hg_gmac_masks), then each GHASH with the next
 * request's first lines and its key's powers of H prefetched (a frame from
 * the NIC, or a key of another worker, is not in this core's L1), and the
 * rest of the next request's data during the tag (hg_gmac_tag_masked).
 */
static void check_gmac_batch(uint32_t dir, struct hg_mac_req *const *q, uint32_t n)
{
	const struct hg_gmac_key *g[CHECK_BATCH];
	__m128i j0[CHECK_BATCH], mask[CHECK_BATCH];
	uint8_t want[HG_MAC_LEN];

	for (uint32_t i = 0; i < n; i++) {
		g[i] = &q[i]->k->gmac;
		j0[i] = gmac_j0(q[i]->data, dir, q[i]->counter);
	}
	hg_gmac_masks(g, j0, mask, n);
	for (uint32_t i = 0; i < n; i++) {
		const struct hg_mac_req *r = q[i];
		const uint8_t *next = NULL;

		if (i + 1 < n) {
			/* the powers the next tag reads (the table of its
			 * path, and avx2's Karatsuba rows): the last
			 * blocks + 2 */
			const struct hg_gmac_key *gn = g[i + 1];
			const uint8_t *end =
				(const uint8_t *)(q[i + 1]->k->isa == HG_MAC_ISA_AVX512 ?
							  gn->hnat + HG_GMAC_CHUNK :
							  gn->hpow + HG_GMAC_CHUNK);
			size_t hb = q[i + 1]->len + 32 < sizeof(g[0]->hpow) ?
					    q[i + 1]->len + 32 :
					    sizeof(g[0]->hpow);

			next = q[i + 1]->data;
			__builtin_prefetch(next, 0);
			__builtin_prefetch(next + 64, 0);
			__builtin_prefetch(next + 128, 0);
			for (size_t off = 64; off <= hb + 63; off += 64)
				__builtin_prefetch(end - off, 0);
			if (q[i + 1]->k->isa == HG_MAC_ISA_AVX2) /* Karatsuba's */
				for (size_t off = 64; off <= hb + 63; off += 64)
					__builtin_prefetch((const uint8_t *)(gn->hkar +
									     HG_GMAC_CHUNK) -
								   off,
							   0);
		}
		hg_gmac_tag_masked(g[i], r->k->isa, mask[i], r->data, r->len,
				   want, next);
		q[i]->ok = crypto_verify_16(want, r->mac) == 0;
	}
}

void hg_mac_key_check_burst(uint32_t dir, struct hg_mac_req *r, uint32_t n)
{
	struct hg_mac_req *q[CHECK_BATCH];
	uint32_t nq = 0;

	for (uint32_t i = 0; i < n; i++) {
		const struct hg_mac_key *k = r[i].k;

		if (k->alg == HG_MAC_UMAC && !(r[i].counter >> 48)) {
			/* the next frame prefetched while this one's NH runs:
			 * a frame from the NIC or another core is not in this
			 * core's caches, and its first use is its MAC */
			r[i].ok = umac_check(k, dir, r[i].counter, r[i].data,
					     r[i].len, r[i].mac,
					     i + 1 < n ? r[i + 1].data : NULL);
			continue;
		}
		if (k->alg != HG_MAC_AES_GMAC ||
		    k->isa == HG_MAC_ISA_PORTABLE || (r[i].counter >> 48)) {
			r[i].ok = hg_mac_key_check(k, dir, r[i].counter,
						   r[i].data, r[i].len, r[i].mac);
			continue;
		}
		q[nq++] = &r[i];
		if (nq == CHECK_BATCH) {
			check_gmac_batch(dir, q, nq);
			nq = 0;
		}
	}
	if (nq)
		check_gmac_batch(dir, q, nq);
}

/* *kp = a key of alg made from key for one call (the one-shot API
 * below), in sodium_malloc's aligned memory; 0 or as hg_mac_key_init().
 * temp_key_free() releases it, made or not. */
static int temp_key(struct hg_mac_key **kp, uint32_t alg, const uint8_t *key)
{
	*kp = NULL;
	if (sodium_init() < 0) /* sodium_malloc needs it first */
		return -ENOTSUP;
	*kp = sodium_malloc(sizeof(**kp)); /* wiped when freed */
	if (!*kp)
		return -ENOMEM;
	memset(*kp, 0, sizeof(**kp));
	return hg_mac_key_init(*kp, alg, key);
}

static void temp_key_free(struct hg_mac_key *k)
{
	if (!k)
		return;
	hg_mac_key_release(k);
	sodium_free(k);
}

int hg_auth_mac(uint32_t alg, const uint8_t *key, uint32_t dir,
		uint64_t counter, const uint8_t *data, size_t len, uint8_t *mac)
{
	struct hg_mac_key *k;
	int rc;

	if (!key || !mac || !data || len < HG_HDR_LEN)
		return -EINVAL;
	rc = temp_key(&k, alg, key);
	if (!rc)
		hg_mac_key_sign(k, dir, counter, data, len, mac);
	temp_key_free(k);
	return rc;
}

int hg_auth_gmac(const uint8_t *key, const uint8_t *nonce, const uint8_t *data,
		 size_t len, uint8_t *tag)
{
	struct hg_mac_key *k;
	int rc;

	if (!key || !nonce || !tag || (!data && len))
		return -EINVAL;
	rc = temp_key(&k, HG_MAC_AES_GMAC, key);
	if (!rc)
		gmac_tag(k, nonce, len ? data : (const uint8_t *)"", len, tag);
	temp_key_free(k);
	return rc;
}

int hg_auth_umac(const uint8_t *key, const uint8_t *nonce, size_t nonce_len,
		 const uint8_t *data, size_t len, uint8_t *tag)
{
	uint8_t key32[HG_AUTH_KEY_LEN] = { 0 }; /* UMAC reads the first 16 */
	struct hg_mac_key *k;
	int rc;

	if (!key || !nonce || !tag || (!data && len) || nonce_len < 1 ||
	    nonce_len > 16 || len > HG_UMAC_MAX_LEN)
		return -EINVAL;
	memcpy(key32, key, 16);
	rc = temp_key(&k, HG_MAC_UMAC, key32);
	sodium_memzero(key32, sizeof(key32));
	if (!rc)
		hg_umac_tag(&k->umac, nonce, nonce_len,
			    len ? data : (const uint8_t *)"", len, tag);
	temp_key_free(k);
	return rc;
}

bool hg_auth_verify(uint32_t alg, const uint8_t *key, uint32_t dir,
		    uint64_t counter, const uint8_t *data, size_t len,
		    const uint8_t *mac)
{
	uint8_t want[HG_MAC_LEN];

	if (!mac || hg_auth_mac(alg, key, dir, counter, data, len, want))
		return false;
	return crypto_verify_16(want, mac) == 0;
}

uint64_t hg_auth_counter_extend(uint64_t last, uint32_t c32)
{
	uint64_t c = (last & ~(uint64_t)UINT32_MAX) | c32;

	if (c + (1ull << 31) < last && c + (1ull << 32) > c)
		c += 1ull << 32;
	else if (c > last + (1ull << 31) && c >= (1ull << 32))
		c -= 1ull << 32;
	return c;
}

uint64_t hg_mac_track_counter(const struct hg_mac_track *t, const uint8_t *hdr)
{
	uint32_t inc = ((uint32_t)hdr[24] << 24) | ((uint32_t)hdr[25] << 16) |
		       ((uint32_t)hdr[26] << 8) | hdr[27];
	uint32_t c32 = ((uint32_t)hdr[28] << 24) | ((uint32_t)hdr[29] << 16) |
		       ((uint32_t)hdr[30] << 8) | hdr[31];
	uint64_t last = 0;

	if (t && t->incarnation == inc && t->epoch == hdr[2])
		last = t->last;
	return hg_auth_counter_extend(last, c32);
}

void hg_mac_track_update(struct hg_mac_track *t, const uint8_t *hdr, uint64_t ctr)
{
	uint32_t inc = ((uint32_t)hdr[24] << 24) | ((uint32_t)hdr[25] << 16) |
		       ((uint32_t)hdr[26] << 8) | hdr[27];

	if (t->incarnation != inc || t->epoch != hdr[2]) {
		t->incarnation = inc;
		t->epoch = hdr[2];
		t->last = ctr;
	} else if (ctr > t->last) {
		t->last = ctr;
	}
}

void hg_auth_wipe(void *p, size_t len)
{
	if (p && len)
		sodium_memzero(p, len);
}
