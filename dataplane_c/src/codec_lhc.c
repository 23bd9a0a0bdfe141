/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec_lhc.c - the lhc method: per-block index (bitmap or Bloom filter),
 * count sketch, peeling, fallback; and auto's choice (docs/PROTOCOL.md
 * "Index", "Count sketch", "Peeling", "Fallback", "auto").
 *
 * Every rule that decides a layout (bitmap or Bloom, Bloom size, sketch
 * size) uses integer arithmetic only, so all workers on all platforms
 * derive the same layout from the same global exponents and counts.
 *
 * The vector paths are in codec_lhc_avx2.c and codec_lhc_avx512.c, chosen
 * here at run time (hg_codec_isa(): a loop with no AVX-512 form takes its
 * AVX2 one on the avx512 path); each gives the same bits as the portable
 * code here.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "homagg/kernels.h"

#include "codec_lhc_pvt.h"
#include "prefetch_pvt.h"

/* The cost model's exact integers: products of 64-bit terms. */
__extension__ typedef unsigned __int128 hg_u128;

/*
 * Bloom filter options (protocol constants): bits per counted element,
 * probes, and the expected false-positive rate (1 - e^(-k/bpe))^k scaled
 * by 2^20 and rounded.
 */
static const struct {
	uint32_t bpe, k, fp_q20;
} bloom_opts[] = {
	{ 8, 6, 22625 }, { 12, 8, 3295 }, { 16, 8, 602 },
	{ 20, 8, 146 },  { 24, 8, 44 },
};
#define N_BLOOM_OPTS (sizeof(bloom_opts) / sizeof(bloom_opts[0]))

/*
 * Split-block Bloom options 5-9 (protocol constants, version 3): bits per
 * counted element and the expected false-positive rate scaled by 2^20 (a
 * non-member's block of Poisson(256 / bpe) members has its eight bits
 * set).  Only a cost model with sbbf_ps > 0 considers them.
 */
static const struct {
	uint32_t bpe, fp_q20;
} split_opts[] = {
	{ 8, 34825 }, { 12, 5683 }, { 16, 1379 }, { 24, 171 }, { 32, 38 },
};
#define N_SPLIT_OPTS (sizeof(split_opts) / sizeof(split_opts[0]))

/* Sketch bits charged per expected Bloom false positive (about 1.23 cells
 * of 32 bits). */
#define FP_COST_BITS 40

/* ---- sizing rules ----------------------------------------------------- */

static uint32_t isqrt32(uint32_t v)
{
	uint32_t r = 0, bit = 1u << 30;

	while (bit > v)
		bit >>= 2;
	while (bit) {
		if (v >= r + bit) {
			v -= r + bit;
			r = (r >> 1) + bit;
		} else {
			r >>= 1;
		}
		bit >>= 2;
	}
	return r;
}

/*
 * Sub-table size t for nc global candidates (3t cells in all).  The default
 * rule t = max(1, floor(11 nc / 27) + floor(3 isqrt(nc) / 5)) minimises the
 * expected bytes of a block, 12 t for the cells plus 4 per candidate left
 * to the fallback, among sizings at or above the peeling threshold
 * (docs/PROTOCOL.md "Sketch sizing"; within 2% of the simulated optimum
 * for every measured nc).  A positive override c gives t = ceil(nc * c / 3)
 * (at least 1), computed in float64.
 */
static uint32_t sketch_t(const struct hg_params *p, uint32_t nc)
{
	double c = p->sketch_cells_per_candidate;

	if (nc == 0)
		return 0;
	if (c > 0.0) {
		double t = ceil((double)nc * c / 3.0);

		return t < 1.0 ? 1 : (uint32_t)t;
	}
	{
		uint32_t t = (uint32_t)((uint64_t)nc * 11 / 27) +
			     3 * isqrt32(nc) / 5;

		return t ? t : 1;
	}
}

/*
 * The cost model's per-byte and per-round-trip terms (docs/PROTOCOL.md
 * "The cost model"), in picoseconds; exact integers, the same on every
 * platform.  timed is false without a link rate (the bytes rules).
 */
struct cost_terms {
	bool timed;
	hg_u128 xb;   /* one byte of a phase: wire + per-packet CPU share */
	hg_u128 rt;   /* one phase round trip */
	hg_u128 lane; /* one union lane: 4 xb + lane_ps */
};

static void cost_terms(const struct hg_params *p, struct cost_terms *ct)
{
	const struct hg_cost *k = &p->cost;
	hg_u128 byte_ps, payload;

	memset(ct, 0, sizeof(*ct));
	if (!k->link_mbit)
		return;
	ct->timed = true;
	byte_ps = (hg_u128)8000000 / k->link_mbit;
	payload = k->payload_bytes ? k->payload_bytes : 1024;
	ct->xb = byte_ps +
		 ((hg_u128)k->pkt_ps + (hg_u128)p->workers * k->agg_pkt_ps +
		  HG_COST_FRAME_BYTES * byte_ps) /
			 payload;
	ct->rt = (hg_u128)1000 * k->rtt_ns;
	ct->lane = 4 * ct->xb + k->lane_ps;
}

/*
 * The index of one block: bitmap or a Bloom option.  Without a link rate
 * the fewest bits (the bytes rule); with one the least predicted time.
 * Returns the block's index time (the cost model's ix_b; 0 for the bytes
 * rule).
 */
static hg_u128 plan_index(const struct hg_params *p, const struct cost_terms *ct,
			  uint32_t len, uint32_t count, struct lhc_block *bk)
{
	uint64_t c = count < len ? count : len;
	uint64_t best = 8 * (((uint64_t)len + 7) / 8);
	hg_u128 tbest = 0, ix = 0;
	uint64_t cw = 0;

	bk->kind = LHC_BITMAP;
	bk->bloom_bits = 0;
	bk->bloom_k = 0;
	if (ct->timed) {
		cw = ((uint64_t)count + p->workers - 1) / p->workers;
		if (cw > len)
			cw = len;
		tbest = (hg_u128)(((uint64_t)len + 7) / 8) * ct->xb +
			(hg_u128)len * p->cost.bitmap_ps;
		ix = tbest;
	}
	for (size_t i = 0; i < N_BLOOM_OPTS; i++) {
		uint64_t bits = (bloom_opts[i].bpe * c + 63) / 64 * 64;

		if (bits == 0)
			bits = 64;
		if (ct->timed) {
			uint64_t fpn = (bloom_opts[i].fp_q20 * (len - c)) >> 20;
			hg_u128 ti = (hg_u128)(bits / 8) * ct->xb +
				     (hg_u128)bloom_opts[i].k * (len + cw) *
					     p->cost.probe_ps;
			hg_u128 t = ti + (hg_u128)fpn * ct->lane;

			if (!(t < tbest))
				continue;
			tbest = t;
			ix = ti;
		} else {
			uint64_t fp = (bloom_opts[i].fp_q20 * (len - c) *
				       FP_COST_BITS) >>
				      20;

			if (!(bits + fp < best))
				continue;
			best = bits + fp;
		}
		bk->kind = LHC_BLOOM;
		bk->bloom_bits = (uint32_t)bits;
		bk->bloom_k = (uint8_t)bloom_opts[i].k;
		bk->bloom_opt = (uint8_t)i;
	}
	for (size_t i = 0; ct->timed && p->cost.sbbf_ps && i < N_SPLIT_OPTS; i++) {
		uint64_t nblk = (split_opts[i].bpe * c + 255) / 256;
		uint64_t bits, fpn;
		hg_u128 ti, t;

		if (nblk == 0)
			nblk = 1;
		bits = 256 * nblk;
		fpn = (split_opts[i].fp_q20 * (len - c)) >> 20;
		ti = (hg_u128)(bits / 8) * ct->xb +
		     (hg_u128)(len + cw) * p->cost.sbbf_ps;
		t = ti + (hg_u128)fpn * ct->lane;
		if (!(t < tbest))
			continue;
		tbest = t;
		ix = ti;
		bk->kind = LHC_SPLIT;
		bk->bloom_bits = (uint32_t)bits;
		bk->bloom_k = 8;
		bk->bloom_opt = (uint8_t)(N_BLOOM_OPTS + i);
	}
	return ix;
}

