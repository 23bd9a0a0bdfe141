/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec_pvt.h - helpers shared by codec.c, codec_lhc.c and codec_nc.c.
 *
 * The fixed-point contract (docs/PROTOCOL.md "Fixed point"): for a block
 * with global code c != HG_EXP_ZERO, E = c + 1 and s = 30 - L - E with
 * L = ceil(log2 W).  v = x * 2^s is exact in float64 (24-bit significand,
 * |s| <= 156), so every rounding below is a single exact decision.
 */
#ifndef HOMAGG_CODEC_PVT_H
#define HOMAGG_CODEC_PVT_H

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "homagg/codec.h"
#include "be32_pvt.h"
#include "hash_pvt.h"

/* Absolute-value bits of a float32: monotonic in |x| for finite x. */
static inline uint32_t hg_abs_bits(float x)
{
	uint32_t b;

	memcpy(&b, &x, sizeof(b));
	return b & 0x7FFFFFFFu;
}

/* Exponent code of a block from the largest absolute-value bits. */
static inline int8_t hg_code_of_absmax(uint32_t absmax)
{
	int be;

	if (absmax == 0)
		return HG_EXP_ZERO;
	be = (int)(absmax >> 23);
	/* normal: max in [2^(be-127), 2^(be-126)), frexp e = be - 126;
	 * subnormal (be = 0): e <= -126, clamped to -126. */
	return (int8_t)(be == 0 ? -127 : be - 127);
}

/*
 * Bits of 2^E for E = code + 1 in [-126, 128]: a finite x is within the
 * block's range iff hg_abs_bits(x) < this (2^128 gives the Inf pattern).
 */
static inline uint32_t hg_code_limit_bits(int8_t code)
{
	if (code == HG_EXP_ZERO)
		return 1; /* only +-0 allowed */
	return (uint32_t)(code + 1 + 127) << 23;
}

/*
 * Whether a quantisation's power-of-two scale lets the vector paths work
 * in float32: a float32 times such a scale is exact unless the product is
 * below 2^-126, and there both roundings give 0; so where the scale is a
 * normal float32 (2^-126 to 2^127) and every product fits an int32 (the
 * callers' range check), rounding the float32 product to nearest even
 * gives hg_rne's int32.
 */
static inline bool hg_quant_f32_ok(double scale)
{
	return scale >= 0x1p-126 && scale <= 0x1p127;
}

/*
 * Whether a decode's power-of-two scale lets the vector paths work in
 * float32: where every non-zero int32 sum (|sum| from 1 to 2^31) times it
 * is a normal float32, rounding the sum to float32 and scaling it after is
 * the single rounding of the float64 product.
 */
static inline bool hg_scale_f32_ok(double scale)
{
	return scale >= 0x1p-126 && scale <= 0x1p96;
}

/* Round-half-even of an exact float64 v with |v| < 2^51 (default FP mode). */
static inline int32_t hg_rne(double v)
{
	const double m = 0x1.8p52; /* not folded: no -ffast-math */

	return (int32_t)(int64_t)((v + m) - m);
}

/*
 * Stochastic rounding of an exact v: floor(v) + 1 iff u / 2^32 < v - floor(v)
 * (exact comparison; u is the top 32 bits of the element's hash).
 */
static inline int32_t hg_sr(double v, uint32_t u)
{
	double f = floor(v);

	return (int32_t)(int64_t)f + ((double)u * 0x1p-32 < v - f);
}

/* Number of elements of block b. */
static inline size_t hg_block_len(const struct hg_params *p, size_t n, size_t b)
{
	size_t start = b * p->block;
	size_t len = n - start;

	return len < p->block ? len : p->block;
}

/* 2^s as float64 for a shift s in [-106, 156]. */
/*
 * y[i] = y[i] / d for i < len (d = p->divisor; nothing when it is 0 or 1).
 * A power of two d multiplies by 1/d instead: the same real number, so the
 * same correctly rounded float32, subnormals included, and vectorised
 * multiplies instead of divisions.
 */
static inline void hg_divide(float *y, size_t len, float d)
{
	int e;

	if (d == 0.0f || d == 1.0f)
		return;
	/* runs of 16: fixed-length inner loops the compiler vectorises at -O2
	 * (SSE on the portable build: mulps / divps) */
	if (frexpf(d, &e) == 0.5f) {
		const float r = 1.0f / d;

		for (; len >= 16; len -= 16, y += 16)
			for (int k = 0; k < 16; k++)
				y[k] *= r;
		for (size_t i = 0; i < len; i++)
			y[i] *= r;
		return;
	}
	for (; len >= 16; len -= 16, y += 16)
		for (int k = 0; k < 16; k++)
			y[k] /= d;
	for (size_t i = 0; i < len; i++)
		y[i] /= d;
}

/* The same at the listed positions of y only (the other elements are 0,
 * and 0 / d = +0 as written). */
static inline void hg_divide_at(float *y, const uint16_t *pos, size_t npos, float d)
{
	int e;

	if (d == 0.0f || d == 1.0f)
		return;
	if (frexpf(d, &e) == 0.5f) {
		const float r = 1.0f / d;

		for (size_t j = 0; j < npos; j++)
			y[pos[j]] *= r;
		return;
	}
	for (size_t j = 0; j < npos; j++)
		y[pos[j]] /= d;
}

static inline double hg_pow2(int s)
{
	return ldexp(1.0, s);
}

