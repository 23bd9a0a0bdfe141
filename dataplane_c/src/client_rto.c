/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The worker client's retransmission timeout (see client.c).
 *
 * Retransmission timeout (RFC 6298): one estimator per aggregator, kept
 * across allreduces.  A sample is the time from a chunk's only transmission to its
 * result (Karn: chunks sent more than once give none).  Under a full window
 * results come back one behind the other at the bottleneck's pace, so the
 * samples include the queueing of the whole window and SRTT settles at the
 * real round trip of a chunk, S times the bottleneck's per-chunk time.
 *
 * A timer expiry whose chunk turns out not to have been lost is a spurious
 * timeout: counted, its backoff undone, and the stall its chunk waited
 * through (a silence of its aggregator that held the whole window, not one
 * slot) taught to the timeout as a floor (Eifel, RFC 4015; the floor halves
 * each STALL_MEMORY_NS without another one).  Before the first result of a step
 * the timers wait at least start_wait, which learns how late the slowest
 * peer starts a step.
 */

#include "client_pvt.h"

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

/* ---- retransmission timeout -------------------------------------------- */

/* rto * backoff_num / backoff_den, saturating at rto_max_ns. */
uint64_t hg_cl_rto_backoff(const struct hg_client *c, uint64_t rto)
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

	rto = srtt +
	      (var4 > c->cfg.rto_granularity_ns ? var4 : c->cfg.rto_granularity_ns);
	if (rto < c->cfg.rto_min_ns)
		rto = c->cfg.rto_min_ns;
	if (rto > c->cfg.rto_max_ns)
		rto = c->cfg.rto_max_ns;
	return rto;
}

/*
 * rto_est of aggregator ag at time now: the RFC 6298 estimate (before the
 * first sample rto_ns, or the step-start sample's timeout when longer), at
 * least the stall floor, which halves every STALL_MEMORY_NS since it was
 * last raised or halved.
 */
static void set_rto_est(const struct hg_client *c, struct agg *ag, uint64_t now)
{
	uint64_t rto = ag->rtt.have ? rto_clamp(c, ag->rtt.avg, ag->rtt.var) :
				      c->cfg.rto_ns;

	/* no sample yet: at least the step-start sample's timeout */
	if (!ag->rtt.have && rto < ag->rto_first)
		rto = ag->rto_first;

	while (ag->stall && now - ag->t_stall >= STALL_MEMORY_NS) {
		ag->stall /= 2;
		ag->t_stall += STALL_MEMORY_NS;
	}
	if (rto < ag->stall)
		rto = ag->stall < c->cfg.rto_max_ns ? ag->stall : c->cfg.rto_max_ns;
	ag->rto_est = rto;
}

/* Rmin after a valid RTT sample r (ns, at least 1) at time now: the least
 * sample since t_rmin, a new bucket every RMIN_BUCKET_NS (the one before
 * kept in rmin_prev). */
static void rmin_sample(struct agg *ag, uint64_t r, uint64_t now)
{
	if (!ag->t_rmin || now - ag->t_rmin >= RMIN_BUCKET_NS) {
		ag->rmin_prev = ag->t_rmin ? ag->rmin : 0;
		ag->rmin = r;
		ag->t_rmin = now ? now : 1;
	} else if (r < ag->rmin) {
		ag->rmin = r;
	}
}

uint64_t hg_cl_rtt_min(const struct agg *ag)
{
	return ag->rmin_prev && ag->rmin_prev < ag->rmin ? ag->rmin_prev : ag->rmin;
}

/* The pipe's cap: S, or the configuration's pipe_max below it
 * (PROTOCOL.md "Slots beyond the ring's share"). */
static uint32_t pipe_cap(const struct hg_client *c)
{
	uint32_t m = c->cfg.pipe_max;

	return m && m < c->cfg.slots ? m : c->cfg.slots;
}