static size_t index_bytes_of(const struct lhc_block *bk, uint32_t len)
{
	if (bk->kind == LHC_BITMAP)
		return (len + 7) / 8;
	if (bk->kind == LHC_BLOOM || bk->kind == LHC_SPLIT)
		return bk->bloom_bits / 8;
	return 0;
}

/* ---- create / destroy / info ------------------------------------------ */

struct hg_lhc *hg_lhc_create(const struct hg_params *p, size_t n,
			     const int8_t *gcodes, const uint8_t *gcounts_be32)
{
	return hg_lhc_create_at(p, 0, n, gcodes, gcounts_be32);
}

struct hg_lhc *hg_lhc_create_at(const struct hg_params *p, uint64_t first,
				size_t n, const int8_t *gcodes,
				const uint8_t *gcounts_be32)
{
	struct hg_lhc *l;
	struct cost_terms ct;
	size_t off = 0;

	if (hg_params_check(p) || (n && (!gcodes || !gcounts_be32)))
		return NULL;
	l = calloc(1, sizeof(*l));
	if (!l)
		return NULL;
	l->p = *p;
	l->n = n;
	l->first = first;
	l->nb = hg_nblocks(p, n);
	l->key_sketch = hg_stream_key(p->seed, HG_DOM_SKETCH, 0);
	l->key_bloom = hg_stream_key(p->seed, HG_DOM_BLOOM, 0);
	l->gcodes = malloc(l->nb ? l->nb : 1);
	l->blk = calloc(l->nb ? l->nb : 1, sizeof(*l->blk));
	if (!l->gcodes || !l->blk)
		goto err_free;
	memcpy(l->gcodes, gcodes, l->nb);
	cost_terms(p, &ct);
	for (size_t b = 0; b < l->nb; b++) {
		struct lhc_block *bk = &l->blk[b];
		uint32_t len = (uint32_t)hg_block_len(p, n, b);

		bk->index_off = off;
		if (gcodes[b] == HG_EXP_ZERO) {
			bk->kind = LHC_NONE;
			continue;
		}
		plan_index(p, &ct, len, hg_ld_be32(gcounts_be32 + 4 * b), bk);
		if (bk->kind == LHC_BITMAP)
			l->info.bitmap_blocks++;
		else
			l->info.bloom_blocks++;
		if (bk->kind == LHC_SPLIT)
			l->info.split_blocks++;
		off += index_bytes_of(bk, len);
	}
	l->info.index_bytes = off;
	l->state = LHC_PLANNED;
	return l;

err_free:
	hg_lhc_destroy(l);
	return NULL;
}

struct hg_lhc *hg_lhc_create_with(const struct hg_params *p, uint64_t first,
				  size_t n, const int8_t *gcodes,
				  const uint8_t *gcounts_be32,
				  struct hg_lhc_scratch *s)
{
	struct hg_lhc *l = hg_lhc_create_at(p, first, n, gcodes, gcounts_be32);

	if (l && s && s->cand_pos) {
		l->cand_pos = s->cand_pos;
		l->cand_cap = s->cand_cap;
		s->cand_pos = NULL;
		s->cand_cap = 0;
	}
	return l;
}

void hg_lhc_destroy_into(struct hg_lhc *l, struct hg_lhc_scratch *s)
{
	if (l && s && l->cand_cap > s->cand_cap) {
		free(s->cand_pos);
		s->cand_pos = l->cand_pos;
		s->cand_cap = l->cand_cap;
		l->cand_pos = NULL;
		l->cand_cap = 0;
	}
	hg_lhc_destroy(l);
}

void hg_lhc_scratch_free(struct hg_lhc_scratch *s)
{
	free(s->cand_pos);
	s->cand_pos = NULL;
	s->cand_cap = 0;
}

void hg_lhc_destroy(struct hg_lhc *l)
{
	if (!l)
		return;
	free(l->gcodes);
	free(l->blk);
	free(l->cand_pos);
	free(l->gindex);
	free(l->values);
	free(l->unresolved);
	free(l->s_cell);
	free(l->s_cid);
	free(l->s_queue);
	free(l->s_c0);
	free(l->s_c1);
	free(l->s_c2);
	free(l->s_sm);
	free(l);
}

int hg_lhc_get_info(const struct hg_lhc *l, struct hg_lhc_info *info)
{
	if (!l || !info)
		return -EINVAL;
	*info = l->info;
	return 0;
}

/* ---- index ------------------------------------------------------------ */

static void bitmap_portable(const float *x, size_t len, uint8_t *out)
{
	memset(out, 0, (len + 7) / 8);
	for (size_t i = 0; i < len; i++)
		out[i >> 3] |= (uint8_t)((hg_abs_bits(x[i]) != 0) << (i & 7));
}

/*
 * The k probes of element g: 21-bit fields of a chain of hash words
 * w_0 = hg_hash(key, g), w_(j+1) = mix64(w_j + GOLDEN); probe i is field
 * i mod 3 of word i / 3, reduced to [0, bits) by multiply-shift.  (Plain
 * double hashing repeats probe patterns too often for 64-bit filters.)
 */
static inline void bloom_probes(uint64_t key, uint64_t g, uint32_t k,
				uint32_t bits, uint32_t *out)
{
	uint64_t w = hg_hash(key, g);

	for (uint32_t i = 0; i < k; i++) {
		if (i && i % 3 == 0)
			w = hg_mix64(w + HG_HASH_GOLDEN);
		out[i] = (uint32_t)((((w >> (21 * (i % 3))) & 0x1FFFFFu) *
				     (uint64_t)bits) >>
				    21);
	}
}

/* The little-endian 32-bit word at p. */
static inline uint32_t le32(const uint8_t *p)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	uint32_t v;

	memcpy(&v, p, 4);
	return v;
#else
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
#endif
}

/* Store v as the little-endian 32-bit word at p. */
static inline void put_le32(uint8_t *p, uint32_t v)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	memcpy(p, &v, 4);
#else
	for (int b = 0; b < 4; b++)
		p[b] = (uint8_t)(v >> (8 * b));
#endif
}

/* Set element g's eight bits in a split-block filter of nblk blocks: one
 * read-modify-write of each 32-bit little-endian word (le32, put_le32). */
static inline void split_set(uint64_t key, uint64_t g, uint32_t nblk, uint8_t *filt)
{
	uint32_t m[8];
	uint8_t *blk = filt + (size_t)SPLIT_BLOCK_BYTES *
				      lhc_split_probe(key, g, nblk, m);

	for (int w = 0; w < 8; w++)
		put_le32(blk + 4 * w, le32(blk + 4 * w) | m[w]);
}

/* 1 when element g's eight bits are all set in a split-block filter of
 * nblk blocks whose hi32(g) part is s (lhc_split_s). */
static inline uint32_t split_test(uint64_t key, uint32_t s, uint64_t g,
				  uint32_t nblk, const uint8_t *filt)
{
	uint32_t h1 = lhc_fmix32(((uint32_t)g + (uint32_t)key) ^ s);
	uint32_t h2 = lhc_fmix32(h1 ^ (uint32_t)(key >> 32));
	const uint8_t *blk = filt + (size_t)SPLIT_BLOCK_BYTES *
					    (((uint64_t)h1 * nblk) >> 32);
	uint32_t miss = 0;

	for (int w = 0; w < 8; w++)
		miss |= (1u << lhc_split_bit(h1, h2, w)) & ~le32(blk + 4 * w);
	return miss == 0;
}