/*
 * One pass over a gradient (codec_scan.c): per block the largest
 * absolute-value bits and the non-zero elements (block-relative position
 * and value, in position order), and the local non-zero bitmap.  The lhc
 * index, sketch and union phases read these instead of the tensor.
 */
struct hg_scan {
	size_t n;       /* elements of the scanned tensor */
	uint32_t block; /* its block length */
	size_t nb;      /* blocks */
	bool valid;     /* the last hg_scan_encode succeeded */
	size_t *off;    /* nb + 1: block b's non-zeros are off[b]..off[b+1]-1 */
	uint32_t *absmax; /* nb: largest hg_abs_bits of the block */
	uint16_t *pos;    /* position in its block, per non-zero */
	float *val;       /* value, per non-zero */
	uint8_t *bitmap;  /* ceil(n / 8) bytes: bit g set iff x[g] != 0 */
	size_t cap, nb_cap, bm_cap;
};

/* true when the AVX2 paths may be used: hg_codec_isa() is avx2 or avx512
 * (a loop with no AVX-512 form takes its AVX2 one on the avx512 path). */
bool hg_codec_avx2(void);

/* true when the AVX-512 (F, DQ, BW) paths may be used: hg_codec_isa() is
 * avx512. */
bool hg_codec_avx512(void);

/*
 * codec_avx2.c: the whole vectors of a block of len elements (the caller
 * does the rest with the portable code); each returns how many elements it
 * did.  hg_absmax_nnz_avx2: the largest absolute-value bits and the
 * non-zero count of them.  hg_quant_avx2: their fixed-point lanes
 * (big-endian) at out, *bad set when one is out of the code's range.
 * hg_dequant_avx2: float32 at y from the int32 lanes at in.
 */
size_t hg_absmax_nnz_avx2(const float *x, size_t len, uint32_t *absmax,
			  uint32_t *nnz);
size_t hg_quant_avx2(const float *x, size_t len, int8_t code, int shift,
		     uint8_t *out, bool *bad);
size_t hg_dequant_avx2(const uint8_t *in, size_t len, int shift, float *y);

/*
 * codec_scan_avx512.c (AVX-512 F, BW, DQ): the scan of the first len16
 * elements of a block (a multiple of 16): non-zero positions and values at
 * pos / val (16 entries of slack past the last), the bitmap bits at bm,
 * absolute-value bits max-ed into *amax; returns the non-zero count.
 */
uint32_t hg_scan_avx512(const float *xb, uint32_t len16, uint16_t *pos,
			float *val, uint8_t *bm, uint32_t *amax);
/* The same with AVX2 (and BMI2) for the first len8 elements (a multiple of
 * 8; 8 entries of slack), codec_scan_avx2.c. */
uint32_t hg_scan_avx2(const float *xb, uint32_t len8, uint16_t *pos, float *val,
		      uint8_t *bm, uint32_t *amax);

/*
 * hg_quantize and hg_nc_encode of the elements x[0..n-1] that sit at
 * first.. in the whole tensor (first a multiple of p->block): the random
 * streams are indexed by the element's position in the whole tensor, so a
 * tensor encoded block group by block group (the client's pipelined
 * phases) gives the bytes of the encoding in one piece.
 */
int hg_quantize_at(const struct hg_params *p, uint64_t first, const float *x,
		   size_t n, const int8_t *gcodes, uint32_t qflags,
		   uint8_t *out_be32);
int hg_nc_encode_at(const struct hg_params *p, uint64_t first, const float *x,
		    size_t n, const int8_t *gcodes, uint8_t *codes);

/*
 * The same for lhc and union: hg_lhc_create of the n elements at first..
 * of the whole tensor (their codes and counts), whose hashes (Bloom,
 * sketch, rounding) use the whole tensor's element index; and a scan of
 * its blocks: view describes blocks b0 .. b0 + nb - 1 (n elements) of s,
 * without copying (it points into s, which must outlive it).
 */
struct hg_lhc *hg_lhc_create_at(const struct hg_params *p, uint64_t first,
				size_t n, const int8_t *gcodes,
				const uint8_t *gcounts_be32);
void hg_scan_view(const struct hg_scan *s, size_t b0, size_t nb, size_t n,
		  struct hg_scan *view);

/*
 * An lhc's candidate list (a position per candidate, about one per element
 * at high density: 2 bytes each) kept from one lhc to the next, as a
 * worker's client does across its allreduces: a list allocated afresh
 * grew by doubling and faulted its pages in on every allreduce.  The
 * client holds the longest list so far (2 bytes per candidate of its
 * largest tensor, rounded up to a power of two) until it is destroyed.
 */
struct hg_lhc_scratch {
	uint16_t *cand_pos;
	size_t cand_cap;
};

/* hg_lhc_create_at() starting from s's list (s is left empty; NULL: none) */
struct hg_lhc *hg_lhc_create_with(const struct hg_params *p, uint64_t first,
				  size_t n, const int8_t *gcodes,
				  const uint8_t *gcounts_be32,
				  struct hg_lhc_scratch *s);
/* hg_lhc_destroy(l) that keeps l's list in s when it is longer than the
 * one s holds (that one is freed) */
void hg_lhc_destroy_into(struct hg_lhc *l, struct hg_lhc_scratch *s);
void hg_lhc_scratch_free(struct hg_lhc_scratch *s);

#endif /* HOMAGG_CODEC_PVT_H */
