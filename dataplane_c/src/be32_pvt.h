/* SPDX-License-Identifier: Apache-2.0 */
/*
 * be32_pvt.h - big-endian int32 lanes (the wire's) loaded and stored at
 * any alignment; shared by the codec, the kernels and the wire helpers.
 */
#ifndef HOMAGG_BE32_PVT_H
#define HOMAGG_BE32_PVT_H

#include <stdint.h>
#include <string.h>

static inline uint32_t hg_ld_be32(const uint8_t *p)
{
	uint32_t v;

	memcpy(&v, p, 4);
	return __builtin_bswap32(v);
}

static inline void hg_st_be32(uint8_t *p, uint32_t v)
{
	v = __builtin_bswap32(v);
	memcpy(p, &v, 4);
}

#endif /* HOMAGG_BE32_PVT_H */