/* Elements per stage-1 chunk of the portable split-block probing (its
 * survivors' list lives on the stack). */
#define SPLIT_CHUNK_PORTABLE 1024

/* The candidates of a split-block block among its elements [i0, len)
 * (element i is g0 + i), appended at out; returns how many. */
static uint32_t split_candidates_portable(uint64_t key, uint64_t g0,
					  uint32_t nblk, const uint8_t *filt,
					  uint32_t i0, uint32_t len, uint16_t *out)
{
	uint32_t c = 0, s = lhc_split_s(key, g0 + i0);
	uint32_t kb = (uint32_t)(key >> 32);
	uint16_t surv[SPLIT_CHUNK_PORTABLE];
	uint32_t sh1[SPLIT_CHUNK_PORTABLE];

	if ((uint64_t)(uint32_t)(g0 + i0) + (len - i0) > UINT32_MAX) {
		/* hi32(g) moves on inside the range: element by element */
		for (uint32_t i = i0; i < len; i++) {
			if ((uint32_t)(g0 + i) == 0)
				s = lhc_split_s(key, g0 + i);
			out[c] = (uint16_t)i;
			c += split_test(key, s, g0 + i, nblk, filt);
		}
		return c;
	}
	/* Two stages, no branch on a bit: words 6 and 7 (fields of h1, so
	 * no second hash) of every element, the survivors (about a fifth of
	 * the elements at a filter's usual fill) listed with their h1; then
	 * h2 and words 0-5 of the survivors. */
	for (uint32_t c0 = i0; c0 < len; c0 += SPLIT_CHUNK_PORTABLE) {
		uint32_t c1 = len - c0 < SPLIT_CHUNK_PORTABLE ?
				      len :
				      c0 + SPLIT_CHUNK_PORTABLE;
		uint32_t ns = 0;

		for (uint32_t i = c0; i < c1; i++) {
			uint32_t h1 = lhc_fmix32(
				((uint32_t)(g0 + i) + (uint32_t)key) ^ s);
			const uint8_t *blk = filt +
					     (size_t)SPLIT_BLOCK_BYTES *
						     (((uint64_t)h1 * nblk) >> 32);
			uint32_t miss = ((1u << lhc_split_bit(h1, 0, 6)) &
					 ~le32(blk + 24)) |
					((1u << lhc_split_bit(h1, 0, 7)) &
					 ~le32(blk + 28));

			surv[ns] = (uint16_t)i;
			sh1[ns] = h1;
			ns += miss == 0;
		}
		for (uint32_t j = 0; j < ns; j++) {
			uint32_t h1 = sh1[j], h2 = lhc_fmix32(h1 ^ kb);
			const uint8_t *blk = filt +
					     (size_t)SPLIT_BLOCK_BYTES *
						     (((uint64_t)h1 * nblk) >> 32);
			uint32_t miss = 0;

			for (int w = 0; w < 6; w++)
				miss |= (1u << lhc_split_bit(h1, h2, w)) &
					~le32(blk + 4 * w);
			out[c] = surv[j];
			c += miss == 0;
		}
	}
	return c;
}

/* Bit p of a filter (byte p / 8, bit p % 8). */
static inline uint32_t bloom_bit(const uint8_t *filt, uint32_t p)
{
	return (filt[p >> 3] >> (p & 7)) & 1u;
}

/* Probe field r (0-2) of hash word w, in [0, bits) (bloom_probes). */
static inline uint32_t bloom_field(uint64_t w, uint32_t r, uint32_t bits)
{
	return (uint32_t)((((w >> (21 * r)) & 0x1FFFFFu) * (uint64_t)bits) >> 21);
}

/* The three probes of hash word w (fields 0-2, bloom_field), unrolled:
 * constant shifts, no loop. */
static inline void bloom_fields3(uint64_t w, uint32_t bits, uint32_t *p)
{
	p[0] = bloom_field(w, 0, bits);
	p[1] = bloom_field(w, 1, bits);
	p[2] = bloom_field(w, 2, bits);
}

/* Elements per stage-1 chunk of the portable Bloom probing (its
 * survivors' list lives on the stack). */
#define BLOOM_CHUNK_PORTABLE 1024

/*
 * The candidates of a Bloom block among its elements [i0, len) (element i
 * is g0 + i): those whose k probes (bloom_probes) all hit a set bit of the
 * filter, appended at out (one entry of slack); returns their count.  In
 * two stages with no branch on a probe: stage 1 tests the three probes of
 * the first hash word of every element and lists the survivors (about one
 * in eight in a filter half full), stage 2 hashes on for the survivors
 * only.  Testing each element to the end before the next, with an early
 * exit per hash word, took a branch the CPU mispredicts on about one
 * element in eight: 3846144 elements at 0.68 %, W = 4 (939 Bloom blocks
 * of k = 8), best CPU time of set_index, the library before and after
 * alternated in one process, shared Xeon under load: 26.2-27.1 ms before,
 * 18.8-19.4 ms after (docs/BENCHMARKS.md "Bloom probing").  Stage 1
 * hashes by adding GOLDEN and takes the three probes unrolled
 * (bloom_fields3): 97 instructions per element before, 72 after
 * (callgrind, blocks of 4096 elements, filters of 1344 bits, k = 8); 100
 * such blocks, old and new alternated 200 times in one process, AMD EPYC
 * under load: best 2.37 ms before, 2.15 after (tenth percentile 2.45,
 * 2.23).  With the first word's probes 1 and 2 made to pass for k < 3 by
 * an OR in the loop (and k < 3 not split off) it ran 5 % slower than
 * before, with fewer instructions.
 * The vector paths leave their last len % 8 (AVX2) or len % 16 (AVX-512)
 * elements to it.
 */
static uint32_t bloom_candidates_portable(uint64_t key, uint64_t g0, uint32_t k,
					  uint32_t bits, const uint8_t *filt,
					  uint32_t i0, uint32_t len, uint16_t *out)
{
	uint16_t surv[BLOOM_CHUNK_PORTABLE + 1];
	uint32_t c = 0;

	/* every option of bloom_opts has k >= 3; fewer probes, element by
	 * element */
	for (uint32_t i = i0; k < 3 && i < len; i++) {
		uint32_t pr[3], hit = 1;

		bloom_probes(key, g0 + i, k, bits, pr);
		for (uint32_t r = 0; r < k; r++)
			hit &= bloom_bit(filt, pr[r]);
		out[c] = (uint16_t)i;
		c += hit;
	}
	if (k < 3)
		return c;

	for (uint32_t c0 = i0; c0 < len; c0 += BLOOM_CHUNK_PORTABLE) {
		uint32_t c1 = len - c0 < BLOOM_CHUNK_PORTABLE ?
				      len :
				      c0 + BLOOM_CHUNK_PORTABLE;
		uint32_t ns = 0;
		/* hg_hash's key + (g + 1) * GOLDEN, g = g0 + i */
		uint64_t z = key + (g0 + c0 + 1) * HG_HASH_GOLDEN;

		for (uint32_t i = c0; i < c1; i++, z += HG_HASH_GOLDEN) {
			uint32_t p[3];

			bloom_fields3(hg_mix64(z), bits, p);
			surv[ns] = (uint16_t)i;
			ns += bloom_bit(filt, p[0]) & bloom_bit(filt, p[1]) &
			      bloom_bit(filt, p[2]);
		}
		for (uint32_t j = 0; j < ns; j++) {
			uint64_t w = hg_hash(key, g0 + surv[j]);
			uint32_t hit = 1;

			for (uint32_t r = 3; r < k; r += 3) {
				uint32_t p[3];

				w = hg_mix64(w + HG_HASH_GOLDEN);
				bloom_fields3(w, bits, p);
				hit &= bloom_bit(filt, p[0]) &
				       (bloom_bit(filt, p[1]) | (r + 1 >= k)) &
				       (bloom_bit(filt, p[2]) | (r + 2 >= k));
			}
			out[c] = surv[j];
			c += hit;
		}
	}
	return c;
}

