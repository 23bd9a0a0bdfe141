/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The worker client's method sequencer (see client.c): one allreduce as a
 * state machine of steps.  The method table (homagg/protocol.h) lists each
 * method's steps; a step is one or more phases, each a stream of lanes
 * aggregated with the phase's op (lhc's first step sends the exponents and
 * the non-zero counts together).  A step is cut into chunks of at most
 * payload_bytes, numbered with consecutive job sequence numbers.  A step
 * starts only when the previous one is complete, because its size and
 * contents come from the previous results.  Each phase has an encoder and
 * a decoder here (phase_codec[]); the codec (homagg/codec.h) does the
 * arithmetic.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "homagg/kernels.h"

#include "client_pvt.h"

/* ---- steps ------------------------------------------------------------- */

static void stream_set(struct stream *s, enum hg_phase phase, int exp,
		       const uint8_t *in, uint8_t *out, size_t lanes,
		       uint32_t payload)
{
	size_t widest;

	s->phase = phase;
	s->op = (enum hg_op)hg_phase_at(phase)->op;
	s->exp = (int8_t)exp;
	s->in = in;
	s->out = out;
	s->lanes = lanes;
	s->in_lane = hg_op_in_lane(s->op);
	s->acc_lane = hg_op_acc_lane(s->op);
	/* Both the request and the result payload must fit (NC8 grows 4x). */
	widest = s->in_lane > s->acc_lane ? s->in_lane : s->acc_lane;
	s->per_chunk = payload / widest;
	if (s->per_chunk > 0xffff)
		s->per_chunk = 0xffff;
	s->chunks = (lanes + s->per_chunk - 1) / s->per_chunk;
}

/* Number the chunks of the streams set in c->st and reset the step. */
static int step_begin(struct hg_client *c, int nstreams)
{
	struct step *st = &c->st;
	int rc;

	st->nstreams = nstreams;
	st->nchunks = 0;
	for (int i = 0; i < nstreams; i++) {
		st->s[i].first_chunk = st->nchunks;
		st->nchunks += st->s[i].chunks;
	}
	st->base = c->next_chunk;
	c->next_chunk += st->nchunks;
	c->stats.chunks += st->nchunks;
	for (uint32_t a = 0; a < c->naggs; a++) {
		struct agg *ag = &c->agg[a];

		/* chunks c < x with c % K == a: x / K + (x % K > a) */
		ag->st.chunks += c->next_chunk / c->naggs + (c->next_chunk % c->naggs > a) -
				 (st->base / c->naggs + (st->base % c->naggs > a));
		ag->hi_done = 0;
		ag->lo_open = (a + c->naggs - st->base % c->naggs) % c->naggs;
		ag->t_hi = 0;
		ag->t_first_tx = 0;
	}
	st->next_send = 0;
	st->ndone = 0;
	rc = hg_cl_buf_need(&c->done, st->nchunks);
	if (rc)
		return rc;
	memset(c->done.p, 0, st->nchunks ? st->nchunks : 1);
	return 0;
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
	return c->sent_phases & HG_PHB(EXPONENTS);
}

static int counts_plan(struct hg_client *c, size_t *lanes, int *exp)
{
	size_t k = 0;

	(void)exp;
	if (!counts_compact(c)) {
		*lanes = c->nblocks;
		return 0;
	}
	for (size_t b = 0; b < c->nblocks; b++)
		k += gcodes(c)[b] != HG_EXP_ZERO;
	*lanes = k;
	return 0;
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
	const char *what;       /* the phase's work, for error texts */
};

static int exponents_plan(struct hg_client *c, size_t *lanes, int *exp)
{
	(void)exp;
	*lanes = c->nblocks;
	return 0;
}

/* hg_client_start encoded the exponents already (it reports bad input). */
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
		memcpy(tx, c->lcounts.p, 4 * c->nblocks);
		return 0;
	}
	for (size_t b = 0; b < c->nblocks; b++)
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
		memcpy(c->gcounts.p, rx, 4 * c->nblocks);
		return 0;
	}
	for (size_t b = 0; b < c->nblocks; b++) {
		if (gcodes(c)[b] != HG_EXP_ZERO)
			memcpy(c->gcounts.p + 4 * b, rx + 4 * k++, 4);
		else
			memset(c->gcounts.p + 4 * b, 0, 4);
	}
	return 0;
}

static int values_plan(struct hg_client *c, size_t *lanes, int *exp)
{
	(void)exp;
	c->qflags = (c->mi->flags & HG_MF_SKIP_ZERO) ? HG_Q_SKIP_ZERO : 0;
	*lanes = hg_quantized_lanes(&c->p, c->n, gcodes(c), c->qflags);
	return 0;
}

static int values_encode(struct hg_client *c, uint8_t *tx)
{
	return hg_quantize(&c->p, c->x, c->n, gcodes(c), c->qflags, tx);
}

static int values_decode(struct hg_client *c, const uint8_t *rx)
{
	return hg_dequantize(&c->p, rx, c->n, gcodes(c), c->qflags, c->y);
}

static int codes_plan(struct hg_client *c, size_t *lanes, int *exp)
{
	c->qflags = 0;
	*lanes = c->n;
	*exp = hg_nc_top(&c->p);
	return 0;
}

static int codes_encode(struct hg_client *c, uint8_t *tx)
{
	return hg_nc_encode(&c->p, c->x, c->n, gcodes(c), tx);
}

