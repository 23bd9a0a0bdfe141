/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The worker client's method sequencer (see client.c): one allreduce as a
 * state machine of steps.  The method table (homagg/protocol.h) lists each
 * method's steps; a step is one or more phases, each a stream of lanes
 * aggregated with the phase's op (lhc's first step sends the exponents and
 * the non-zero counts together).  A step is cut into chunks of at most
 * payload_bytes, numbered with consecutive job sequence numbers.  Each phase
 * has an encoder and a decoder here (phase_codec[]); the codec
 * (homagg/codec.h) does the arithmetic.
 *
 * Without pipelining a step starts only when the previous one is complete,
 * because its size and contents come from the previous results; each step
 * is a segment of its own (client_window.c keeps its window state per
 * segment).  Methods whose steps work block by block (HG_MF_GROUPS: all of
 * them) cut the tensor into G block groups instead, and the whole
 * allreduce is one segment: unit (g, s), step s for group g, is numbered in
 * a fixed wavefront order as soon as unit (g, s - 1) is complete
 * (docs/PROTOCOL.md "Pipelined block groups").  auto then chooses per
 * group, in four steps whatever the groups choose (auto_phases).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "homagg/kernels.h"

#include "client_pvt.h"
#include "codec_pvt.h"

/* ---- steps ------------------------------------------------------------- */

/*
 * Stream s carries lanes of phase ph from byte in_off of c->tx[ph]; its
 * results go to byte out_off of c->rx[ph] (offsets, not pointers: the
 * buffers may move when they grow).
 */
static void stream_set(struct stream *s, enum hg_phase phase, int exp,
		       size_t lanes_before, size_t lanes, uint32_t payload)
{
	size_t widest;

	s->phase = phase;
	s->op = (enum hg_op)hg_phase_at(phase)->op;
	s->exp = (int8_t)exp;
	s->lanes = lanes;
	s->in_lane = hg_op_in_lane(s->op);
	s->acc_lane = hg_op_acc_lane(s->op);
	s->in_off = lanes_before * s->in_lane;
	s->out_off = lanes_before * s->acc_lane;
	/* Both the request and the result payload must fit (NC8 grows 4x). */
	widest = s->in_lane > s->acc_lane ? s->in_lane : s->acc_lane;
	s->per_chunk = payload / widest;
	if (s->per_chunk > 0xffff)
		s->per_chunk = 0xffff;
	s->chunks = (lanes + s->per_chunk - 1) / s->per_chunk;
}

/* Room for need entries of size elem in *p (capacity *cap), grown by doubling. */
static int grow(void **p, uint32_t *cap, size_t elem, size_t need)
{
	size_t n = *cap ? *cap : 16;
	void *q;

	if (need <= *cap)
		return 0;
	while (n < need)
		n *= 2;
	if (n > UINT32_MAX)
		return -ENOMEM;
	q = realloc(*p, n * elem);
	if (!q)
		return -ENOMEM;
	*p = q;
	*cap = (uint32_t)n;
	return 0;
}

/*
 * At least n bytes in b, grown by doubling (a buffer that grows unit by
 * unit); never NULL, even for n = 0 (the codec may be handed it).
 */
static int buf_grow(struct buf *b, size_t n)
{
	return n <= b->cap && b->p ?
		       0 :
		       hg_cl_buf_need(b, n < 2 * b->cap ? 2 * b->cap : n);
}

/* The done bytes of chunks 0 .. n - 1 of the segment. */
static int done_need(struct hg_client *c, size_t n)
{
	return buf_grow(&c->done, n);
}

/*
 * Start a segment at chunk c->next_chunk: no chunk numbered yet, the
 * aggregators' order of results and step-start wait begin again.
 */
static void segment_begin(struct hg_client *c, bool first)
{
	struct segment *st = &c->st;

	st->first = first;
	st->nstreams = 0;
	st->nunits = 0;
	st->lo_unit = 0;
	st->base = c->next_chunk;
	st->nchunks = 0;
	st->next_send = 0;
	st->ndone = 0;
	st->completions = 0;
	st->seen = 0;
	for (uint32_t a = 0; a < c->naggs; a++) {
		struct agg *ag = &c->agg[a];

		ag->hi_done = 0;
		ag->lo_open = (a + c->naggs - st->base % c->naggs) % c->naggs;
		ag->t_hi = 0;
		ag->t_first_tx = 0;
	}
}

