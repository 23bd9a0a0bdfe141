/* SPDX-License-Identifier: Apache-2.0 */
/*
 * homagg/client.h - the worker client: one allreduce as an event-driven
 * state machine over a port (homagg/port.h).
 *
 * No threads and no blocking inside: hg_client_start() prepares an
 * allreduce, every hg_client_poll() receives a burst, places the results
 * that arrived, advances the phases (protocol.h lists them per method), sends
 * new chunks within the window of S chunks and retransmits the chunks whose
 * timer expired.  The caller polls again at the latest at *next_deadline_ns
 * (the port's clock), or as soon as a packet may have arrived.
 *
 * Chunks are numbered with one 64-bit counter per job, running on across
 * the phases of one allreduce and across successive allreduces: every
 * worker of the job computes the same phase sizes from global data, so they
 * all agree on every number.  A job may name K aggregators: chunk c goes to
 * aggregator c % K with sequence number c / K there (docs/PROTOCOL.md,
 * "Several aggregators"); with K = 1 the sequence number is c.  At each
 * aggregator, seq uses slot seq % S and shadow set (seq / S) % 2, and seq + S
 * is sent only after the result of seq arrived (a window of S per
 * aggregator).
 *
 * The retransmission timeout adapts to the round trip (RFC 6298: SRTT,
 * RTTVAR, Karn's rule, exponential backoff), one estimator per aggregator,
 * between rto_min_ns and rto_max_ns; hg_client_stats and
 * hg_client_get_agg_stats report it.
 *
 * docs/PROTOCOL.md ("Worker state machine") describes the protocol side.
 */
#ifndef HOMAGG_CLIENT_H
#define HOMAGG_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "homagg/auth.h"
#include "homagg/codec.h"
#include "homagg/port.h"
#include "homagg/protocol.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * HG_FOREACH_CLIENT_STAT(X, P): the fields of struct hg_client_stats, one
 * table.  X(type, name, doc) is a scalar field, P(name, doc) a uint64_t per
 * phase (an array indexed by enum hg_phase).  It generates the struct and
 * the name table behind hg_client_stat_name(); Python reads the fields
 * through it (homagg.bindings.client.client_stats_dict).
 */
/* clang-format off */
#define HG_FOREACH_CLIENT_STAT(X, P)                                           \
	X(uint64_t, packets_sent, "every chunk transmission, retransmissions included") \
	X(uint64_t, retransmissions, "transmissions after the first of a chunk") \
	X(uint64_t, timeouts, "retransmission timer expiries")                 \
	X(uint64_t, spurious_timeouts, "expiries whose chunk had not been lost (a STATUS showed our contribution, or the result came twice)") \
	X(uint64_t, fast_retransmissions, "resent on a gap or a STATUS, without a timer") \
	X(uint64_t, window_retransmissions, "resent with a stalled window: a chunk of its aggregator timed out again (docs/PROTOCOL.md)") \
	X(uint64_t, start_probes, "resent when the first answer of a step was late: a peer may not have started it; not timeouts (docs/PROTOCOL.md \"Peers that start late\")") \
	X(uint64_t, results_received, "result packets placed (first copy of a chunk)") \
	X(uint64_t, duplicates_received, "result packets for chunks already placed") \
	X(uint64_t, status_received, "STATUS replies (slot bitmaps)")          \
	X(uint64_t, packets_ignored, "received frames that were not for this client") \
	X(uint64_t, tx_refused, "packets the port did not take (resent later)") \
	X(uint64_t, flight_ns, "sum over results of the time their chunk was in flight (first transmission to result): / allreduce time = mean window occupancy") \
	X(uint64_t, window_full_ns, "time a numbered chunk waited for its slot (the window of its aggregator was full)") \
	P(bytes_sent, "HomAgg payload bytes sent, per enum hg_phase")          \
	P(bytes_received, "result payload bytes placed, per phase")           \
	X(uint64_t, chunks, "distinct chunks of the allreduces so far")       \
	X(uint64_t, stalled_blocks, "lhc: blocks whose peeling stalled")      \
	X(uint64_t, fallback_lanes, "lhc: lanes of the fallback phase")       \
	X(int, method_chosen, "method of the last allreduce (auto: the one chosen by the most block groups)") \
	X(uint32_t, auto_dense_groups, "auto: block groups of the last allreduce that sent dense values") \
	X(uint32_t, auto_blocks_groups, "auto: block groups that sent blocks values") \
	X(uint32_t, auto_union_groups, "auto: block groups that sent union values") \
	X(uint64_t, next_seq, "next chunk number c of the job (K = 1: its seq)") \
	X(uint64_t, srtt_ns, "smoothed round-trip time (0 before the first sample)") \
	X(uint64_t, rttvar_ns, "its mean deviation")                          \
	X(uint64_t, rto_ns, "current retransmission timeout, backoff included") \
	X(uint64_t, rtt_samples, "RTT samples taken (results of chunks sent once)") \
	X(uint32_t, aggregators, "K; srtt/rttvar/rto above are of the aggregator with the longest timeout, rtt_samples the total") \
	X(uint64_t, start_wait_ns, "current wait for the first result of a step (the longer of an allreduce's first step's and a later step's)") \
	X(uint64_t, rto_floor_ns, "the floor of the timeout spurious timeouts taught (0: none; of that same aggregator)") \
	X(uint64_t, bad_mac, "replies dropped: MAC missing, wrong, or present on a job without auth") \
	X(uint32_t, groups, "block groups of the last allreduce (1: not pipelined)") \
	X(uint64_t, input_nonzeros, "elements of the last allreduce's input that are not 0 (-0.0 is 0), counted by the scan of lhc, union and auto (no extra pass); UINT64_MAX: not counted (dense, blocks, nc)")
