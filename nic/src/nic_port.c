/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A port of the NIC model: descriptor rings, the hg_port ops table
 * (homagg/port.h), multicast membership, and the bulk helpers for Python.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "nic_pvt.h"

#define DEFAULT_RING 1024
#define DEFAULT_MTU 1500

/* -------------------------------------------------------------- ops */

/* The buffer behind pkt if it belongs to this fabric's pool, else NULL. */
static struct nic_buf *pkt_buf(struct hg_nic_fabric *f, const struct hg_pkt *pkt)
{
	const struct nic_buf *nb = pkt ? pkt->priv : NULL;

	if (!nb || nb < f->bufs || nb >= f->bufs + f->cfg.pool_size ||
	    (const struct hg_pkt *)&nb->pkt != pkt)
		return NULL;
	return (struct nic_buf *)nb;
}

static uint16_t nic_rx_burst(void *ctx, struct hg_pkt **pkts, uint16_t n)
{
	struct hg_nic_port *p = ctx;
	struct hg_nic_fabric *f = p->f;
	uint16_t i;

	if (n > p->rx_count)
		n = (uint16_t)p->rx_count;
	for (i = 0; i < n; i++) {
		struct nic_buf *nb = nic_buf(f, p->rxq[p->rx_head]);

		p->rx_head = p->rx_head + 1 == p->cfg.rx_ring ? 0 : p->rx_head + 1;
		nb->state = BUF_USER;
		pkts[i] = &nb->pkt;
	}
	p->rx_count -= n;
	p->ctr[HG_NIC_PC_RX_BURST] += n;
	return n;
}

/* Drop the tx ring entries whose frame has left the serialiser by now. */
static void tx_ring_reap(struct hg_nic_port *p, uint64_t now)
{
	while (p->tx_count && p->txq[p->tx_head] <= now) {
		p->tx_head = p->tx_head + 1 == p->tx_cap ? 0 : p->tx_head + 1;
		p->tx_count--;
	}
}

static uint16_t nic_tx_burst(void *ctx, struct hg_pkt **pkts, uint16_t n)
{
	struct hg_nic_port *p = ctx;
	struct hg_nic_fabric *f = p->f;
	uint32_t max_len = (uint32_t)p->cfg.mtu + NIC_ETH_HLEN;
	uint16_t i;

	tx_ring_reap(p, f->now);
	for (i = 0; i < n; i++) {
		struct nic_buf *nb = pkt_buf(f, pkts[i]);

		if (!nb || nb->state != BUF_USER || nb->pkt.len > nb->pkt.cap) {
			p->ctr[HG_NIC_PC_TX_BAD_PKT]++;
			break;
		}
		if (p->tx_count >= p->cfg.tx_ring) {
			p->ctr[HG_NIC_PC_TX_RING_FULL] += n - i;
			f->ctr[HG_NIC_FC_TX_RING_FULL] += n - i;
			break;
		}
		nb->state = BUF_FABRIC;
		nb->src = p->id;
		nb->dst = NIC_NO_PORT;
		nb->pkt.meta = p->id;
		if (nb->pkt.len < NIC_ETH_HLEN || nb->pkt.len > max_len) {
			bool runt = nb->pkt.len < NIC_ETH_HLEN;

			p->ctr[runt ? HG_NIC_PC_TX_RUNT : HG_NIC_PC_TX_OVERSIZE]++;
			f->ctr[HG_NIC_FC_OVERSIZE]++;
			nic_trace(f, nb->idx, NIC_NO_PORT, HG_NIC_EV_OVERSIZE,
				  HG_NIC_OUT);
			nic_buf_free(f, nb->idx);
			continue;
		}
		p->ctr[HG_NIC_PC_TX]++;
		p->ctr[HG_NIC_PC_TX_BYTES] += nb->pkt.len;
		f->ctr[HG_NIC_FC_SENT]++;
		nic_trace(f, nb->idx, NIC_NO_PORT, HG_NIC_EV_TX, HG_NIC_OUT);
		nic_link_enter(f, p, HG_NIC_OUT, nb->idx);
	}
	return i;
}