/*
 * Make the streams from first_stream on unit (group, step) and number its
 * chunks: the next ones of the segment and of the job.
 */
static int unit_append(struct hg_client *c, uint32_t group, uint32_t step,
		       uint32_t first_stream)
{
	struct segment *st = &c->st;
	uint64_t from = c->next_chunk;
	struct unit *u;
	int rc;

	rc = grow((void **)&st->u, &st->cap_units, sizeof(*st->u), st->nunits + 1);
	if (rc)
		return rc;
	u = &st->u[st->nunits];
	u->group = group;
	u->step = step;
	u->first_stream = first_stream;
	u->nstreams = st->nstreams - first_stream;
	u->first_chunk = st->nchunks;
	u->nchunks = 0;
	u->ndone = 0;
	u->decoded = false;
	for (uint32_t i = first_stream; i < st->nstreams; i++) {
		st->s[i].first_chunk = st->nchunks + u->nchunks;
		st->s[i].unit = st->nunits;
		u->nchunks += st->s[i].chunks;
	}
	rc = done_need(c, st->nchunks + u->nchunks);
	if (rc)
		return rc;
	if (u->nchunks)
		memset(c->done.p + st->nchunks, 0, u->nchunks);
	st->nchunks += u->nchunks;
	st->nunits++;
	if (u->nchunks == 0)
		st->completions++; /* nothing to wait for */
	c->next_chunk += u->nchunks;
	c->stats.chunks += u->nchunks;
	for (uint32_t a = 0; a < c->naggs; a++) {
		/* chunks c < x with c % K == a: x / K + (x % K > a) */
		c->agg[a].st.chunks += c->next_chunk / c->naggs +
				       (c->next_chunk % c->naggs > a) -
				       (from / c->naggs + (from % c->naggs > a));
	}
	return 0;
}

void hg_cl_chunk_done(struct hg_client *c, size_t k)
{
	struct segment *st = &c->st;
	struct unit *u = &st->u[hg_cl_chunk_stream(c, k)->unit];

	st->ndone++;
	if (++u->ndone == u->nchunks)
		st->completions++;
}

void hg_cl_release_segment(struct hg_client *c)
{
	free(c->st.s);
	free(c->st.u);
	memset(&c->st, 0, sizeof(c->st));
}

/* ---- phases: encoders and decoders -------------------------------------- */

static const int8_t *gcodes(const struct hg_client *c)
{
	return (const int8_t *)c->rx[HG_PH_EXPONENTS].p;
}

static const uint8_t *gcounts(const struct hg_client *c)
{
	return c->gcounts.p;
}

/*
 * The counts phase carries one lane per block when it travels with the
 * exponents, else (auto: a step after them) one lane per block whose global
 * code is not HG_EXP_ZERO (the others are 0 on every worker).
 */
static bool counts_compact(const struct hg_client *c)
{
	return (c->sent_phases & HG_PHB(EXPONENTS)) ||
	       (c->mi->flags & HG_MF_CHOOSES);
}

static int counts_plan(struct hg_client *c, size_t *lanes, int *exp)
{
	size_t k = 0;

	(void)exp;
	if (!counts_compact(c)) {
		*lanes = c->gnb;
		return 0;
	}
	for (size_t b = c->gb0; b < c->gb0 + c->gnb; b++)
		k += gcodes(c)[b] != HG_EXP_ZERO;
	*lanes = k;
	return 0;
}

/* The current group's lhc is done with (after its last decode). */
static void group_lhc_release(struct hg_client *c)
{
	hg_lhc_destroy_into(c->lhc, &c->lhc_scratch);
	c->lhc = NULL;
	((struct hg_lhc **)c->glhc.p)[c->cur_group] = NULL;
}

/* The scan of the current group's blocks (the whole scan when G = 1). */
static const struct hg_scan *group_scan(const struct hg_client *c,
					struct hg_scan *v)
{
	if (c->groups == 1)
		return c->scan;
	hg_scan_view(c->scan, c->gb0, c->gnb, c->gn, v);
	return v;
}

static struct hg_lhc_info lhc_info(const struct hg_client *c)
{
	struct hg_lhc_info info = { 0 };

	hg_lhc_get_info(c->lhc, &info);
	return info;
}

/*
 * One phase of the client.  plan: how many lanes this phase sends (and the
 * header's exp), from what the earlier steps left; it may fail with a
 * negative errno.  encode: this worker's lanes into tx (sized by the op's
 * lane width).  decode (NULL: nothing to do): use the aggregated lanes.
 */
