/* SPDX-License-Identifier: Apache-2.0 */
/*
 * homagg/sim.h - a whole HomAgg cluster in one process and one thread.
 *
 * A software NIC fabric (homagg/nic.h, virtual time, seeded faults), K
 * aggregator ports each driven by an engine (homagg/engine.h), and for each
 * job W worker ports each driven by a worker client (homagg/client.h).
 * Every job is spread over the K aggregators (docs/PROTOCOL.md, "Several
 * aggregators"), or runs over a two-level tree: L leaf aggregators
 * (0..L-1), each serving a contiguous part of every job's workers, below
 * one root (aggregator L) (docs/PROTOCOL.md, "Tree").  The
 * same engine and client bytes as on real ports; only the clock is virtual.
 *
 * hg_sim_run() is the event loop: poll the engine and every busy client
 * until nothing moves, then advance virtual time to the earlier of the next
 * NIC event and the next client deadline; repeat until every started
 * allreduce has finished or failed, or the virtual time budget is spent.
 */
#ifndef HOMAGG_SIM_H
#define HOMAGG_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "homagg/client.h"
#include "homagg/codec.h"
#include "homagg/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cdef-begin */
#define HG_SIM_MAX_JOBS 16
#define HG_SIM_MAX_AGGREGATORS 64
/* Frames an aggregator's NIC port holds in its receive ring: the jobs on it
 * keep at most this many in flight together (hg_sim_add_job). */
#define HG_SIM_AGG_RX_RING 4096
#define HG_SIM_INCARNATION 1000

struct hg_sim_config {
	double loss;      /* probability a frame is dropped, per link hop */
	double duplicate; /* probability a frame is delivered twice */
	double reorder;   /* probability a frame is held back (reordered) */
	uint64_t reorder_ns; /* how long a reordered frame is held back (0 = 10 us) */
	uint64_t delay_ns; /* one-way propagation delay of every link */
	double link_gbps;  /* line rate of every worker's link, 0 = unlimited */
	uint64_t seed;     /* seed of every fault stream */
	uint32_t payload_bytes; /* 0 = HG_DEFAULT_PAYLOAD */
	bool unicast_results; /* false: results by multicast (fabric replicates) */
	double agg_link_gbps; /* line rate of the aggregator's link, 0 = link_gbps
				 * (a real aggregator or switch port is usually
				 * faster than one worker's link) */
	uint32_t aggregators; /* K aggregators every job is spread over (0 = 1) */
	uint32_t pool_frames; /* frame buffers of the fabric (0 = 65536): every
				 * frame in flight or queued holds one, each
				 * multicast copy too */
	uint16_t mtu;         /* MTU of every port, 576..9000 (9000: jumbo
				 * frames); 0 = 1500, or the payload's frame
				 * when that is larger */
	uint32_t leaves;      /* L > 0: a two-level tree of L leaves and a root
				 * (aggregators must be 0 or 1; every job needs
				 * W >= L); 0: flat */
	uint64_t up_rto_ns; /* the leaves' upward timeout (0 = the engine's) */
	uint64_t up_give_up_ns; /* the leaves' upward give-up time (0 = the engine's) */
	uint32_t worker_tx_ring; /* tx descriptors of every worker's port (0 = 4096;
				  * a small ring refuses frames as a full kernel
				  * socket buffer does) */
};

