/* SPDX-License-Identifier: Apache-2.0 */
/*
 * homagg/auth.h - per-worker authentication of HomAgg frames
 * (docs/PROTOCOL.md Part 2, "Authentication").
 *
 * A job's members share a 32-byte job secret.  Worker w's key is the
 * libsodium KDF subkey w of it (crypto_kdf_derive_from_key, context
 * "homaggv2"), the aggregator's key the subkey HG_AUTH_KEY_AGGREGATOR.  A
 * frame's MAC is keyed BLAKE2b with a 16-byte output (crypto_generichash)
 * over the HomAgg header as sent (HG_FLAG_AUTH set) and the payload; it
 * follows the payload.  The crypto is libsodium's; nothing here is
 * hand-written cryptography.
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
/* KDF subkey id of the aggregator's key (workers use their id 0..W-1). */
#define HG_AUTH_KEY_AGGREGATOR 65536

/*
 * key (HG_AUTH_KEY_LEN bytes) = subkey id of secret (HG_AUTH_SECRET_LEN
 * bytes): id is a worker id or HG_AUTH_KEY_AGGREGATOR.  Returns 0, -EINVAL
 * (NULL, or id neither a worker id nor the aggregator's), -ENOTSUP
 * (libsodium failed to initialise).
 */
int hg_auth_derive_key(const uint8_t *secret, uint32_t id, uint8_t *key);

/* mac (HG_MAC_LEN bytes) = keyed BLAKE2b-128 of data[0..len).  0 or -EINVAL. */
int hg_auth_mac(const uint8_t *key, const uint8_t *data, size_t len,
		uint8_t *mac);

/* Does mac verify for data[0..len) under key?  Constant-time compare. */
bool hg_auth_verify(const uint8_t *key, const uint8_t *data, size_t len,
		    const uint8_t *mac);

/* Overwrite p[0..len) with zeros in a way the compiler keeps (secrets). */
void hg_auth_wipe(void *p, size_t len);
/* cdef-end */

#ifdef __cplusplus
}
#endif

#endif /* HOMAGG_AUTH_H */