int hg_lhc_index_encode(const struct hg_lhc *l, const float *x, uint8_t *index)
{
	bool avx2;

	if (!l || (l->n && !x) || (l->info.index_bytes && !index))
		return -EINVAL;
	avx2 = hg_codec_avx2();
	for (size_t b = 0; b < l->nb; b++) {
		const struct lhc_block *bk = &l->blk[b];
		size_t len = hg_block_len(&l->p, l->n, b);
		const float *xb = x + b * l->p.block;
		uint8_t *out = index + bk->index_off;

		if (bk->kind == LHC_NONE)
			continue;
		if (bk->kind == LHC_BITMAP) {
			size_t i = avx2 ? hg_lhc_bitmap_avx2(xb, len, out) : 0;

			bitmap_portable(xb + i, len - i, out + i / 8);
			continue;
		}
		memset(out, 0, bk->bloom_bits / 8);
		for (size_t i = 0; i < len; i++) {
			uint32_t pr[8];

			if (!hg_abs_bits(xb[i]))
				continue;
			if (bk->kind == LHC_SPLIT) {
				split_set(l->key_bloom,
					  l->first + b * l->p.block + i,
					  bk->bloom_bits / 256, out);
				continue;
			}
			bloom_probes(l->key_bloom, l->first + b * l->p.block + i,
				     bk->bloom_k, bk->bloom_bits, pr);
			for (uint32_t k = 0; k < bk->bloom_k; k++)
				out[pr[k] >> 3] |= (uint8_t)(1u << (pr[k] & 7));
		}
	}
	return 0;
}

/* The Bloom bits of block b from its non-zero positions. */
static void bloom_encode(const struct hg_lhc *l, size_t b, const uint16_t *pos,
			 size_t nz, uint8_t *out)
{
	const struct lhc_block *bk = &l->blk[b];

	memset(out, 0, bk->bloom_bits / 8);
	if (bk->kind == LHC_SPLIT) {
		for (size_t j = 0; j < nz; j++)
			split_set(l->key_bloom, l->first + b * l->p.block + pos[j],
				  bk->bloom_bits / 256, out);
		return;
	}
	for (size_t j = 0; j < nz; j++) {
		uint32_t pr[8];

		bloom_probes(l->key_bloom, l->first + b * l->p.block + pos[j],
			     bk->bloom_k, bk->bloom_bits, pr);
		for (uint32_t k = 0; k < bk->bloom_k; k++)
			out[pr[k] >> 3] |= (uint8_t)(1u << (pr[k] & 7));
	}
}

int hg_lhc_index_encode_scan(const struct hg_lhc *l, const struct hg_scan *s,
			     uint8_t *index)
{
	if (!l || lhc_scan_matches(l, s) || (l->info.index_bytes && !index))
		return -EINVAL;
	for (size_t b = 0; b < l->nb; b++) {
		const struct lhc_block *bk = &l->blk[b];
		size_t len = hg_block_len(&l->p, l->n, b);
		uint8_t *out = index + bk->index_off;

		if (bk->kind == LHC_BITMAP)
			memcpy(out, s->bitmap + b * (l->p.block / 8),
			       (len + 7) / 8);
		else if (bk->kind == LHC_BLOOM || bk->kind == LHC_SPLIT)
			bloom_encode(l, b, s->pos + s->off[b],
				     s->off[b + 1] - s->off[b], out);
	}
	return 0;
}

static int cand_reserve(struct hg_lhc *l, size_t need)
{
	size_t cap = l->cand_cap ? l->cand_cap : 1024;
	uint16_t *np;

	if (need <= l->cand_cap)
		return 0;
	while (cap < need)
		cap *= 2;
	np = realloc(l->cand_pos, cap * sizeof(*np));
	if (!np)
		return -ENOMEM;
	l->cand_pos = np;
	l->cand_cap = cap;
	return 0;
}

/* true when the AVX-512 VBMI2 candidate list may be used (the AVX-512
 * paths are allowed and the CPU has VBMI2 and BW: 16-bit lanes). */
static bool cand_vbmi2(void)
{
	return hg_codec_avx512() && __builtin_cpu_supports("avx512bw") &&
	       __builtin_cpu_supports("avx512vbmi2");
}

/* Slack past the last candidate: whole vectors of 32 positions are stored. */
#define CAND_SLACK 32

/* Candidates of one block appended at l->cand_pos + total (a bitmap's
 * list by AVX-512 VBMI2 when vbmi2, else by AVX2 when avx2; a Bloom
 * block's probing by AVX-512 when avx512, else by AVX2 when avx2). */
static int collect_candidates(struct hg_lhc *l, size_t b, const uint8_t *idx,
			      size_t total, bool vbmi2, bool avx2, bool avx512,
			      uint32_t *count)
{
	const struct lhc_block *bk = &l->blk[b];
	uint32_t len = (uint32_t)hg_block_len(&l->p, l->n, b);
	uint32_t c = 0;
	uint16_t *out;
	int rc;

	rc = cand_reserve(l, total + len + CAND_SLACK);
	if (rc)
		return rc;
	out = l->cand_pos + total;
	if (bk->kind == LHC_BITMAP) {
		uint32_t nbytes = (len + 7) / 8, w0 = 0;

		/* whole 64-bit words by vector (all but a short last
		 * block's tail), the rest below */
		if (vbmi2) {
			c = hg_lhc_bitmap_positions_vbmi2(idx, len / 64, out);
			w0 = len / 64 * 8;
		} else if (avx2) {
			c = hg_lhc_bitmap_positions_avx2(idx, len / 64, out);
			w0 = len / 64 * 8;
		}
		for (uint32_t w = w0; w < nbytes; w += 8) {
			uint64_t v = 0;
			uint32_t take = nbytes - w < 8 ? nbytes - w : 8;

			for (uint32_t k = 0; k < take; k++)
				v |= (uint64_t)idx[w + k] << (8 * k);
			if (8 * w + 64 > len) /* bits past the block's end */
				v &= (len - 8 * w >= 64) ?
					     ~0ull :
					     (1ull << (len - 8 * w)) - 1;
			while (v) {
				out[c++] = (uint16_t)(8 * w +
						      (uint32_t)__builtin_ctzll(v));
				v &= v - 1;
			}
		}
	} else if (bk->kind == LHC_BLOOM) {
		uint32_t i = 0;

		if (avx512 && bk->bloom_bits < BLOOM_VEC_BITS) {
			i = len & ~15u;
			c = hg_lhc_bloom_candidates_avx512(l->key_bloom,
							   l->first + b * l->p.block,
							   bk->bloom_k,
							   bk->bloom_bits, idx,
							   i, out);
		} else if (avx2 && bk->bloom_bits < BLOOM_VEC_BITS) {
			i = len & ~7u;
			c = hg_lhc_bloom_candidates_avx2(l->key_bloom,
							 l->first + b * l->p.block,
							 bk->bloom_k,
							 bk->bloom_bits, idx, i,
							 out);
		}
		c += bloom_candidates_portable(l->key_bloom,
					       l->first + b * l->p.block,
					       bk->bloom_k, bk->bloom_bits, idx,
					       i, len, out + c);
	} else if (bk->kind == LHC_SPLIT) {
		uint64_t g0 = l->first + b * l->p.block;
		uint32_t i = 0;

		/* the vector hash takes hi32(g) as the block's first one */
		if (avx512 && bk->bloom_bits / 256 <= SPLIT_VEC512_BLOCKS &&
		    (uint64_t)(uint32_t)g0 + len <= UINT32_MAX) {
			i = len & ~15u;
			c = hg_lhc_split_candidates_avx512(l->key_bloom, g0,
							   bk->bloom_bits / 256,
							   idx, i, out);
		} else if (avx2 && (uint64_t)(uint32_t)g0 + len <= UINT32_MAX) {
			i = len & ~7u;
			c = hg_lhc_split_candidates_avx2(l->key_bloom, g0,
							 bk->bloom_bits / 256,
							 idx, i, out);
		}
		c += split_candidates_portable(l->key_bloom, g0,
					       bk->bloom_bits / 256, idx, i,
					       len, out + c);
	}
	*count = c;
	return 0;
}

