/* SPDX-License-Identifier: Apache-2.0 */
/*
 * homagg/protocol.h - the protocol's vocabulary, one X-macro table each:
 * aggregation ops (what the aggregator's ALU does to a slot), phases (one
 * run of lanes a worker sends, aggregated with one op) and allreduce
 * methods (which phases, in which steps).  Everything else reads these
 * facts from here: the kernels and the wire parser (lane widths, the
 * exponent field, identities), the engine, the worker client's method
 * sequencer, and Python (homagg.protocol, through the accessors below).
 *
 * Wire numbers are part of docs/PROTOCOL.md: op and method codes never
 * change; a new one takes the next number.  Op codes run 1..HG_OP__COUNT
 * and method codes 1..HG_M__COUNT in table order (protocol.c checks it).
 *
 * CONTRIBUTING.md lists the files a new op, phase or method touches.
 */
#ifndef HOMAGG_PROTOCOL_H
#define HOMAGG_PROTOCOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * HG_FOREACH_OP(X): X(NAME, id, code, in_lane, acc_lane, identity, exp_max, doc)
 *   id        lower-case name: the op's name ("sum32") and its kernels' prefix
 *   code      the header's op byte
 *   in_lane   bytes of one lane a worker sends
 *   acc_lane  bytes of one accumulator (and result) lane
 *   identity  byte every accumulator byte starts from
 *   exp_max   the header's exp field must lie in 0..exp_max (0: must be 0)
 */
/* clang-format off */
#define HG_FOREACH_OP(X)                                                       \
	X(SUM32, sum32, 1, 4, 4, 0x00, 0, "int32 wrapping add")                  \
	X(OR, or, 2, 1, 1, 0x00, 0, "bitwise OR")                                \
	X(MAX8, max8, 3, 1, 1, 0x80, 0, "signed int8 max")                       \
	X(NC8, nc8, 4, 1, 4, 0x00, 31,                                           \
	  "NC8 code expanded to +-2^(exp - m), added into int32 lanes")
/* clang-format on */

/*
 * HG_FOREACH_PHASE(X): X(NAME, "name", OP, doc) - a run of lanes every
 * worker sends, aggregated with op HG_OP_<OP>.  The index (HG_PH_NAME,
 * from 0) is also the index of hg_client_stats.bytes_sent / _received.
 */
/* clang-format off */
#define HG_FOREACH_PHASE(X)                                                    \
	X(EXPONENTS, "exponents", MAX8, "block exponent codes, one int8 per block") \
	X(COUNTS, "counts", SUM32, "non-zero elements per block")                 \
	X(VALUES, "values", SUM32, "fixed-point values of the blocks sent")       \
	X(CODES, "codes", NC8, "natural-compression codes, one byte per element") \
	X(INDEX, "index", OR, "candidate index: bitmaps or Bloom filters")        \
	X(SKETCH, "sketch", SUM32, "count sketch cells")                          \
	X(FALLBACK, "fallback", SUM32, "values of the candidates peeling left")   \
	X(UNION, "union", SUM32,                                                 \
	  "values at every global candidate, 0 where the worker has none")
/* clang-format on */

/* The phase bit of a step mask. */
#define HG_PHB(NAME) (1u << HG_PH_##NAME)

/*
 * HG_FOREACH_METHOD(X): X(NAME, "name", code, flags, doc, steps...)
 * Each step is a mask of phases (HG_PHB) sent together; a step starts once
 * the previous one is complete, because its sizes and contents come from
 * the previous results.
 */
/* clang-format off */
#define HG_FOREACH_METHOD(X)                                                   \
	X(DENSE, "dense", 1, HG_MF_EXACT | HG_MF_CANDIDATE | HG_MF_GROUPS,       \
	  "fixed-point values of every block (SwitchML-like)",                   \
	  HG_PHB(EXPONENTS), HG_PHB(VALUES))                                     \
	X(BLOCKS, "blocks", 2, HG_MF_EXACT | HG_MF_SKIP_ZERO | HG_MF_CANDIDATE | \
	  HG_MF_GROUPS,                                                          \
	  "fixed-point values of the blocks non-zero anywhere (OmniReduce-like)",\
	  HG_PHB(EXPONENTS), HG_PHB(VALUES))                                     \
	X(LHC, "lhc", 3, HG_MF_EXACT | HG_MF_GROUPS,                             \
	  "index and count sketch, peeled; stalled candidates sent again",       \
	  HG_PHB(EXPONENTS) | HG_PHB(COUNTS), HG_PHB(INDEX), HG_PHB(SKETCH),     \
	  HG_PHB(FALLBACK))                                                      \
	X(NC, "nc", 4, HG_MF_GROUPS,                                             \
	  "natural compression (unbiased, lossy by design)",                     \
	  HG_PHB(EXPONENTS), HG_PHB(CODES))                                      \
	X(AUTO, "auto", 5, HG_MF_EXACT | HG_MF_CHOOSES | HG_MF_GROUPS,           \
	  "the exact method with the fewest bytes, chosen from exact counts",    \
	  HG_PHB(EXPONENTS), HG_PHB(COUNTS))                                     \
	X(UNION, "union", 6, HG_MF_EXACT | HG_MF_CANDIDATE | HG_MF_GROUPS,       \
	  "lhc's index, then every worker's value at every candidate, scattered",\
	  HG_PHB(EXPONENTS) | HG_PHB(COUNTS), HG_PHB(INDEX), HG_PHB(UNION))
