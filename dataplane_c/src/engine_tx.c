/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the engine sends (engine_pvt.h): the transmit queue, results to a
 * worker or the job's group, STATUS, and answers to retransmissions.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine_pvt.h"

void hg_eng_flush_tx(struct hg_engine *e)
{
	uint32_t sent = 0;

	while (sent < e->ntx) {
		uint32_t n = e->ntx - sent;
		uint16_t k;

		if (n > 0xffff)
			n = 0xffff;
		k = hg_port_tx(e->port, e->tx + sent, (uint16_t)n);
		sent += k;
		if (k < n)
			break;
	}
	if (sent < e->ntx) {
		e->cnt[HG_CNT_TX_FULL] += e->ntx - sent;
		hg_port_free(e->port, e->tx + sent, (uint16_t)(e->ntx - sent));
	}
	e->ntx = 0;
}

/* A buffer for a reply of need bytes: the received one if it is still
 * unused and large enough, else a new one from the port (NULL: counted). */
struct hg_pkt *hg_eng_out_pkt(struct hg_engine *e, struct hg_job *j,
			      struct hg_pkt **reuse, size_t need)
{
	struct hg_pkt *p = *reuse;

	if (p && p->cap >= need) {
		*reuse = NULL;
		return p;
	}
	if (hg_port_alloc(e->port, &p, 1) != 1 || p->cap < need) {
		if (p && p->cap < need)
			hg_port_free(e->port, &p, 1);
		count(e, j, HG_CNT_NO_BUFFER);
		return NULL;
	}
	return p;
}

/*
 * Write a reply frame (result or status) into p: to worker w's learned
 * address, or to the job's group when w is HG_WORKER_ALL.  psum is the
 * checksum partial sum of the payload (ignored without checksums).  An
 * auth job's reply carries HG_FLAG_AUTH and the aggregator's MAC; the
 * checksum adds the MAC's 16 bytes to psum, or, where the MAC starts at an
 * odd offset (a STATUS bitmap of odd length), is summed again over payload
 * and MAC.
 */
static void put_reply(struct hg_engine *e, struct hg_job *j, struct hg_pkt *p,
		      const struct hg_set *s, uint16_t flags, uint16_t w,
		      bool group, const uint8_t *payload, size_t plen,
		      uint64_t psum, struct hg_mac_shared *sh)
{
	struct hg_hdr h = {
		.version = HG_PROTOCOL_VERSION,
		.op = s->op,
		.flags = (uint16_t)(flags |
				    (j->mac_len ? HG_FLAG_AUTH | j->epoch << HG_FLAG_EPOCH_SHIFT :
						  0)),
		.job = j->cfg.job,
		.token = j->cfg.token,
		.worker = w,
		.slot = (uint16_t)((s - j->sets) / 2),
		.seq = s->seq,
		.lanes = s->lanes,
		.exp = s->exp,
		.shard = j->cfg.shard,
		.incarnation = j->cfg.incarnation,
		.nonce = j->mac_len ? (uint32_t)++j->mac_ctr : 0,
	};
	uint8_t *f = p->data;

	if (w == HG_WORKER_ALL || group) {
		/* the same headers for every result of this size: built once */
		size_t udp_payload = HG_HDR_LEN + plen + j->mac_len;

		if (j->mc_plen != udp_payload) {
			uint8_t mac[6];

			hg_wire_mcast_mac(j->cfg.group_ipv4, mac);
			hg_wire_put_l2l4(j->mc_l2l4, &e->self, mac,
					 j->cfg.group_ipv4, e->self.port,
					 udp_payload);
			j->mc_plen = (uint16_t)udp_payload;
		}
		memcpy(f, j->mc_l2l4, HG_OFF_HDR);
	} else {
		const struct hg_wire_addr *a = &j->peers[w].addr;

		hg_wire_put_l2l4(f, &e->self, a->mac, a->ipv4, a->port,
				 HG_HDR_LEN + plen + j->mac_len);
	}
	hg_wire_put_hdr(f + HG_OFF_HDR, &h);
	if (f + HG_OFF_PAYLOAD != payload)
		memcpy(f + HG_OFF_PAYLOAD, payload, plen);
	if (j->mac_len) {
		const struct hg_mac_key *k = &j->keys[j->cfg.workers];

		if (sh && sh->k != k) /* the first copy: what the others share */
			hg_mac_key_share(k, f + HG_OFF_HDR, HG_HDR_LEN + plen, sh);
		hg_mac_key_sign_shared(k, sh, HG_AUTH_DIR_REPLY, j->mac_ctr,
				       f + HG_OFF_HDR, HG_HDR_LEN + plen,
				       f + HG_OFF_PAYLOAD + plen);
		if (!(e->wire_flags & HG_WIRE_F_UDP_CSUM))
			;
		else if (plen % 2 == 0) /* 16-bit aligned: sums add up */
			psum = hg_csum_add(psum, f + HG_OFF_PAYLOAD + plen,
					   j->mac_len);
		else
			psum = hg_csum_add(0, f + HG_OFF_PAYLOAD,
					   plen + j->mac_len);
	}
	if (e->wire_flags & HG_WIRE_F_UDP_CSUM)
		hg_wire_put_udp_csum(f, hg_csum_add(psum, f + HG_OFF_HDR,
						    HG_HDR_LEN));
	p->len = (uint16_t)(HG_OFF_PAYLOAD + plen + j->mac_len);
}

/* Send a complete set's result to worker w (HG_WORKER_ALL: to every worker). */
void hg_eng_send_result(struct hg_engine *e, struct hg_job *j,
			const struct hg_set *s, const uint8_t *acc, uint16_t w,
			struct hg_pkt **reuse)
{
	size_t plen = (size_t)s->lanes * hg_op_acc_lane(s->op);
	uint16_t fl = set_flags(j, s, HG_FLAG_RESULT);
	struct hg_mac_shared sh;
	struct hg_pkt *p;

