/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The tree leaf (docs/PROTOCOL.md "Tree"; engine_pvt.h): partial sums sent
 * up to the root, the root's results and STATUS taken back, and the upward
 * timers (hg_engine_timers()).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine_pvt.h"

/* ---- tree leaf (docs/PROTOCOL.md "Tree") -------------------------------- */

/* The op a leaf's partial sum goes up with: an NC8 accumulator is already
 * int32 lanes, so it goes up as SUM32; OR, MAX8 and SUM32 keep theirs. */
static inline uint8_t up_op(uint8_t op)
{
	return op == HG_OP_NC8 ? HG_OP_SUM32 : op;
}

/* Why a partial sum goes up: first, on its timer (the timeout doubles),
 * or asked by a root STATUS or a worker's retransmission (it does not). */
enum up_why { UP_FIRST, UP_TIMER, UP_ASKED };

/*
 * Queue a frame of the root's job about set s from this leaf (worker
 * up_worker): the partial sum (kind 0 or HG_FLAG_RETRANS) or a leaf report
 * (HG_FLAG_STATUS), payload pl of plen bytes, MACed with the leaf's key at
 * the root.  reuse: a buffer to take if large enough (NULL: allocate one).
 * False when there was no buffer (no_buffer counted).
 */
static bool up_frame(struct hg_engine *e, struct hg_job *j,
		     const struct hg_set *s, uint16_t kind, const uint8_t *pl,
		     size_t plen, struct hg_pkt **reuse)
{
	uint8_t op = up_op(s->op);
	struct hg_hdr h;

	/* a resend may be lost to a key the root dropped: given next keys
	 * are used from then on (docs/PROTOCOL.md "Key epochs in a tree") */
	if (j->mac_len && (kind & HG_FLAG_RETRANS))
		hg_eng_up_key_switch(j);
	h = (struct hg_hdr){
		.version = HG_PROTOCOL_VERSION,
		.op = op,
		.flags = set_flags(j, s, kind),
		.job = j->cfg.job,
		.token = j->cfg.token,
		.worker = j->cfg.up_worker,
		.slot = (uint16_t)((size_t)(s - j->sets) / 2),
		.seq = s->seq,
		.lanes = s->lanes,
		.exp = op == s->op && !(kind & HG_FLAG_STATUS) ? s->exp : 0,
		.shard = j->cfg.up_shard,
		.incarnation = j->up_self,
		.nonce = j->mac_len ? (uint32_t)++j->up_ctr : 0,
	};
	struct hg_pkt *none = NULL;
	struct hg_pkt *p;
	uint8_t *f;

	if (j->mac_len)
		h.flags |= (uint16_t)(HG_FLAG_AUTH |
				      j->up_epoch << HG_FLAG_EPOCH_SHIFT);
	p = hg_eng_out_pkt(e, j, reuse ? reuse : &none,
			   HG_OFF_PAYLOAD + plen + j->mac_len);
	if (!p)
		return false;
	f = p->data;
	hg_wire_put_l2l4(f, &e->self, j->cfg.up_mac, j->cfg.up_ipv4,
			 j->cfg.up_port, HG_HDR_LEN + plen + j->mac_len);
	hg_wire_put_hdr(f + HG_OFF_HDR, &h);
	memcpy(f + HG_OFF_PAYLOAD, pl, plen);
	if (j->mac_len)
		hg_mac_key_sign(&j->up_keys[UPK_SEND], HG_AUTH_DIR_REQUEST,
				j->up_ctr, f + HG_OFF_HDR, HG_HDR_LEN + plen,
				f + HG_OFF_PAYLOAD + plen);
	if (e->wire_flags & HG_WIRE_F_UDP_CSUM)
		hg_wire_put_udp_csum(f, hg_csum_add(0, f + HG_OFF_HDR,
						    HG_HDR_LEN + plen + j->mac_len));
	p->len = (uint16_t)(HG_OFF_PAYLOAD + plen + j->mac_len);
	queue_tx(e, p);
	return true;
}

/* Sample r into a smoothed value and its deviation as RFC 6298 smooths
 * RTT samples (the first sets avg = r, var = r / 2). */
static void smooth_rfc6298(uint64_t *avg, uint64_t *var, bool *have, uint64_t r)
{
	uint64_t d;

	if (!*have) {
		*avg = r;
		*var = r / 2;
		*have = true;
		return;
	}
	d = *avg > r ? *avg - r : r - *avg;
	*var = (3 * *var + d) / 4;
	*avg = (7 * *avg + r) / 8;
}

