/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The worker client (homagg/client.h): one allreduce as a state machine of
 * steps.  A step is one or two streams of lanes aggregated with one op each
 * (the meta step sends the exponents and the non-zero counts together); it
 * is cut into chunks of at most payload_bytes, numbered with consecutive
 * job sequence numbers.  A step starts only when the previous one is
 * complete, because its size and contents come from the previous results.
 *
 * In flight: at most S chunks, kept in a ring indexed by seq % S (the same
 * index as the aggregator's slot).  Chunk k of a step may go out the first
 * time when k < S (every earlier chunk is complete) or when chunk k - S has
 * its result: the aggregator reuses slot seq % S only then.
 *
 * Retransmission timeout (RFC 6298): one estimator per client, kept across
 * allreduces.  A sample is the time from a chunk's only transmission to its
 * result (Karn: chunks sent more than once give none).  Under a full window
 * results come back one behind the other at the bottleneck's pace, so the
 * samples include the queueing of the whole window and SRTT settles at the
 * real round trip of a chunk, S times the bottleneck's per-chunk time.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "homagg/client.h"
#include "homagg/codec.h"
#include "homagg/kernels.h"
#include "homagg/wire.h"

#define BURST 32
#define ETH_LEN 14
#define IP_LEN 20
#define UDP_LEN 8
#define BITMAP_BYTES (HG_MAX_WORKERS / 8)

enum stage {
	ST_IDLE = 0,
	ST_META,
	ST_VALUES,
	ST_INDEX,
	ST_SKETCH,
	ST_FALLBACK,
	ST_DONE,
	ST_FAILED,
};

static const char *const phase_names[HG_PH_COUNT] = {
	[HG_PH_META] = "exponents",
	[HG_PH_VALUES] = "values",
	[HG_PH_INDEX] = "index",
	[HG_PH_SKETCH] = "sketch",
	[HG_PH_FALLBACK] = "fallback",
};

/* One run of lanes aggregated with one op. */
struct stream {
	enum hg_op op;
	int8_t exp;
	enum hg_client_phase phase;
	const uint8_t *in;      /* lanes * in_lane bytes, as sent */
	uint8_t *out;           /* lanes * acc_lane bytes, the results */
	size_t lanes;
	size_t in_lane, acc_lane;
	size_t per_chunk;       /* lanes per chunk */
	size_t chunks;
	size_t first_chunk;     /* index of its first chunk in the step */
};

struct step {
	struct stream s[2];
	int nstreams;
	uint32_t base_seq;
	size_t nchunks;
	size_t next_send;       /* next chunk to send the first time */
	size_t ndone;
	size_t hi_done;         /* 1 + the highest chunk with its result (0: none) */
	uint64_t t_hi;          /* when the result of chunk hi_done - 1 arrived */
};

/* A chunk in flight, at ring index seq % S. */
struct flight {
	uint32_t seq;
	bool busy;
	bool unsent;            /* the port refused it: send at the next poll */
	bool have_status;
	uint32_t tries;         /* transmissions so far */
	uint64_t first_tx;      /* when it was queued for its first transmission */
	uint64_t last_tx;       /* its latest transmission */
	uint64_t armed;         /* its timer runs from here (see chunk_deadline) */
	uint64_t rto;           /* its timeout: the client's at the first
				 * transmission, backed off at every expiry */
	uint8_t bitmap[BITMAP_BYTES];
};

/* A growable scratch buffer, kept across allreduces. */
struct buf {
	uint8_t *p;
	size_t cap;
};

struct hg_client {
	struct hg_client_config cfg;
	struct hg_port_info me;
	struct hg_wire_addr src, dst; /* this worker, the aggregator */

	/* the allreduce in progress */
	enum stage stage;
	int rc;                 /* result once ST_DONE / ST_FAILED */
	struct hg_params p;
	int method;             /* as asked */
	int method_eff;         /* after auto's choice */
	const float *x;
	float *y;
	size_t n, nblocks;
	uint32_t qflags;
	struct hg_lhc *lhc;
	struct step st;
	uint64_t start_results; /* results_received at the start */
	uint32_t agg_incarnation; /* of this allreduce's first reply (0: none yet) */
	uint64_t start_sent;

	uint32_t next_seq;      /* job sequence number of the next chunk */
	struct flight *fl;      /* S entries */
	struct buf done;        /* one byte per chunk of the step */
	struct buf lcodes, gcodes, lcounts, gcounts;
	struct buf tx, rx;      /* values / index / sketch / fallback */
	struct buf fb_tx, fb_rx;

	/*
	 * RTT estimator, ns (RFC 6298).  rto_est: SRTT + max(G, 4 RTTVAR),
	 * clamped, from the last sample; rto: what a new chunk is armed
	 * with, rto_est backed off by timeouts since that sample.
	 */
	bool have_rtt;
	uint64_t srtt, rttvar, rto_est, rto;
	uint64_t t_backoff;     /* when rto was last backed off */
	uint64_t t_timeout;     /* when a timer last expired (0: never) */

	struct hg_client_stats stats;
	char err[256];
};

static int buf_need(struct buf *b, size_t n)
{
	uint8_t *p;

	if (n == 0)
		n = 4;
	if (n <= b->cap)
		return 0;
	p = realloc(b->p, n);
	if (!p)
		return -ENOMEM;
	b->p = p;
	b->cap = n;
	return 0;
}

static void buf_free(struct buf *b)
{
	free(b->p);
	b->p = NULL;
	b->cap = 0;
}

struct hg_client *hg_client_create(const struct hg_client_config *cfg)
{
	struct hg_client *c;

	if (!cfg || !cfg->port || !cfg->port->ops)
		return NULL;
	if (cfg->workers == 0 || cfg->workers > HG_MAX_WORKERS ||
	    cfg->worker >= cfg->workers)
		return NULL;
	if (cfg->slots == 0 || cfg->slots > HG_CLIENT_MAX_SLOTS)
		return NULL;
	if (cfg->payload_bytes < 4 || cfg->payload_bytes > HG_MAX_PAYLOAD ||
	    cfg->payload_bytes % 4)
		return NULL;
	if ((cfg->backoff_num == 0) != (cfg->backoff_den == 0) ||
	    cfg->backoff_num < cfg->backoff_den)
		return NULL;

	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->cfg = *cfg;
	if (!c->cfg.agg_udp_port)
		c->cfg.agg_udp_port = HG_UDP_PORT;
	if (!c->cfg.rto_ns)
		c->cfg.rto_ns = HG_CLIENT_DEFAULT_RTO_NS;
	if (!c->cfg.rto_max_ns)
		c->cfg.rto_max_ns = HG_CLIENT_DEFAULT_RTO_MAX_NS;
	if (c->cfg.rto_max_ns < c->cfg.rto_ns)
		c->cfg.rto_max_ns = c->cfg.rto_ns;
	if (!c->cfg.rto_min_ns)
		c->cfg.rto_min_ns = c->cfg.rto_ns < HG_CLIENT_DEFAULT_RTO_MIN_NS ?
				    c->cfg.rto_ns : HG_CLIENT_DEFAULT_RTO_MIN_NS;
	if (c->cfg.rto_min_ns > c->cfg.rto_max_ns)
		goto err_free;
	if (!c->cfg.incarnation)
		c->cfg.incarnation = hg_wire_incarnation_now();
	c->rto = c->cfg.rto_ns;
	c->rto_est = c->cfg.rto_ns;
	if (!c->cfg.give_up_ns)
		c->cfg.give_up_ns = HG_CLIENT_DEFAULT_GIVE_UP_NS;
	if (!c->cfg.backoff_num) {
		c->cfg.backoff_num = 2;
		c->cfg.backoff_den = 1;
	}
	if (cfg->port->ops->get_info(cfg->port->ctx, &c->me) < 0)
		goto err_free;
	if (c->me.mtu && c->me.mtu < IP_LEN + UDP_LEN + HG_HDR_LEN + cfg->payload_bytes)
		goto err_free;
	memcpy(c->src.mac, c->me.mac, 6);
	c->src.ipv4 = c->me.ipv4;
	c->src.port = c->me.udp_port ? c->me.udp_port : HG_UDP_PORT;
	memcpy(c->dst.mac, c->cfg.agg_mac, 6);
	c->dst.ipv4 = c->cfg.agg_ipv4;
	c->dst.port = c->cfg.agg_udp_port;
	if (cfg->group_ipv4 && cfg->port->ops->join_group &&
	    cfg->port->ops->join_group(cfg->port->ctx, cfg->group_ipv4) < 0)
		goto err_free;
	c->fl = calloc(cfg->slots, sizeof(*c->fl));
	if (!c->fl)
		goto err_free;
	c->stats.method_chosen = 0;
	return c;

err_free:
	free(c);
	return NULL;
}

static void client_release_lhc(struct hg_client *c)
{
	hg_lhc_destroy(c->lhc);
	c->lhc = NULL;
}

void hg_client_destroy(struct hg_client *c)
{
	if (!c)
		return;
	client_release_lhc(c);
	buf_free(&c->done);
	buf_free(&c->lcodes);
	buf_free(&c->gcodes);
	buf_free(&c->lcounts);
	buf_free(&c->gcounts);
	buf_free(&c->tx);
	buf_free(&c->rx);
	buf_free(&c->fb_tx);
	buf_free(&c->fb_rx);
	free(c->fl);
	free(c);
}

bool hg_client_busy(const struct hg_client *c)
{
	return c && c->stage != ST_IDLE && c->stage != ST_DONE &&
	       c->stage != ST_FAILED;
}

const char *hg_client_error_text(const struct hg_client *c)
{
	return c ? c->err : "";
}

int hg_client_get_stats(const struct hg_client *c, struct hg_client_stats *st)
{
	if (!c || !st)
		return -EINVAL;
	*st = c->stats;
	st->next_seq = c->next_seq;
	st->srtt_ns = c->srtt;
	st->rttvar_ns = c->rttvar;
	st->rto_ns = c->rto;
	return 0;
}

/* ---- retransmission timeout -------------------------------------------- */

/* rto * backoff_num / backoff_den, saturating at rto_max_ns. */
static uint64_t rto_backoff(const struct hg_client *c, uint64_t rto)
{
	if (rto >= c->cfg.rto_max_ns / c->cfg.backoff_num * c->cfg.backoff_den)
		return c->cfg.rto_max_ns;
	rto = rto * c->cfg.backoff_num / c->cfg.backoff_den;
	return rto < c->cfg.rto_max_ns ? rto : c->cfg.rto_max_ns;
}

/*
 * A valid RTT sample r (ns): RFC 6298 section 2 with alpha = 1/8,
 * beta = 1/4, K = 4, G = HG_CLIENT_RTO_GRANULARITY_NS.  The new timeout
 * replaces any backed-off one.
 */
static void rtt_sample(struct hg_client *c, uint64_t r)
{
	uint64_t var4, rto;

	if (!c->have_rtt) {
		c->srtt = r;
		c->rttvar = r / 2;
		c->have_rtt = true;
	} else {
		uint64_t d = c->srtt > r ? c->srtt - r : r - c->srtt;

		c->rttvar = (3 * c->rttvar + d) / 4;
		c->srtt = (7 * c->srtt + r) / 8;
	}
	var4 = 4 * c->rttvar;
	rto = c->srtt + (var4 > HG_CLIENT_RTO_GRANULARITY_NS ?
			 var4 : HG_CLIENT_RTO_GRANULARITY_NS);
	if (rto < c->cfg.rto_min_ns)
		rto = c->cfg.rto_min_ns;
	if (rto > c->cfg.rto_max_ns)
		rto = c->cfg.rto_max_ns;
	c->rto_est = rto;
	c->rto = rto;
	c->stats.rtt_samples++;
}

/*
 * The timeout of a chunk in flight: its own (armed at its first
 * transmission, backed off at each of its expiries) or the client's
 * current one when that is longer (a longer estimate, or a backoff since).
 */
static uint64_t chunk_rto(const struct hg_client *c, const struct flight *fl)
{
	return fl->rto > c->rto ? fl->rto : c->rto;
}

/*
 * When the chunk's timer expires.  Results of a window come back in chunk
 * order, one behind the other at the bottleneck's pace.  So, as TCP
 * restarts its one timer whenever new data is acknowledged and after each
 * backoff (RFC 6298 5.3, 5.6), the timer of a chunk no later chunk has
 * overtaken runs from the latest of its transmission, the latest result of
 * an earlier chunk and the latest backoff: the 64th chunk of a burst is not
 * late while the 63 before it keep coming back, and one expiry (backing
 * off) gives the rest of the window the longer timeout instead of
 * retransmitting all of it.  A chunk a later one overtook was probably
 * lost: its timer start is frozen then (handle_frame sets fl->armed).
 */
static uint64_t chunk_deadline(const struct hg_client *c, const struct flight *fl)
{
	size_t k = (uint32_t)(fl->seq - c->st.base_seq);
	uint64_t from = fl->armed;

	if (k >= c->st.hi_done) {
		if (c->st.t_hi > from)
			from = c->st.t_hi;
		if (c->t_backoff > from)
			from = c->t_backoff;
	}
	return from + chunk_rto(c, fl);
}

/* ---- frames ------------------------------------------------------------ */

/*
 * Write the frame of chunk k of the step into pkt: Ethernet / IPv4 / UDP to
 * the aggregator, the HomAgg header, the chunk's lanes as they are in the
 * stream's input buffer (already big-endian).  Returns the payload bytes.
 */
static size_t build_chunk(struct hg_client *c, struct hg_pkt *pkt, size_t k,
			  bool retrans, enum hg_client_phase *phase)
{
	const struct stream *s = &c->st.s[0];
	uint32_t seq = c->st.base_seq + (uint32_t)k;
	struct hg_hdr h = { 0 };
	size_t first, lanes, bytes;
	int len;

	if (c->st.nstreams > 1 && k >= c->st.s[1].first_chunk)
		s = &c->st.s[1];
	first = (k - s->first_chunk) * s->per_chunk;
	lanes = s->lanes - first < s->per_chunk ? s->lanes - first : s->per_chunk;
	bytes = lanes * s->in_lane;
	*phase = s->phase;

	h.version = HG_PROTOCOL_VERSION;
	h.op = (uint8_t)s->op;
	h.flags = (uint16_t)((retrans ? HG_FLAG_RETRANS : 0) |
			     ((seq / c->cfg.slots) % 2 ? HG_FLAG_SHADOW : 0));
	h.job = c->cfg.job;
	h.token = c->cfg.token;
	h.worker = (uint16_t)c->cfg.worker;
	h.slot = (uint16_t)(seq % c->cfg.slots);
	h.seq = seq;
	h.lanes = (uint16_t)lanes;
	h.exp = s->exp;
	h.incarnation = c->cfg.incarnation;
	len = hg_wire_build(pkt->data, pkt->cap, &c->src, &c->dst, &h,
			    s->in + first * s->in_lane, bytes, 0);
	/* Cannot fail: cap and payload were checked against payload_bytes. */
	pkt->len = len > 0 ? (uint16_t)len : 0;
	return bytes;
}

/* ---- steps ------------------------------------------------------------- */

static void stream_set(struct stream *s, enum hg_op op, int exp,
		       enum hg_client_phase phase, const uint8_t *in,
		       uint8_t *out, size_t lanes, uint32_t payload)
{
	size_t widest;

	s->op = op;
	s->exp = (int8_t)exp;
	s->phase = phase;
	s->in = in;
	s->out = out;
	s->lanes = lanes;
	s->in_lane = hg_op_in_lane_bytes(op);
	s->acc_lane = hg_op_acc_lane_bytes(op);
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
	st->base_seq = c->next_seq;
	c->next_seq += (uint32_t)st->nchunks;
	c->stats.chunks += st->nchunks;
	st->next_send = 0;
	st->ndone = 0;
	st->hi_done = 0;
	st->t_hi = 0;
	rc = buf_need(&c->done, st->nchunks);
	if (rc)
		return rc;
	memset(c->done.p, 0, st->nchunks ? st->nchunks : 1);
	return 0;
}

static int client_fail(struct hg_client *c, int rc)
{
	c->stage = ST_FAILED;
	c->rc = rc;
	client_release_lhc(c);
	for (uint32_t i = 0; i < c->cfg.slots; i++)
		c->fl[i].busy = false;
	return rc;
}

static int fail_text(struct hg_client *c, int rc, const char *what)
{
	snprintf(c->err, sizeof(c->err), "%s", what);
	return client_fail(c, rc);
}

/* The step after the meta step, once the global exponents (and counts) are known. */
static int begin_method(struct hg_client *c)
{
	const struct hg_params *p = &c->p;
	struct hg_lhc_info info;
	size_t lanes;
	int rc;

	if (c->method_eff == HG_M_AUTO) {
		rc = hg_auto_choose(p, c->n, (const int8_t *)c->gcodes.p, c->gcounts.p);
		if (rc < 0)
			return fail_text(c, rc, "auto: cannot choose a method");
		c->method_eff = rc;
	}
	c->stats.method_chosen = c->method_eff;

	switch (c->method_eff) {
	case HG_M_DENSE:
	case HG_M_BLOCKS:
		c->qflags = c->method_eff == HG_M_BLOCKS ? HG_Q_SKIP_ZERO : 0;
		lanes = hg_quantized_lanes(p, c->n, (const int8_t *)c->gcodes.p, c->qflags);
		if (buf_need(&c->tx, lanes * 4) || buf_need(&c->rx, lanes * 4))
			return fail_text(c, -ENOMEM, "out of memory");
		rc = hg_quantize(p, c->x, c->n, (const int8_t *)c->gcodes.p, c->qflags, c->tx.p);
		if (rc)
			return fail_text(c, rc, "quantize failed");
		stream_set(&c->st.s[0], HG_OP_SUM32, 0, HG_PH_VALUES, c->tx.p,
			   c->rx.p, lanes, c->cfg.payload_bytes);
		c->stage = ST_VALUES;
		break;
	case HG_M_NC:
		if (buf_need(&c->tx, c->n) || buf_need(&c->rx, c->n * 4))
			return fail_text(c, -ENOMEM, "out of memory");
		rc = hg_nc_encode(p, c->x, c->n, (const int8_t *)c->gcodes.p, c->tx.p);
		if (rc)
			return fail_text(c, rc, "nc encode failed");
		stream_set(&c->st.s[0], HG_OP_NC8, hg_nc_top(p), HG_PH_VALUES,
			   c->tx.p, c->rx.p, c->n, c->cfg.payload_bytes);
		c->stage = ST_VALUES;
		break;
	case HG_M_LHC:
		c->lhc = hg_lhc_create(p, c->n, (const int8_t *)c->gcodes.p, c->gcounts.p);
		if (!c->lhc)
			return fail_text(c, -ENOMEM, "lhc: cannot plan the index");
		hg_lhc_get_info(c->lhc, &info);
		if (buf_need(&c->tx, info.index_bytes) || buf_need(&c->rx, info.index_bytes))
			return fail_text(c, -ENOMEM, "out of memory");
		rc = hg_lhc_index_encode(c->lhc, c->x, c->tx.p);
		if (rc)
			return fail_text(c, rc, "lhc index encode failed");
		stream_set(&c->st.s[0], HG_OP_OR, 0, HG_PH_INDEX, c->tx.p, c->rx.p,
			   info.index_bytes, c->cfg.payload_bytes);
		c->stage = ST_INDEX;
		break;
	default:
		return fail_text(c, -EINVAL, "unknown method");
	}
	rc = step_begin(c, 1);
	return rc ? fail_text(c, rc, "out of memory") : 0;
}

/*
 * The current step is complete: use its results, set up the next step or
 * finish.  Returns 0, or the negative errno the allreduce failed with.
 */
static int advance(struct hg_client *c)
{
	struct hg_lhc_info info;
	int rc;

	switch (c->stage) {
	case ST_META:
		return begin_method(c);
	case ST_VALUES:
		rc = hg_dequantize(&c->p, c->rx.p, c->n, (const int8_t *)c->gcodes.p,
				   c->method_eff == HG_M_NC ? 0 : c->qflags, c->y);
		if (rc)
			return fail_text(c, rc, "dequantize failed");
		c->stage = ST_DONE;
		c->rc = 1;
		return 0;
	case ST_INDEX:
		rc = hg_lhc_set_index(c->lhc, c->rx.p);
		if (rc)
			return fail_text(c, rc, "lhc: bad global index");
		hg_lhc_get_info(c->lhc, &info);
		if (buf_need(&c->tx, info.sketch_lanes * 4) ||
		    buf_need(&c->rx, info.sketch_lanes * 4))
			return fail_text(c, -ENOMEM, "out of memory");
		rc = hg_lhc_sketch_encode(c->lhc, c->x, c->tx.p);
		if (rc)
			return fail_text(c, rc, "lhc sketch encode failed");
		stream_set(&c->st.s[0], HG_OP_SUM32, 0, HG_PH_SKETCH, c->tx.p,
			   c->rx.p, info.sketch_lanes, c->cfg.payload_bytes);
		c->stage = ST_SKETCH;
		break;
	case ST_SKETCH:
		rc = hg_lhc_peel(c->lhc, c->rx.p);
		if (rc)
			return fail_text(c, rc, "lhc peel failed");
		hg_lhc_get_info(c->lhc, &info);
		c->stats.stalled_blocks += info.stalled_blocks;
		c->stats.fallback_lanes += info.fallback_lanes;
		if (buf_need(&c->fb_tx, info.fallback_lanes * 4) ||
		    buf_need(&c->fb_rx, info.fallback_lanes * 4))
			return fail_text(c, -ENOMEM, "out of memory");
		rc = hg_lhc_fallback_encode(c->lhc, c->x, c->fb_tx.p);
		if (rc)
			return fail_text(c, rc, "lhc fallback encode failed");
		stream_set(&c->st.s[0], HG_OP_SUM32, 0, HG_PH_FALLBACK, c->fb_tx.p,
			   c->fb_rx.p, info.fallback_lanes, c->cfg.payload_bytes);
		c->stage = ST_FALLBACK;
		break;
	case ST_FALLBACK:
		rc = hg_lhc_decode(c->lhc, c->fb_rx.p, c->y);
		if (rc)
			return fail_text(c, rc, "lhc decode failed");
		client_release_lhc(c);
		c->stage = ST_DONE;
		c->rc = 1;
		return 0;
	default:
		return fail_text(c, -EINVAL, "no allreduce in progress");
	}
	rc = step_begin(c, 1);
	return rc ? fail_text(c, rc, "out of memory") : 0;
}

int hg_client_start(struct hg_client *c, const struct hg_params *params,
		    int method, const float *x, size_t n, float *y)
{
	struct hg_params p;
	size_t nb;
	int rc;

	if (!c || !params || (n && (!x || !y)))
		return -EINVAL;
	if (hg_client_busy(c))
		return -EBUSY;
	if (method < HG_M_DENSE || method > HG_M_AUTO)
		return -EINVAL;
	p = *params;
	p.workers = c->cfg.workers;
	p.worker = c->cfg.worker;
	rc = hg_params_check(&p);
	if (rc)
		return rc;
	nb = hg_nblocks(&p, n);
	if (buf_need(&c->lcodes, nb) || buf_need(&c->gcodes, nb) ||
	    buf_need(&c->lcounts, nb * 4) || buf_need(&c->gcounts, nb * 4))
		return -ENOMEM;
	c->err[0] = '\0';
	rc = hg_exp_encode(&p, x, n, (int8_t *)c->lcodes.p, NULL);
	if (rc) {
		snprintf(c->err, sizeof(c->err), "%s",
			 rc == -EDOM ? "the gradient holds NaN or Inf"
				     : "bad parameters");
		return rc;
	}
	client_release_lhc(c);
	c->p = p;
	c->method = method;
	c->method_eff = method;
	c->x = x;
	c->y = y;
	c->n = n;
	c->nblocks = nb;
	c->qflags = 0;
	c->start_results = c->stats.results_received;
	c->agg_incarnation = 0;
	c->start_sent = c->stats.packets_sent;
	for (uint32_t i = 0; i < c->cfg.slots; i++)
		c->fl[i].busy = false;

	stream_set(&c->st.s[0], HG_OP_MAX8, 0, HG_PH_META, c->lcodes.p,
		   c->gcodes.p, nb, c->cfg.payload_bytes);
	if (method == HG_M_LHC || method == HG_M_AUTO) {
		rc = hg_nnz_counts(&p, x, n, c->lcounts.p);
		if (rc)
			return rc;
		stream_set(&c->st.s[1], HG_OP_SUM32, 0, HG_PH_META, c->lcounts.p,
			   c->gcounts.p, nb, c->cfg.payload_bytes);
		rc = step_begin(c, 2);
	} else {
		rc = step_begin(c, 1);
	}
	if (rc)
		return rc;
	c->stage = ST_META;
	c->rc = 0;
	return 0;
}

/* ---- receive ----------------------------------------------------------- */

static void format_ip(char *s, size_t len, uint32_t ip)
{
	snprintf(s, len, "%u.%u.%u.%u", ip >> 24, (ip >> 16) & 255,
		 (ip >> 8) & 255, ip & 255);
}

/* The aggregator answered with incarnation inc after another one during
 * this allreduce: it lost the job's state.  End the allreduce. */
static void agg_restarted(struct hg_client *c, uint32_t inc)
{
	char ip[20];

	format_ip(ip, sizeof(ip), c->cfg.agg_ipv4);
	snprintf(c->err, sizeof(c->err),
		 "aggregator %s:%u restarted during the allreduce (incarnation "
		 "%u, now %u)", ip, c->cfg.agg_udp_port, c->agg_incarnation, inc);
	client_fail(c, -ECONNRESET);
}

/* Handle one received frame (at port time now): a result or a status for this job. */
static void handle_frame(struct hg_client *c, const uint8_t *f, size_t len,
			 uint64_t now)
{
	struct step *st = &c->st;
	struct hg_wire_view v;
	const struct stream *s;
	struct flight *fl;
	const uint8_t *pl;
	size_t k, first, lanes;
	uint32_t seq;

	/* Same validation as the aggregator: addresses, lengths, header. */
	if (hg_wire_parse(f, len, c->src.port, 0, &v) != 0 ||
	    v.hdr.job != c->cfg.job || v.hdr.token != c->cfg.token ||
	    !(v.hdr.flags & (HG_FLAG_RESULT | HG_FLAG_STATUS)))
		goto ignore;
	pl = f + v.payload_off;
	seq = v.hdr.seq;
	if (!(c->stage >= ST_META && c->stage <= ST_FALLBACK)) {
		if (v.hdr.flags & HG_FLAG_RESULT)
			c->stats.duplicates_received++;
		return;
	}
	k = (uint32_t)(seq - st->base_seq);
	if (k < st->nchunks && v.hdr.incarnation != c->agg_incarnation) {
		/* A reply about this step from another life of the aggregator. */
		if (c->agg_incarnation) {
			agg_restarted(c, v.hdr.incarnation);
			return;
		}
		c->agg_incarnation = v.hdr.incarnation;
	}

	if (v.hdr.flags & HG_FLAG_STATUS) {
		fl = &c->fl[seq % c->cfg.slots];
		c->stats.status_received++;
		if (fl->busy && fl->seq == seq) {
			size_t nb = (c->cfg.workers + 7) / 8;

			memset(fl->bitmap, 0, sizeof(fl->bitmap));
			memcpy(fl->bitmap, pl, v.payload_len < nb ? v.payload_len : nb);
			fl->have_status = true;
		}
		return;
	}
	if (k >= st->nchunks) {
		/* A late copy of a chunk of an earlier step. */
		c->stats.duplicates_received++;
		return;
	}
	if (c->done.p[k]) {
		c->stats.duplicates_received++;
		return;
	}
	s = &st->s[0];
	if (st->nstreams > 1 && k >= st->s[1].first_chunk)
		s = &st->s[1];
	first = (k - s->first_chunk) * s->per_chunk;
	lanes = s->lanes - first < s->per_chunk ? s->lanes - first : s->per_chunk;
	/* hg_wire_parse checked payload_len == lanes * acc lane bytes. */
	if (v.hdr.op != s->op || v.hdr.lanes != lanes)
		goto ignore;
	memcpy(s->out + first * s->acc_lane, pl, lanes * s->acc_lane);
	c->done.p[k] = 1;
	st->ndone++;
	c->stats.results_received++;
	c->stats.bytes_received[s->phase] += lanes * s->acc_lane;
	fl = &c->fl[seq % c->cfg.slots];
	if (fl->busy && fl->seq == seq) {
		/*
		 * Karn: only a chunk sent once tells which copy was answered.
		 * And results come back in chunk order unless a chunk waited
		 * for a retransmission, ours or another worker's: a result
		 * behind a later chunk's measured that recovery, not the
		 * path, and would ratchet the timeout of every worker up.
		 * Likewise a chunk sent before one of our timers expired may
		 * have waited for that recovery (a peer's chunk lost with
		 * ours answered, say): only chunks sent after it count.
		 */
		if (fl->tries == 1 && k + 1 >= st->hi_done &&
		    fl->last_tx > c->t_timeout && now >= fl->last_tx)
			rtt_sample(c, now - fl->last_tx);
		fl->busy = false;
	}
	if (k + 1 > st->hi_done) {
		/* Chunks this result overtook: their timers stop following
		 * the results from here on (see chunk_deadline). */
		uint64_t from = st->t_hi > c->t_backoff ? st->t_hi : c->t_backoff;

		for (size_t i = st->hi_done; i < k; i++) {
			struct flight *o = &c->fl[(st->base_seq + (uint32_t)i) %
						  c->cfg.slots];

			if (!c->done.p[i] && o->busy && o->armed < from)
				o->armed = from;
		}
		st->hi_done = k + 1;
		st->t_hi = now;
	}
	return;

ignore:
	c->stats.packets_ignored++;
}

static void rx_all(struct hg_client *c, uint64_t now)
{
	struct hg_pkt *pk[BURST];
	uint16_t nb;

	/* Bounded: at most 8 bursts per poll, so a flood cannot starve tx. */
	for (int round = 0; round < 8; round++) {
		nb = hg_port_rx(c->cfg.port, pk, BURST);
		if (nb == 0)
			return;
		for (uint16_t i = 0; i < nb; i++)
			handle_frame(c, pk[i]->data, pk[i]->len, now);
		hg_port_free(c->cfg.port, pk, nb);
	}
}

/* ---- transmit ---------------------------------------------------------- */

/*
 * Send the chunks listed in ks (chunk indices of the step), flagged as
 * retransmissions after their first transmission.  Entries the port refuses stay marked
 * unsent and go out at the next poll.
 */
static void tx_chunks(struct hg_client *c, const size_t *ks, uint16_t cnt,
		      uint64_t now)
{
	struct hg_pkt *pk[BURST];
	enum hg_client_phase ph[BURST];
	size_t bytes[BURST];
	uint16_t got, sent;

	got = hg_port_alloc(c->cfg.port, pk, cnt);
	for (uint16_t i = 0; i < got; i++) {
		if (pk[i]->cap < ETH_LEN + IP_LEN + UDP_LEN + HG_HDR_LEN +
				 c->cfg.payload_bytes) {
			hg_port_free(c->cfg.port, pk + i, got - i);
			got = i;
			break;
		}
		uint32_t seq = c->st.base_seq + (uint32_t)ks[i];

		bytes[i] = build_chunk(c, pk[i], ks[i],
				       c->fl[seq % c->cfg.slots].tries > 0, &ph[i]);
	}
	sent = got ? hg_port_tx(c->cfg.port, pk, got) : 0;
	if (sent < got)
		hg_port_free(c->cfg.port, pk + sent, got - sent);
	for (uint16_t i = 0; i < cnt; i++) {
		uint32_t seq = c->st.base_seq + (uint32_t)ks[i];
		struct flight *fl = &c->fl[seq % c->cfg.slots];

		if (i >= sent) {
			fl->unsent = true;
			c->stats.tx_refused++;
			continue;
		}
		fl->unsent = false;
		fl->last_tx = now;
		fl->armed = now;
		if (fl->tries++ > 0)
			c->stats.retransmissions++;
		c->stats.packets_sent++;
		c->stats.bytes_sent[ph[i]] += bytes[i];
	}
}

/* First transmissions of the chunks the window allows. */
static void tx_new(struct hg_client *c, uint64_t now)
{
	struct step *st = &c->st;
	size_t ks[BURST];
	uint16_t cnt;

	for (;;) {
		cnt = 0;
		while (cnt < BURST && st->next_send < st->nchunks) {
			size_t k = st->next_send;
			uint32_t seq = st->base_seq + (uint32_t)k;
			struct flight *fl = &c->fl[seq % c->cfg.slots];

			if (k >= c->cfg.slots && !c->done.p[k - c->cfg.slots])
				break;
			if (fl->busy)
				break; /* cannot happen when the above holds */
			fl->busy = true;
			fl->seq = seq;
			fl->tries = 0;
			fl->have_status = false;
			fl->first_tx = now;
			fl->rto = c->rto;
			ks[cnt++] = k;
			st->next_send++;
		}
		if (!cnt)
			return;
		tx_chunks(c, ks, cnt, now);
		if (c->fl[(st->base_seq + (uint32_t)ks[cnt - 1]) % c->cfg.slots].unsent)
			return; /* the port is full: try again at the next poll */
	}
}

static void timeout_text(struct hg_client *c, const struct flight *fl,
			 uint64_t now)
{
	const struct stream *s = &c->st.s[0];
	size_t k = (uint32_t)(fl->seq - c->st.base_seq);
	char ip[20], *e = c->err, *end = c->err + sizeof(c->err);
	double secs = (double)(now - fl->first_tx) / 1e9;
	uint32_t missing = 0;

	if (c->st.nstreams > 1 && k >= c->st.s[1].first_chunk)
		s = &c->st.s[1];
	format_ip(ip, sizeof(ip), c->cfg.agg_ipv4);
	if (c->stats.results_received == c->start_results && !fl->have_status) {
		snprintf(c->err, sizeof(c->err),
			 "no answer from aggregator %s:%u (sent %llu chunks, "
			 "received 0 results)", ip, c->cfg.agg_udp_port,
			 (unsigned long long)(c->stats.packets_sent - c->start_sent));
		return;
	}
	e += snprintf(e, (size_t)(end - e),
		      "timed out after %.3g s waiting for chunk %u (phase %s): ",
		      secs, fl->seq, phase_names[s->phase]);
	if (!fl->have_status) {
		snprintf(e, (size_t)(end - e),
			 "no status from aggregator %s:%u after %u transmissions",
			 ip, c->cfg.agg_udp_port, fl->tries);
		return;
	}
	e += snprintf(e, (size_t)(end - e), "aggregator reports workers ");
	for (int pass = 0; pass < 2; pass++) {
		bool first = true;

		if (pass == 1) {
			for (uint32_t w = 0; w < c->cfg.workers; w++)
				missing += !(fl->bitmap[w / 8] >> (w % 8) & 1);
			if (e < end)
				e += snprintf(e, (size_t)(end - e),
					      " present, missing worker%s ",
					      missing == 1 ? "" : "s");
		}
		for (uint32_t w = 0; w < c->cfg.workers && e < end - 1; w++) {
			bool in = fl->bitmap[w / 8] >> (w % 8) & 1;

			if (in != (pass == 0))
				continue;
			e += snprintf(e, (size_t)(end - e), "%s%u",
				      first ? "" : ",", w);
			first = false;
		}
		if (first && e < end - 1)
			e += snprintf(e, (size_t)(end - e), "none");
	}
}

/*
 * Retransmit the chunks whose timer expired (backing off), and end the
 * allreduce when the oldest one waited give_up_ns.  Returns 0 or -ETIMEDOUT.
 */
static int tx_expired(struct hg_client *c, uint64_t now)
{
	const struct flight *oldest = NULL;
	size_t ks[BURST];
	uint16_t cnt = 0;

	for (uint32_t i = 0; i < c->cfg.slots; i++) {
		const struct flight *fl = &c->fl[i];

		if (fl->busy && now - fl->first_tx >= c->cfg.give_up_ns &&
		    (!oldest || fl->first_tx < oldest->first_tx))
			oldest = fl;
	}
	if (oldest) {
		timeout_text(c, oldest, now);
		c->stats.timeouts++;
		return client_fail(c, -ETIMEDOUT);
	}
	for (uint32_t i = 0; i < c->cfg.slots; i++) {
		struct flight *fl = &c->fl[i];

		if (!fl->busy)
			continue;
		if (!fl->unsent && now < chunk_deadline(c, fl))
			continue;
		if (!fl->unsent) {
			/* RFC 6298 5.5: back off this chunk's timer, and the
			 * client's, which new chunks start with until a valid
			 * sample -- the latter at most once per RTO, so
			 * independent losses expiring together (one lost
			 * contribution times out on every worker's copy of
			 * the chunk) do not compound. */
			c->stats.timeouts++;
			c->t_timeout = now;
			fl->rto = rto_backoff(c, chunk_rto(c, fl));
			if (now - c->t_backoff >= c->rto) {
				c->rto = rto_backoff(c, c->rto);
				c->t_backoff = now;
			}
		}
		ks[cnt++] = (uint32_t)(fl->seq - c->st.base_seq);
		if (cnt == BURST) {
			tx_chunks(c, ks, cnt, now);
			cnt = 0;
		}
	}
	if (cnt)
		tx_chunks(c, ks, cnt, now);
	return 0;
}

static uint64_t next_deadline(const struct hg_client *c, uint64_t now)
{
	uint64_t dl = UINT64_MAX;

	for (uint32_t i = 0; i < c->cfg.slots; i++) {
		const struct flight *fl = &c->fl[i];
		uint64_t t;

		if (!fl->busy)
			continue;
		if (fl->unsent)
			return now;
		t = chunk_deadline(c, fl);
		if (t < dl)
			dl = t;
		t = fl->first_tx + c->cfg.give_up_ns;
		if (t < dl)
			dl = t;
	}
	return dl;
}

int hg_client_poll(struct hg_client *c, uint64_t *next_deadline_ns)
{
	uint64_t now;
	int rc;

	if (next_deadline_ns)
		*next_deadline_ns = UINT64_MAX;
	if (!c)
		return -EINVAL;
	switch (c->stage) {
	case ST_IDLE:
		return -EINVAL;
	case ST_DONE:
	case ST_FAILED:
		/* Keep draining so late copies do not pile up in the port. */
		rx_all(c, hg_port_now(c->cfg.port));
		return c->rc;
	default:
		break;
	}
	now = hg_port_now(c->cfg.port);
	rx_all(c, now);
	if (c->stage == ST_FAILED)
		return c->rc;
	while (c->st.ndone == c->st.nchunks) {
		rc = advance(c);
		if (rc < 0)
			return rc;
		if (c->stage == ST_DONE)
			return 1;
	}
	tx_new(c, now);
	rc = tx_expired(c, now);
	if (rc < 0)
		return rc;
	if (next_deadline_ns)
		*next_deadline_ns = next_deadline(c, now);
	return 0;
}

int hg_client_allreduce(struct hg_client *c, const struct hg_params *p,
			int method, const float *x, size_t n, float *y)
{
	uint64_t dl, now;
	int rc;

	rc = hg_client_start(c, p, method, x, n, y);
	if (rc)
		return rc;
	for (;;) {
		rc = hg_client_poll(c, &dl);
		if (rc != 0)
			return rc > 0 ? 0 : rc;
		now = hg_port_now(c->cfg.port);
		if (dl > now) {
			uint64_t wait = dl - now;
			struct timespec ts;

			if (wait > 50000)
				wait = 50000;
			ts.tv_sec = 0;
			ts.tv_nsec = (long)wait;
			nanosleep(&ts, NULL);
		}
	}
}