struct phase_codec {
	int (*plan)(struct hg_client *c, size_t *lanes, int *exp);
	int (*encode)(struct hg_client *c, uint8_t *tx);
	int (*decode)(struct hg_client *c, const uint8_t *rx);
	const char *what; /* the phase's work, for error texts */
};

static int exponents_plan(struct hg_client *c, size_t *lanes, int *exp)
{
	(void)exp;
	*lanes = c->gnb;
	return 0;
}

/* hg_client_start encoded the exponents of every block already (it reports
 * bad input); a group's stream starts at its first block's code. */
static int exponents_encode(struct hg_client *c, uint8_t *tx)
{
	(void)c;
	(void)tx;
	return 0;
}

/* hg_client_start's scan computed the counts. */
static int counts_encode(struct hg_client *c, uint8_t *tx)
{
	size_t k = 0;

	if (!counts_compact(c)) {
		memcpy(tx, c->lcounts.p + 4 * c->gb0, 4 * c->gnb);
		return 0;
	}
	for (size_t b = c->gb0; b < c->gb0 + c->gnb; b++)
		if (gcodes(c)[b] != HG_EXP_ZERO)
			memcpy(tx + 4 * k++, c->lcounts.p + 4 * b, 4);
	return 0;
}

static int counts_decode(struct hg_client *c, const uint8_t *rx)
{
	size_t k = 0;

	if (hg_cl_buf_need(&c->gcounts, 4 * c->nblocks))
		return -ENOMEM;
	if (!counts_compact(c)) {
		memcpy(c->gcounts.p + 4 * c->gb0, rx, 4 * c->gnb);
		return 0;
	}
	for (size_t b = c->gb0; b < c->gb0 + c->gnb; b++) {
		if (gcodes(c)[b] != HG_EXP_ZERO)
			memcpy(c->gcounts.p + 4 * b, rx + 4 * k++, 4);
		else
			memset(c->gcounts.p + 4 * b, 0, 4);
	}
	return 0;
}

/*
 * The method the current group runs: the allreduce's, or with pipelined
 * auto the group's own choice so far (auto until its counts are in).
 */
static const struct hg_method_info *group_method(const struct hg_client *c)
{
	if (c->groups > 1 && (c->mi->flags & HG_MF_CHOOSES))
		return hg_method_get(c->gmethod.p[c->cur_group]);
	return c->mi;
}

/* Quantiser flags of the current group's values (blocks: skip zero blocks;
 * codes: 0, nc has no zero-block skipping). */
static uint32_t group_qflags(const struct hg_client *c)
{
	return (group_method(c)->flags & HG_MF_SKIP_ZERO) ? HG_Q_SKIP_ZERO : 0;
}

/* values and codes work on the block range c->gb0.. (a group, or all). */
static int values_plan(struct hg_client *c, size_t *lanes, int *exp)
{
	(void)exp;
	*lanes = hg_quantized_lanes(&c->p, c->gn, gcodes(c) + c->gb0,
				    group_qflags(c));
	return 0;
}

static int values_encode(struct hg_client *c, uint8_t *tx)
{
	return hg_quantize_at(&c->p, c->ge0, c->x + c->ge0, c->gn,
			      gcodes(c) + c->gb0, group_qflags(c), tx);
}

static int values_decode(struct hg_client *c, const uint8_t *rx)
{
	return hg_dequantize(&c->p, rx, c->gn, gcodes(c) + c->gb0,
			     group_qflags(c), c->y + c->ge0);
}

static int codes_plan(struct hg_client *c, size_t *lanes, int *exp)
{
	*lanes = c->gn;
	*exp = hg_nc_top(&c->p);
	return 0;
}

static int codes_encode(struct hg_client *c, uint8_t *tx)
{
	return hg_nc_encode_at(&c->p, c->ge0, c->x + c->ge0, c->gn,
			       gcodes(c) + c->gb0, tx);
}

static int index_plan(struct hg_client *c, size_t *lanes, int *exp)
{
	(void)exp;
	group_lhc_release(c);
	c->lhc = hg_lhc_create_with(&c->p, c->ge0, c->gn, gcodes(c) + c->gb0,
				    gcounts(c) + 4 * c->gb0, &c->lhc_scratch);
	((struct hg_lhc **)c->glhc.p)[c->cur_group] = c->lhc;
	if (!c->lhc)
		return -ENOMEM;
	*lanes = lhc_info(c).index_bytes;
	return 0;
}

