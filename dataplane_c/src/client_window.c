/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The worker client's window transport (see client.c).
 *
 * Several aggregators (docs/PROTOCOL.md): chunk number c (one 64-bit
 * counter of the job) goes to aggregator a = c % K as its seq c / K; K = 1
 * is the single-aggregator numbering.  Everything that follows holds per
 * aggregator: its own window, sequence numbers, in-order results and timer.
 *
 * In flight: at most S chunks per aggregator, kept in a ring indexed by
 * a * S + seq % S (seq % S is the aggregator's slot).  Chunk k of a
 * segment (a step, or the whole allreduce when its block groups are
 * pipelined: client_method.c) may go out the first time when k < K S
 * (every earlier chunk is complete) or
 * when chunk k - K S, the one before it in the same slot of the same
 * aggregator, has its result: the aggregator reuses the slot only then.
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
 * RFC 4015).  Before the first result of a segment the timers wait at
 * least start_wait, which learns how late the slowest peer starts one.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "homagg/kernels.h"

#include "client_pvt.h"

/* The flight record of chunk k of the segment (a * S + seq % S). */
static struct flight *flight_of(const struct hg_client *c, size_t k)
{
	uint64_t chunk = c->st.base + k;
	uint32_t a = (uint32_t)(chunk % c->naggs);
	uint32_t seq = (uint32_t)(chunk / c->naggs);

	return &c->fl[(size_t)a * c->cfg.slots + seq % c->cfg.slots];
}

/* ---- frames ------------------------------------------------------------ */

/*
 * The stream chunk k (< st.nchunks) of the segment belongs to: the last
 * one starting at or before k (streams without chunks start where the next
 * one does, so the last of equals is the one with chunks).
 */
const struct stream *hg_cl_chunk_stream(const struct hg_client *c, size_t k)
{
	const struct segment *st = &c->st;
	uint32_t lo = 0, hi = st->nstreams; /* the answer is in [lo, hi) */

	while (hi - lo > 1) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (st->s[mid].first_chunk <= k)
			lo = mid;
		else
			hi = mid;
	}
	return &st->s[lo];
}

/*
 * Write the frame of chunk k of the segment into pkt: Ethernet / IPv4 / UDP to
 * the aggregator, the HomAgg header, the chunk's lanes as they are in the
 * stream's input buffer (already big-endian).  Returns the payload bytes.
 */
static size_t build_chunk(struct hg_client *c, struct hg_pkt *pkt, size_t k,
			  bool retrans, enum hg_phase *phase)
{
	const struct stream *s = hg_cl_chunk_stream(c, k);
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
	h.worker = (uint16_t)c->cfg.agg_worker;
	h.slot = (uint16_t)(seq % c->cfg.slots);
	h.seq = seq;
	h.lanes = (uint16_t)lanes;
	h.exp = s->exp;
	h.shard = (uint8_t)a;
	h.incarnation = c->cfg.incarnation;
	if (c->mac_len) {
		/* A retransmission may be lost to a key the aggregator dropped:
		 * a given next epoch is used from then on. */
		if (retrans && c->has_next)
			hg_cl_key_switch(c);
		h.flags |= (uint16_t)(c->epoch << HG_FLAG_EPOCH_SHIFT);
	}
	len = hg_wire_build_keyed(pkt->data, pkt->cap, &c->src, &c->agg[a].dst, &h,
				  c->tx[s->phase].p + s->in_off + first * s->in_lane,
				  bytes, 0, c->mac_len ? &c->keys[0] : NULL,
				  HG_AUTH_DIR_REQUEST,
				  c->mac_len ? ++c->mac_ctr : 0);
	/* Cannot fail: cap and payload were checked against payload_bytes. */
	pkt->len = len > 0 ? (uint16_t)len : 0;
	return bytes;
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

	/* below a tree leaf (docs/PROTOCOL.md "Tree"): the job's W is more */
	const char *kind = c->cfg.agg_workers &&
					   c->cfg.agg_workers < c->cfg.workers ?
				   "leaf aggregator" :
				   "aggregator";

	format_ip(ip, sizeof(ip), d->ipv4);
	if (c->naggs == 1)
		snprintf(s, len, "%s %s:%u", kind, ip, d->port);
	else
		snprintf(s, len, "%s %s:%u (shard %u of %u)", kind, ip, d->port,
			 a, c->naggs);
}

/* The bytes of a STATUS payload (plen bytes, bitmaps of nb bytes) after
 * its two bitmaps, copied to out (TREE_TAIL bytes): a tree leaf's view of
 * its root (docs/PROTOCOL.md "Who is missing in a tree").  Returns how
 * many. */