struct hg_sim_job_config {
	uint32_t workers;    /* W */
	uint32_t slots;      /* S (0 = 64) */
	uint64_t rto_ns;     /* worker retransmission timeout (0 = default) */
	uint64_t rto_max_ns; /* cap (0 = default) */
	uint64_t give_up_ns; /* give-up deadline per chunk (0 = default) */
	uint64_t rto_min_ns; /* lower clamp of the adaptive timeout (0 = default) */
	uint64_t rto_granularity_ns; /* hg_client_config.rto_granularity_ns
				 * (0 = default) */
	uint64_t start_wait_ns;      /* least wait for a step's first result
				 * (hg_client_config.start_wait_ns; 0 = default) */
	uint32_t incarnation;        /* of every worker and of the job on the
				 * aggregator (0 = HG_SIM_INCARNATION; the
				 * virtual cluster keeps it deterministic) */
	uint8_t auth;                /* 1: the job authenticates every frame */
	uint8_t secret[32]; /* auth: the job secret (HG_AUTH_SECRET_LEN) */
	uint32_t mac;       /* auth: HG_MAC_*, 0 = hg_auth_default_mac() */
	uint32_t pipeline_groups; /* hg_client_config.pipeline_groups of every
				 * worker (0 = automatic, 1 = not pipelined) */
	uint32_t pipe_gain_pct;   /* hg_client_config.pipe_gain_pct of every
				 * worker (0 = no bound but the slots) */
	uint32_t pipe_max;        /* hg_client_config.pipe_max of every worker
				 * (0 = slots); with pipe_gain_pct, a flat
				 * job counts W x min(slots, pipe_max) frames
				 * in flight (docs/PROTOCOL.md "Slots beyond
				 * the ring's share, in the NIC model") */
};

struct hg_sim_stats {
	uint64_t now_ns;        /* virtual time */
	uint64_t loop_rounds;   /* polling rounds of hg_sim_run */
	uint64_t time_advances; /* jumps of virtual time */
	uint64_t frames_tx;     /* frames sent into the fabric by every port */
	uint64_t frames_rx;     /* frames received from it by every port */
	uint64_t engine_polls; /* engine polls that handled at least one frame */
};

struct hg_sim;
struct hg_engine;
struct hg_nic_fabric;

/* NULL on bad configuration or allocation failure. */
struct hg_sim *hg_sim_create(const struct hg_sim_config *cfg);
void hg_sim_destroy(struct hg_sim *s);

/*
 * Add a job: its W worker ports and clients, its slots and token on the
 * engine.  Returns the job index (0, 1, ...) or -EINVAL, -ERANGE (W out of
 * range; or the job's frames in flight, with those of the jobs already
 * added, exceed an aggregator's HG_SIM_AGG_RX_RING: hg_sim_agg_frames),
 * -ENOSPC (HG_SIM_MAX_JOBS), -ENOMEM.
 */
int hg_sim_add_job(struct hg_sim *s, const struct hg_sim_job_config *jc);

/*
 * The frames a job of workers x slots (slots 0: the default) would keep in
 * flight towards aggregator k into *frames (a tree: a leaf gets its part of
 * the workers, the root one per leaf), and those the jobs already added
 * hold there into *held.  0, or -EINVAL (NULL, k or workers out of range).
 */
int hg_sim_agg_frames(const struct hg_sim *s, uint32_t k, uint32_t workers,
		      uint32_t slots, uint64_t *frames, uint32_t *held);

/* The job's id and token on the wire (for hand-made frames). */
int hg_sim_job_wire(const struct hg_sim *s, int job, uint32_t *job_id,
		    uint32_t *token);

/*
 * Worker `worker` of job starts every later allreduce delay_ns of virtual
 * time after hg_sim_start (0: at once): a straggler, a rank still
 * computing its gradient.  Its client is not polled before; frames that
 * reach it meanwhile wait in its port's ring.  Returns 0 or -EINVAL.
 */
int hg_sim_delay_start(struct hg_sim *s, int job, uint32_t worker,
		       uint64_t delay_ns);

/*
 * Start one allreduce of job: worker w reduces x[w] (n floats) into y[w].
 * The arrays and buffers must stay valid until it ends.  Returns 0 or the
 * first worker's hg_client_start() error (-EBUSY, -EINVAL, -ERANGE, -EDOM).
 */
int hg_sim_start(struct hg_sim *s, int job, int method, const struct hg_params *p,
		 const float *const *x, size_t n, float *const *y);

/*
 * Run the event loop until every started allreduce ended, or max_ns of
 * virtual time passed (from this call).  Returns 0 when all ended (some may
 * have failed: see hg_sim_worker_status), -ETIMEDOUT when the budget ran
 * out first.
 */
int hg_sim_run(struct hg_sim *s, uint64_t max_ns);

