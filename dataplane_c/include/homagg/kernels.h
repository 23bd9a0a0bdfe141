/* SPDX-License-Identifier: Apache-2.0 */
/*
 * homagg/kernels.h - the aggregation ALU: what the aggregator does to a slot.
 *
 * Each op combines one packet payload ("in") into an accumulator ("acc"),
 * lane by lane, over big-endian lanes exactly as they are on the wire, so a
 * result payload is the accumulator itself.  Integer operations only.
 *
 * The ops, their codes and lane widths are the table of homagg/protocol.h:
 *
 *   op            in lane        acc lane      acc = ...
 *   HG_OP_SUM32   int32 BE       int32 BE      acc + in (wrapping)
 *   HG_OP_OR      byte           byte          acc | in
 *   HG_OP_MAX8    int8           int8          max(acc, in) (signed)
 *   HG_OP_NC8     NC8 code       int32 BE      acc + expand(in, top) (wrapping)
 *
 * NC8 code: bit 7 sign, bits 0..6 m; m = 0 is zero, else the lane adds
 * +-2^(top - m) when 1 <= m <= top, and 0 when m > top.
 *
 * The best implementation for the CPU (AVX-512, AVX2, portable) is chosen at
 * run time; hg_aggregate_isa() forces one for tests and benchmarks.
 */
#ifndef HOMAGG_KERNELS_H
#define HOMAGG_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "homagg/protocol.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cdef-begin */
enum hg_isa {
	HG_ISA_PORTABLE = 0,
	HG_ISA_AVX2 = 1,
	HG_ISA_AVX512 = 2,
	HG_ISA_BEST = 3,
};

/* Does this CPU (and build) support the ISA?  HG_ISA_BEST is always true. */
bool hg_isa_supported(enum hg_isa isa);
/* The ISA hg_aggregate() uses. */
enum hg_isa hg_isa_best(void);
const char *hg_isa_name(enum hg_isa isa);

/* Fill lanes accumulator lanes with the op's identity (0, or -128 for MAX8). */
int hg_op_identity(enum hg_op op, uint8_t *acc, size_t lanes);

/*
 * acc = acc (op) in over lanes lanes; top is the NC8 shift (ignored by the
 * other ops).  Returns 0, -EINVAL (bad op, NULL), -ENOTSUP (ISA missing).
 */
int hg_aggregate(enum hg_op op, uint8_t *acc, const uint8_t *in, size_t lanes,
		 int top);
int hg_aggregate_isa(enum hg_isa isa, enum hg_op op, uint8_t *acc,
		     const uint8_t *in, size_t lanes, int top);
/* cdef-end */

/* Hot-path form: the kernel of one op for the best ISA, resolved once. */
typedef void (*hg_kernel_fn)(uint8_t *acc, const uint8_t *in, size_t lanes,
			     int top);
hg_kernel_fn hg_kernel(enum hg_op op, enum hg_isa isa);

#ifdef __cplusplus
}
#endif

#endif /* HOMAGG_KERNELS_H */