static uint16_t nic_alloc_bulk(void *ctx, struct hg_pkt **pkts, uint16_t n)
{
	struct hg_nic_port *p = ctx;
	struct hg_nic_fabric *f = p->f;
	uint16_t i;

	if (n > f->nfree) {
		p->ctr[HG_NIC_PC_ALLOC_SHORT]++;
		f->ctr[HG_NIC_FC_ALLOC_SHORT]++;
		n = (uint16_t)f->nfree;
	}
	for (i = 0; i < n; i++) {
		struct nic_buf *nb = nic_buf(f, nic_buf_alloc(f));

		nb->state = BUF_USER;
		pkts[i] = &nb->pkt;
	}
	return n;
}

static void nic_free_bulk(void *ctx, struct hg_pkt **pkts, uint16_t n)
{
	struct hg_nic_port *p = ctx;
	struct hg_nic_fabric *f = p->f;
	uint16_t i;

	for (i = 0; i < n; i++) {
		struct nic_buf *nb = pkt_buf(f, pkts[i]);

		/* A buffer the user does not hold (double free, foreign
		 * pointer) is counted and left alone, never corrupts the pool. */
		if (!nb || nb->state != BUF_USER) {
			p->ctr[HG_NIC_PC_BAD_FREE]++;
			f->ctr[HG_NIC_FC_BAD_FREE]++;
			continue;
		}
		nic_buf_free(f, nb->idx);
	}
}

static int nic_get_info(void *ctx, struct hg_port_info *info)
{
	struct hg_nic_port *p = ctx;

	if (!info)
		return -EINVAL;
	memcpy(info->mac, p->cfg.mac, 6);
	info->ipv4 = p->cfg.ipv4;
	info->udp_port = p->cfg.udp_port;
	info->mtu = p->cfg.mtu;
	info->can_replicate = !p->f->cfg.no_multicast;
	return 0;
}

static uint64_t nic_now_ns(void *ctx)
{
	struct hg_nic_port *p = ctx;

	return p->f->now;
}

static int nic_join_group(void *ctx, uint32_t group)
{
	return hg_nic_port_join(ctx, group);
}

static const struct hg_port_ops nic_port_ops = {
	.rx_burst = nic_rx_burst,
	.tx_burst = nic_tx_burst,
	.alloc_bulk = nic_alloc_bulk,
	.free_bulk = nic_free_bulk,
	.get_info = nic_get_info,
	.now_ns = nic_now_ns,
	.join_group = nic_join_group,
};

/* ----------------------------------------------------------- delivery */

/* A frame arrived at its port (buffer's dst): into the rx ring, or dropped. */
void nic_port_deliver(struct hg_nic_fabric *f, uint32_t b)
{
	struct nic_buf *nb = nic_buf(f, b);
	struct hg_nic_port *p = f->ports[nb->dst];

	if (nb->pkt.len > (uint32_t)p->cfg.mtu + NIC_ETH_HLEN) {
		p->ctr[HG_NIC_PC_RX_OVERSIZE]++;
		f->ctr[HG_NIC_FC_OVERSIZE]++;
		nic_trace(f, b, p->id, HG_NIC_EV_OVERSIZE, HG_NIC_IN);
		nic_buf_free(f, b);
		return;
	}
	if (p->rx_count >= p->cfg.rx_ring) {
		p->ctr[HG_NIC_PC_RX_RING_OVERFLOW]++;
		f->ctr[HG_NIC_FC_RX_RING_OVERFLOW]++;
		nic_trace(f, b, p->id, HG_NIC_EV_RX_OVERFLOW, HG_NIC_IN);
		nic_buf_free(f, b);
		return;
	}
	nb->pkt.meta = nb->src;
	p->rxq[(p->rx_head + p->rx_count) % p->cfg.rx_ring] = b;
	p->rx_count++;
	p->ctr[HG_NIC_PC_RX]++;
	p->ctr[HG_NIC_PC_RX_BYTES] += nb->pkt.len;
	f->ctr[HG_NIC_FC_DELIVERED]++;
	nic_trace(f, b, p->id, HG_NIC_EV_DELIVER, HG_NIC_IN);
}

