/* SPDX-License-Identifier: Apache-2.0 */
/*
 * switch_shard.c - the shards of homagg-switch: one engine each, on the
 * main lcore (--lcores 1) or on its own lcore behind a ring-mode port,
 * the mailbox that carries job changes to that lcore, and the counter
 * snapshots the lcores publish.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <rte_cycles.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_malloc.h>
#include <rte_pause.h>

#include "homagg/auth.h"
#include "log.h"
#include "switch_pvt.h"

void hg_switch_shard_publish(struct shard *sh)
{
	uint64_t c[HG_CNT__COUNT];
	unsigned int i;

	hg_engine_counters(sh->eng, c, HG_CNT__COUNT);
	for (i = 0; i < HG_CNT__COUNT; i++)
		__atomic_store_n(&sh->snap[i], c[i], __ATOMIC_RELAXED);
}

/* The engine counters summed over the shards.  With one shard on the main
 * lcore they are read directly (this is that lcore); otherwise from the
 * snapshots the engine lcores publish every millisecond. */
void hg_switch_counters_sum(struct daemon *d, uint64_t *out)
{
	unsigned int i, k;

	if (d->nshards == 1 && !d->shards[0].launched) {
		hg_engine_counters(d->shards[0].eng, out, HG_CNT__COUNT);
		return;
	}
	memset(out, 0, sizeof(uint64_t) * HG_CNT__COUNT);
	for (k = 0; k < d->nshards; k++)
		for (i = 0; i < HG_CNT__COUNT; i++)
			out[i] += __atomic_load_n(&d->shards[k].snap[i],
						  __ATOMIC_RELAXED);
}

int hg_switch_shard_poll(struct shard *sh)
{
	uint64_t t0 = rte_get_tsc_cycles();
	int n = hg_engine_poll(sh->eng);

	if (n > 0)
		__atomic_store_n(&sh->busy_tsc,
				 sh->busy_tsc + (rte_get_tsc_cycles() - t0),
				 __ATOMIC_RELAXED);
	return n;
}

/* One engine's share of a job's stats into sh->job_stats (the layout of
 * hg_switch_job_stats); on the lcore that polls the engine. */
static int job_stats_fill(struct shard *sh, uint32_t job)
{
	uint64_t *out = sh->job_stats;
	struct hg_job_config jc;
	uint32_t w;
	int rc, open;

	if ((rc = hg_engine_job_config(sh->eng, job, &jc)) < 0 ||
	    (rc = hg_engine_job_counters(sh->eng, job, out, HG_CNT__COUNT)) < 0 ||
	    (open = rc = hg_engine_job_open_sets(sh->eng, job)) < 0)
		return rc;
	out[HG_CNT__COUNT] = (uint64_t)open;
	out += HG_CNT__COUNT + 1;
	for (w = 0; w < jc.workers; w++, out += HG_WCNT__COUNT)
		if ((rc = hg_engine_worker_counters(sh->eng, job, w, out,
						    HG_WCNT__COUNT)) < 0)
			return rc;
	return 0;
}

/* A mailbox request on shard sh's engine (on the lcore that polls it). */
static int shard_op(struct shard *sh, int op, const struct hg_job_config *jc,
		    uint32_t job, uint64_t grace_ns)
{
	switch (op) {
	case MB_ADD:
		return hg_engine_add_job(sh->eng, jc);
	case MB_ROTATE:
		return hg_engine_rotate_key(sh->eng, job, jc->secret, grace_ns);
	case MB_ROTATE_UP:
		return hg_engine_rotate_up_key(sh->eng, job, jc->up_key,
					       jc->up_reply_key);
	case MB_JOB_STATS:
		return job_stats_fill(sh, job);
	default:
		return hg_engine_remove_job(sh->eng, job);
	}
}

/* Run a pending mailbox request (on the shard's own lcore). */
static void shard_serve(struct shard *sh)
{
	struct mailbox *mb = &sh->mb;

	if (__atomic_load_n(&mb->state, __ATOMIC_ACQUIRE) != MB_REQ)
		return;
	mb->rc = shard_op(sh, mb->op, &mb->jc, mb->job, mb->grace_ns);
	hg_auth_wipe(mb->jc.secret, sizeof(mb->jc.secret));
	hg_auth_wipe(mb->jc.up_key, sizeof(mb->jc.up_key));
	hg_auth_wipe(mb->jc.up_reply_key, sizeof(mb->jc.up_reply_key));
	hg_switch_shard_publish(sh);
	__atomic_store_n(&mb->state, MB_DONE, __ATOMIC_RELEASE);
}

/* Ask shard sh to add or remove a job; waits (bounded) for the answer. */
int hg_switch_shard_call(struct shard *sh, int op, const struct hg_job_config *jc,
			 uint32_t job, uint64_t grace_ns)
{
	struct mailbox *mb = &sh->mb;
	uint64_t deadline;
	int rc;

	if (!sh->launched) /* the engine is polled by this very lcore */
		return shard_op(sh, op, jc, job, grace_ns);
	if (__atomic_load_n(&mb->state, __ATOMIC_ACQUIRE) != MB_IDLE)
		return -EBUSY; /* an earlier request timed out */
	mb->op = op;
	if (jc)
		mb->jc = *jc;
	mb->job = job;
	mb->grace_ns = grace_ns;
	__atomic_store_n(&mb->state, MB_REQ, __ATOMIC_RELEASE);
	deadline = rte_get_tsc_cycles() + 2 * rte_get_tsc_hz();
	while (__atomic_load_n(&mb->state, __ATOMIC_ACQUIRE) != MB_DONE) {
		if (rte_get_tsc_cycles() > deadline)
			return -ETIMEDOUT;
		rte_pause();
	}
	rc = mb->rc;
	__atomic_store_n(&mb->state, MB_IDLE, __ATOMIC_RELEASE);
	return rc;
}