/*
 * The pipe's bound before its first sample: the K pipes share this
 * worker's link, so they start with at most PIPE_LINK_START chunks
 * together, each within [PIPE_MIN, PIPE_START] (PROTOCOL.md "Several
 * pipes on one link"); at most the pipe's cap.
 */
uint32_t hg_cl_pipe_start(const struct hg_client *c)
{
	uint32_t start = PIPE_LINK_START / (c->naggs ? c->naggs : 1),
		 cap = pipe_cap(c);

	if (start > PIPE_START)
		start = PIPE_START;
	if (start < PIPE_MIN)
		start = PIPE_MIN;
	return start < cap ? start : cap;
}

/*
 * The pipe's bound after a valid RTT sample r (ns; PROTOCOL.md "The
 * pipe"): from hg_cl_pipe_start, cwnd a 1 / max(cwnd, 8) of the way to
 * g cwnd Rmin / r, within [PIPE_MIN, the pipe's cap].  A pipe of cwnd
 * chunks answered within r carries cwnd / r, so it settles where
 * r = g Rmin; while r = Rmin it doubles about every round trip (cwnd
 * samples).
 */
static void pipe_sample(const struct hg_client *c, struct agg *ag, uint64_t r)
{
	double g = c->cfg.pipe_gain_pct / 100.0, target, step, lo = PIPE_MIN,
	       hi = pipe_cap(c);
	uint64_t rmin = hg_cl_rtt_min(ag);

	if (!rmin)
		return; /* no full chunk's sample yet: the bound stays */
	if (ag->cwnd <= 0)
		ag->cwnd = hg_cl_pipe_start(c);
	target = g * ag->cwnd * (double)rmin / (double)r;
	step = ag->cwnd > 8 ? ag->cwnd : 8;
	ag->cwnd += (target - ag->cwnd) / step;
	if (lo > hi)
		lo = hi;
	if (ag->cwnd < lo)
		ag->cwnd = lo;
	if (ag->cwnd > hi)
		ag->cwnd = hi;
}

/*
 * A valid RTT sample r (ns) of aggregator ag: RFC 6298 section 2 with
 * alpha = 1/8, beta = 1/4, K = 4, G = cfg.rto_granularity_ns.  The
 * new timeout replaces any backed-off one.  With a pipe gain, the sample
 * also moves the pipe's bound; only a full chunk's (full: as many lanes
 * as a chunk of its stream carries) can lower Rmin, since a shorter frame
 * crosses every link faster than any full chunk (PROTOCOL.md "The pipe").
 */
void hg_cl_rtt_sample(const struct hg_client *c, struct agg *ag, uint64_t r,
		      uint64_t now, bool full)
{
	smooth_add(&ag->rtt, r);
	if (full)
		rmin_sample(ag, r ? r : 1, now);
	if (c->cfg.pipe_gain_pct)
		pipe_sample(c, ag, r ? r : 1);
	set_rto_est(c, ag, now);
	ag->rto = ag->rto_est;
	ag->st.rtt_samples++;
}

/*
 * The class of the current step's start: 0 for an allreduce's first step,
 * whose wait includes how much later than this worker the slowest peer
 * began the allreduce (its computing before it), 1 for a later step
 * (the peers' decoding of the step before).
 */
unsigned hg_cl_start_class(const struct hg_client *c)
{
	return c->st.first ? 0 : 1;
}

/*
 * A step-start sample s (ns): aggregator ag's first transmission of the
 * step to its first result, at time now.  The start wait of the step's
 * class is 1.5 times the least of its latest START_SAMPLES samples (a peer
 * always late shows in each, one late after a repair of its own in some;
 * PROTOCOL.md "Why the least of the latest samples"), within
 * [start_wait_ns, give_up_ns / 4].
 */