/* clang-format on */

/* cdef-begin */
/* Defaults used when a config field is 0. */
#define HG_CLIENT_DEFAULT_RTO_NS 1000000
#define HG_CLIENT_DEFAULT_RTO_MAX_NS 100000000
#define HG_CLIENT_DEFAULT_RTO_MIN_NS 100000
/* G of RFC 6298: the least margin above SRTT (the blocking form's sleep). */
#define HG_CLIENT_RTO_GRANULARITY_NS 50000
#define HG_CLIENT_DEFAULT_GIVE_UP_NS 2000000000
#define HG_CLIENT_MAX_SLOTS 65535
/* The largest pipe gain (hg_client_config.pipe_gain_pct): g = 10. */
#define HG_CLIENT_MAX_PIPE_GAIN_PCT 1000

/* Aggregators one job may be spread over (the header's shard is one byte). */
#define HG_CLIENT_MAX_AGGREGATORS 64

/* One aggregator of a job spread over several (hg_client_config.aggs). */
struct hg_client_agg {
	uint8_t mac[6];    /* its MAC (next hop) */
	uint32_t ipv4;     /* its IPv4 address (host order) */
	uint16_t udp_port; /* its UDP port (0 = HG_UDP_PORT) */
};

struct hg_client_config {
	struct hg_port *port; /* the worker's port (not owned) */
	uint32_t job;         /* job id */
	uint32_t token;       /* job token */
	uint32_t worker;      /* this worker's id, 0..workers-1 */
	uint32_t workers;     /* W */
	uint32_t slots; /* S: slots of the job at each aggregator = window there */
	uint32_t payload_bytes; /* largest payload, multiple of 4, <= HG_MAX_PAYLOAD */
	uint8_t agg_mac[6];    /* aggregator's MAC (naggs == 0) */
	uint32_t agg_ipv4;     /* aggregator's IPv4 address (host order) */
	uint16_t agg_udp_port; /* aggregator's UDP port (0 = HG_UDP_PORT) */
	uint32_t naggs; /* K aggregators listed in aggs; 0 = the one above */
	const struct hg_client_agg *aggs; /* K entries in the job's order (index =
				    * shard); copied by hg_client_create */
	uint32_t group_ipv4; /* result multicast group; 0 = unicast results */
	uint64_t rto_ns; /* initial retransmission timeout (no RTT sample yet) */
	uint32_t backoff_num; /* timeout *= backoff_num / backoff_den per retry */
	uint32_t backoff_den; /*   (0/0 = 2/1) */
	uint64_t rto_max_ns;  /* upper clamp of the retransmission timeout */
	uint64_t give_up_ns; /* a chunk unanswered this long ends the allreduce */
	uint64_t rto_min_ns; /* lower clamp of the timeout computed from RTT samples
				    * (0 = min(HG_CLIENT_DEFAULT_RTO_MIN_NS, rto_ns)) */
	uint64_t rto_granularity_ns; /* G: the least 4 RTTVAR of the timeout and
				    * the least turn (docs/PROTOCOL.md Part 3,
				    * "Retransmission and backoff"); 0 =
				    * HG_CLIENT_RTO_GRANULARITY_NS, at most
				    * rto_max_ns */
	uint32_t incarnation; /* this worker's life, carried by every frame;
				    * 0 = hg_wire_incarnation_now() (a restarted
				    * worker passes one greater than before) */
	uint64_t start_wait_ns; /* least wait for the first result of a step, which
				    * includes the slowest peer's computing (0 = 4 rto_ns) */
	uint32_t pipeline_groups; /* block groups of every method but auto, the same on
				    * every worker (docs/PROTOCOL.md "Pipelined block
				    * groups"): 0 = automatic (8 groups, each at least
				    * four windows of dense values), 1 = no pipelining,
				    * N = N groups */
	uint8_t auth;             /* 1: the job authenticates every frame */
	uint8_t secret[32]; /* auth: the job secret (HG_AUTH_SECRET_LEN) of key
				    * epoch `epoch`; the client keeps only its key
				    * and the aggregator's, and wipes this copy */
	uint32_t mac; /* auth: HG_MAC_* of the job, 0 = hg_auth_default_mac() */
	uint8_t epoch;        /* auth: the key epoch of secret (0 at add_job) */
	uint32_t agg_worker;  /* wire worker id at its aggregator (a tree leaf's
				    * index of it, docs/PROTOCOL.md "Tree"); worker
				    * and workers above stay the codec's */
	uint32_t agg_workers; /* W at its aggregator; 0 = workers (and agg_worker
				    * = worker).  The leaf serves workers worker -
				    * agg_worker .. + agg_workers - 1 (errors name them) */
	uint32_t pipe_gain_pct; /* the pipe's gain g in hundredths (docs/PROTOCOL.md
				    * Part 3, "The pipe"): first transmissions wait
				    * while an aggregator's pipe holds cwnd chunks,
				    * cwnd settling where the round trip is g times
				    * its least; 0 = no bound but the slots, at most
				    * HG_CLIENT_MAX_PIPE_GAIN_PCT */
	uint32_t pipe_max;   /* with pipe_gain_pct, the pipe's cap: cwnd within
				    * [4, min(slots, pipe_max)] (docs/PROTOCOL.md
				    * "Slots beyond the ring's share"); 0 = slots */
	struct hg_cost cost; /* the job's cost model (docs/PROTOCOL.md "The cost
				    * model"), the same on every worker: used by every
				    * allreduce whose hg_params.cost names no link rate;
				    * its payload_bytes is always this config's */
};