int hg_switch_job_stats(struct daemon *d, uint32_t job, uint32_t workers,
			uint64_t *out)
{
	const size_t n = HG_CNT__COUNT + 1 + (size_t)workers * HG_WCNT__COUNT;
	unsigned int k;
	size_t i;
	int rc;

	if (workers > HG_MAX_WORKERS)
		return -ERANGE;
	memset(out, 0, sizeof(*out) * n);
	for (k = 0; k < d->nshards; k++) {
		if ((rc = hg_switch_shard_call(&d->shards[k], MB_JOB_STATS,
					       NULL, job, 0)))
			return rc;
		for (i = 0; i < n; i++)
			out[i] += d->shards[k].job_stats[i];
	}
	return 0;
}

/* An engine lcore (--lcores > 1). */
static int shard_loop(void *arg)
{
	struct shard *sh = arg;
	struct daemon *d = sh->d;
	const uint64_t period = rte_get_tsc_hz() / 1000;
	uint64_t next = 0;
	struct idle idle = { 0 };
	unsigned int iter = 0;

	sh->start_tsc = rte_get_tsc_cycles();
	while (!d->stop_engines) {
		int n = hg_switch_shard_poll(sh);

		idle_sleep(d, &idle, n > 0);
		shard_serve(sh);
		if ((++iter & 255) == 0 || idle.polls) {
			uint64_t now = rte_get_tsc_cycles();

			if (now >= next) {
				next = now + period;
				hg_switch_shard_publish(sh);
			}
		}
	}
	shard_serve(sh);
	hg_switch_shard_publish(sh);
	return 0;
}
/* Create the shards' engines (and, with N > 1, their rings and ports). */
int hg_switch_shards_setup(struct daemon *d)
{
	struct hg_engine_config ec;
	unsigned int k, lcore = rte_get_main_lcore();

	d->nshards = d->o.lcores;
	if (d->nshards > 1 && rte_lcore_count() < d->nshards + 1) {
		HG_LOG(ERR,
		       "--lcores %u needs %u EAL lcores (e.g. -l 0-%u): "
		       "one dispatcher and one per engine",
		       d->nshards, d->nshards + 1, d->nshards);
		return -EINVAL;
	}
	d->shards = rte_zmalloc("hg_shards", sizeof(*d->shards) * d->nshards,
				RTE_CACHE_LINE_SIZE);
	if (!d->shards)
		return -ENOMEM;
	for (k = 0; k < d->nshards; k++) {
		struct shard *sh = &d->shards[k];

		sh->d = d;
		if (d->nshards == 1) {
			sh->port = d->port;
		} else {
			char name[RTE_RING_NAMESIZE];

			snprintf(name, sizeof(name), "hg_rx%u", k);
			sh->rx_ring = rte_ring_create(name, 4096,
						      (int)rte_socket_id(),
						      RING_F_SP_ENQ | RING_F_SC_DEQ);
			snprintf(name, sizeof(name), "hg_tx%u", k);
			sh->tx_ring = rte_ring_create(name, 4096,
						      (int)rte_socket_id(),
						      RING_F_SP_ENQ | RING_F_SC_DEQ);
			if (!sh->rx_ring || !sh->tx_ring)
				return -ENOMEM;
			sh->dport = hg_dpdk_port_create(&(struct hg_dpdk_port_conf){
				.port_id = d->o.port_id,
				.pool = d->pool,
				.ipv4 = d->o.ipv4,
				.udp_port = d->o.udp_port,
				.can_replicate = d->o.replicate,
				.mtu = d->mtu,
				.rx_ring = sh->rx_ring,
				.tx_ring = sh->tx_ring });
			if (!sh->dport)
				return -ENOMEM;
			sh->port = hg_dpdk_port_ops(sh->dport);
		}
		hg_engine_config_init(&ec);
		ec.port = &sh->port;
		ec.max_jobs = d->o.max_jobs;
		ec.udp_port = d->o.udp_port;
		if (!d->o.udp_csum)
			ec.flags &= ~(uint32_t)HG_ENGINE_F_UDP_CSUM;
		sh->eng = hg_engine_create(&ec);
		if (!sh->eng) {
			HG_LOG(ERR, "engine: could not create");
			return -ENOMEM;
		}
		hg_switch_shard_publish(sh);
	}
	if (d->nshards == 1)
		return 0;
	for (k = 0; k < d->nshards; k++) {
		struct shard *sh = &d->shards[k];

		lcore = rte_get_next_lcore(lcore, 1, 0);
		sh->lcore = lcore;
		if (rte_eal_remote_launch(shard_loop, sh, lcore) != 0) {
			HG_LOG(ERR, "lcore %u: could not launch", lcore);
			return -EBUSY;
		}
		sh->launched = true;
	}
	return 0;
}

void hg_switch_stop_engines(struct daemon *d)
{
	unsigned int k;

	d->stop_engines = true;
	for (k = 0; k < d->nshards; k++)
		if (d->shards[k].launched)
			rte_eal_wait_lcore(d->shards[k].lcore);
}
