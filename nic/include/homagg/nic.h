/* SPDX-License-Identifier: Apache-2.0 */
/*
 * homagg/nic.h - the software NIC model: the second port backend.
 *
 * A fabric is one L2 switch with a virtual clock (ns) and a fixed buffer
 * pool.  Ports created on it expose a struct hg_port (homagg/port.h), so the
 * engine and the worker client run on it unchanged.  Everything is
 * deterministic: the same seed and the same sequence of calls give the same
 * trace, bit for bit.
 *
 * The path of a frame from port A to port B:
 *
 *   A.tx_burst -> A's tx ring (tx_ring descriptors; full -> refused)
 *     -> fault stage of A's link, direction OUT
 *     -> serialiser at A's line rate -> propagation (A.prop_delay_ns)
 *        + extra delay/jitter of the stage                  [switch]
 *     -> lookup: unicast MAC, IPv4 multicast MAC (replicated to every port
 *        that joined the group, never back to A), broadcast
 *     -> fault stage of B's link, direction IN
 *     -> serialiser at B's line rate -> propagation (B.prop_delay_ns)
 *        + extra delay/jitter of the stage
 *     -> B's rx ring at the arrival time (full -> dropped, counted)
 *
 * Serialisation time = (frame bytes + 20 bytes preamble/IFG) * 8 / rate.
 * A fault stage applies, in this order: loss, corruption (one random byte
 * XORed with a non-zero value), duplication (a copy follows the frame),
 * reordering (the frame is held back until 1..reorder_max later frames of
 * the same stage went past it, or reorder_timeout_ns passed), and, after
 * serialisation, extra delay + uniform jitter.  Jitter never reorders: a
 * frame never arrives before the previous frame of its link direction, so
 * reordering is bounded by reorder_max alone.  Each stage draws from its own
 * xoshiro256** generator seeded from (fabric seed, port id, direction), so
 * traffic on one link does not perturb the draws of another.
 *
 * Time only moves in hg_nic_advance()/hg_nic_advance_to(); tx_burst and
 * rx_burst act at the current virtual time.  A simulation driver polls every
 * port's user, and when nothing moved advances to min(hg_nic_next_event(),
 * its own next timer).
 *
 * Not thread-safe: one fabric is driven by one thread.
 */
#ifndef HOMAGG_NIC_H
#define HOMAGG_NIC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "homagg/port.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Counters: one X-macro table each (enum + names); hg_nic_*_counter_name()
 * gives the names, Python reads them as dicts.  OUT_* count on the link
 * from the port to the switch, IN_* on the link from the switch to the port.
 */
/* clang-format off */
#define HG_NIC_PORT_COUNTERS(X)                                                \
	X(TX, "tx")                           /* frames taken by tx_burst */    \
	X(TX_BYTES, "tx_bytes")                                                 \
	X(TX_RING_FULL, "tx_ring_full")       /* refused: tx ring full */       \
	X(TX_OVERSIZE, "tx_oversize")         /* taken, dropped: > MTU + 14 */  \
	X(TX_RUNT, "tx_runt")                 /* taken, dropped: < 14 bytes */  \
	X(TX_BAD_PKT, "tx_bad_pkt")           /* refused: not a user buffer */  \
	X(NO_ROUTE, "no_route")               /* sent to nobody (unknown MAC) */\
	X(RX, "rx")                           /* frames put into the rx ring */ \
	X(RX_BYTES, "rx_bytes")                                                 \
	X(RX_BURST, "rx_burst")               /* frames taken by rx_burst */    \
	X(RX_RING_OVERFLOW, "rx_ring_overflow")                                 \
	X(RX_OVERSIZE, "rx_oversize")         /* longer than this port's MTU */ \
	X(OUT_LOST, "out_lost")                                                 \
	X(OUT_DUPLICATED, "out_duplicated")                                     \
	X(OUT_REORDERED, "out_reordered")     /* frames held back */            \
	X(OUT_CORRUPTED, "out_corrupted")                                       \
	X(OUT_NOBUF, "out_nobuf")             /* duplicate lost: pool empty */  \
	X(IN_LOST, "in_lost")                                                   \
	X(IN_DUPLICATED, "in_duplicated")                                       \
	X(IN_REORDERED, "in_reordered")                                         \
	X(IN_CORRUPTED, "in_corrupted")                                         \
	X(IN_NOBUF, "in_nobuf")       /* duplicate or replica lost: no buffer */\
	X(ALLOC_SHORT, "alloc_short") /* alloc_bulk returned fewer than asked */\
	X(BAD_FREE, "bad_free")       /* free_bulk of a buffer not held */
