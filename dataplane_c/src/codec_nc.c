/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec_nc.c - natural compression (C_nat) and natural dithering into NC8
 * codes (docs/PROTOCOL.md "NC8 and natural dithering").
 *
 * In fixed-point units v = |x| * 2^s_b (exact in float64, v < 2^(top-1)),
 * the representable magnitudes are 2^k units for k_min <= k <= top - 1,
 * coded m = top - k, and 0 (m = 0).  k_min = top - S with S the number of
 * levels (nc_levels, or top for plain C_nat; at most top).  Rounding is
 * unbiased and stochastic: between 2^k and 2^(k+1) round up iff
 * u / 2^32 < v / 2^k - 1; below 2^k_min round to 2^k_min iff
 * u / 2^32 < v / 2^k_min, else to 0.  u = top 32 bits of
 * hg_hash(hg_stream_key(seed, NC, worker), g).
 */
#include <errno.h>
#include <math.h>

#include "codec_pvt.h"

int hg_nc_top(const struct hg_params *p)
{
	return 31 - hg_log2_workers(p);
}

static inline uint8_t nc_code(float x, double scale, int top, int kmin, uint32_t u)
{
	double v = fabs((double)x) * scale, r = (double)u * 0x1p-32;
	uint8_t sign = x < 0.0f ? 0x80 : 0;
	int e, k;

	if (v == 0.0)
		return 0;
	if (v < ldexp(1.0, kmin)) {
		if (r < v * ldexp(1.0, -kmin))
			return (uint8_t)(sign | (top - kmin));
		return 0;
	}
	(void)frexp(v, &e);
	k = e - 1; /* 2^k <= v < 2^(k+1) */
	if (r < ldexp(v, -k) - 1.0)
		k++;
	return (uint8_t)(sign | (top - k));
}

int hg_nc_encode(const struct hg_params *p, const float *x, size_t n,
		 const int8_t *gcodes, uint8_t *codes)
{
	return hg_nc_encode_at(p, 0, x, n, gcodes, codes);
}

int hg_nc_encode_at(const struct hg_params *p, uint64_t first, const float *x,
		    size_t n, const int8_t *gcodes, uint8_t *codes)
{
	int rc = hg_params_check(p);
	int top, levels, kmin;
	uint64_t key;
	size_t nb;

	if (rc)
		return rc;
	if (n && (!x || !gcodes || !codes))
		return -EINVAL;
	top = hg_nc_top(p);
	levels = p->nc_levels == 0 || p->nc_levels > (uint32_t)top ?
			 top :
			 (int)p->nc_levels;
	kmin = top - levels;
	key = hg_stream_key(p->seed, HG_DOM_NC, p->worker);
	nb = hg_nblocks(p, n);
	for (size_t b = 0; b < nb; b++) {
		size_t len = hg_block_len(p, n, b), g0 = b * p->block;
		const uint32_t lim = hg_code_limit_bits(gcodes[b]);
		const double scale = hg_pow2(hg_scale_shift(p, gcodes[b]));

		for (size_t i = 0; i < len; i++) {
			const float xi = x[g0 + i];

			if (hg_abs_bits(xi) >= lim)
				return -ERANGE;
			if (hg_abs_bits(xi) == 0) {
				codes[g0 + i] = 0;
				continue;
			}
			codes[g0 + i] = nc_code(xi, scale, top, kmin,
						(uint32_t)(hg_hash(key,
								   first + g0 + i) >>
							   32));
		}
	}
	return 0;
}
