/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The worker client (homagg/client.h): one allreduce as a state machine of
 * steps, in four files as TCP's input, output and timer are split:
 * client_method.c sequences a method's steps and phases (what is sent),
 * client_window.c moves the chunks of a step through per-aggregator
 * windows (how it is sent and repaired), client_rto.c estimates the
 * retransmission timeout (when to give up waiting), and this file creates
 * the client and drives it (poll, the blocking allreduce).  Their shared
 * state is struct hg_client (client_pvt.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "homagg/kernels.h"

#include "client_pvt.h"

int hg_cl_buf_need(struct buf *b, size_t n)
{
	uint8_t *p;

	if (n == 0)
		n = 4;
	if (n <= b->cap)
		return 0;
	p = realloc(b->p, n);
	if (!p)
		return -ENOMEM;
	b->p = p;
	b->cap = n;
	return 0;
}

static void buf_free(struct buf *b)
{
	free(b->p);
	b->p = NULL;
	b->cap = 0;
}

static void wipe_keys(struct hg_client *c)
{
	for (int i = 0; i < 2; i++) {
		hg_mac_key_release(&c->keys[i]);
		hg_mac_key_release(&c->next[i]);
	}
	hg_mac_key_release(&c->prev_agg);
}

struct hg_client *hg_client_create(const struct hg_client_config *cfg)
{
	struct hg_client *c;
	int rc = -EINVAL;

	if (!cfg || !cfg->port || !cfg->port->ops)
		goto err;
	if (cfg->workers == 0 || cfg->workers > HG_MAX_WORKERS ||
	    cfg->worker >= cfg->workers)
		goto err;
	if (cfg->slots == 0 || cfg->slots > HG_CLIENT_MAX_SLOTS)
		goto err;
	if (cfg->payload_bytes < 4 || cfg->payload_bytes > HG_MAX_PAYLOAD ||
	    cfg->payload_bytes % 4)
		goto err;
	if ((cfg->backoff_num == 0) != (cfg->backoff_den == 0) ||
	    cfg->backoff_num < cfg->backoff_den)
		goto err;
	if (cfg->naggs > HG_CLIENT_MAX_AGGREGATORS || (cfg->naggs && !cfg->aggs))
		goto err;
	if (cfg->agg_workers ? cfg->agg_workers > cfg->workers ||
				       cfg->agg_worker >= cfg->agg_workers ||
				       cfg->agg_worker > cfg->worker :
			       cfg->agg_worker != 0)
		goto err;

	rc = -ENOMEM;
	/* aligned for the AES-GMAC key states it holds (any allocator) */
	if (posix_memalign((void **)&c, 64, sizeof(*c)))
		c = NULL;
	else
		memset(c, 0, sizeof(*c));
	if (!c)
		goto err;
	c->cfg = *cfg;
	if (!c->cfg.agg_workers) {
		c->cfg.agg_workers = cfg->workers;
		c->cfg.agg_worker = cfg->worker;
	}
	if (!c->cfg.agg_udp_port)
		c->cfg.agg_udp_port = HG_UDP_PORT;
	if (!c->cfg.rto_ns)
		c->cfg.rto_ns = HG_CLIENT_DEFAULT_RTO_NS;
	if (!c->cfg.rto_max_ns)
		c->cfg.rto_max_ns = HG_CLIENT_DEFAULT_RTO_MAX_NS;
	if (c->cfg.rto_max_ns < c->cfg.rto_ns)
		c->cfg.rto_max_ns = c->cfg.rto_ns;
	if (!c->cfg.rto_min_ns)
		c->cfg.rto_min_ns = c->cfg.rto_ns < HG_CLIENT_DEFAULT_RTO_MIN_NS ?
					    c->cfg.rto_ns :
					    HG_CLIENT_DEFAULT_RTO_MIN_NS;
	if (!c->cfg.rto_granularity_ns)
		c->cfg.rto_granularity_ns = HG_CLIENT_RTO_GRANULARITY_NS;
	rc = -EINVAL;
	if (c->cfg.rto_min_ns > c->cfg.rto_max_ns ||
	    c->cfg.rto_granularity_ns > c->cfg.rto_max_ns ||
	    c->cfg.pipe_gain_pct > HG_CLIENT_MAX_PIPE_GAIN_PCT ||
	    (c->cfg.pipe_max && c->cfg.pipe_max < PIPE_MIN))
		goto err_free;
	if (!c->cfg.incarnation)
		c->cfg.incarnation = hg_wire_incarnation_now();
	hg_auth_wipe(c->cfg.secret, sizeof(c->cfg.secret));
	if (cfg->auth) {
		if (!c->cfg.mac)
			c->cfg.mac = hg_auth_default_mac();
		/* -ENOTSUP: the job's MAC algorithm is not available here */
		rc = hg_mac_key_derive(&c->keys[0], c->cfg.mac, cfg->secret,
				       cfg->job, c->cfg.agg_worker);
		if (!rc)
			rc = hg_mac_key_derive(&c->keys[1], c->cfg.mac, cfg->secret,
					       cfg->job, HG_AUTH_KEY_AGGREGATOR);
		if (rc)
			goto err_free;
		c->epoch = cfg->epoch;
		c->mac_len = HG_MAC_LEN;
	}
	if (!c->cfg.give_up_ns)
		c->cfg.give_up_ns = HG_CLIENT_DEFAULT_GIVE_UP_NS;
	if (!c->cfg.start_wait_ns)
		c->cfg.start_wait_ns = 4 * c->cfg.rto_ns;
	if (c->cfg.start_wait_ns > c->cfg.give_up_ns / 4)
		c->cfg.start_wait_ns = c->cfg.give_up_ns / 4;
	c->start_wait[0] = c->start_wait[1] = c->cfg.start_wait_ns;
	if (!c->cfg.backoff_num) {
		c->cfg.backoff_num = 2;
		c->cfg.backoff_den = 1;
	}
	rc = cfg->port->ops->get_info(cfg->port->ctx, &c->me);
	if (rc < 0)
		goto err_free;
	rc = -EMSGSIZE;
	if (c->me.mtu && c->me.mtu < IP_LEN + UDP_LEN + HG_HDR_LEN +
					     cfg->payload_bytes + c->mac_len)
		goto err_free;
	memcpy(c->src.mac, c->me.mac, 6);
	c->src.ipv4 = c->me.ipv4;
	c->src.port = c->me.udp_port ? c->me.udp_port : HG_UDP_PORT;
	c->naggs = cfg->naggs ? cfg->naggs : 1;
	c->cfg.aggs = NULL; /* the caller's array is not kept */
	rc = -ENOMEM;
	c->agg = calloc(c->naggs, sizeof(*c->agg));
	if (!c->agg)
		goto err_free;
	for (uint32_t a = 0; a < c->naggs; a++) {
		struct agg *ag = &c->agg[a];

		if (cfg->naggs) {
			memcpy(ag->dst.mac, cfg->aggs[a].mac, 6);
			ag->dst.ipv4 = cfg->aggs[a].ipv4;
			ag->dst.port = cfg->aggs[a].udp_port;
		} else {
			memcpy(ag->dst.mac, c->cfg.agg_mac, 6);
			ag->dst.ipv4 = c->cfg.agg_ipv4;
			ag->dst.port = c->cfg.agg_udp_port;
		}
		if (!ag->dst.port)
			ag->dst.port = HG_UDP_PORT;
		ag->rto = c->cfg.rto_ns;
		ag->rto_est = c->cfg.rto_ns;
	}
	if (cfg->group_ipv4 && cfg->port->ops->join_group) {
		rc = cfg->port->ops->join_group(cfg->port->ctx, cfg->group_ipv4);
		if (rc < 0)
			goto err_free_agg;
	}
	rc = -ENOMEM;
	c->fl = calloc((size_t)c->naggs * cfg->slots, sizeof(*c->fl));
	if (!c->fl)
		goto err_free_agg;
	c->stats.method_chosen = 0;
	c->stats.input_nonzeros = UINT64_MAX; /* no allreduce yet */
	return c;

err_free_agg:
	free(c->agg);
err_free:
	wipe_keys(c);
	free(c);
err:
	errno = -rc;
	return NULL;
}

int hg_client_rotate_key(struct hg_client *c, const uint8_t *secret, uint32_t epoch)
{
	int rc;

	if (!c || !secret)
		return -EINVAL;
	if (!c->mac_len)
		return -EPERM;
	if (epoch != (uint8_t)(c->epoch + 1))
		return -EINVAL;
	/* a next secret given again replaces the first */
	hg_mac_key_release(&c->next[0]);
	hg_mac_key_release(&c->next[1]);
	c->has_next = false;
	rc = hg_mac_key_derive(&c->next[0], c->cfg.mac, secret, c->cfg.job,
			       c->cfg.agg_worker);
	if (!rc)
		rc = hg_mac_key_derive(&c->next[1], c->cfg.mac, secret,
				       c->cfg.job, HG_AUTH_KEY_AGGREGATOR);
	if (rc) {
		hg_mac_key_release(&c->next[0]);
		hg_mac_key_release(&c->next[1]);
		return rc;
	}
	c->has_next = true;
	return 0;
}

void hg_cl_key_switch(struct hg_client *c)
{
	if (!c->has_next)
		return;
	/* keys move: the current aggregator key becomes the previous one */
	hg_mac_key_release(&c->prev_agg);
	c->prev_agg = c->keys[1];
	c->has_prev = true;
	hg_mac_key_release(&c->keys[0]);
	memcpy(c->keys, c->next, sizeof(c->keys));
	sodium_memzero(c->next, sizeof(c->next));
	c->has_next = false;
	c->epoch++;
	c->mac_ctr = 0;
}

/* Every group's lhc (with G = 1 the one of the whole tensor). */
void hg_cl_release_lhc(struct hg_client *c)
{
	struct hg_lhc **l = (struct hg_lhc **)c->glhc.p;

	for (uint32_t g = 0; l && g < c->groups; g++) {
		hg_lhc_destroy_into(l[g], &c->lhc_scratch);
		l[g] = NULL;
	}
	c->lhc = NULL;
}

void hg_client_destroy(struct hg_client *c)
{
	if (!c)
		return;
	hg_cl_release_lhc(c);
	hg_lhc_scratch_free(&c->lhc_scratch);
	hg_scan_destroy(c->scan);
	buf_free(&c->lcounts);
	buf_free(&c->gcounts);
	buf_free(&c->done);
	buf_free(&c->glast);
	buf_free(&c->glhc);
	buf_free(&c->gmethod);
	hg_cl_release_segment(c);
	for (int ph = 0; ph < HG_PH__COUNT; ph++) {
		buf_free(&c->tx[ph]);
		buf_free(&c->rx[ph]);
	}
	free(c->fl);
	free(c->agg);
	wipe_keys(c);
	free(c);
}

bool hg_client_busy(const struct hg_client *c)
{
	return c && c->stage != ST_IDLE && c->stage != ST_DONE &&
	       c->stage != ST_FAILED;
}

const char *hg_client_error_text(const struct hg_client *c)
{
	return c ? c->err : "";
}

#define HG_CS_NAME_(type, name, doc) { #name, false },
#define HG_CS_PER_PHASE_NAME_(name, doc) { #name, true },
static const struct {
	const char *name;
	bool per_phase;
} client_stat_fields[] = { HG_FOREACH_CLIENT_STAT(HG_CS_NAME_,
						  HG_CS_PER_PHASE_NAME_) };
#undef HG_CS_NAME_
#undef HG_CS_PER_PHASE_NAME_

#define CLIENT_STAT_COUNT                                                      \
	(unsigned)(sizeof(client_stat_fields) / sizeof(client_stat_fields[0]))

unsigned hg_client_stat_count(void)
{
	return CLIENT_STAT_COUNT;
}

const char *hg_client_stat_name(unsigned i)
{
	return i < CLIENT_STAT_COUNT ? client_stat_fields[i].name : NULL;
}

bool hg_client_stat_per_phase(unsigned i)
{
	return i < CLIENT_STAT_COUNT && client_stat_fields[i].per_phase;
}

int hg_client_get_stats(const struct hg_client *c, struct hg_client_stats *st)
{
	const struct agg *slow;

	if (!c || !st)
		return -EINVAL;
	*st = c->stats;
	st->next_seq = c->next_chunk;
	st->aggregators = c->naggs;
	st->rtt_samples = 0;
	slow = &c->agg[0];
	for (uint32_t a = 0; a < c->naggs; a++) {
		st->rtt_samples += c->agg[a].st.rtt_samples;
		if (c->agg[a].rto > slow->rto)
			slow = &c->agg[a];
	}
	st->srtt_ns = slow->rtt.avg;
	st->rttvar_ns = slow->rtt.var;
	st->rto_ns = slow->rto;
	st->rto_floor_ns = slow->stall;
	/* the longer of an allreduce's first step's and a later step's */
	st->start_wait_ns = c->start_wait[0] > c->start_wait[1] ?
				    c->start_wait[0] :
				    c->start_wait[1];
	return 0;
}

int hg_client_get_agg_stats(const struct hg_client *c, uint32_t k,
			    struct hg_client_agg_stats *st)
{
	const struct agg *ag;

	if (!c || !st)
		return -EINVAL;
	if (k >= c->naggs)
		return -ERANGE;
	ag = &c->agg[k];
	*st = ag->st;
	/* The chunks c < next_chunk with c % K == k. */
	st->next_seq = c->next_chunk / c->naggs + (c->next_chunk % c->naggs > k);
	st->srtt_ns = ag->rtt.avg;
	st->rttvar_ns = ag->rtt.var;
	st->rto_ns = ag->rto;
	st->rto_floor_ns = ag->stall;
	st->pipe_limit = c->cfg.pipe_gain_pct ?
				 (uint64_t)(ag->cwnd > 0 ? ag->cwnd :
							   hg_cl_pipe_start(c)) :
				 0;
	st->rtt_min_ns = hg_cl_rtt_min(ag);
	return 0;
}

int hg_cl_fail(struct hg_client *c, int rc)
{
	c->stage = ST_FAILED;
	c->rc = rc;
	hg_cl_release_lhc(c);
	for (size_t i = 0; i < (size_t)c->naggs * c->cfg.slots; i++)
		c->fl[i].busy = false;
	return rc;
}

int hg_cl_fail_text(struct hg_client *c, int rc, const char *what)
{
	snprintf(c->err, sizeof(c->err), "%s", what);
	return hg_cl_fail(c, rc);
}

int hg_client_poll(struct hg_client *c, uint64_t *next_deadline_ns)
{
	uint64_t now;
	int rc;

	if (next_deadline_ns)
		*next_deadline_ns = UINT64_MAX;
	if (!c)
		return -EINVAL;
	switch (c->stage) {
	case ST_IDLE:
		return -EINVAL;
	case ST_DONE:
	case ST_FAILED:
		/* Keep draining so late copies do not pile up in the port. */
		hg_cl_rx_all(c, hg_port_now(c->cfg.port));
		return c->rc;
	default:
		break;
	}
	now = hg_port_now(c->cfg.port);
	c->tx_blocked = false;
	hg_cl_rx_all(c, now);
	if (c->stage == ST_FAILED)
		return c->rc;
	rc = hg_cl_advance(c);
	if (rc < 0)
		return rc;
	if (c->stage == ST_DONE)
		return 1;
	/* Retransmissions and the frames the port refused last time first:
	 * new chunks sent before a refused one would overtake it, and the
	 * peers' results of them would count as a gap (fast retransmission). */
	rc = hg_cl_tx_expired(c, now);
	if (rc < 0)
		return rc;
	hg_cl_tx_new(c, now);
	if (next_deadline_ns)
		*next_deadline_ns = hg_cl_next_deadline(c, now);
	return 0;
}

int hg_client_allreduce(struct hg_client *c, const struct hg_params *p,
			int method, const float *x, size_t n, float *y)
{
	const struct hg_port *port;
	uint64_t dl, now;
	int rc;

	rc = hg_client_start(c, p, method, x, n, y);
	if (rc)
		return rc;
	port = c->cfg.port;
	for (;;) {
		rc = hg_client_poll(c, &dl);
		if (rc != 0)
			return rc > 0 ? 0 : rc;
		now = hg_port_now(port);
		if (c->tx_blocked) {
			/* The port refused frames: wait until it takes more
			 * (or a result comes), at most one granule. */
			dl = now + HG_CLIENT_RTO_GRANULARITY_NS;
		} else if (dl <= now) {
			continue;
		}
		if (dl - now > IDLE_WAIT_NS)
			dl = now + IDLE_WAIT_NS;
		if (hg_port_can_wait(port)) {
			rc = hg_port_wait(port, dl, c->tx_blocked);
			if (rc < 0)
				return hg_cl_fail(c, rc);
		} else {
			uint64_t wait = dl - now;
			struct timespec ts;

			if (wait > HG_CLIENT_RTO_GRANULARITY_NS)
				wait = HG_CLIENT_RTO_GRANULARITY_NS;
			ts.tv_sec = 0;
			ts.tv_nsec = (long)wait;
			nanosleep(&ts, NULL);
		}
	}
}