static uint8_t tree_tail(const uint8_t *pl, size_t plen, size_t nb, uint8_t *out)
{
	size_t n = plen > 2 * nb ? plen - 2 * nb : 0;

	if (n > TREE_TAIL)
		n = TREE_TAIL;
	memcpy(out, pl + 2 * nb, n);
	return (uint8_t)n;
}

/* Aggregator ag answered with incarnation inc after another one during
 * this allreduce: it lost the job's state.  End the allreduce. */
static void agg_restarted(struct hg_client *c, const struct agg *ag, uint32_t inc)
{
	char name[64];

	agg_name(c, (uint32_t)(ag - c->agg), name, sizeof(name));
	snprintf(c->err, sizeof(c->err),
		 "%s restarted during the allreduce (incarnation "
		 "%u, now %u)",
		 name, ag->incarnation, inc);
	hg_cl_fail(c, -ECONNRESET);
}

/*
 * Does a reply verify with the aggregator's key of its epoch (current,
 * the given next one, which the client then sends with, or the previous)?
 * a: the aggregator it comes from (-1: none of ours), whose MAC counter
 * the reply's is read against.
 */
static bool reply_verify(struct hg_client *c, int a, const uint8_t *f,
			 const struct hg_wire_view *v)
{
	const uint8_t *h = f + v->payload_off - HG_HDR_LEN;
	uint8_t epoch = (uint8_t)(v->hdr.flags >> HG_FLAG_EPOCH_SHIFT);
	struct hg_mac_track *t = a >= 0 ? &c->agg[a].mac : NULL;
	const struct hg_mac_key *k;
	uint64_t ctr;

	if (!(v->hdr.flags & HG_FLAG_AUTH))
		return false;
	if (epoch == c->epoch)
		k = &c->keys[1];
	else if (c->has_next && epoch == (uint8_t)(c->epoch + 1))
		k = &c->next[1];
	else if (c->has_prev && epoch == (uint8_t)(c->epoch - 1))
		k = &c->prev_agg;
	else
		return false;
	ctr = hg_mac_track_counter(t, h);
	if (!hg_mac_key_check(k, HG_AUTH_DIR_REPLY, ctr, h,
			      HG_HDR_LEN + v->payload_len,
			      f + v->payload_off + v->payload_len))
		return false;
	if (t)
		hg_mac_track_update(t, h, ctr);
	if (k == &c->next[1])
		hg_cl_key_switch(c);
	return true;
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

/*
 * Whether a leaf's STATUS tail t of n bytes holds a whole root view (what
 * root_text reads).
 */
static bool root_view(const struct hg_client *c, const uint8_t *t, size_t n)
{
	uint32_t L = n < 2 ? 0 : (uint32_t)(t[0] << 8 | t[1]);

	return L && L <= c->cfg.workers &&
	       n >= 2 + 2 * (size_t)((L + 7) / 8) + BITMAP_BYTES;
}

/* Whether a STATUS bitmap holds every worker of the aggregator. */
static bool all_present(const struct hg_client *c, const uint8_t *bitmap)
{
	for (uint32_t w = 0; w < c->cfg.agg_workers; w++)
		if (!(bitmap[w / 8] >> (w % 8) & 1))
			return false;
	return true;
}

/* Handle one received frame (at port time now): a result or a status for this job. */
static void handle_frame(struct hg_client *c, const uint8_t *f, size_t len,
			 uint64_t now)
{
	struct segment *st = &c->st;
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
	a = reply_agg(c, &v);
	/* A reply of this job must carry the aggregator's MAC (auth), or none. */
	if (c->mac_len ? !reply_verify(c, a, f, &v) : (v.hdr.flags & HG_FLAG_AUTH)) {
		c->stats.bad_mac++;
		return;
	}
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
	/* Chunk number of (a, seq): seq counts from the segment's base / K at
	 * every aggregator, modulo 2^32.  Below the segment's base, k wraps to
	 * a huge value: a late copy of an earlier segment. */
	chunk = (st->base / c->naggs +
		 (uint32_t)(seq - (uint32_t)(st->base / c->naggs))) *
			c->naggs +
		(uint32_t)a;
	k = (size_t)(chunk - st->base);
	fl = &c->fl[(size_t)a * c->cfg.slots + seq % c->cfg.slots];
	if (k < st->nchunks && v.hdr.incarnation != ag->incarnation) {
		/* A reply about this segment from another life of the aggregator. */
		if (ag->incarnation) {
			agg_restarted(c, ag, v.hdr.incarnation);
			return;
		}
		ag->incarnation = v.hdr.incarnation;
	}

	ag->unanswered = 0;
	if (v.hdr.flags & HG_FLAG_STATUS) {
		c->stats.status_received++;
		ag->st.status_received++;
		if (k < st->nchunks) {
			/* kept for the give-up's text: who this aggregator
			 * lacked, whichever chunk times out */
			size_t nb = (c->cfg.agg_workers + 7) / 8;

			memset(ag->status_bitmap, 0, sizeof(ag->status_bitmap));
			memcpy(ag->status_bitmap, pl,
			       v.payload_len < nb ? v.payload_len : nb);
			ag->status_tree_len = tree_tail(pl, v.payload_len, nb,
							ag->status_tree);
			ag->status_chunk = chunk;
			ag->have_status = true;
			if (root_view(c, ag->status_tree, ag->status_tree_len)) {
				memcpy(ag->view_tree, ag->status_tree,
				       ag->status_tree_len);
				ag->view_tree_len = ag->status_tree_len;
				ag->view_chunk = chunk;
			}
		}
		if (fl->busy && fl->chunk == chunk) {
			size_t nb = (c->cfg.agg_workers + 7) / 8;

			memset(fl->bitmap, 0, sizeof(fl->bitmap));
			memcpy(fl->bitmap, pl,
			       v.payload_len < nb ? v.payload_len : nb);
			fl->tree_len = tree_tail(pl, v.payload_len, nb, fl->tree);
			fl->have_status = true;
			/* the answer to our latest resend (a loss report was
			 * not asked for): how long a turn waits */
			if (fl->tries >= 2 && !fl->replied &&
			    now > fl->last_tx && !(v.hdr.flags & HG_FLAG_LOSS) &&
			    (v.hdr.worker == c->cfg.agg_worker ||
			     v.hdr.worker == HG_WORKER_ALL))
				hg_cl_reply_sample(c, ag, now - fl->last_tx);
			fl->replied = true;
			hg_cl_note_silence(c, ag, now);
			if (fl->bitmap[c->cfg.agg_worker / 8] >>
				    (c->cfg.agg_worker % 8) &
			    1) {
				/* Our contribution is there: the slot waits for
				 * a peer.  Nothing to resend; a timeout that made
				 * us ask was spurious. */
				if (fl->timed_out)
					hg_cl_spurious_timeout(c, ag, fl,
							       fl->silence, now);
				fl->present = true;
				fl->fast_at = 0;
				fl->armed = now;
				/* the step's first answer waits for a peer that
				 * has not started it: wait as long again before
				 * asking again */
				if (hg_cl_step_start(c, fl) &&
				    now - fl->first_tx > fl->rto)
					fl->rto = now - fl->first_tx;
				/* The slot completes when the peer has resent
				 * (at once, on the same STATUS): results of
				 * chunks sent after now that overtake this one
				 * mean its result was lost on the way to us. */
				fl->txn_last = c->txn;
				fl->overtaken = 0;
			} else if (!fl->unsent &&
				   (fl->fast_at ||
				    ((v.hdr.flags & HG_FLAG_LOSS) &&
				     v.hdr.worker == c->cfg.agg_worker &&
				     fl->tries == 1) ||
				    now - fl->last_tx >= hg_cl_turn_ns(c, ag))) {
				/* Ours is missing, and this STATUS is not older
				 * than our latest copy (results of chunks sent
				 * after it came back, or it is a turn old):
				 * resend it now. */
				fl->fast_at = now;
			}
		} else if (fl->busy && !fl->unsent &&
			   fl->chunk + (uint64_t)c->naggs * c->cfg.slots == chunk &&
			   (!fl->fast_at || fl->fast_at > now)) {
			/* A STATUS of the next chunk of this slot, which we
			 * have not sent yet: peers contributed to it only
			 * after the result of ours, so ours is complete there
			 * and its result was lost on the way to us.  Resend it
			 * now (the aggregator answers with the result); the
			 * STATUS came because a peer took the chunk we hold
			 * back for lost. */
			fl->fast_at = now;
		}
		if (k < st->nchunks && (!fl->busy || fl->chunk < chunk) &&
		    c->cfg.agg_workers == c->cfg.workers &&
		    c->cfg.workers > HG_REPORT_GROUP_MAX)
			/* a chunk we have not sent yet waits for a repair */
			fl->status_ahead = chunk + 1;
		return;
	}
	if (k >= st->nchunks) {
		/* A late copy of a chunk of an earlier segment. */
		c->stats.duplicates_received++;
		return;
	}
	if (c->done.p[k] != CH_PENDING) {
		c->stats.duplicates_received++;
		if (c->done.p[k] == CH_DONE_AFTER_TIMEOUT) {
			/* The original's result and the answer to the
			 * retransmission both came: it was not lost. */
			hg_cl_spurious_timeout(c, ag, NULL, ag->late, now);
			c->done.p[k] = CH_DONE;
		}
		return;
	}
	s = hg_cl_chunk_stream(c, k);
	first = (k - s->first_chunk) * s->per_chunk;
	lanes = s->lanes - first < s->per_chunk ? s->lanes - first : s->per_chunk;
	/* hg_wire_parse checked payload_len == lanes * acc lane bytes. */
	if (v.hdr.op != s->op || v.hdr.lanes != lanes)
		goto ignore;
	memcpy(c->rx[s->phase].p + s->out_off + first * s->acc_lane, pl,
	       lanes * s->acc_lane);
	hg_cl_note_silence(c, ag, now);
	hg_cl_path_result(c, ag, now);
	ag->t_res = now;
	c->done.p[k] = CH_DONE;
	hg_cl_chunk_done(c, k);
	c->stats.results_received++;
	c->stats.bytes_received[s->phase] += lanes * s->acc_lane;
	ag->st.results_received++;
	ag->st.bytes_received += lanes * s->acc_lane;
	if (ag->hi_done == 0 && ag->t_first_tx && now >= ag->t_first_tx)
		hg_cl_start_sample(c, ag, now - ag->t_first_tx, now);
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
		 * ours answered, say): only chunks sent after it count.  With
		 * pipelined block groups the first result of a unit waited
		 * for the slowest peer to compute the unit: not a sample.
		 * Nor is a chunk a STATUS reported incomplete: its result
		 * waited for a peer's repair.
		 */
		if (fl->tries == 1 && !fl->have_status && !fl->status_before &&
		    k + 1 >= ag->hi_done && fl->last_tx > ag->t_timeout &&
		    now >= fl->last_tx &&
		    !(c->groups > 1 && c->st.u[fl->unit].ndone == 1)) {
			hg_cl_rtt_sample(c, ag, now - fl->last_tx, now,
					 lanes == s->per_chunk);
			hg_cl_path_sample(ag, fl, now - fl->last_tx);
		}
		if (fl->timed_out) {
			c->done.p[k] = CH_DONE_AFTER_TIMEOUT;
			ag->late = fl->silence;
		}
		/* a STATUS showed it spurious: the whole stall is over */
		if (fl->spurious)
			hg_cl_stall_floor(c, ag, fl->silence, now);
		if (now >= fl->first_tx)
			c->stats.flight_ns += now - fl->first_tx;
		/* The answered copy was sent no earlier than the first. */
		txn = fl->txn_first;
		fl->busy = false;
		fl->fast_at = 0;
	}
	/*
	 * The aggregator's chunks still open below k (K apart) that were last
	 * sent before k was first sent: one more result overtook them.  At
	 * DUPTHRESH they are taken as lost and resent at once: a peer's lost
	 * contribution would have come with a loss report first (it precedes
	 * the result of the peer's chunk LOSS_LAG later), so the loss is ours
	 * -- our result, or the report of our own lost frame.  Below a tree
	 * leaf a repair under another leaf has no report here: at our turn
	 * (hg_cl_chunk_rank), as before; in the step's tail, where no new
	 * chunk covers the wait, after at most one turn (the first in turn's
	 * STATUS is back by then).
	 */
	while (ag->lo_open < st->nchunks && c->done.p[ag->lo_open] != CH_PENDING)
		ag->lo_open += c->naggs;
	for (size_t i = ag->lo_open; i < k && txn != UINT64_MAX; i += c->naggs) {
		struct flight *o = flight_of(c, i);

		if (c->done.p[i] != CH_PENDING || !o->busy || o->unsent ||
		    o->txn_last >= txn || o->fast_at)
			continue;
		if (++o->overtaken >= DUPTHRESH) {
			uint64_t d = 0;

			if (c->cfg.agg_workers < c->cfg.workers) {
				d = hg_cl_turn_offset(c, ag, o->chunk);
				if (hg_cl_tail(c) && d > hg_cl_turn_ns(c, ag))
					d = hg_cl_turn_ns(c, ag);
			}
			o->fast_at = now + d;
		}
	}
	if (k + 1 > ag->hi_done) {
		/* Chunks of this aggregator this result overtook: their
		 * timers stop following its results from here on (see
		 * hg_cl_chunk_deadline).  Its chunks are K apart in the segment. */
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

void hg_cl_rx_all(struct hg_client *c, uint64_t now)
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
 * Send the chunks listed in ks (chunk indices of the segment), flagged as
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
		bytes[i] = build_chunk(c, pk[i], ks[i],
				       flight_of(c, ks[i])->tries > 0, &ph[i]);
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
		fl->replied = false;
		fl->last_tx = now;
		fl->armed = now;
		fl->txn_last = ++c->txn;
		fl->overtaken = 0;
		if (fl->tries == 0)
			fl->txn_first = fl->txn_last;
		if (!ag->t_first_tx)
			ag->t_first_tx = now;
		if (fl->tries++ > 0) {
			ag->unanswered++;
			c->stats.retransmissions++;
			ag->st.retransmissions++;
		}
		c->stats.packets_sent++;
		c->stats.bytes_sent[ph[i]] += bytes[i];
		ag->st.packets_sent++;
		ag->st.bytes_sent += bytes[i];
	}
}

