/* SPDX-License-Identifier: Apache-2.0 */
/*
 * homagg/codec.h - the lossless homomorphic codec (worker side).
 *
 * Every function here is pure computation on caller-owned buffers: no global
 * state, no I/O.  A tensor of n float32 elements is cut into quantisation
 * blocks of p->block elements (the last block may be shorter), block b
 * starting at element b * p->block.
 *
 * Wire buffers ("be32" below) hold big-endian int32 lanes, exactly as they
 * travel in a packet payload; they are typed uint8_t * and sized in lanes.
 *
 * The encoder and decoder of each phase (homagg/protocol.h lists the phases
 * and, per method, which phases it sends in which steps):
 *
 *   exponents: hg_exp_encode (hg_exp_nnz_encode with counts) -> MAX8 -> global codes
 *   counts   : hg_nnz_counts                      -> SUM32 -> hg_lhc_create / hg_auto_choose
 *   values   : hg_quantize (HG_Q_SKIP_ZERO: blocks) -> SUM32 -> hg_dequantize
 *   codes    : hg_nc_encode -> NC8 (expands into int32 lanes) -> hg_dequantize
 *   index    : hg_lhc_index_encode                -> OR    -> hg_lhc_set_index
 *   sketch   : hg_lhc_sketch_encode               -> SUM32 -> hg_lhc_peel
 *   fallback : hg_lhc_fallback_encode             -> SUM32 -> hg_lhc_decode
 *   union    : hg_union_encode                    -> SUM32 -> hg_union_decode
 *
 * lhc, union and auto encode from one pass over the gradient (hg_scan_encode:
 * exponents, counts, the local bitmap and the non-zeros; then the *_scan
 * encoders and hg_union_encode read only the scan).
 */
#ifndef HOMAGG_CODEC_H
#define HOMAGG_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "homagg/protocol.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cdef-begin */
#define HG_PROTOCOL_VERSION 3
#define HG_MAX_WORKERS 256
#define HG_MIN_BLOCK 64
#define HG_MAX_BLOCK 65536
#define HG_DEFAULT_BLOCK 4096
/* Block exponent code of a block that is exactly zero on every worker. */
#define HG_EXP_ZERO -128

/* hg_params.flags */
#define HG_F_STOCHASTIC 1

/* hg_quantize / hg_dequantize flags */
#define HG_Q_SKIP_ZERO 1

/* Bounds of the cost model's coefficients (hg_params_check: -ERANGE). */
#define HG_COST_MAX_ELEM_PS 1000000
#define HG_COST_MAX_PKT_PS 100000000
/* Framing bytes per packet the cost model charges (docs/PROTOCOL.md). */
#define HG_COST_FRAME_BYTES 98

/*
 * The cost model (docs/PROTOCOL.md "The cost model"): the job's link and
 * its hosts' CPU costs, registered with the job, the same on every worker.
 * link_mbit == 0: no model, every choice minimises bytes (the bytes rules).
 * CPU coefficients are picoseconds.
 */
struct hg_cost {
	uint32_t link_mbit; /* link rate, Mbit/s; 0 = the bytes rules */
	uint32_t payload_bytes; /* payload per packet; 0 = 1024 (the client sets its own) */
	uint32_t rtt_ns; /* one phase round trip */
	uint32_t pkt_ps; /* worker CPU per packet sent and its result received */
	uint32_t agg_pkt_ps; /* aggregator CPU per frame received */
	uint32_t value_ps; /* per dense / blocks value lane (quantise + dequantise) */
	uint32_t lane_ps;   /* per union lane (encode + scatter) */
	uint32_t bitmap_ps; /* per element of a bitmap-indexed block */
	uint32_t probe_ps;  /* per element and probe of a Bloom-indexed block */
	uint32_t sbbf_ps;   /* per element of a split-block-indexed block;
			     * 0 = no split-block option (version 3) */
};

