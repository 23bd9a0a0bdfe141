/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec.c - parameters, block exponents, non-zero counts, fixed-point
 * quantisation and dequantisation (homagg/codec.h, docs/PROTOCOL.md
 * "Codec").
 *
 * The hot loops have an AVX2 form (codec_avx2.c, chosen at run time) and
 * a portable form; both give the same bits: the AVX2 conversions use the
 * default round-to-nearest-even mode exactly like the scalar code.  The
 * path of every codec loop is chosen here (hg_codec_isa()).
 */
#include <errno.h>
#include <float.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "homagg/kernels.h"

#include "codec_pvt.h"

/*
 * The ISA path of the hot loops (homagg/codec.h "hg_codec_isa"): read from
 * HOMAGG_CODEC_ISA at the first call, kept until hg_codec_isa_reload().
 * A process-wide setting like the CPU's own flags: every codec call of the
 * process runs on one path.  INT_MIN: not read yet.
 */
static int codec_isa_cached = INT_MIN;

/* The CPU features a path's loops use: AVX2 with BMI2 (pext) for avx2,
 * AVX-512 F, DQ (64-bit lane multiplies), BW (16-bit lanes) and BMI2 for
 * avx512 (VBMI2 is used when present, else that one loop takes AVX2). */
static bool codec_isa_cpu(int isa)
{
	__builtin_cpu_init();
	switch (isa) {
	case HG_ISA_PORTABLE:
		return true;
	case HG_ISA_AVX2:
		return __builtin_cpu_supports("avx2") &&
		       __builtin_cpu_supports("bmi2");
	case HG_ISA_AVX512:
		return codec_isa_cpu(HG_ISA_AVX2) &&
		       __builtin_cpu_supports("avx512f") &&
		       __builtin_cpu_supports("avx512dq") &&
		       __builtin_cpu_supports("avx512bw");
	default:
		return false;
	}
}

static int codec_isa_read(void)
{
	const char *v = getenv("HOMAGG_CODEC_ISA");
	int isa;

	if (!v || !*v) {
		if (codec_isa_cpu(HG_ISA_AVX512))
			return HG_ISA_AVX512;
		return codec_isa_cpu(HG_ISA_AVX2) ? HG_ISA_AVX2 : HG_ISA_PORTABLE;
	}
	if (strcmp(v, "portable") == 0)
		isa = HG_ISA_PORTABLE;
	else if (strcmp(v, "avx2") == 0)
		isa = HG_ISA_AVX2;
	else if (strcmp(v, "avx512") == 0)
		isa = HG_ISA_AVX512;
	else
		return -EINVAL;
	return codec_isa_cpu(isa) ? isa : -ENOTSUP;
}

int hg_codec_isa(void)
{
	int isa = __atomic_load_n(&codec_isa_cached, __ATOMIC_RELAXED);

	if (isa == INT_MIN) {
		isa = codec_isa_read();
		__atomic_store_n(&codec_isa_cached, isa, __ATOMIC_RELAXED);
	}
	return isa;
}

int hg_codec_isa_reload(void)
{
	int isa = codec_isa_read();

	__atomic_store_n(&codec_isa_cached, isa, __ATOMIC_RELAXED);
	return isa;
}

bool hg_codec_avx2(void)
{
	return hg_codec_isa() >= HG_ISA_AVX2;
}

bool hg_codec_avx512(void)
{
	return hg_codec_isa() == HG_ISA_AVX512;
}

int hg_params_check(const struct hg_params *p)
{
	int isa = hg_codec_isa();

	if (isa < 0) /* HOMAGG_CODEC_ISA names no path, or one the CPU lacks */
		return isa;
	if (!p)
		return -EINVAL;
	if (p->block < HG_MIN_BLOCK || p->block > HG_MAX_BLOCK || p->block % 64 != 0)
		return -EINVAL;
	if (p->workers < 1 || p->workers > HG_MAX_WORKERS)
		return -ERANGE;
	if (p->worker >= p->workers)
		return -ERANGE;
	if (!(p->sketch_cells_per_candidate >= 0.0f &&
	      p->sketch_cells_per_candidate <= 64.0f))
		return -EINVAL;
	if (p->cost.pkt_ps > HG_COST_MAX_PKT_PS ||
	    p->cost.agg_pkt_ps > HG_COST_MAX_PKT_PS ||
	    p->cost.value_ps > HG_COST_MAX_ELEM_PS ||
	    p->cost.lane_ps > HG_COST_MAX_ELEM_PS ||
	    p->cost.bitmap_ps > HG_COST_MAX_ELEM_PS ||
	    p->cost.probe_ps > HG_COST_MAX_ELEM_PS ||
	    p->cost.sbbf_ps > HG_COST_MAX_ELEM_PS)
		return -ERANGE;
	if (!(p->divisor >= 0.0f && p->divisor <= FLT_MAX))
		return -ERANGE;
	if (p->divisor > 0.0f && p->divisor < FLT_MIN)
		return -ERANGE; /* subnormal: 1/divisor overflows */
	return 0;
}