/* Chunk k of the segment went out (and may be answered already). */
static bool chunk_sent(const struct hg_client *c, size_t k)
{
	const struct flight *fl = flight_of(c, k);

	return c->done.p[k] != CH_PENDING ||
	       (fl->busy && fl->chunk == c->st.base + k);
}

/*
 * When the chunks after the one holding slot fl may go out without waiting
 * for it: a turn (hg_cl_turn_ns) after its latest transmission, or after a
 * STATUS showed our contribution in (fl->armed).  By then its answer is
 * overdue: lost, lost on the way to us, or waiting for a peer's repair; a
 * repair of a lost contribution at a drained queue is back sooner.
 * UINT64_MAX: the slot is free.
 */
static uint64_t held_until(const struct hg_client *c, const struct flight *fl)
{
	if (!fl->busy)
		return UINT64_MAX;
	return fl->armed + hg_cl_turn_ns(c, &c->agg[fl->agg]);
}

/*
 * pipe[a] = this worker's chunks of aggregator a in the network's queues as
 * far as it knows (PROTOCOL.md "The pipe"): sent once, no result, not
 * shown present, not overtaken DUPTHRESH times, no fast retransmission
 * due, no timer expiry.  A chunk in repair holds its slot, not the queue.
 */
static void pipe_count(const struct hg_client *c, uint32_t *pipe)
{
	size_t span = (size_t)c->naggs * c->cfg.slots;

	memset(pipe, 0, c->naggs * sizeof(*pipe));
	for (size_t i = 0; i < span; i++) {
		const struct flight *f = &c->fl[i];

		if (f->busy && !f->unsent && f->tries == 1 && !f->present &&
		    !f->timed_out && !f->fast_at && f->overtaken < DUPTHRESH)
			pipe[f->agg]++;
	}
}