/*
 * Parameters every worker of one allreduce agrees on (plus its own id).
 * A zero sketch_cells_per_candidate means the protocol's default sizing; a
 * positive value overrides it (tests use it to force peeling stalls).
 */
struct hg_params {
	uint32_t block; /* quantisation block length, HG_MIN_BLOCK..HG_MAX_BLOCK, multiple of 64 */
	uint32_t workers;   /* W, 1..HG_MAX_WORKERS */
	uint32_t worker;    /* this worker's id, 0..W-1 (stochastic streams) */
	uint32_t flags;     /* HG_F_STOCHASTIC: unbiased stochastic rounding */
	uint64_t seed;      /* seed of every random stream (rounding, NC) */
	uint32_t nc_levels; /* natural dithering levels s; 0 = plain C_nat */
	float sketch_cells_per_candidate; /* 0 = default sizing */
	struct hg_cost cost; /* the job's cost model; all 0 = the bytes rules */
	float divisor; /* 0 or 1: the decoders write the sum; else each element
			* is float32(sum) / divisor, an IEEE float32 division
			* (numpy's y / np.float32(divisor), bit for bit: W gives a
			* DDP hook's mean), fused into the decode while the block
			* is in cache; finite and > 0 */
};

/*
 * 0, or -EINVAL (block), -ERANGE (workers, worker id, a cost coefficient
 * above its bound, a divisor not 0 and not finite and positive); or the error of hg_codec_isa() when HOMAGG_CODEC_ISA
 * names no usable path (every codec call that checks its parameters
 * refuses then).
 */
int hg_params_check(const struct hg_params *p);

/*
 * The ISA path every hot loop of the codec takes (the values of enum
 * hg_isa, homagg/kernels.h: 0 portable, 1 avx2, 2 avx512), the same bits
 * on each.  HOMAGG_CODEC_ISA=portable|avx2|avx512 forces one; unset or
 * empty, the best this CPU has.  Read at the first call (the first codec
 * call of the process) and kept; hg_codec_isa_reload() reads it again
 * (tests, after changing the variable; not while other threads run codec
 * calls).  Returns the path, -EINVAL when the variable names no path, or
 * -ENOTSUP when this CPU lacks it (avx2 needs AVX2 and BMI2; avx512 also
 * AVX-512 F, DQ and BW).
 */
int hg_codec_isa(void);
int hg_codec_isa_reload(void);

/* Number of quantisation blocks of an n-element tensor. */
size_t hg_nblocks(const struct hg_params *p, size_t n);

/* ceil(log2(W)) as used by the scale; 0 for W = 1. */
int hg_log2_workers(const struct hg_params *p);

/*
 * Local block exponent codes: for each block, the frexp exponent e of the
 * block's max |x| clamped to [-126, 128], stored as e - 1 (int8), or
 * HG_EXP_ZERO for a block that is all +-0.  One int8 lane per block.
 * Returns 0; -EDOM if x holds NaN or Inf (first such index in *bad_index,
 * which may be NULL); -EINVAL / -ERANGE for bad parameters.
 */
int hg_exp_encode(const struct hg_params *p, const float *x, size_t n,
		  int8_t *codes, size_t *bad_index);

/* Scale shift s_b = 30 - ceil(log2 W) - E_b of a global code (0 for zero). */
int hg_scale_shift(const struct hg_params *p, int8_t code);

/* Number of int32 lanes hg_quantize writes for these codes and flags. */
size_t hg_quantized_lanes(const struct hg_params *p, size_t n,
			  const int8_t *gcodes, uint32_t qflags);

/*
 * Fixed-point quantisation q = round(x * 2^s_b) with the global codes,
 * round-half-even (or stochastic with HG_F_STOCHASTIC), as big-endian int32
 * lanes.  With HG_Q_SKIP_ZERO the blocks whose global code is HG_EXP_ZERO
 * are left out.  Returns 0, -EINVAL, -ERANGE.
 */
int hg_quantize(const struct hg_params *p, const float *x, size_t n,
		const int8_t *gcodes, uint32_t qflags, uint8_t *out_be32);