/*
 * The upward timeout of set t (docs/PROTOCOL.md "Repairs in a tree"):
 * up_rto_ns, or the leaf's measured round trip to the root when longer
 * (USRTT + 4 URTTVAR of up_rtt_sample(), at most UP_MAX_RTT_RTOS x
 * up_rto_ns), doubled per expiry of the set, and at least up_backoff times
 * (up_expired(): a set sent under a timeout that expires on sets doubles
 * it for the sets after it until a sample comes, RFC 6298 5.5 and 5.7;
 * without it a timeout below the round trip expires on every set, and
 * Karn's rule leaves no sample to correct it).
 */
static uint64_t up_timeout(const struct hg_job *j, const struct hg_up_timer *t)
{
	uint64_t m = j->cfg.up_rto_ns;
	uint32_t b = t->tries > j->up_backoff ? t->tries : j->up_backoff;

	if (j->up_rtt_have) {
		m = j->up_rtt_avg + 4 * j->up_rtt_var;
		if (m > UP_MAX_RTT_RTOS * j->cfg.up_rto_ns)
			m = UP_MAX_RTT_RTOS * j->cfg.up_rto_ns;
		if (m < j->cfg.up_rto_ns)
			m = j->cfg.up_rto_ns;
	}
	return m << (b < UP_MAX_BACKOFF ? b : UP_MAX_BACKOFF);
}

/* Set t of job j expired at time now: the first expiry of a set sent
 * since the timeout last doubled doubles it (up to UP_MAX_BACKOFF). */
static void up_expired(struct hg_job *j, const struct hg_up_timer *t, uint64_t now)
{
	if (t->first_ns < j->up_backoff_ns || j->up_backoff >= UP_MAX_BACKOFF)
		return;
	j->up_backoff++;
	j->up_backoff_ns = now;
}

/* A round trip r (ns) to the root: a set sent up once, to its RESULT
 * (Karn's rule: a set sent again gives none); a sample ends the doubling. */
static void up_rtt_sample(struct hg_job *j, uint64_t r)
{
	j->up_backoff = 0;
	smooth_rfc6298(&j->up_rtt_avg, &j->up_rtt_var, &j->up_rtt_have, r);
}

/*
 * Send set s's partial sum (its accumulator) up to the root, as worker
 * up_worker of the root's job (a resend with HG_FLAG_RETRANS), and arm the
 * set's timer with the timeout doubled per timer expiry.  reuse: a buffer
 * to take if large enough (NULL: allocate one).  Without a buffer the
 * frame is not sent (no_buffer) but the timer still runs.
 */
static void up_send(struct hg_engine *e, struct hg_job *j, struct hg_set *s,
		    const uint8_t *acc, enum up_why why, struct hg_pkt **reuse)
{
	bool retrans = why != UP_FIRST;
	struct hg_up_timer *t = &j->up[s - j->sets];
	size_t plen = (size_t)s->lanes * hg_op_in_lane(up_op(s->op));
	uint64_t now = hg_port_now(e->port);

	if (why == UP_FIRST) {
		t->first_ns = now;
		t->tries = 0;
		t->resent = false;
	} else {
		t->resent = true;
		if (why == UP_TIMER)
			t->tries++;
	}
	t->txn_last = ++j->up_txn;
	t->txn_sent = t->txn_last;
	if (why == UP_FIRST)
		t->txn_first = t->txn_last;
	t->overtaken = 0;
	t->awaiting = true;
	t->deferred = false;
	t->sent_ns = now;
	t->due_ns = now + up_timeout(j, t);
	if (t->due_ns < e->up_next)
		e->up_next = t->due_ns;
	count(e, j, retrans ? HG_CNT_UP_RETRANSMISSIONS : HG_CNT_UP_SENT);
	up_frame(e, j, s, retrans ? HG_FLAG_RETRANS : 0, acc, plen, reuse);
}

/* Leaf: how often it repeats a report of a set still open there. */
static uint64_t report_period(const struct hg_job *j)
{
	return j->cfg.up_rto_ns < REPORT_REPEAT_NS ? j->cfg.up_rto_ns :
						     REPORT_REPEAT_NS;
}

/*
 * Leaf: tell the root which of this leaf's workers open set s lacks (a leaf
 * report, docs/PROTOCOL.md "Who is missing in a tree"), unless a report of
 * the same chunk went up less than half a report_period() ago.  Nothing is
 * summed by it; the root only keeps it for its STATUS.  While the set
 * stays open the leaf repeats it every report_period() (hg_engine_timers),
 * up to up_give_up_ns after the first: a root takes a report not heard
 * again within REPORT_STALE_NS for a dead leaf's.
 */