	if (w != HG_WORKER_ALL || (e->can_replicate && j->cfg.group_ipv4)) {
		p = hg_eng_out_pkt(e, j, reuse, HG_OFF_PAYLOAD + plen + j->mac_len);
		if (!p)
			return;
		put_reply(e, j, p, s, fl, w, false, acc, plen, s->psum, NULL);
		queue_tx(e, p);
		count(e, j, HG_CNT_RESULTS_SENT);
		return;
	}
	/* the copies' MACs share what follows the header (auth_pvt.h) */
	sh.k = NULL;
	for (uint32_t i = 0; i < j->cfg.workers; i++) {
		p = hg_eng_out_pkt(e, j, reuse, HG_OFF_PAYLOAD + plen + j->mac_len);
		if (!p)
			continue;
		put_reply(e, j, p, s, fl, (uint16_t)i, false, acc, plen,
			  s->psum, &sh);
		queue_tx(e, p);
		count(e, j, HG_CNT_RESULTS_SENT);
	}
}

static bool send_status(struct hg_engine *e, struct hg_job *j,
			const struct hg_set *s, uint16_t w, uint16_t more,
			bool group, struct hg_pkt **reuse)
{
	uint8_t bits[HG_STATUS_MAX_PAYLOAD];
	size_t nb = (j->cfg.workers + 7) / 8, plen = 2 * nb;
	struct hg_pkt *p;
	uint64_t psum = 0;

	for (size_t i = 0; i < nb; i++)
		bits[i] = (uint8_t)(s->bitmap[i / 8] >> (8 * (i % 8)));
	memset(bits + nb, 0, nb);
	for (uint32_t i = 0; i < j->cfg.workers; i++)
		if (!(s->bitmap[i / 64] >> (i % 64) & 1) &&
		    j->peers[i].last > s->opened)
			bits[nb + i / 8] |= (uint8_t)(1u << (i % 8));
	plen += hg_eng_tree_tail(j, s, hg_port_now(e->port), bits + plen);
	p = hg_eng_out_pkt(e, j, reuse, HG_OFF_PAYLOAD + plen + j->mac_len);
	if (!p)
		return false;
	if (e->wire_flags & HG_WIRE_F_UDP_CSUM)
		psum = hg_csum_add(0, bits, plen);
	put_reply(e, j, p, s, set_flags(j, s, (uint16_t)(HG_FLAG_STATUS | more)),
		  w, group, bits, plen, psum, NULL);
	queue_tx(e, p);
	count(e, j, HG_CNT_STATUS_SENT);
	return true;
}

/* STATUS to worker w (HG_WORKER_ALL: the job's group): the set's worker
 * bitmap, W bits, bit w%8 of byte w/8, then its active bitmap: bit w set
 * when worker w is missing from the set and a frame of it (any chunk) was
 * accepted since the set's first one (it is sending: its frame or its
 * result was lost; docs/PROTOCOL.md Part 3, "Who is missing, and why").
 * False when no buffer was free. */
bool hg_eng_send_status(struct hg_engine *e, struct hg_job *j,
			const struct hg_set *s, uint16_t w, struct hg_pkt **reuse)
{
	return send_status(e, j, s, w, 0, false, reuse);
}

/* A loss report: the STATUS of hg_eng_send_status() naming worker w, marked
 * HG_FLAG_LOSS, to the job's group when "group" (w still in the header),
 * else to w alone (docs/PROTOCOL.md Part 3, "Loss reports"). */
bool hg_eng_send_loss_report(struct hg_engine *e, struct hg_job *j,
			     const struct hg_set *s, uint16_t w, bool group,
			     struct hg_pkt **reuse)
{
	return send_status(e, j, s, w, HG_FLAG_LOSS, group, reuse);
}

/*
 * Answer worker w's retransmission of open set s, already counted, with a
 * STATUS (docs/PROTOCOL.md Part 3, fast retransmission): to the job's group
 * where there is one, so every worker that waits for this slot learns
 * whether it is missing, but once per bitmap.  A bitmap the group already
 * had goes to w and to the workers it lacks (they may have taken the
 * group's copy as older than their latest transmission), each a unicast
 * counted in "status_repeats": at most W frames, at most one per worker.
 * Its bits only grow until the set starts over or is cleared
 * (status_count = NO_STATUS then), so the same count is the same bitmap.
 */
void hg_eng_answer_retrans(struct hg_engine *e, struct hg_job *j,
			   struct hg_set *s, uint16_t w, struct hg_pkt **reuse)
{
	if (j->up && j->cfg.up_leaves)
		hg_eng_up_report(e, j, s); /* what holds the root up */
	if (!e->can_replicate || !j->cfg.group_ipv4) {
		hg_eng_send_status(e, j, s, w, reuse);
		return;
	}
	if (s->status_count != s->count) {
		if (hg_eng_send_status(e, j, s, HG_WORKER_ALL, reuse))
			s->status_count = s->count;
		return;
	}
	if (hg_eng_send_status(e, j, s, w, reuse))
		count(e, j, HG_CNT_STATUS_REPEATS);
	for (uint32_t i = 0; i < j->cfg.workers; i++) {
		if (s->bitmap[i / 64] & (1ull << (i % 64)) || !j->peers[i].addr.ipv4)
			continue; /* present, or never heard from */
		if (hg_eng_send_status(e, j, s, (uint16_t)i, reuse))
			count(e, j, HG_CNT_STATUS_REPEATS);
	}
}
