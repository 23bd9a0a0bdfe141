/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An in-memory port backend (homagg/port_mem.h) for engine tests and
 * benchmarks: rx from a queue of injected frames, tx into a queue read back
 * by the test, buffers from a fixed pool.  Single-threaded.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "homagg/port.h"
#include "homagg/port_mem.h"
#include "homagg/wire.h"

/* A FIFO of packet pointers; capacity = the pool size, so it never fills. */
struct pq {
	struct hg_pkt **v;
	uint32_t head, n, cap;
};

struct hg_port_mem {
	struct hg_port port;
	struct hg_port_info info;
	uint32_t pool_n;
	struct hg_pkt *pkts;
	uint8_t *mem;
	struct hg_pkt **free_stack;
	uint32_t nfree;
	struct pq rxq, txq;
	uint64_t now;
	uint32_t tx_limit; /* 0 = unlimited */
	uint32_t tx_taken;
	uint32_t groups;
};

static void pq_push(struct pq *q, struct hg_pkt *p)
{
	q->v[(q->head + q->n) % q->cap] = p;
	q->n++;
}

static struct hg_pkt *pq_pop(struct pq *q)
{
	struct hg_pkt *p;

	if (!q->n)
		return NULL;
	p = q->v[q->head];
	q->head = (q->head + 1) % q->cap;
	q->n--;
	return p;
}

static uint16_t mem_rx(void *ctx, struct hg_pkt **pkts, uint16_t n)
{
	struct hg_port_mem *m = ctx;
	uint16_t i;

	for (i = 0; i < n && m->rxq.n; i++)
		pkts[i] = pq_pop(&m->rxq);
	return i;
}

static uint16_t mem_tx(void *ctx, struct hg_pkt **pkts, uint16_t n)
{
	struct hg_port_mem *m = ctx;
	uint16_t i;

	for (i = 0; i < n; i++) {
		if (m->tx_limit && m->tx_taken >= m->tx_limit)
			break;
		pq_push(&m->txq, pkts[i]);
		m->tx_taken++;
	}
	return i;
}

static uint16_t mem_alloc(void *ctx, struct hg_pkt **pkts, uint16_t n)
{
	struct hg_port_mem *m = ctx;
	uint16_t i;

	for (i = 0; i < n && m->nfree; i++) {
		pkts[i] = m->free_stack[--m->nfree];
		pkts[i]->len = 0;
	}
	return i;
}

static void mem_free(void *ctx, struct hg_pkt **pkts, uint16_t n)
{
	struct hg_port_mem *m = ctx;

	for (uint16_t i = 0; i < n; i++)
		m->free_stack[m->nfree++] = pkts[i];
}

static int mem_info(void *ctx, struct hg_port_info *info)
{
	struct hg_port_mem *m = ctx;

	*info = m->info;
	return 0;
}

static uint64_t mem_now(void *ctx)
{
	return ((struct hg_port_mem *)ctx)->now;
}

static int mem_join(void *ctx, uint32_t group)
{
	(void)group;
	((struct hg_port_mem *)ctx)->groups++;
	return 0;
}

static const struct hg_port_ops mem_ops = {
	.rx_burst = mem_rx,
	.tx_burst = mem_tx,
	.alloc_bulk = mem_alloc,
	.free_bulk = mem_free,
	.get_info = mem_info,
	.now_ns = mem_now,
	.join_group = mem_join,
};

void hg_port_mem_config_init(struct hg_port_mem_config *c)
{
	if (!c)
		return;
	memset(c, 0, sizeof(*c));
	c->pool = 4096;
	c->buf_size = 9216;
	c->mac[0] = 0x02;
	c->mac[5] = 0x01;
	c->ipv4 = 0x0a0000fe;
	c->udp_port = HG_UDP_PORT;
	c->mtu = 9000;
}

struct hg_port_mem *hg_port_mem_create(const struct hg_port_mem_config *c)
{
	struct hg_port_mem *m;

