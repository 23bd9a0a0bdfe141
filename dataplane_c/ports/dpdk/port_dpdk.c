/* SPDX-License-Identifier: Apache-2.0 */
/*
 * port_dpdk.c - homagg/port.h over rte_ethdev (see port_dpdk.h).
 *
 * Packet mapping: every mbuf of the pool carries its struct hg_pkt in the
 * mbuf private area (rte_mbuf_to_priv), set up once per burst, so neither
 * direction copies a byte.  hg_pkt.priv points back at the mbuf.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <rte_arp.h>
#include <rte_cycles.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_malloc.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_prefetch.h>
#include <rte_ring.h>

#include "port_dpdk.h"

#define HG_DPDK_BURST_MAX 64
#define PRIV_SIZE RTE_ALIGN_CEIL(sizeof(struct hg_pkt), RTE_MBUF_PRIV_ALIGN)

struct hg_dpdk_port {
	struct hg_dpdk_port_conf conf;
	struct hg_dpdk_port_stats st;
	struct rte_ether_addr mac;
	uint16_t mtu;
	uint64_t drop_threshold; /* drop when rng() < threshold */
	uint64_t rng;            /* xorshift64* state */
	uint64_t tsc_base;
	uint64_t ns_mult; /* ns = (tsc * ns_mult) >> 32 */
};

static inline struct hg_pkt *mbuf_pkt(struct rte_mbuf *m)
{
	return rte_mbuf_to_priv(m);
}

/* Point m's hg_pkt at m's data (after rx or alloc). */
static inline struct hg_pkt *pkt_bind(struct rte_mbuf *m)
{
	struct hg_pkt *pk = mbuf_pkt(m);

	pk->data = rte_pktmbuf_mtod(m, uint8_t *);
	pk->len = m->data_len;
	pk->cap = (uint16_t)(m->buf_len - m->data_off);
	pk->meta = m->port;
	pk->priv = m;
	return pk;
}

struct rte_mempool *hg_dpdk_pool_create(const char *name, unsigned int n,
					uint16_t data_room, int socket)
{
	return rte_pktmbuf_pool_create(name, n, n >= 1024 ? 256 : 0, PRIV_SIZE,
				       (uint16_t)(data_room + RTE_PKTMBUF_HEADROOM),
				       socket);
}

/* xorshift64*: a small seeded generator; the drop pattern is reproducible. */
static inline uint64_t rng_next(struct hg_dpdk_port *p)
{
	uint64_t x = p->rng;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	p->rng = x;
	return x * 0x2545F4914F6CDD1DULL;
}

/*
 * ARP never reaches the engine.  A request for our address is turned into
 * the reply in place and sent (arp_replies; a reply the NIC refuses is also
 * counted in tx_refused); every other ARP frame -- a request for another
 * address, a reply, one too short for an IPv4 ARP body, another protocol --
 * is freed and counted in arp_other.  Returns true when m was consumed.
 */
static bool arp_consume(struct hg_dpdk_port *p, struct rte_mbuf *m)
{
	struct rte_ether_hdr *eth = rte_pktmbuf_mtod(m, struct rte_ether_hdr *);
	struct rte_arp_hdr *arp;

	if (m->data_len < sizeof(*eth) ||
	    eth->ether_type != rte_cpu_to_be_16(RTE_ETHER_TYPE_ARP))
		return false;
	arp = (struct rte_arp_hdr *)(eth + 1);
	if (m->data_len < sizeof(*eth) + sizeof(*arp) ||
	    arp->arp_opcode != rte_cpu_to_be_16(RTE_ARP_OP_REQUEST) ||
	    arp->arp_protocol != rte_cpu_to_be_16(RTE_ETHER_TYPE_IPV4) ||
	    rte_be_to_cpu_32(arp->arp_data.arp_tip) != p->conf.ipv4) {
		p->st.arp_other++;
		rte_pktmbuf_free(m);
		return true;
	}
	arp->arp_opcode = rte_cpu_to_be_16(RTE_ARP_OP_REPLY);
	arp->arp_data.arp_tha = arp->arp_data.arp_sha;
	arp->arp_data.arp_tip = arp->arp_data.arp_sip;
	arp->arp_data.arp_sha = p->mac;
	arp->arp_data.arp_sip = rte_cpu_to_be_32(p->conf.ipv4);
	eth->dst_addr = eth->src_addr;
	eth->src_addr = p->mac;
	p->st.arp_replies++;
	if (rte_eth_tx_burst(p->conf.port_id, p->conf.tx_queue, &m, 1) != 1) {
		p->st.tx_refused++;
		rte_pktmbuf_free(m);
	}
	return true;
}

