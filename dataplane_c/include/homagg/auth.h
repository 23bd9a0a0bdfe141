/* SPDX-License-Identifier: Apache-2.0 */
/*
 * homagg/auth.h - per-worker authentication of HomAgg frames
 * (docs/PROTOCOL.md Part 2, "Authentication").
 *
 * A job's members share a 32-byte secret per key epoch.  Member m's key is
 * the libsodium KDF subkey job * 2^32 + m of it (crypto_kdf_derive_from_key,
 * context "homaggv3"): m is a worker id, or HG_AUTH_KEY_AGGREGATOR for the
 * aggregator's key.  A frame's 16-byte MAC follows the payload and covers
 * the HomAgg header as sent (HG_FLAG_AUTH, the key epoch and the MAC
 * counter set) and the payload, with the job's algorithm: keyed BLAKE2b
 * (crypto_generichash) or AES-GMAC (crypto_aead_aes256gcm, empty
 * plaintext, header + payload as additional data) under the nonce of
 * hg_auth_nonce().  The KDF and BLAKE2b are libsodium's; AES-GMAC is the
 * project's own on AES-NI and (V)PCLMULQDQ (auth_gmac*.c, one path per ISA,
 * hg_mac_isa()), or libsodium's and OpenSSL's on the "portable" path: the
 * same tag bytes on every path.
 */
#ifndef HOMAGG_AUTH_H
#define HOMAGG_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cdef-begin */
#define HG_AUTH_SECRET_LEN 32
#define HG_AUTH_KEY_LEN 32
#define HG_AUTH_NONCE_LEN 12
/* KDF member id of the aggregator's key (workers use their id 0..W-1). */
#define HG_AUTH_KEY_AGGREGATOR 65536

/* MAC algorithms (hg_job_config.mac, hg_client_config.mac); 0 = the
 * default of this host, hg_auth_default_mac(). */
#define HG_MAC_BLAKE2B 1
#define HG_MAC_AES_GMAC 2
#define HG_MAC_UMAC 3

/* Nonce directions: towards an aggregator, or an aggregator's reply. */
#define HG_AUTH_DIR_REQUEST 0
#define HG_AUTH_DIR_REPLY 1

/* The AES-GMAC paths (HOMAGG_MAC_ISA=portable|pclmul|avx2|avx512):
 * libsodium and OpenSSL; the project's own on xmm PCLMULQDQ, on ymm
 * VPCLMULQDQ (AVX2), on zmm VPCLMULQDQ (AVX-512 F and BW). */
#define HG_MAC_ISA_PORTABLE 0
#define HG_MAC_ISA_PCLMUL 1
#define HG_MAC_ISA_AVX2 2
#define HG_MAC_ISA_AVX512 3

/*
 * The AES-GMAC path of this process: HOMAGG_MAC_ISA read at the first
 * call (unset or empty: the best this CPU has), kept until
 * hg_mac_isa_reload().  A key takes the path of the moment it is made.
 * Returns HG_MAC_ISA_*, -EINVAL (the variable names no path) or -ENOTSUP
 * (the CPU lacks that path's instructions).
 */
int hg_mac_isa(void);
/* Read HOMAGG_MAC_ISA again (tests); returns as hg_mac_isa(). */
int hg_mac_isa_reload(void);
/* Does this CPU have the instructions of AES-GMAC path isa? */
bool hg_mac_isa_available(int isa);
/* "portable", "pclmul", "avx2", "avx512"; "?" for anything else. */
const char *hg_mac_isa_name(int isa);

/* Can this host compute MAC algorithm alg (AES-GMAC: AES-NI and PCLMUL;
 * UMAC: AES-NI)? */
bool hg_auth_mac_available(uint32_t alg);

/* HG_MAC_UMAC where available, else HG_MAC_BLAKE2B; 0 when libsodium
 * fails to initialise. */
uint32_t hg_auth_default_mac(void);