	if (!c || c->pool < 1 || c->pool > (1u << 20) || c->buf_size < 64)
		return NULL;
	m = calloc(1, sizeof(*m));
	if (!m)
		goto err;
	m->pkts = calloc(c->pool, sizeof(*m->pkts));
	m->mem = malloc((size_t)c->pool * c->buf_size);
	m->free_stack = calloc(c->pool, sizeof(*m->free_stack));
	m->rxq.v = calloc(c->pool, sizeof(*m->rxq.v));
	m->txq.v = calloc(c->pool, sizeof(*m->txq.v));
	if (!m->pkts || !m->mem || !m->free_stack || !m->rxq.v || !m->txq.v)
		goto err_free;
	m->rxq.cap = m->txq.cap = c->pool;
	m->pool_n = c->pool;
	for (uint32_t i = 0; i < c->pool; i++) {
		m->pkts[i].data = m->mem + (size_t)i * c->buf_size;
		m->pkts[i].cap = c->buf_size;
		m->pkts[i].priv = m;
		m->free_stack[i] = &m->pkts[c->pool - 1 - i];
	}
	m->nfree = c->pool;
	memcpy(m->info.mac, c->mac, 6);
	m->info.ipv4 = c->ipv4;
	m->info.udp_port = c->udp_port;
	m->info.mtu = c->mtu;
	m->info.can_replicate = c->can_replicate;
	m->tx_limit = c->tx_limit;
	m->port.ops = &mem_ops;
	m->port.ctx = m;
	return m;

err_free:
	hg_port_mem_destroy(m);
err:
	return NULL;
}

void hg_port_mem_destroy(struct hg_port_mem *m)
{
	if (!m)
		return;
	free(m->txq.v);
	free(m->rxq.v);
	free(m->free_stack);
	free(m->mem);
	free(m->pkts);
	free(m);
}

struct hg_port *hg_port_mem_port(struct hg_port_mem *m)
{
	return m ? &m->port : NULL;
}

int hg_port_mem_inject(struct hg_port_mem *m, const uint8_t *frame, size_t len)
{
	struct hg_pkt *p;

	if (!m || (!frame && len))
		return -EINVAL;
	if (len > m->pkts[0].cap)
		return -ENOSPC;
	if (!m->nfree)
		return -ENOMEM;
	p = m->free_stack[--m->nfree];
	if (len)
		memcpy(p->data, frame, len);
	p->len = (uint16_t)len;
	pq_push(&m->rxq, p);
	return 0;
}

int hg_port_mem_pop_tx(struct hg_port_mem *m, uint8_t *buf, size_t cap)
{
	struct hg_pkt *p;
	int len;

	if (!m || (!buf && cap))
		return -EINVAL;
	if (!m->txq.n)
		return 0;
	p = m->txq.v[m->txq.head];
	if (p->len > cap)
		return -ENOSPC;
	pq_pop(&m->txq);
	memcpy(buf, p->data, p->len);
	len = p->len;
	m->free_stack[m->nfree++] = p;
	return len;
}

uint32_t hg_port_mem_rx_pending(const struct hg_port_mem *m)
{
	return m ? m->rxq.n : 0;
}

uint32_t hg_port_mem_tx_pending(const struct hg_port_mem *m)
{
	return m ? m->txq.n : 0;
}

uint32_t hg_port_mem_free_count(const struct hg_port_mem *m)
{
	return m ? m->nfree : 0;
}

void hg_port_mem_set_time(struct hg_port_mem *m, uint64_t ns)
{
	if (m)
		m->now = ns;
}

void hg_port_mem_set_tx_limit(struct hg_port_mem *m, uint32_t limit)
{
	if (!m)
		return;
	m->tx_limit = limit;
	m->tx_taken = 0;
}

uint32_t hg_port_mem_groups(const struct hg_port_mem *m)
{
	return m ? m->groups : 0;
}