static uint16_t dpdk_rx(void *ctx, struct hg_pkt **pkts, uint16_t n)
{
	struct hg_dpdk_port *p = ctx;
	struct rte_mbuf *m[HG_DPDK_BURST_MAX];
	uint16_t got, i, out = 0;

	if (n > HG_DPDK_BURST_MAX)
		n = HG_DPDK_BURST_MAX;
	if (p->conf.rx_ring)
		got = (uint16_t)rte_ring_sc_dequeue_burst(p->conf.rx_ring,
							  (void **)m, n, NULL);
	else
		got = rte_eth_rx_burst(p->conf.port_id, p->conf.rx_queue, m, n);
	if (got == 0)
		return 0;
	/* the mbuf headers and the frame headers of the whole burst are
	 * fetched in parallel rather than one miss at a time (they are cold
	 * when another core or the NIC wrote them): first every mbuf (its
	 * header, where the data pointer is, and its private area, where
	 * pkt_bind() writes), then the frames the data pointers point at */
	for (i = 0; i < got; i++) {
		rte_prefetch0(m[i]);
		rte_prefetch0(mbuf_pkt(m[i]));
	}
	for (i = 0; i < got; i++) {
		rte_prefetch0(rte_pktmbuf_mtod(m[i], void *));
		rte_prefetch0(rte_pktmbuf_mtod_offset(m[i], char *,
						      RTE_CACHE_LINE_SIZE));
	}
	for (i = 0; i < got; i++) {
		if (p->drop_threshold && rng_next(p) < p->drop_threshold) {
			p->st.drop_injected++;
			rte_pktmbuf_free(m[i]);
			continue;
		}
		/* the engine reads a frame as one buffer: a PMD that scattered
		 * it (a jumbo frame into small rx buffers) gets it copied into
		 * its first mbuf when that one can hold it all */
		if (unlikely(m[i]->nb_segs != 1)) {
			if (rte_pktmbuf_linearize(m[i]) != 0) {
				p->st.drop_segmented++;
				rte_pktmbuf_free(m[i]);
				continue;
			}
			p->st.rx_linearized++;
		}
		if (unlikely(arp_consume(p, m[i])))
			continue;
		pkts[out++] = pkt_bind(m[i]);
	}
	p->st.rx += out;
	return out;
}

/* Bring the mbuf in line with what the caller did to its hg_pkt. */
static inline struct rte_mbuf *pkt_sync(struct hg_pkt *pk)
{
	struct rte_mbuf *m = pk->priv;

	if (likely(m->next == NULL)) {
		m->data_off = (uint16_t)(pk->data - (uint8_t *)m->buf_addr);
		m->data_len = pk->len;
		m->pkt_len = pk->len;
	} else {
		/* a fan-out clone: header segment + shared payload segment */
		m->pkt_len = pk->len;
	}
	return m;
}

static uint16_t dpdk_tx(void *ctx, struct hg_pkt **pkts, uint16_t n)
{
	struct hg_dpdk_port *p = ctx;
	struct rte_mbuf *m[HG_DPDK_BURST_MAX];
	uint16_t i, sent, total = 0;

	/* tx_burst's contract: the first rc packets were taken, in order */
	while (total < n) {
		uint16_t k = n - total;

		if (k > HG_DPDK_BURST_MAX)
			k = HG_DPDK_BURST_MAX;
		for (i = 0; i < k; i++)
			m[i] = pkt_sync(pkts[total + i]);
		if (p->conf.tx_ring)
			sent = (uint16_t)rte_ring_sp_enqueue_burst(p->conf.tx_ring,
								   (void **)m,
								   k, NULL);
		else
			sent = rte_eth_tx_burst(p->conf.port_id,
						p->conf.tx_queue, m, k);
		total += sent;
		if (sent < k)
			break;
	}
	p->st.tx += total;
	p->st.tx_refused += n - total;
	return total;
}

uint16_t hg_dpdk_port_tx_mbufs(struct hg_dpdk_port *p, struct rte_mbuf **m,
			       uint16_t n)
{
	uint16_t sent = rte_eth_tx_burst(p->conf.port_id, p->conf.tx_queue, m, n);

	p->st.tx += sent;
	p->st.tx_refused += n - sent;
	return sent;
}

static uint16_t dpdk_alloc(void *ctx, struct hg_pkt **pkts, uint16_t n)
{
	struct hg_dpdk_port *p = ctx;
	struct rte_mbuf *m[HG_DPDK_BURST_MAX];
	uint16_t i;

	if (n > HG_DPDK_BURST_MAX)
		n = HG_DPDK_BURST_MAX;
	if (rte_pktmbuf_alloc_bulk(p->conf.pool, m, n) != 0) {
		p->st.alloc_fail++;
		return 0;
	}
	for (i = 0; i < n; i++) {
		pkts[i] = pkt_bind(m[i]);
		pkts[i]->len = 0;
	}
	return n;
}

static void dpdk_free(void *ctx, struct hg_pkt **pkts, uint16_t n)
{
	struct rte_mbuf *m[HG_DPDK_BURST_MAX];
	uint16_t i, k;

	(void)ctx;
	while (n) {
		k = n < HG_DPDK_BURST_MAX ? n : HG_DPDK_BURST_MAX;
		for (i = 0; i < k; i++)
			m[i] = pkts[i]->priv;
		rte_pktmbuf_free_bulk(m, k); /* one mempool put per pool run */
		pkts += k;
		n -= k;
	}
}