void hg_eng_up_report(struct hg_engine *e, struct hg_job *j, const struct hg_set *s)
{
	struct hg_view *vw = &j->view[s - j->sets];
	uint8_t pl[4 + VIEW_BYTES] = { 0 };
	uint32_t n = j->cfg.workers;
	uint64_t now = hg_port_now(e->port);
	bool again;

	if (s->state != SET_OPEN)
		return;
	again = vw->reported && vw->report_seq == s->seq;
	if (again && now - vw->report_ns < report_period(j) / 2)
		return;
	hg_wr16(pl, j->cfg.up_base);
	hg_wr16(pl + 2, (uint16_t)n);
	for (uint32_t i = 0; i < n; i++)
		if (!(s->bitmap[i / 64] >> (i % 64) & 1))
			pl[4 + i / 8] |= (uint8_t)(1u << (i % 8));
	if (!up_frame(e, j, s, HG_FLAG_STATUS, pl, 4 + (n + 7) / 8, NULL))
		return;
	if (!again)
		vw->report_first_ns = now;
	vw->reported = true;
	vw->report_seq = s->seq;
	vw->report_ns = now;
	if (now + report_period(j) < e->up_next)
		e->up_next = now + report_period(j);
	count(e, j, HG_CNT_UP_REPORTS);
}

/* Leaf: the time its report of open set s is due again (UINT64_MAX: none:
 * the set is not open, was never reported, or the next repeat would come
 * more than up_give_up_ns after its first report). */
static uint64_t report_due(const struct hg_job *j, const struct hg_set *s)
{
	const struct hg_view *vw = &j->view[s - j->sets];

	if (s->state != SET_OPEN || !vw->reported || vw->report_seq != s->seq ||
	    vw->report_ns + report_period(j) - vw->report_first_ns >
		    j->cfg.up_give_up_ns)
		return UINT64_MAX;
	return vw->report_ns + report_period(j);
}

/* Root: does leaf w's latest report still count at time now (a live leaf
 * repeats it while the set waits)? */
static bool report_fresh(const struct hg_job *j, uint32_t w, uint64_t now)
{
	return now - j->peers[w].report_ns <= REPORT_STALE_NS;
}

/*
 * The bytes a STATUS of set s carries after its two bitmaps (written to
 * out, at most HG_STATUS_MAX_PAYLOAD - 64; returns how many): at a root,
 * the missing-below bitmap its leaves reported for the set's chunk; at a
 * leaf, for a forwarded set of which it has the root's STATUS, L, the
 * root's worker and active bitmaps and the missing-below bitmap
 * (docs/PROTOCOL.md "Who is missing in a tree").  0: nothing.
 */
size_t hg_eng_tree_tail(const struct hg_job *j, const struct hg_set *s,
			uint64_t now, uint8_t *out)
{
	const struct hg_view *vw = &j->view[s - j->sets];
	size_t nb;

	if (!j->up) {
		if (!vw->below_set || vw->below_seq != s->seq)
			return 0;
		memcpy(out, vw->below, VIEW_BYTES);
		/* a leaf that stopped repeating its report: not one that waits */
		for (uint32_t l = 0; l < j->cfg.workers; l++)
			if (j->peers[l].below_n && !report_fresh(j, l, now))
				bits_clear(out, j->peers[l].below_base,
					   j->peers[l].below_n);
		return VIEW_BYTES;
	}
	if (!j->cfg.up_leaves || s->state != SET_UP || !vw->have_view ||
	    vw->view_seq != s->seq)
		return 0;
	nb = (j->cfg.up_leaves + 7u) / 8;
	hg_wr16(out, j->cfg.up_leaves);
	memcpy(out + 2, vw->root, nb);
	memcpy(out + 2 + nb, vw->active, nb);
	memcpy(out + 2 + 2 * nb, vw->below, VIEW_BYTES);
	return 2 + 2 * nb + VIEW_BYTES;
}

/* Set s reached its W_l contributions at a leaf: it goes up. */
void hg_eng_up_forward(struct hg_engine *e, struct hg_job *j, struct hg_set *s,
		       const uint8_t *acc, struct hg_pkt **reuse)
{
	s->state = SET_UP;
	up_send(e, j, s, acc, UP_FIRST, reuse);
}

/*
 * Resend set s at once (a root STATUS without this leaf, or a worker's
 * retransmission at least holdoff_ns after the last send), unless the
 * set was abandoned or its give-up time has passed (then it is abandoned
 * here: counted once).
 */
static void up_asked(struct hg_engine *e, struct hg_job *j, struct hg_set *s,
		     const uint8_t *acc, uint64_t holdoff_ns,
		     enum hg_counter cause, struct hg_pkt **reuse)
{
	struct hg_up_timer *t = &j->up[s - j->sets];
	uint64_t now = hg_port_now(e->port);

	if (t->due_ns == UINT64_MAX || now - t->sent_ns < holdoff_ns)
		return;
	if (now - t->first_ns >= j->cfg.up_give_up_ns) {
		t->due_ns = UINT64_MAX;
		count(e, j, HG_CNT_UP_ABANDONED);
		return;
	}
	count(e, j, cause);
	up_send(e, j, s, acc, UP_ASKED, reuse);
}