static int index_encode(struct hg_client *c, uint8_t *tx)
{
	struct hg_scan v;

	return hg_lhc_index_encode_scan(c->lhc, group_scan(c, &v), tx);
}

static int index_decode(struct hg_client *c, const uint8_t *rx)
{
	return hg_lhc_set_index(c->lhc, rx);
}

static int sketch_plan(struct hg_client *c, size_t *lanes, int *exp)
{
	(void)exp;
	*lanes = lhc_info(c).sketch_lanes;
	return 0;
}

static int sketch_encode(struct hg_client *c, uint8_t *tx)
{
	struct hg_scan v;

	return hg_lhc_sketch_encode_scan(c->lhc, group_scan(c, &v), tx);
}

static int sketch_decode(struct hg_client *c, const uint8_t *rx)
{
	struct hg_lhc_info info;
	int rc = hg_lhc_peel(c->lhc, rx);

	if (rc)
		return rc;
	info = lhc_info(c);
	c->stats.stalled_blocks += info.stalled_blocks;
	c->stats.fallback_lanes += info.fallback_lanes;
	return 0;
}

static int fallback_plan(struct hg_client *c, size_t *lanes, int *exp)
{
	(void)exp;
	*lanes = lhc_info(c).fallback_lanes;
	return 0;
}

static int fallback_encode(struct hg_client *c, uint8_t *tx)
{
	return hg_lhc_fallback_encode(c->lhc, c->x + c->ge0, tx);
}

static int fallback_decode(struct hg_client *c, const uint8_t *rx)
{
	int rc = hg_lhc_decode(c->lhc, rx, c->y + c->ge0);

	group_lhc_release(c);
	return rc;
}

static int union_plan(struct hg_client *c, size_t *lanes, int *exp)
{
	(void)exp;
	*lanes = hg_union_lanes(c->lhc);
	return 0;
}

static int union_encode(struct hg_client *c, uint8_t *tx)
{
	struct hg_scan v;

	return hg_union_encode(c->lhc, group_scan(c, &v), tx);
}

static int union_decode(struct hg_client *c, const uint8_t *rx)
{
	int rc = hg_union_decode(c->lhc, rx, c->y + c->ge0);

	group_lhc_release(c);
	return rc;
}

static const struct phase_codec phase_codec[HG_PH__COUNT] = {
	[HG_PH_EXPONENTS] = { exponents_plan, exponents_encode, NULL, "exponents" },
	[HG_PH_COUNTS] = { counts_plan, counts_encode, counts_decode,
			   "non-zero counts" },
	[HG_PH_VALUES] = { values_plan, values_encode, values_decode, "quantize" },
	[HG_PH_CODES] = { codes_plan, codes_encode, values_decode, "nc encode" },
	[HG_PH_INDEX] = { index_plan, index_encode, index_decode, "lhc index" },
	[HG_PH_SKETCH] = { sketch_plan, sketch_encode, sketch_decode, "lhc sketch" },
	[HG_PH_FALLBACK] = { fallback_plan, fallback_encode, fallback_decode,
			     "lhc fallback" },
	[HG_PH_UNION] = { union_plan, union_encode, union_decode, "union values" },
};

/* The first step of mi with a phase not sent yet (mi->nsteps if none). */
static uint32_t first_unsent_step(const struct hg_client *c,
				  const struct hg_method_info *mi)
{
	uint32_t k = 0;

	while (k < mi->nsteps && !(mi->steps[k] & ~c->sent_phases))
		k++;
	return k;
}

/* The phase codecs work on block group g from here on (all blocks when G = 1). */
static void group_range(struct hg_client *c, uint32_t g)
{
	size_t bl = c->p.block;

	c->cur_group = g;
	c->lhc = ((struct hg_lhc **)c->glhc.p)[g];

	c->gb0 = (size_t)g * c->group_blocks;
	c->gnb = c->nblocks - c->gb0 < c->group_blocks ? c->nblocks - c->gb0 :
							 c->group_blocks;
	c->ge0 = c->gb0 * bl;
	c->gn = c->n - c->ge0 < c->gnb * bl ? c->n - c->ge0 : c->gnb * bl;
}

/* auto's groups per chosen method (the stats of the allreduce). */
static uint32_t *auto_groups(struct hg_client *c, int method)
{
	switch (method) {
	case HG_M_DENSE:
		return &c->stats.auto_dense_groups;
	case HG_M_BLOCKS:
		return &c->stats.auto_blocks_groups;
	default:
		return &c->stats.auto_union_groups;
	}
}