static int dpdk_info(void *ctx, struct hg_port_info *info)
{
	struct hg_dpdk_port *p = ctx;

	memcpy(info->mac, p->mac.addr_bytes, 6);
	info->ipv4 = p->conf.ipv4;
	info->udp_port = p->conf.udp_port;
	info->mtu = p->mtu;
	info->can_replicate = p->conf.can_replicate;
	return 0;
}

static uint64_t dpdk_now(void *ctx)
{
	struct hg_dpdk_port *p = ctx;
	uint64_t d = rte_get_tsc_cycles() - p->tsc_base;

	return (uint64_t)(((unsigned __int128)d * p->ns_mult) >> 32);
}

/* A DPDK port receives every frame of its link: multicast needs no join. */
static int dpdk_join(void *ctx, uint32_t group)
{
	(void)ctx;
	(void)group;
	return 0;
}

static const struct hg_port_ops dpdk_ops = {
	.rx_burst = dpdk_rx,
	.tx_burst = dpdk_tx,
	.alloc_bulk = dpdk_alloc,
	.free_bulk = dpdk_free,
	.get_info = dpdk_info,
	.now_ns = dpdk_now,
	.join_group = dpdk_join,
};

struct hg_dpdk_port *hg_dpdk_port_create(const struct hg_dpdk_port_conf *c)
{
	struct hg_dpdk_port *p;
	uint64_t hz;

	if (!c || !c->pool || !rte_eth_dev_is_valid_port(c->port_id) ||
	    !(c->drop_rate >= 0.0 && c->drop_rate <= 1.0) ||
	    c->pool->private_data_size == 0 ||
	    rte_pktmbuf_priv_size(c->pool) < sizeof(struct hg_pkt) ||
	    !c->rx_ring != !c->tx_ring) {
		errno = EINVAL;
		return NULL;
	}
	p = rte_zmalloc("hg_dpdk_port", sizeof(*p), RTE_CACHE_LINE_SIZE);
	if (!p) {
		errno = ENOMEM;
		return NULL;
	}
	p->conf = *c;
	if (rte_eth_macaddr_get(c->port_id, &p->mac) != 0)
		memset(&p->mac, 0, sizeof(p->mac));
	p->mtu = c->mtu;
	if (!p->mtu && rte_eth_dev_get_mtu(c->port_id, &p->mtu) != 0)
		p->mtu = RTE_ETHER_MTU;
	/* drop_rate 1.0 saturates to "drop everything but 1 in 2^64" */
	if (c->drop_rate >= 1.0)
		p->drop_threshold = UINT64_MAX;
	else
		p->drop_threshold = (uint64_t)(c->drop_rate *
					       18446744073709551616.0);
	p->rng = c->seed ? c->seed : 0x9E3779B97F4A7C15ULL;
	hz = rte_get_tsc_hz();
	p->tsc_base = rte_get_tsc_cycles();
	p->ns_mult = (uint64_t)(((unsigned __int128)1000000000ULL << 32) /
				(hz ? hz : 1));
	return p;
}

void hg_dpdk_port_destroy(struct hg_dpdk_port *p)
{
	rte_free(p);
}

struct hg_port hg_dpdk_port_ops(struct hg_dpdk_port *p)
{
	struct hg_port port = { .ops = &dpdk_ops, .ctx = p };

	return port;
}

void hg_dpdk_port_get_stats(const struct hg_dpdk_port *p,
			    struct hg_dpdk_port_stats *s)
{
	*s = p->st;
}

uint16_t hg_dpdk_port_fanout(struct hg_dpdk_port *p, struct hg_pkt *src,
			     uint16_t hdr_len, struct hg_pkt **out, uint16_t n)
{
	struct rte_mbuf *sm = src->priv;
	uint16_t i;

	if (hdr_len > src->len)
		return 0;
	pkt_sync(src);
	for (i = 0; i < n; i++) {
		struct rte_mbuf *h = rte_pktmbuf_alloc(p->conf.pool);
		struct rte_mbuf *body;
		struct hg_pkt *pk;

		if (!h)
			break;
		body = rte_pktmbuf_clone(sm, p->conf.pool); /* indirect, refcnt+1 */
		if (!body) {
			rte_pktmbuf_free(h);
			break;
		}
		rte_pktmbuf_adj(body, hdr_len);
		memcpy(rte_pktmbuf_mtod(h, uint8_t *), src->data, hdr_len);
		h->data_len = hdr_len;
		h->pkt_len = hdr_len;
		if (rte_pktmbuf_chain(h, body) != 0) {
			rte_pktmbuf_free(body);
			rte_pktmbuf_free(h);
			break;
		}
		pk = pkt_bind(h);
		pk->len = src->len;
		pk->cap = hdr_len;
		out[i] = pk;
	}
	return i;
}