/*
 * key (HG_AUTH_KEY_LEN bytes) = member id's key of job under secret
 * (HG_AUTH_SECRET_LEN bytes): id is a worker id or HG_AUTH_KEY_AGGREGATOR.
 * Returns 0, -EINVAL (NULL, or id neither a worker id nor the
 * aggregator's), -ENOTSUP (libsodium failed to initialise).
 */
int hg_auth_derive_key(const uint8_t *secret, uint32_t job, uint32_t id,
		       uint8_t *key);

/*
 * The AES-GMAC nonce (HG_AUTH_NONCE_LEN bytes) of a frame whose HomAgg
 * header (as sent, HG_HDR_LEN bytes) is hdr, sent in direction dir with
 * the full MAC counter counter: shard, dir, the counter's low 48 bits
 * (big-endian), the header's incarnation.
 */
void hg_auth_nonce(const uint8_t *hdr, uint32_t dir, uint64_t counter,
		   uint8_t *nonce);

/*
 * mac (HG_MAC_LEN bytes) = the MAC of algorithm alg under key of
 * data[0..len), which starts with the HomAgg header (len >= HG_HDR_LEN
 * for AES-GMAC and UMAC; dir and counter make their nonce, BLAKE2b
 * ignores them).  0, -EINVAL (NULL, short data, or AES-GMAC or UMAC with
 * HOMAGG_MAC_ISA naming no path), -ENOTSUP (alg unknown or unavailable,
 * or a path the CPU lacks), -ENOMEM.
 */
int hg_auth_mac(uint32_t alg, const uint8_t *key, uint32_t dir,
		uint64_t counter, const uint8_t *data, size_t len, uint8_t *mac);

/*
 * tag (HG_MAC_LEN bytes) = the AES-256-GCM tag under key of the 12-byte
 * nonce, an empty plaintext and data[0..len) as additional data, on the
 * path of hg_mac_isa(): the primitive under hg_auth_mac's AES-GMAC, for
 * known-answer tests.  0, -EINVAL (NULL; HOMAGG_MAC_ISA names no path),
 * -ENOTSUP (no AES-GMAC on this CPU or on the forced path), -ENOMEM.
 */
int hg_auth_gmac(const uint8_t *key, const uint8_t *nonce, const uint8_t *data,
		 size_t len, uint8_t *tag);

/*
 * tag (HG_MAC_LEN bytes) = RFC 4418's UMAC-64 (UMAC-AES-128, 8-byte tag)
 * under the 16-byte key of data[0..len) with a nonce of nonce_len (1..16)
 * bytes, then 8 zero bytes (the frame trailer's form), NH on AVX2 on the
 * avx2 and avx512 paths of hg_mac_isa() and wherever the CPU has AVX2 with
 * HOMAGG_MAC_ISA unset, else scalar: the primitive under hg_auth_mac's UMAC, for known-answer
 * tests.  0, -EINVAL (NULL, a nonce length outside 1..16, len over 2^24,
 * or HOMAGG_MAC_ISA naming no path), -ENOTSUP (no AES-NI, or a path the
 * CPU lacks), -ENOMEM.
 */
int hg_auth_umac(const uint8_t *key, const uint8_t *nonce, size_t nonce_len,
		 const uint8_t *data, size_t len, uint8_t *tag);

/* Does mac verify as hg_auth_mac's?  Constant-time compare. */
bool hg_auth_verify(uint32_t alg, const uint8_t *key, uint32_t dir,
		    uint64_t counter, const uint8_t *data, size_t len,
		    const uint8_t *mac);

/* The full MAC counter a receiver takes for the 32 bits c32 of a frame:
 * the value with low bits c32 nearest to last (the greatest verified from
 * that sender, incarnation and epoch; 0 before the first). */
uint64_t hg_auth_counter_extend(uint64_t last, uint32_t c32);

/* Overwrite p[0..len) with zeros in a way the compiler keeps (secrets). */
void hg_auth_wipe(void *p, size_t len);
/* cdef-end */

#ifdef __cplusplus
}
#endif

#endif /* HOMAGG_AUTH_H */