/* Whether a first transmission towards ag waits for its pipe: a gain is
 * set and pipe chunks fill the bound (hg_cl_pipe_start before the
 * aggregator's first RTT sample). */
static bool pipe_full(const struct hg_client *c, const struct agg *ag, uint32_t pipe)
{
	if (!c->cfg.pipe_gain_pct)
		return false;
	return pipe >= (ag->cwnd > 0 ? (uint32_t)ag->cwnd : hg_cl_pipe_start(c));
}

/*
 * First transmissions of the chunks the window allows: chunk k when the
 * previous chunk of its slot (k - K S) has its result, in order of k.  A
 * chunk whose slot is held by an overdue chunk (held_until: a turn without
 * its answer) waits without holding back the later ones, up to AHEAD_LAPS
 * laps past the lowest unsent chunk: a lost answer then holds one slot, not
 * this worker's whole window (and with it every peer's, which wait for this
 * worker's contributions), and the results of the chunks sent after it show
 * the loss (fast retransmission) where only its timer, at the stall floor,
 * did.  With a pipe gain, chunk k also waits while its aggregator's pipe is
 * full (PROTOCOL.md "The pipe"), and the later chunks with it (chunks
 * leave in order of k).
 */
void hg_cl_tx_new(struct hg_client *c, uint64_t now)
{
	struct segment *st = &c->st;
	size_t span = (size_t)c->naggs * c->cfg.slots;
	size_t ks[BURST];
	uint32_t pipe[HG_CLIENT_MAX_AGGREGATORS];
	uint16_t cnt;

	/* counted once: within this call only its own sends change the pipes,
	 * and each adds itself below */
	if (c->cfg.pipe_gain_pct)
		pipe_count(c, pipe);
	for (;;) {
		bool full = false;
		size_t end;

		while (st->next_send < st->nchunks && chunk_sent(c, st->next_send))
			st->next_send++;
		end = st->next_send + AHEAD_LAPS * span;
		if (end > st->nchunks)
			end = st->nchunks;
		cnt = 0;
		for (size_t k = st->next_send; cnt < BURST && k < end; k++) {
			struct flight *fl = flight_of(c, k);

			if (chunk_sent(c, k))
				continue;
			if (fl->busy) {
				/* its slot is held by chunk k - K S (or earlier) */
				full = true;
				if (now < held_until(c, fl))
					break;
				continue;
			}
			if (c->cfg.pipe_gain_pct) {
				uint32_t a = (uint32_t)((st->base + k) % c->naggs);

				if (pipe_full(c, &c->agg[a], pipe[a])) {
					full = true;
					break;
				}
				pipe[a]++;
			}
			fl->busy = true;
			fl->chunk = st->base + k;
			fl->unit = hg_cl_chunk_stream(c, k)->unit;
			fl->agg = (uint32_t)(fl->chunk % c->naggs);
			fl->seq = (uint32_t)(fl->chunk / c->naggs);
			fl->tries = 0;
			fl->have_status = false;
			fl->status_before = fl->status_ahead == fl->chunk + 1;
			fl->timed_out = false;
			fl->present = false;
			fl->spurious = false;
			fl->silence = 0;
			fl->stalled = 0;
			fl->overtaken = 0;
			fl->fast_at = 0;
			fl->first_tx = now;
			fl->rto = c->agg[fl->agg].rto;
			ks[cnt++] = k;
		}
		/* How long the window held numbered chunks back. */
		if (full && !c->t_win_full) {
			c->t_win_full = now;
		} else if (!full && c->t_win_full) {
			c->stats.window_full_ns += now - c->t_win_full;
			c->t_win_full = 0;
		}
		if (!cnt)
			return;
		tx_chunks(c, ks, cnt, now);
		if (flight_of(c, ks[cnt - 1])->unsent)
			return; /* the port is full: try again at the next poll */
	}
}