static int index_plan(struct hg_client *c, size_t *lanes, int *exp)
{
	(void)exp;
	hg_cl_release_lhc(c);
	c->lhc = hg_lhc_create(&c->p, c->n, gcodes(c), gcounts(c));
	if (!c->lhc)
		return -ENOMEM;
	*lanes = lhc_info(c).index_bytes;
	return 0;
}

static int index_encode(struct hg_client *c, uint8_t *tx)
{
	return hg_lhc_index_encode_scan(c->lhc, c->scan, tx);
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
	return hg_lhc_sketch_encode_scan(c->lhc, c->scan, tx);
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
	return hg_lhc_fallback_encode(c->lhc, c->x, tx);
}

static int fallback_decode(struct hg_client *c, const uint8_t *rx)
{
	int rc = hg_lhc_decode(c->lhc, rx, c->y);

	hg_cl_release_lhc(c);
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
	return hg_union_encode(c->lhc, c->scan, tx);
}

static int union_decode(struct hg_client *c, const uint8_t *rx)
{
	int rc = hg_union_decode(c->lhc, rx, c->y);

	hg_cl_release_lhc(c);
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

/*
 * Set up step c->step of the method: plan, size and encode each of its
 * phases, and number the chunks.  Returns 0 or a negative errno (the
 * allreduce failed).
 */
static int step_setup(struct hg_client *c)
{
	uint32_t mask = c->mi->steps[c->step];
	int ns = 0, rc;

	for (int ph = 0; ph < HG_PH__COUNT; ph++) {
		const struct phase_codec *pc = &phase_codec[ph];
		const struct hg_op_info *op;
		size_t lanes = 0;
		int exp = 0;

		if (!(mask & (1u << ph)))
			continue;
		if (!pc->plan)
			return hg_cl_fail_text(c, -ENOTSUP, "a phase the client lacks");
		rc = pc->plan(c, &lanes, &exp);
		if (rc)
			return hg_cl_fail_text(c, rc, pc->what);
		op = hg_op_get(hg_phase_at(ph)->op);
		if (hg_cl_buf_need(&c->tx[ph], lanes * op->in_lane) ||
		    hg_cl_buf_need(&c->rx[ph], lanes * op->acc_lane))
			return hg_cl_fail_text(c, -ENOMEM, "out of memory");
		rc = pc->encode(c, c->tx[ph].p);
		if (rc)
			return hg_cl_fail_text(c, rc, pc->what);
		stream_set(&c->st.s[ns++], (enum hg_phase)ph, exp, c->tx[ph].p,
			   c->rx[ph].p, lanes, c->cfg.payload_bytes);
	}
	rc = step_begin(c, ns);
	return rc ? hg_cl_fail_text(c, rc, "out of memory") : 0;
}

/*
 * The current step is complete: decode its phases, then set up the next
 * step (after auto's choice, the chosen method's) or finish.  Returns 0, or
 * the negative errno the allreduce failed with.
 */
int hg_cl_advance(struct hg_client *c)
{
	const struct hg_method_info *next;
	int rc;

	for (int i = 0; i < c->st.nstreams; i++) {
		const struct stream *s = &c->st.s[i];
		const struct phase_codec *pc = &phase_codec[s->phase];

		if (!pc->decode)
			continue;
		rc = pc->decode(c, s->out);
		if (rc)
			return hg_cl_fail_text(c, rc, pc->what);
	}
	c->sent_phases |= c->mi->steps[c->step];
	next = NULL;
	if ((c->mi->flags & HG_MF_CHOOSES) && c->step + 1 == c->mi->nsteps) {
		/* auto after its own steps: the meta phase decides, or the
		 * index phase runs first */
		rc = hg_auto_choose(&c->p, c->n, gcodes(c), gcounts(c));
		next = rc < 0 ? NULL : hg_method_get(rc);
		if (!next)
			return hg_cl_fail_text(c, rc < 0 ? rc : -EPROTO,
					       "auto: cannot choose a method");
		c->choose_again = true;
	} else if (c->choose_again &&
		   (c->mi->steps[c->step] & HG_PHB(INDEX))) {
		rc = hg_auto_choose_indexed(c->lhc);
		next = rc < 0 ? NULL : hg_method_get(rc);
		if (!next)
			return hg_cl_fail_text(c, rc < 0 ? rc : -EPROTO,
					       "auto: cannot choose a method");
		c->choose_again = false;
	}
	if (next) {
		c->mi = next;
		c->stats.method_chosen = next->code;
		c->step = first_unsent_step(c, next);
	} else {
		c->step++;
	}
	if (c->step >= c->mi->nsteps) {
		c->stage = ST_DONE;
		c->rc = 1;
		return 0;
	}
	return step_setup(c);
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
			 rc == -EDOM ? "the gradient holds NaN or Inf"
				     : "bad parameters");
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
	c->qflags = 0;
	c->stats.method_chosen = mi->code;
	c->start_results = c->stats.results_received;
	c->start_sent = c->stats.packets_sent;
	for (uint32_t a = 0; a < c->naggs; a++) {
		c->agg[a].start_results = c->agg[a].st.results_received;
		c->agg[a].start_sent = c->agg[a].st.packets_sent;
		c->agg[a].incarnation = 0;
	}
	for (size_t i = 0; i < (size_t)c->naggs * c->cfg.slots; i++)
		c->fl[i].busy = false;
	c->stage = ST_RUNNING;
	c->rc = 0;
	rc = step_setup(c);
	if (rc) {
		c->stage = ST_IDLE;
		return rc;
	}
	return 0;
}
