/* SPDX-License-Identifier: Apache-2.0 */
/*
 * port_dpdk.h - the port interface (homagg/port.h) over rte_ethdev.
 *
 * One hg_dpdk_port serves one (ethdev, rx queue, tx queue) triple and is
 * used by one lcore.  A received packet is an rte_mbuf whose private area
 * holds its struct hg_pkt, so rx/tx hand packets over without copies; the
 * mempool must therefore be created with hg_dpdk_pool_create() (private area
 * sized for a struct hg_pkt).
 *
 * The backend also answers ARP requests for its IPv4 address itself (a DPDK
 * port has no kernel stack behind it, and workers on kernel sockets need a
 * neighbour entry), and can drop a seeded fraction of received frames: the
 * kernel on the test machines has no netem, so loss is injected here.
 */
#ifndef HOMAGG_PORT_DPDK_H
#define HOMAGG_PORT_DPDK_H

#include <stdbool.h>
#include <stdint.h>

#include "homagg/port.h"

struct rte_mbuf;
struct rte_mempool;
struct rte_ring;

struct hg_dpdk_port_conf {
	uint16_t port_id; /* ethdev, configured and started by the caller */
	uint16_t rx_queue;
	uint16_t tx_queue;
	struct rte_mempool *pool; /* from hg_dpdk_pool_create() */
	uint32_t ipv4;            /* host byte order */
	uint16_t udp_port;        /* host byte order */
	bool can_replicate;       /* the link replicates multicast frames */
	double drop_rate; /* fraction of received frames dropped, 0..1 */
	uint64_t seed;    /* of the drop generator */
	uint16_t mtu;     /* reported by get_info; 0 = the ethdev's */
	/* Ring mode (both set): receive mbufs from rx_ring and send to
	 * tx_ring instead of the ethdev queues, for an engine lcore fed by a
	 * dispatcher lcore that owns the ethdev (port_id still names it:
	 * MAC and MTU come from it). */
	struct rte_ring *rx_ring;
	struct rte_ring *tx_ring;
};

/* Counters of the backend itself (the engine keeps its own). */
struct hg_dpdk_port_stats {
	uint64_t rx;            /* frames handed to the caller */
	uint64_t tx;            /* frames the NIC took */
	uint64_t tx_refused;    /* frames the NIC refused (caller still owns) */
	uint64_t drop_injected; /* frames dropped by drop_rate */
	uint64_t rx_linearized; /* multi-segment frames copied into their first mbuf */
	uint64_t drop_segmented; /* multi-segment frames too long for one mbuf, dropped */
	uint64_t arp_replies; /* ARP requests for our address (answered) */
	uint64_t arp_other; /* other ARP frames, consumed (never the engine's) */
	uint64_t alloc_fail; /* alloc_bulk calls the pool could not serve */
};

/* Create the packet pool: n mbufs with room for a frame of data_room bytes
 * and a struct hg_pkt in each private area.  NULL on failure (rte_errno). */
struct rte_mempool *hg_dpdk_pool_create(const char *name, unsigned int n,
					uint16_t data_room, int socket);

/* Returns NULL on a bad conf (-EINVAL) or an allocation failure. */
struct hg_dpdk_port *hg_dpdk_port_create(const struct hg_dpdk_port_conf *c);
void hg_dpdk_port_destroy(struct hg_dpdk_port *p);

/* Send mbufs on p's ethdev tx queue, counted in p's stats (the dispatcher
 * of ring-mode ports uses it).  Returns how many the NIC took; the caller
 * owns the rest. */
uint16_t hg_dpdk_port_tx_mbufs(struct hg_dpdk_port *p, struct rte_mbuf **m,
			       uint16_t n);

/* The port interface of p (valid as long as p is). */
struct hg_port hg_dpdk_port_ops(struct hg_dpdk_port *p);

void hg_dpdk_port_get_stats(const struct hg_dpdk_port *p,
			    struct hg_dpdk_port_stats *s);

/*
 * Zero-copy fan-out: n packets that carry src's frame, each with its own
 * writable copy of the first hdr_len bytes (Ethernet/IP/UDP/HomAgg headers:
 * per-destination addresses, worker id) chained to an indirect mbuf that
 * shares src's payload (reference count, no payload copy).  Only
 * out[i]->data[0..hdr_len) may be written; out[i]->len is the frame length.
 * src stays owned by the caller.  Returns how many were made (0..n).
 */
uint16_t hg_dpdk_port_fanout(struct hg_dpdk_port *p, struct hg_pkt *src,
			     uint16_t hdr_len, struct hg_pkt **out, uint16_t n);

#endif /* HOMAGG_PORT_DPDK_H */