void hg_cl_start_sample(struct hg_client *c, struct agg *ag, uint64_t s,
			uint64_t now)
{
	unsigned k = hg_cl_start_class(c);
	uint64_t w = UINT64_MAX, *ring = c->start_s[k];
	size_t n;

	ring[c->start_n[k]++ % START_SAMPLES] = s;
	n = c->start_n[k] < START_SAMPLES ? (size_t)c->start_n[k] : START_SAMPLES;
	for (size_t i = 0; i < n; i++)
		if (ring[i] < w)
			w = ring[i];
	w += w / 2;
	if (w < c->cfg.start_wait_ns)
		w = c->cfg.start_wait_ns;
	if (w > c->cfg.give_up_ns / 4)
		w = c->cfg.give_up_ns / 4;
	c->start_wait[k] = w;
	/* Before aggregator ag's first RTT sample its timeout is at least
	 * RFC 6298's of a first sample s: s is an upper bound of what the
	 * window's first chunk waited, where rto_ns knows nothing of the
	 * queue at the aggregator (PROTOCOL.md "The timeout before the
	 * first sample"). */
	if (!ag->rtt.have) {
		uint64_t r = rto_clamp(c, s, s / 2);

		if (r > ag->rto_first) {
			ag->rto_first = r;
			set_rto_est(c, ag, now);
			if (ag->rto < ag->rto_est)
				ag->rto = ag->rto_est;
		}
	}
}

/*
 * Raise aggregator ag's stall floor to twice silence (ns), the stall a
 * chunk with a spurious timeout waited through: the timer restarts at
 * every result, so twice the stall covers one as long again (RFC 4015
 * re-seeds SRTT = R', RTTVAR = R' / 2, a timeout of 3 R').  The floor
 * halves every STALL_MEMORY_NS.
 */
void hg_cl_stall_floor(const struct hg_client *c, struct agg *ag,
		       uint64_t silence, uint64_t now)
{
	set_rto_est(c, ag, now);
	if (2 * silence <= ag->stall)
		return;
	ag->stall = 2 * silence;
	ag->t_stall = now;
	set_rto_est(c, ag, now);
	if (ag->rto < ag->rto_est)
		ag->rto = ag->rto_est;
}

/*
 * A timeout of aggregator ag turned out spurious: the chunk had not been
 * lost, it waited for a peer (computing, descheduled, or repairing its
 * own loss).  Eifel response (RFC 4015): undo the backoff, and adapt the
 * timer to the stall that fooled it.  The smoothed estimate follows the
 * queue of the window within a few results, so the stall goes into a
 * floor of the timeout instead (hg_cl_stall_floor): ``silence``, the
 * longest stall of the aggregator the chunk waited through so far
 * (hg_cl_note_silence); its result teaches the whole stall.
 */
void hg_cl_spurious_timeout(struct hg_client *c, struct agg *ag,
			    struct flight *fl, uint64_t silence, uint64_t now)
{
	c->stats.spurious_timeouts++;
	ag->st.spurious_timeouts++;
	if (fl) {
		fl->timed_out = false;
		fl->spurious = true;
	}
	hg_cl_stall_floor(c, ag, silence, now);
	ag->rto = ag->rto_est;
}

/*
 * A reply of aggregator ag at time now: a new result, or a STATUS about an
 * open chunk.  The silence since its latest result is a stall of the
 * aggregator when at least two of our chunks there waited through all of
 * it, none of them known lost (no later result overtook it): a peer, the
 * aggregator or this worker off its core stops every slot of the window,
 * while a repair holds its own slot and the others' results keep coming
 * (until a worker waiting on it has sent the window past it), and the lone
 * last chunk of a step proves nothing.  Every chunk that waited through it
 * keeps the longest such stall.
 */
void hg_cl_note_silence(struct hg_client *c, struct agg *ag, uint64_t now)
{
	struct flight *f = &c->fl[(size_t)(ag - c->agg) * c->cfg.slots];
	uint64_t g = now - ag->t_res;
	uint32_t held = 0;

	/* none yet, or too short to lengthen the timeout as a floor */
	if (!ag->t_res || now < ag->t_res || 2 * g <= ag->rto_est)
		return;
	for (uint32_t i = 0; i < c->cfg.slots && held < 2; i++)
		held += f[i].busy && f[i].first_tx <= ag->t_res && !f[i].overtaken;
	if (held < 2)
		return;
	for (uint32_t i = 0; i < c->cfg.slots; i++)
		if (f[i].busy && f[i].first_tx <= ag->t_res && f[i].silence < g)
			f[i].silence = g;
}