/*
 * The root's result of forwarded set s came (docs/PROTOCOL.md "Repairs in
 * a tree"): every other forwarded set last sent up, or last shown present
 * by a root STATUS, before s was first sent is overtaken once more; at
 * DUPTHRESH its result was lost on the way down (or its partial sum on
 * the way up), and it goes up again at once, not at its timer.
 */
static void up_overtaken(struct hg_engine *e, struct hg_job *j,
			 const struct hg_set *s)
{
	uint64_t txn = j->up[s - j->sets].txn_first;

	for (size_t i = 0; i < 2 * (size_t)j->cfg.slots; i++) {
		struct hg_up_timer *t = &j->up[i];

		if (&j->sets[i] == s || j->sets[i].state != SET_UP ||
		    t->due_ns == UINT64_MAX || t->txn_last >= txn)
			continue;
		if (++t->overtaken >= UP_DUPTHRESH)
			up_asked(e, j, &j->sets[i], j->acc + i * j->acc_stride,
				 0, HG_CNT_UP_RESENT_OVERTAKEN, NULL);
	}
}

/*
 * The root answered forwarded set s at time now with its RESULT or a
 * STATUS showing this leaf present: when its latest send up was a resend,
 * the time since is a sample of the root's answer time, smoothed as RFC
 * 6298 smooths RTT samples (the root answers a resend at once; a first
 * send's answer may include the wait for the other leaves, and a STATUS
 * lacking the leaf answers no send of it).
 */
static void up_reply_sample(struct hg_job *j, struct hg_up_timer *t, uint64_t now)
{
	if (!t->awaiting || !t->resent || now < t->sent_ns)
		return;
	t->awaiting = false;
	smooth_rfc6298(&j->up_reply_avg, &j->up_reply_var, &j->up_reply_have,
		       now - t->sent_ns);
}

/*
 * How long after a send up a worker's retransmission does not send the
 * partial sum up again: half an upward timeout, or the root's answer time
 * (avg + 4 dev) once measured if shorter -- one copy per root round trip
 * however many workers ask (docs/PROTOCOL.md "Repairs in a tree").
 */
static uint64_t up_holdoff(const struct hg_job *j)
{
	uint64_t h = j->cfg.up_rto_ns / 2;

	if (j->up_reply_have && j->up_reply_avg + 4 * j->up_reply_var < h)
		h = j->up_reply_avg + 4 * j->up_reply_var;
	return h;
}

/*
 * The root answered set t (its RESULT, or a STATUS showing the leaf): a
 * copy of it reached the root, so every copy the leaf sent before t's
 * first one has reached the root or was lost (links keep their order).
 */
static void up_answered(struct hg_job *j, const struct hg_up_timer *t)
{
	if (t->txn_first > j->up_passed)
		j->up_passed = t->txn_first;
}

/*
 * Does a root STATUS that lacks this leaf (hdr_flags: its flags) tell of a
 * lost copy of set t (docs/PROTOCOL.md "Repairs in a tree")?  Yes when it
 * is a loss report naming the leaf, when the set already went up more
 * than once, or when the root had answered a set first sent after t's
 * latest copy before it made this STATUS (its frames come in the order
 * it sent them): that copy came before and was lost.  Otherwise the copy
 * may still be on its way, queued before the root's link.
 */
static bool up_lack_told(const struct hg_job *j, const struct hg_up_timer *t,
			 uint16_t hdr_flags)
{
	return (hdr_flags & HG_FLAG_LOSS) || t->resent ||
	       t->txn_sent < j->up_passed;
}

/*
 * A root STATUS of forwarded set s lacks this leaf (docs/PROTOCOL.md
 * "Repairs in a tree") and tells of a lost copy (up_lack_told()): the
 * partial sum goes up again at once, or, when
 * it went up less than the hold-off ago (once the root's answer time is
 * measured), at the end of the hold-off from the set's timer, unless the
 * root shows the leaf present or sends the result before.
 */
static void up_lacking(struct hg_engine *e, struct hg_job *j, struct hg_set *s,
		       const uint8_t *acc, struct hg_pkt **reuse)
{
	struct hg_up_timer *t = &j->up[s - j->sets];
	uint64_t now = hg_port_now(e->port);
	uint64_t h = j->up_reply_have ? up_holdoff(j) : 0;

	if (t->due_ns == UINT64_MAX || now - t->sent_ns >= h) {
		up_asked(e, j, s, acc, 0, HG_CNT_UP_RESENT_LACKING, reuse);
		return;
	}
	if (!t->deferred || t->sent_ns + h < t->due_ns)
		t->due_ns = t->sent_ns + h;
	t->deferred = true;
	if (t->due_ns < e->up_next)
		e->up_next = t->due_ns;
}

