/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The fabric of the NIC model: buffer pool, event queue (virtual clock),
 * the L2 switch, counters and trace (homagg/nic.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "homagg/mix.h"
#include "nic_pvt.h"

#define DEFAULT_POOL 8192
#define DEFAULT_BUF 2048
#define DEFAULT_PORTS 64

/* ---------------------------------------------------------------- pool */

uint32_t nic_buf_alloc(struct hg_nic_fabric *f)
{
	uint32_t b;

	if (!f->nfree)
		return NIC_NONE;
	b = f->freelist[--f->nfree];
	f->bufs[b].state = BUF_FABRIC;
	f->bufs[b].pkt.len = 0;
	f->bufs[b].pkt.meta = 0;
	f->bufs[b].src = NIC_NO_PORT;
	f->bufs[b].dst = NIC_NO_PORT;
	return b;
}

void nic_buf_free(struct hg_nic_fabric *f, uint32_t b)
{
	f->bufs[b].state = BUF_FREE;
	f->freelist[f->nfree++] = b;
}

/* A copy of buffer b (bytes, length, source), or NIC_NONE if the pool is empty. */
uint32_t nic_buf_copy(struct hg_nic_fabric *f, uint32_t b)
{
	uint32_t c = nic_buf_alloc(f);
	struct nic_buf *src = nic_buf(f, b), *dst;

	if (c == NIC_NONE)
		return c;
	dst = nic_buf(f, c);
	memcpy(dst->pkt.data, src->pkt.data, src->pkt.len);
	dst->pkt.len = src->pkt.len;
	dst->src = src->src;
	dst->dst = src->dst;
	return c;
}

/* ---------------------------------------------------------- event heap */

static bool ev_before(const struct nic_ev *a, const struct nic_ev *b)
{
	return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

/*
 * Push an event.  Each buffer is in at most one event, so the heap (sized
 * pool_size) never overflows.
 */
void nic_ev_push(struct hg_nic_fabric *f, uint64_t t, uint32_t buf, uint32_t kind)
{
	uint32_t i = f->nheap++;
	struct nic_ev ev = { .t = t, .seq = f->seq++, .buf = buf, .kind = kind };

	while (i) {
		uint32_t parent = (i - 1) / 2;

		if (!ev_before(&ev, &f->heap[parent]))
			break;
		f->heap[i] = f->heap[parent];
		i = parent;
	}
	f->heap[i] = ev;
}

static struct nic_ev ev_pop(struct hg_nic_fabric *f)
{
	struct nic_ev top = f->heap[0], last = f->heap[--f->nheap];
	uint32_t i = 0, n = f->nheap;

	for (;;) {
		uint32_t c = 2 * i + 1;

		if (c >= n)
			break;
		if (c + 1 < n && ev_before(&f->heap[c + 1], &f->heap[c]))
			c++;
		if (!ev_before(&f->heap[c], &last))
			break;
		f->heap[i] = f->heap[c];
		i = c;
	}
	if (n)
		f->heap[i] = last;
	return top;
}

/* --------------------------------------------------------------- trace */

static uint64_t hash_bytes(const uint8_t *p, size_t n)
{
	uint64_t h = HG_MIX_GOLDEN ^ n;
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		uint64_t w;

		memcpy(&w, p + i, 8);
		h = (h ^ w) * 0x100000001b3ULL;
		h ^= h >> 29;
	}
	for (; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ULL;
	return hg_mix64(h);
}

/* Record one event of buffer b into the running hash and the ring. */
void nic_trace(struct hg_nic_fabric *f, uint32_t b, uint16_t dst, uint8_t kind,
	       uint8_t dir)
{
	struct nic_buf *nb = nic_buf(f, b);
	struct hg_nic_trace_rec r;

	f->trace_count++;
	if (!f->cfg.trace_hash && !f->trace)
		return;
	r.t_ns = f->now;
	r.hash = hash_bytes(nb->pkt.data, nb->pkt.len);
	r.src = nb->src;
	r.dst = dst;
	r.len = nb->pkt.len;
	r.kind = kind;
	r.dir = dir;
	if (f->cfg.trace_hash) {
		uint64_t h = f->trace_hash;

		h = hg_mix64(h ^ r.t_ns);
		h = hg_mix64(h ^ r.hash);
		h = hg_mix64(h ^ ((uint64_t)r.src | (uint64_t)r.dst << 16 |
				  (uint64_t)r.len << 32 | (uint64_t)r.kind << 48 |
				  (uint64_t)r.dir << 56));
		f->trace_hash = h;
	}
	if (f->trace)
		f->trace[(f->trace_count - 1) % f->cfg.trace_records] = r;
}

uint64_t hg_nic_trace_hash(const struct hg_nic_fabric *f)
{
	return f->trace_hash;
}

uint64_t hg_nic_trace_count(const struct hg_nic_fabric *f)
{
	return f->trace_count;
}

unsigned hg_nic_trace_copy(const struct hg_nic_fabric *f,
			   struct hg_nic_trace_rec *out, unsigned n)
{
	uint64_t have, first, i;

	if (!f->trace)
		return 0;
	have = f->trace_count < f->cfg.trace_records ? f->trace_count :
						       f->cfg.trace_records;
	if (n > have)
		n = (unsigned)have;
	first = f->trace_count - n;
	for (i = 0; i < n; i++)
		out[i] = f->trace[(first + i) % f->cfg.trace_records];
	return n;
}

/* ------------------------------------------------------ create/destroy */

struct hg_nic_fabric *hg_nic_fabric_create(const struct hg_nic_fabric_config *cfg)
{
	struct hg_nic_fabric_config c = { 0 };
	struct hg_nic_fabric *f;
	uint32_t i;

	if (cfg)
		c = *cfg;
	if (!c.pool_size)
		c.pool_size = DEFAULT_POOL;
	if (!c.buf_size)
		c.buf_size = DEFAULT_BUF;
	if (!c.max_ports)
		c.max_ports = DEFAULT_PORTS;
	if (c.buf_size < 64 || c.max_ports > HG_NIC_MAX_PORTS ||
	    c.pool_size >= NIC_NONE) {
		errno = EINVAL;
		return NULL;
	}
	f = calloc(1, sizeof(*f));
	if (!f)
		goto err_nomem;
	f->cfg = c;
	f->bufs = calloc(c.pool_size, sizeof(*f->bufs));
	f->mem = calloc(c.pool_size, c.buf_size);
	f->freelist = calloc(c.pool_size, sizeof(*f->freelist));
	f->heap = calloc(c.pool_size, sizeof(*f->heap));
	f->ports = calloc(c.max_ports, sizeof(*f->ports));
	for (f->mac_mask = 1; f->mac_mask < 2u * c.max_ports; f->mac_mask <<= 1)
		;
	f->mac_table = calloc(f->mac_mask, sizeof(*f->mac_table));
	f->mac_mask--;
	if (!f->bufs || !f->mem || !f->freelist || !f->heap || !f->ports ||
	    !f->mac_table)
		goto err_free_fabric;
	if (c.trace_records) {
		f->trace = calloc(c.trace_records, sizeof(*f->trace));
		if (!f->trace)
			goto err_free_fabric;
	}
	/* Free list in reverse so the first allocations take buffers 0, 1, ... */
	for (i = 0; i < c.pool_size; i++) {
		struct nic_buf *b = &f->bufs[i];

		b->idx = i;
		b->pkt.data = f->mem + (size_t)i * c.buf_size;
		b->pkt.cap = c.buf_size;
		b->pkt.priv = b;
		b->state = BUF_FREE;
		f->freelist[c.pool_size - 1 - i] = i;
	}
	f->nfree = c.pool_size;
	return f;

err_free_fabric:
	hg_nic_fabric_destroy(f);
err_nomem:
	errno = ENOMEM;
	return NULL;
}

void hg_nic_fabric_destroy(struct hg_nic_fabric *f)
{
	unsigned i;

	if (!f)
		return;
	if (f->ports)
		for (i = 0; i < f->nports; i++)
			nic_port_destroy(f->ports[i]);
	free(f->trace);
	free(f->mac_table);
	free(f->ports);
	free(f->heap);
	free(f->freelist);
	free(f->mem);
	free(f->bufs);
	free(f);
}

struct hg_nic_port *hg_nic_fabric_port(struct hg_nic_fabric *f, unsigned id)
{
	return id < f->nports ? f->ports[id] : NULL;
}

/* -------------------------------------------------------------- switch */

static uint64_t mac_key(const uint8_t *m)
{
	return (uint64_t)m[0] << 40 | (uint64_t)m[1] << 32 | (uint64_t)m[2] << 24 |
	       (uint64_t)m[3] << 16 | (uint64_t)m[4] << 8 | m[5];
}

static uint32_t mac_slot(const struct hg_nic_fabric *f, uint64_t key)
{
	return (uint32_t)(hg_mix64(key) & f->mac_mask);
}

/* The port owning unicast MAC key, or -1 (linear probing; never full). */
int nic_mac_lookup(const struct hg_nic_fabric *f, uint64_t key)
{
	uint32_t i;

	for (i = mac_slot(f, key); f->mac_table[i]; i = (i + 1) & f->mac_mask)
		if (f->ports[f->mac_table[i] - 1]->mac_key == key)
			return (int)f->mac_table[i] - 1;
	return -1;
}

void nic_mac_insert(struct hg_nic_fabric *f, uint64_t key, uint16_t id)
{
	uint32_t i;

	for (i = mac_slot(f, key); f->mac_table[i]; i = (i + 1) & f->mac_mask)
		;
	f->mac_table[i] = (uint32_t)id + 1;
}

static void drop_no_route(struct hg_nic_fabric *f, uint32_t b)
{
	struct nic_buf *nb = nic_buf(f, b);

	f->ports[nb->src]->ctr[HG_NIC_PC_NO_ROUTE]++;
	f->ctr[HG_NIC_FC_NO_ROUTE]++;
	nic_trace(f, b, NIC_NO_PORT, HG_NIC_EV_NO_ROUTE, 0);
	nic_buf_free(f, b);
}

static bool port_in_group(const struct hg_nic_port *p, uint32_t low23)
{
	unsigned i;

	for (i = 0; i < p->ngroups; i++)
		if ((p->groups[i] & 0x7fffff) == low23)
			return true;
	return false;
}

/*
 * Send buffer b (from port src) to every port in the set, never back to
 * src: one port gets the buffer itself, the others copies (counted as
 * replicas; a copy the pool cannot give is lost, counted on the receiver).
 */
static void switch_flood(struct hg_nic_fabric *f, uint32_t b, uint16_t src,
			 bool group, uint32_t low23)
{
	int last = -1;
	unsigned i;

	for (i = 0; i < f->nports; i++) {
		struct hg_nic_port *p = f->ports[i];
		uint32_t c;

		if (i == src || (group && !port_in_group(p, low23)))
			continue;
		if (last >= 0) {
			c = nic_buf_copy(f, b);
			if (c == NIC_NONE) {
				f->ports[last]->ctr[HG_NIC_PC_IN_NOBUF]++;
				f->ctr[HG_NIC_FC_NOBUF]++;
				nic_trace(f, b, (uint16_t)last, HG_NIC_EV_NOBUF,
					  HG_NIC_IN);
			} else {
				f->ctr[HG_NIC_FC_REPLICATED]++;
				nic_buf(f, c)->dst = (uint16_t)last;
				nic_link_enter(f, f->ports[last], HG_NIC_IN, c);
			}
		}
		last = (int)i;
	}
	if (last < 0) {
		drop_no_route(f, b);
		return;
	}
	nic_buf(f, b)->dst = (uint16_t)last;
	nic_link_enter(f, f->ports[last], HG_NIC_IN, b);
}

/* A frame reached the switch: look up where it goes. */
static void switch_frame(struct hg_nic_fabric *f, uint32_t b)
{
	struct nic_buf *nb = nic_buf(f, b);
	const uint8_t *d = nb->pkt.data;
	uint64_t key = mac_key(d);
	int i;

	if (key == 0xffffffffffffULL) {
		if (f->cfg.no_broadcast)
			drop_no_route(f, b);
		else
			switch_flood(f, b, nb->src, false, 0);
		return;
	}
	if (d[0] & 1) {
		if (d[0] == 0x01 && d[1] == 0x00 && d[2] == 0x5e &&
		    !(d[3] & 0x80) && !f->cfg.no_multicast)
			switch_flood(f, b, nb->src, true,
				     (uint32_t)(key & 0x7fffff));
		else
			drop_no_route(f, b);
		return;
	}
	i = nic_mac_lookup(f, key);
	if (i >= 0 && (unsigned)i != nb->src) {
		nb->dst = (uint16_t)i;
		nic_link_enter(f, f->ports[i], HG_NIC_IN, b);
		return;
	}
	drop_no_route(f, b);
}

/* ---------------------------------------------------------------- time */

uint64_t hg_nic_now(const struct hg_nic_fabric *f)
{
	return f->now;
}

bool hg_nic_next_event(const struct hg_nic_fabric *f, uint64_t *t)
{
	uint64_t best = UINT64_MAX;
	bool any = false;

	if (f->nheap) {
		best = f->heap[0].t;
		any = true;
	}
	if (f->nheld && f->hold_deadline < best) {
		best = f->hold_deadline;
		any = true;
	}
	if (any && t)
		*t = best;
	return any;
}

/* Earliest deadline over every held frame (after one was released). */
void nic_hold_recompute(struct hg_nic_fabric *f)
{
	uint64_t best = UINT64_MAX;
	unsigned i, d, k;

	if (f->nheld)
		for (i = 0; i < f->nports; i++)
			for (d = 0; d < 2; d++) {
				const struct nic_link *l = &f->ports[i]->link[d];

				for (k = 0; k < l->nheld; k++)
					if (l->held[k].deadline < best)
						best = l->held[k].deadline;
			}
	f->hold_deadline = best;
}

int hg_nic_advance_to(struct hg_nic_fabric *f, uint64_t t)
{
	if (t < f->now)
		return -EINVAL;
	for (;;) {
		uint64_t te = f->nheap ? f->heap[0].t : UINT64_MAX;

		/* Held frames whose timeout comes first are released first. */
		if (f->nheld && f->hold_deadline <= t && f->hold_deadline <= te) {
			f->now = f->hold_deadline;
			nic_link_release_due(f, f->now);
			f->ctr[HG_NIC_FC_EVENTS]++;
			continue;
		}
		if (te > t)
			break;
		struct nic_ev ev = ev_pop(f);

		f->now = ev.t;
		f->ctr[HG_NIC_FC_EVENTS]++;
		if (ev.kind == EV_SWITCH)
			switch_frame(f, ev.buf);
		else
			nic_port_deliver(f, ev.buf);
	}
	f->now = t;
	return 0;
}

int hg_nic_advance(struct hg_nic_fabric *f, uint64_t ns)
{
	if (f->now + ns < f->now)
		return -EINVAL;
	return hg_nic_advance_to(f, f->now + ns);
}

uint32_t hg_nic_in_flight(const struct hg_nic_fabric *f)
{
	return f->nheap + f->nheld;
}

uint32_t hg_nic_pool_free(const struct hg_nic_fabric *f)
{
	return f->nfree;
}

/* ------------------------------------------------------------ counters */

#define NIC_NAME_(name, str) str,
static const char *const fabric_counter_names[] = { HG_NIC_FABRIC_COUNTERS(
	NIC_NAME_) };
static const char *const port_counter_names[] = { HG_NIC_PORT_COUNTERS(NIC_NAME_) };
#undef NIC_NAME_

/*
 * The three accessors of one counter table (homagg/nic.h):
 * hg_nic_<obj>_counter_count(), hg_nic_<obj>_counter_name(i) (NULL past
 * the end) and hg_nic_<obj>_counters(o, out, n) (the first n, at most
 * count, into out; returns how many).
 */
#define NIC_COUNTER_ACCESSORS(obj, names, count)                               \
	unsigned hg_nic_##obj##_counter_count(void)                            \
	{                                                                      \
		return count;                                                  \
	}                                                                      \
	const char *hg_nic_##obj##_counter_name(unsigned i)                    \
	{                                                                      \
		return i < count ? names[i] : NULL;                            \
	}                                                                      \
	unsigned hg_nic_##obj##_counters(const struct hg_nic_##obj *o,         \
					 uint64_t *out, unsigned n)            \
	{                                                                      \
		if (n > count)                                                 \
			n = count;                                             \
		memcpy(out, o->ctr, n * sizeof(*out));                         \
		return n;                                                      \
	}

NIC_COUNTER_ACCESSORS(fabric, fabric_counter_names, HG_NIC_FC__COUNT)
NIC_COUNTER_ACCESSORS(port, port_counter_names, HG_NIC_PC__COUNT)
#undef NIC_COUNTER_ACCESSORS