static int scratch_reserve(struct hg_lhc *l, size_t cells, size_t cands)
{
	if (cells > l->s_cells_cap) {
		free(l->s_cell);
		free(l->s_cid);
		free(l->s_queue);
		l->s_cell = malloc(cells * sizeof(*l->s_cell));
		l->s_cid = malloc(cells * sizeof(*l->s_cid));
		/* a push stores its slot before it knows whether to advance
		 * (one slot past the last pushed cell), the vector seeding
		 * whole vectors of 8 */
		l->s_queue = malloc((cells + 8) * sizeof(*l->s_queue));
		l->s_cells_cap = 0;
		if (!l->s_cell || !l->s_cid || !l->s_queue)
			return -ENOMEM;
		l->s_cells_cap = cells;
	}
	if (cands > l->s_cand_cap) {
		free(l->s_c0);
		free(l->s_c1);
		free(l->s_c2);
		free(l->s_sm);
		l->s_c0 = malloc(cands * sizeof(*l->s_c0));
		l->s_c1 = malloc(cands * sizeof(*l->s_c1));
		l->s_c2 = malloc(cands * sizeof(*l->s_c2));
		l->s_sm = malloc(cands * sizeof(*l->s_sm));
		l->s_cand_cap = 0;
		if (!l->s_c0 || !l->s_c1 || !l->s_c2 || !l->s_sm)
			return -ENOMEM;
		l->s_cand_cap = cands;
	}
	return 0;
}

/* Ask for block b's index bytes while the block before it is read. */
PREFETCH_FN void prefetch_index(const struct hg_lhc *l, size_t b,
				const uint8_t *gindex)
{
	const struct lhc_block *bk = &l->blk[b];
	size_t nbytes = index_bytes_of(bk, (uint32_t)hg_block_len(&l->p, l->n, b));

	for (size_t o = 0; o < nbytes; o += 64)
		__builtin_prefetch(gindex + bk->index_off + o, 0, 3);
}

int hg_lhc_set_index(struct hg_lhc *l, const uint8_t *gindex)
{
	size_t total = 0, lanes = 0, max_cells = 0, max_cand = 0;
	bool vbmi2, avx2, avx512;
	int rc;

	if (!l || (l->info.index_bytes && !gindex))
		return -EINVAL;
	vbmi2 = cand_vbmi2();
	avx2 = hg_codec_avx2();
	avx512 = hg_codec_avx512();
	l->state = LHC_PLANNED;
	/* union reads the bitmaps again, in words (slack for the last one) */
	free(l->gindex);
	l->gindex = malloc(l->info.index_bytes + 8);
	if (!l->gindex)
		return -ENOMEM;
	if (l->info.index_bytes)
		memcpy(l->gindex, gindex, l->info.index_bytes);
	memset(l->gindex + l->info.index_bytes, 0, 8);
	for (size_t b = 0; b < l->nb; b++) {
		struct lhc_block *bk = &l->blk[b];
		uint32_t c = 0;

		bk->cand_off = total;
		bk->sketch_off = lanes;
		if (b + 1 < l->nb)
			prefetch_index(l, b + 1, gindex);
		if (bk->kind != LHC_NONE) {
			rc = collect_candidates(l, b, gindex + bk->index_off,
						total, vbmi2, avx2, avx512, &c);
			if (rc)
				return rc;
		}
		bk->ncand = c;
		bk->t = sketch_t(&l->p, c);
		total += c;
		lanes += 3 * (size_t)bk->t;
		if (3 * (size_t)bk->t > max_cells)
			max_cells = 3 * (size_t)bk->t;
		if (c > max_cand)
			max_cand = c;
	}
	free(l->values);
	free(l->unresolved);
	l->values = malloc((total ? total : 1) * sizeof(*l->values));
	l->unresolved = malloc((total ? total : 1) * sizeof(*l->unresolved));
	if (!l->values || !l->unresolved)
		return -ENOMEM;
	rc = scratch_reserve(l, max_cells ? max_cells : 1, max_cand ? max_cand : 1);
	if (rc)
		return rc;
	l->info.candidates = total;
	l->info.sketch_lanes = lanes;
	l->info.stalled_blocks = 0;
	l->info.fallback_lanes = 0;
	l->state = LHC_INDEXED;
	return 0;
}

/* ---- sketch cells of a batch of candidates ----------------------------- */

/*
 * The three cells (block-relative) and the sign of element g: cell r is
 * r * t + ((21-bit field r of h) * t >> 21), negative iff bit 63 of h.
 */
static inline void sketch_cells(uint64_t key, uint64_t g, uint32_t t,
				uint32_t cell[3], uint32_t *neg)
{
	uint64_t h = hg_hash(key, g);

	/* the three fields written out: gcc 12 -O2 kept a loop over r with
	 * a variable shift, 66 instructions a candidate in cells_portable
	 * against 40 now (callgrind, one hg_lhc_peel of 778181 candidates);
	 * the peel's portable hashing takes 31% fewer cycles
	 * (docs/BENCHMARKS.md "Where lhc decode's time goes") */
	cell[0] = (uint32_t)((h & 0x1FFFFFu) * t >> 21);
	cell[1] = t + (uint32_t)(((h >> 21) & 0x1FFFFFu) * t >> 21);
	cell[2] = 2 * t + (uint32_t)(((h >> 42) & 0x1FFFFFu) * t >> 21);
	*neg = (uint32_t)(h >> 63);
}

static void cells_portable(uint64_t key, uint64_t g0, uint32_t t,
			   const uint16_t *pos, uint32_t n,
			   const struct cell_batch *cb, uint32_t j0)
{
	for (uint32_t j = j0; j < n; j++) {
		uint32_t c[3], neg;

		sketch_cells(key, g0 + pos[j], t, c, &neg);
		cb->c0[j] = c[0];
		cb->c1[j] = c[1];
		cb->c2[j] = c[2];
		cb->sm[j] = 0u - neg;
	}
}

static void cells_batch(int isa, uint64_t key, uint64_t g0, uint32_t t,
			const uint16_t *pos, uint32_t n,
			const struct cell_batch *cb)
{
	uint32_t j = 0;

	if (isa == HG_ISA_AVX512)
		j = hg_lhc_cells_avx512(key, g0, t, pos, n, cb);
	else if (isa == HG_ISA_AVX2)
		j = hg_lhc_cells_avx2(key, g0, t, pos, n, cb);

	cells_portable(key, g0, t, pos, n, cb, j);
}

/* ---- count sketch ----------------------------------------------------- */

/*
 * Elements per sketch chunk: a block is encoded in chunks whose working set
 * (positions, values, cells, signs: 22 bytes per element) stays on the
 * stack and in L1.  Wrapping adds commute, so chunking changes no bit.
 */
#define SK_CHUNK 512

/*
 * Non-zero elements i0 <= i < i1 of a block: their positions appended to
 * pos, their absolute-value bits OR-ed into *amax (range check).  Branch
 * free: every element is stored, the count advances only for non-zeros.
 */
static uint32_t compact_portable(const float *xb, uint32_t i0, uint32_t i1,
				 uint16_t *pos, uint32_t *amax)
{
	uint32_t c = 0, mx = *amax;

	for (uint32_t i = i0; i < i1; i++) {
		uint32_t a = hg_abs_bits(xb[i]);

		pos[c] = (uint16_t)i;
		c += a != 0;
		mx = a > mx ? a : mx;
	}
	*amax = mx;
	return c;
}