/*
 * auto's choice rc (a method, or a negative errno from the rule) for the
 * current group (unpipelined: the tensor): counted in the stats in place
 * of the group's earlier choice; method_chosen is the one of the most
 * groups (ties: dense, blocks, union).  Returns the method's info, or NULL
 * after failing the allreduce.
 */
static const struct hg_method_info *auto_chosen(struct hg_client *c, int rc)
{
	const struct hg_method_info *prev = group_method(c);
	const struct hg_method_info *next = rc < 0 ? NULL : hg_method_get(rc);
	uint32_t d, b, u;

	if (!next || !(next->flags & HG_MF_CANDIDATE)) {
		hg_cl_fail_text(c, rc < 0 ? rc : -EPROTO,
				"auto: cannot choose a method");
		return NULL;
	}
	if (prev->flags & HG_MF_CANDIDATE)
		(*auto_groups(c, prev->code))--;
	(*auto_groups(c, next->code))++;
	if (c->groups > 1)
		c->gmethod.p[c->cur_group] = (uint8_t)next->code;
	d = c->stats.auto_dense_groups;
	b = c->stats.auto_blocks_groups;
	u = c->stats.auto_union_groups;
	c->stats.method_chosen = d >= b && d >= u ? HG_M_DENSE :
				 b >= u           ? HG_M_BLOCKS :
						    HG_M_UNION;
	return next;
}

/* Pipelined auto's steps per group: exponents; counts; index or nothing;
 * the chosen method's values (docs/PROTOCOL.md "auto, per group"). */
#define AUTO_GROUP_STEPS 4

/*
 * The phases of pipelined auto's unit (current group, step): the third and
 * fourth steps as the group chooses, from its counts and then its index.
 * Returns 0 or a negative errno (the allreduce failed).
 */
static int auto_phases(struct hg_client *c, uint32_t step, uint32_t *mask)
{
	const struct hg_method_info *mi;

	switch (step) {
	case 0:
		*mask = HG_PHB(EXPONENTS);
		return 0;
	case 1:
		*mask = HG_PHB(COUNTS);
		return 0;
	case 2: /* the meta phase decides dense or blocks, or the index runs */
		mi = auto_chosen(c, hg_auto_choose(&c->p, c->gn, gcodes(c) + c->gb0,
						   gcounts(c) + 4 * c->gb0));
		if (!mi)
			return c->rc;
		*mask = mi->code == HG_M_UNION ? HG_PHB(INDEX) : 0;
		return 0;
	default:
		mi = group_method(c);
		if (mi->code == HG_M_UNION) {
			mi = auto_chosen(c, hg_auto_choose_indexed(c->lhc));
			if (!mi)
				return c->rc;
			if (mi->code != HG_M_UNION)
				group_lhc_release(c); /* the index was paid for nothing */
		}
		*mask = mi->code == HG_M_UNION ? HG_PHB(UNION) : HG_PHB(VALUES);
		return 0;
	}
}

/*
 * Set up unit (g, step) of the method: plan, size and encode each of its
 * phases for block group g, and number its chunks (the next ones of the
 * segment).  Returns 0 or a negative errno (the allreduce failed).
 */
static int unit_setup(struct hg_client *c, uint32_t g, uint32_t step)
{
	uint32_t mask = c->mi->steps[step];
	uint32_t first = c->st.nstreams;
	int rc;

	group_range(c, g);
	if (c->groups > 1 && (c->mi->flags & HG_MF_CHOOSES)) {
		rc = auto_phases(c, step, &mask);
		if (rc)
			return rc;
	}
	for (int ph = 0; ph < HG_PH__COUNT; ph++) {
		const struct phase_codec *pc = &phase_codec[ph];
		const struct hg_op_info *op;
		size_t lanes = 0, before = c->ph_lanes[ph];
		int exp = 0;

		if (!(mask & (1u << ph)))
			continue;
		if (!pc->plan)
			return hg_cl_fail_text(c, -ENOTSUP,
					       "a phase the client lacks");
		rc = pc->plan(c, &lanes, &exp);
		if (rc)
			return hg_cl_fail_text(c, rc, pc->what);
		op = hg_op_get(hg_phase_at(ph)->op);
		if (buf_grow(&c->tx[ph], (before + lanes) * op->in_lane) ||
		    buf_grow(&c->rx[ph], (before + lanes) * op->acc_lane) ||
		    grow((void **)&c->st.s, &c->st.cap_streams,
			 sizeof(*c->st.s), c->st.nstreams + 1))
			return hg_cl_fail_text(c, -ENOMEM, "out of memory");
		rc = pc->encode(c, c->tx[ph].p + before * op->in_lane);
		if (rc)
			return hg_cl_fail_text(c, rc, pc->what);
		stream_set(&c->st.s[c->st.nstreams++], (enum hg_phase)ph, exp,
			   before, lanes, c->cfg.payload_bytes);
		c->ph_lanes[ph] = before + lanes;
	}
	rc = unit_append(c, g, step, first);
	return rc ? hg_cl_fail_text(c, rc, "out of memory") : 0;
}

