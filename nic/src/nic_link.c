/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One direction of a port's link: the seeded fault stage (loss, corruption,
 * duplication, bounded reordering), the serialiser at line rate, and the
 * propagation with extra delay and jitter (homagg/nic.h).
 */
#include <errno.h>
#include <math.h>
#include <string.h>

#include "homagg/mix.h"
#include "nic_pvt.h"

#define DEFAULT_HOLD_TIMEOUT_NS 100000

/* ----------------------------------------------------------------- rng */

static uint64_t rotl(uint64_t x, int k)
{
	return (x << k) | (x >> (64 - k));
}

/* xoshiro256** (Blackman, Vigna). */
static uint64_t rng_next(uint64_t *s)
{
	uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;

	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return r;
}

/* Uniform in [0, 1) with 53 bits. */
static double rng_unit(uint64_t *s)
{
	return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

/* Uniform in [0, n) (n > 0); the modulo bias is below 2^-32 for n < 2^32. */
static uint64_t rng_below(uint64_t *s, uint64_t n)
{
	return rng_next(s) % n;
}

static bool rng_hit(uint64_t *s, double p)
{
	return p > 0 && rng_unit(s) < p;
}

void nic_link_init(struct nic_link *l, uint64_t seed, uint16_t port, uint8_t dir)
{
	uint64_t s = seed ^
		     (0xd1b54a32d192ed03ULL * (2 * (uint64_t)port + dir + 1));
	unsigned i;

	memset(l, 0, sizeof(*l));
	l->dir = dir;
	for (i = 0; i < 4; i++)
		l->rng[i] = hg_splitmix64(&s);
}

static bool prob_ok(double p)
{
	return p >= 0.0 && p <= 1.0; /* false for NaN */
}

int nic_link_set_faults(struct nic_link *l, const struct hg_nic_faults *fl)
{
	struct hg_nic_faults c = *fl;

	if (!prob_ok(c.loss) || !prob_ok(c.dup) || !prob_ok(c.corrupt) ||
	    !prob_ok(c.reorder))
		return -EINVAL;
	if (c.reorder > 0 && (c.reorder_max == 0 || c.reorder_max > HG_NIC_MAX_HOLD))
		return -EINVAL;
	if (!c.reorder_timeout_ns)
		c.reorder_timeout_ns = DEFAULT_HOLD_TIMEOUT_NS;
	l->faults = c;
	l->active = c.loss > 0 || c.dup > 0 || c.corrupt > 0 || c.reorder > 0 ||
		    c.delay_ns || c.jitter_ns;
	return 0;
}

/* ---------------------------------------------------------- serialiser */

/* Counter index of a fault event in the port table, by direction. */
static unsigned pc(uint8_t dir, unsigned out_ctr, unsigned in_ctr)
{
	return dir == HG_NIC_OUT ? out_ctr : in_ctr;
}

/*
 * Serialise buffer b on the link at the current time and schedule its
 * arrival at the far end: the switch (OUT) or the port's rx ring (IN).
 * The remainder of the rate division is carried, so the long-run rate is
 * exact.
 */
static void link_send(struct hg_nic_fabric *f, struct hg_nic_port *p,
		      uint8_t dir, uint32_t b)
{
	struct nic_link *l = &p->link[dir];
	struct nic_buf *nb = nic_buf(f, b);
	uint64_t start = f->now > l->busy_until ? f->now : l->busy_until;
	uint64_t depart = start, arrive;

	if (p->cfg.rate_bps) {
		uint64_t bits_ns = ((uint64_t)nb->pkt.len + NIC_WIRE_OVERHEAD) *
					   8 * 1000000000ULL +
				   l->carry;

		depart += bits_ns / p->cfg.rate_bps;
		l->carry = bits_ns % p->cfg.rate_bps;
	}
	l->busy_until = depart;
	if (dir == HG_NIC_OUT && p->tx_count < p->tx_cap) {
		p->txq[(p->tx_head + p->tx_count) % p->tx_cap] = depart;
		p->tx_count++;
	}
	arrive = depart + p->cfg.prop_delay_ns + l->faults.delay_ns;
	if (l->faults.jitter_ns)
		arrive += rng_below(l->rng, l->faults.jitter_ns + 1);
	/* Jitter never reorders a link: clamp to the previous arrival. */
	if (arrive < l->last_arrival)
		arrive = l->last_arrival;
	l->last_arrival = arrive;
	nic_ev_push(f, arrive, b, dir == HG_NIC_OUT ? EV_SWITCH : EV_DELIVER);
}

/* Remove held entry k of the link (keeping the others in hold order). */
static uint32_t hold_remove(struct hg_nic_fabric *f, struct nic_link *l, unsigned k)
{
	uint32_t b = l->held[k].buf;

	memmove(&l->held[k], &l->held[k + 1],
		(l->nheld - k - 1) * sizeof(l->held[0]));
	l->nheld--;
	f->nheld--;
	return b;
}

/*
 * Serialise b, then let every held frame count it as one more frame that
 * went past.  Then, one at a time, the first held frame (in hold order, which
 * is arrival order) whose count ran out goes next, and counts as a pass for
 * the rest in turn.  A frame held with count k is released right after the
 * k-th frame went past it, before anything else: it is overtaken by at
 * most k later frames.
 */
static void link_emit(struct hg_nic_fabric *f, struct hg_nic_port *p,
		      uint8_t dir, uint32_t b)
{
	struct nic_link *l = &p->link[dir];
	bool released = false;
	unsigned k;

	link_send(f, p, dir, b);
	while (l->nheld) {
		for (k = 0; k < l->nheld; k++)
			if (l->held[k].left)
				l->held[k].left--;
		for (k = 0; k < l->nheld && l->held[k].left; k++)
			;
		if (k == l->nheld)
			break;
		link_send(f, p, dir, hold_remove(f, l, k));
		released = true;
	}
	if (released)
		nic_hold_recompute(f);
}

/*
 * A frame enters the link direction at the current time: apply the fault
 * stage, then serialise what is left.  Takes ownership of b.
 */
void nic_link_enter(struct hg_nic_fabric *f, struct hg_nic_port *p, uint8_t dir,
		    uint32_t b)
{
	struct nic_link *l = &p->link[dir];
	const struct hg_nic_faults *fl = &l->faults;
	struct nic_buf *nb;
	uint32_t dup = NIC_NONE;
	uint16_t who = dir == HG_NIC_OUT ? NIC_NO_PORT : p->id;

	if (!l->active) {
		link_emit(f, p, dir, b);
		return;
	}
	nb = nic_buf(f, b);
	if (rng_hit(l->rng, fl->loss)) {
		p->ctr[pc(dir, HG_NIC_PC_OUT_LOST, HG_NIC_PC_IN_LOST)]++;
		f->ctr[HG_NIC_FC_DROPPED_LOSS]++;
		nic_trace(f, b, who, HG_NIC_EV_LOSS, dir);
		nic_buf_free(f, b);
		return;
	}
	if (rng_hit(l->rng, fl->corrupt) && nb->pkt.len) {
		uint64_t r = rng_next(l->rng);

		nb->pkt.data[(r >> 8) % nb->pkt.len] ^= (uint8_t)(1 + (r & 0xff) %
									      255);
		p->ctr[pc(dir, HG_NIC_PC_OUT_CORRUPTED, HG_NIC_PC_IN_CORRUPTED)]++;
		f->ctr[HG_NIC_FC_CORRUPTED]++;
		nic_trace(f, b, who, HG_NIC_EV_CORRUPT, dir);
	}
	if (rng_hit(l->rng, fl->dup)) {
		dup = nic_buf_copy(f, b);
		if (dup == NIC_NONE) {
			p->ctr[pc(dir, HG_NIC_PC_OUT_NOBUF, HG_NIC_PC_IN_NOBUF)]++;
			f->ctr[HG_NIC_FC_NOBUF]++;
			nic_trace(f, b, who, HG_NIC_EV_NOBUF, dir);
		} else {
			p->ctr[pc(dir, HG_NIC_PC_OUT_DUPLICATED,
				  HG_NIC_PC_IN_DUPLICATED)]++;
			f->ctr[HG_NIC_FC_DUPLICATED]++;
			nic_trace(f, b, who, HG_NIC_EV_DUP, dir);
		}
	}
	if (l->nheld < HG_NIC_MAX_HOLD && rng_hit(l->rng, fl->reorder)) {
		struct nic_held *h = &l->held[l->nheld++];

		h->buf = b;
		h->left = 1 + (uint32_t)rng_below(l->rng, fl->reorder_max);
		h->deadline = f->now + fl->reorder_timeout_ns;
		if (!f->nheld++ || h->deadline < f->hold_deadline)
			f->hold_deadline = h->deadline;
		p->ctr[pc(dir, HG_NIC_PC_OUT_REORDERED, HG_NIC_PC_IN_REORDERED)]++;
		f->ctr[HG_NIC_FC_REORDERED]++;
		nic_trace(f, b, who, HG_NIC_EV_HOLD, dir);
	} else {
		link_emit(f, p, dir, b);
	}
	if (dup != NIC_NONE)
		link_emit(f, p, dir, dup);
}

/*
 * Release every held frame whose timeout is t (the fabric's earliest hold
 * deadline), on whichever link holds it.  Returns true if one was released.
 */
bool nic_link_release_due(struct hg_nic_fabric *f, uint64_t t)
{
	bool any = false;
	unsigned i, d, k;

	for (i = 0; i < f->nports; i++)
		for (d = 0; d < 2; d++) {
			struct nic_link *l = &f->ports[i]->link[d];

			for (k = 0; k < l->nheld;) {
				if (l->held[k].deadline <= t) {
					link_emit(f, f->ports[i], (uint8_t)d,
						  hold_remove(f, l, k));
					any = true;
					k = 0; /* link_emit may have removed others */
					continue;
				}
				k++;
			}
		}
	nic_hold_recompute(f);
	return any;
}