/*
 * y = sum * 2^-s_b rounded once to float32, from the aggregated lanes laid
 * out as hg_quantize wrote them; skipped blocks decode to +0.
 */
int hg_dequantize(const struct hg_params *p, const uint8_t *sum_be32, size_t n,
		  const int8_t *gcodes, uint32_t qflags, float *y);

/* Per-block count of non-zero elements, one big-endian int32 lane per block. */
int hg_nnz_counts(const struct hg_params *p, const float *x, size_t n,
		  uint8_t *counts_be32);

/*
 * hg_exp_encode and hg_nnz_counts in one pass over x (the lhc meta phase
 * reads the gradient once).  Same results and errors as the two calls.
 */
int hg_exp_nnz_encode(const struct hg_params *p, const float *x, size_t n,
		      int8_t *codes, uint8_t *counts_be32, size_t *bad_index);

/*
 * The one-pass encode: a scan of x computes the exponent codes and the
 * non-zero counts (the meta phase's lanes) and keeps, per block, the
 * positions and values of the non-zero elements and the local non-zero
 * bitmap.  The lhc and union phases then read only the scan (the *_scan
 * functions), not the tensor again.  A scan is reused across tensors (its
 * buffers grow as needed).
 */
struct hg_scan;

struct hg_scan *hg_scan_create(void);
void hg_scan_destroy(struct hg_scan *s);

/*
 * Scan x: codes and counts_be32 as hg_exp_nnz_encode writes them (either
 * may be NULL).  Returns 0; -EDOM if x holds NaN or Inf (first such index in
 * *bad_index, which may be NULL); -EINVAL / -ERANGE (parameters); -ENOMEM.
 * A failed scan leaves s unusable until the next successful one.
 */
int hg_scan_encode(struct hg_scan *s, const struct hg_params *p, const float *x,
		   size_t n, int8_t *codes, uint8_t *counts_be32,
		   size_t *bad_index);

/* Non-zero elements of the last successful scan. */
size_t hg_scan_nonzeros(const struct hg_scan *s);

/* ---- lhc: index + count sketch + peeling ------------------------------ */

struct hg_lhc;

struct hg_lhc_info {
	size_t index_bytes;   /* bytes of the OR phase */
	size_t bitmap_blocks; /* blocks indexed by a bitmap */
	size_t bloom_blocks; /* blocks indexed by a Bloom filter (either layout) */
	size_t split_blocks;   /* of them, split-block filters (version 3) */
	size_t candidates;     /* global candidates (after hg_lhc_set_index) */
	size_t sketch_lanes;   /* int32 cells of the sketch phase */
	size_t stalled_blocks; /* blocks whose peeling stalled (after peel) */
	size_t fallback_lanes; /* unresolved candidates sent in the fallback */
};

/*
 * Plan an lhc allreduce from the global exponent codes and the global
 * (summed) non-zero counts: chooses bitmap or Bloom per block and lays out
 * the index.  Returns NULL on bad arguments or allocation failure.
 */
struct hg_lhc *hg_lhc_create(const struct hg_params *p, size_t n,
			     const int8_t *gcodes, const uint8_t *gcounts_be32);
void hg_lhc_destroy(struct hg_lhc *l);
int hg_lhc_get_info(const struct hg_lhc *l, struct hg_lhc_info *info);

/* This worker's index (bitmap / Bloom bits), hg_lhc_info.index_bytes long. */
int hg_lhc_index_encode(const struct hg_lhc *l, const float *x, uint8_t *index);

/* The same bytes from a scan of x (the one-pass encode). */
int hg_lhc_index_encode_scan(const struct hg_lhc *l, const struct hg_scan *s,
			     uint8_t *index);

/*
 * Take the OR of every worker's index: candidates and sketch layout.  Any
 * bytes are accepted (a hostile index only makes more candidates).
 */
int hg_lhc_set_index(struct hg_lhc *l, const uint8_t *gindex);

