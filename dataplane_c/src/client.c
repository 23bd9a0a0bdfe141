/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The worker client (homagg/client.h): one allreduce as a state machine of
 * steps.  The method table (homagg/protocol.h) lists each method's steps;
 * a step is one or more phases, each a stream of lanes aggregated with the
 * phase's op (lhc's first step sends the exponents and the non-zero counts
 * together).  A step is cut into chunks of at most payload_bytes, numbered
 * with consecutive job sequence numbers.  A step starts only when the
 * previous one is complete, because its size and contents come from the
 * previous results.  Each phase has an encoder and a decoder here
 * (phase_codec[]); the codec (homagg/codec.h) does the arithmetic.
 *
 Several aggregators (docs/PROTOCOL.md): chunk number c (one 64-bit
 * counter of the job) goes to aggregator a = c % K as its seq c / K; K = 1
 * is the single-aggregator numbering.  Everything that follows holds per
 * aggregator: its own window, sequence numbers, in-order results and timer.
 *
 * In flight: at most S chunks per aggregator, kept in a ring indexed by
 * a * S + seq % S (seq % S is the aggregator's slot).  Chunk k of a step may
 * go out the first time when k < K S (every earlier chunk is complete) or
 * when chunk k - K S, the one before it in the same slot of the same
 * aggregator, has its result: the aggregator reuses the slot only then.
 *
 * Retransmission timeout (RFC 6298): one estimator per aggregator, kept
 * across allreduces.  A sample is the time from a chunk's only transmission to its
 * result (Karn: chunks sent more than once give none).  Under a full window
 * results come back one behind the other at the bottleneck's pace, so the
 * samples include the queueing of the whole window and SRTT settles at the
 * real round trip of a chunk, S times the bottleneck's per-chunk time.
 *
 * Loss is mostly repaired without the timer (fast retransmission): a chunk
 * whose result is missing while DUPTHRESH results of its aggregator's
 * chunks sent after it came back, or a STATUS reply showing this worker's
 * contribution missing, is sent again at once.  Every worker sees the same
 * gap, but only one of them lost the contribution: they take turns by a
 * rank that rotates with the chunk, SRTT + 4 RTTVAR apart, and the
 * aggregator's STATUS reply to the first (sent to the group) tells the
 * others whether they are missing.  A timer expiry whose chunk turns out
 * not to have been lost (a STATUS with this worker's bit set, or the
 * result twice) is a spurious timeout: counted, its backoff undone (Eifel,
 * RFC 4015).  Before the first result of a step the timers wait at least
 * start_wait, which learns how late the slowest peer starts a step.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "homagg/auth.h"
#include "homagg/client.h"
#include "homagg/codec.h"
#include "homagg/kernels.h"
#include "homagg/wire.h"

#define BURST 64         /* a window's worth of frames per port call */
/* Results of chunks sent after a missing one that declare it lost (TCP's
 * duplicate-ACK threshold): tolerates reordering by up to DUPTHRESH - 1. */
#define DUPTHRESH 3
/* done[] values: no result yet, the result, the result after a timeout
 * (a second copy then shows the timeout was spurious). */
enum { CH_PENDING = 0, CH_DONE = 1, CH_DONE_AFTER_TIMEOUT = 2 };
/* The blocking form's longest wait without a deadline (a safety net). */
#define IDLE_WAIT_NS 10000000ull
#define ETH_LEN 14
#define IP_LEN 20
#define UDP_LEN 8
#define BITMAP_BYTES (HG_MAX_WORKERS / 8)

enum stage {
	ST_IDLE = 0,
	ST_RUNNING,
	ST_DONE,
	ST_FAILED,
};

/* One phase's run of lanes, aggregated with the phase's op. */
struct stream {
	enum hg_op op;
	int8_t exp;
	enum hg_phase phase;
	const uint8_t *in;      /* lanes * in_lane bytes, as sent */
	uint8_t *out;           /* lanes * acc_lane bytes, the results */
	size_t lanes;
	size_t in_lane, acc_lane;
	size_t per_chunk;       /* lanes per chunk */
	size_t chunks;
	size_t first_chunk;     /* index of its first chunk in the step */
};

struct step {
	struct stream s[HG_PH__COUNT];
	int nstreams;
	uint64_t base;          /* chunk number c of its first chunk */
	size_t nchunks;
	size_t next_send;       /* next chunk to send the first time */
	size_t ndone;
};

/* A chunk in flight, at ring index a * S + seq % S. */
struct flight {
	uint64_t chunk;         /* its chunk number c */
	uint32_t seq;           /* its sequence number at its aggregator */
	uint32_t agg;           /* a = chunk % K */
	bool busy;
	bool unsent;            /* the port refused it: send at the next poll */
	bool have_status;
	bool timed_out;         /* its timer expired; not yet judged spurious */
	bool present;           /* a STATUS showed our contribution in the slot */
	uint16_t overtaken;     /* results of chunks sent after its latest transmission */
	uint32_t tries;         /* transmissions so far */
	uint64_t txn_first;     /* transmission order number of its first sending */
	uint64_t txn_last;      /*   and of its latest */
	uint64_t fast_at;       /* a fast retransmission is due then (0: none) */
	uint64_t first_tx;      /* when it was queued for its first transmission */
	uint64_t last_tx;       /* its latest transmission */
	uint64_t armed;         /* its timer runs from here (see chunk_deadline) */
	uint64_t rto;           /* its timeout: the client's at the first
				 * transmission, backed off at every expiry */
	uint8_t bitmap[BITMAP_BYTES];
};

/*
 * A smoothed mean and mean deviation of samples, ns (RFC 6298 section 2:
 * alpha = 1/8, beta = 1/4; the first sample r gives r and r / 2).
 */
struct smooth {
	bool have;
	uint64_t avg, var;
};

static void smooth_add(struct smooth *m, uint64_t r)
{
	if (!m->have) {
		m->avg = r;
		m->var = r / 2;
		m->have = true;
	} else {
		uint64_t d = m->avg > r ? m->avg - r : r - m->avg;

		m->var = (3 * m->var + d) / 4;
		m->avg = (7 * m->avg + r) / 8;
	}
}

/*
 * One aggregator of the job: where its chunks go, its RTT estimator (ns,
 * RFC 6298; rto_est: SRTT + max(G, 4 RTTVAR), clamped, from the last
 * sample; rto: what a new chunk is armed with, rto_est backed off by
 * timeouts since that sample), and the order of its results in the step.
 */
struct agg {
	struct hg_wire_addr dst;
	struct smooth rtt;      /* SRTT (avg) and RTTVAR (var) */
	uint64_t rto_est, rto;
	uint64_t t_backoff;     /* when rto was last backed off */
	uint64_t t_timeout;     /* when a timer last expired (0: never) */
	size_t hi_done;         /* 1 + its highest chunk (of the step) with its
				 * result (0: none) */
	size_t lo_open;         /* each of its chunks of the step below has its result */
	uint64_t t_hi;          /* when the result of chunk hi_done - 1 arrived */
	uint64_t t_first_tx;    /* when its first chunk of the step was sent (0: not yet) */
	uint64_t start_results; /* st.results_received at the allreduce's start */
	uint64_t start_sent;    /* st.packets_sent then */
	uint32_t incarnation;   /* of this allreduce's first reply (0: none yet) */
	struct hg_client_agg_stats st;
};

/* A growable scratch buffer, kept across allreduces. */
struct buf {
	uint8_t *p;
	size_t cap;
};

struct hg_client {
	struct hg_client_config cfg;
	struct hg_port_info me;
	struct hg_wire_addr src;      /* this worker */
	struct agg *agg;              /* K entries */
	uint32_t naggs;               /* K */

	/* the allreduce in progress */
	enum stage stage;
	int rc;                 /* result once ST_DONE / ST_FAILED */
	struct hg_params p;
	const struct hg_method_info *mi; /* the method (after auto's choice) */
	uint32_t step;          /* index of the current step in mi->steps */
	uint32_t sent_phases;   /* phases of the steps completed so far (mask) */
	bool choose_again;      /* auto: choose again after the index step */
	const float *x;
	float *y;
	size_t n, nblocks;
	uint32_t qflags;
	struct hg_lhc *lhc;
	struct hg_scan *scan;   /* the one-pass encode of x (lhc, union, auto) */
	struct buf lcounts;     /* this worker's counts, one lane per block */
	struct buf gcounts;     /* the global counts, one lane per block */
	struct step st;
	uint64_t start_results; /* results_received at the start */
	uint64_t start_sent;

	uint64_t next_chunk;    /* chunk number c of the next chunk */
	uint64_t txn;           /* transmissions so far: their order numbers */
	bool tx_blocked;        /* the port refused frames in the latest poll */
	/*
	 * Step-start wait, ns: the time from a step's first transmission to
	 * its first result includes the slowest peer's computing of the step
	 * (every worker starts a step when it has decoded the previous one).
	 * Smoothed like SRTT/RTTVAR from one sample per step and aggregator;
	 * chunks of an aggregator without a result in the step yet wait
	 * max(RTO, start_wait).
	 */
	struct smooth start;    /* SSTART, SSTARTVAR */
	uint64_t start_wait;
	struct flight *fl;      /* K * S entries */
	struct buf done;        /* one byte per chunk of the step */
	struct buf tx[HG_PH__COUNT];  /* per phase: this worker's lanes */
	struct buf rx[HG_PH__COUNT];  /* per phase: the aggregated lanes */

	/* auth: this worker's key, then the aggregator's */
	uint8_t keys[2][HG_AUTH_KEY_LEN];
	size_t mac_len;         /* auth: HG_MAC_LEN, else 0 */

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
	if (cfg->naggs > HG_CLIENT_MAX_AGGREGATORS || (cfg->naggs && !cfg->aggs))
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
	hg_auth_wipe(c->cfg.secret, sizeof(c->cfg.secret));
	if (cfg->auth) {
		if (hg_auth_derive_key(cfg->secret, cfg->worker, c->keys[0]) ||
		    hg_auth_derive_key(cfg->secret, HG_AUTH_KEY_AGGREGATOR,
				       c->keys[1]))
			goto err_free;
		c->mac_len = HG_MAC_LEN;
	}
	if (!c->cfg.give_up_ns)
		c->cfg.give_up_ns = HG_CLIENT_DEFAULT_GIVE_UP_NS;
	if (!c->cfg.start_wait_ns)
		c->cfg.start_wait_ns = 4 * c->cfg.rto_ns;
	if (c->cfg.start_wait_ns > c->cfg.give_up_ns / 4)
		c->cfg.start_wait_ns = c->cfg.give_up_ns / 4;
	c->start_wait = c->cfg.start_wait_ns;
	if (!c->cfg.backoff_num) {
		c->cfg.backoff_num = 2;
		c->cfg.backoff_den = 1;
	}
	if (cfg->port->ops->get_info(cfg->port->ctx, &c->me) < 0)
		goto err_free;
	if (c->me.mtu && c->me.mtu < IP_LEN + UDP_LEN + HG_HDR_LEN +
				     cfg->payload_bytes + c->mac_len)
		goto err_free;
	memcpy(c->src.mac, c->me.mac, 6);
	c->src.ipv4 = c->me.ipv4;
	c->src.port = c->me.udp_port ? c->me.udp_port : HG_UDP_PORT;
	c->naggs = cfg->naggs ? cfg->naggs : 1;
	c->cfg.aggs = NULL; /* the caller's array is not kept */
	c->agg = calloc(c->naggs, sizeof(*c->agg));
	if (!c->agg)
		goto err_free;
	for (uint32_t a = 0; a < c->naggs; a++) {
		struct agg *ag = &c->agg[a];

		if (cfg->naggs) {
			memcpy(ag->dst.mac, cfg->aggs[a].mac, 6);
			ag->dst.ipv4 = cfg->aggs[a].ipv4;
			ag->dst.port = cfg->aggs[a].udp_port;
		} else {
			memcpy(ag->dst.mac, c->cfg.agg_mac, 6);
			ag->dst.ipv4 = c->cfg.agg_ipv4;
			ag->dst.port = c->cfg.agg_udp_port;
		}
		if (!ag->dst.port)
			ag->dst.port = HG_UDP_PORT;
		ag->rto = c->cfg.rto_ns;
		ag->rto_est = c->cfg.rto_ns;
	}
	if (cfg->group_ipv4 && cfg->port->ops->join_group &&
	    cfg->port->ops->join_group(cfg->port->ctx, cfg->group_ipv4) < 0)
		goto err_free_agg;
	c->fl = calloc((size_t)c->naggs * cfg->slots, sizeof(*c->fl));
	if (!c->fl)
		goto err_free_agg;
	c->stats.method_chosen = 0;
	return c;

err_free_agg:
	free(c->agg);
err_free:
	hg_auth_wipe(c->keys, sizeof(c->keys));
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
	hg_scan_destroy(c->scan);
	buf_free(&c->lcounts);
	buf_free(&c->gcounts);
	buf_free(&c->done);
	for (int ph = 0; ph < HG_PH__COUNT; ph++) {
		buf_free(&c->tx[ph]);
		buf_free(&c->rx[ph]);
	}
	free(c->fl);
	free(c->agg);
	hg_auth_wipe(c->keys, sizeof(c->keys));
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
	const struct agg *slow;

	if (!c || !st)
		return -EINVAL;
	*st = c->stats;
	st->next_seq = c->next_chunk;
	st->aggregators = c->naggs;
	st->rtt_samples = 0;
	slow = &c->agg[0];
	for (uint32_t a = 0; a < c->naggs; a++) {
		st->rtt_samples += c->agg[a].st.rtt_samples;
		if (c->agg[a].rto > slow->rto)
			slow = &c->agg[a];
	}
	st->srtt_ns = slow->rtt.avg;
	st->rttvar_ns = slow->rtt.var;
	st->rto_ns = slow->rto;
	st->start_wait_ns = c->start_wait;
	return 0;
}

int hg_client_get_agg_stats(const struct hg_client *c, uint32_t k,
			    struct hg_client_agg_stats *st)
{
	const struct agg *ag;

	if (!c || !st)
		return -EINVAL;
	if (k >= c->naggs)
		return -ERANGE;
	ag = &c->agg[k];
	*st = ag->st;
	/* The chunks c < next_chunk with c % K == k. */
	st->next_seq = c->next_chunk / c->naggs + (c->next_chunk % c->naggs > k);
	st->srtt_ns = ag->rtt.avg;
	st->rttvar_ns = ag->rtt.var;
	st->rto_ns = ag->rto;
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

/* SRTT + max(G, 4 RTTVAR), clamped to [rto_min_ns, rto_max_ns]. */
static uint64_t rto_clamp(const struct hg_client *c, uint64_t srtt, uint64_t var)
{
	uint64_t var4 = 4 * var, rto;

	rto = srtt + (var4 > HG_CLIENT_RTO_GRANULARITY_NS ?
		      var4 : HG_CLIENT_RTO_GRANULARITY_NS);
	if (rto < c->cfg.rto_min_ns)
		rto = c->cfg.rto_min_ns;
	if (rto > c->cfg.rto_max_ns)
		rto = c->cfg.rto_max_ns;
	return rto;
}

/*
 * A valid RTT sample r (ns) of aggregator ag: RFC 6298 section 2 with
 * alpha = 1/8, beta = 1/4, K = 4, G = HG_CLIENT_RTO_GRANULARITY_NS.  The
 * new timeout replaces any backed-off one.
 */
static void rtt_sample(const struct hg_client *c, struct agg *ag, uint64_t r)
{
	smooth_add(&ag->rtt, r);
	ag->rto_est = rto_clamp(c, ag->rtt.avg, ag->rtt.var);
	ag->rto = ag->rto_est;
	ag->st.rtt_samples++;
}

/*
 * A step-start sample s (ns): an aggregator's first transmission of the
 * step to its first result.  Smoothed as RTT samples are; start_wait
 * stays within [start_wait_ns, give_up_ns / 4].
 */
static void start_sample(struct hg_client *c, uint64_t s)
{
	uint64_t w;

	smooth_add(&c->start, s);
	w = c->start.avg + 4 * c->start.var;
	if (w < c->cfg.start_wait_ns)
		w = c->cfg.start_wait_ns;
	if (w > c->cfg.give_up_ns / 4)
		w = c->cfg.give_up_ns / 4;
	c->start_wait = w;
}

/*
 * A timeout of aggregator ag turned out spurious: the chunk had not been
 * lost, it waited for a peer (computing, descheduled, or repairing its own
 * loss).  Eifel response (RFC 4015): undo the backoff, keep the estimate.
 * The margin against such waits is rto_min_ns (real-time ports) and
 * start_wait.
 */
static void spurious_timeout(struct hg_client *c, struct agg *ag, struct flight *fl)
{
	c->stats.spurious_timeouts++;
	ag->st.spurious_timeouts++;
	if (fl)
		fl->timed_out = false;
	ag->rto = ag->rto_est;
}

/* This worker's turn among the W for chunk number chunk (0 first), rotating. */
static uint32_t chunk_rank(const struct hg_client *c, uint64_t chunk)
{
	return (uint32_t)((c->cfg.worker + c->cfg.workers - chunk % c->cfg.workers) %
			  c->cfg.workers);
}

/* How far apart the workers' turns are: SRTT + 4 RTTVAR, by when the
 * STATUS reply to the previous turn's retransmission is back, with the
 * confidence RFC 6298 gives the RTO (but without its floors). */
static uint64_t turn_ns(const struct hg_client *c, const struct agg *ag)
{
	uint64_t d = ag->rtt.have ? ag->rtt.avg + 4 * ag->rtt.var : c->cfg.rto_ns;

	return d > HG_CLIENT_RTO_GRANULARITY_NS ? d : HG_CLIENT_RTO_GRANULARITY_NS;
}

/*
 * The timeout of a chunk in flight: its own (armed at its first
 * transmission, backed off at each of its expiries) or its aggregator's
 * current one when that is longer (a longer estimate, or a backoff since).
 */
static uint64_t chunk_rto(const struct hg_client *c, const struct flight *fl)
{
	uint64_t rto = c->agg[fl->agg].rto;

	return fl->rto > rto ? fl->rto : rto;
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
	const struct agg *ag = &c->agg[fl->agg];
	size_t k = (size_t)(fl->chunk - c->st.base);
	uint64_t from = fl->armed, rto = chunk_rto(c, fl);

	if (k >= ag->hi_done) {
		if (ag->t_hi > from)
			from = ag->t_hi;
		if (ag->t_backoff > from)
			from = ag->t_backoff;
	}
	/* No result of the step yet: the slowest peer may still be computing
	 * it.  And the workers take turns (see chunk_rank), so that the first
	 * one's STATUS reply tells the others whether they are missing. */
	if (ag->hi_done == 0 && c->start_wait > rto)
		rto = c->start_wait;
	return from + rto + chunk_rank(c, fl->chunk) * turn_ns(c, ag);
}

/* The flight record of chunk k of the step (a * S + seq % S). */
static struct flight *flight_of(const struct hg_client *c, size_t k)
{
	uint64_t chunk = c->st.base + k;
	uint32_t a = (uint32_t)(chunk % c->naggs);
	uint32_t seq = (uint32_t)(chunk / c->naggs);

	return &c->fl[(size_t)a * c->cfg.slots + seq % c->cfg.slots];
}

/* ---- frames ------------------------------------------------------------ */

/* The stream chunk k of the step belongs to. */
static const struct stream *chunk_stream(const struct step *st, size_t k)
{
	int i = st->nstreams - 1;

	while (i > 0 && k < st->s[i].first_chunk)
		i--;
	return &st->s[i];
}

/*
 * Write the frame of chunk k of the step into pkt: Ethernet / IPv4 / UDP to
 * the aggregator, the HomAgg header, the chunk's lanes as they are in the
 * stream's input buffer (already big-endian).  Returns the payload bytes.
 */
static size_t build_chunk(struct hg_client *c, struct hg_pkt *pkt, size_t k,
			  bool retrans, enum hg_phase *phase)
{
	const struct stream *s = chunk_stream(&c->st, k);
	uint64_t chunk = c->st.base + k;
	uint32_t a = (uint32_t)(chunk % c->naggs);
	uint32_t seq = (uint32_t)(chunk / c->naggs);
	struct hg_hdr h = { 0 };
	size_t first, lanes, bytes;
	int len;

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
	h.shard = (uint8_t)a;
	h.incarnation = c->cfg.incarnation;
	len = hg_wire_build_mac(pkt->data, pkt->cap, &c->src, &c->agg[a].dst,
				&h, s->in + first * s->in_lane, bytes, 0,
				c->mac_len ? c->keys[0] : NULL);
	/* Cannot fail: cap and payload were checked against payload_bytes. */
	pkt->len = len > 0 ? (uint16_t)len : 0;
	return bytes;
}

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
	for (size_t i = 0; i < (size_t)c->naggs * c->cfg.slots; i++)
		c->fl[i].busy = false;
	return rc;
}

static int fail_text(struct hg_client *c, int rc, const char *what)
{
	snprintf(c->err, sizeof(c->err), "%s", what);
	return client_fail(c, rc);
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

	if (buf_need(&c->gcounts, 4 * c->nblocks))
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
	client_release_lhc(c);
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

	client_release_lhc(c);
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

	client_release_lhc(c);
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
			return fail_text(c, -ENOTSUP, "a phase the client lacks");
		rc = pc->plan(c, &lanes, &exp);
		if (rc)
			return fail_text(c, rc, pc->what);
		op = hg_op_get(hg_phase_at(ph)->op);
		if (buf_need(&c->tx[ph], lanes * op->in_lane) ||
		    buf_need(&c->rx[ph], lanes * op->acc_lane))
			return fail_text(c, -ENOMEM, "out of memory");
		rc = pc->encode(c, c->tx[ph].p);
		if (rc)
			return fail_text(c, rc, pc->what);
		stream_set(&c->st.s[ns++], (enum hg_phase)ph, exp, c->tx[ph].p,
			   c->rx[ph].p, lanes, c->cfg.payload_bytes);
	}
	rc = step_begin(c, ns);
	return rc ? fail_text(c, rc, "out of memory") : 0;
}