/*
 * A worker's retransmission of a set already sent up: it is counted (a
 * STATUS with every bit set tells it so) and never summed again; the
 * partial sum goes up again at once unless it went up less than a hold-off
 * ago (up_holdoff(): the workers' timers then hurry the leaf's), or, before
 * the leaf has measured the root's answer time, unless it already went up
 * more than once.
 */
void hg_eng_up_worker_retrans(struct hg_engine *e, struct hg_job *j,
			      struct hg_set *s, const uint8_t *acc, uint16_t w,
			      struct hg_pkt **reuse)
{
	const struct hg_up_timer *t = &j->up[s - j->sets];

	hg_eng_send_status(e, j, s, w, reuse);
	/* before any answer time is measured, a worker's first ask of a set
	 * sent up once is taken at once: its timer is the only measure of
	 * the path the leaf has */
	up_asked(e, j, s, acc, !j->up_reply_have && !t->resent ? 0 : up_holdoff(j),
		 HG_CNT_UP_RESENT_WORKER, NULL);
}

/*
 * First pass over a RESULT or STATUS frame: taken (true) when its job is a
 * tree leaf's, then either staged (st->up) or counted and freed; false for
 * any other job (the caller drops it as bad_flags).  The frame must come
 * from the parent's address and port and match the job as the root knows
 * it (token, worker up_worker or all, shard, slot and shadow, lanes).
 * st->worker carries whether a STATUS has this leaf's bit.
 */
/* A root reply to auth leaf j, checked with the root's aggregator key of
 * its epoch: the leaf's upward epoch, the next one (whose first verified
 * reply switches the leaf to it) or the previous one (docs/PROTOCOL.md
 * "Key epochs in a tree"). */
static bool up_verify(struct hg_job *j, const struct hg_pkt *pkt,
		      const struct hg_wire_view *v, uint16_t flags)
{
	const uint8_t *h = pkt->data + v->payload_off - HG_HDR_LEN;
	uint8_t epoch = (uint8_t)(flags >> HG_FLAG_EPOCH_SHIFT);
	const struct hg_mac_key *k;
	uint64_t ctr;

	if (!(flags & HG_FLAG_AUTH))
		return false;
	if (epoch == j->up_epoch)
		k = &j->up_keys[UPK_REPLY];
	else if (j->up_has_next && epoch == (uint8_t)(j->up_epoch + 1))
		k = &j->up_keys[UPK_NEXT_REPLY];
	else if (j->up_has_prev && epoch == (uint8_t)(j->up_epoch - 1))
		k = &j->up_keys[UPK_PREV_REPLY];
	else
		return false;
	ctr = hg_mac_track_counter(&j->up_track, h);
	if (!hg_mac_key_check(k, HG_AUTH_DIR_REPLY, ctr, h,
			      HG_HDR_LEN + v->payload_len,
			      pkt->data + v->payload_off + v->payload_len))
		return false;
	hg_mac_track_update(&j->up_track, h, ctr);
	if (k == &j->up_keys[UPK_NEXT_REPLY])
		hg_eng_up_key_switch(j);
	return true;
}

/*
 * Set s's STATUS to every member of job j: to its group where the port
 * replicates, else to each it has heard from.
 */
static void status_to_all(struct hg_engine *e, struct hg_job *j,
			  const struct hg_set *s)
{
	struct hg_pkt *none = NULL;

	if (e->can_replicate && j->cfg.group_ipv4) {
		hg_eng_send_status(e, j, s, HG_WORKER_ALL, &none);
		return;
	}
	for (uint32_t i = 0; i < j->cfg.workers; i++)
		if (j->peers[i].addr.ipv4)
			hg_eng_send_status(e, j, s, (uint16_t)i, &none);
}

/*
 * Root: leaf l's report of the workers it lacks for a chunk (a frame of
 * worker l with HG_FLAG_STATUS, docs/PROTOCOL.md "Who is missing in a
 * tree"), checked like a request up to its slot, then kept in the set's
 * missing-below bitmap.  Nothing is summed and nothing is answered.
 */