/* This worker's count sketch, sketch_lanes big-endian int32 cells. */
int hg_lhc_sketch_encode(const struct hg_lhc *l, const float *x,
			 uint8_t *cells_be32);

/* The same cells from a scan of x. */
int hg_lhc_sketch_encode_scan(const struct hg_lhc *l, const struct hg_scan *s,
			      uint8_t *cells_be32);

/*
 * Peel the summed sketch; afterwards info tells the stalls. Deterministic.
 * -EPROTO when the cells are inconsistent with the index (never a crash).
 */
int hg_lhc_peel(struct hg_lhc *l, const uint8_t *gcells_be32);

/* This worker's quantised values at the unresolved candidates. */
int hg_lhc_fallback_encode(const struct hg_lhc *l, const float *x,
			   uint8_t *out_be32);

/* Final result: every element of y (n floats), bit-exact. */
int hg_lhc_decode(const struct hg_lhc *l, const uint8_t *gfallback_be32, float *y);

/* ---- union: the candidates' values (docs/PROTOCOL.md "union") -------- */

/*
 * Lanes of the union values phase: one int32 per global candidate, after
 * hg_lhc_set_index (hg_lhc_info.candidates).
 */
size_t hg_union_lanes(const struct hg_lhc *l);

/*
 * This worker's quantised value at every global candidate, in block then
 * position order, 0 where it has none (hg_union_lanes big-endian int32
 * lanes), from a scan of x.  Returns 0; -EINVAL (no index set, scan of
 * another tensor); -ERANGE (a value outside its block's global range, or a
 * non-zero in a block zero everywhere); -EPROTO (a non-zero of this worker
 * that the global index does not list: the index is not the OR of the
 * workers' indexes).
 */
int hg_union_encode(const struct hg_lhc *l, const struct hg_scan *s,
		    uint8_t *out_be32);

/*
 * Final result from the summed candidate values: every element of y
 * (n floats) written once, +0 at non-candidates.  Any summed values decode
 * (to some float32).  Returns 0 or -EINVAL.
 */
int hg_union_decode(const struct hg_lhc *l, const uint8_t *gvals_be32, float *y);

/*
 * auto, decided on exact byte counts (docs/PROTOCOL.md "auto's rule").
 * From the meta phase (global codes and summed counts): HG_M_DENSE or
 * HG_M_BLOCKS when one of them is certainly the smallest exact method (it
 * sends no more than the least bytes union could send), else HG_M_UNION:
 * run the index phase, then hg_auto_choose_indexed makes the final choice.
 * Returns the method, or -EINVAL / -ERANGE.
 */
int hg_auto_choose(const struct hg_params *p, size_t n, const int8_t *gcodes,
		   const uint8_t *gcounts_be32);

/*
 * auto's final choice after the index phase (l after hg_lhc_set_index):
 * the fewest remaining bytes among dense (4 n), blocks (4 x the lanes of
 * the non-zero blocks) and union (4 x the candidates); ties go to dense,
 * then blocks.  Returns HG_M_DENSE, HG_M_BLOCKS or HG_M_UNION, or -EINVAL.
 */
int hg_auto_choose_indexed(const struct hg_lhc *l);

/* ---- nc: natural compression / natural dithering ---------------------- */

/* The exponent header field of NC8 packets: 31 - ceil(log2 W). */
int hg_nc_top(const struct hg_params *p);

/*
 * One NC8 code per element (docs/PROTOCOL.md "NC8"): unbiased stochastic
 * rounding to a power of two (natural dithering with p->nc_levels levels),
 * always stochastic, seeded by (seed, worker, index).  The aggregated int32
 * lanes decode with hg_dequantize(flags 0).
 */
int hg_nc_encode(const struct hg_params *p, const float *x, size_t n,
		 const int8_t *gcodes, uint8_t *codes);
/* cdef-end */

#ifdef __cplusplus
}
#endif

#endif /* HOMAGG_CODEC_H */