/* Append formatted text at e while there is room before end. */
#define TEXT(...)                                                              \
	do {                                                                   \
		if (e < end)                                                   \
			e += snprintf(e, (size_t)(end - e), __VA_ARGS__);      \
	} while (0)

/*
 * Append what a leaf's STATUS says of its root (the tail after its two
 * bitmaps, docs/PROTOCOL.md "Who is missing in a tree"): ", which reports
 * leaf 0 present, missing leaf 1 (workers 2,3): its aggregator reports
 * missing worker 3".  Nothing when the tail is not a whole view.  Returns
 * the new end of the text.
 */
static char *root_text(const struct hg_client *c, const uint8_t *t, size_t n,
		       char *e, char *end)
{
	uint32_t L, W = c->cfg.workers, nb, present = 0, nmiss = 0;
	const uint8_t *root, *below;
	bool first = true;

	if (n < 2)
		return e;
	L = (uint32_t)(t[0] << 8 | t[1]);
	nb = (L + 7) / 8;
	if (!L || L > W || n < 2 + 2 * (size_t)nb + BITMAP_BYTES)
		return e;
	root = t + 2;
	below = t + 2 + 2 * nb;
	for (uint32_t l = 0; l < L; l++)
		present += root[l / 8] >> (l % 8) & 1;
	TEXT(", which reports lea%s ", present == 1 ? "f" : "ves");
	for (uint32_t l = 0; l < L; l++) {
		if (!(root[l / 8] >> (l % 8) & 1))
			continue;
		TEXT("%s%u", first ? "" : ",", l);
		first = false;
	}
	if (first)
		TEXT("none");
	TEXT(" present");
	for (uint32_t l = 0; l < L; l++) {
		uint32_t lo = (uint32_t)((uint64_t)l * W / L),
			 hi = (uint32_t)((uint64_t)(l + 1) * W / L);
		bool any = false;

		if (root[l / 8] >> (l % 8) & 1)
			continue;
		TEXT("%s missing leaf %u (workers %u-%u): ", nmiss++ ? ";" : ",",
		     l, lo, hi - 1);
		for (uint32_t w = lo; w < hi && w < HG_MAX_WORKERS; w++) {
			if (!(below[w / 8] >> (w % 8) & 1))
				continue;
			TEXT("%s%u",
			     any ? "," : "its aggregator reports missing worker ",
			     w);
			any = true;
		}
		if (!any)
			TEXT("no status from leaf aggregator %u", l);
	}
	return e < end ? e : end;
}

