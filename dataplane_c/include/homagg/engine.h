/* SPDX-License-Identifier: Apache-2.0 */
/*
 * homagg/engine.h - the aggregation engine (the data path of an aggregator).
 *
 * An engine owns no port: it receives from and transmits to the struct
 * hg_port it is created with (DPDK, the NIC model, port_mem).  Several
 * engines may live in one process; nothing is global.
 *
 * A job is W workers, a token, S slots and a payload size.  Chunk seq uses
 * slot seq % S and shadow set (seq / S) % 2; each set keeps the chunk's seq,
 * an accumulator, a 256-bit worker bitmap and a count.  A packet:
 *   - for a newer seq than its set holds: starts the set over (the set's
 *     previous chunk is complete everywhere by construction of the window);
 *   - for an older seq: dropped (counter "stale");
 *   - from a worker already counted: not added again ("duplicates"); if the
 *     slot is complete the result goes again to that worker only
 *     ("replays"); if not, and the packet is flagged RETRANS, a STATUS frame
 *     with the slot's worker bitmap goes to the job's group, or to that
 *     worker when there is none, or to it and the missing workers when the
 *     group already had this bitmap ("status_sent", "status_repeats");
 *   - otherwise: combined into the accumulator; when W have contributed, the
 *     result goes to every worker: once to the job's multicast group if the
 *     port replicates and a group is set, else one unicast per worker.
 * Sequence numbers compare in serial-number arithmetic (RFC 1982), so they
 * may wrap.  Worker addresses are learned from their valid packets.
 *
 * Incarnations (docs/PROTOCOL.md): the engine keeps per job and worker the
 * greatest incarnation it accepted; a frame of an older one is dropped
 * ("old_incarnation"), a greater one replaces it and clears every
 * incomplete slot holding the worker's earlier contribution
 * ("incarnation_resets").  Replies carry the job's incarnation and shard.
 *
 * Tree (docs/PROTOCOL.md "Tree"): a job whose config names a parent (up)
 * is a leaf.  A set complete there goes up to the root as one request of
 * worker up_worker (NC8 accumulators as SUM32) and waits, resent on a timer
 * served by hg_engine_poll(), until the root's RESULT arrives; that result
 * then goes to the leaf's workers.  Only a leaf accepts RESULT and STATUS
 * frames, and only from its root.
 *
 * The packet path allocates nothing and logs nothing: memory is allocated by
 * hg_engine_create() and hg_engine_add_job().  The control calls
 * (add/remove job) must not run concurrently with poll/process.
 * docs/PROTOCOL.md describes every drop reason and counter.
 */
#ifndef HOMAGG_ENGINE_H
#define HOMAGG_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "homagg/auth.h"
#include "homagg/kernels.h"
#include "homagg/port.h"
#include "homagg/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cdef-begin */
#define HG_ENGINE_MAX_JOBS 4096
#define HG_ENGINE_MAX_SLOTS 65535
#define HG_ENGINE_MAX_BURST 256

/* hg_engine_config.flags */
/* Verify non-zero UDP checksums of received frames and fill in the UDP
 * checksum of sent ones (set by hg_engine_config_init; clear it when the
 * port offloads checksums). */
#define HG_ENGINE_F_UDP_CSUM 1

struct hg_port;
struct hg_engine;

struct hg_engine_config {
	struct hg_port *port; /* receives from and transmits to; not owned */
	uint32_t max_jobs;    /* 1..HG_ENGINE_MAX_JOBS */
	uint16_t udp_port; /* UDP port accepted and sent from; 0 = HG_UDP_PORT */
	uint16_t burst; /* rx burst of hg_engine_poll, 1..HG_ENGINE_MAX_BURST */
	uint32_t flags; /* HG_ENGINE_F_* */
	enum hg_isa isa; /* kernels to use (tests force one) */
};