size_t hg_nblocks(const struct hg_params *p, size_t n)
{
	if (!p || p->block == 0)
		return 0;
	return (n + p->block - 1) / p->block;
}

int hg_log2_workers(const struct hg_params *p)
{
	int l = 0;

	if (!p)
		return 0;
	while ((1u << l) < p->workers)
		l++;
	return l;
}

int hg_scale_shift(const struct hg_params *p, int8_t code)
{
	if (code == HG_EXP_ZERO)
		return 0;
	return 30 - hg_log2_workers(p) - (code + 1);
}

/* ---- exponent codes and non-zero counts: one pass --------------------- */

static void scan_portable(const float *x, size_t len, uint32_t *absmax,
			  uint32_t *nnz)
{
	uint32_t mx = 0, c = 0;

	for (size_t i = 0; i < len; i++) {
		uint32_t a = hg_abs_bits(x[i]);

		mx = a > mx ? a : mx;
		c += a != 0;
	}
	*absmax = mx;
	*nnz = c;
}

/* The same with the AVX2 path (when avx2) for the whole groups of 16. */
static void scan_block(const float *x, size_t len, bool avx2, uint32_t *absmax,
		       uint32_t *nnz)
{
	uint32_t mx = 0, c = 0, tmx, tc;
	size_t i = avx2 ? hg_absmax_nnz_avx2(x, len, &mx, &c) : 0;

	scan_portable(x + i, len - i, &tmx, &tc);
	*absmax = tmx > mx ? tmx : mx;
	*nnz = c + tc;
}

static size_t first_nonfinite(const float *x, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (hg_abs_bits(x[i]) >= 0x7F800000u)
			return i;
	return len;
}

/*
 * The fused pass: codes and/or counts (either may be NULL).  check_finite
 * makes NaN/Inf an error (-EDOM); otherwise they count as non-zero.
 */
static int exp_nnz(const struct hg_params *p, const float *x, size_t n,
		   int8_t *codes, uint8_t *counts_be32, size_t *bad_index,
		   bool check_finite)
{
	int rc = hg_params_check(p);
	size_t nb;
	bool avx2;

	if (rc)
		return rc;
	if (n && !x)
		return -EINVAL;
	nb = hg_nblocks(p, n);
	avx2 = hg_codec_avx2();
	for (size_t b = 0; b < nb; b++) {
		size_t len = hg_block_len(p, n, b);
		const float *xb = x + b * p->block;
		uint32_t mx, c;

		scan_block(xb, len, avx2, &mx, &c);
		if (check_finite && mx >= 0x7F800000u) {
			if (bad_index)
				*bad_index = b * p->block +
					     first_nonfinite(xb, len);
			return -EDOM;
		}
		if (codes)
			codes[b] = hg_code_of_absmax(mx);
		if (counts_be32)
			hg_st_be32(counts_be32 + 4 * b, c);
	}
	return 0;
}

int hg_exp_encode(const struct hg_params *p, const float *x, size_t n,
		  int8_t *codes, size_t *bad_index)
{
	if (!codes && n)
		return -EINVAL;
	return exp_nnz(p, x, n, codes, NULL, bad_index, true);
}

int hg_exp_nnz_encode(const struct hg_params *p, const float *x, size_t n,
		      int8_t *codes, uint8_t *counts_be32, size_t *bad_index)
{
	if ((!codes || !counts_be32) && n)
		return -EINVAL;
	return exp_nnz(p, x, n, codes, counts_be32, bad_index, true);
}

int hg_nnz_counts(const struct hg_params *p, const float *x, size_t n,
		  uint8_t *counts_be32)
{
	if (!counts_be32 && n)
		return -EINVAL;
	return exp_nnz(p, x, n, NULL, counts_be32, NULL, false);
}

/* ---- quantisation ----------------------------------------------------- */

size_t hg_quantized_lanes(const struct hg_params *p, size_t n,
			  const int8_t *gcodes, uint32_t qflags)
{
	size_t nb, lanes = 0;

	if (hg_params_check(p) || (n && !gcodes))
		return 0;
	if (!(qflags & HG_Q_SKIP_ZERO))
		return n;
	nb = hg_nblocks(p, n);
	for (size_t b = 0; b < nb; b++)
		if (gcodes[b] != HG_EXP_ZERO)
			lanes += hg_block_len(p, n, b);
	return lanes;
}

/* The checks of hg_quantize and hg_dequantize: the parameters, the
 * buffers (bufs: none is NULL) unless n is 0, the flags. */
static int quant_check(const struct hg_params *p, size_t n, bool bufs,
		       uint32_t qflags)
{
	int rc = hg_params_check(p);

	if (rc)
		return rc;
	if ((n && !bufs) || (qflags & ~(uint32_t)HG_Q_SKIP_ZERO))
		return -EINVAL;
	return 0;
}