static void report_take(struct hg_engine *e, struct hg_job *j, struct hg_pkt *pkt,
			const struct hg_wire_view *v, uint16_t flags)
{
	const uint8_t *h = pkt->data + v->payload_off - HG_HDR_LEN;
	const uint8_t *pl = pkt->data + v->payload_off;
	uint32_t w = v->hdr.worker, S = j->cfg.slots, q, base, n;
	struct hg_set *set;
	struct hg_view *vw;
	bool changed = false;
	int rc;

	if (v->hdr.token != j->cfg.token) {
		rc = HG_CNT_BAD_TOKEN;
		goto drop;
	}
	if (w >= j->cfg.workers) {
		rc = HG_CNT_BAD_WORKER;
		goto drop;
	}
	if (j->mac_len) {
		struct hg_mac_track *t = &j->peers[w].mac;
		const struct hg_mac_key *k = hg_eng_worker_key(e, j, w, flags);
		uint64_t ctr;

		if (!k) {
			rc = HG_CNT_BAD_MAC;
			goto drop;
		}
		ctr = hg_mac_track_counter(t, h);
		if (!hg_mac_key_check(k, HG_AUTH_DIR_REQUEST, ctr, h,
				      HG_HDR_LEN + v->payload_len,
				      pl + v->payload_len)) {
			rc = HG_CNT_BAD_MAC;
			goto drop;
		}
		hg_mac_track_update(t, h, ctr);
	} else if (flags & HG_FLAG_AUTH) {
		rc = HG_CNT_BAD_MAC;
		goto drop;
	}
	if (v->hdr.shard != j->cfg.shard) {
		rc = HG_CNT_BAD_SHARD;
		goto drop;
	}
	q = slot_quot(j, v->hdr.seq);
	if (v->hdr.slot >= S || v->hdr.slot != v->hdr.seq - q * S ||
	    (flags & HG_FLAG_SHADOW) != ((q & 1) ? HG_FLAG_SHADOW : 0)) {
		rc = HG_CNT_BAD_SLOT;
		goto drop;
	}
	base = v->payload_len >= 4 ? hg_rd16(pl) : 0;
	n = v->payload_len >= 4 ? hg_rd16(pl + 2) : 0;
	if (!n || base + n > HG_MAX_WORKERS || v->payload_len != 4 + (n + 7) / 8) {
		rc = HG_CNT_BAD_LANES;
		goto drop;
	}
	set = &j->sets[2 * (size_t)v->hdr.slot + (q & 1)];
	vw = &j->view[set - j->sets];
	j->peers[w].report_ns = hg_port_now(e->port);
	j->peers[w].below_base = (uint16_t)base;
	j->peers[w].below_n = (uint16_t)n;
	if (!vw->below_set || vw->below_seq != v->hdr.seq) {
		memset(vw->below, 0, sizeof(vw->below));
		vw->below_seq = v->hdr.seq;
		vw->below_set = true;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint8_t bit = (uint8_t)(1u << ((base + i) % 8)),
			old = vw->below[(base + i) / 8];

		if (pl[4 + i / 8] >> (i % 8) & 1)
			vw->below[(base + i) / 8] |= bit;
		else
			vw->below[(base + i) / 8] &= (uint8_t)~bit;
		changed |= old != vw->below[(base + i) / 8];
	}
	count(e, j, HG_CNT_LEAF_REPORTS);
	queue_free(e, pkt);
	/* News for the leaves that wait on the set: its STATUS, once per
	 * change of what the reports say. */
	if (changed && set->state == SET_OPEN && set->seq == v->hdr.seq)
		status_to_all(e, j, set);
	return;

drop:
	count(e, j, rc);
	queue_free(e, pkt);
}

bool hg_eng_up_classify(struct hg_engine *e, struct hg_pkt *pkt,
			const struct hg_wire_view *v, uint16_t flags,
			struct hg_stage *st)
{
	struct hg_job *j = job_find(e, v->hdr.job);
	uint32_t S, q, expect_shadow, uw;
	bool other;
	int rc;