/* clang-format on */

/* clang-format off */
#define HG_NIC_FABRIC_COUNTERS(X)                                              \
	X(SENT, "sent")                 /* frames taken by any tx_burst */      \
	X(DELIVERED, "delivered")       /* frames put into any rx ring */       \
	X(DROPPED_LOSS, "dropped_loss")                                         \
	X(DUPLICATED, "duplicated")                                             \
	X(REORDERED, "reordered")                                               \
	X(CORRUPTED, "corrupted")                                               \
	X(RX_RING_OVERFLOW, "rx_ring_overflow")                                 \
	X(TX_RING_FULL, "tx_ring_full")                                         \
	X(OVERSIZE, "oversize")         /* tx_oversize + rx_oversize + runts */ \
	X(NO_ROUTE, "no_route")                                                 \
	X(REPLICATED, "replicated")     /* extra copies made for multicast */   \
	X(NOBUF, "nobuf")               /* copies lost: pool empty */           \
	X(ALLOC_SHORT, "alloc_short")                                           \
	X(BAD_FREE, "bad_free")                                                 \
	X(EVENTS, "events")             /* events processed by the clock */
/* clang-format on */

#define HG_NIC_ENUM_(name, str) HG_NIC_PC_##name,
enum hg_nic_port_counter {
	HG_NIC_PORT_COUNTERS(HG_NIC_ENUM_) HG_NIC_PC__COUNT
};
#undef HG_NIC_ENUM_
#define HG_NIC_ENUM_(name, str) HG_NIC_FC_##name,
enum hg_nic_fabric_counter {
	HG_NIC_FABRIC_COUNTERS(HG_NIC_ENUM_) HG_NIC_FC__COUNT
};
#undef HG_NIC_ENUM_

/* cdef-begin */
struct hg_nic_fabric;
struct hg_nic_port;

/* Link directions of a port, for hg_nic_port_set_faults(). */
#define HG_NIC_OUT 0 /* port -> switch (what the port sends) */
#define HG_NIC_IN 1  /* switch -> port (what the port receives) */

/* Limits. */
/* frames held back at once per stage; reorder_max bound */
#define HG_NIC_MAX_HOLD 64
#define HG_NIC_MAX_GROUPS 16 /* multicast groups per port */
#define HG_NIC_MAX_PORTS 1024

/* Trace event kinds (struct hg_nic_trace_rec.kind). */
#define HG_NIC_EV_TX 1          /* taken by tx_burst */
#define HG_NIC_EV_DELIVER 2     /* put into the rx ring of dst */
#define HG_NIC_EV_LOSS 3        /* lost by a fault stage */
#define HG_NIC_EV_DUP 4         /* duplicated by a fault stage */
#define HG_NIC_EV_CORRUPT 5     /* corrupted by a fault stage */
#define HG_NIC_EV_HOLD 6        /* held back by a fault stage (reordering) */
#define HG_NIC_EV_RX_OVERFLOW 7 /* dropped: rx ring of dst full */
#define HG_NIC_EV_OVERSIZE 8    /* dropped: longer than the MTU, or a runt */
#define HG_NIC_EV_NO_ROUTE 9    /* dropped: no port owns the destination */
#define HG_NIC_EV_NOBUF 10      /* a copy was not made: pool empty */

struct hg_nic_fabric_config {
	uint64_t seed;          /* seeds every fault stage */
	uint32_t pool_size;     /* packet buffers in the pool (0 = 8192) */
	uint16_t buf_size;      /* bytes per buffer (0 = 2048; >= 64) */
	uint16_t max_ports;     /* 0 = 64; at most HG_NIC_MAX_PORTS */
	uint32_t trace_records; /* records kept in the trace ring (0 = none) */
	bool trace_hash;        /* keep the running 64-bit trace hash */
	bool no_multicast; /* do not replicate multicast (dropped, no_route) */
	bool no_broadcast; /* do not flood ff:ff:ff:ff:ff:ff (no_route) */
};

