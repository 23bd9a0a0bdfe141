/* SPDX-License-Identifier: Apache-2.0 */
/* switch_ctl.c - homagg-switch's control callbacks (control.h): job
 * changes go to every shard, stats come from the counter snapshots. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rte_ethdev.h>

#include "homagg/auth.h"
#include "homagg/errors.h"
#include "homagg/wire.h"
#include "switch_pvt.h"

static int ctl_add_job(void *ctx, const struct hg_ctl_job *j, char *err,
		       size_t errlen)
{
	struct daemon *d = ctx;
	struct hg_job_config jc = {
		.job = j->job,
		.token = j->token,
		.workers = j->workers,
		.slots = j->slots,
		.payload_bytes = j->payload,
		.group_ipv4 = j->group,
		.shard = j->shard,
		.incarnation = j->incarnation,
		.auth = j->auth,
		.mac = j->mac,
		.up = j->up,
		.up_shard = j->up_shard,
		.up_worker = j->up_worker,
		.up_base = j->up_base,
		.up_leaves = j->up_leaves,
		.up_ipv4 = j->up_ipv4,
		.up_port = j->up_port,
		.up_group = j->up_group,
		.up_rto_ns = j->up_rto_ns,
	};
	unsigned int k;
	int rc = 0;

	memcpy(jc.secret, j->secret, sizeof(jc.secret));
	memcpy(jc.up_mac, j->up_mac, sizeof(jc.up_mac));
	memcpy(jc.up_key, j->up_key, sizeof(jc.up_key));
	memcpy(jc.up_reply_key, j->up_reply_key, sizeof(jc.up_reply_key));

	/* On every shard (each serves its slots of the job); all or none. */
	for (k = 0; k < d->nshards && !rc; k++)
		rc = hg_switch_shard_call(&d->shards[k], MB_ADD, &jc, j->job, 0);
	if (rc && rc != -EEXIST)
		while (--k > 0)
			hg_switch_shard_call(&d->shards[k - 1], MB_REMOVE, NULL,
					     j->job, 0);
	hg_auth_wipe(jc.secret, sizeof(jc.secret));
	hg_auth_wipe(jc.up_key, sizeof(jc.up_key));
	hg_auth_wipe(jc.up_reply_key, sizeof(jc.up_reply_key));
	if (rc == -EEXIST)
		snprintf(err, errlen, "job %u already exists", j->job);
	else if (rc == -ETIMEDOUT || rc == -EBUSY)
		snprintf(err, errlen,
			 "the engine lcore of job %u did not answer", j->job);
	return rc;
}

static int ctl_remove_job(void *ctx, uint32_t job)
{
	struct daemon *d = ctx;
	unsigned int k;
	int rc = 0, r;

	for (k = 0; k < d->nshards; k++)
		if ((r = hg_switch_shard_call(&d->shards[k], MB_REMOVE, NULL,
					      job, 0)) &&
		    !rc)
			rc = r;
	return rc;
}

/*
 * Key request op (MB_ROTATE: jc->secret; MB_ROTATE_UP: jc->up_key and
 * jc->up_reply_key) on every shard; the key material in jc is wiped.  A
 * shard that fails after others took the new keys leaves them differing
 * between shards: named in err, as are -EPERM (eperm) and -ENOENT.
 */
static int ctl_keys_on_shards(struct daemon *d, int op,
			      struct hg_job_config *jc, uint64_t grace_ns,
			      const char *eperm, char *err, size_t errlen)
{
	unsigned int k;
	int rc = 0;

	for (k = 0; k < d->nshards && rc >= 0; k++)
		rc = hg_switch_shard_call(&d->shards[k], op, jc, jc->job, grace_ns);
	hg_auth_wipe(jc->secret, sizeof(jc->secret));
	hg_auth_wipe(jc->up_key, sizeof(jc->up_key));
	hg_auth_wipe(jc->up_reply_key, sizeof(jc->up_reply_key));
	if (rc == -EPERM)
		snprintf(err, errlen, "job %u %s", jc->job, eperm);
	else if (rc == -ENOENT)
		snprintf(err, errlen, "no job %u", jc->job);
	else if (rc < 0 && k > 1)
		snprintf(err, errlen,
			 "engine lcore %u failed (%s) after %u took "
			 "the new keys: remove and re-add the job",
			 k - 1, hg_strerror(rc), k - 1);
	return rc;
}

