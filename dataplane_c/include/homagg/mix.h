/* SPDX-License-Identifier: Apache-2.0 */
/*
 * homagg/mix.h - the one 64-bit mixer of the project: the splitmix64
 * finaliser (hg_mix64, part of the protocol's hashes: hash_pvt.h) and the
 * splitmix64 generator built on it (hg_splitmix64: seeded fault streams of
 * the NIC model, job tokens of the simulated cluster, the tools).  Header
 * only; fixed-width unsigned arithmetic modulo 2^64, the same bits on every
 * platform.
 */
#ifndef HOMAGG_MIX_H
#define HOMAGG_MIX_H

#include <stdint.h>

#define HG_MIX_GOLDEN 0x9E3779B97F4A7C15ull

static inline uint64_t hg_mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* The next value of the splitmix64 stream whose state is *state. */
static inline uint64_t hg_splitmix64(uint64_t *state)
{
	return hg_mix64(*state += HG_MIX_GOLDEN);
}

#endif /* HOMAGG_MIX_H */