struct hg_nic_port_config {
	uint8_t mac[6];    /* unicast, unique on the fabric */
	uint32_t ipv4;     /* host byte order (reported by get_info) */
	uint16_t udp_port; /* host byte order (reported by get_info) */
	uint16_t mtu;      /* largest IP packet (0 = 1500) */
	uint32_t rx_ring;  /* rx descriptors (0 = 1024) */
	uint32_t tx_ring;  /* tx descriptors (0 = 1024) */
	uint64_t rate_bps; /* line rate of the port's link (0 = unlimited) */
	uint64_t prop_delay_ns; /* propagation delay, each direction of the link */
};

/* Faults of one direction of one port's link; all zero = a perfect link. */
struct hg_nic_faults {
	double loss;          /* probability a frame is lost */
	double dup;           /* probability a frame is duplicated */
	double corrupt;       /* probability one byte is flipped */
	double reorder;       /* probability a frame is held back ... */
	uint32_t reorder_max; /* ... until 1..reorder_max later frames passed it */
	uint64_t reorder_timeout_ns; /* ... or this long (0 = 100000) */
	uint64_t delay_ns;           /* extra fixed delay */
	uint64_t jitter_ns;          /* extra uniform delay in [0, jitter_ns] */
};

struct hg_nic_trace_rec {
	uint64_t t_ns; /* virtual time of the event */
	uint64_t hash; /* hash of the frame bytes */
	uint16_t src;  /* sending port id */
	uint16_t dst;  /* receiving port id (0xffff: none yet) */
	uint16_t len;  /* frame length */
	uint8_t kind;  /* HG_NIC_EV_* */
	uint8_t dir;   /* HG_NIC_OUT / HG_NIC_IN for fault events */
};

/*
 * Create a fabric (cfg NULL = all defaults).  Returns NULL on a bad config
 * (errno EINVAL: buf_size < 64, max_ports > HG_NIC_MAX_PORTS) or when
 * memory runs out (ENOMEM).  Every buffer is allocated here, none later.
 */
struct hg_nic_fabric *hg_nic_fabric_create(const struct hg_nic_fabric_config *cfg);
/* Destroy the fabric and all its ports (NULL is fine). */
void hg_nic_fabric_destroy(struct hg_nic_fabric *f);

/*
 * Create a port on the fabric; it lives until the fabric is destroyed.
 * Returns NULL (errno EINVAL) for a multicast/zero MAC, a MAC already used,
 * mtu < 68 or mtu + 14 > buf_size; ERANGE when max_ports ports exist;
 * ENOMEM.
 */
struct hg_nic_port *hg_nic_port_create(struct hg_nic_fabric *f,
				       const struct hg_nic_port_config *cfg);
/* The port interface of a NIC port (valid as long as the fabric). */
struct hg_port *hg_nic_port_get(struct hg_nic_port *p);
/* Port id: 0, 1, ... in creation order (trace records, pkt->meta). */
int hg_nic_port_id(const struct hg_nic_port *p);
/* The n-th port of the fabric, or NULL. */
struct hg_nic_port *hg_nic_fabric_port(struct hg_nic_fabric *f, unsigned id);

/*
 * Set the faults of one direction of the port's link (HG_NIC_OUT or
 * HG_NIC_IN).  -EINVAL: bad direction, a probability outside [0, 1] or NaN,
 * reorder > 0 with reorder_max 0 or > HG_NIC_MAX_HOLD.  Frames already held
 * back stay held until released.
 */
int hg_nic_port_set_faults(struct hg_nic_port *p, int dir,
			   const struct hg_nic_faults *faults);

/*
 * Join / leave an IPv4 multicast group (host byte order, 224.0.0.0/4).
 * Frames to its MAC (01:00:5e + low 23 bits) then reach this port.
 * -EINVAL: not a multicast address; -ENOSPC: HG_NIC_MAX_GROUPS joined;
 * -ENOENT (leave): not joined.  Joining twice is a no-op.
 */
