/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Keys ready for the packet path: the AES-GMAC key schedule (and, on the
 * project's own paths, the powers of H) is made once per key, not per
 * frame, for the path of hg_mac_isa() at that moment: the project's own
 * (auth_gmac_pvt.h), or libsodium below HG_GMAC_EVP_MIN bytes and OpenSSL's
 * libcrypto from there on (auth.c says why).  A key is released (and
 * wiped) with hg_mac_key_release().
 */
#ifndef HOMAGG_AUTH_PVT_H
#define HOMAGG_AUTH_PVT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <sodium.h>

#include "auth_gmac_pvt.h"
#include "auth_umac_pvt.h"
#include "homagg/auth.h"

struct evp_cipher_ctx_st;

struct hg_mac_key {
	union {
		struct hg_gmac_key gmac; /* HG_MAC_AES_GMAC, own paths */
		struct hg_umac_key umac; /* HG_MAC_UMAC */
	};
	crypto_aead_aes256gcm_state aes; /* HG_MAC_AES_GMAC, portable */
	struct evp_cipher_ctx_st *evp;   /* HG_MAC_AES_GMAC, portable, long */
	uint8_t key[HG_AUTH_KEY_LEN];    /* HG_MAC_BLAKE2B */
	uint32_t alg;
	int isa; /* AES-GMAC and UMAC: HG_MAC_ISA_* */
};

/* k (zeroed or released) = key for alg.  0, -EINVAL, -ENOTSUP (alg
 * unknown or unavailable), -ENOMEM. */
int hg_mac_key_init(struct hg_mac_key *k, uint32_t alg, const uint8_t *key);
/* k = member id's key of job under secret. */
int hg_mac_key_derive(struct hg_mac_key *k, uint32_t alg, const uint8_t *secret,
		      uint32_t job, uint32_t id);
/* Free what k holds and wipe it (accepts a zeroed key). */
void hg_mac_key_release(struct hg_mac_key *k);
void hg_mac_key_sign(const struct hg_mac_key *k, uint32_t dir, uint64_t counter,
		     const uint8_t *data, size_t len, uint8_t *mac);
bool hg_mac_key_check(const struct hg_mac_key *k, uint32_t dir, uint64_t counter,
		      const uint8_t *data, size_t len, const uint8_t *mac);

/*
 * Replies that differ only in their header (an aggregator's unicast copies
 * of one result): what their MACs share, made once from the first copy
 * (hg_mac_key_share), then each copy's MAC (hg_mac_key_sign_shared), the
 * same bytes as hg_mac_key_sign().  UMAC only (auth_umac_pvt.h); other
 * algorithms sign each copy whole.
 */
struct hg_mac_shared {
	struct hg_umac_shared umac;
	const struct hg_mac_key *k; /* NULL: nothing shared yet */
};

/* s = the shared part of data[0..len) (header first) under k. */
void hg_mac_key_share(const struct hg_mac_key *k, const uint8_t *data,
		      size_t len, struct hg_mac_shared *s);
/* hg_mac_key_sign(k, ...) of data[0..len), whose bytes after the header
 * are those s was made from (s NULL or not made for k: signed whole). */
void hg_mac_key_sign_shared(const struct hg_mac_key *k,
			    const struct hg_mac_shared *s, uint32_t dir,
			    uint64_t counter, const uint8_t *data, size_t len,
			    uint8_t *mac);

/* One frame to check: hg_mac_key_check(k, dir, counter, data, len, mac). */
struct hg_mac_req {
	const struct hg_mac_key *k;
	uint64_t counter;
	const uint8_t *data;
	size_t len;
	const uint8_t *mac;
	bool ok; /* out */
};

/*
 * r[i].ok = hg_mac_key_check(r[i].k, dir, r[i].counter, ...) for i < n,
 * the same answers, computed together: on the project's own AES-GMAC paths
 * the E_K(J0) of up to 32 frames are pipelined through AES-NI and each
 * GHASH runs with the next frame's lines prefetched.
 */
void hg_mac_key_check_burst(uint32_t dir, struct hg_mac_req *r, uint32_t n);

/* Receiver state of one sender's MAC counter (PROTOCOL.md "Nonce"). */
struct hg_mac_track {
	uint64_t last;        /* greatest verified counter */
	uint32_t incarnation; /* of that sender life, 0 = none yet */
	uint8_t epoch;
};

/* The counter of a frame with header hdr (as sent) from a sender tracked
 * by t (NULL: none). */
uint64_t hg_mac_track_counter(const struct hg_mac_track *t, const uint8_t *hdr);
/* A frame with header hdr verified with counter ctr: remember it. */
void hg_mac_track_update(struct hg_mac_track *t, const uint8_t *hdr, uint64_t ctr);

struct hg_wire_addr;
struct hg_hdr;
/* hg_wire_build_mac() with a ready key k (NULL: no MAC). */
int hg_wire_build_keyed(uint8_t *f, size_t cap, const struct hg_wire_addr *src,
			const struct hg_wire_addr *dst, const struct hg_hdr *hdr,
			const uint8_t *payload, size_t payload_len,
			uint32_t flags, const struct hg_mac_key *k,
			uint32_t dir, uint64_t counter);

#endif /* HOMAGG_AUTH_PVT_H */