/* Quantised value of x (within range checked by the caller). */
static inline int32_t quant1(const struct hg_params *p, uint64_t rkey, float x,
			     double scale, uint64_t g)
{
	if (p->flags & HG_F_STOCHASTIC)
		return hg_sr((double)x * scale, (uint32_t)(hg_hash(rkey, g) >> 32));
	return hg_rne((double)x * scale);
}

/* Signed quantised values of the elements g0 + pos[j] (range already
 * checked): q[j] = (quantised v[j] ^ sm[j]) - sm[j], sm[j] all ones for a
 * negative cell sign (struct cell_batch). */
static void signed_vals(const struct hg_params *p, uint64_t rkey, const float *v,
			uint64_t g0, const uint16_t *pos, uint32_t n,
			double scale, const uint32_t *sm, uint32_t *q, int isa)
{
	uint32_t j = 0;

	if (!(p->flags & HG_F_STOCHASTIC)) {
		if (isa >= HG_ISA_AVX2)
			j = hg_lhc_signed_avx2(v, sm, n, scale, q);
		for (; j < n; j++)
			q[j] = ((uint32_t)hg_rne((double)v[j] * scale) ^ sm[j]) -
			       sm[j];
		return;
	}
	for (; j < n; j++)
		q[j] = ((uint32_t)quant1(p, rkey, v[j], scale, g0 + pos[j]) ^
			sm[j]) -
		       sm[j];
}

/* The wire buffer is only byte-aligned: host-order cells via memcpy. */
static inline void cell_add(uint8_t *cells, uint32_t k, uint32_t v)
{
	uint32_t t;

	memcpy(&t, cells + 4 * (size_t)k, 4);
	t += v;
	memcpy(cells + 4 * (size_t)k, &t, 4);
}

/*
 * Adds n non-zero elements of block b (positions pos, values v, in range)
 * into the block's cells (host order, in place), SK_CHUNK at a time.
 */
static void sketch_add(const struct hg_lhc *l, size_t b, const uint16_t *pos,
		       const float *v, uint32_t n, uint8_t *cells,
		       uint64_t rkey, int isa)
{
	const struct lhc_block *bk = &l->blk[b];
	const double scale = hg_pow2(hg_scale_shift(&l->p, l->gcodes[b]));
	const uint64_t g0 = l->first + b * l->p.block;
	uint32_t q[SK_CHUNK], c0[SK_CHUNK], c1[SK_CHUNK], c2[SK_CHUNK];
	uint32_t sm[SK_CHUNK];
	const struct cell_batch cb = { c0, c1, c2, sm };

	for (uint32_t j0 = 0; j0 < n; j0 += SK_CHUNK) {
		uint32_t m = n - j0 < SK_CHUNK ? n - j0 : SK_CHUNK;

		cells_batch(isa, l->key_sketch, g0, bk->t, pos + j0, m, &cb);
		signed_vals(&l->p, rkey, v + j0, g0, pos + j0, m, scale, sm, q,
			    isa);
		for (uint32_t j = 0; j < m; j++) {
			cell_add(cells, c0[j], q[j]);
			cell_add(cells, c1[j], q[j]);
			cell_add(cells, c2[j], q[j]);
		}
	}
}

/*
 * Adds the block's non-zero elements into its cells, reading the tensor
 * (the path before the one-pass scan, kept for hg_lhc_sketch_encode);
 * returns false if one is out of the block's range or the block has no
 * candidate although this worker has a non-zero.
 */
static bool sketch_block(const struct hg_lhc *l, size_t b, const float *xb,
			 uint32_t len, uint8_t *cells, uint64_t rkey, int isa)
{
	const struct lhc_block *bk = &l->blk[b];
	const uint32_t lim = hg_code_limit_bits(l->gcodes[b]);
	uint16_t pos[SK_CHUNK + 16];
	float v[SK_CHUNK];

	for (uint32_t i0 = 0; i0 < len; i0 += SK_CHUNK) {
		uint32_t i1 = len - i0 < SK_CHUNK ? len : i0 + SK_CHUNK;
		uint32_t amax = 0, n;

		/* block lengths are multiples of 64 except the tensor's
		 * last block: its tail goes the portable way */
		if (isa == HG_ISA_AVX512) {
			uint32_t iv = i0 + ((i1 - i0) & ~15u);

			n = hg_lhc_compact_avx512(xb, i0, iv, pos, &amax);
			n += compact_portable(xb, iv, i1, pos + n, &amax);
		} else {
			n = compact_portable(xb, i0, i1, pos, &amax);
		}
		if (!n)
			continue;
		if (amax >= lim || bk->ncand == 0)
			return false;
		for (uint32_t j = 0; j < n; j++)
			v[j] = xb[pos[j]];
		sketch_add(l, b, pos, v, n, cells, rkey, isa);
	}
	return true;
}

/* Host-order cells of a block to big-endian, in place. */
static void cells_to_be(uint8_t *cells, size_t nc, int isa)
{
	size_t k = isa >= HG_ISA_AVX2 ? hg_lhc_cells_be_avx2(cells, nc) : 0;

	for (; k < nc; k++) {
		uint32_t t;

		memcpy(&t, cells + 4 * k, 4);
		hg_st_be32(cells + 4 * k, t);
	}
}

/* The checks both sketch encoders share (-EINVAL), then the stream key
 * of this worker's rounding into *rkey. */
static int sketch_start(const struct hg_lhc *l, const uint8_t *cells_be32,
			uint64_t *rkey)
{
	if (!l || l->state < LHC_INDEXED || (l->info.sketch_lanes && !cells_be32))
		return -EINVAL;
	*rkey = hg_stream_key(l->p.seed, HG_DOM_ROUND, l->p.worker);
	return 0;
}

int hg_lhc_sketch_encode(const struct hg_lhc *l, const float *x, uint8_t *cells_be32)
{
	uint64_t rkey;
	int isa;

	if (sketch_start(l, cells_be32, &rkey) || (l->n && !x))
		return -EINVAL;
	isa = hg_codec_isa();
	for (size_t b = 0; b < l->nb; b++) {
		const struct lhc_block *bk = &l->blk[b];
		uint32_t len = (uint32_t)hg_block_len(&l->p, l->n, b);
		const float *xb = x + b * l->p.block;
		uint8_t *cells = cells_be32 + 4 * bk->sketch_off;
		size_t nc = 3 * (size_t)bk->t;

		/* accumulate in host order in place, then byte-swap: the
		 * block's cells stay in cache */
		if (nc) /* no cells at all: cells_be32 may be NULL */
			memset(cells, 0, nc * 4);
		if (bk->kind == LHC_NONE) {
			/* a block zero everywhere must be zero here too */
			for (size_t i = 0; i < len; i++)
				if (hg_abs_bits(xb[i]))
					return -ERANGE;
			continue;
		}
		if (!sketch_block(l, b, xb, len, cells, rkey, isa))
			return -ERANGE;
		cells_to_be(cells, nc, isa);
	}
	return 0;
}

int hg_lhc_sketch_encode_scan(const struct hg_lhc *l, const struct hg_scan *s,
			      uint8_t *cells_be32)
{
	uint64_t rkey;
	int isa;

	if (sketch_start(l, cells_be32, &rkey) || lhc_scan_matches(l, s))
		return -EINVAL;
	isa = hg_codec_isa();
	for (size_t b = 0; b < l->nb; b++) {
		const struct lhc_block *bk = &l->blk[b];
		uint8_t *cells = cells_be32 + 4 * bk->sketch_off;
		size_t nc = 3 * (size_t)bk->t;
		size_t o = s->off[b];
		uint32_t nz = (uint32_t)(s->off[b + 1] - o);

		if (nc) /* no cells at all: cells_be32 may be NULL */
			memset(cells, 0, nc * 4);
		if (!nz)
			continue;
		if (s->absmax[b] >= hg_code_limit_bits(l->gcodes[b]) ||
		    bk->ncand == 0)
			return -ERANGE;
		sketch_add(l, b, s->pos + o, s->val + o, nz, cells, rkey, isa);
		cells_to_be(cells, nc, isa);
	}
	return 0;
}

