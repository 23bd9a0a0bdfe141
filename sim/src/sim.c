/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The simulated cluster (homagg/sim.h): one NIC fabric, K aggregator ports
 * each driven by an engine, an attacker port for hand-made frames, and per
 * job W worker ports each driven by a worker client.
 *
 * Addresses: aggregator 0 02:00:00:00:00:01 / 10.0.0.1, aggregator k > 0
 * 02:00:00:00:01:kk / 10.0.1.k, attacker
 * 02:00:00:00:00:02 / 10.0.0.2, worker w of job j 02:00:01:jj:ww:ww /
 * 10.(1 + j).(w >> 8).(w & 255 + 1)... (see worker_addr()).  Faults apply to
 * both directions of every worker's link, so each frame between a worker
 * and an aggregator crosses exactly one faulty stage; the aggregators' and
 * the attacker's links are perfect, except a tree's root link (leaves
 * 0..L-1 at the aggregator addresses, the root at aggregator L's), which
 * has the workers' faults, so leaf-root frames cross one faulty stage too.
 * In a tree, job j's leaf l multicasts to 239.1.l.(j + 1), the root to
 * 239.2.0.(j + 1), which the leaves join.  Worker and attacker links run at
 * link_gbps, the aggregator's at agg_link_gbps.
 *
 * Each worker's client talks through a thin wrapper of its NIC port that
 * counts transmitted frames, so hg_sim_kill_worker() can make the worker
 * fall silent after a given number of frames.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "homagg/auth.h"
#include "homagg/client.h"
#include "homagg/engine.h"
#include "homagg/mix.h"
#include "homagg/nic.h"
#include "homagg/sim.h"
#include "homagg/wire.h"

#define AGG_IP 0x0a000001u
#define AGG_IP_K 0x0a000100u /* 10.0.1.k, aggregator k > 0 */
#define ATTACKER_IP 0x0a000002u
#define GROUP_BASE 0xef010001u /* 239.1.0.1 + job (+ leaf << 8 in a tree) */
#define ROOT_GROUP_BASE 0xef020001u /* 239.2.0.1 + job: a tree root's results */
#define JOB_ID_BASE 100u
#define DEFAULT_SLOTS 64
#define DEFAULT_REORDER_NS 10000
#define REORDER_MAX 8

struct sim_worker {
	struct hg_sim *sim;
	struct hg_nic_port *nport;
	struct hg_port *inner; /* the NIC port's interface */
	struct hg_port wrap;   /* what the client uses */
	struct hg_client *client;
	uint64_t tx_frames;
	uint64_t kill_at;  /* UINT64_MAX: never */
	uint64_t deadline; /* poll again at this time (or on rx) */
	bool dead;
	bool active;          /* an allreduce is running on it */
	uint64_t start_delay; /* it starts every allreduce this late (ns) */
	uint64_t start_at;    /* its allreduce starts then (pending) */
	bool pending;       /* started by hg_sim_start, not yet by the client */
	struct hg_params p; /* the pending start's arguments */
	int method;
	const float *x;
	size_t n;
	float *y;
	int status; /* 1 done, 0 running/never, < 0 error */
};

struct sim_job {
	uint32_t id, token, workers, slots;
	uint8_t epoch;        /* auth: its key epoch (hg_sim_rotate_key) */
	struct sim_worker *w; /* workers entries */
};

/* One aggregator: its port, its engine, when it dies or restarts. */
struct sim_agg {
	struct hg_nic_port *port;
	struct hg_engine *engine;
	uint64_t dead_at;    /* UINT64_MAX: never */
	uint64_t restart_at; /* its engine's "received" count; UINT64_MAX: none */
	uint32_t restart_incarnation;
	uint32_t incarnation; /* of its jobs after a restart (0: none yet) */
	uint32_t held_frames; /* the frames in flight of the jobs on it */
};

struct hg_sim {
	struct hg_sim_config cfg;
	struct hg_nic_fabric *fab;
	struct sim_agg agg[HG_SIM_MAX_AGGREGATORS];
	uint32_t naggs;
	uint32_t leaves; /* tree: L leaves, agg[L] the root; 0: flat */
	struct hg_nic_port *attacker;
	struct sim_job jobs[HG_SIM_MAX_JOBS];
	int njobs;
	uint16_t mtu;
	struct hg_sim_stats st;
};

/* ---- the killable port wrapper ----------------------------------------- */

static uint16_t w_rx(void *ctx, struct hg_pkt **pk, uint16_t n)
{
	struct sim_worker *w = ctx;

	return w->inner->ops->rx_burst(w->inner->ctx, pk, n);
}

static uint16_t w_tx(void *ctx, struct hg_pkt **pk, uint16_t n)
{
	struct sim_worker *w = ctx;
	uint16_t ok = n, sent;

	if (w->dead) {
		/* A dead host's frames vanish. */
		w->inner->ops->free_bulk(w->inner->ctx, pk, n);
		return n;
	}
	if (w->kill_at != UINT64_MAX && w->tx_frames + n > w->kill_at)
		ok = (uint16_t)(w->kill_at - w->tx_frames);
	sent = ok ? w->inner->ops->tx_burst(w->inner->ctx, pk, ok) : 0;
	w->tx_frames += sent;
	if (w->tx_frames >= w->kill_at) {
		w->dead = true;
		if (n > sent)
			w->inner->ops->free_bulk(w->inner->ctx, pk + sent,
						 n - sent);
		return n;
	}
	return sent;
}

static uint16_t w_alloc(void *ctx, struct hg_pkt **pk, uint16_t n)
{
	struct sim_worker *w = ctx;

	return w->inner->ops->alloc_bulk(w->inner->ctx, pk, n);
}

static void w_free(void *ctx, struct hg_pkt **pk, uint16_t n)
{
	struct sim_worker *w = ctx;

	w->inner->ops->free_bulk(w->inner->ctx, pk, n);
}

static int w_info(void *ctx, struct hg_port_info *info)
{
	struct sim_worker *w = ctx;

	return w->inner->ops->get_info(w->inner->ctx, info);
}

static uint64_t w_now(void *ctx)
{
	struct sim_worker *w = ctx;

	return w->inner->ops->now_ns(w->inner->ctx);
}

static int w_join(void *ctx, uint32_t group)
{
	struct sim_worker *w = ctx;

	return hg_nic_port_join(w->nport, group);
}

static const struct hg_port_ops worker_port_ops = {
	.rx_burst = w_rx,
	.tx_burst = w_tx,
	.alloc_bulk = w_alloc,
	.free_bulk = w_free,
	.get_info = w_info,
	.now_ns = w_now,
	.join_group = w_join,
};

/* ---- create / destroy -------------------------------------------------- */

static struct hg_nic_port *add_port(struct hg_sim *s, const uint8_t mac[6],
				    uint32_t ip, double gbps, bool faulty,
				    uint32_t tx_ring)
{
	struct hg_nic_port_config pc = { 0 };
	struct hg_nic_faults fa = { 0 };
	struct hg_nic_port *p;

	memcpy(pc.mac, mac, 6);
	pc.ipv4 = ip;
	pc.udp_port = HG_UDP_PORT;
	pc.mtu = s->mtu;
	pc.rx_ring = HG_SIM_AGG_RX_RING;
	pc.tx_ring = tx_ring ? tx_ring : 4096;
	pc.rate_bps = (uint64_t)(gbps * 1e9);
	pc.prop_delay_ns = s->cfg.delay_ns;
	p = hg_nic_port_create(s->fab, &pc);
	if (!p || !faulty)
		return p;
	fa.loss = s->cfg.loss;
	fa.dup = s->cfg.duplicate;
	fa.reorder = s->cfg.reorder;
	fa.reorder_max = s->cfg.reorder > 0 ? REORDER_MAX : 0;
	fa.reorder_timeout_ns = s->cfg.reorder_ns ? s->cfg.reorder_ns :
						    DEFAULT_REORDER_NS;
	if (hg_nic_port_set_faults(p, HG_NIC_OUT, &fa) ||
	    hg_nic_port_set_faults(p, HG_NIC_IN, &fa))
		return NULL;
	return p;
}

/* Aggregator k's addresses. */
static void agg_addr(uint32_t k, uint8_t mac[6], uint32_t *ip)
{
	static const uint8_t agg0[6] = { 2, 0, 0, 0, 0, 1 };

	memcpy(mac, agg0, 6);
	*ip = AGG_IP;
	if (k > 0) {
		mac[4] = 1;
		mac[5] = (uint8_t)k;
		*ip = AGG_IP_K | k;
	}
}

struct hg_sim *hg_sim_create(const struct hg_sim_config *cfg)
{
	static const uint8_t att_mac[6] = { 2, 0, 0, 0, 0, 2 };
	struct hg_nic_fabric_config fc = { 0 };
	struct hg_engine_config ec = { 0 };
	struct hg_sim *s;
	uint32_t payload;

	if (!cfg)
		return NULL;
	payload = cfg->payload_bytes ? cfg->payload_bytes : HG_DEFAULT_PAYLOAD;
	if (payload % 4 || payload > HG_MAX_PAYLOAD ||
	    (cfg->mtu && (cfg->mtu < 576 || cfg->mtu > 9000 ||
			  cfg->mtu < 20 + 8 + HG_HDR_LEN + payload)) ||
	    !(cfg->loss >= 0 && cfg->loss < 1) ||
	    !(cfg->duplicate >= 0 && cfg->duplicate < 1) ||
	    !(cfg->reorder >= 0 && cfg->reorder < 1) ||
	    !(cfg->link_gbps >= 0) || !(cfg->agg_link_gbps >= 0) ||
	    cfg->aggregators > HG_SIM_MAX_AGGREGATORS ||
	    cfg->leaves >= HG_SIM_MAX_AGGREGATORS ||
	    (cfg->leaves && cfg->aggregators > 1))
		return NULL;
	s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->cfg = *cfg;
	s->cfg.payload_bytes = payload;
	if (s->cfg.agg_link_gbps == 0)
		s->cfg.agg_link_gbps = s->cfg.link_gbps;
	/* Largest IP packet: the configured MTU, else IPv4 + UDP + header +
	 * payload + MAC, at least 1500. */
	s->mtu = (uint16_t)(20 + 8 + HG_HDR_LEN + payload + HG_MAC_LEN);
	if (s->mtu < 1500)
		s->mtu = 1500;
	if (cfg->mtu)
		s->mtu = cfg->mtu;
	fc.seed = cfg->seed;
	fc.pool_size = cfg->pool_frames ? cfg->pool_frames : 65536;
	fc.buf_size = (uint16_t)((s->mtu + 14 + 63) / 64 * 64);
	fc.max_ports = HG_NIC_MAX_PORTS;
	s->fab = hg_nic_fabric_create(&fc);
	if (!s->fab)
		goto err;
	s->naggs = cfg->aggregators ? cfg->aggregators : 1;
	s->leaves = cfg->leaves;
	if (s->leaves)
		s->naggs = s->leaves + 1;
	for (uint32_t k = 0; k < s->naggs; k++) {
		struct sim_agg *ag = &s->agg[k];
		uint8_t mac[6];
		uint32_t ip;

		agg_addr(k, mac, &ip);
		ag->dead_at = UINT64_MAX;
		ag->restart_at = UINT64_MAX;
		/* a tree's root link is faulty too: leaf-root frames cross
		 * one faulty stage, as worker-leaf frames do */
		ag->port = add_port(s, mac, ip, s->cfg.agg_link_gbps,
				    s->leaves && k == s->leaves, 0);
		if (!ag->port)
			goto err;
		hg_engine_config_init(&ec);
		ec.port = hg_nic_port_get(ag->port);
		ec.max_jobs = HG_SIM_MAX_JOBS;
		ag->engine = hg_engine_create(&ec);
		if (!ag->engine)
			goto err;
	}
	s->attacker = add_port(s, att_mac, ATTACKER_IP, s->cfg.link_gbps, false, 0);
	if (!s->attacker)
		goto err;
	return s;

err:
	hg_sim_destroy(s);
	return NULL;
}

void hg_sim_destroy(struct hg_sim *s)
{
	if (!s)
		return;
	for (int j = 0; j < s->njobs; j++) {
		struct sim_job *job = &s->jobs[j];

		for (uint32_t w = 0; w < job->workers && job->w; w++)
			hg_client_destroy(job->w[w].client);
		free(job->w);
	}
	for (uint32_t k = 0; k < HG_SIM_MAX_AGGREGATORS; k++)
		hg_engine_destroy(s->agg[k].engine);
	hg_nic_fabric_destroy(s->fab);
	free(s);
}

static uint32_t worker_ip(int job, uint32_t w)
{
	return 0x0a000000u | (uint32_t)(1 + job) << 16 | (w + 1);
}

/* Tree: the first worker of leaf l among W (leaf l serves first(l) ..
 * first(l + 1) - 1, docs/PROTOCOL.md "Tree"). */
static uint32_t leaf_first(const struct hg_sim *s, uint32_t W, uint32_t l)
{
	return (uint32_t)((uint64_t)l * W / s->leaves);
}

static uint32_t leaf_of(const struct hg_sim *s, uint32_t W, uint32_t w)
{
	uint32_t l = (uint32_t)((uint64_t)w * s->leaves / W);

	while (l + 1 < s->leaves && leaf_first(s, W, l + 1) <= w)
		l++;
	while (leaf_first(s, W, l) > w)
		l--;
	return l;
}

/* Tree: add job j to every leaf (its part of the workers, the root as
 * parent) and to the root (the L leaves as workers). */
/*
 * An authenticated tree: the job's secret is the root's; leaf l's own job
 * secret (its workers') is keyed BLAKE2b of "leaf" and l under it, a
 * choice of this simulator only (docs/PROTOCOL.md "Tree": every level has
 * its own secret).  The leaf gets its key at the root and the root's
 * aggregator key, never the root's secret.
 */
static int leaf_auth(const uint8_t *root_secret, uint32_t job, uint32_t l,
		     uint8_t *leaf_secret, struct hg_job_config *ej)
{
	uint8_t msg[8] = { 'l',
			   'e',
			   'a',
			   'f',
			   (uint8_t)(l >> 24),
			   (uint8_t)(l >> 16),
			   (uint8_t)(l >> 8),
			   (uint8_t)l };
	int rc;

	if (crypto_generichash(leaf_secret, HG_AUTH_SECRET_LEN, msg, sizeof(msg),
			       root_secret, HG_AUTH_SECRET_LEN) != 0)
		return -ENOTSUP;
	if (!ej)
		return 0;
	memcpy(ej->secret, leaf_secret, HG_AUTH_SECRET_LEN);
	rc = hg_auth_derive_key(root_secret, job, l, ej->up_key);
	if (!rc)
		rc = hg_auth_derive_key(root_secret, job, HG_AUTH_KEY_AGGREGATOR,
					ej->up_reply_key);
	return rc;
}

static int add_tree_job(struct hg_sim *s, int j, struct hg_job_config *ej)
{
	uint8_t root_secret[HG_AUTH_SECRET_LEN], leaf_secret[HG_AUTH_SECRET_LEN];
	struct sim_agg *root = &s->agg[s->leaves];
	uint32_t W = ej->workers, group = ej->group_ipv4, inc = ej->incarnation;
	int rc;

	memcpy(root_secret, ej->secret, sizeof(root_secret));
	ej->incarnation = root->incarnation ? root->incarnation : inc;
	ej->workers = s->leaves;
	ej->group_ipv4 = group ? ROOT_GROUP_BASE + (uint32_t)j : 0;
	rc = hg_engine_add_job(root->engine, ej);
	if (rc)
		goto out;
	ej->up = 1;
	agg_addr(s->leaves, ej->up_mac, &ej->up_ipv4);
	ej->up_port = HG_UDP_PORT;
	ej->up_group = ej->group_ipv4;
	ej->up_rto_ns = s->cfg.up_rto_ns;
	ej->up_give_up_ns = s->cfg.up_give_up_ns;
	for (uint32_t l = 0; l < s->leaves; l++) {
		ej->workers = leaf_first(s, W, l + 1) - leaf_first(s, W, l);
		ej->up_worker = (uint16_t)l;
		ej->up_base = (uint16_t)leaf_first(s, W, l);
		ej->up_leaves = (uint16_t)s->leaves;
		ej->group_ipv4 = group ? group + (l << 8) : 0;
		ej->incarnation = s->agg[l].incarnation ? s->agg[l].incarnation :
							  inc;
		if (ej->auth &&
		    (rc = leaf_auth(root_secret, ej->job, l, leaf_secret, ej)))
			goto out;
		rc = hg_engine_add_job(s->agg[l].engine, ej);
		if (rc)
			goto out;
	}
out:
	hg_auth_wipe(root_secret, sizeof(root_secret));
	hg_auth_wipe(leaf_secret, sizeof(leaf_secret));
	hg_auth_wipe(ej->secret, sizeof(ej->secret));
	hg_auth_wipe(ej->up_key, sizeof(ej->up_key));
	hg_auth_wipe(ej->up_reply_key, sizeof(ej->up_reply_key));
	return rc;
}

/* The frames a job of W workers and S slots keeps in flight towards
 * aggregator k: one per slot from each worker (tree: each leaf's part of
 * the workers; the root gets one per slot from each leaf). */
static uint64_t job_frames(const struct hg_sim *s, uint32_t k, uint32_t W,
			   uint32_t S)
{
	if (!s->leaves)
		return (uint64_t)W * S;
	if (k == s->leaves)
		return (uint64_t)s->leaves * S;
	return (uint64_t)(leaf_first(s, W, k + 1) - leaf_first(s, W, k)) * S;
}

int hg_sim_agg_frames(const struct hg_sim *s, uint32_t k, uint32_t workers,
		      uint32_t slots, uint64_t *frames, uint32_t *held)
{
	if (!s || !frames || !held || k >= s->naggs || !workers ||
	    workers > HG_MAX_WORKERS || workers < s->leaves)
		return -EINVAL;
	*frames = job_frames(s, k, workers, slots ? slots : DEFAULT_SLOTS);
	*held = s->agg[k].held_frames;
	return 0;
}

/* -ERANGE when the job's frames in flight, with those of the jobs already
 * on it, overflow an aggregator's receive ring (docs/PROTOCOL.md Part 2,
 * "Frames in flight"). */
static int check_rings(const struct hg_sim *s, uint32_t W, uint32_t S)
{
	for (uint32_t k = 0; k < s->naggs; k++)
		if ((uint64_t)s->agg[k].held_frames + job_frames(s, k, W, S) >
		    HG_SIM_AGG_RX_RING)
			return -ERANGE;
	return 0;
}

/* The slots a job's frames in flight are counted by: S, or for a flat
 * job whose workers cap their pipe below S the cap (docs/PROTOCOL.md
 * "Slots beyond the ring's share, in the NIC model"). */
static uint32_t ring_slots(const struct hg_sim *s,
			   const struct hg_sim_job_config *jc, uint32_t S)
{
	if (!s->leaves && jc->pipe_gain_pct && jc->pipe_max && jc->pipe_max < S)
		return jc->pipe_max;
	return S;
}

int hg_sim_add_job(struct hg_sim *s, const struct hg_sim_job_config *jc)
{
	struct hg_job_config ej = { 0 };
	uint8_t mac[6] = { 2, 0, 1, 0, 0, 0 };
	struct hg_client_agg aggs[HG_SIM_MAX_AGGREGATORS];
	struct hg_client_config cc = { 0 };
	struct sim_job *job;
	uint64_t seed;
	uint32_t inc;
	int j, rc;

	if (!s || !jc)
		return -EINVAL;
	if (jc->workers == 0 || jc->workers > HG_MAX_WORKERS ||
	    jc->workers < s->leaves)
		return -ERANGE;
	if (s->njobs == HG_SIM_MAX_JOBS)
		return -ENOSPC;
	if ((rc = check_rings(s, jc->workers,
			      ring_slots(s, jc,
					 jc->slots ? jc->slots : DEFAULT_SLOTS))))
		return rc;
	j = s->njobs;
	job = &s->jobs[j];
	memset(job, 0, sizeof(*job));
	job->id = JOB_ID_BASE + (uint32_t)j;
	seed = s->cfg.seed ^ (0x5eedull << 32) ^ (uint64_t)j;
	job->token = (uint32_t)hg_splitmix64(&seed) | 1;
	job->workers = jc->workers;
	job->slots = jc->slots ? jc->slots : DEFAULT_SLOTS;

	ej.job = job->id;
	ej.token = job->token;
	ej.workers = job->workers;
	ej.slots = job->slots;
	ej.payload_bytes = s->cfg.payload_bytes;
	ej.group_ipv4 = s->cfg.unicast_results ? 0 : GROUP_BASE + (uint32_t)j;
	inc = jc->incarnation ? jc->incarnation : HG_SIM_INCARNATION;
	ej.auth = jc->auth;
	ej.mac = jc->mac;
	memcpy(ej.secret, jc->secret, sizeof(ej.secret));
	for (uint32_t k = 0; k < s->naggs; k++) {
		agg_addr(k, aggs[k].mac, &aggs[k].ipv4);
		aggs[k].udp_port = HG_UDP_PORT;
		if (s->leaves)
			continue;
		ej.shard = (uint8_t)k;
		ej.incarnation = s->agg[k].incarnation ? s->agg[k].incarnation :
							 inc;
		rc = hg_engine_add_job(s->agg[k].engine, &ej);
		if (rc)
			return rc;
	}
	if (s->leaves) {
		struct hg_job_config tj = ej;

		tj.incarnation = inc;
		rc = add_tree_job(s, j, &tj);
		if (rc)
			return rc;
	}

	job->w = calloc(job->workers, sizeof(*job->w));
	if (!job->w)
		return -ENOMEM;
	s->njobs++; /* from here on destroy frees what exists */
	for (uint32_t k = 0; k < s->naggs; k++)
		s->agg[k].held_frames += (uint32_t)
			job_frames(s, k, job->workers,
				   ring_slots(s, jc, job->slots));
	cc.job = job->id;
	cc.token = job->token;
	cc.workers = job->workers;
	cc.slots = job->slots;
	cc.payload_bytes = s->cfg.payload_bytes;
	cc.naggs = s->naggs;
	cc.aggs = aggs;
	cc.group_ipv4 = ej.group_ipv4;
	cc.rto_ns = jc->rto_ns;
	cc.rto_max_ns = jc->rto_max_ns;
	cc.give_up_ns = jc->give_up_ns;
	cc.rto_min_ns = jc->rto_min_ns;
	cc.rto_granularity_ns = jc->rto_granularity_ns;
	cc.start_wait_ns = jc->start_wait_ns;
	cc.incarnation = inc;
	cc.pipeline_groups = jc->pipeline_groups;
	cc.pipe_gain_pct = jc->pipe_gain_pct;
	cc.pipe_max = jc->pipe_max;
	cc.auth = jc->auth;
	cc.mac = jc->mac;
	memcpy(cc.secret, jc->secret, sizeof(cc.secret));
	hg_auth_wipe(ej.secret, sizeof(ej.secret));
	rc = -ENOMEM; /* a port that could not be added */
	for (uint32_t w = 0; w < job->workers; w++) {
		struct sim_worker *sw = &job->w[w];

		sw->sim = s;
		sw->kill_at = UINT64_MAX;
		mac[3] = (uint8_t)j;
		mac[4] = (uint8_t)(w >> 8);
		mac[5] = (uint8_t)w;
		sw->nport = add_port(s, mac, worker_ip(j, w), s->cfg.link_gbps,
				     true, s->cfg.worker_tx_ring);
		if (!sw->nport)
			break;
		sw->inner = hg_nic_port_get(sw->nport);
		sw->wrap.ops = &worker_port_ops;
		sw->wrap.ctx = sw;
		cc.port = &sw->wrap;
		cc.worker = w;
		if (s->leaves) {
			/* its leaf is its one aggregator, its id there local */
			uint32_t l = leaf_of(s, job->workers, w);

			cc.naggs = 1;
			cc.aggs = &aggs[l];
			cc.agg_worker = w - leaf_first(s, job->workers, l);
			cc.agg_workers = leaf_first(s, job->workers, l + 1) -
					 leaf_first(s, job->workers, l);
			cc.group_ipv4 = ej.group_ipv4 ? GROUP_BASE + (uint32_t)j +
								(l << 8) :
							0;
			if (cc.auth &&
			    leaf_auth(jc->secret, job->id, l, cc.secret, NULL))
				break;
		}
		errno = 0;
		sw->client = hg_client_create(&cc);
		if (!sw->client) {
			/* why the client refused (EINVAL: a field out of range) */
			rc = errno ? -errno : -ENOMEM;
			break;
		}
	}
	hg_auth_wipe(cc.secret, sizeof(cc.secret));
	return job->w[job->workers - 1].client ? j : rc;
}

static struct sim_job *get_job(const struct hg_sim *s, int job)
{
	if (!s || job < 0 || job >= s->njobs)
		return NULL;
	return (struct sim_job *)&s->jobs[job];
}

/*
 * Tree: the next epoch of every key of job jb from the root's new secret,
 * in the order of docs/PROTOCOL.md "Key epochs in a tree": every leaf the
 * root's next keys, the root, then leaf by leaf its workers and the leaf
 * (its next secret derived as at add_tree_job).  The new epoch, or -errno.
 */
static int rotate_tree(struct hg_sim *s, struct sim_job *jb,
		       const uint8_t *secret, uint64_t grace_ns)
{
	uint8_t leaf_secret[HG_AUTH_SECRET_LEN];
	struct hg_job_config ej;
	uint32_t W = jb->workers;
	int rc = 0, epoch = -EPERM;

	memset(&ej, 0, sizeof(ej));
	for (uint32_t l = 0; l < s->leaves && !rc; l++) {
		rc = leaf_auth(secret, jb->id, l, leaf_secret, &ej);
		if (!rc) {
			rc = hg_engine_rotate_up_key(s->agg[l].engine, jb->id,
						     ej.up_key, ej.up_reply_key);
			rc = rc < 0 ? rc : 0;
		}
	}
	if (!rc) {
		epoch = hg_engine_rotate_key(s->agg[s->leaves].engine, jb->id,
					     secret, grace_ns);
		rc = epoch < 0 ? epoch : 0;
	}
	for (uint32_t l = 0; l < s->leaves && !rc; l++) {
		rc = leaf_auth(secret, jb->id, l, leaf_secret, NULL);
		for (uint32_t w = leaf_first(s, W, l);
		     w < leaf_first(s, W, l + 1) && !rc; w++)
			rc = hg_client_rotate_key(jb->w[w].client, leaf_secret,
						  (uint8_t)(jb->epoch + 1));
		if (!rc) {
			int e = hg_engine_rotate_key(s->agg[l].engine, jb->id,
						     leaf_secret, grace_ns);

			rc = e < 0 ? e : 0;
		}
	}
	hg_auth_wipe(leaf_secret, sizeof(leaf_secret));
	hg_auth_wipe(&ej, sizeof(ej));
	return rc ? rc : epoch;
}

int hg_sim_rotate_key(struct hg_sim *s, int job, const uint8_t *secret,
		      uint64_t grace_ns)
{
	struct sim_job *jb = get_job(s, job);
	int rc = 0, epoch = -EPERM;

	if (!jb || !secret)
		return jb ? -EINVAL : -ENOENT;
	for (uint32_t k = 0; k < s->naggs && !rc; k++) {
		struct hg_job_config jc;

		/* refuse before any worker has the key: the job must auth */
		rc = hg_engine_job_config(s->agg[k].engine, jb->id, &jc);
		if (!rc && !jc.auth)
			rc = -EPERM;
	}
	if (!rc && s->leaves) {
		epoch = rotate_tree(s, jb, secret, grace_ns);
		rc = epoch < 0 ? epoch : 0;
	}
	for (uint32_t w = 0; w < jb->workers && !rc && !s->leaves; w++)
		rc = hg_client_rotate_key(jb->w[w].client, secret,
					  (uint8_t)(jb->epoch + 1));
	for (uint32_t k = 0; k < s->naggs && !rc && !s->leaves; k++) {
		epoch = hg_engine_rotate_key(s->agg[k].engine, jb->id, secret,
					     grace_ns);
		if (epoch < 0)
			rc = epoch;
	}
	if (rc)
		return rc;
	jb->epoch = (uint8_t)epoch;
	return epoch;
}

int hg_sim_job_wire(const struct hg_sim *s, int job, uint32_t *job_id,
		    uint32_t *token)
{
	const struct sim_job *jb = get_job(s, job);

	if (!jb || !job_id || !token)
		return -EINVAL;
	*job_id = jb->id;
	*token = jb->token;
	return 0;
}

int hg_sim_start(struct hg_sim *s, int job, int method, const struct hg_params *p,
		 const float *const *x, size_t n, float *const *y)
{
	struct sim_job *jb = get_job(s, job);
	int rc;

	if (!jb || !p || !x || !y)
		return -EINVAL;
	for (uint32_t w = 0; w < jb->workers; w++)
		if (jb->w[w].active)
			return -EBUSY;
	for (uint32_t w = 0; w < jb->workers; w++) {
		struct sim_worker *sw = &jb->w[w];

		sw->status = 0;
		if (sw->dead) {
			sw->status = -ESHUTDOWN;
			continue;
		}
		sw->deadline = 0;
		if (sw->start_delay) {
			/* a straggler: its client starts the allreduce later
			 * (hg_sim_run), as a rank still computing would */
			sw->pending = true;
			sw->start_at = hg_nic_now(s->fab) + sw->start_delay;
			sw->p = *p;
			sw->method = method;
			sw->x = x[w];
			sw->n = n;
			sw->y = y[w];
			sw->active = true;
			continue;
		}
		rc = hg_client_start(sw->client, p, method, x[w], n, y[w]);
		if (rc) {
			/* Undo nothing: the others that started simply run
			 * until they give up, as a real cluster would. */
			sw->status = rc;
			if (w == 0)
				return rc;
			continue;
		}
		sw->active = true;
	}
	return 0;
}

/* ---- the event loop ---------------------------------------------------- */

int hg_sim_restart_aggregator(struct hg_sim *s, uint32_t k,
			      uint64_t after_frames, uint32_t incarnation)
{
	uint64_t rx = 0;

	if (!s || k >= s->naggs)
		return -EINVAL;
	hg_engine_counters(s->agg[k].engine, &rx, 1);
	s->agg[k].restart_at = rx + after_frames;
	s->agg[k].restart_incarnation = incarnation;
	return 0;
}

/* A restart of aggregator k is due: every job starts over there. */
static void restart_due(struct hg_sim *s, uint32_t k)
{
	struct sim_agg *ag = &s->agg[k];
	struct hg_job_config ec;
	uint64_t rx = 0;

	if (ag->restart_at == UINT64_MAX)
		return;
	hg_engine_counters(ag->engine, &rx, 1);
	if (rx < ag->restart_at)
		return;
	ag->restart_at = UINT64_MAX;
	for (int j = 0; j < s->njobs; j++) {
		if (hg_engine_job_config(ag->engine, s->jobs[j].id, &ec))
			continue;
		ec.incarnation = ag->restart_incarnation ?
					 ag->restart_incarnation :
					 ec.incarnation + 1;
		if (!ec.incarnation)
			ec.incarnation = 1;
		ag->incarnation = ec.incarnation;
		/* Cannot fail: the same job was there (memory aside). */
		hg_engine_remove_job(ag->engine, ec.job);
		hg_engine_add_job(ag->engine, &ec);
	}
}

static bool rx_pending(const struct hg_sim *s)
{
	uint64_t now = hg_nic_now(s->fab);

	for (uint32_t k = 0; k < s->naggs; k++)
		if (now < s->agg[k].dead_at &&
		    hg_nic_port_rx_pending(s->agg[k].port))
			return true;
	for (int j = 0; j < s->njobs; j++)
		for (uint32_t w = 0; w < s->jobs[j].workers; w++) {
			const struct sim_worker *sw = &s->jobs[j].w[w];

			if (sw->active && !sw->pending &&
			    hg_nic_port_rx_pending(sw->nport))
				return true;
		}
	return false;
}

/* Drain the dead hosts' rx rings so they do not hold pool buffers. */
static void drain_dead(struct hg_sim *s)
{
	struct hg_pkt *pk[32];

	for (uint32_t k = 0; k < s->naggs; k++) {
		struct hg_port *p = hg_nic_port_get(s->agg[k].port);
		uint16_t nb;

		if (s->agg[k].dead_at == UINT64_MAX ||
		    s->agg[k].dead_at > hg_nic_now(s->fab))
			continue;
		while ((nb = p->ops->rx_burst(p->ctx, pk, 32)))
			p->ops->free_bulk(p->ctx, pk, nb);
	}

	for (int j = 0; j < s->njobs; j++)
		for (uint32_t w = 0; w < s->jobs[j].workers; w++) {
			struct sim_worker *sw = &s->jobs[j].w[w];
			uint16_t nb;

			if (!sw->dead)
				continue;
			while ((nb = sw->inner->ops->rx_burst(sw->inner->ctx,
							      pk, 32)))
				sw->inner->ops->free_bulk(sw->inner->ctx, pk, nb);
		}
}

int hg_sim_run(struct hg_sim *s, uint64_t max_ns)
{
	uint64_t now, end, t, nic_t;
	bool has_nic;

	if (!s)
		return -EINVAL;
	now = hg_nic_now(s->fab);
	end = UINT64_MAX - now > max_ns ? now + max_ns : UINT64_MAX;
	for (;;) {
		uint64_t min_dl = UINT64_MAX;
		bool any = false;

		s->st.loop_rounds++;
		for (uint32_t k = 0; k < s->naggs; k++) {
			if (now >= s->agg[k].dead_at)
				continue;
			restart_due(s, k);
			while (hg_engine_poll(s->agg[k].engine) > 0) {
				s->st.engine_polls++;
				restart_due(s, k);
			}
		}
		for (int j = 0; j < s->njobs; j++)
			for (uint32_t w = 0; w < s->jobs[j].workers; w++) {
				struct sim_worker *sw = &s->jobs[j].w[w];
				uint64_t dl;
				int rc;

				if (!sw->active)
					continue;
				if (sw->dead) {
					sw->active = false;
					sw->pending = false;
					sw->status = -ESHUTDOWN;
					continue;
				}
				if (sw->pending) {
					any = true;
					if (now < sw->start_at) {
						if (sw->start_at < min_dl)
							min_dl = sw->start_at;
						continue;
					}
					sw->pending = false;
					rc = hg_client_start(sw->client, &sw->p,
							     sw->method, sw->x,
							     sw->n, sw->y);
					if (rc != 0) {
						sw->active = false;
						sw->status = rc;
						continue;
					}
					sw->deadline = 0;
				}
				/* A client acts only on a frame or a timer:
				 * poll it only then (the loop's main cost). */
				if (now >= sw->deadline ||
				    hg_nic_port_rx_pending(sw->nport)) {
					rc = hg_client_poll(sw->client, &dl);
					if (rc != 0) {
						sw->active = false;
						sw->status = rc;
						continue;
					}
					sw->deadline = dl;
				}
				any = true;
				if (sw->deadline < min_dl)
					min_dl = sw->deadline;
			}
		/* tree leaves: their upward timers */
		for (uint32_t k = 0; k < s->leaves; k++) {
			uint64_t dl = hg_engine_next_deadline(s->agg[k].engine);

			if (now < s->agg[k].dead_at && dl < min_dl)
				min_dl = dl;
		}
		drain_dead(s);
		if (!any)
			return 0;
		if (rx_pending(s))
			continue;
		has_nic = hg_nic_next_event(s->fab, &nic_t);
		if (has_nic && nic_t <= now) {
			hg_nic_advance_to(s->fab, now);
			continue;
		}
		t = min_dl;
		if (has_nic && nic_t < t)
			t = nic_t;
		if (t <= now)
			t = has_nic ? nic_t :
				      now + 1000; /* a refused frame: retry later */
		if (t > end) {
			if (end > now)
				hg_nic_advance_to(s->fab, end);
			return -ETIMEDOUT;
		}
		hg_nic_advance_to(s->fab, t);
		s->st.time_advances++;
		now = t;
	}
}

/* ---- per-worker results ------------------------------------------------ */

static const struct sim_worker *get_worker(const struct hg_sim *s, int job,
					   uint32_t worker)
{
	const struct sim_job *jb = get_job(s, job);

	if (!jb || worker >= jb->workers)
		return NULL;
	return &jb->w[worker];
}

int hg_sim_worker_status(const struct hg_sim *s, int job, uint32_t worker)
{
	const struct sim_worker *sw = get_worker(s, job, worker);

	return sw ? sw->status : -EINVAL;
}

const char *hg_sim_worker_error(const struct hg_sim *s, int job, uint32_t worker)
{
	const struct sim_worker *sw = get_worker(s, job, worker);

	if (!sw)
		return "no such worker";
	if (sw->status == -ESHUTDOWN)
		return "worker stopped (killed)";
	return hg_client_error_text(sw->client);
}

int hg_sim_worker_stats(const struct hg_sim *s, int job, uint32_t worker,
			struct hg_client_stats *st)
{
	const struct sim_worker *sw = get_worker(s, job, worker);

	if (!sw)
		return -EINVAL;
	return hg_client_get_stats(sw->client, st);
}

int hg_sim_kill_worker(struct hg_sim *s, int job, uint32_t worker,
		       uint64_t after_packets)
{
	struct sim_worker *sw = (struct sim_worker *)get_worker(s, job, worker);

	if (!sw)
		return -ENOENT;
	sw->kill_at = sw->tx_frames + after_packets;
	if (after_packets == 0)
		sw->dead = true;
	return 0;
}

/* ---- hand-made frames -------------------------------------------------- */

int hg_sim_inject(struct hg_sim *s, const uint8_t *frame, size_t len)
{
	uint16_t l;

	if (!s || !frame || len == 0 || len > (size_t)s->mtu + 14)
		return -EINVAL;
	l = (uint16_t)len;
	return hg_nic_port_send_frames(s->attacker, frame, &l, 1) == 1 ? 0 :
									 -ENOSPC;
}

int hg_sim_build_frame(const struct hg_sim *s, const struct hg_hdr *h,
		       const uint8_t *payload, size_t payload_len,
		       uint8_t *frame, size_t cap, const struct hg_wire_mac *m)
{
	struct hg_wire_addr src = { { 2, 0, 0, 0, 0, 2 }, ATTACKER_IP, HG_UDP_PORT };
	struct hg_wire_addr dst = { { 2, 0, 0, 0, 0, 1 }, AGG_IP, HG_UDP_PORT };

	if (!s || !h)
		return -EINVAL;
	return hg_wire_build_mac(frame, cap, &src, &dst, h, payload,
				 payload_len, 0, m);
}

int hg_sim_kill_aggregator(struct hg_sim *s, uint32_t k, uint64_t after_ns)
{
	uint64_t now;

	if (!s)
		return -EINVAL;
	if (k >= s->naggs)
		return -ENOENT;
	now = hg_nic_now(s->fab);
	s->agg[k].dead_at = UINT64_MAX - now > after_ns ? now + after_ns :
							  UINT64_MAX - 1;
	return 0;
}

int hg_sim_worker_agg_stats(const struct hg_sim *s, int job, uint32_t worker,
			    uint32_t k, struct hg_client_agg_stats *st)
{
	const struct sim_worker *sw = get_worker(s, job, worker);

	if (!sw)
		return -EINVAL;
	return hg_client_get_agg_stats(sw->client, k, st);
}

struct hg_engine *hg_sim_engine(struct hg_sim *s)
{
	return s ? s->agg[0].engine : NULL;
}

struct hg_engine *hg_sim_aggregator_engine(struct hg_sim *s, uint32_t k)
{
	return s && k < s->naggs ? s->agg[k].engine : NULL;
}

struct hg_nic_port *hg_sim_aggregator_port(struct hg_sim *s, uint32_t k)
{
	return s && k < s->naggs ? s->agg[k].port : NULL;
}

uint32_t hg_sim_aggregators(const struct hg_sim *s)
{
	return s ? s->naggs : 0;
}

struct hg_nic_fabric *hg_sim_fabric(struct hg_sim *s)
{
	return s ? s->fab : NULL;
}

uint64_t hg_sim_now(const struct hg_sim *s)
{
	return s ? hg_nic_now(s->fab) : 0;
}

int hg_sim_get_stats(const struct hg_sim *s, struct hg_sim_stats *st)
{
	uint64_t fc[HG_NIC_FC__COUNT];

	if (!s || !st)
		return -EINVAL;
	*st = s->st;
	st->now_ns = hg_nic_now(s->fab);
	hg_nic_fabric_counters(s->fab, fc, HG_NIC_FC__COUNT);
	st->frames_tx = fc[HG_NIC_FC_SENT];
	st->frames_rx = fc[HG_NIC_FC_DELIVERED];
	return 0;
}

int hg_sim_delay_start(struct hg_sim *s, int job, uint32_t worker, uint64_t delay_ns)
{
	struct sim_worker *sw = (struct sim_worker *)get_worker(s, job, worker);

	if (!sw)
		return -EINVAL;
	sw->start_delay = delay_ns;
	return 0;
}
