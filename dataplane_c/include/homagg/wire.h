/* SPDX-License-Identifier: Apache-2.0 */
/*
 * homagg/wire.h - the HomAgg packet: Ethernet / IPv4 / UDP / HomAgg header /
 * payload lanes.  Every multi-byte field is big-endian (network order).
 * docs/PROTOCOL.md describes every byte; this header is its C form.
 *
 *   off size field
 *    0   1   version      HG_PROTOCOL_VERSION
 *    1   1   op           enum hg_op
 *    2   2   flags        HG_FLAG_*; bits 8..15: key epoch (with HG_FLAG_AUTH)
 *    4   4   job          job id
 *    8   4   token        job token (the job selector; a secret only
 *                         without authentication)
 *   12   2   worker       worker id, 0..W-1 (HG_WORKER_ALL in a multicast result)
 *   14   2   slot         seq mod S
 *   16   4   seq          chunk sequence number of the job at this aggregator
 *   20   2   lanes        payload lanes (payload bytes = lanes * in-lane size)
 *   22   1   exp          signed; the NC8 "top" shift, 0 for other ops
 *   23   1   shard        index of the aggregator the chunk belongs to, 0..K-1
 *   24   4   incarnation  sender's life: the worker's, or in a reply the
 *                         aggregator's incarnation of the job; never 0
 *   28   4   nonce        with HG_FLAG_AUTH the sender's MAC counter (low
 *                         32 bits), else 0
 *   32   ..  payload
 *   ..   16  MAC          only with HG_FLAG_AUTH (docs/PROTOCOL.md)
 */
#ifndef HOMAGG_WIRE_H
#define HOMAGG_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* cdef-begin */
#define HG_UDP_PORT 48879
#define HG_HDR_LEN 32
/* The MAC trailer of an authenticated frame (HG_FLAG_AUTH). */
#define HG_MAC_LEN 16
#define HG_ETH_IP_UDP_LEN 42
/* Default and largest payload: 1024 bytes = 256 int32 lanes. */
#define HG_DEFAULT_PAYLOAD 1024
#define HG_MAX_PAYLOAD 8192

#define HG_FLAG_RESULT 1
#define HG_FLAG_RETRANS 2
#define HG_FLAG_SHADOW 4
#define HG_FLAG_OVERFLOW 8
/* Aggregator -> worker: the slot is incomplete; payload = worker bitmap. */
#define HG_FLAG_STATUS 16
/* Both directions: a HG_MAC_LEN-byte MAC follows the payload. */
#define HG_FLAG_AUTH 32
/* With HG_FLAG_STATUS: a loss report, sent unasked because a worker the
 * set lacks has sent a later chunk (docs/PROTOCOL.md "Loss reports"). */
#define HG_FLAG_LOSS 64
/* In a job of more than this many workers only a chunk's first loss report
 * goes to the job's group, the later ones to the worker they name, and a
 * worker of a flat job takes no RTT sample from a chunk a STATUS came for
 * before it sent it (docs/PROTOCOL.md "Loss reports"). */
#define HG_REPORT_GROUP_MAX 128

struct hg_hdr {
	uint8_t version;
	uint8_t op;
	uint16_t flags;
	uint32_t job;
	uint32_t token;
	uint16_t worker;
	uint16_t slot;
	uint32_t seq;
	uint16_t lanes;
	int8_t exp;
	uint8_t shard;
	uint32_t incarnation;
	uint32_t nonce;
};

/* Worker field of a multicast result (addressed to every worker). */
#define HG_WORKER_ALL 65535

/* The longest STATUS payload: the worker and active bitmaps (2 x 32 bytes),
 * then a tree leaf's view of its root: L (2), the root's two bitmaps (2 x
 * 32) and the missing-below bitmap (32) (docs/PROTOCOL.md "Tree"). */
#define HG_STATUS_MAX_PAYLOAD 162
/* Flags a worker may set; RESULT and STATUS are the aggregator's. */
#define HG_FLAGS_WORKER 46
/* Bits 8..15 of the flags: the key epoch of an authenticated frame. */
#define HG_FLAG_EPOCH_SHIFT 8
#define HG_FLAGS_KNOWN 65407

/* hg_wire_parse / hg_wire_build flags */
/* Verify (parse) or fill in (build) the UDP checksum.  Without it a parsed
 * frame's UDP checksum is ignored and a built one carries 0 (none). */
#define HG_WIRE_F_UDP_CSUM 1

/* An endpoint: Ethernet address, IPv4 address and UDP port (host order). */
struct hg_wire_addr {
	uint8_t mac[6];
	uint32_t ipv4;
	uint16_t port;
};