/* ---- peeling ---------------------------------------------------------- */

/*
 * Peels one block: values of resolved candidates into l->values, the
 * unresolved ones appended to l->unresolved.  Returns -EPROTO when the
 * summed cells are inconsistent with the index (a cell with no candidate
 * left but a non-zero value).
 *
 * A FIFO seeded with the count-1 cells in cell order (the protocol's
 * reference order, docs/PROTOCOL.md "Peeling"; any order gives the same
 * result), a popped cell skipped unless its count is still 1.  Per cell
 * one 64-bit word holds the count (low 32 bits) and the sum of the ranks
 * of its candidates (high 32 bits): with count 1 the high half is the sole
 * candidate's rank (the XOR of the protocol text names the same
 * candidate), and one subtraction updates both.  Each candidate's cells
 * and sign are hashed once, before the loop (cells_batch, vector on the
 * AVX2 and AVX-512 paths).
 *
 * The pop loop does only the work of a live pop: a stale cell (about one
 * pop in eight at the default sizing) costs a mispredicted branch, which
 * is cheaper than the masked updates of a branch-free loop, where every
 * pop paid for all of them (callgrind, portable path: 79 instructions a
 * pop before, 51 now).  The FIFO matters: the queue is long for most of a
 * block, so the out-of-order core overlaps several pops; a LIFO stack
 * chains each pop on the one before (twice the time in an isolated
 * measurement of the loop).  The passes over the cells (load, seeding,
 * final check) go 8 cells a step on the vector paths (codec_lhc_avx2.c).
 * No per-candidate flag is kept: a peeled candidate leaves the cell it was
 * peeled from at count 0, while every cell of a candidate of the 2-core
 * keeps a count of at least 2, so when the block stalls the unresolved
 * candidates are those whose three cells all still count candidates.
 */
static int peel_block(struct hg_lhc *l, size_t b, const uint8_t *gcells, int isa)
{
	const struct lhc_block *bk = &l->blk[b];
	const uint32_t nc = 3 * bk->t, n = bk->ncand;
	const uint16_t *pos = l->cand_pos + bk->cand_off;
	int32_t *val = l->values + bk->cand_off;
	uint32_t *cell = l->s_cell, *queue = l->s_queue;
	uint64_t *cid = l->s_cid;
	const uint32_t *c0 = l->s_c0, *c1 = l->s_c1, *c2 = l->s_c2;
	const uint32_t *sm = l->s_sm;
	const struct cell_batch cb = { l->s_c0, l->s_c1, l->s_c2, l->s_sm };
	uint32_t head = 0, tail = 0, peeled = 0, bad = 0, k0;

	k0 = isa != HG_ISA_PORTABLE ?
		     hg_lhc_peel_load_avx2(gcells, nc, cell, cid) :
		     0;
	for (uint32_t k = k0; k < nc; k++)
		cell[k] = hg_ld_be32(gcells + 4 * k);
	memset(cid + k0, 0, (nc - k0) * sizeof(*cid));
	cells_batch(isa, l->key_sketch, l->first + b * l->p.block, bk->t, pos,
		    n, &cb);
	for (uint32_t j = 0; j < n; j++) {
		const uint64_t d = 1 + ((uint64_t)j << 32);

		cid[c0[j]] += d;
		cid[c1[j]] += d;
		cid[c2[j]] += d;
	}
	/* (tail and bad stay in registers: the vector passes return them) */
	k0 = 0;
	if (isa != HG_ISA_PORTABLE)
		tail = hg_lhc_peel_seed_avx2(cid, nc, queue, &k0);
	for (uint32_t k = k0; k < nc; k++) {
		queue[tail] = k;
		tail += (uint32_t)cid[k] == 1;
	}
	while (head < tail) {
		const uint32_t k = queue[head++];
		const uint64_t e = cid[k];
		uint32_t j, v, q;
		uint64_t d;

		if ((uint32_t)e != 1)
			continue; /* emptied since it was pushed */
		j = (uint32_t)(e >> 32);
		v = cell[k];
		d = e; /* 1 + (j << 32) */
		/* the candidate's signed contribution is cell[k] */
		val[j] = (int32_t)((v ^ sm[j]) - sm[j]);
		peeled++;
		q = c0[j];
		cell[q] -= v;
		cid[q] -= d;
		queue[tail] = q;
		tail += (uint32_t)cid[q] == 1;
		q = c1[j];
		cell[q] -= v;
		cid[q] -= d;
		queue[tail] = q;
		tail += (uint32_t)cid[q] == 1;
		q = c2[j];
		cell[q] -= v;
		cid[q] -= d;
		queue[tail] = q;
		tail += (uint32_t)cid[q] == 1;
	}
	k0 = 0;
	if (isa != HG_ISA_PORTABLE)
		bad = hg_lhc_peel_bad_avx2(cell, cid, nc, &k0);
	for (uint32_t k = k0; k < nc; k++)
		bad |= cell[k] & ((uint32_t)((uint32_t)cid[k] != 0) - 1u);
	if (bad)
		return -EPROTO;
	if (peeled < n) {
		l->info.stalled_blocks++;
		for (uint32_t j = 0; j < n; j++)
			if ((uint32_t)cid[c0[j]] && (uint32_t)cid[c1[j]] &&
			    (uint32_t)cid[c2[j]]) {
				val[j] = 0;
				l->unresolved[l->info.fallback_lanes++] =
					(uint32_t)(bk->cand_off + j);
			}
	}
	return 0;
}

/* Blocks ahead of the one being peeled whose cells prefetch_block asks
 * for. */
#define PEEL_PREFETCH_AHEAD 2

/*
 * Ask for a later block's summed cells and candidate positions while the
 * current one is peeled, with locality 1 (prefetcht2: into L2 on Zen 4;
 * both are read once, front to back, when its turn comes; the peeling
 * itself works in L1).  The next block's into L1 left the load pass of
 * the cells 25-70% slower: sum of per-block minimum TSC cycles, 2^26 at
 * 5%, W = 4, alternated in one process under load, portable 33-36 M
 * against 21-24 M, avx2 16 M against 10-11 M, avx512 16 M against
 * 10-13 M; the whole peel 0-5% fewer cycles at 2^26 in 9 of 11 such
 * runs, at 2^24 -8% to +7% on avx512 (the noise; docs/BENCHMARKS.md).
 */
PREFETCH_FN void prefetch_block(const struct hg_lhc *l, const struct lhc_block *bk,
				const uint8_t *gcells_be32)
{
	const uint8_t *c = gcells_be32 + 4 * bk->sketch_off;
	const uint8_t *p = (const uint8_t *)(l->cand_pos + bk->cand_off);
	size_t cb = 12 * (size_t)bk->t, pb = 2 * (size_t)bk->ncand;

	for (size_t o = 0; o < cb; o += 64)
		__builtin_prefetch(c + o, 0, 1);
	for (size_t o = 0; o < pb; o += 64)
		__builtin_prefetch(p + o, 0, 1);
}

