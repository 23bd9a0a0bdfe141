/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The aggregation ALU (homagg/kernels.h): the ops of homagg/protocol.h over
 * big-endian wire lanes, in three implementations that give identical bytes:
 *
 *   portable  plain C, any CPU
 *   AVX2      32-byte vectors, scalar tail
 *   AVX-512   64-byte vectors (AVX-512F + BW), masked tail
 *
 * The SIMD versions are compiled with __attribute__((target(...))) so the
 * whole library keeps one set of compiler flags; hg_kernel() picks one at
 * run time with __builtin_cpu_supports().
 *
 * NC8 arithmetic is modulo 2^32 like SUM32: a code adds +-2^(top - m) when
 * 1 <= m <= top, where 2^k for k >= 32 is 0 (mod 2^32) and 2^31 is INT32_MIN;
 * m = 0 or m > top adds 0.  The vector forms get this for free from
 * vpsllvd, which yields 0 for shift counts outside 0..31.
 */
#include <errno.h>
#include <string.h>

#include "homagg/kernels.h"
#include "be32_pvt.h"

#if defined(__x86_64__) || defined(__i386__)
#define HG_X86 1
#include <immintrin.h>
#endif

/* The int32 (mod 2^32) value one NC8 code adds. */
static inline uint32_t nc8_expand(uint8_t code, int top)
{
	int m = code & 0x7f;
	int k = top - m;
	uint32_t v;

	if (m == 0 || k < 0 || k > 31)
		return 0;
	v = 1u << k;
	return (code & 0x80) ? 0u - v : v;
}

/* ---- portable ---------------------------------------------------------- */

static void sum32_portable(uint8_t *acc, const uint8_t *in, size_t lanes, int top)
{
	(void)top;
	for (size_t i = 0; i < lanes; i++)
		hg_st_be32(acc + 4 * i,
			   hg_ld_be32(acc + 4 * i) + hg_ld_be32(in + 4 * i));
}

static void or_portable(uint8_t *acc, const uint8_t *in, size_t lanes, int top)
{
	(void)top;
	for (size_t i = 0; i < lanes; i++)
		acc[i] |= in[i];
}

static void max8_portable(uint8_t *acc, const uint8_t *in, size_t lanes, int top)
{
	(void)top;
	for (size_t i = 0; i < lanes; i++) {
		int8_t a = (int8_t)acc[i], b = (int8_t)in[i];

		acc[i] = (uint8_t)(b > a ? b : a);
	}
}

static void nc8_portable(uint8_t *acc, const uint8_t *in, size_t lanes, int top)
{
	for (size_t i = 0; i < lanes; i++)
		hg_st_be32(acc + 4 * i,
			   hg_ld_be32(acc + 4 * i) + nc8_expand(in[i], top));
}

#ifdef HG_X86
/* ---- AVX2 -------------------------------------------------------------- */

#define AVX2 __attribute__((target("avx2")))

AVX2 static inline __m256i bswap32_256(__m256i v)
{
	const __m256i shuf = _mm256_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9,
					      8, 15, 14, 13, 12, 3, 2, 1, 0, 7, 6,
					      5, 4, 11, 10, 9, 8, 15, 14, 13, 12);

	return _mm256_shuffle_epi8(v, shuf);
}

AVX2 static void sum32_avx2(uint8_t *acc, const uint8_t *in, size_t lanes, int top)
{
	size_t i = 0;

	for (; i + 8 <= lanes; i += 8) {
		__m256i a = _mm256_loadu_si256((const __m256i *)(acc + 4 * i));
		__m256i b = _mm256_loadu_si256((const __m256i *)(in + 4 * i));

		a = _mm256_add_epi32(bswap32_256(a), bswap32_256(b));
		_mm256_storeu_si256((__m256i *)(acc + 4 * i), bswap32_256(a));
	}
	sum32_portable(acc + 4 * i, in + 4 * i, lanes - i, top);
}

