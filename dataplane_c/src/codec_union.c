/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec_union.c - the union method's values phase (docs/PROTOCOL.md
 * "union"): after lhc's meta and index phases every worker knows the
 * global candidates; each sends its quantised value at every candidate
 * (0 where it has none), the aggregator sums them (SUM32), and every
 * worker scatters the sums.  No sketch, no peeling, no fallback.
 *
 * Encode merges two sorted lists per block, the global candidates (from
 * hg_lhc_set_index) and this worker's non-zeros (from its scan), writing
 * every lane once.  Decode writes every element of the output once per
 * block: zeros, then the candidates' sums, while the block is in cache.
 * The vector paths (encode of a bitmap block, the decode scatter) are in
 * codec_union_avx512.c and codec_union_avx2.c, chosen at run time
 * (hg_codec_isa()).
 */
#include <errno.h>
#include <string.h>

#include "homagg/kernels.h"

#include "codec_lhc_pvt.h"

size_t hg_union_lanes(const struct hg_lhc *l)
{
	if (!l || l->state < LHC_INDEXED)
		return 0;
	return l->info.candidates;
}

/*
 * Lanes of one block, deterministic rounding: candidate j gets the value
 * of the next non-zero when their positions match.  Branch free: the
 * non-zero index i advances only on a match.  Returns the number of
 * non-zeros consumed (nz when every one is a candidate).
 */
static uint32_t merge_rne(const uint16_t *cand, uint32_t nc, const uint16_t *pos,
			  const float *v, uint32_t nz, double scale, uint8_t *out)
{
	uint32_t i = 0;

	for (uint32_t j = 0; j < nc; j++) {
		uint32_t ii = i < nz ? i : nz - 1;
		uint32_t m = (i < nz) & (pos[ii] == cand[j]);
		uint32_t q = (uint32_t)hg_rne((double)v[ii] * scale);

		hg_st_be32(out + 4 * (size_t)j, q & (0u - m));
		i += m;
	}
	return i;
}

/* The same with stochastic rounding (the element's own stream). */
static uint32_t merge_sr(const uint16_t *cand, uint32_t nc, const uint16_t *pos,
			 const float *v, uint32_t nz, double scale,
			 uint64_t rkey, uint64_t g0, uint8_t *out)
{
	uint32_t i = 0;

	for (uint32_t j = 0; j < nc; j++) {
		uint32_t q = 0;

		if (i < nz && pos[i] == cand[j]) {
			uint32_t u = (uint32_t)(hg_hash(rkey, g0 + pos[i]) >> 32);

			q = (uint32_t)hg_sr((double)v[i] * scale, u);
			i++;
		}
		hg_st_be32(out + 4 * (size_t)j, q);
	}
	return i;
}

int hg_union_encode(const struct hg_lhc *l, const struct hg_scan *s,
		    uint8_t *out_be32)
{
	uint64_t rkey;
	bool sto;
	int isa;

	if (!l || l->state < LHC_INDEXED || lhc_scan_matches(l, s) ||
	    (l->info.candidates && !out_be32))
		return -EINVAL;
	sto = l->p.flags & HG_F_STOCHASTIC;
	isa = sto ? HG_ISA_PORTABLE : hg_codec_isa();
	rkey = hg_stream_key(l->p.seed, HG_DOM_ROUND, l->p.worker);
	for (size_t b = 0; b < l->nb; b++) {
		const struct lhc_block *bk = &l->blk[b];
		const size_t o = s->off[b];
		const uint32_t nz = (uint32_t)(s->off[b + 1] - o);
		const uint16_t *cand = l->cand_pos + bk->cand_off;
		uint8_t *out = out_be32 + 4 * bk->cand_off;
		double scale;
		uint32_t used;

		if (!nz) {
			memset(out, 0, 4 * (size_t)bk->ncand);
			continue;
		}
		if (bk->kind == LHC_NONE ||
		    s->absmax[b] >= hg_code_limit_bits(l->gcodes[b]))
			return -ERANGE;
		scale = hg_pow2(hg_scale_shift(&l->p, l->gcodes[b]));
		if (isa == HG_ISA_AVX512 && bk->kind == LHC_BITMAP)
			used = hg_union_bitmap_avx512(
				l->gindex + bk->index_off,
				s->bitmap + b * (l->p.block / 8),
				(uint32_t)hg_block_len(&l->p, l->n, b),
				s->val + o, scale, bk->ncand, out);
		else if (isa == HG_ISA_AVX2 && bk->kind == LHC_BITMAP)
			used = hg_union_bitmap_avx2(l->gindex + bk->index_off,
						    s->bitmap + b * (l->p.block / 8),
						    (uint32_t)hg_block_len(&l->p,
									   l->n, b),
						    s->val + o, scale,
						    bk->ncand, out);
		else if (sto)
			used = merge_sr(cand, bk->ncand, s->pos + o, s->val + o,
					nz, scale, rkey,
					l->first + b * l->p.block, out);
		else
			used = merge_rne(cand, bk->ncand, s->pos + o,
					 s->val + o, nz, scale, out);
		if (used != nz)
			return -EPROTO;
	}
	return 0;
}

