/* SPDX-License-Identifier: Apache-2.0 */
/*
 * homagg/port.h - the port interface: how the engine and the worker client
 * move packets.  One ops table, several backends chosen by the build:
 *
 *   dataplane_c/ports/port_mem.c     in-memory (tests, benchmarks)
 *   dataplane_c/ports/port_udp.c     kernel UDP sockets (workers on real links)
 *   dataplane_c/ports/dpdk/          rte_ethdev (hardware NICs and virtual PMDs;
 *                                    built into the daemon only)
 *   nic/src/nic_port.c               the software NIC model (virtual time,
 *                                    fault injection)
 *
 * A packet is a struct hg_pkt owned by the backend that allocated it.  A
 * frame starts at data[0] with the Ethernet header.  Ownership rules, as in
 * rte_eth_tx_burst(): tx_burst takes the packets it returns as sent (the
 * first rc of the array); the caller still owns and must free the rest.
 */
#ifndef HOMAGG_PORT_H
#define HOMAGG_PORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cdef-begin */
struct hg_pkt {
	uint8_t *data; /* Ethernet frame */
	uint16_t len;  /* frame length in bytes */
	uint16_t cap;  /* bytes available at data */
	uint32_t meta; /* backend use (e.g. arrival port) */
	void *priv;    /* backend handle (rte_mbuf *, NIC model buffer) */
};

struct hg_port_info {
	uint8_t mac[6];
	uint32_t ipv4;     /* host byte order */
	uint16_t udp_port; /* host byte order */
	uint16_t mtu;      /* largest IP packet */
	bool can_replicate; /* a frame to a multicast group reaches every member */
};
/* cdef-end */

struct hg_port_ops {
	/* Receive up to n packets; returns how many. */
	uint16_t (*rx_burst)(void *ctx, struct hg_pkt **pkts, uint16_t n);
	/* Send up to n packets; returns how many were taken (see above). */
	uint16_t (*tx_burst)(void *ctx, struct hg_pkt **pkts, uint16_t n);
	/* Allocate n empty packets (len 0); returns how many (0..n). */
	uint16_t (*alloc_bulk)(void *ctx, struct hg_pkt **pkts, uint16_t n);
	void (*free_bulk)(void *ctx, struct hg_pkt **pkts, uint16_t n);
	int (*get_info)(void *ctx, struct hg_port_info *info);
	/* The port's clock in ns (virtual time in the NIC model). */
	uint64_t (*now_ns)(void *ctx);
	/* Optional (NULL = none): join a multicast group (IPv4, host order). */
	int (*join_group)(void *ctx, uint32_t group_ipv4);
	/*
	 * Optional (NULL = none; real-time ports only): block until a frame
	 * may be ready to receive (or, with tx, the port can take frames
	 * again) or the port's clock reaches until_ns.  Returns 1 (ready),
	 * 0 (the time passed) or a negative errno.
	 */
	int (*wait)(void *ctx, uint64_t until_ns, bool tx);
};

struct hg_port {
	const struct hg_port_ops *ops;
	void *ctx;
};

static inline uint16_t hg_port_rx(const struct hg_port *p, struct hg_pkt **pk,
				  uint16_t n)
{
	return p->ops->rx_burst(p->ctx, pk, n);
}

static inline uint16_t hg_port_tx(const struct hg_port *p, struct hg_pkt **pk,
				  uint16_t n)
{
	return p->ops->tx_burst(p->ctx, pk, n);
}

static inline uint16_t hg_port_alloc(const struct hg_port *p,
				     struct hg_pkt **pk, uint16_t n)
{
	return p->ops->alloc_bulk(p->ctx, pk, n);
}

static inline void hg_port_free(const struct hg_port *p, struct hg_pkt **pk,
				uint16_t n)
{
	if (n)
		p->ops->free_bulk(p->ctx, pk, n);
}

static inline uint64_t hg_port_now(const struct hg_port *p)
{
	return p->ops->now_ns(p->ctx);
}

static inline bool hg_port_can_wait(const struct hg_port *p)
{
	return p->ops->wait != NULL;
}

static inline int hg_port_wait(const struct hg_port *p, uint64_t until_ns, bool tx)
{
	return p->ops->wait(p->ctx, until_ns, tx);
}

#ifdef __cplusplus
}
#endif

#endif /* HOMAGG_PORT_H */