/* Decode the phases of a complete unit (its group's elements of the output). */
static int unit_decode(struct hg_client *c, struct unit *u)
{
	int rc;

	group_range(c, u->group);
	for (uint32_t i = u->first_stream; i < u->first_stream + u->nstreams; i++) {
		const struct stream *s = &c->st.s[i];
		const struct phase_codec *pc = &phase_codec[s->phase];

		if (!pc->decode)
			continue;
		rc = pc->decode(c, c->rx[s->phase].p + s->out_off);
		if (rc)
			return hg_cl_fail_text(c, rc, pc->what);
	}
	u->decoded = true;
	return 0;
}

/* Decode every unit that completed since the last look. */
static int decode_complete(struct hg_client *c)
{
	struct segment *st = &c->st;
	int rc;

	if (st->completions == st->seen)
		return 0;
	st->seen = st->completions;
	for (uint32_t i = st->lo_unit; i < st->nunits; i++) {
		struct unit *u = &st->u[i];

		if (u->decoded || u->ndone < u->nchunks)
			continue;
		rc = unit_decode(c, u);
		if (rc)
			return rc;
	}
	while (st->lo_unit < st->nunits && st->u[st->lo_unit].decoded)
		st->lo_unit++;
	return 0;
}

/*
 * Block groups (docs/PROTOCOL.md "Pipelined block groups"): G and the
 * blocks per group, from the job's option and the allreduce's size; G = 1
 * for a method whose steps do not work block by block.
 */
static void groups_plan(struct hg_client *c)
{
	uint32_t opt = c->cfg.pipeline_groups;
	size_t nb = c->nblocks, gb;

	if (!(c->mi->flags & HG_MF_GROUPS) || opt == 1 || nb <= 1) {
		gb = nb;
	} else if (opt == 0) {
		/* HG_CLIENT_AUTO_GROUPS groups, each at least four windows of
		 * dense value chunks (so a group's exponents come back while
		 * the previous group's values are sent) */
		uint64_t lanes = 4ull * c->naggs * c->cfg.slots *
				 (c->cfg.payload_bytes / 4);
		size_t least = (size_t)((lanes + c->p.block - 1) / c->p.block);

		gb = (nb + HG_CLIENT_AUTO_GROUPS - 1) / HG_CLIENT_AUTO_GROUPS;
		if (gb < least)
			gb = least;
	} else {
		gb = (nb + opt - 1) / opt;
	}
	if (gb < 1)
		gb = 1;
	if (gb > nb)
		gb = nb ? nb : 1;
	c->group_blocks = (uint32_t)gb;
	c->groups = nb ? (uint32_t)((nb + gb - 1) / gb) : 1;
	c->stats.groups = c->groups;
}

static bool pipelined(const struct hg_client *c)
{
	return c->groups > 1;
}

/* T: the steps of every group (auto: its own four, whatever it chooses). */
static uint32_t sched_steps(const struct hg_client *c)
{
	return (c->mi->flags & HG_MF_CHOOSES) ? AUTO_GROUP_STEPS : c->mi->nsteps;
}

/* The schedule's units run out after round G + T - 2. */
static bool sched_done(const struct hg_client *c)
{
	return c->round >= c->groups + sched_steps(c) - 1;
}

/*
 * Move the schedule's cursor to its next unit: round r holds (r - s, s) for
 * s = 0 .. T - 1 whose group is in 0 .. G - 1.
 */
static void sched_next(struct hg_client *c)
{
	do {
		if (++c->rstep == sched_steps(c)) {
			c->rstep = 0;
			c->round++;
		}
	} while (!sched_done(c) &&
		 (c->rstep > c->round || c->round - c->rstep >= c->groups));
}