/* Returns false when an element is out of the block's range. */
static bool quant_block_portable(const float *x, size_t len, int8_t code,
				 int shift, uint8_t *out)
{
	const uint32_t lim = hg_code_limit_bits(code);
	const double scale = hg_pow2(shift);
	uint32_t bad = 0;

	for (size_t i = 0; i < len; i++) {
		bad |= hg_abs_bits(x[i]) >= lim;
		hg_st_be32(out + 4 * i, (uint32_t)hg_rne((double)x[i] * scale));
	}
	return !bad;
}

/* The same with the AVX2 path (when avx2) for the whole groups of 8. */
static bool quant_block(const float *x, size_t len, int8_t code, int shift,
			bool avx2, uint8_t *out)
{
	bool bad = false;
	size_t i = avx2 ? hg_quant_avx2(x, len, code, shift, out, &bad) : 0;

	return !bad &&
	       quant_block_portable(x + i, len - i, code, shift, out + 4 * i);
}

static bool quant_block_stochastic(const float *x, size_t len, int8_t code,
				   int shift, uint64_t key, uint64_t g0,
				   uint8_t *out)
{
	const uint32_t lim = hg_code_limit_bits(code);
	const double scale = hg_pow2(shift);
	uint32_t bad = 0;

	for (size_t i = 0; i < len; i++) {
		uint32_t u = (uint32_t)(hg_hash(key, g0 + i) >> 32);

		bad |= hg_abs_bits(x[i]) >= lim;
		hg_st_be32(out + 4 * i, (uint32_t)hg_sr((double)x[i] * scale, u));
	}
	return !bad;
}

int hg_quantize(const struct hg_params *p, const float *x, size_t n,
		const int8_t *gcodes, uint32_t qflags, uint8_t *out_be32)
{
	return hg_quantize_at(p, 0, x, n, gcodes, qflags, out_be32);
}

int hg_quantize_at(const struct hg_params *p, uint64_t first, const float *x,
		   size_t n, const int8_t *gcodes, uint32_t qflags,
		   uint8_t *out_be32)
{
	int rc = quant_check(p, n, x && gcodes && out_be32, qflags);
	bool avx2, sto;
	uint64_t key;
	size_t nb, off = 0;

	if (rc)
		return rc;
	avx2 = hg_codec_avx2();
	sto = p->flags & HG_F_STOCHASTIC;
	key = hg_stream_key(p->seed, HG_DOM_ROUND, p->worker);
	nb = hg_nblocks(p, n);
	for (size_t b = 0; b < nb; b++) {
		size_t len = hg_block_len(p, n, b);
		const float *xb = x + b * p->block;
		int8_t code = gcodes[b];
		int s = hg_scale_shift(p, code);
		bool ok;

		if (code == HG_EXP_ZERO && (qflags & HG_Q_SKIP_ZERO)) {
			uint32_t mx, c;

			scan_portable(xb, len, &mx, &c);
			if (mx)
				return -ERANGE;
			continue;
		}
		if (sto)
			ok = quant_block_stochastic(xb, len, code, s, key,
						    first + b * p->block,
						    out_be32 + 4 * off);
		else
			ok = quant_block(xb, len, code, s, avx2,
					 out_be32 + 4 * off);
		if (!ok)
			return -ERANGE;
		off += len;
	}
	return 0;
}

/* ---- dequantisation --------------------------------------------------- */

static void dequant_block_portable(const uint8_t *in, size_t len, int shift,
				   float *y)
{
	const double scale = hg_pow2(-shift);

	for (size_t i = 0; i < len; i++)
		y[i] = (float)((double)(int32_t)hg_ld_be32(in + 4 * i) * scale);
}

int hg_dequantize(const struct hg_params *p, const uint8_t *sum_be32, size_t n,
		  const int8_t *gcodes, uint32_t qflags, float *y)
{
	int rc = quant_check(p, n, sum_be32 && gcodes && y, qflags);
	size_t nb, off = 0;
	bool avx2;

	if (rc)
		return rc;
	avx2 = hg_codec_avx2();
	nb = hg_nblocks(p, n);
	for (size_t b = 0; b < nb; b++) {
		size_t len = hg_block_len(p, n, b);
		float *yb = y + b * p->block;
		const uint8_t *in = sum_be32 + 4 * off;
		int s = hg_scale_shift(p, gcodes[b]);
		size_t i;

		if (gcodes[b] == HG_EXP_ZERO && (qflags & HG_Q_SKIP_ZERO)) {
			memset(yb, 0, len * sizeof(float));
			continue;
		}
		i = avx2 ? hg_dequant_avx2(in, len, s, yb) : 0;
		dequant_block_portable(in + 4 * i, len - i, s, yb + i);
		hg_divide(yb, len, p->divisor); /* in L1: 16 KB a block */
		off += len;
	}
	return 0;
}