/*
 * Append "workers 0,1,3 present, missing worker 2" for a STATUS bitmap of
 * the aggregator (the job's worker numbers: a tree leaf's are an offset),
 * and when none is missing that the slot waits for the root (PROTOCOL.md
 * "Tree") and what the root lacks when the STATUS carried its view (tail,
 * tn bytes).  Returns the new end of the text.
 */
static char *bitmap_text(const struct hg_client *c, const uint8_t *bitmap,
			 const uint8_t *tail, size_t tn, char *e, char *end)
{
	uint32_t missing = 0, base = c->cfg.worker - c->cfg.agg_worker;

	if (e < end)
		e += snprintf(e, (size_t)(end - e), "workers ");
	for (int pass = 0; pass < 2; pass++) {
		bool first = true;

		if (pass == 1) {
			for (uint32_t w = 0; w < c->cfg.agg_workers; w++)
				missing += !(bitmap[w / 8] >> (w % 8) & 1);
			if (e < end)
				e += snprintf(e, (size_t)(end - e),
					      " present, missing worker%s ",
					      missing == 1 ? "" : "s");
		}
		for (uint32_t w = 0; w < c->cfg.agg_workers && e < end - 1; w++) {
			bool in = bitmap[w / 8] >> (w % 8) & 1;

			if (in != (pass == 0))
				continue;
			e += snprintf(e, (size_t)(end - e), "%s%u",
				      first ? "" : ",", w + base);
			first = false;
		}
		if (first && e < end - 1)
			e += snprintf(e, (size_t)(end - e), "none");
	}
	/* complete there: a tree leaf waiting for its root (PROTOCOL.md "Tree") */
	if (!missing && e < end - 1) {
		e += snprintf(e, (size_t)(end - e),
			      " (complete there: it waits for its root aggregator");
		e = root_text(c, tail, tn, e < end ? e : end, end);
		TEXT(")");
	}
	return e < end ? e : end;
}