/* How hg_wire_build_mac() authenticates a frame (homagg/auth.h). */
struct hg_wire_mac {
	uint32_t alg;     /* HG_MAC_* */
	uint32_t dir;     /* HG_AUTH_DIR_* */
	uint64_t counter; /* the sender's MAC counter of this frame */
	uint8_t key[32];  /* HG_AUTH_KEY_LEN */
};

/* A validated frame: its addresses, its header in host byte order and
 * where its payload is (frame + payload_off, payload_len bytes). */
struct hg_wire_view {
	struct hg_wire_addr src;
	struct hg_wire_addr dst;
	struct hg_hdr hdr;
	uint16_t payload_off;
	uint16_t payload_len;
};

/*
 * Validate a frame and fill *v.  udp_port: the destination port to accept
 * (0 = any).  Returns 0 for a valid frame, else the drop reason as a
 * counter index (enum hg_counter in homagg/counters.h, > 0), or -EINVAL for
 * a NULL frame or view.  Checks, in order: Ethernet type, IPv4 header
 * (version, IHL, fragments, lengths, checksum), UDP (protocol, port, length,
 * checksum with HG_WIRE_F_UDP_CSUM), HomAgg version (HG_PROTOCOL_VERSION;
 * nothing else of an other version is read), flags, incarnation (not 0),
 * reserved bytes, op, the MAC trailer's presence (HG_FLAG_AUTH: 16 bytes
 * after the payload, not verified here), and the payload length: lanes *
 * in-lane bytes for data, lanes * accumulator-lane bytes for a RESULT,
 * 1..HG_STATUS_MAX_PAYLOAD bytes for a STATUS (its worker and active
 * bitmaps, then in a tree the view of docs/PROTOCOL.md "Who is missing in
 * a tree").  With HG_FLAG_AUTH the MAC is at
 * frame + payload_off + payload_len.  It reads nothing outside frame[0..len).
 */
int hg_wire_parse(const uint8_t *frame, size_t len, uint16_t udp_port,
		  uint32_t flags, struct hg_wire_view *v);

/*
 * Write a whole frame (Ethernet, IPv4, UDP, HomAgg header, payload, and
 * with HG_FLAG_AUTH in hdr->flags the 16-byte MAC) to frame[0..cap) from
 * src to dst.  hdr is in host byte order; payload may be NULL when
 * payload_len is 0.  hg_wire_build() writes an all-zero MAC (a frame that
 * fails verification, for tests); hg_wire_build_mac() with m sets
 * HG_FLAG_AUTH, the nonce field (m->counter's low 32 bits) and writes the
 * MAC of algorithm m->alg keyed with m->key, direction m->dir (the key
 * epoch is hdr->flags' high byte; NULL m: as hg_wire_build).  Returns the frame
 * length, -EINVAL (NULL argument), -ERANGE (payload longer than
 * HG_MAX_PAYLOAD), -ENOSPC (cap too small), -ENOTSUP (m->alg unknown or
 * not available on this host).  The IPv4 checksum is always
 * filled in.
 */
int hg_wire_build(uint8_t *frame, size_t cap, const struct hg_wire_addr *src,
		  const struct hg_wire_addr *dst, const struct hg_hdr *hdr,
		  const uint8_t *payload, size_t payload_len, uint32_t flags);
int hg_wire_build_mac(uint8_t *frame, size_t cap, const struct hg_wire_addr *src,
		      const struct hg_wire_addr *dst, const struct hg_hdr *hdr,
		      const uint8_t *payload, size_t payload_len,
		      uint32_t flags, const struct hg_wire_mac *m);

/*
 * A fresh incarnation (docs/PROTOCOL.md "Incarnations"): the low 32 bits of
 * CLOCK_REALTIME in milliseconds, 1 instead of 0.  A later life started more
 * than a millisecond later gets a greater one (RFC 1982 order, for 24 days).
 */
uint32_t hg_wire_incarnation_now(void);

/* Is incarnation a older than b (RFC 1982 serial arithmetic)? */
bool hg_wire_incarnation_older(uint32_t a, uint32_t b);

/* The Ethernet address of an IPv4 multicast group (01:00:5e + low 23 bits). */
void hg_wire_mcast_mac(uint32_t group_ipv4, uint8_t mac[6]);

/* The counter table (homagg/counters.h): how many, and each one's name. */
int hg_counter_count(void);
const char *hg_counter_name(int i);
/* The per-worker counter table (HG_FOREACH_WORKER_COUNTER). */
int hg_worker_counter_count(void);
const char *hg_worker_counter_name(int i);
/* cdef-end */

#ifdef __cplusplus
}
#endif

#endif /* HOMAGG_WIRE_H */