/*
 * Pipelined: number the schedule's units in order while the next one's
 * prerequisite, its group's previous step, is complete and decoded (units
 * are numbered in schedule order, so the prerequisite of (g, s) is the
 * unit numbered for group g in the round before).  Finish once every unit
 * is numbered and decoded.
 */
static int sched_advance(struct hg_client *c)
{
	struct segment *st = &c->st;
	uint32_t *last = (uint32_t *)c->glast.p;
	uint32_t g;
	int rc;

	for (;;) {
		rc = decode_complete(c);
		if (rc)
			return rc;
		if (sched_done(c)) {
			if (st->lo_unit == st->nunits) {
				c->sent_phases = 0;
				for (uint32_t k = 0; k < c->mi->nsteps; k++)
					c->sent_phases |= c->mi->steps[k];
				c->stage = ST_DONE;
				c->rc = 1;
			}
			return 0;
		}
		g = c->round - c->rstep;
		if (c->rstep > 0 && !st->u[last[g]].decoded)
			return 0; /* wait for group g's previous step */
		rc = unit_setup(c, g, c->rstep);
		if (rc)
			return rc;
		last[g] = st->nunits - 1;
		sched_next(c);
	}
}

/*
 * Unpipelined: once the current step is complete, decode its phases, then
 * set up the next step (after auto's choice, the chosen method's) or
 * finish.
 */
static int step_advance(struct hg_client *c)
{
	const struct hg_method_info *next;
	int rc;

	for (;;) {
		rc = decode_complete(c);
		if (rc)
			return rc;
		if (c->st.lo_unit < c->st.nunits)
			return 0;
		c->sent_phases |= c->mi->steps[c->step];
		next = NULL;
		if ((c->mi->flags & HG_MF_CHOOSES) && c->step + 1 == c->mi->nsteps) {
			/* auto after its own steps: the meta phase decides, or
			 * the index phase runs first */
			next = auto_chosen(c, hg_auto_choose(&c->p, c->n, gcodes(c),
							     gcounts(c)));
			if (!next)
				return c->rc;
			c->choose_again = true;
		} else if (c->choose_again &&
			   (c->mi->steps[c->step] & HG_PHB(INDEX))) {
			next = auto_chosen(c, hg_auto_choose_indexed(c->lhc));
			if (!next)
				return c->rc;
			c->choose_again = false;
		}
		if (next) {
			c->mi = next;
			c->step = first_unsent_step(c, next);
		} else {
			c->step++;
		}
		if (c->step >= c->mi->nsteps) {
			c->stage = ST_DONE;
			c->rc = 1;
			return 0;
		}
		segment_begin(c, false);
		rc = unit_setup(c, 0, c->step);
		if (rc)
			return rc;
	}
}

/*
 * Use the results that completed units: decode them and number what may
 * follow (the next step, or the schedule's next units), or finish.
 * Returns 0, or the negative errno the allreduce failed with.
 */
int hg_cl_advance(struct hg_client *c)
{
	return pipelined(c) ? sched_advance(c) : step_advance(c);
}

/* Does any step of mi send phase ph? */
static bool method_sends(const struct hg_method_info *mi, int ph)
{
	for (uint32_t k = 0; k < mi->nsteps; k++)
		if (mi->steps[k] & (1u << ph))
			return true;
	return false;
}

