/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: the codec's decode paths on hostile global buffers, as
 * a worker receives them from the aggregator.  The input is
 *
 *   W-1 (1 byte) | block / 64 - 1 (bits 0-5; bit 6: split-block indexes
 *   by a cost model) | n (2 bytes, big-endian) |
 *   flags (1 byte) | then a stream of bytes consumed in order by:
 *   global codes (nb bytes), global counts (4 nb), global index
 *   (index_bytes), union values (4 x candidates), sketch cells
 *   (4 x sketch_lanes), fallback values (4 x fallback_lanes), and this
 *   worker's gradient (4 n bytes, float32).
 *
 * Once the stream runs out, the rest reads as zeros.  Every call must
 * return 0 or a negative errno, never crash, read or write out of bounds
 * (ASan) or leak: a hostile index only makes more candidates, hostile cells
 * give -EPROTO, hostile values decode to some numbers; a gradient
 * inconsistent with the global codes or index gives -ERANGE or -EPROTO.
 *
 * Seeds (corpus_codec/): the consistent global state of small allreduces
 * (bitmap and Bloom blocks, stochastic rounding, W = 2..8) written by the
 * codec itself in this layout, and one with a flipped index byte.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "homagg/codec.h"

struct stream {
	const uint8_t *p;
	size_t left;
};

/* The next len bytes into a new buffer (zeros past the input's end). */
static void *take(struct stream *s, size_t len)
{
	uint8_t *b = calloc(len ? len : 1, 1);
	size_t k = len < s->left ? len : s->left;

	if (!b)
		abort();
	memcpy(b, s->p, k);
	s->p += k;
	s->left -= k;
	return b;
}

static void check_rc(int rc)
{
	if (rc > 0 || (rc < 0 && rc != -EINVAL && rc != -ERANGE &&
		       rc != -EPROTO && rc != -EDOM && rc != -ENOMEM))
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct stream s = { data, size };
	struct hg_params p = { 0 };
	struct hg_lhc_info info;
	struct hg_scan *scan;
	struct hg_lhc *l;
	uint8_t *gindex, *gvals, *cells, *fb, *counts_be32;
	int8_t *gcodes;
	float *x, *y;
	size_t n, nb;
	int rc;

	if (size < 5)
		return 0;
	p.workers = (uint32_t)data[0] + 1;
	p.block = 64 * ((uint32_t)(data[1] & 63) + 1);
	if (data[1] & 64) {
		/* a cost model under which every indexed block takes a
		 * split-block filter (version 3) */
		p.cost.link_mbit = 1000000;
		p.cost.bitmap_ps = HG_COST_MAX_ELEM_PS;
		p.cost.probe_ps = HG_COST_MAX_ELEM_PS;
		p.cost.sbbf_ps = 1;
	}
	n = ((size_t)data[2] << 8 | data[3]) % 16384;
	p.flags = data[4] & HG_F_STOCHASTIC;
	p.worker = data[4] >> 1 < p.workers ? data[4] >> 1 : 0;
	s.p += 5;
	s.left -= 5;
	nb = hg_nblocks(&p, n);

	gcodes = take(&s, nb);
	counts_be32 = take(&s, 4 * nb);
	rc = hg_auto_choose(&p, n, gcodes, counts_be32);
	if (rc != HG_M_DENSE && rc != HG_M_BLOCKS && rc != HG_M_UNION)
		abort();
	l = hg_lhc_create(&p, n, gcodes, counts_be32);
	if (!l)
		goto out_codes;
	hg_lhc_get_info(l, &info);
	gindex = take(&s, info.index_bytes);
	rc = hg_lhc_set_index(l, gindex);
	check_rc(rc);
	y = malloc((n ? n : 1) * sizeof(float));
	x = take(&s, 0);
	if (!y)
		abort();
	if (rc == 0) {
		hg_lhc_get_info(l, &info);
		if (hg_union_lanes(l) != info.candidates || info.candidates > n)
			abort();
		rc = hg_auto_choose_indexed(l);
		if (rc != HG_M_DENSE && rc != HG_M_BLOCKS && rc != HG_M_UNION)
			abort();
		gvals = take(&s, 4 * info.candidates);
		check_rc(hg_union_decode(l, gvals, y));
		cells = take(&s, 4 * info.sketch_lanes);
		rc = hg_lhc_peel(l, cells);
		check_rc(rc);
		if (rc == 0) {
			hg_lhc_get_info(l, &info);
			fb = take(&s, 4 * info.fallback_lanes);
			check_rc(hg_lhc_decode(l, fb, y));
			free(fb);
		}
		/* this worker's gradient against the (hostile) global state */
		free(x);
		x = take(&s, 4 * n);
		for (size_t i = 0; i < n; i++)
			if (!isfinite(x[i]))
				x[i] = 0.0f;
		scan = hg_scan_create();
		if (!scan)
			abort();
		if (hg_scan_encode(scan, &p, x, n, NULL, NULL, NULL) == 0) {
			uint8_t *out = malloc(4 * info.candidates + 4);
			uint8_t *idx = malloc(info.index_bytes + 1);

			if (!out || !idx)
				abort();
			check_rc(hg_union_encode(l, scan, out));
			check_rc(hg_lhc_index_encode_scan(l, scan, idx));
			free(out);
			free(idx);
		}
		hg_scan_destroy(scan);
		free(cells);
		free(gvals);
	}
	free(x);
	free(y);
	free(gindex);
	hg_lhc_destroy(l);
out_codes:
	free(gcodes);
	free(counts_be32);
	return 0;
}