int hg_lhc_peel(struct hg_lhc *l, const uint8_t *gcells_be32)
{
	int isa;

	if (!l || l->state < LHC_INDEXED || (l->info.sketch_lanes && !gcells_be32))
		return -EINVAL;
	isa = hg_codec_isa();
	l->info.stalled_blocks = 0;
	l->info.fallback_lanes = 0;
	l->state = LHC_INDEXED;
	for (size_t b = 0; b < l->nb; b++) {
		const struct lhc_block *bk = &l->blk[b];
		int rc;

		if (!bk->ncand)
			continue;
		if (b + PEEL_PREFETCH_AHEAD < l->nb)
			prefetch_block(l, &l->blk[b + PEEL_PREFETCH_AHEAD],
				       gcells_be32);
		rc = peel_block(l, b, gcells_be32 + 4 * bk->sketch_off, isa);
		if (rc)
			return rc;
	}
	l->state = LHC_PEELED;
	return 0;
}

/* ---- fallback and decode ---------------------------------------------- */

int hg_lhc_fallback_encode(const struct hg_lhc *l, const float *x, uint8_t *out_be32)
{
	uint64_t rkey;
	size_t u = 0;

	if (!l || l->state < LHC_PEELED || (l->n && !x) ||
	    (l->info.fallback_lanes && !out_be32))
		return -EINVAL;
	rkey = hg_stream_key(l->p.seed, HG_DOM_ROUND, l->p.worker);
	for (size_t b = 0; b < l->nb && u < l->info.fallback_lanes; b++) {
		const struct lhc_block *bk = &l->blk[b];
		const double scale = hg_pow2(hg_scale_shift(&l->p, l->gcodes[b]));
		const uint32_t lim = hg_code_limit_bits(l->gcodes[b]);
		const size_t end = bk->cand_off + bk->ncand;

		for (; u < l->info.fallback_lanes && l->unresolved[u] < end; u++) {
			size_t g = b * l->p.block + l->cand_pos[l->unresolved[u]];

			if (hg_abs_bits(x[g]) >= lim)
				return -ERANGE;
			hg_st_be32(out_be32 + 4 * u,
				   (uint32_t)quant1(&l->p, rkey, x[g], scale,
						    l->first + g));
		}
	}
	return 0;
}

int hg_lhc_decode(const struct hg_lhc *l, const uint8_t *gfallback_be32, float *y)
{
	size_t u = 0;
	int isa;

	if (!l || l->state < LHC_PEELED || (l->n && !y) ||
	    (l->info.fallback_lanes && !gfallback_be32))
		return -EINVAL;
	isa = hg_codec_isa();
	for (size_t b = 0; b < l->nb; b++) {
		const struct lhc_block *bk = &l->blk[b];
		float *yb = y + b * l->p.block;
		const size_t end = bk->cand_off + bk->ncand;
		double scale;

		/* peeled values (0 where unresolved), then the fallback's */
		hg_decode_block(l, b, (const uint8_t *)(l->values + bk->cand_off),
				false, isa, yb);
		if (u < l->info.fallback_lanes && l->unresolved[u] < end) {
			scale = hg_pow2(-hg_scale_shift(&l->p, l->gcodes[b]));
			for (; u < l->info.fallback_lanes && l->unresolved[u] < end;
			     u++)
				yb[l->cand_pos[l->unresolved[u]]] =
					(float)((double)(int32_t)hg_ld_be32(
							gfallback_be32 + 4 * u) *
						scale);
		}
		/* the candidates only: every other element is +0 */
		hg_divide_at(yb, l->cand_pos + bk->cand_off, bk->ncand,
			     l->p.divisor);
	}
	return 0;
}

/* ---- auto ------------------------------------------------------------- */

/*
 * auto decides on exact byte counts (docs/PROTOCOL.md "auto's rule").
 * After the meta phase (exponents and counts, paid by every choice alike)
 * the remaining bytes of dense (4 n) and blocks (4 x the lanes of the
 * non-zero blocks) are exact; union's are its index bytes (exact: the plan
 * depends only on codes and counts) plus 4 per candidate, and a block's
 * candidates are at least ceil(C_b / W) (no position is counted by more
 * than W workers).  lhc never sends fewer bytes than union (its sketch and
 * fallback carry at least the 4 bytes per candidate union sends), so it is
 * never the smallest.  When dense or blocks sends no more than that lower
 * bound of union, it is the smallest: chosen now.  Otherwise the index
 * phase runs and hg_auto_choose_indexed compares the exact counts; if it
 * then picks dense or blocks, the index was paid for nothing, at most
 * 1/32 of dense or blocks (one bit per element against 32).
 */
static void auto_dense_blocks(const struct hg_params *p, size_t n,
			      const int8_t *gcodes, uint64_t *dense,
			      uint64_t *blocks)
{
	size_t nb = hg_nblocks(p, n);

	*dense = 4 * (uint64_t)n;
	*blocks = 0;
	for (size_t b = 0; b < nb; b++)
		if (gcodes[b] != HG_EXP_ZERO)
			*blocks += 4 * (uint64_t)hg_block_len(p, n, b);
}

/* Predicted time of the dense or blocks values phase: 4 bytes and one
 * value_ps per lane. */
static hg_u128 values_time(const struct hg_params *p,
			   const struct cost_terms *ct, uint64_t bytes)
{
	return (hg_u128)bytes * ct->xb + (hg_u128)(bytes / 4) * p->cost.value_ps;
}

int hg_auto_choose(const struct hg_params *p, size_t n, const int8_t *gcodes,
		   const uint8_t *gcounts_be32)
{
	uint64_t dense, blocks, union_lo = 0, best;
	hg_u128 t_union_lo = 0, td, tk;
	struct cost_terms ct;
	size_t nb;
	int rc = hg_params_check(p);

	if (rc)
		return rc;
	if (n && (!gcodes || !gcounts_be32))
		return -EINVAL;
	nb = hg_nblocks(p, n);
	cost_terms(p, &ct);
	auto_dense_blocks(p, n, gcodes, &dense, &blocks);
	for (size_t b = 0; b < nb; b++) {
		uint32_t len = (uint32_t)hg_block_len(p, n, b);
		uint32_t cnt = hg_ld_be32(gcounts_be32 + 4 * b);
		uint64_t lo = ((uint64_t)cnt + p->workers - 1) / p->workers;
		struct lhc_block bk;
		hg_u128 ix;

		if (gcodes[b] == HG_EXP_ZERO)
			continue;
		if (lo > len)
			lo = len;
		ix = plan_index(p, &ct, len, cnt, &bk);
		union_lo += index_bytes_of(&bk, len) + 4 * lo;
		t_union_lo += ix + (hg_u128)lo * ct.lane;
	}
	if (ct.timed) {
		td = values_time(p, &ct, dense) + ct.rt;
		tk = values_time(p, &ct, blocks) + ct.rt;
		t_union_lo += 2 * ct.rt;
		if ((td <= tk ? td : tk) <= t_union_lo)
			return td <= tk ? HG_M_DENSE : HG_M_BLOCKS;
		return HG_M_UNION;
	}
	best = dense <= blocks ? dense : blocks;
	if (best <= union_lo)
		return dense <= blocks ? HG_M_DENSE : HG_M_BLOCKS;
	return HG_M_UNION;
}

int hg_auto_choose_indexed(const struct hg_lhc *l)
{
	uint64_t dense, blocks, un;
	struct cost_terms ct;

	if (!l || l->state < LHC_INDEXED)
		return -EINVAL;
	auto_dense_blocks(&l->p, l->n, l->gcodes, &dense, &blocks);
	un = 4 * (uint64_t)l->info.candidates;
	cost_terms(&l->p, &ct);
	if (ct.timed) {
		hg_u128 td = values_time(&l->p, &ct, dense);
		hg_u128 tk = values_time(&l->p, &ct, blocks);
		hg_u128 tu = (hg_u128)l->info.candidates * ct.lane;

		if (td <= tk && td <= tu)
			return HG_M_DENSE;
		if (tk <= tu)
			return HG_M_BLOCKS;
		return HG_M_UNION;
	}
	if (dense <= blocks && dense <= un)
		return HG_M_DENSE;
	if (blocks <= un)
		return HG_M_BLOCKS;
	return HG_M_UNION;
}