int hg_nic_port_join(struct hg_nic_port *p, uint32_t group_ipv4);
int hg_nic_port_leave(struct hg_nic_port *p, uint32_t group_ipv4);

/* Virtual time in ns. */
uint64_t hg_nic_now(const struct hg_nic_fabric *f);
/*
 * Move the clock to t (advance: by ns), processing in time order every
 * event due at or before t: frames reach the switch, fault stages release
 * held frames, frames are put into rx rings.  -EINVAL if t < now.
 */
int hg_nic_advance_to(struct hg_nic_fabric *f, uint64_t t);
int hg_nic_advance(struct hg_nic_fabric *f, uint64_t ns);
/* Time of the earliest pending event into *t; false if nothing is pending. */
bool hg_nic_next_event(const struct hg_nic_fabric *f, uint64_t *t);
/* Frames inside the fabric (in flight or held back), not in rx rings. */
uint32_t hg_nic_in_flight(const struct hg_nic_fabric *f);
/* Buffers free in the pool. */
uint32_t hg_nic_pool_free(const struct hg_nic_fabric *f);
/* Frames waiting in the port's rx ring. */
uint32_t hg_nic_port_rx_pending(const struct hg_nic_port *p);

/* Counters: the number of them, their names, a snapshot (returns count). */
unsigned hg_nic_port_counter_count(void);
const char *hg_nic_port_counter_name(unsigned i);
unsigned hg_nic_port_counters(const struct hg_nic_port *p, uint64_t *out,
			      unsigned n);
unsigned hg_nic_fabric_counter_count(void);
const char *hg_nic_fabric_counter_name(unsigned i);
unsigned hg_nic_fabric_counters(const struct hg_nic_fabric *f, uint64_t *out,
				unsigned n);

/* Running hash of every trace event (0 unless trace_hash), events so far. */
uint64_t hg_nic_trace_hash(const struct hg_nic_fabric *f);
uint64_t hg_nic_trace_count(const struct hg_nic_fabric *f);
/* Copy the last (at most n) records of the trace ring, oldest first. */
unsigned hg_nic_trace_copy(const struct hg_nic_fabric *f,
			   struct hg_nic_trace_rec *out, unsigned n);

/*
 * Bulk helpers for tests, benchmarks and Python (not for the packet path):
 * send n frames packed back to back in buf (lengths in lens) through the
 * port's tx_burst; returns how many were taken (stops at the first refusal
 * or when the pool is empty).  recv takes up to n frames from the rx ring,
 * copies them packed into buf (stops before a frame that does not fit in
 * cap), writes lens and, if src is not NULL, the sending port ids, frees
 * the buffers and returns how many.
 */
uint32_t hg_nic_port_send_frames(struct hg_nic_port *p, const uint8_t *buf,
				 const uint16_t *lens, uint32_t n);
uint32_t hg_nic_port_recv_frames(struct hg_nic_port *p, uint8_t *buf, size_t cap,
				 uint16_t *lens, uint16_t *src, uint32_t n);

/*
 * The port's hg_port ops, called through the ops table exactly as the
 * engine calls them (hg_port_rx() etc. of homagg/port.h); struct hg_port is
 * opaque to Python, so tests and the Python layer use these.
 */
uint16_t hg_nic_port_rx_burst(struct hg_nic_port *p, struct hg_pkt **pkts,
			      uint16_t n);
uint16_t hg_nic_port_tx_burst(struct hg_nic_port *p, struct hg_pkt **pkts,
			      uint16_t n);
uint16_t hg_nic_port_alloc_bulk(struct hg_nic_port *p, struct hg_pkt **pkts,
				uint16_t n);
void hg_nic_port_free_bulk(struct hg_nic_port *p, struct hg_pkt **pkts, uint16_t n);
int hg_nic_port_get_info(struct hg_nic_port *p, struct hg_port_info *info);
uint64_t hg_nic_port_now(struct hg_nic_port *p);
int hg_nic_port_join_group(struct hg_nic_port *p, uint32_t group_ipv4);
/* cdef-end */

#ifdef __cplusplus
}
#endif

#endif /* HOMAGG_NIC_H */