/*
 * The give-up's text (PROTOCOL.md "Timeouts and naming the missing
 * peers"): it names who is missing -- the workers the aggregator's STATUS
 * of the chunk lacked, else those its latest STATUS of any chunk of this
 * allreduce lacked, else the aggregator itself when it answered nothing.
 */
static void timeout_text(struct hg_client *c, const struct flight *fl)
{
	const struct stream *s = hg_cl_chunk_stream(c, (size_t)(fl->chunk -
								c->st.base));
	const struct agg *ag = &c->agg[fl->agg];
	char name[64], *e = c->err, *end = c->err + sizeof(c->err);
	/* the limit it waited for; a late wake-up (a loaded host) is not news */
	double secs = (double)c->cfg.give_up_ns / 1e9;

	agg_name(c, fl->agg, name, sizeof(name));
	if (ag->st.results_received == ag->start_results && !fl->have_status &&
	    !ag->have_status) {
		snprintf(c->err, sizeof(c->err),
			 "no answer from %s: sent %llu chunks, "
			 "received 0 results",
			 name,
			 (unsigned long long)(ag->st.packets_sent - ag->start_sent));
		return;
	}
	e += snprintf(e, (size_t)(end - e),
		      "timed out after %.3g s waiting for chunk %llu (phase %s): ", secs,
		      (unsigned long long)fl->chunk, hg_phase_name(s->phase));
	if (!ag->have_status || ag->unanswered >= STOPPED_UNANSWERED) {
		/* it answered earlier, then none of our latest resends
		 * (a live one answers each resend its slot has): it stopped */
		snprintf(e, (size_t)(end - e),
			 "no status from %s after %u transmissions "
			 "(it stopped answering: none of the last %u resends to "
			 "it was answered)",
			 name, fl->tries, ag->unanswered);
		return;
	}
	if (fl->have_status && all_present(c, fl->bitmap) &&
	    !root_view(c, fl->tree, fl->tree_len) && ag->view_tree_len) {
		/* complete at the leaf, whose STATUS of it came before it had
		 * the root's view: the latest view of another chunk names who
		 * the root waits for */
		e += snprintf(e, (size_t)(end - e), "%s reports ", name);
		e = bitmap_text(c, fl->bitmap, ag->view_tree, ag->view_tree_len,
				e, end);
		TEXT("; the root's view is of chunk %llu, its latest one here",
		     (unsigned long long)ag->view_chunk);
		return;
	}
	if (fl->have_status) {
		e += snprintf(e, (size_t)(end - e), "%s reports ", name);
		bitmap_text(c, fl->bitmap, fl->tree, fl->tree_len, e, end);
		return;
	}
	e += snprintf(e, (size_t)(end - e),
		      "no status of it from %s after %u transmissions; "
		      "its latest (chunk %llu) reports ",
		      name, fl->tries, (unsigned long long)ag->status_chunk);
	bitmap_text(c, ag->status_bitmap, ag->status_tree, ag->status_tree_len,
		    e, end);
}

