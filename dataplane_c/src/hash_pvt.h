/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hash_pvt.h - the counter-based hash of the codec (docs/PROTOCOL.md
 * "Random streams and hashes").  Part of protocol version 1: every
 * implementation must produce the same bits, so only fixed-width unsigned
 * arithmetic modulo 2^64 is used.
 *
 *   mix64(z)        = splitmix64 finaliser
 *   hg_stream_key   = mix64(mix64(seed + domain) + worker)
 *   hg_hash(key, g) = mix64(key + (g + 1) * GOLDEN)
 *
 * g is the element's index in the tensor.  Rounding and NC streams use the
 * worker's id; the sketch and Bloom hashes use worker 0 (shared by all).
 */
#ifndef HOMAGG_HASH_PVT_H
#define HOMAGG_HASH_PVT_H

#include <stdint.h>

#include "homagg/mix.h"

#define HG_HASH_GOLDEN HG_MIX_GOLDEN

/* Stream domains: one per use, so the streams are independent. */
#define HG_DOM_ROUND 0x524F554E44000001ull  /* stochastic rounding */
#define HG_DOM_NC 0x4E41544E43000002ull     /* natural compression */
#define HG_DOM_SKETCH 0x534B455443480003ull /* count-sketch cells and signs */
#define HG_DOM_BLOOM 0x424C4F4F4D000004ull  /* Bloom filter probes */

static inline uint64_t hg_stream_key(uint64_t seed, uint64_t domain, uint32_t worker)
{
	return hg_mix64(hg_mix64(seed + domain) + (uint64_t)worker);
}

static inline uint64_t hg_hash(uint64_t key, uint64_t g)
{
	return hg_mix64(key + (g + 1) * HG_HASH_GOLDEN);
}

#endif /* HOMAGG_HASH_PVT_H */
