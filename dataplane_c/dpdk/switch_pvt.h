/* SPDX-License-Identifier: Apache-2.0 */
/*
 * switch_pvt.h - what the files of homagg-switch share: the daemon, its
 * shards (one engine each) and their mailboxes, and the calls between the
 * files.  Nothing here is part of the library's public headers.
 *
 *   switch_main.c       EAL, port setup, the main loop, signals, teardown
 *   switch_opts.c       the command line (after the EAL arguments)
 *   switch_shard.c      shards: engines, their lcores, mailboxes, counters
 *   switch_dispatch.c   the dispatcher (--lcores > 1): frames to and from shards
 *   switch_ctl.c        the control socket's callbacks (control.h)
 *   switch_telemetry.c  the /homagg/stats telemetry command
 *   switch_rxring.c     the port's receive ring: its capacity, what it missed
 *
 * With --lcores 1 (the default) one engine (engine.h) runs on the main
 * lcore behind one hg_dpdk_port (port_dpdk.h), and the same loop polls the
 * control socket (control.h) every millisecond, so the engine is only ever
 * touched by one thread.  With --lcores N > 1 the main lcore dispatches:
 * it receives from the ethdev, hands each frame to engine (job id + slot)
 * % N on its own lcore through a ring, sends what the engines put in their
 * tx rings, and serves the control socket.  Every engine holds every job
 * and serves the slots that map to it, so one job's slots are spread over
 * all N lcores (a slot is only ever touched by one of them).  Job changes
 * reach each engine through a mailbox its lcore serves between polls, so
 * again nothing runs concurrently with a poll and the packet path takes no
 * locks.  docs/SWITCH.md documents the command line.
 */
#ifndef HOMAGG_DPDK_SWITCH_PVT_H
#define HOMAGG_DPDK_SWITCH_PVT_H

#include <stdbool.h>
#include <limits.h>
#include <stdint.h>
#include <time.h>

#include <rte_common.h>
#include <rte_ethdev.h>
#include <rte_mempool.h>
#include <rte_ring.h>

#include "homagg/codec.h" /* HG_MAX_WORKERS */
#include "homagg/counters.h"
#include "homagg/engine.h"
#include "homagg/port.h"
#include "control.h"
#include "port_dpdk.h"

struct opts {
	uint32_t ipv4;
	uint16_t udp_port;
	uint16_t port_id;
	const char *control;
	unsigned int lcores;
	unsigned int queues;
	double drop_rate;
	uint64_t seed;
	double stats_interval;    /* seconds, 0 = off */
	unsigned int idle_us;     /* sleep when idle, 0 = spin */
	unsigned int idle_polls;  /* empty polls before the first sleep */
	unsigned int idle_max_us; /* longest sleep after a long idle time */
	unsigned int mbufs;
	unsigned int rx_ring; /* rx descriptors asked of a descriptor-ring PMD */
	unsigned int max_jobs;
	unsigned int mtu; /* 0 = the port's (kernel interface or PMD) */
	bool replicate;
	bool udp_csum; /* verify received / fill sent UDP checksums */
};

/* A request to an engine lcore (job changes must run on the lcore that
 * polls the engine: engine.h forbids concurrent control and poll). */
enum { MB_IDLE, MB_REQ, MB_DONE };
enum { MB_ADD, MB_REMOVE, MB_JOB_STATS, MB_ROTATE, MB_ROTATE_UP };

struct mailbox {
	int state; /* MB_*, acquire/release atomics */
	int op;
	struct hg_job_config jc; /* MB_ROTATE: jc.secret is the new epoch's;
				  * MB_ROTATE_UP: jc.up_key, jc.up_reply_key */
	uint32_t job;
	uint64_t grace_ns; /* MB_ROTATE */
	int rc;
};

/* One engine.  With --lcores 1 the only shard runs on the main lcore on
 * the ethdev port itself; with N > 1 each runs on its own lcore on a
 * ring-mode port fed by the dispatcher ((job id + slot) % N picks the
 * shard; every shard holds every job). */
struct shard {
	struct daemon *d;
	struct hg_dpdk_port *dport; /* ring-mode port (N > 1) */
	struct hg_port port;
	struct hg_engine *eng;
	struct rte_ring *rx_ring;
	struct rte_ring *tx_ring;
	unsigned int lcore;
	bool launched;
	struct mailbox mb;
	uint64_t snap[HG_CNT__COUNT]; /* published counters (relaxed atomics) */
	uint64_t start_tsc;           /* when its loop started */
	uint64_t busy_tsc;            /* in polls that received frames (relaxed
					* atomic: one writer, the shard's lcore) */
	/* MB_JOB_STATS: the engine's share of one job (hg_switch_job_stats'
	 * layout), written by the shard's lcore.  Its own memory, not the
	 * caller's: an answer that comes after the caller gave up writes
	 * nowhere else. */
	uint64_t job_stats[HG_CNT__COUNT + 1 + HG_MAX_WORKERS * HG_WCNT__COUNT];
} __rte_cache_aligned;