/*
 * A bitmap block with fewer candidates than one in SPARSE_DIV of its
 * elements is written as zeros at memset speed and then its sums at their
 * candidates' positions, one by one: the vector scatters (codec_union_*.c)
 * do every 8 or 16 elements' conversion and expansion whether they hold a
 * sum or not.  Both give the same bits.  AMD EPYC, avx2, two rounds: the
 * output of NCF's bucket shape (3.85 M elements, 2.7 % candidates)
 * 0.88 -> 0.27-0.30 ms; 2^24 at 5.2 % candidates 2.36-2.54 -> 2.30-2.43
 * ms (bound by the output's writes); at 11.5 % the vector path is as fast
 * or faster.
 */
#define SPARSE_DIV 16

void hg_decode_block(const struct hg_lhc *l, size_t b, const uint8_t *in,
		     bool be, int isa, float *yb)
{
	const struct lhc_block *bk = &l->blk[b];
	const size_t len = hg_block_len(&l->p, l->n, b);
	const uint16_t *cand = l->cand_pos + bk->cand_off;
	const bool sparse = (size_t)bk->ncand * SPARSE_DIV < len;
	double scale;

	if (!bk->ncand) {
		memset(yb, 0, len * sizeof(float));
		return;
	}
	scale = hg_pow2(-hg_scale_shift(&l->p, l->gcodes[b]));
	if (isa == HG_ISA_AVX512 && bk->kind == LHC_BITMAP && !sparse) {
		hg_scatter_bitmap(l->gindex + bk->index_off, (uint32_t)len, in,
				  be, scale, yb);
		return;
	}
	if (isa == HG_ISA_AVX2 && bk->kind == LHC_BITMAP && !sparse) {
		hg_scatter_bitmap_avx2(l->gindex + bk->index_off, (uint32_t)len,
				       in, bk->ncand, be, scale, yb);
		return;
	}
	memset(yb, 0, len * sizeof(float));
	for (uint32_t j = 0; j < bk->ncand; j++) {
		uint32_t v;

		memcpy(&v, in + 4 * (size_t)j, 4);
		v = be ? __builtin_bswap32(v) : v;
		yb[cand[j]] = (float)((double)(int32_t)v * scale);
	}
}

int hg_union_decode(const struct hg_lhc *l, const uint8_t *gvals_be32, float *y)
{
	int isa;

	if (!l || l->state < LHC_INDEXED || (l->n && !y) ||
	    (l->info.candidates && !gvals_be32))
		return -EINVAL;
	isa = hg_codec_isa();
	for (size_t b = 0; b < l->nb; b++) {
		const struct lhc_block *bk = &l->blk[b];

		hg_decode_block(l, b, gvals_be32 + 4 * bk->cand_off, true, isa,
				y + b * l->p.block);
		/* the candidates only: every other element is +0 */
		hg_divide_at(y + b * l->p.block, l->cand_pos + bk->cand_off,
			     bk->ncand, l->p.divisor);
	}
	return 0;
}