struct hg_client_stats {
#define HG_CS_FIELD_(type, name, doc) type name;
#define HG_CS_PER_PHASE_(name, doc) uint64_t name[HG_PH__COUNT];
	HG_FOREACH_CLIENT_STAT(HG_CS_FIELD_, HG_CS_PER_PHASE_)
#undef HG_CS_FIELD_
#undef HG_CS_PER_PHASE_
};

/*
 * The fields of struct hg_client_stats in table order: their count, the
 * name of field i (NULL past the end), and whether it is per phase (an
 * array indexed by enum hg_phase).
 */
unsigned hg_client_stat_count(void);
const char *hg_client_stat_name(unsigned i);
bool hg_client_stat_per_phase(unsigned i);

/* What a worker exchanged with one of its aggregators. */
struct hg_client_agg_stats {
	uint64_t packets_sent; /* transmissions, retransmissions included */
	uint64_t retransmissions;
	uint64_t timeouts;          /* timer expiries of its chunks */
	uint64_t spurious_timeouts; /* of which its chunk had not been lost */
	uint64_t fast_retransmissions;   /* resent on a gap or a STATUS */
	uint64_t window_retransmissions; /* resent with its stalled window */
	uint64_t results_received;       /* first copies of results */
	uint64_t status_received;
	uint64_t bytes_sent;     /* HomAgg payload bytes sent to it */
	uint64_t bytes_received; /* result payload bytes placed from it */
	uint64_t chunks;         /* distinct chunks assigned to it */
	uint64_t next_seq; /* its next sequence number (wraps at 2^32 on the wire) */
	uint64_t srtt_ns, rttvar_ns, rto_ns, rtt_samples;
	uint64_t rto_floor_ns; /* the floor of rto_ns spurious timeouts taught (0: none) */
	uint64_t pipe_limit; /* the pipe's bound cwnd in chunks (0: no bound) */
	uint64_t rtt_min_ns; /* Rmin, the least RTT sample of the last 10-20 s */
};