/*
 * An aggregator's window is stalled (one of its chunks timed out again:
 * its retransmission went unanswered too, as when a peer is gone): send
 * every other open chunk of it again that was out for at least an RTO and
 * is not known present, so each gets a STATUS (the give-up names the
 * missing workers) or its result.  Returns the new count of ks.
 */
static uint16_t tx_window(struct hg_client *c, uint32_t a, size_t *ks,
			  uint16_t cnt, uint64_t now)
{
	struct agg *ag = &c->agg[a];

	for (size_t i = (size_t)a * c->cfg.slots;
	     i < (size_t)(a + 1) * c->cfg.slots; i++) {
		struct flight *fl = &c->fl[i];

		if (!fl->busy || fl->unsent || fl->present ||
		    fl->last_tx == now || now - fl->last_tx < ag->rto_est)
			continue;
		c->stats.window_retransmissions++;
		ag->st.window_retransmissions++;
		ks[cnt++] = (size_t)(fl->chunk - c->st.base);
		if (cnt == BURST) {
			tx_chunks(c, ks, cnt, now);
			cnt = 0;
		}
	}
	return cnt;
}

/*
 * Whether chunk fl's aggregator ag is stalled: neither a new result of it
 * nor the chunk's first transmission came within the last
 * give_up_ns / STALL_WINDOW_DIV.  A repair in progress holds one slot while
 * the results of the others keep coming; a step start or a peer's long
 * repair is a silence shorter than that, and resending the window then cost
 * one retransmission per open chunk and worker (10-12 per drop at W = 64).
 */
static bool window_stalled(const struct hg_client *c, const struct agg *ag,
			   const struct flight *fl, uint64_t now)
{
	uint64_t from = ag->t_res > fl->first_tx ? ag->t_res : fl->first_tx;

	return now >= from && now - from >= c->cfg.give_up_ns / STALL_WINDOW_DIV;
}

/*
 * Retransmit the chunks whose timer expired (backing off), the whole window
 * of an aggregator where one expired again (tx_window), and end the
 * allreduce when the oldest one waited give_up_ns.  Returns 0 or -ETIMEDOUT.
 */
int hg_cl_tx_expired(struct hg_client *c, uint64_t now)
{
	const struct flight *oldest = NULL;
	size_t ks[BURST];
	uint16_t cnt = 0;
	uint32_t stalled = UINT32_MAX; /* an aggregator whose window stalled */

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
		return hg_cl_fail(c, -ETIMEDOUT);
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
		} else if (!fl->unsent && now < hg_cl_chunk_deadline(c, fl)) {
			continue;
		} else if (!fl->unsent && hg_cl_step_start(c, fl)) {
			/* No answer of its step yet: a peer may not have
			 * started the step (PROTOCOL.md "Peers that start
			 * late").  Ask (the resend repairs our contribution
			 * if it was lost, else gets the STATUS naming who is
			 * missing), backing off this chunk's timer only: no
			 * timeout, nothing to learn. */
			c->stats.start_probes++;
			fl->fast_at = 0;
			fl->rto = hg_cl_rto_backoff(c, hg_cl_chunk_rto(c, fl));
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
			if (fl->tries >= 2 && window_stalled(c, ag, fl, now))
				stalled = fl->agg;
			fl->timed_out = true;
			fl->fast_at = 0;
			fl->rto = hg_cl_rto_backoff(c, hg_cl_chunk_rto(c, fl));
			if (now - ag->t_backoff >= ag->rto) {
				ag->rto = hg_cl_rto_backoff(c, ag->rto);
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
		tx_chunks(c, ks, cnt, now); /* these now have last_tx == now */
	if (stalled != UINT32_MAX) {
		cnt = tx_window(c, stalled, ks, 0, now);
		if (cnt)
			tx_chunks(c, ks, cnt, now);
	}
	return 0;
}

uint64_t hg_cl_next_deadline(const struct hg_client *c, uint64_t now)
{
	size_t span = (size_t)c->naggs * c->cfg.slots;
	uint64_t dl = UINT64_MAX;

	for (size_t i = 0; i < span; i++) {
		const struct flight *fl = &c->fl[i];
		uint64_t t, held;

		if (!fl->busy)
			continue;
		if (fl->unsent)
			return now;
		t = hg_cl_chunk_deadline(c, fl);
		if (fl->fast_at && fl->fast_at < t)
			t = fl->fast_at;
		/* the chunks after it may go then, when a later one waits */
		held = held_until(c, fl);
		if (held > now && held < t &&
		    (size_t)(fl->chunk - c->st.base) + span < c->st.nchunks)
			t = held;
		if (t < dl)
			dl = t;
		t = fl->first_tx + c->cfg.give_up_ns;
		if (t < dl)
			dl = t;
	}
	return dl;
}
