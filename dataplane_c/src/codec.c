/* SPDX-License-Identifier: Apache-2.0 */
/*
 * codec.c - parameters, block exponents, non-zero counts, fixed-point
 * quantisation and dequantisation (homagg/codec.h, docs/PROTOCOL.md
 * "Codec").
 *
 * The hot loops have an AVX2 form (target attribute, chosen at run time)
 * and a portable form; both give the same bits: the AVX2 conversions use
 * the default round-to-nearest-even mode exactly like the scalar code.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

#include "codec_pvt.h"

bool hg_codec_avx2(void)
{
	const char *isa = getenv("HOMAGG_CODEC_ISA");

	if (isa && strcmp(isa, "portable") == 0)
		return false;
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2");
}

bool hg_codec_avx512(void)
{
	const char *isa = getenv("HOMAGG_CODEC_ISA");

	if (isa && (strcmp(isa, "portable") == 0 || strcmp(isa, "avx2") == 0))
		return false;
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx512f") &&
	       __builtin_cpu_supports("avx512dq");
}

int hg_params_check(const struct hg_params *p)
{
	if (!p)
		return -EINVAL;
	if (p->block < HG_MIN_BLOCK || p->block > HG_MAX_BLOCK ||
	    p->block % 64 != 0)
		return -EINVAL;
	if (p->workers < 1 || p->workers > HG_MAX_WORKERS)
		return -ERANGE;
	if (p->worker >= p->workers)
		return -ERANGE;
	if (!(p->sketch_cells_per_candidate >= 0.0f &&
	      p->sketch_cells_per_candidate <= 64.0f))
		return -EINVAL;
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

__attribute__((target("avx2")))
static void scan_avx2(const float *x, size_t len, uint32_t *absmax,
		      uint32_t *nnz)
{
	const __m256i m = _mm256_set1_epi32(0x7FFFFFFF);
	const __m256i z = _mm256_setzero_si256();
	__m256i mx0 = z, mx1 = z, zc0 = z, zc1 = z;
	uint32_t lanes[8], zeros = 0, mx = 0, tmx, tc;
	size_t i = 0;

	for (; i + 16 <= len; i += 16) {
		__m256i a = _mm256_and_si256(
			_mm256_loadu_si256((const __m256i *)(x + i)), m);
		__m256i b = _mm256_and_si256(
			_mm256_loadu_si256((const __m256i *)(x + i + 8)), m);

		mx0 = _mm256_max_epu32(mx0, a);
		mx1 = _mm256_max_epu32(mx1, b);
		zc0 = _mm256_sub_epi32(zc0, _mm256_cmpeq_epi32(a, z));
		zc1 = _mm256_sub_epi32(zc1, _mm256_cmpeq_epi32(b, z));
	}
	_mm256_storeu_si256((__m256i *)lanes, _mm256_max_epu32(mx0, mx1));
	for (int k = 0; k < 8; k++)
		mx = lanes[k] > mx ? lanes[k] : mx;
	_mm256_storeu_si256((__m256i *)lanes, _mm256_add_epi32(zc0, zc1));
	for (int k = 0; k < 8; k++)
		zeros += lanes[k];
	scan_portable(x + i, len - i, &tmx, &tc);
	*absmax = tmx > mx ? tmx : mx;
	*nnz = (uint32_t)(i - zeros) + tc;
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

		if (avx2)
			scan_avx2(xb, len, &mx, &c);
		else
			scan_portable(xb, len, &mx, &c);
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

__attribute__((target("avx2")))
static bool quant_block_avx2(const float *x, size_t len, int8_t code,
			     int shift, uint8_t *out)
{
	const uint32_t lim = hg_code_limit_bits(code);
	const __m256i m = _mm256_set1_epi32(0x7FFFFFFF);
	const __m256i limv = _mm256_set1_epi32((int32_t)(lim - 1));
	const __m256d scale = _mm256_set1_pd(hg_pow2(shift));
	const __m256i bswap = _mm256_setr_epi8(
		3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12,
		3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12);
	__m256i bad = _mm256_setzero_si256();
	size_t i = 0;

	for (; i + 8 <= len; i += 8) {
		__m256 v = _mm256_loadu_ps(x + i);
		__m256i a = _mm256_and_si256(_mm256_castps_si256(v), m);
		__m128i lo, hi;

		bad = _mm256_or_si256(bad, _mm256_cmpgt_epi32(a, limv));
		/* cvtpd_epi32 rounds to nearest even (default MXCSR) */
		lo = _mm256_cvtpd_epi32(_mm256_mul_pd(
			_mm256_cvtps_pd(_mm256_castps256_ps128(v)), scale));
		hi = _mm256_cvtpd_epi32(_mm256_mul_pd(
			_mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)), scale));
		_mm256_storeu_si256(
			(__m256i *)(out + 4 * i),
			_mm256_shuffle_epi8(_mm256_set_m128i(hi, lo), bswap));
	}
	if (!_mm256_testz_si256(bad, bad))
		return false;
	return quant_block_portable(x + i, len - i, code, shift, out + 4 * i);
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
		hg_st_be32(out + 4 * i,
			   (uint32_t)hg_sr((double)x[i] * scale, u));
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
	int rc = hg_params_check(p);
	bool avx2, sto;
	uint64_t key;
	size_t nb, off = 0;

	if (rc)
		return rc;
	if (n && (!x || !gcodes || !out_be32))
		return -EINVAL;
	if (qflags & ~(uint32_t)HG_Q_SKIP_ZERO)
		return -EINVAL;
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
		else if (avx2)
			ok = quant_block_avx2(xb, len, code, s,
					      out_be32 + 4 * off);
		else
			ok = quant_block_portable(xb, len, code, s,
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

__attribute__((target("avx2")))
static void dequant_block_avx2(const uint8_t *in, size_t len, int shift,
			       float *y)
{
	const __m256d scale = _mm256_set1_pd(hg_pow2(-shift));
	const __m256i bswap = _mm256_setr_epi8(
		3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12,
		3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12);
	size_t i = 0;

	for (; i + 8 <= len; i += 8) {
		__m256i v = _mm256_shuffle_epi8(
			_mm256_loadu_si256((const __m256i *)(in + 4 * i)),
			bswap);
		/* both conversions are exact or round once, like the scalar */
		__m128 lo = _mm256_cvtpd_ps(_mm256_mul_pd(
			_mm256_cvtepi32_pd(_mm256_castsi256_si128(v)), scale));
		__m128 hi = _mm256_cvtpd_ps(_mm256_mul_pd(
			_mm256_cvtepi32_pd(_mm256_extracti128_si256(v, 1)),
			scale));

		_mm256_storeu_ps(y + i, _mm256_set_m128(hi, lo));
	}
	dequant_block_portable(in + 4 * i, len - i, shift, y + i);
}

int hg_dequantize(const struct hg_params *p, const uint8_t *sum_be32,
		  size_t n, const int8_t *gcodes, uint32_t qflags, float *y)
{
	int rc = hg_params_check(p);
	size_t nb, off = 0;
	bool avx2;

	if (rc)
		return rc;
	if (n && (!sum_be32 || !gcodes || !y))
		return -EINVAL;
	if (qflags & ~(uint32_t)HG_Q_SKIP_ZERO)
		return -EINVAL;
	avx2 = hg_codec_avx2();
	nb = hg_nblocks(p, n);
	for (size_t b = 0; b < nb; b++) {
		size_t len = hg_block_len(p, n, b);
		float *yb = y + b * p->block;

		if (gcodes[b] == HG_EXP_ZERO && (qflags & HG_Q_SKIP_ZERO)) {
			memset(yb, 0, len * sizeof(float));
			continue;
		}
		if (avx2)
			dequant_block_avx2(sum_be32 + 4 * off, len,
					   hg_scale_shift(p, gcodes[b]), yb);
		else
			dequant_block_portable(sum_be32 + 4 * off, len,
					       hg_scale_shift(p, gcodes[b]),
					       yb);
		off += len;
	}
	return 0;
}