struct hg_job_config {
	uint32_t job;     /* job id */
	uint32_t token;   /* job selector (its secret only without auth) */
	uint32_t workers; /* W, 1..HG_MAX_WORKERS */
	uint32_t slots;   /* S, 1..HG_ENGINE_MAX_SLOTS */
	uint32_t payload_bytes; /* largest result payload, 4..HG_MAX_PAYLOAD */
	uint32_t group_ipv4;    /* multicast group (host order), 0 = none */
	uint8_t shard;        /* this aggregator's index k among the job's K */
	uint32_t incarnation; /* the job's incarnation in replies;
				  * 0 = hg_wire_incarnation_now() */
	uint8_t auth;         /* 1: every frame carries a MAC (homagg/auth.h) */
	uint8_t secret[32]; /* auth: the job secret (HG_AUTH_SECRET_LEN) of key
				  * epoch 0; the engine keeps only the keys derived
				  * from it and wipes this copy */
	uint32_t mac;       /* auth: HG_MAC_*, 0 = hg_auth_default_mac() */
	/* Tree (docs/PROTOCOL.md "Tree"): with up = 1 this aggregator is a
	 * leaf; a slot complete here goes up to the root as one request of
	 * worker up_worker and its workers get the root's result. */
	uint8_t up;         /* 1: a leaf with the parent below */
	uint8_t up_shard;   /* the root's shard index for the job */
	uint16_t up_worker; /* this leaf's worker id at the root */
	/* Who is missing in a tree (docs/PROTOCOL.md): the job's id of this
	 * leaf's first worker and the number of leaves L (0: the leaf sends
	 * no reports to the root and no root view to its workers). */
	uint16_t up_base;
	uint16_t up_leaves;
	uint8_t up_mac[6];      /* the root's MAC (next hop) */
	uint32_t up_ipv4;       /* the root's IPv4 address (host order) */
	uint16_t up_port;       /* the root's UDP port (0 = HG_UDP_PORT) */
	uint32_t up_group;      /* the root's result group, joined (0 = none) */
	uint64_t up_rto_ns;     /* upward retransmission timeout (0 = 1 ms) */
	uint64_t up_give_up_ns; /* stop resending a set after this (0 = 10 s) */
	/* A leaf of an auth job: its key as worker up_worker of the root's
	 * job, and the root's aggregator key (HG_AUTH_KEY_LEN bytes each,
	 * from the root job's secret; wiped like secret). */
	uint8_t up_key[32];
	uint8_t up_reply_key[32];
};

/* Defaults: max_jobs 64, HG_UDP_PORT, burst 32, HG_ENGINE_F_UDP_CSUM,
 * HG_ISA_BEST; port NULL (the caller sets it). */
void hg_engine_config_init(struct hg_engine_config *c);

/* NULL on a bad config (NULL port, a range) or when allocation fails. */
struct hg_engine *hg_engine_create(const struct hg_engine_config *c);
void hg_engine_destroy(struct hg_engine *e);

/*
 * Add a job; all its memory (2 * S accumulators of payload_bytes, the
 * worker table, with auth the W + 1 keys) is allocated here.  Returns 0,
 * -EINVAL (NULL), -EEXIST (job id in use), -ERANGE (W, S, payload, or
 * max_jobs reached), -ENOMEM, -ENOTSUP (auth: libsodium unusable, or the
 * MAC algorithm unknown or not available on this host), -EINVAL (up
 * without the root's address).
 */
int hg_engine_add_job(struct hg_engine *e, const struct hg_job_config *j);

/*
 * Register the next key epoch of auth job `job` (docs/PROTOCOL.md "Key
 * epochs"): secret (HG_AUTH_SECRET_LEN bytes) is the new epoch's; replies
 * use it at once; worker frames of the previous epoch are accepted for
 * grace_ns more, then dropped as bad_mac.  Returns the new epoch (0..255),
 * -EINVAL (NULL), -ENOENT (no such job), -EPERM (job without auth),
 * -ENOMEM.  The caller wipes its secret.  On a tree leaf only the keys
 * between the leaf and its workers change (hg_engine_rotate_up_key gives
 * the upward ones).
 */
int hg_engine_rotate_key(struct hg_engine *e, uint32_t job,
			 const uint8_t *secret, uint64_t grace_ns);