	if (j && !j->up && (flags & HG_FLAG_STATUS)) {
		e->last = j;
		j->cnt[HG_CNT_RECEIVED]++;
		report_take(e, j, pkt, v, flags);
		return true;
	}
	if (!j || !j->up)
		return false;
	e->last = j;
	j->cnt[HG_CNT_RECEIVED]++;
	uw = j->cfg.up_worker;
	if (v->hdr.token != j->cfg.token) {
		rc = HG_CNT_BAD_TOKEN;
		goto drop;
	}
	if (v->src.ipv4 != j->cfg.up_ipv4 || v->src.port != j->cfg.up_port) {
		rc = HG_CNT_BAD_FLAGS; /* a reply, but not from the root */
		goto drop;
	}
	/* the root sends its loss reports to its group: one naming another
	 * leaf is a STATUS, not a stray frame ("Loss reports") */
	other = v->hdr.worker != uw && v->hdr.worker != HG_WORKER_ALL;
	if (other && !((flags & HG_FLAG_LOSS) && (flags & HG_FLAG_STATUS) &&
		       (!j->cfg.up_leaves || v->hdr.worker < j->cfg.up_leaves))) {
		rc = HG_CNT_BAD_WORKER;
		goto drop;
	}
	if (j->mac_len ? !up_verify(j, pkt, v, flags) : (flags & HG_FLAG_AUTH)) {
		rc = HG_CNT_BAD_MAC;
		goto drop;
	}
	if (v->hdr.shard != j->cfg.up_shard) {
		rc = HG_CNT_BAD_SHARD;
		goto drop;
	}
	S = j->cfg.slots;
	q = slot_quot(j, v->hdr.seq);
	expect_shadow = (q & 1) ? HG_FLAG_SHADOW : 0;
	if (v->hdr.slot >= S || v->hdr.slot != v->hdr.seq - q * S ||
	    (flags & HG_FLAG_SHADOW) != expect_shadow) {
		rc = HG_CNT_BAD_SLOT;
		goto drop;
	}
	if (!(flags & HG_FLAG_STATUS) &&
	    (size_t)v->hdr.lanes * hg_op_acc_lane(v->hdr.op) > j->cfg.payload_bytes) {
		rc = HG_CNT_BAD_LANES;
		goto drop;
	}
	if (v->hdr.exp != 0) {
		rc = HG_CNT_BAD_EXP;
		goto drop;
	}
	if (other) {
		/* taken and left: acting on it was no faster (docs/PROTOCOL.md
		 * "Loss reports") */
		rc = HG_CNT_UP_STATUS;
		goto drop;
	}
	st->pkt = pkt;
	st->job = j;
	st->set = &j->sets[2 * (size_t)v->hdr.slot + (expect_shadow ? 1 : 0)];
	st->acc = j->acc + (size_t)(st->set - j->sets) * j->acc_stride;
	st->in = pkt->data + v->payload_off;
	st->seq = v->hdr.seq;
	st->flags = flags;
	st->lanes = v->hdr.lanes;
	st->op = v->hdr.op;
	st->exp = 0;
	st->incarnation = v->hdr.incarnation;
	st->plen = (uint16_t)v->payload_len;
	st->worker = (flags & HG_FLAG_STATUS) && uw / 8 < v->payload_len &&
		     (st->in[uw / 8] >> (uw % 8) & 1);
	memset(&st->ln, 0,
	       sizeof(st->ln)); /* nothing to prefetch for apply() in engine.c */
	st->up = true;
	return true;

drop:
	count(e, j, rc);
	queue_free(e, pkt);
	return true;
}

/*
 * Leaf: keep the root's STATUS (payload pl, plen bytes) of forwarded set s
 * as its view: the root's two bitmaps over the L leaves and the
 * missing-below bitmap when it has one (docs/PROTOCOL.md "Who is missing
 * in a tree").  True when it is the chunk's first view and has
 * missing-below bits: pushed down to the workers; later views reach a
 * worker in the answer to its resend ("One view of a chunk pushed down").
 */
static bool keep_view(struct hg_job *j, const struct hg_set *s,
		      const uint8_t *pl, size_t plen)
{
	struct hg_view *vw = &j->view[s - j->sets];
	size_t nb = (j->cfg.up_leaves + 7u) / 8;

	uint8_t below[VIEW_BYTES] = { 0 };
	bool news, first = !(vw->have_view && vw->view_seq == s->seq);

	if (plen < 2 * nb)
		return false;
	if (plen >= 2 * nb + VIEW_BYTES)
		memcpy(below, pl + 2 * nb, VIEW_BYTES);
	news = memcmp(below,
		      vw->have_view && vw->view_seq == s->seq ?
			      vw->below :
			      (const uint8_t[VIEW_BYTES]){ 0 },
		      VIEW_BYTES) != 0;
	memcpy(vw->root, pl, nb);
	memcpy(vw->active, pl + nb, nb);
	memcpy(vw->below, below, VIEW_BYTES);
	vw->view_seq = s->seq;
	vw->have_view = true;
	return news && first;
}

/*
 * Second pass over a root's reply: a RESULT of a forwarded set becomes the
 * set's result and goes to the leaf's workers; a STATUS without this
 * leaf's bit and telling of a lost copy sends the partial sum up again
 * (up_lacking()).  Anything not about a
 * forwarded set (late copies, a set started over) is up_stale.  A root
 * reply with another incarnation than the root's earlier ones: the root
 * lost its state, so the leaf takes a new incarnation for its job and its
 * workers end their allreduce as after a restart of the leaf.
 */