/* clang-format on */

#ifdef __cplusplus
extern "C" {
#endif

/* cdef-begin */
/*
 * hg_method_info.flags.  EXACT: the result is bit-exact (homagg.reference).
 * SKIP_ZERO: the values phase leaves out the blocks zero on every worker.
 * CANDIDATE: auto may choose it.  CHOOSES: after its own steps, continue
 * with the steps of the method hg_auto_choose() picks, skipping each step
 * whose phases were all sent already; when that method has an index step,
 * choose again after it (hg_auto_choose_indexed) and continue the same way
 * (docs/PROTOCOL.md "auto's rule").  A counts phase in a step after the
 * exponents' carries one lane per block non-zero somewhere, not one per
 * block.  GROUPS: every step works block by block, so block groups may go
 * through the steps independently (the client's pipelined phases,
 * docs/PROTOCOL.md "Pipelined block groups"; auto then chooses per group).
 */
#define HG_MF_EXACT 1
#define HG_MF_SKIP_ZERO 2
#define HG_MF_CANDIDATE 4
#define HG_MF_CHOOSES 8
#define HG_MF_GROUPS 16

#define HG_METHOD_MAX_STEPS 8

enum hg_op {
#define HG_OP_ENUM_(NAME, id, code, in, acc, ident, exp_max, doc)              \
	HG_OP_##NAME = code,
	HG_FOREACH_OP(HG_OP_ENUM_)
#undef HG_OP_ENUM_
};

enum hg_phase {
#define HG_PH_ENUM_(NAME, name, op, doc) HG_PH_##NAME,
	HG_FOREACH_PHASE(HG_PH_ENUM_)
#undef HG_PH_ENUM_
		HG_PH__COUNT
};

enum hg_method {
#define HG_M_ENUM_(NAME, name, code, flags, doc, ...) HG_M_##NAME = code,
	HG_FOREACH_METHOD(HG_M_ENUM_)
#undef HG_M_ENUM_
};

struct hg_op_info {
	int code;
	const char *name;
	uint8_t in_lane;  /* bytes */
	uint8_t acc_lane; /* bytes */
	uint8_t identity; /* accumulator byte before any contribution */
	int8_t exp_max;   /* header exp in 0..exp_max */
	const char *doc;
};

struct hg_phase_info {
	int index; /* enum hg_phase */
	const char *name;
	int op; /* enum hg_op */
	const char *doc;
};

struct hg_method_info {
	int code; /* enum hg_method */
	const char *name;
	uint32_t flags; /* HG_MF_* */
	uint32_t nsteps;
	uint32_t steps[HG_METHOD_MAX_STEPS]; /* phase masks (1 << enum hg_phase), nsteps used */
	const char *doc;
};

/* Number of ops / phases / methods, and the i-th (0-based) entry of each
 * table; NULL when i is out of range. */
int hg_op_count(void);
const struct hg_op_info *hg_op_at(int i);
int hg_phase_count(void);
const struct hg_phase_info *hg_phase_at(int i);
int hg_method_count(void);
const struct hg_method_info *hg_method_at(int i);

/* The entry of a wire code; NULL for an unknown code. */
const struct hg_op_info *hg_op_get(int op);
const struct hg_method_info *hg_method_get(int method);

bool hg_op_valid(int op);
/* Bytes of one input lane / one accumulator lane of op; 0 for a bad op. */
size_t hg_op_in_lane_bytes(enum hg_op op);
size_t hg_op_acc_lane_bytes(enum hg_op op);
/* "sum32", ...; "unknown" for a bad code. */
const char *hg_op_name(int op);
const char *hg_phase_name(int phase);
const char *hg_method_name(enum hg_method m);
/* cdef-end */

/* Counts as constants, for array sizes. */
enum {
#define HG_OP_ONE_(...) +1
	HG_OP__COUNT = 0 HG_FOREACH_OP(HG_OP_ONE_),
	HG_M__COUNT = 0 HG_FOREACH_METHOD(HG_OP_ONE_),
#undef HG_OP_ONE_
};

/* The op table (protocol.c), row op - 1 for wire code op. */
extern const struct hg_op_info hg_op_table[HG_OP__COUNT];

/* Inline per-op facts for the packet path; 0 (exp_max: -1) for a bad op. */
static inline size_t hg_op_in_lane(unsigned op)
{
	return op - 1u < HG_OP__COUNT ? hg_op_table[op - 1].in_lane : 0;
}

static inline size_t hg_op_acc_lane(unsigned op)
{
	return op - 1u < HG_OP__COUNT ? hg_op_table[op - 1].acc_lane : 0;
}

static inline int hg_op_exp_max(unsigned op)
{
	return op - 1u < HG_OP__COUNT ? hg_op_table[op - 1].exp_max : -1;
}

static inline uint8_t hg_op_identity_byte(unsigned op)
{
	return op - 1u < HG_OP__COUNT ? hg_op_table[op - 1].identity : 0;
}

#ifdef __cplusplus
}
#endif

#endif /* HOMAGG_PROTOCOL_H */