struct hg_client;

/*
 * NULL on failure, with errno set to the reason (a positive errno):
 * EINVAL (a bad configuration field), ENOMEM, EMSGSIZE (the payload and
 * its headers exceed the port's MTU), or the port's own error from
 * get_info or join_group (for example EADDRNOTAVAIL, ENODEV).
 */
struct hg_client *hg_client_create(const struct hg_client_config *cfg);
void hg_client_destroy(struct hg_client *c);

/*
 * Begin one allreduce of x (n floats) into y (n floats, written when it
 * completes).  p->workers and p->worker are taken from the config.  x and y
 * must stay valid until the allreduce ends.  Returns 0; -EBUSY (one is in
 * progress), -EINVAL / -ERANGE (parameters), -EDOM (x holds NaN or Inf),
 * -ENOMEM.
 */
int hg_client_start(struct hg_client *c, const struct hg_params *p, int method,
		    const float *x, size_t n, float *y);

/*
 * Make progress without blocking.  Returns 1 when the allreduce is complete
 * (y holds the result), 0 while in progress, or a negative errno: -ETIMEDOUT
 * (a chunk got no result within give_up_ns; hg_client_error_text() names the
 * chunk, the phase and the missing workers), -ECONNRESET (the aggregator's
 * incarnation changed during the allreduce: it restarted; the text names it
 * and both incarnations), -EPROTO, -ENOMEM, -EINVAL (no allreduce started).  *next_deadline_ns (may be NULL) is set to the port
 * time at which the client needs to be polled again even if nothing arrives
 * (UINT64_MAX when none).
 */
int hg_client_poll(struct hg_client *c, uint64_t *next_deadline_ns);

/*
 * Blocking form for real-time ports: start, then poll until done; between
 * polls it blocks in the port's wait op (kernel UDP: ppoll on the sockets
 * with a nanosecond timeout) until a frame arrives or the next deadline,
 * so a result wakes it at once and an idle worker uses no CPU.  Ports
 * without a wait op sleep until the deadline, at most 50 us at a time.
 * Same returns as hg_client_start / hg_client_poll, 0 on success.
 */
int hg_client_allreduce(struct hg_client *c, const struct hg_params *p,
			int method, const float *x, size_t n, float *y);

/*
 * Give the client the secret (HG_AUTH_SECRET_LEN bytes) of key epoch
 * `epoch` (its current one + 1; docs/PROTOCOL.md "Key epochs"): it verifies
 * replies of that epoch at once and sends with it from its first verified
 * reply of it or its next retransmission.  Returns 0, -EINVAL (NULL, or
 * epoch not the next), -EPERM (no auth), -ENOTSUP.  The caller wipes its
 * secret.
 */
int hg_client_rotate_key(struct hg_client *c, const uint8_t *secret,
			 uint32_t epoch);

/* Is an allreduce in progress? */
bool hg_client_busy(const struct hg_client *c);

/* The reason of the last error, "" when none. */
const char *hg_client_error_text(const struct hg_client *c);

int hg_client_get_stats(const struct hg_client *c, struct hg_client_stats *st);
/* Aggregator k's share (0..K-1).  Returns 0, -EINVAL or -ERANGE (k >= K). */
int hg_client_get_agg_stats(const struct hg_client *c, uint32_t k,
			    struct hg_client_agg_stats *st);
/* cdef-end */

#ifdef __cplusplus
}
#endif

#endif /* HOMAGG_CLIENT_H */
