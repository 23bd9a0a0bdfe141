/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The protocol's tables (homagg/protocol.h) as data: ops, phases and
 * methods, each generated from its X-macro, with lookups by index (for
 * Python, which builds its enums from them) and by wire code.
 */
#include <stddef.h>

#include "homagg/protocol.h"

#define ARRAY_LEN(a) ((int)(sizeof(a) / sizeof((a)[0])))

const struct hg_op_info hg_op_table[HG_OP__COUNT] = {
#define OP_ROW_(NAME, id, code, in, acc, ident, exp_max, doc)                  \
	{ code, #id, in, acc, ident, exp_max, doc },
	HG_FOREACH_OP(OP_ROW_)
#undef OP_ROW_
};

static const struct hg_phase_info phase_table[] = {
#define PH_ROW_(NAME, name, op, doc) { HG_PH_##NAME, name, HG_OP_##op, doc },
	HG_FOREACH_PHASE(PH_ROW_)
#undef PH_ROW_
};

#define STEPS_LEN_(...) (sizeof((uint32_t[]){ __VA_ARGS__ }) / sizeof(uint32_t))

static const struct hg_method_info method_table[] = {
#define M_ROW_(NAME, name, code, flags, doc, ...)                              \
	{ code, name, flags, STEPS_LEN_(__VA_ARGS__), { __VA_ARGS__ }, doc },
	HG_FOREACH_METHOD(M_ROW_)
#undef M_ROW_
};

/* Wire codes run 1..count in table order, so a code indexes its row. */
#define OP_ORDER_(NAME, id, code, ...)                                         \
	_Static_assert(HG_OP_##NAME == (int)__COUNTER__ - OP_BASE_,            \
		       "op codes 1..n in order");
enum { OP_BASE_ = __COUNTER__ };
HG_FOREACH_OP(OP_ORDER_)
#undef OP_ORDER_
#define M_ORDER_(NAME, name, code, ...)                                        \
	_Static_assert(HG_M_##NAME == (int)__COUNTER__ - M_BASE_,              \
		       "method codes 1..n in order");
enum { M_BASE_ = __COUNTER__ };
HG_FOREACH_METHOD(M_ORDER_)
#undef M_ORDER_
#define M_STEPS_(NAME, name, code, flags, doc, ...)                            \
	_Static_assert(STEPS_LEN_(__VA_ARGS__) <= HG_METHOD_MAX_STEPS,         \
		       "too many steps");
HG_FOREACH_METHOD(M_STEPS_)
#undef M_STEPS_
_Static_assert(HG_PH__COUNT <= 32, "a step mask holds 32 phases");

int hg_op_count(void)
{
	return ARRAY_LEN(hg_op_table);
}

const struct hg_op_info *hg_op_at(int i)
{
	return i >= 0 && i < ARRAY_LEN(hg_op_table) ? &hg_op_table[i] : NULL;
}

int hg_phase_count(void)
{
	return ARRAY_LEN(phase_table);
}

const struct hg_phase_info *hg_phase_at(int i)
{
	return i >= 0 && i < ARRAY_LEN(phase_table) ? &phase_table[i] : NULL;
}

int hg_method_count(void)
{
	return ARRAY_LEN(method_table);
}

const struct hg_method_info *hg_method_at(int i)
{
	return i >= 0 && i < ARRAY_LEN(method_table) ? &method_table[i] : NULL;
}

const struct hg_op_info *hg_op_get(int op)
{
	return hg_op_at(op - 1);
}

const struct hg_method_info *hg_method_get(int method)
{
	return hg_method_at(method - 1);
}

bool hg_op_valid(int op)
{
	return hg_op_get(op) != NULL;
}

size_t hg_op_in_lane_bytes(enum hg_op op)
{
	return hg_op_in_lane((unsigned)op);
}

size_t hg_op_acc_lane_bytes(enum hg_op op)
{
	return hg_op_acc_lane((unsigned)op);
}

const char *hg_op_name(int op)
{
	const struct hg_op_info *o = hg_op_get(op);

	return o ? o->name : "unknown";
}

const char *hg_phase_name(int phase)
{
	const struct hg_phase_info *ph = hg_phase_at(phase);

	return ph ? ph->name : "unknown";
}

const char *hg_method_name(enum hg_method m)
{
	const struct hg_method_info *mi = hg_method_get((int)m);

	return mi ? mi->name : "unknown";
}
