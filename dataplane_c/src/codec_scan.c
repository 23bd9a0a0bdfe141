/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec_scan.c - the one-pass encode (homagg/codec.h "hg_scan"): a single
 * read of the float32 gradient yields the exponent codes and non-zero
 * counts of the meta phase, the local non-zero bitmap (the lhc index of a
 * bitmap block, as it travels) and a compact list of the non-zero elements
 * (block-relative position and value).  The index, sketch and union phases
 * then read only the non-zeros (5% of the tensor at the benchmark's
 * density) instead of the whole tensor again.  The AVX-512 and AVX2 paths
 * of the pass are in codec_scan_avx512.c and codec_scan_avx2.c, chosen at
 * run time (hg_codec_isa()).
 *
 * Same codes and counts as hg_exp_nnz_encode, same index bytes, sketch
 * cells and values as the tensor-reading functions: tests compare them on
 * random inputs (tests/test_codec_union.py).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "homagg/kernels.h"

#include "codec_pvt.h"

/* Whole 16-element vectors are stored past the last non-zero. */
#define SCAN_SLACK 16

struct hg_scan *hg_scan_create(void)
{
	return calloc(1, sizeof(struct hg_scan));
}

void hg_scan_destroy(struct hg_scan *s)
{
	if (!s)
		return;
	free(s->off);
	free(s->absmax);
	free(s->pos);
	free(s->val);
	free(s->bitmap);
	free(s);
}

size_t hg_scan_nonzeros(const struct hg_scan *s)
{
	if (!s || !s->valid)
		return 0;
	return s->off[s->nb];
}

void hg_scan_view(const struct hg_scan *s, size_t b0, size_t nb, size_t n,
		  struct hg_scan *view)
{
	*view = *s;
	view->n = n;
	view->nb = nb;
	/* off[] indexes pos[] / val[] of the whole scan: the view's blocks
	 * keep their entries there */
	view->off = s->off + b0;
	view->absmax = s->absmax + b0;
	view->bitmap = s->bitmap + b0 * (s->block / 8);
	view->cap = view->nb_cap = view->bm_cap = 0; /* it owns nothing */
}

/* pos and val share one capacity. */
static int reserve_nz(struct hg_scan *s, size_t need)
{
	size_t c = s->cap ? s->cap : 4096;
	uint16_t *np;
	float *nv;

	if (need <= s->cap)
		return 0;
	while (c < need)
		c *= 2;
	np = realloc(s->pos, c * sizeof(*np));
	if (!np)
		return -ENOMEM;
	s->pos = np;
	nv = realloc(s->val, c * sizeof(*nv));
	if (!nv)
		return -ENOMEM;
	s->val = nv;
	s->cap = c;
	return 0;
}

static int reserve_blocks(struct hg_scan *s, size_t nb, size_t bm_bytes)
{
	if (nb + 1 > s->nb_cap) {
		size_t *o = realloc(s->off, (nb + 1) * sizeof(*o));
		uint32_t *a;

		if (!o)
			return -ENOMEM;
		s->off = o;
		a = realloc(s->absmax, (nb + 1) * sizeof(*a));
		if (!a)
			return -ENOMEM;
		s->absmax = a;
		s->nb_cap = nb + 1;
	}
	if (bm_bytes + 8 > s->bm_cap) {
		uint8_t *m = realloc(s->bitmap, bm_bytes + 8);

		if (!m)
			return -ENOMEM;
		s->bitmap = m;
		s->bm_cap = bm_bytes + 8;
	}
	return 0;
}

/*
 * Elements i0 <= i < len of a block: positions and values of the non-zeros
 * appended at pos / val (branch free: every element is stored, the count
 * advances only for non-zeros), bits into bm (bit i of the block at byte
 * i / 8, bytes from i0 / 8 on cleared first), absolute-value bits max-ed
 * into *amax.  i0 is a multiple of 8.
 */
static uint32_t scan_tail(const float *xb, uint32_t i0, uint32_t len,
			  uint16_t *pos, float *val, uint8_t *bm, uint32_t *amax)
{
	uint32_t c = 0, mx = *amax;

	memset(bm + i0 / 8, 0, (len - i0 + 7) / 8);
	for (uint32_t i = i0; i < len; i++) {
		uint32_t a = hg_abs_bits(xb[i]);
		uint32_t nz = a != 0;

		pos[c] = (uint16_t)i;
		val[c] = xb[i];
		c += nz;
		bm[i >> 3] |= (uint8_t)(nz << (i & 7));
		mx = a > mx ? a : mx;
	}
	*amax = mx;
	return c;
}

int hg_scan_encode(struct hg_scan *s, const struct hg_params *p, const float *x,
		   size_t n, int8_t *codes, uint8_t *counts_be32, size_t *bad_index)
{
	int rc = hg_params_check(p);
	size_t nb, total = 0;
	int isa;

	if (!s)
		return -EINVAL;
	s->valid = false;
	if (rc)
		return rc;
	if (n && !x)
		return -EINVAL;
	nb = hg_nblocks(p, n);
	rc = reserve_blocks(s, nb, (n + 7) / 8);
	if (rc)
		return rc;
	s->n = n;
	s->block = p->block;
	s->nb = nb;
	isa = hg_codec_isa();
	for (size_t b = 0; b < nb; b++) {
		uint32_t len = (uint32_t)hg_block_len(p, n, b);
		const float *xb = x + b * p->block;
		uint8_t *bm = s->bitmap + b * (p->block / 8);
		uint32_t amax = 0, c = 0, i0 = 0;

		rc = reserve_nz(s, total + len + SCAN_SLACK);
		if (rc)
			return rc;
		s->off[b] = total;
		if (isa == HG_ISA_AVX512) {
			i0 = len & ~15u;
			c = hg_scan_avx512(xb, i0, s->pos + total,
					   s->val + total, bm, &amax);
		} else if (isa == HG_ISA_AVX2) {
			i0 = len & ~7u;
			c = hg_scan_avx2(xb, i0, s->pos + total, s->val + total,
					 bm, &amax);
		}
		c += scan_tail(xb, i0, len, s->pos + total + c,
			       s->val + total + c, bm, &amax);
		if (amax >= 0x7F800000u) {
			if (bad_index) {
				size_t i = 0;

				while (hg_abs_bits(xb[i]) < 0x7F800000u)
					i++;
				*bad_index = b * p->block + i;
			}
			return -EDOM;
		}
		s->absmax[b] = amax;
		if (codes)
			codes[b] = hg_code_of_absmax(amax);
		if (counts_be32)
			hg_st_be32(counts_be32 + 4 * b, c);
		total += c;
	}
	s->off[nb] = total;
	s->valid = true;
	return 0;
}