/*
 * A new result of aggregator ag at time now (before t_res moves).  Results
 * of a window come back one behind the other; a silence longer than a
 * turn is a stall (a peer's repair, a peer that has not sent, this worker
 * off its core), and every chunk in flight when it ends notes its length:
 * a sample at most twice that long says more of the stall than of the
 * path (hg_cl_path_sample).
 */
void hg_cl_path_result(struct hg_client *c, struct agg *ag, uint64_t now)
{
	uint64_t g;

	if (!ag->t_res || now <= ag->t_res)
		return;
	g = now - ag->t_res;
	if (g <= hg_cl_turn_ns(c, ag))
		return;
	for (uint32_t i = 0; i < c->cfg.slots; i++) {
		struct flight *f = &c->fl[(size_t)(ag - c->agg) * c->cfg.slots + i];

		if (f->busy && f->stalled < g)
			f->stalled = g;
	}
}

/*
 * A valid RTT sample r (ns) of chunk fl: the turns' estimate takes it
 * unless a stall was half of it.  The RTO keeps every sample (its floor
 * and the stalls' samples are what keep spurious timeouts rare); the
 * turns space the workers' retransmissions and release the slots an
 * overdue chunk holds, which a stall-inflated estimate stretches into a
 * stall of its own.
 */
void hg_cl_path_sample(struct agg *ag, const struct flight *fl, uint64_t r)
{
	if (2 * fl->stalled <= r)
		smooth_add(&ag->path, r);
}

/*
 * Below a tree leaf: a retransmission's reply time r (ns), from the resend
 * to the first STATUS of its chunk after it (docs/PROTOCOL.md "Repairs in
 * a tree").  The leaf answers from one hop away, where the path's round
 * trip crosses the root and waits for the slowest leaf.
 */
void hg_cl_reply_sample(const struct hg_client *c, struct agg *ag, uint64_t r)
{
	if (c->cfg.agg_workers < c->cfg.workers)
		smooth_add(&ag->reply, r);
}

/* This worker's turn among the W at its aggregator for chunk number chunk
 * (0 first), rotating: the workers whose retransmissions that aggregator's
 * STATUS answers (below a tree leaf, the leaf's, not the job's W). */
uint32_t hg_cl_chunk_rank(const struct hg_client *c, uint64_t chunk)
{
	uint32_t n = c->cfg.agg_workers;

	return (uint32_t)((c->cfg.agg_worker + n - chunk % n) % n);
}

/* How far apart the workers' turns are: SRTT + 4 RTTVAR of the path
 * (the samples no stall lengthened, hg_cl_path_sample), by when the
 * STATUS reply to the previous turn's retransmission is back, with the
 * confidence RFC 6298 gives the RTO (but without its floors); below a
 * tree leaf at most the same of the leaf's reply time, which is what a
 * turn waits for (hg_cl_reply_sample). */
uint64_t hg_cl_turn_ns(const struct hg_client *c, const struct agg *ag)
{
	uint64_t d = ag->path.have ? ag->path.avg + 4 * ag->path.var :
				     c->cfg.rto_ns;

	if (ag->reply.have && ag->reply.avg + 4 * ag->reply.var < d)
		d = ag->reply.avg + 4 * ag->reply.var;

	/* at most the longest timeout: W - 1 turns stay bounded */
	if (d > c->cfg.rto_max_ns)
		d = c->cfg.rto_max_ns;
	return d > c->cfg.rto_granularity_ns ? d : c->cfg.rto_granularity_ns;
}

/*
 * How long after the first turn this worker's turn for chunk number chunk
 * comes: min(rank, TURNS_MAX) turns (none for rank 0), at
 * most rto_max_ns, so that every worker's turn comes soon, however many
 * workers and however inflated the turn (a lost result, which only its
 * worker sees, waits that long; the window goes on meanwhile).
 */