AVX2 static void or_avx2(uint8_t *acc, const uint8_t *in, size_t lanes, int top)
{
	size_t i = 0;

	for (; i + 32 <= lanes; i += 32) {
		__m256i a = _mm256_loadu_si256((const __m256i *)(acc + i));
		__m256i b = _mm256_loadu_si256((const __m256i *)(in + i));

		_mm256_storeu_si256((__m256i *)(acc + i), _mm256_or_si256(a, b));
	}
	or_portable(acc + i, in + i, lanes - i, top);
}

AVX2 static void max8_avx2(uint8_t *acc, const uint8_t *in, size_t lanes, int top)
{
	size_t i = 0;

	for (; i + 32 <= lanes; i += 32) {
		__m256i a = _mm256_loadu_si256((const __m256i *)(acc + i));
		__m256i b = _mm256_loadu_si256((const __m256i *)(in + i));

		_mm256_storeu_si256((__m256i *)(acc + i), _mm256_max_epi8(a, b));
	}
	max8_portable(acc + i, in + i, lanes - i, top);
}

/* Eight NC8 codes -> eight int32 values (mod 2^32). */
AVX2 static inline __m256i nc8_expand_256(__m128i codes8, __m256i vtop)
{
	__m256i c = _mm256_cvtepu8_epi32(codes8);
	__m256i m = _mm256_and_si256(c, _mm256_set1_epi32(0x7f));
	__m256i sign = _mm256_cmpgt_epi32(c, _mm256_set1_epi32(0x7f));
	__m256i zero = _mm256_cmpeq_epi32(m, _mm256_setzero_si256());
	/* top - m < 0 or > 31 shifts to 0 (vpsllvd semantics). */
	__m256i v = _mm256_sllv_epi32(_mm256_set1_epi32(1),
				      _mm256_sub_epi32(vtop, m));

	v = _mm256_andnot_si256(zero, v);
	/* Conditional negate: (v ^ s) - s with s = 0 or -1. */
	return _mm256_sub_epi32(_mm256_xor_si256(v, sign), sign);
}

AVX2 static void nc8_avx2(uint8_t *acc, const uint8_t *in, size_t lanes, int top)
{
	const __m256i vtop = _mm256_set1_epi32(top);
	size_t i = 0;

	for (; i + 8 <= lanes; i += 8) {
		__m128i codes = _mm_loadl_epi64((const __m128i *)(in + i));
		__m256i a = _mm256_loadu_si256((const __m256i *)(acc + 4 * i));

		a = _mm256_add_epi32(bswap32_256(a), nc8_expand_256(codes, vtop));
		_mm256_storeu_si256((__m256i *)(acc + 4 * i), bswap32_256(a));
	}
	nc8_portable(acc + 4 * i, in + i, lanes - i, top);
}

/* ---- AVX-512 (F + BW) --------------------------------------------------- */

#define AVX512 __attribute__((target("avx512f,avx512bw")))

AVX512 static inline __m512i bswap32_512(__m512i v)
{
	const __m512i shuf = _mm512_set_epi8(60, 61, 62, 63, 56, 57, 58, 59, 52,
					     53, 54, 55, 48, 49, 50, 51, 44, 45,
					     46, 47, 40, 41, 42, 43, 36, 37, 38,
					     39, 32, 33, 34, 35, 28, 29, 30, 31,
					     24, 25, 26, 27, 20, 21, 22, 23, 16,
					     17, 18, 19, 12, 13, 14, 15, 8, 9,
					     10, 11, 4, 5, 6, 7, 0, 1, 2, 3);

	/* vpshufb works within 128-bit lanes: indices taken mod 16. */
	return _mm512_shuffle_epi8(v, shuf);
}

