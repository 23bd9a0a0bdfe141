/* SPDX-License-Identifier: Apache-2.0 */
/*
 * homagg/port_udp.h - the port interface over kernel UDP sockets, for
 * workers on ordinary hosts (and in the local testbed's namespaces).
 *
 * The kernel owns Ethernet, IP and UDP; the HomAgg header and payload are
 * the UDP payload.  So the engine and the client see the same frame layout
 * as on every other backend, rx synthesises the Ethernet/IPv4/UDP headers in
 * front of the received payload (IPv4 checksum valid, UDP checksum 0, MACs
 * zero) and tx reads the destination from them and strips them before
 * sendmmsg().  Batches use recvmmsg()/sendmmsg(); with gso (config) a run
 * of frames of one size to one destination is one UDP_SEGMENT message.
 *
 * Two sockets: one bound to (bind_ipv4, bind_port) for unicast, and, after
 * join_group, one bound to group_port that receives the result multicast
 * groups joined (IP_ADD_MEMBERSHIP; IP_MULTICAST_ALL off, so only those).
 * A datagram from the group socket is presented with this port's own
 * address and UDP port as destination, like a unicast one: the group is a
 * delivery detail, the client accepts frames to its own port only.
 * The clock is CLOCK_MONOTONIC.
 */
#ifndef HOMAGG_PORT_UDP_H
#define HOMAGG_PORT_UDP_H

#include <stdint.h>

#include "homagg/port.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cdef-begin */
struct hg_udp_port_config {
	uint32_t bind_ipv4; /* host order; 0 = any address */
	uint16_t bind_port; /* 0 = an ephemeral port */
	uint16_t group_port; /* UDP port of multicast results (0 = HG_UDP_PORT) */
	uint32_t packets;    /* packet pool size (0 = 1024) */
	uint32_t rcvbuf;     /* socket receive buffer bytes (0 = 4 MiB) */
	uint32_t sndbuf;     /* socket send buffer bytes (0 = 4 MiB): a window
			       * of frames waits there behind a shaped link */
	uint16_t mtu;        /* MTU of the path to the aggregator, reported by
			       * get_info (0 = 1500; at most 9000) */
	uint8_t gso; /* 1: a run of frames of one size to one destination
		      * leaves as one UDP_SEGMENT message, which the kernel
		      * (or the NIC) cuts into the same datagrams: only where
		      * the aggregator's port sees them cut (a NIC, the
		      * testbed's switch ports), never a packet socket on
		      * the sending host's own veth.  Refused by the kernel
		      * (before Linux 6.11: a link without checksum offload):
		      * frame by frame from then on, tx_gso_refused counts
		      * it. */
};

struct hg_udp_port_stats {
	uint64_t rx;           /* datagrams received */
	uint64_t tx;           /* datagrams sent */
	uint64_t rx_truncated; /* datagrams larger than a packet (dropped) */
	uint64_t tx_bad;       /* frames that were not IPv4/UDP (dropped) */
	uint64_t tx_errors;    /* sendmmsg errors other than a full buffer */
	uint64_t tx_too_big; /* datagrams the kernel refused as larger than the
			       * path MTU (EMSGSIZE: the socket never fragments) */
	uint64_t tx_too_big_bytes; /* the IPv4 length of the latest of them */
	uint64_t waits;            /* blocking waits (ppoll) */
	uint64_t wait_timeouts; /* waits that ended at their deadline, no frame */
	uint64_t tx_gso;        /* UDP_SEGMENT messages sent (of 2+ frames) */
	uint64_t tx_gso_frames;  /* the frames they carried (counted in tx) */
	uint64_t tx_gso_refused; /* 1 once the kernel refused one (gso off) */
};

struct hg_udp_port;

/* NULL with errno set (socket/bind errors, ENOMEM, EINVAL: mtu not 0 or
 * 576..9000). */
struct hg_udp_port *hg_udp_port_create(const struct hg_udp_port_config *cfg);
void hg_udp_port_destroy(struct hg_udp_port *p);

/* The port interface of p, valid as long as p. */
struct hg_port *hg_udp_port_port(struct hg_udp_port *p);

/* The bound unicast address (host order). */
int hg_udp_port_local(const struct hg_udp_port *p, uint32_t *ipv4,
		      uint16_t *udp_port);

/* Block until a datagram is ready or timeout_ns passed.  Returns 1 (ready),
 * 0 (timeout) or -errno. */
int hg_udp_port_wait(struct hg_udp_port *p, uint64_t timeout_ns);

int hg_udp_port_get_stats(const struct hg_udp_port *p,
			  struct hg_udp_port_stats *st);
/* cdef-end */

#ifdef __cplusplus
}
#endif

#endif /* HOMAGG_PORT_UDP_H */