int hg_client_start(struct hg_client *c, const struct hg_params *params,
		    int method, const float *x, size_t n, float *y)
{
	const struct hg_method_info *mi = hg_method_get(method);
	struct hg_params p;
	size_t nb;
	int rc;

	if (!c || !params || (n && (!x || !y)))
		return -EINVAL;
	if (hg_client_busy(c))
		return -EBUSY;
	if (!mi)
		return -EINVAL;
	p = *params;
	p.workers = c->cfg.workers;
	p.worker = c->cfg.worker;
	if (!p.cost.link_mbit)
		p.cost = c->cfg.cost;
	p.cost.payload_bytes = c->cfg.payload_bytes;
	rc = hg_params_check(&p);
	if (rc)
		return rc;
	nb = hg_nblocks(&p, n);
	if (hg_cl_buf_need(&c->tx[HG_PH_EXPONENTS], nb))
		return -ENOMEM;
	c->err[0] = '\0';
	if (method_sends(mi, HG_PH_COUNTS)) {
		/* lhc, union, auto: one pass gives exponents, counts and the
		 * non-zeros every later phase reads */
		if (!c->scan)
			c->scan = hg_scan_create();
		if (!c->scan || hg_cl_buf_need(&c->lcounts, 4 * nb))
			return -ENOMEM;
		rc = hg_scan_encode(c->scan, &p, x, n,
				    (int8_t *)c->tx[HG_PH_EXPONENTS].p,
				    c->lcounts.p, NULL);
	} else {
		rc = hg_exp_encode(&p, x, n, (int8_t *)c->tx[HG_PH_EXPONENTS].p,
				   NULL);
	}
	if (rc) {
		snprintf(c->err, sizeof(c->err), "%s",
			 rc == -EDOM ? "the gradient holds NaN or Inf" :
				       "bad parameters");
		return rc;
	}
	hg_cl_release_lhc(c);
	c->p = p;
	c->mi = mi;
	c->step = 0;
	c->sent_phases = 0;
	c->choose_again = false;
	c->x = x;
	c->y = y;
	c->n = n;
	c->nblocks = nb;
	c->stats.method_chosen = mi->code;
	c->stats.input_nonzeros = method_sends(mi, HG_PH_COUNTS) ?
					  hg_scan_nonzeros(c->scan) :
					  UINT64_MAX;
	c->stats.auto_dense_groups = 0;
	c->stats.auto_blocks_groups = 0;
	c->stats.auto_union_groups = 0;
	c->start_results = c->stats.results_received;
	c->start_sent = c->stats.packets_sent;
	for (uint32_t a = 0; a < c->naggs; a++) {
		c->agg[a].start_results = c->agg[a].st.results_received;
		c->agg[a].start_sent = c->agg[a].st.packets_sent;
		c->agg[a].have_status = false;
		c->agg[a].view_tree_len = 0;
		c->agg[a].unanswered = 0;
		c->agg[a].incarnation = 0;
	}
	for (size_t i = 0; i < (size_t)c->naggs * c->cfg.slots; i++)
		c->fl[i].busy = false;
	c->t_win_full = 0;
	c->stage = ST_RUNNING;
	c->rc = 0;
	memset(c->ph_lanes, 0, sizeof(c->ph_lanes));
	groups_plan(c);
	if (hg_cl_buf_need(&c->glhc, sizeof(struct hg_lhc *) * c->groups)) {
		c->groups = 0;
		c->stage = ST_IDLE;
		return -ENOMEM;
	}
	memset(c->glhc.p, 0, sizeof(struct hg_lhc *) * c->groups);
	segment_begin(c, true);
	if (pipelined(c)) {
		/* every group's lanes at their place in one buffer per phase,
		 * sized once (the tx of the exponents is encoded already); the
		 * sizes of the others grow as they come */
		uint32_t sized = HG_PHB(EXPONENTS) | HG_PHB(COUNTS) |
				 HG_PHB(VALUES) | HG_PHB(CODES),
			 mask = 0;

		for (uint32_t k = 0; k < mi->nsteps; k++)
			mask |= mi->steps[k];
		if (mi->flags & HG_MF_CHOOSES) /* dense or blocks values, likely */
			mask |= HG_PHB(VALUES);
		c->round = 0;
		c->rstep = 0;
		rc = hg_cl_buf_need(&c->glast, sizeof(uint32_t) * c->groups);
		if (!rc)
			rc = hg_cl_buf_need(&c->gmethod, c->groups);
		if (!rc)
			memset(c->gmethod.p, HG_M_AUTO, c->groups);
		for (int ph = 0; ph < HG_PH__COUNT && !rc; ph++) {
			const struct hg_op_info *op = hg_op_get(hg_phase_at(ph)->op);
			size_t lanes = ph == HG_PH_EXPONENTS || ph == HG_PH_COUNTS ?
					       nb :
					       n;

			if (!(mask & sized & (1u << ph)))
				continue;
			rc = hg_cl_buf_need(&c->tx[ph], lanes * op->in_lane);
			if (!rc)
				rc = hg_cl_buf_need(&c->rx[ph],
						    lanes * op->acc_lane);
		}
		rc = rc ? hg_cl_fail_text(c, rc, "out of memory") :
			  sched_advance(c);
	} else {
		rc = unit_setup(c, 0, 0);
	}
	if (rc) {
		c->stage = ST_IDLE;
		return rc;
	}
	return 0;
}