/* 1 done, 0 running or never started, or the worker's negative error. */
int hg_sim_worker_status(const struct hg_sim *s, int job, uint32_t worker);
const char *hg_sim_worker_error(const struct hg_sim *s, int job, uint32_t worker);
int hg_sim_worker_stats(const struct hg_sim *s, int job, uint32_t worker,
			struct hg_client_stats *st);

/*
 * The worker stops (its process dies) once it sent after_packets more
 * frames: its port drops everything from then on and it is not polled
 * again.  Returns 0 or -EINVAL / -ENOENT.
 */
int hg_sim_kill_worker(struct hg_sim *s, int job, uint32_t worker,
		       uint64_t after_packets);

/*
 * Aggregator k restarts once its engine received after_frames more frames
 * (0: at its next poll in hg_sim_run): every job is removed and added again
 * with the same configuration, all slot and worker state lost, and the new
 * incarnation (0 = the previous one + 1).  The engine's counters are kept.
 * Returns 0 or -EINVAL (no aggregator k).
 */
int hg_sim_restart_aggregator(struct hg_sim *s, uint32_t k,
			      uint64_t after_frames, uint32_t incarnation);

/*
 * Send a raw Ethernet frame to the aggregator from an extra port (an
 * attacker on the fabric); it arrives through the fabric like any frame.
 * Returns 0, -EINVAL (len 0 or too long), -ENOSPC (port full).
 */
int hg_sim_inject(struct hg_sim *s, const uint8_t *frame, size_t len);

/* Build a well-formed HomAgg frame to the aggregator in frame (cap bytes):
 * the same headers a worker writes, any header values, with the MAC m
 * describes (hg_wire_build_mac(); NULL: none, or a zero MAC when h has
 * HG_FLAG_AUTH).  Returns its length or -ENOSPC / -EINVAL / -ENOTSUP. */
int hg_sim_build_frame(const struct hg_sim *s, const struct hg_hdr *h,
		       const uint8_t *payload, size_t payload_len,
		       uint8_t *frame, size_t cap, const struct hg_wire_mac *m);

/*
 * The next key epoch of authenticated job `job` (docs/PROTOCOL.md "Key
 * epochs"): secret (HG_AUTH_SECRET_LEN bytes) goes to every worker of the
 * job first (hg_client_rotate_key), then to every aggregator of it
 * (hg_engine_rotate_key, grace_ns of virtual time).  A tree rotates every
 * level in the order of "Key epochs in a tree": secret is the root's new
 * one, each leaf's next secret derived from it as at add_job.  Returns the
 * new epoch, or -EINVAL / -ENOENT / -EPERM (no auth) / -ENOMEM.
 */
int hg_sim_rotate_key(struct hg_sim *s, int job, const uint8_t *secret,
		      uint64_t grace_ns);

/*
 * Aggregator k stops (its host dies) after_ns of virtual time from now: its
 * engine is not polled again and what reaches its port is discarded.
 * Returns 0 or -EINVAL / -ENOENT.
 */
int hg_sim_kill_aggregator(struct hg_sim *s, uint32_t k, uint64_t after_ns);

/* Worker w's exchange with aggregator k (homagg/client.h). */
int hg_sim_worker_agg_stats(const struct hg_sim *s, int job, uint32_t worker,
			    uint32_t k, struct hg_client_agg_stats *st);

/* The engine of aggregator 0, for its counters (homagg/engine.h); in a tree
 * aggregators 0..L-1 are the leaves and L the root. */
struct hg_engine *hg_sim_engine(struct hg_sim *s);
/* Aggregator k's engine and NIC port (its link's counters); NULL if k >= K. */
struct hg_engine *hg_sim_aggregator_engine(struct hg_sim *s, uint32_t k);
struct hg_nic_port *hg_sim_aggregator_port(struct hg_sim *s, uint32_t k);
uint32_t hg_sim_aggregators(const struct hg_sim *s);
/* The NIC fabric, for its counters (homagg/nic.h). */
struct hg_nic_fabric *hg_sim_fabric(struct hg_sim *s);

uint64_t hg_sim_now(const struct hg_sim *s);
int hg_sim_get_stats(const struct hg_sim *s, struct hg_sim_stats *st);
/* cdef-end */

#ifdef __cplusplus
}
#endif

#endif /* HOMAGG_SIM_H */