/* The new epoch on every shard. */
static int ctl_rotate_key(void *ctx, uint32_t job, const uint8_t *secret,
			  uint64_t grace_ns, char *err, size_t errlen)
{
	struct hg_job_config jc = { .job = job };

	memcpy(jc.secret, secret, sizeof(jc.secret));
	return ctl_keys_on_shards(ctx, MB_ROTATE, &jc, grace_ns,
				  "does not authenticate", err, errlen);
}

/* A tree leaf's keys of the root's next epoch, on every shard. */
static int ctl_rotate_up_key(void *ctx, uint32_t job, const uint8_t *key,
			     const uint8_t *reply_key, char *err, size_t errlen)
{
	struct hg_job_config jc = { .job = job };

	memcpy(jc.up_key, key, sizeof(jc.up_key));
	memcpy(jc.up_reply_key, reply_key, sizeof(jc.up_reply_key));
	return ctl_keys_on_shards(ctx, MB_ROTATE_UP, &jc, 0,
				  "is no authenticated tree leaf (only a "
				  "leaf's keys at its root take 'parent')",
				  err, errlen);
}

static int engine_times(struct daemon *d, json_t *reply);

/* The counters under "stats" (engine) and "port" (backend, dispatcher). */
static int ctl_stats(void *ctx, json_t *reply)
{
	struct daemon *d = ctx;
	uint64_t c[HG_CNT__COUNT];
	struct hg_dpdk_port_stats ps;
	struct rte_eth_stats es;
	json_t *eng = json_object(), *port, *summed;
	unsigned int i;
	int rc;

	hg_switch_counters_sum(d, c);
	for (i = 0; eng && i < HG_CNT__COUNT; i++)
		if (json_object_set_new(eng, hg_counter_name((int)i),
					json_integer((json_int_t)c[i])) < 0)
			break;
	hg_dpdk_port_get_stats(d->dport, &ps);
	/* the ethdev's own count of frames received: every one of them is
	 * in exactly one of drop_injected, drop_segmented, arp_replies,
	 * arp_other and rx */
	if (rte_eth_stats_get(d->o.port_id, &es) != 0)
		es.ipackets = 0;
	port = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
			 "ipackets", (json_int_t)es.ipackets, "rx",
			 (json_int_t)ps.rx, "tx", (json_int_t)ps.tx,
			 "tx_refused", (json_int_t)ps.tx_refused,
			 "drop_injected", (json_int_t)ps.drop_injected,
			 "rx_linearized", (json_int_t)ps.rx_linearized,
			 "drop_segmented", (json_int_t)ps.drop_segmented,
			 "arp_replies", (json_int_t)ps.arp_replies, "arp_other",
			 (json_int_t)ps.arp_other, "alloc_fail",
			 (json_int_t)ps.alloc_fail, "dispatch_full",
			 (json_int_t)d->dispatch_full, "rx_missed",
			 (json_int_t)hg_switch_rx_missed(d));
	if (!eng || i < HG_CNT__COUNT || !port) {
		json_decref(eng);
		json_decref(port);
		return -ENOMEM;
	}
	/* each set takes its value's reference, also when it fails */
	rc = json_object_set_new(reply, "stats", eng);
	rc |= json_object_set_new(reply, "port", port);
	rc |= json_object_set_new(reply, "engines", json_integer(d->nshards));
	/* what a job's W x S frames in flight may reach (add_job) */
	rc |= json_object_set_new(reply, "rx_ring", json_integer(d->rx_ring_limit));
	/* What each engine lcore summed (the spread of one job's slots). */
	summed = json_array();
	for (i = 0; summed && i < d->nshards; i++) {
		uint64_t v = d->nshards == 1 && !d->shards[0].launched ?
				     c[HG_CNT_SUMMED] :
				     __atomic_load_n(&d->shards[i].snap[HG_CNT_SUMMED],
						     __ATOMIC_RELAXED);

		rc |= json_array_append_new(summed, json_integer((json_int_t)v));
	}
	rc |= json_object_set_new(reply, "engine_summed", summed);
	rc |= engine_times(d, reply);
	return rc ? -ENOMEM : 0;
}