uint64_t hg_cl_turn_offset(const struct hg_client *c, const struct agg *ag,
			   uint64_t chunk)
{
	uint32_t r = hg_cl_chunk_rank(c, chunk);
	uint64_t d = (uint64_t)(r < TURNS_MAX ? r : TURNS_MAX) *
		     hg_cl_turn_ns(c, ag);

	return d < c->cfg.rto_max_ns ? d : c->cfg.rto_max_ns;
}

/*
 * The timeout of a chunk in flight: its own (armed at its first
 * transmission, backed off at each of its expiries) or its aggregator's
 * current one when that is longer (a longer estimate, or a backoff since).
 * In the step's tail its own only: no window waits behind it that the
 * aggregator's backoff would keep from being resent; below a tree leaf, at
 * most TAIL_RMINS Rmin until its first resend.
 */
uint64_t hg_cl_chunk_rto(const struct hg_client *c, const struct flight *fl)
{
	const struct agg *ag = &c->agg[fl->agg];
	uint64_t rto = ag->rto;

	if (fl->rto && hg_cl_tail(c)) {
		uint64_t m = TAIL_RMINS * hg_cl_rtt_min(ag);

		/* Below a tree leaf, until the chunk's first resend: at most
		 * TAIL_RMINS Rmin (PROTOCOL.md "The tail of a step", rule 5). */
		if (c->cfg.agg_workers < c->cfg.workers && fl->tries == 1 && m) {
			if (m < c->cfg.rto_min_ns)
				m = c->cfg.rto_min_ns;
			if (m < fl->rto)
				return m;
		}
		return fl->rto;
	}
	return fl->rto > rto ? fl->rto : rto;
}

/*
 * Whether chunk fl waits for the first answer of its step at its
 * aggregator (with pipelined block groups: of its unit): none of the
 * step's results came back yet, so a peer may not have started it.
 */
bool hg_cl_step_start(const struct hg_client *c, const struct flight *fl)
{
	return c->agg[fl->agg].hi_done == 0 || c->st.u[fl->unit].ndone == 0;
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
uint64_t hg_cl_chunk_deadline(const struct hg_client *c, const struct flight *fl)
{
	const struct agg *ag = &c->agg[fl->agg];
	size_t k = (size_t)(fl->chunk - c->st.base);
	uint64_t from = fl->armed, rto = hg_cl_chunk_rto(c, fl);

	if (k >= ag->hi_done) {
		if (ag->t_hi > from)
			from = ag->t_hi;
		if (ag->t_backoff > from)
			from = ag->t_backoff;
	}
	/* No result of the step (of the segment, or of the chunk's unit when
	 * block groups are pipelined) yet: the slowest peer may still be
	 * computing it.  And the workers take turns (see hg_cl_chunk_rank), so
	 * that the first one's STATUS reply tells the others whether they are
	 * missing. */
	if (hg_cl_step_start(c, fl)) {
		uint64_t w = c->start_wait[hg_cl_start_class(c)];

		/* Only the lowest open chunk of the aggregator asks (the
		 * others wait for the same peers; its STATUS goes to the
		 * group); the others' timers start when it has its answer. */
		if (k != ag->lo_open)
			return UINT64_MAX;
		if (w > rto)
			rto = w;
	}
	/* In the tail, a chunk shown present waits for its own result, which
	 * the peers' turns do not bring: no turn of its own.  Any other waits
	 * at most one turn: a result lost on the way to this worker is asked
	 * for by nobody else (PROTOCOL.md "The tail of a step", rule 4). */
	if (hg_cl_tail(c)) {
		uint64_t d = fl->present ? 0 : hg_cl_turn_offset(c, ag, fl->chunk);
		uint64_t t = hg_cl_turn_ns(c, ag);

		return from + rto + (d < t ? d : t);
	}
	return from + rto + hg_cl_turn_offset(c, ag, fl->chunk);
}