AVX512 static void sum32_avx512(uint8_t *acc, const uint8_t *in, size_t lanes,
				int top)
{
	size_t i = 0;

	(void)top;
	for (; i + 16 <= lanes; i += 16) {
		__m512i a = _mm512_loadu_si512(acc + 4 * i);
		__m512i b = _mm512_loadu_si512(in + 4 * i);

		a = _mm512_add_epi32(bswap32_512(a), bswap32_512(b));
		_mm512_storeu_si512(acc + 4 * i, bswap32_512(a));
	}
	if (i < lanes) {
		__mmask16 k = (__mmask16)((1u << (lanes - i)) - 1);
		__m512i a = _mm512_maskz_loadu_epi32(k, acc + 4 * i);
		__m512i b = _mm512_maskz_loadu_epi32(k, in + 4 * i);

		a = _mm512_add_epi32(bswap32_512(a), bswap32_512(b));
		_mm512_mask_storeu_epi32(acc + 4 * i, k, bswap32_512(a));
	}
}

AVX512 static void or_avx512(uint8_t *acc, const uint8_t *in, size_t lanes, int top)
{
	size_t i = 0;

	(void)top;
	for (; i + 64 <= lanes; i += 64) {
		__m512i a = _mm512_loadu_si512(acc + i);
		__m512i b = _mm512_loadu_si512(in + i);

		_mm512_storeu_si512(acc + i, _mm512_or_si512(a, b));
	}
	if (i < lanes) {
		__mmask64 k = (__mmask64)((~0ull) >> (64 - (lanes - i)));
		__m512i a = _mm512_maskz_loadu_epi8(k, acc + i);
		__m512i b = _mm512_maskz_loadu_epi8(k, in + i);

		_mm512_mask_storeu_epi8(acc + i, k, _mm512_or_si512(a, b));
	}
}

AVX512 static void max8_avx512(uint8_t *acc, const uint8_t *in, size_t lanes,
			       int top)
{
	size_t i = 0;

	(void)top;
	for (; i + 64 <= lanes; i += 64) {
		__m512i a = _mm512_loadu_si512(acc + i);
		__m512i b = _mm512_loadu_si512(in + i);

		_mm512_storeu_si512(acc + i, _mm512_max_epi8(a, b));
	}
	if (i < lanes) {
		__mmask64 k = (__mmask64)((~0ull) >> (64 - (lanes - i)));
		__m512i a = _mm512_maskz_loadu_epi8(k, acc + i);
		__m512i b = _mm512_maskz_loadu_epi8(k, in + i);

		_mm512_mask_storeu_epi8(acc + i, k, _mm512_max_epi8(a, b));
	}
}

/* Sixteen NC8 codes -> sixteen int32 values (mod 2^32). */
AVX512 static inline __m512i nc8_expand_512(__m128i codes16, __m512i vtop)
{
	__m512i c = _mm512_cvtepu8_epi32(codes16);
	__m512i m = _mm512_and_si512(c, _mm512_set1_epi32(0x7f));
	__mmask16 neg = _mm512_cmpgt_epi32_mask(c, _mm512_set1_epi32(0x7f));
	__mmask16 nz = _mm512_test_epi32_mask(m, m);
	__m512i v = _mm512_maskz_sllv_epi32(nz, _mm512_set1_epi32(1),
					    _mm512_sub_epi32(vtop, m));

	return _mm512_mask_sub_epi32(v, neg, _mm512_setzero_si512(), v);
}

AVX512 static void nc8_avx512(uint8_t *acc, const uint8_t *in, size_t lanes, int top)
{
	const __m512i vtop = _mm512_set1_epi32(top);
	size_t i = 0;

	for (; i + 16 <= lanes; i += 16) {
		__m128i codes = _mm_loadu_si128((const __m128i *)(in + i));
		__m512i a = _mm512_loadu_si512(acc + 4 * i);

		a = _mm512_add_epi32(bswap32_512(a), nc8_expand_512(codes, vtop));
		_mm512_storeu_si512(acc + 4 * i, bswap32_512(a));
	}
	if (i < lanes) {
		__mmask16 k = (__mmask16)((1u << (lanes - i)) - 1);
		uint8_t tail[16] = { 0 };
		__m128i codes;
		__m512i a;

		/* A 16-byte masked load would need AVX-512VL: copy instead. */
		memcpy(tail, in + i, lanes - i);
		codes = _mm_loadu_si128((const __m128i *)tail);
		a = _mm512_maskz_loadu_epi32(k, acc + 4 * i);

		a = _mm512_add_epi32(bswap32_512(a), nc8_expand_512(codes, vtop));
		_mm512_mask_storeu_epi32(acc + 4 * i, k, bswap32_512(a));
	}
}
#endif /* HG_X86 */