/* ----------------------------------------------------- create/destroy */

static bool mac_is_zero(const uint8_t *m)
{
	return !(m[0] | m[1] | m[2] | m[3] | m[4] | m[5]);
}

struct hg_nic_port *hg_nic_port_create(struct hg_nic_fabric *f,
				       const struct hg_nic_port_config *cfg)
{
	struct hg_nic_port_config c;
	struct hg_nic_port *p;
	uint64_t key;

	if (!f || !cfg) {
		errno = EINVAL;
		return NULL;
	}
	c = *cfg;
	if (!c.mtu)
		c.mtu = DEFAULT_MTU;
	if (!c.rx_ring)
		c.rx_ring = DEFAULT_RING;
	if (!c.tx_ring)
		c.tx_ring = DEFAULT_RING;
	key = (uint64_t)c.mac[0] << 40 | (uint64_t)c.mac[1] << 32 |
	      (uint64_t)c.mac[2] << 24 | (uint64_t)c.mac[3] << 16 |
	      (uint64_t)c.mac[4] << 8 | c.mac[5];
	if ((c.mac[0] & 1) || mac_is_zero(c.mac) || c.mtu < 68 ||
	    (uint32_t)c.mtu + NIC_ETH_HLEN > f->cfg.buf_size ||
	    c.tx_ring > (UINT32_MAX - HG_NIC_MAX_HOLD - 1) / 2) {
		errno = EINVAL;
		return NULL;
	}
	if (nic_mac_lookup(f, key) >= 0) {
		errno = EINVAL;
		return NULL;
	}
	if (f->nports >= f->cfg.max_ports) {
		errno = ERANGE;
		return NULL;
	}
	p = calloc(1, sizeof(*p));
	if (!p)
		goto err_nomem;
	p->port.ops = &nic_port_ops;
	p->port.ctx = p;
	p->f = f;
	p->id = f->nports;
	p->cfg = c;
	p->mac_key = key;
	p->rxq = calloc(c.rx_ring, sizeof(*p->rxq));
	/* The tx ring admits tx_ring host frames; duplicates and released
	 * held frames also queue on the serialiser, hence the slack. */
	p->tx_cap = 2 * c.tx_ring + HG_NIC_MAX_HOLD + 1;
	p->txq = calloc(p->tx_cap, sizeof(*p->txq));
	if (!p->rxq || !p->txq)
		goto err_free_port;
	nic_link_init(&p->link[HG_NIC_OUT], f->cfg.seed, p->id, HG_NIC_OUT);
	nic_link_init(&p->link[HG_NIC_IN], f->cfg.seed, p->id, HG_NIC_IN);
	f->ports[f->nports++] = p;
	nic_mac_insert(f, key, p->id);
	return p;

err_free_port:
	nic_port_destroy(p);
err_nomem:
	errno = ENOMEM;
	return NULL;
}

void nic_port_destroy(struct hg_nic_port *p)
{
	if (!p)
		return;
	free(p->txq);
	free(p->rxq);
	free(p);
}

struct hg_port *hg_nic_port_get(struct hg_nic_port *p)
{
	return &p->port;
}

int hg_nic_port_id(const struct hg_nic_port *p)
{
	return p->id;
}

uint32_t hg_nic_port_rx_pending(const struct hg_nic_port *p)
{
	return p->rx_count;
}

int hg_nic_port_set_faults(struct hg_nic_port *p, int dir,
			   const struct hg_nic_faults *faults)
{
	if (!p || !faults || (dir != HG_NIC_OUT && dir != HG_NIC_IN))
		return -EINVAL;
	return nic_link_set_faults(&p->link[dir], faults);
}