/* "engine_ns": each engine lcore's time since its loop started, and
 * "engine_busy_ns": the part of it spent in polls that received frames
 * (their ratio is how busy the lcore is; idle polls and sleeps are not). */
static int engine_times(struct daemon *d, json_t *reply)
{
	const uint64_t hz = rte_get_tsc_hz(), now = rte_get_tsc_cycles();
	json_t *up = json_array(), *busy = json_array();
	unsigned int i;
	int rc = 0;

	for (i = 0; up && busy && i < d->nshards; i++) {
		const struct shard *sh = &d->shards[i];
		uint64_t start = __atomic_load_n(&sh->start_tsc, __ATOMIC_RELAXED);
		uint64_t b = __atomic_load_n(&sh->busy_tsc, __ATOMIC_RELAXED);
		uint64_t t = start && now > start ? now - start : 0;

		rc |= json_array_append_new(up,
					    json_integer(
						    (json_int_t)((double)t * 1e9 /
								 (double)hz)));
		rc |= json_array_append_new(busy,
					    json_integer(
						    (json_int_t)((double)b * 1e9 /
								 (double)hz)));
	}
	rc |= json_object_set_new(reply, "engine_ns", up);
	rc |= json_object_set_new(reply, "engine_busy_ns", busy);
	return rc;
}

/* One job: its configuration, its counters summed over the engines, the
 * sets open and, per worker, the worker counters as one array each. */
static int ctl_job_stats(void *ctx, uint32_t job, json_t *reply)
{
	struct daemon *d = ctx;
	struct hg_job_config jc;
	json_t *cnt, *wk;
	uint64_t *v;
	uint32_t w;
	int rc, i, bad = 0;

	/* every engine holds every job with the same configuration */
	if ((rc = hg_engine_job_config(d->shards[0].eng, job, &jc)) < 0)
		return rc;
	v = calloc(HG_CNT__COUNT + 1 + (size_t)jc.workers * HG_WCNT__COUNT,
		   sizeof(*v));
	if (!v)
		return -ENOMEM;
	if ((rc = hg_switch_job_stats(d, job, jc.workers, v)) < 0)
		goto out;
	rc = -ENOMEM;
	cnt = json_object();
	wk = json_object();
	if (!cnt || !wk) {
		json_decref(cnt);
		json_decref(wk);
		goto out;
	}
	for (i = 0; i < HG_CNT__COUNT; i++)
		bad |= json_object_set_new(cnt, hg_counter_name(i),
					   json_integer((json_int_t)v[i]));
	for (i = 0; i < HG_WCNT__COUNT; i++) {
		json_t *a = json_array();

		for (w = 0; a && w < jc.workers; w++)
			bad |= json_array_append_new(
				a,
				json_integer((
					json_int_t)v[HG_CNT__COUNT + 1 +
						     (size_t)w * HG_WCNT__COUNT + i]));
		bad |= json_object_set_new(wk, hg_worker_counter_name(i), a);
	}
	/* each set takes its value's reference, also when it fails */
	if (bad | json_object_set_new(reply, "counters", cnt) |
	    json_object_set_new(reply, "worker_counters", wk) |
	    json_object_set_new(reply, "workers", json_integer(jc.workers)) |
	    json_object_set_new(reply, "slots", json_integer(jc.slots)) |
	    json_object_set_new(reply, "payload", json_integer(jc.payload_bytes)) |
	    json_object_set_new(reply, "incarnation", json_integer(jc.incarnation)) |
	    json_object_set_new(reply, "shard", json_integer(jc.shard)) |
	    json_object_set_new(reply, "sets_open",
				json_integer((json_int_t)v[HG_CNT__COUNT])))
		goto out;
	rc = 0;
out:
	free(v);
	return rc;
}

static void ctl_shutdown(void *ctx)
{
	struct daemon *d = ctx;

	d->stop_requested = true;
}

const struct hg_ctl_ops hg_switch_ctl_ops = {
	.add_job = ctl_add_job,
	.remove_job = ctl_remove_job,
	.rotate_key = ctl_rotate_key,
	.rotate_up_key = ctl_rotate_up_key,
	.stats = ctl_stats,
	.job_stats = ctl_job_stats,
	.shutdown = ctl_shutdown,
};
