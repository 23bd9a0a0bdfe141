/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec_lhc_pvt.h - the lhc plan (struct hg_lhc), shared by codec_lhc.c
 * (index, sketch, peeling, auto), its vector paths (codec_lhc_avx2.c,
 * codec_lhc_avx512.c) and codec_union.c (the union values phase, which
 * reuses lhc's meta and index phases and its candidate list) with its
 * vector paths (codec_union_avx512.c).
 */
#ifndef HOMAGG_CODEC_LHC_PVT_H
#define HOMAGG_CODEC_LHC_PVT_H

#include <errno.h>

#include "codec_pvt.h"

/* LHC_SPLIT: a split-block Bloom filter (options 5-9, version 3):
 * bloom_bits = 256 * its blocks, bloom_k = 8 */
enum lhc_kind { LHC_NONE = 0, LHC_BITMAP = 1, LHC_BLOOM = 2, LHC_SPLIT = 3 };

enum lhc_state { LHC_PLANNED = 0, LHC_INDEXED = 1, LHC_PEELED = 2 };

struct lhc_block {
	size_t index_off;  /* byte offset of the block's index */
	size_t cand_off;   /* global rank of the block's first candidate */
	size_t sketch_off; /* lane offset of the block's cells */
	uint32_t ncand;    /* global candidates */
	uint32_t t;        /* sub-table size: 3t cells */
	uint32_t bloom_bits;
	uint8_t kind;
	uint8_t bloom_k;
	uint8_t bloom_opt; /* the protocol's option: 0-4 bloom_opts, 5-9 split_opts */
};

struct hg_lhc {
	struct hg_params p;
	size_t n, nb;
	uint64_t first; /* element index of its element 0 in the whole tensor
			     * (hg_lhc_create_at): the hashes' g is first + i */
	int8_t *gcodes;
	struct lhc_block *blk;
	int state;
	struct hg_lhc_info info;
	uint64_t key_sketch, key_bloom;
	/* after set_index */
	uint16_t *cand_pos; /* position in its block, per candidate */
	size_t cand_cap;
	uint8_t *gindex; /* copy of the global index, 8 zero bytes of slack */
	/* after peel */
	int32_t *values;      /* peeled sum per candidate (0 if unresolved) */
	uint32_t *unresolved; /* global ranks, ascending */
	/* peeling scratch, sized for the largest block: per cell its value,
	 * count + rank sum, queue slot (one more: a push stores its slot
	 * before it knows whether to advance); per candidate its cells and sign
	 * mask */
	uint32_t *s_cell, *s_queue;
	uint64_t *s_cid;
	uint32_t *s_c0, *s_c1, *s_c2, *s_sm;
	size_t s_cells_cap, s_cand_cap;
};

/*
 * Cells and signs of the elements g0 + pos[j], j < n, in structure-of-arrays
 * form: c0/c1/c2[j] the three cells, sm[j] = 0 (positive) or 0xFFFFFFFF
 * (negative), so that a signed value is (v ^ sm) - sm.  Hashing a whole
 * batch at once lets it run as straight-line (vector) code.
 */
struct cell_batch {
	uint32_t *c0, *c1, *c2, *sm;
};

/*
 * Split-block Bloom filters (docs/PROTOCOL.md "Split-block Bloom options"):
 * element g sets (and is tested for) one bit in each of the eight 32-bit
 * little-endian words of one 256-bit block of the filter.  The hash is
 * 32-bit arithmetic only, so that 8 or 16 elements hash in one vector:
 * s = fmix32(hi32(g) ^ kb), h1 = fmix32((lo32(g) + ka) ^ s) picks the block
 * (h1 * nblk) >> 32, h2 = fmix32(h1 ^ kb) and h1 the bits: word w's is
 * lhc_split_bit(h1, h2, w); ka, kb the low and high halves of the Bloom
 * key.
 */
#define SPLIT_BLOCK_BYTES 32

/* The bit of word w (0-7) of an element whose hash words are h1, h2:
 * 5-bit fields of h2 for words 0-5, of h1's low bits for 6 and 7. */
static inline uint32_t lhc_split_bit(uint32_t h1, uint32_t h2, int w)
{
	return w < 6 ? (h2 >> (5 * w)) & 31 : (h1 >> (5 * (w - 6))) & 31;
}

/* MurmurHash3's 32-bit finaliser. */
static inline uint32_t lhc_fmix32(uint32_t h)
{
	h ^= h >> 16;
	h *= 0x85EBCA6Bu;
	h ^= h >> 13;
	h *= 0xC2B2AE35u;
	return h ^ (h >> 16);
}

/* The part of a split-block hash that depends on hi32(g) only. */
static inline uint32_t lhc_split_s(uint64_t key, uint64_t g)
{
	return lhc_fmix32((uint32_t)(g >> 32) ^ (uint32_t)(key >> 32));
}

/* Element g's block (of nblk) and its bit in each word (mask[w]). */
static inline uint32_t lhc_split_probe(uint64_t key, uint64_t g, uint32_t nblk,
				       uint32_t mask[8])
{
	uint32_t h1 = lhc_fmix32(((uint32_t)g + (uint32_t)key) ^
				 lhc_split_s(key, g));
	uint32_t h2 = lhc_fmix32(h1 ^ (uint32_t)(key >> 32));

	for (int w = 0; w < 8; w++)
		mask[w] = 1u << lhc_split_bit(h1, h2, w);
	return (uint32_t)(((uint64_t)h1 * nblk) >> 32);
}

/* The candidates of a split-block filter of nblk blocks among the first
 * len8 elements (a multiple of 8) of a block whose first element is g0,
 * lo32(g0) + len8 not past 2^32 (AVX2); see codec_lhc_avx2.c. */
uint32_t hg_lhc_split_candidates_avx2(uint64_t key, uint64_t g0, uint32_t nblk,
				      const uint8_t *filt, uint32_t len8,
				      uint16_t *out);

/* The same with AVX-512 (F, DQ) for filters of at most 32 blocks among the
 * first len16 elements (a multiple of 16; 16 entries of slack at out);
 * see codec_lhc_avx512.c. */
#define SPLIT_VEC512_BLOCKS 32
uint32_t hg_lhc_split_candidates_avx512(uint64_t key, uint64_t g0,
					uint32_t nblk, const uint8_t *filt,
					uint32_t len16, uint16_t *out);

/*
 * The vector paths (codec_lhc_avx2.c, codec_lhc_avx512.c), each giving the
 * same bits as the portable code of codec_lhc.c, which chooses them at run
 * time (hg_codec_avx2(), hg_codec_avx512()).
 *
 * hg_lhc_bitmap_avx2: the bitmap of whole groups of 32 of the len elements
 * of x at out; returns how many elements it did (the caller does the rest).
 */
size_t hg_lhc_bitmap_avx2(const float *x, size_t len, uint8_t *out);
/* Cells of the elements g0 + pos[j] for whole groups of 4 of the n (AVX2);
 * returns how many it did (the caller does the rest). */
uint32_t hg_lhc_cells_avx2(uint64_t key, uint64_t g0, uint32_t t,
			   const uint16_t *pos, uint32_t n,
			   const struct cell_batch *cb);
/* The signed values (q ^ sm[j]) - sm[j], q the deterministic rounding of
 * v[j] * scale (in range), of whole groups of 8 of the n (AVX2); returns
 * how many it did (the caller does the rest). */
uint32_t hg_lhc_signed_avx2(const float *v, const uint32_t *sm, uint32_t n,
			    double scale, uint32_t *sv);
/* nc host-order 32-bit cells to big-endian in place, whole groups of 8
 * (AVX2); returns how many it did (the caller does the rest). */
size_t hg_lhc_cells_be_avx2(uint8_t *cells, size_t nc);
/* The Bloom candidates among the first len8 elements (a multiple of 8) of
 * a block whose first element is g0 (AVX2, BMI2); see codec_lhc_avx2.c. */
uint32_t hg_lhc_bloom_candidates_avx2(uint64_t key, uint64_t g0, uint32_t k,
				      uint32_t bits, const uint8_t *filt,
				      uint32_t len8, uint16_t *out);
/* Positions of the set bits of nwords 64-bit words of a bitmap (AVX2,
 * BMI2; 8 entries of slack); see codec_lhc_avx2.c. */
uint32_t hg_lhc_bitmap_positions_avx2(const uint8_t *idx, uint32_t nwords,
				      uint16_t *out);
/* The peel's passes over a block's nc cells, whole groups of 8 (AVX2,
 * BMI2): load and byte-swap the cells and zero their counts (returns the
 * cells done); queue the cells of count 1 (returns how many, 8 entries of
 * slack); the OR of the cells of count 0 (non-zero: a value left).  The
 * last two put the cells done in *done.  See codec_lhc_avx2.c. */
uint32_t hg_lhc_peel_load_avx2(const uint8_t *gcells, uint32_t nc,
			       uint32_t *cell, uint64_t *cid);
uint32_t hg_lhc_peel_seed_avx2(const uint64_t *cid, uint32_t nc,
			       uint32_t *queue, uint32_t *done);
uint32_t hg_lhc_peel_bad_avx2(const uint32_t *cell, const uint64_t *cid,
			      uint32_t nc, uint32_t *done);
/* Positions of the set bits of nwords 64-bit words of a bitmap (AVX-512
 * VBMI2, BW); see codec_lhc_avx512.c. */
uint32_t hg_lhc_bitmap_positions_vbmi2(const uint8_t *idx, uint32_t nwords,
				       uint16_t *out);
/* Cells of the elements g0 + pos[j] for whole groups of 8 of the n; returns
 * how many it did (the caller does the rest). */
uint32_t hg_lhc_cells_avx512(uint64_t key, uint64_t g0, uint32_t t,
			     const uint16_t *pos, uint32_t n,
			     const struct cell_batch *cb);
/* The vector Bloom probing computes probes in 32-bit lanes: filters of
 * fewer bits than this (larger ones, which no block of HG_MAX_BLOCK
 * elements chooses, as a bitmap is smaller, take the portable loop). */
#define BLOOM_VEC_BITS (1u << 17)
/* The candidates of a Bloom block among its first len16 elements (a
 * multiple of 16), as hg_lhc_bloom_candidates_avx2 (AVX-512 F, DQ; 16
 * entries of slack at out); see codec_lhc_avx512.c. */
uint32_t hg_lhc_bloom_candidates_avx512(uint64_t key, uint64_t g0, uint32_t k,
					uint32_t bits, const uint8_t *filt,
					uint32_t len16, uint16_t *out);
/* The non-zeros of xb[i0, i1) (i1 - i0 a multiple of 16); see
 * codec_lhc_avx512.c. */
uint32_t hg_lhc_compact_avx512(const float *xb, uint32_t i0, uint32_t i1,
			       uint16_t *pos, uint32_t *amax);

/*
 * The union values of a bitmap block (gbm: the global bitmap, lbm: this
 * worker's, len elements) from this worker's non-zero values v (16
 * readable past the last), deterministic rounding, into the block's nc
 * candidate lanes at out; codec_union_avx512.c.  Returns the non-zeros
 * consumed, or UINT32_MAX if lbm is not a subset of gbm.  Needs the avx512
 * path of hg_codec_isa().
 */
uint32_t hg_union_bitmap_avx512(const uint8_t *gbm, const uint8_t *lbm,
				uint32_t len, const float *v, double scale,
				uint32_t nc, uint8_t *out);

/*
 * Decode a bitmap block of len elements into y, writing each element once:
 * +0 where the bitmap gbm has no bit, else the next int32 sum of in
 * (big-endian lanes when be, host order otherwise) times scale, rounded
 * once to float32.  codec_union_avx512.c; needs the avx512 path of
 * hg_codec_isa().
 */
void hg_scatter_bitmap(const uint8_t *gbm, uint32_t len, const uint8_t *in,
		       bool be, double scale, float *y);

/*
 * The AVX2 forms of the two above (codec_union_avx2.c; need the avx2 path
 * of hg_codec_isa()): nc / nin is the block's candidate count, the lanes
 * at out and the sums at in (nothing past them is touched).
 */
uint32_t hg_union_bitmap_avx2(const uint8_t *gbm, const uint8_t *lbm,
			      uint32_t len, const float *v, double scale,
			      uint32_t nc, uint8_t *out);
void hg_scatter_bitmap_avx2(const uint8_t *gbm, uint32_t len, const uint8_t *in,
			    uint32_t nin, bool be, double scale, float *y);

/*
 * Decode block b of the plan into yb from one int32 sum per candidate
 * (big-endian lanes when be, host order otherwise): +0 at non-candidates,
 * every element written once (the vector scatter of the ISA path isa,
 * enum hg_isa, when the block has a bitmap).  Shared by union and lhc
 * decode.
 */
void hg_decode_block(const struct hg_lhc *l, size_t b, const uint8_t *in,
		     bool be, int isa, float *yb);

/* 0 when the scan s is of a tensor of the plan's length and blocking. */
static inline int lhc_scan_matches(const struct hg_lhc *l, const struct hg_scan *s)
{
	if (!s || s->n != l->n || s->block != l->p.block || !s->valid)
		return -EINVAL;
	return 0;
}

#endif /* HOMAGG_CODEC_LHC_PVT_H */
