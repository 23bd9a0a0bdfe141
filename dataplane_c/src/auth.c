/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Keys and MACs of authenticated jobs (homagg/auth.h), on libsodium.
 *
 * Cost: one keyed BLAKE2b pass over header + payload per frame checked or
 * sent; docs/SWITCH.md "Authentication" has the measured rates.
 */
#include <errno.h>
#include <string.h>

#include <sodium.h>

#include "homagg/auth.h"
#include "homagg/client.h"
#include "homagg/codec.h"
#include "homagg/engine.h"
#include "homagg/wire.h"

#define KDF_CONTEXT "homaggv2"

_Static_assert(HG_AUTH_SECRET_LEN == crypto_kdf_KEYBYTES, "secret length");
/* The config structs spell the length out (cffi parses them). */
_Static_assert(sizeof(((struct hg_job_config *)0)->secret) == HG_AUTH_SECRET_LEN &&
	       sizeof(((struct hg_client_config *)0)->secret) == HG_AUTH_SECRET_LEN,
	       "secret fields");
_Static_assert(sizeof(KDF_CONTEXT) - 1 == crypto_kdf_CONTEXTBYTES, "KDF context");
_Static_assert(HG_MAC_LEN >= crypto_generichash_BYTES_MIN &&
	       HG_MAC_LEN <= crypto_generichash_BYTES_MAX, "MAC length");
_Static_assert(HG_AUTH_KEY_LEN >= crypto_generichash_KEYBYTES_MIN &&
	       HG_AUTH_KEY_LEN <= crypto_generichash_KEYBYTES_MAX, "key length");

int hg_auth_derive_key(const uint8_t *secret, uint32_t id, uint8_t *key)
{
	if (!secret || !key ||
	    (id >= HG_MAX_WORKERS && id != HG_AUTH_KEY_AGGREGATOR))
		return -EINVAL;
	/* Idempotent and thread-safe; picks the fastest BLAKE2b for the CPU. */
	if (sodium_init() < 0)
		return -ENOTSUP;
	if (crypto_kdf_derive_from_key(key, HG_AUTH_KEY_LEN, id, KDF_CONTEXT,
				       secret) != 0)
		return -EINVAL;
	return 0;
}

int hg_auth_mac(const uint8_t *key, const uint8_t *data, size_t len,
		uint8_t *mac)
{
	if (!key || !mac || (len && !data))
		return -EINVAL;
	crypto_generichash(mac, HG_MAC_LEN, data, len, key, HG_AUTH_KEY_LEN);
	return 0;
}

bool hg_auth_verify(const uint8_t *key, const uint8_t *data, size_t len,
		    const uint8_t *mac)
{
	uint8_t want[HG_MAC_LEN];

	if (!key || !mac || (len && !data))
		return false;
	crypto_generichash(want, HG_MAC_LEN, data, len, key, HG_AUTH_KEY_LEN);
	return crypto_verify_16(want, mac) == 0;
}

void hg_auth_wipe(void *p, size_t len)
{
	if (p && len)
		sodium_memzero(p, len);
}