/* ---- selection ---------------------------------------------------------- */

bool hg_isa_supported(enum hg_isa isa)
{
	switch (isa) {
	case HG_ISA_PORTABLE:
	case HG_ISA_BEST:
		return true;
#ifdef HG_X86
	case HG_ISA_AVX2:
		return __builtin_cpu_supports("avx2");
	case HG_ISA_AVX512:
		return __builtin_cpu_supports("avx512f") &&
		       __builtin_cpu_supports("avx512bw");
#endif
	default:
		return false;
	}
}

enum hg_isa hg_isa_best(void)
{
	if (hg_isa_supported(HG_ISA_AVX512))
		return HG_ISA_AVX512;
	if (hg_isa_supported(HG_ISA_AVX2))
		return HG_ISA_AVX2;
	return HG_ISA_PORTABLE;
}

const char *hg_isa_name(enum hg_isa isa)
{
	switch (isa) {
	case HG_ISA_PORTABLE:
		return "portable";
	case HG_ISA_AVX2:
		return "avx2";
	case HG_ISA_AVX512:
		return "avx512";
	case HG_ISA_BEST:
		return "best";
	default:
		return "unknown";
	}
}

int hg_op_identity(enum hg_op op, uint8_t *acc, size_t lanes)
{
	size_t lb = hg_op_acc_lane_bytes(op);

	if (!lb || (!acc && lanes))
		return -EINVAL;
	if (lanes)
		memset(acc, hg_op_identity_byte(op), lanes * lb);
	return 0;
}

/* One kernel per op and ISA, named <op id>_<isa> (homagg/protocol.h). */
#define KERNEL_ROW_portable(NAME, id, code, ...) [code] = id##_portable,
#define KERNEL_ROW_avx2(NAME, id, code, ...) [code] = id##_avx2,
#define KERNEL_ROW_avx512(NAME, id, code, ...) [code] = id##_avx512,

hg_kernel_fn hg_kernel(enum hg_op op, enum hg_isa isa)
{
	if (isa == HG_ISA_BEST)
		isa = hg_isa_best();
	if (!hg_op_valid(op) || !hg_isa_supported(isa))
		return NULL;
	switch (isa) {
	case HG_ISA_PORTABLE: {
		static const hg_kernel_fn k[HG_OP__COUNT + 1] = { HG_FOREACH_OP(
			KERNEL_ROW_portable) };
		return k[op];
	}
#ifdef HG_X86
	case HG_ISA_AVX2: {
		static const hg_kernel_fn k[HG_OP__COUNT + 1] = { HG_FOREACH_OP(
			KERNEL_ROW_avx2) };
		return k[op];
	}
	case HG_ISA_AVX512: {
		static const hg_kernel_fn k[HG_OP__COUNT + 1] = { HG_FOREACH_OP(
			KERNEL_ROW_avx512) };
		return k[op];
	}
#endif
	default:
		return NULL;
	}
}

int hg_aggregate_isa(enum hg_isa isa, enum hg_op op, uint8_t *acc,
		     const uint8_t *in, size_t lanes, int top)
{
	hg_kernel_fn fn;

	if (!hg_op_valid(op) || (unsigned)isa > HG_ISA_BEST)
		return -EINVAL;
	if (lanes && (!acc || !in))
		return -EINVAL;
	if (!hg_isa_supported(isa))
		return -ENOTSUP;
	fn = hg_kernel(op, isa);
	if (!fn)
		return -ENOTSUP;
	if (lanes)
		fn(acc, in, lanes, top);
	return 0;
}

int hg_aggregate(enum hg_op op, uint8_t *acc, const uint8_t *in, size_t lanes,
		 int top)
{
	return hg_aggregate_isa(HG_ISA_BEST, op, acc, in, lanes, top);
}