/*
 * Tree leaf `job` of an auth tree: the root's next key epoch's keys, key
 * (the leaf's as the root's worker up_worker) and reply_key (the root's
 * aggregator key), HG_AUTH_KEY_LEN bytes each (docs/PROTOCOL.md "Key
 * epochs in a tree").  The leaf verifies root replies of both epochs and
 * sends up with the new keys from the first root reply of the new epoch
 * or its first resend up.  Returns the next upward epoch (0..255),
 * -EINVAL (NULL), -ENOENT, -EPERM (no auth, or no tree leaf), -ENOMEM.
 * The caller wipes its keys.
 */
int hg_engine_rotate_up_key(struct hg_engine *e, uint32_t job,
			    const uint8_t *key, const uint8_t *reply_key);
/* The job's configuration as the engine holds it (the incarnation chosen
 * when it was 0).  0, -EINVAL (NULL) or -ENOENT. */
int hg_engine_job_config(const struct hg_engine *e, uint32_t job,
			 struct hg_job_config *out);
/* 0 or -ENOENT.  Packets of the job are then dropped as unknown_job. */
int hg_engine_remove_job(struct hg_engine *e, uint32_t job);
/* Number of jobs configured. */
int hg_engine_job_count(const struct hg_engine *e);

/*
 * Receive one burst from the port, process it, transmit what it produced;
 * serve the leaf jobs' upward timers when one is due (hg_engine_timers).
 * Returns the number of frames received (0 when the port had none).
 */
int hg_engine_poll(struct hg_engine *e);

/*
 * Tree leaves: resend every partial sum whose upward timer is due (at the
 * port's clock) and transmit.  hg_engine_poll() calls it; a caller that
 * only uses hg_engine_process() calls it itself.  Returns the number of
 * requests resent, or -EINVAL.
 */
int hg_engine_timers(struct hg_engine *e);

/* When hg_engine_timers() has work next (port clock, ns): no later than the
 * earliest upward timer (a timer re-armed later leaves the earlier time,
 * which then finds nothing due); UINT64_MAX: no timer. */
uint64_t hg_engine_next_deadline(const struct hg_engine *e);

/*
 * Process n frames already received from the engine's port: the engine
 * takes them (each is freed to the port or reused for a reply), then
 * transmits what they produced.  Returns n.
 */
int hg_engine_process(struct hg_engine *e, struct hg_pkt **pkts, uint32_t n);

/*
 * Staged processing (the default): a burst is classified first (parse, the
 * checks against the job, the slot's set prefetched; frames of the usual
 * shape through a fast path of a few word compares), then applied frame by
 * frame in arrival order.  false handles each frame completely before the
 * next, always through the full parser; counters and results are the same
 * either way (a test knob and a baseline for `homagg bench engine
 * --one-at-a-time`).  0 or -EINVAL.
 */
int hg_engine_set_staging(struct hg_engine *e, bool staged);

/*
 * Copy the engine's counters (enum hg_counter order, names from
 * hg_counter_name()) into out[0..n); returns how many were copied
 * (min(n, hg_counter_count())).
 */
int hg_engine_counters(const struct hg_engine *e, uint64_t *out, size_t n);
/* The same for one job (frames dropped before the job is known are not
 * counted there).  Returns the count copied or -ENOENT. */
int hg_engine_job_counters(const struct hg_engine *e, uint32_t job,
			   uint64_t *out, size_t n);
/* One worker's counters of a job (enum hg_worker_counter order, names from
 * hg_worker_counter_name()).  Returns the count copied (min(n,
 * hg_worker_counter_count())), -EINVAL (NULL), -ENOENT (no such job) or
 * -ERANGE (worker >= W). */
int hg_engine_worker_counters(const struct hg_engine *e, uint32_t job,
			      uint32_t worker, uint64_t *out, size_t n);
/* The job's sets holding a chunk not yet answered (open, or sent up by a
 * tree leaf): 0..2 x S, -EINVAL (NULL) or -ENOENT. */
int hg_engine_job_open_sets(const struct hg_engine *e, uint32_t job);
/* cdef-end */

#ifdef __cplusplus
}
#endif

#endif /* HOMAGG_ENGINE_H */