void hg_eng_up_apply(struct hg_engine *e, struct hg_stage *st)
{
	struct hg_job *j = st->job;
	struct hg_set *s = st->set;
	struct hg_pkt *pkt = st->pkt;
	struct hg_up_timer *t;
	uint64_t now;
	size_t bytes;

	if (st->incarnation != j->up_incarnation) {
		if (j->up_incarnation) {
			j->cfg.incarnation = j->cfg.incarnation + 1 ?
						     j->cfg.incarnation + 1 :
						     1;
			count(e, j, HG_CNT_UP_ROOT_RESTARTS);
		}
		j->up_incarnation = st->incarnation;
	}

	if (s->state != SET_UP || s->seq != st->seq || s->lanes != st->lanes ||
	    up_op(s->op) != st->op) {
		/* the root asks about a chunk still open here: say who holds
		 * it (a report lost on the way is sent again) */
		if ((st->flags & HG_FLAG_STATUS) && s->state == SET_OPEN &&
		    s->seq == st->seq && j->cfg.up_leaves)
			hg_eng_up_report(e, j, s);
		count(e, j, HG_CNT_UP_STALE);
		queue_free(e, pkt);
		return;
	}
	t = &j->up[s - j->sets];
	now = hg_port_now(e->port);
	if (!(st->flags & HG_FLAG_STATUS) || st->worker)
		up_reply_sample(j, t, now);
	if (!(st->flags & HG_FLAG_STATUS) && !t->resent && now >= t->first_ns)
		up_rtt_sample(j, now - t->first_ns);
	if (st->flags & HG_FLAG_STATUS) {
		count(e, j, HG_CNT_UP_STATUS);
		/* the chunk's first news of who holds the root up: the
		 * workers learn it now */
		if (j->cfg.up_leaves && keep_view(j, s, st->in, st->plen))
			status_to_all(e, j, s);
		if (!st->worker) {
			if (up_lack_told(j, t, st->flags))
				up_lacking(e, j, s, st->acc, &pkt);
		} else {
			/* in at the root: the set waits for another leaf, and
			 * only sets sent up from now on overtake it; a resend
			 * put off for the hold-off is not needed */
			up_answered(j, t);
			t->txn_last = j->up_txn;
			t->overtaken = 0;
			if (t->deferred) {
				t->deferred = false;
				t->due_ns = t->sent_ns + up_timeout(j, t);
			}
		}
		if (pkt)
			queue_free(e, pkt);
		return;
	}
	up_answered(j, t);
	up_overtaken(e, j, s);
	bytes = (size_t)s->lanes * hg_op_acc_lane(s->op);
	memcpy(st->acc, st->in, bytes);
	s->state = SET_DONE;
	s->psum = (e->wire_flags & HG_WIRE_F_UDP_CSUM) ?
			  hg_csum_add(0, st->acc, bytes) :
			  0;
	count(e, j, HG_CNT_UP_RESULTS);
	hg_eng_send_result(e, j, s, st->acc, HG_WORKER_ALL, &pkt);
	if (pkt)
		queue_free(e, pkt);
}

int hg_engine_timers(struct hg_engine *e)
{
	uint64_t now, next = UINT64_MAX;
	int resent = 0;

	if (!e)
		return -EINVAL;
	if (e->up_next == UINT64_MAX)
		return 0;
	now = hg_port_now(e->port);
	if (now < e->up_next)
		return 0;
	e->up_next = UINT64_MAX; /* up_send() lowers it again */
	for (uint32_t k = 0; k < e->max_jobs; k++) {
		struct hg_job *j = &e->jobs[k];

		if (!j->in_use || !j->up)
			continue;
		for (size_t i = 0; i < 2 * (size_t)j->cfg.slots; i++) {
			struct hg_up_timer *t = &j->up[i];

			if (j->sets[i].state != SET_UP || t->due_ns == UINT64_MAX)
				continue;
			if (t->due_ns > now) {
				if (t->due_ns < next)
					next = t->due_ns;
				continue;
			}
			if (now - t->first_ns >= j->cfg.up_give_up_ns) {
				t->due_ns = UINT64_MAX;
				count(e, j, HG_CNT_UP_ABANDONED);
				continue;
			}
			if (t->deferred) { /* asked for: no expiry */
				count(e, j, HG_CNT_UP_RESENT_LACKING);
				up_send(e, j, &j->sets[i],
					j->acc + i * j->acc_stride, UP_ASKED,
					NULL);
				resent++;
				continue;
			}
			up_expired(j, t, now);
			count(e, j, HG_CNT_UP_RESENT_TIMER);
			up_send(e, j, &j->sets[i], j->acc + i * j->acc_stride,
				UP_TIMER, NULL);
			resent++;
		}
		if (!j->cfg.up_leaves)
			continue;
		/* reports of sets still open here, repeated while they wait */
		for (size_t i = 0; i < 2 * (size_t)j->cfg.slots; i++) {
			uint64_t due = report_due(j, &j->sets[i]);

			if (due <= now) {
				hg_eng_up_report(e, j, &j->sets[i]);
				due = report_due(j, &j->sets[i]);
			}
			if (due < next)
				next = due;
		}
	}
	if (next < e->up_next)
		e->up_next = next;
	if (e->ntx)
		hg_eng_flush_tx(e);
	return resent;
}

uint64_t hg_engine_next_deadline(const struct hg_engine *e)
{
	return e ? e->up_next : UINT64_MAX;
}