struct daemon {
	struct opts o;
	struct rte_mempool *pool;
	struct hg_dpdk_port *dport; /* the ethdev port */
	struct hg_port port;
	struct shard *shards;
	unsigned int nshards;
	struct hg_control *ctl;
	bool port_started;
	uint16_t mtu;         /* of the link (--mtu, kernel interface, PMD) */
	uint16_t data_room;   /* of every mbuf: a whole frame of the MTU */
	unsigned int rx_ring; /* frames the port's receive ring holds */
	const char *rx_ring_source; /* what sets it: "af_packet framecnt", ... */
	unsigned int rx_ring_limit; /* W x S at most: rx_ring, or a shard ring's */
	int pkt_fds[8];             /* af_packet: the PMD's packet sockets */
	unsigned int npkt_fds;
	uint64_t ring_drops; /* af_packet: the kernel ring's drops, summed */
	volatile bool stop_requested; /* by the shutdown command */
	volatile bool stop_engines;   /* engine lcores leave their loop */
	uint64_t dispatch_full;       /* frames a full shard ring refused */
};

/* switch_opts.c: parse the daemon's options (argv[0] is the program);
 * 0, or -EINVAL after printing what is wrong. */
int hg_switch_parse_opts(int argc, char **argv, struct opts *o);
/* Whether the application arguments (after "--") ask --log-format json;
 * read before rte_eal_init() so EAL's own messages are JSON too. */
bool hg_switch_log_json_wanted(int argc, char **argv);

/* switch_shard.c */
int hg_switch_shards_setup(struct daemon *d);
void hg_switch_stop_engines(struct daemon *d);
void hg_switch_shard_publish(struct shard *sh);
void hg_switch_counters_sum(struct daemon *d, uint64_t *out);
int hg_switch_shard_call(struct shard *sh, int op, const struct hg_job_config *jc,
			 uint32_t job, uint64_t grace_ns);
/* One poll of a shard's engine, its time counted as busy when it received
 * frames; returns what hg_engine_poll() returned. */
int hg_switch_shard_poll(struct shard *sh);
/* A job's counters summed over the shards into out: HG_CNT__COUNT job
 * counters, the open sets, then W x HG_WCNT__COUNT worker counters
 * (worker-major).  0, -ENOENT, or a mailbox error. */
int hg_switch_job_stats(struct daemon *d, uint32_t job, uint32_t workers,
			uint64_t *out);

/* switch_dispatch.c: one round of the dispatcher; whether a frame moved. */
bool hg_switch_dispatch(struct daemon *d);

/* switch_rxring.c: set d->rx_ring and its source from the PMD (nrx: the rx
 * descriptors it took); the frames the ring had no room for so far. */
void hg_switch_rx_ring_probe(struct daemon *d,
			     const struct rte_eth_dev_info *info, uint16_t nrx);
uint64_t hg_switch_rx_missed(struct daemon *d);

/* switch_ctl.c: the control socket's callbacks (ctx is the daemon). */
extern const struct hg_ctl_ops hg_switch_ctl_ops;

/* switch_telemetry.c: register /homagg/stats for d (logs a failure);
 * stop makes the command answer -EAGAIN again. */
void hg_switch_telemetry_start(struct daemon *d);
void hg_switch_telemetry_stop(void);

/* Idle backoff: after --idle-polls polls in a row that moved nothing, sleep
 * between polls until a poll moves a frame again.  On a machine whose cores
 * are shared with the workers (a testbed on one host) a spinning lcore takes
 * a core from them; a dedicated core can spin (--idle-us 0).  The sleep is
 * --idle-us, or a sixteenth of the time the port has been idle when that is
 * longer, up to --idle-max-us: the gaps between a step's phases keep the
 * short sleep, while a long gap (the ranks computing) wakes the lcore about
 * once a millisecond instead of every few tens of microseconds, and the
 * first frame after a gap waits at most a sixteenth of it. */
struct idle {
	unsigned int polls; /* in a row that moved nothing */
	uint64_t since;     /* TSC of the poll that reached --idle-polls */
};

static inline void idle_sleep(const struct daemon *d, struct idle *idle, bool moved)
{
	unsigned int us = d->o.idle_us;

	if (moved) {
		idle->polls = 0;
		return;
	}
	if (!us || ++idle->polls < d->o.idle_polls)
		return;
	if (d->o.idle_max_us > us) {
		uint64_t now = rte_get_tsc_cycles();

		if (idle->polls == d->o.idle_polls) {
			idle->since = now;
		} else {
			uint64_t per_us = rte_get_tsc_hz() / 1000000;
			uint64_t grow = (now - idle->since) /
					(16 * (per_us ? per_us : 1));

			if (grow > us)
				us = grow < d->o.idle_max_us ? (unsigned int)grow :
							       d->o.idle_max_us;
		}
		if (idle->polls == UINT_MAX) /* keep since's meaning */
			idle->polls = d->o.idle_polls + 1;
	}
	struct timespec ts = { (time_t)(us / 1000000), (long)(us % 1000000) * 1000 };

	nanosleep(&ts, NULL);
}

#endif /* HOMAGG_DPDK_SWITCH_PVT_H */