/* ----------------------------------------------------------- multicast */

static bool is_multicast(uint32_t g)
{
	return (g >> 28) == 0xe;
}

int hg_nic_port_join(struct hg_nic_port *p, uint32_t group)
{
	unsigned i;

	if (!is_multicast(group))
		return -EINVAL;
	for (i = 0; i < p->ngroups; i++)
		if (p->groups[i] == group)
			return 0;
	if (p->ngroups >= HG_NIC_MAX_GROUPS)
		return -ENOSPC;
	p->groups[p->ngroups++] = group;
	return 0;
}

int hg_nic_port_leave(struct hg_nic_port *p, uint32_t group)
{
	unsigned i;

	if (!is_multicast(group))
		return -EINVAL;
	for (i = 0; i < p->ngroups; i++)
		if (p->groups[i] == group) {
			p->groups[i] = p->groups[--p->ngroups];
			return 0;
		}
	return -ENOENT;
}

/* ------------------------------------------------------- bulk helpers */

uint32_t hg_nic_port_send_frames(struct hg_nic_port *p, const uint8_t *buf,
				 const uint16_t *lens, uint32_t n)
{
	struct hg_pkt *pkt;
	size_t off = 0;
	uint32_t i;

	for (i = 0; i < n; i++) {
		if (lens[i] > p->f->cfg.buf_size)
			break;
		if (nic_alloc_bulk(p, &pkt, 1) != 1)
			break;
		memcpy(pkt->data, buf + off, lens[i]);
		pkt->len = lens[i];
		if (nic_tx_burst(p, &pkt, 1) != 1) {
			nic_free_bulk(p, &pkt, 1);
			break;
		}
		off += lens[i];
	}
	return i;
}

uint32_t hg_nic_port_recv_frames(struct hg_nic_port *p, uint8_t *buf, size_t cap,
				 uint16_t *lens, uint16_t *src, uint32_t n)
{
	struct hg_nic_fabric *f = p->f;
	size_t off = 0;
	uint32_t i;

	for (i = 0; i < n && p->rx_count; i++) {
		struct hg_pkt *pkt;
		struct nic_buf *nb = nic_buf(f, p->rxq[p->rx_head]);

		if (off + nb->pkt.len > cap)
			break;
		nic_rx_burst(p, &pkt, 1);
		memcpy(buf + off, pkt->data, pkt->len);
		off += pkt->len;
		lens[i] = pkt->len;
		if (src)
			src[i] = (uint16_t)pkt->meta;
		nic_free_bulk(p, &pkt, 1);
	}
	return i;
}

/* ------------------------------------------- ops through the hg_port */

uint16_t hg_nic_port_rx_burst(struct hg_nic_port *p, struct hg_pkt **pkts,
			      uint16_t n)
{
	return hg_port_rx(&p->port, pkts, n);
}

uint16_t hg_nic_port_tx_burst(struct hg_nic_port *p, struct hg_pkt **pkts,
			      uint16_t n)
{
	return hg_port_tx(&p->port, pkts, n);
}

uint16_t hg_nic_port_alloc_bulk(struct hg_nic_port *p, struct hg_pkt **pkts,
				uint16_t n)
{
	return hg_port_alloc(&p->port, pkts, n);
}

void hg_nic_port_free_bulk(struct hg_nic_port *p, struct hg_pkt **pkts, uint16_t n)
{
	hg_port_free(&p->port, pkts, n);
}

int hg_nic_port_get_info(struct hg_nic_port *p, struct hg_port_info *info)
{
	return p->port.ops->get_info(p->port.ctx, info);
}

uint64_t hg_nic_port_now(struct hg_nic_port *p)
{
	return hg_port_now(&p->port);
}

int hg_nic_port_join_group(struct hg_nic_port *p, uint32_t group_ipv4)
{
	return p->port.ops->join_group(p->port.ctx, group_ipv4);
}