/*
 * The current step is complete: decode its phases, then set up the next
 * step (after auto's choice, the chosen method's) or finish.  Returns 0, or
 * the negative errno the allreduce failed with.
 */
static int advance(struct hg_client *c)
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
			return fail_text(c, rc, pc->what);
	}
	c->sent_phases |= c->mi->steps[c->step];
	next = NULL;
	if ((c->mi->flags & HG_MF_CHOOSES) && c->step + 1 == c->mi->nsteps) {
		/* auto after its own steps: the meta phase decides, or the
		 * index phase runs first */
		rc = hg_auto_choose(&c->p, c->n, gcodes(c), gcounts(c));
		next = rc < 0 ? NULL : hg_method_get(rc);
		if (!next)
			return fail_text(c, rc < 0 ? rc : -EPROTO,
					 "auto: cannot choose a method");
		c->choose_again = true;
	} else if (c->choose_again &&
		   (c->mi->steps[c->step] & HG_PHB(INDEX))) {
		rc = hg_auto_choose_indexed(c->lhc);
		next = rc < 0 ? NULL : hg_method_get(rc);
		if (!next)
			return fail_text(c, rc < 0 ? rc : -EPROTO,
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
	if (buf_need(&c->tx[HG_PH_EXPONENTS], nb))
		return -ENOMEM;
	c->err[0] = '\0';
	if (method_sends(mi, HG_PH_COUNTS)) {
		/* lhc, union, auto: one pass gives exponents, counts and the
		 * non-zeros every later phase reads */
		if (!c->scan)
			c->scan = hg_scan_create();
		if (!c->scan || buf_need(&c->lcounts, 4 * nb))
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
	client_release_lhc(c);
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

/* ---- receive ----------------------------------------------------------- */

static void format_ip(char *s, size_t len, uint32_t ip)
{
	snprintf(s, len, "%u.%u.%u.%u", ip >> 24, (ip >> 16) & 255,
		 (ip >> 8) & 255, ip & 255);
}

/*
 * The aggregator's name in error texts: "10.0.0.1:48879", and with K > 1
 * "10.0.1.2:48879 (shard 1 of 3)".
 */
static void agg_name(const struct hg_client *c, uint32_t a, char *s, size_t len)
{
	const struct hg_wire_addr *d = &c->agg[a].dst;
	char ip[20];

	format_ip(ip, sizeof(ip), d->ipv4);
	if (c->naggs == 1)
		snprintf(s, len, "%s:%u", ip, d->port);
	else
		snprintf(s, len, "%s:%u (shard %u of %u)", ip, d->port, a, c->naggs);
}

/* Aggregator ag answered with incarnation inc after another one during
 * this allreduce: it lost the job's state.  End the allreduce. */
static void agg_restarted(struct hg_client *c, const struct agg *ag,
			  uint32_t inc)
{
	char name[64];

	agg_name(c, (uint32_t)(ag - c->agg), name, sizeof(name));
	snprintf(c->err, sizeof(c->err),
		 "aggregator %s restarted during the allreduce (incarnation "
		 "%u, now %u)", name, ag->incarnation, inc);
	client_fail(c, -ECONNRESET);
}

/*
 * Which aggregator sent a reply: the one whose address (IPv4, UDP port) is
 * its source.  Returns its index, or -1.
 */
static int reply_agg(const struct hg_client *c, const struct hg_wire_view *v)
{
	for (uint32_t a = 0; a < c->naggs; a++)
		if (c->agg[a].dst.ipv4 == v->src.ipv4 &&
		    c->agg[a].dst.port == v->src.port)
			return (int)a;
	return -1;
}

/* Handle one received frame (at port time now): a result or a status for this job. */
static void handle_frame(struct hg_client *c, const uint8_t *f, size_t len,
			 uint64_t now)
{
	struct step *st = &c->st;
	struct hg_wire_view v;
	const struct stream *s;
	struct flight *fl;
	struct agg *ag;
	const uint8_t *pl;
	size_t k, first, lanes;
	uint64_t chunk, txn;
	uint32_t seq;
	int a;

	/* Same validation as the aggregator: addresses, lengths, header. */
	if (hg_wire_parse(f, len, c->src.port, 0, &v) != 0 ||
	    v.hdr.job != c->cfg.job || v.hdr.token != c->cfg.token ||
	    !(v.hdr.flags & (HG_FLAG_RESULT | HG_FLAG_STATUS)))
		goto ignore;
	/* A reply of this job must carry the aggregator's MAC (auth), or none. */
	if (c->mac_len ? !(v.hdr.flags & HG_FLAG_AUTH) ||
			 !hg_auth_verify(c->keys[1], f + v.payload_off - HG_HDR_LEN,
					 HG_HDR_LEN + v.payload_len,
					 f + v.payload_off + v.payload_len)
		       : (v.hdr.flags & HG_FLAG_AUTH)) {
		c->stats.bad_mac++;
		return;
	}
	a = reply_agg(c, &v);
	if (a < 0 || v.hdr.shard != (uint32_t)a)
		goto ignore; /* not one of ours, or its reply about another shard */
	ag = &c->agg[a];
	pl = f + v.payload_off;
	seq = v.hdr.seq;
	if (c->stage != ST_RUNNING) {
		if (v.hdr.flags & HG_FLAG_RESULT)
			c->stats.duplicates_received++;
		return;
	}
	/* Chunk number of (a, seq): seq counts from the step's base / K at
	 * every aggregator, modulo 2^32.  Below the step's base, k wraps to
	 * a huge value: a late copy of an earlier step. */
	chunk = (st->base / c->naggs + (uint32_t)(seq - (uint32_t)(st->base / c->naggs))) *
		c->naggs + (uint32_t)a;
	k = (size_t)(chunk - st->base);
	fl = &c->fl[(size_t)a * c->cfg.slots + seq % c->cfg.slots];
	if (k < st->nchunks && v.hdr.incarnation != ag->incarnation) {
		/* A reply about this step from another life of the aggregator. */
		if (ag->incarnation) {
			agg_restarted(c, ag, v.hdr.incarnation);
			return;
		}
		ag->incarnation = v.hdr.incarnation;
	}

	if (v.hdr.flags & HG_FLAG_STATUS) {
		c->stats.status_received++;
		ag->st.status_received++;
		if (fl->busy && fl->chunk == chunk) {
			size_t nb = (c->cfg.workers + 7) / 8;

			memset(fl->bitmap, 0, sizeof(fl->bitmap));
			memcpy(fl->bitmap, pl, v.payload_len < nb ? v.payload_len : nb);
			fl->have_status = true;
			if (fl->bitmap[c->cfg.worker / 8] >> (c->cfg.worker % 8) & 1) {
				/* Our contribution is there: the slot waits for
				 * a peer.  Nothing to resend; a timeout that made
				 * us ask was spurious. */
				if (fl->timed_out)
					spurious_timeout(c, ag, fl);
				fl->present = true;
				fl->fast_at = 0;
				fl->armed = now;
			} else if (!fl->unsent &&
				   (fl->fast_at || now - fl->last_tx >= turn_ns(c, ag))) {
				/* Ours is missing, and this STATUS is not older
				 * than our latest copy (results of chunks sent
				 * after it came back, or it is a turn old):
				 * resend it now. */
				fl->fast_at = now;
			}
		}
		return;
	}
	if (k >= st->nchunks) {
		/* A late copy of a chunk of an earlier step. */
		c->stats.duplicates_received++;
		return;
	}
	if (c->done.p[k] != CH_PENDING) {
		c->stats.duplicates_received++;
		if (c->done.p[k] == CH_DONE_AFTER_TIMEOUT) {
			/* The original's result and the answer to the
			 * retransmission both came: it was not lost. */
			spurious_timeout(c, ag, NULL);
			c->done.p[k] = CH_DONE;
		}
		return;
	}
	s = chunk_stream(st, k);
	first = (k - s->first_chunk) * s->per_chunk;
	lanes = s->lanes - first < s->per_chunk ? s->lanes - first : s->per_chunk;
	/* hg_wire_parse checked payload_len == lanes * acc lane bytes. */
	if (v.hdr.op != s->op || v.hdr.lanes != lanes)
		goto ignore;
	memcpy(s->out + first * s->acc_lane, pl, lanes * s->acc_lane);
	c->done.p[k] = CH_DONE;
	st->ndone++;
	c->stats.results_received++;
	c->stats.bytes_received[s->phase] += lanes * s->acc_lane;
	ag->st.results_received++;
	ag->st.bytes_received += lanes * s->acc_lane;
	if (ag->hi_done == 0 && ag->t_first_tx && now >= ag->t_first_tx)
		start_sample(c, now - ag->t_first_tx);
	txn = UINT64_MAX;
	if (fl->busy && fl->chunk == chunk) {
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
		if (fl->tries == 1 && k + 1 >= ag->hi_done &&
		    fl->last_tx > ag->t_timeout && now >= fl->last_tx)
			rtt_sample(c, ag, now - fl->last_tx);
		if (fl->timed_out)
			c->done.p[k] = CH_DONE_AFTER_TIMEOUT;
		/* The answered copy was sent no earlier than the first. */
		txn = fl->txn_first;
		fl->busy = false;
		fl->fast_at = 0;
	}
	/*
	 * The aggregator's chunks still open below k (K apart) that were last
	 * sent before k was first sent: one more result overtook them.  At
	 * DUPTHRESH they are taken as lost and resent at this worker's turn
	 * (chunk_rank).
	 */
	while (ag->lo_open < st->nchunks && c->done.p[ag->lo_open] != CH_PENDING)
		ag->lo_open += c->naggs;
	for (size_t i = ag->lo_open; i < k && txn != UINT64_MAX; i += c->naggs) {
		struct flight *o = flight_of(c, i);

		if (c->done.p[i] != CH_PENDING || !o->busy || o->unsent ||
		    o->present || o->txn_last >= txn || o->fast_at)
			continue;
		if (++o->overtaken >= DUPTHRESH)
			o->fast_at = now + chunk_rank(c, o->chunk) * turn_ns(c, ag);
	}
	if (k + 1 > ag->hi_done) {
		/* Chunks of this aggregator this result overtook: their
		 * timers stop following its results from here on (see
		 * chunk_deadline).  Its chunks are K apart in the step. */
		uint64_t from = ag->t_hi > ag->t_backoff ? ag->t_hi : ag->t_backoff;
		size_t i = ag->hi_done ? ag->hi_done - 1 + c->naggs : k % c->naggs;

		for (; i < k; i += c->naggs) {
			struct flight *o = flight_of(c, i);

			if (!c->done.p[i] && o->busy && o->armed < from)
				o->armed = from;
		}
		ag->hi_done = k + 1;
		ag->t_hi = now;
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
	enum hg_phase ph[BURST];
	size_t bytes[BURST];
	uint16_t got, sent;

	got = hg_port_alloc(c->cfg.port, pk, cnt);
	for (uint16_t i = 0; i < got; i++) {
		if (pk[i]->cap < ETH_LEN + IP_LEN + UDP_LEN + HG_HDR_LEN +
				 c->cfg.payload_bytes + c->mac_len) {
			hg_port_free(c->cfg.port, pk + i, got - i);
			got = i;
			break;
		}
		bytes[i] = build_chunk(c, pk[i], ks[i], flight_of(c, ks[i])->tries > 0,
				       &ph[i]);
	}
	sent = got ? hg_port_tx(c->cfg.port, pk, got) : 0;
	if (sent < got)
		hg_port_free(c->cfg.port, pk + sent, got - sent);
	for (uint16_t i = 0; i < cnt; i++) {
		struct flight *fl = flight_of(c, ks[i]);
		struct agg *ag = &c->agg[fl->agg];

		if (i >= sent) {
			c->tx_blocked = true;
			fl->unsent = true;
			c->stats.tx_refused++;
			continue;
		}
		fl->unsent = false;
		fl->last_tx = now;
		fl->armed = now;
		fl->txn_last = ++c->txn;
		fl->overtaken = 0;
		if (fl->tries == 0)
			fl->txn_first = fl->txn_last;
		if (!ag->t_first_tx)
			ag->t_first_tx = now;
		if (fl->tries++ > 0) {
			c->stats.retransmissions++;
			ag->st.retransmissions++;
		}
		c->stats.packets_sent++;
		c->stats.bytes_sent[ph[i]] += bytes[i];
		ag->st.packets_sent++;
		ag->st.bytes_sent += bytes[i];
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
			size_t span = (size_t)c->naggs * c->cfg.slots;
			struct flight *fl = flight_of(c, k);

			/* chunk k - K S: the same slot of the same aggregator */
			if (k >= span && !c->done.p[k - span])
				break;
			if (fl->busy)
				break; /* cannot happen when the above holds */
			fl->busy = true;
			fl->chunk = st->base + k;
			fl->agg = (uint32_t)(fl->chunk % c->naggs);
			fl->seq = (uint32_t)(fl->chunk / c->naggs);
			fl->tries = 0;
			fl->have_status = false;
			fl->timed_out = false;
			fl->present = false;
			fl->overtaken = 0;
			fl->fast_at = 0;
			fl->first_tx = now;
			fl->rto = c->agg[fl->agg].rto;
			ks[cnt++] = k;
			st->next_send++;
		}
		if (!cnt)
			return;
		tx_chunks(c, ks, cnt, now);
		if (flight_of(c, ks[cnt - 1])->unsent)
			return; /* the port is full: try again at the next poll */
	}
}

static void timeout_text(struct hg_client *c, const struct flight *fl)
{
	const struct stream *s = chunk_stream(&c->st, (size_t)(fl->chunk - c->st.base));
	const struct agg *ag = &c->agg[fl->agg];
	char name[64], *e = c->err, *end = c->err + sizeof(c->err);
	/* the limit it waited for; a late wake-up (a loaded host) is not news */
	double secs = (double)c->cfg.give_up_ns / 1e9;
	uint32_t missing = 0;

	agg_name(c, fl->agg, name, sizeof(name));
	if (ag->st.results_received == ag->start_results && !fl->have_status) {
		snprintf(c->err, sizeof(c->err),
			 "no answer from aggregator %s: sent %llu chunks, "
			 "received 0 results", name,
			 (unsigned long long)(ag->st.packets_sent - ag->start_sent));
		return;
	}
	e += snprintf(e, (size_t)(end - e),
		      "timed out after %.3g s waiting for chunk %llu (phase %s): ",
		      secs, (unsigned long long)fl->chunk, hg_phase_name(s->phase));
	if (!fl->have_status) {
		snprintf(e, (size_t)(end - e),
			 "no status from aggregator %s after %u transmissions",
			 name, fl->tries);
		return;
	}
	e += snprintf(e, (size_t)(end - e), "aggregator %s reports workers ", name);
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

	size_t nfl = (size_t)c->naggs * c->cfg.slots;

	for (size_t i = 0; i < nfl; i++) {
		const struct flight *fl = &c->fl[i];

		if (fl->busy && now - fl->first_tx >= c->cfg.give_up_ns &&
		    (!oldest || fl->first_tx < oldest->first_tx))
			oldest = fl;
	}
	if (oldest) {
		timeout_text(c, oldest);
		c->stats.timeouts++;
		return client_fail(c, -ETIMEDOUT);
	}
	for (size_t i = 0; i < nfl; i++) {
		struct flight *fl = &c->fl[i];
		struct agg *ag = &c->agg[fl->agg];

		if (!fl->busy)
			continue;
		if (!fl->unsent && fl->fast_at && now >= fl->fast_at) {
			/* Fast retransmission: a gap or a STATUS said it was
			 * lost; no timer expired, nothing to back off. */
			fl->fast_at = 0;
			c->stats.fast_retransmissions++;
			ag->st.fast_retransmissions++;
		} else if (!fl->unsent && now < chunk_deadline(c, fl)) {
			continue;
		} else if (!fl->unsent) {
			/* RFC 6298 5.5: back off this chunk's timer, and the
			 * client's, which new chunks start with until a valid
			 * sample -- the latter at most once per RTO, so
			 * independent losses expiring together (one lost
			 * contribution times out on every worker's copy of
			 * the chunk) do not compound. */
			c->stats.timeouts++;
			ag->st.timeouts++;
			ag->t_timeout = now;
			fl->timed_out = true;
			fl->fast_at = 0;
			fl->rto = rto_backoff(c, chunk_rto(c, fl));
			if (now - ag->t_backoff >= ag->rto) {
				ag->rto = rto_backoff(c, ag->rto);
				ag->t_backoff = now;
			}
		}
		ks[cnt++] = (size_t)(fl->chunk - c->st.base);
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

	for (size_t i = 0; i < (size_t)c->naggs * c->cfg.slots; i++) {
		const struct flight *fl = &c->fl[i];
		uint64_t t;

		if (!fl->busy)
			continue;
		if (fl->unsent)
			return now;
		t = chunk_deadline(c, fl);
		if (fl->fast_at && fl->fast_at < t)
			t = fl->fast_at;
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
	c->tx_blocked = false;
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
	const struct hg_port *port;
	uint64_t dl, now;
	int rc;

	rc = hg_client_start(c, p, method, x, n, y);
	if (rc)
		return rc;
	port = c->cfg.port;
	for (;;) {
		rc = hg_client_poll(c, &dl);
		if (rc != 0)
			return rc > 0 ? 0 : rc;
		now = hg_port_now(port);
		if (c->tx_blocked) {
			/* The port refused frames: wait until it takes more
			 * (or a result comes), at most one granule. */
			dl = now + HG_CLIENT_RTO_GRANULARITY_NS;
		} else if (dl <= now) {
			continue;
		}
		if (dl - now > IDLE_WAIT_NS)
			dl = now + IDLE_WAIT_NS;
		if (hg_port_can_wait(port)) {
			rc = hg_port_wait(port, dl, c->tx_blocked);
			if (rc < 0)
				return client_fail(c, rc);
		} else {
			uint64_t wait = dl - now;
			struct timespec ts;

			if (wait > HG_CLIENT_RTO_GRANULARITY_NS)
				wait = HG_CLIENT_RTO_GRANULARITY_NS;
			ts.tv_sec = 0;
			ts.tv_nsec = (long)wait;
			nanosleep(&ts, NULL);
		}
	}
}
