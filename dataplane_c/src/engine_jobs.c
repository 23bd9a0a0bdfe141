/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine's jobs (engine_pvt.h): create and destroy, the job table
 * (open addressing on the job id), per-job keys and their rotation, and
 * the counters the control path reads.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine_pvt.h"

void hg_engine_config_init(struct hg_engine_config *c)
{
	if (!c)
		return;
	memset(c, 0, sizeof(*c));
	c->max_jobs = 64;
	c->udp_port = HG_UDP_PORT;
	c->burst = 32;
	c->flags = HG_ENGINE_F_UDP_CSUM;
	c->isa = HG_ISA_BEST;
}

/*
 * Accumulator byte order: kept big-endian (the kernels' contract).  A
 * native-order SUM32 accumulator saves two byte shuffles per 64 bytes;
 * measured on the (shared) AMD EPYC development machine, AVX-512, 1024-byte
 * payloads, 128 frames cycling over 16 accumulators, best of 20: 52-57 Mpps
 * big-endian vs 55-60 Mpps native (<= 7%).  Native order would need a
 * byte-swap pass at every completion and replay; big-endian makes a result
 * one memcpy, so it stays.
 */
struct hg_engine *hg_engine_create(const struct hg_engine_config *c)
{
	struct hg_port_info info;
	struct hg_engine *e;
	uint32_t tsize = 1;

	if (!c || !c->port || !c->port->ops || c->max_jobs < 1 ||
	    c->max_jobs > HG_ENGINE_MAX_JOBS || c->burst < 1 ||
	    c->burst > HG_ENGINE_MAX_BURST || !hg_isa_supported(c->isa))
		return NULL;
	memset(&info, 0, sizeof(info));
	if (c->port->ops->get_info && c->port->ops->get_info(c->port->ctx, &info))
		return NULL;

	e = calloc(1, sizeof(*e));
	if (!e)
		goto err;
	e->jobs = calloc(c->max_jobs, sizeof(*e->jobs));
	if (!e->jobs)
		goto err_free_engine;
	while (tsize < 2 * c->max_jobs)
		tsize <<= 1;
	e->table = calloc(tsize, sizeof(*e->table));
	if (!e->table)
		goto err_free_jobs;
	e->table_mask = tsize - 1;
	e->max_jobs = c->max_jobs;
	e->port = c->port;
	memcpy(e->self.mac, info.mac, 6);
	e->self.ipv4 = info.ipv4;
	e->self.port = c->udp_port ? c->udp_port : HG_UDP_PORT;
	e->can_replicate = info.can_replicate;
	e->flags = c->flags;
	e->wire_flags = (c->flags & HG_ENGINE_F_UDP_CSUM) ? HG_WIRE_F_UDP_CSUM : 0;
	e->burst = c->burst;
	e->up_next = UINT64_MAX;
	for (int op = 1; op <= HG_OP__COUNT; op++)
		e->kern[op] = hg_kernel((enum hg_op)op, c->isa);
	return e;

err_free_jobs:
	free(e->jobs);
err_free_engine:
	free(e);
err:
	return NULL;
}

/* n keys, aligned for the AES state, zeroed; NULL when out of memory. */
static struct hg_mac_key *keys_alloc(size_t n)
{
	struct hg_mac_key *k;

	if (posix_memalign((void **)&k, 64, n * sizeof(*k)))
		return NULL;
	memset(k, 0, n * sizeof(*k));
	return k;
}

void hg_eng_keys_free(struct hg_mac_key *k, size_t n)
{
	if (!k)
		return;
	for (size_t i = 0; i < n; i++)
		hg_mac_key_release(&k[i]);
	free(k);
}

/* The W + 1 keys of secret's epoch for job j; NULL and *rc on failure. */
static struct hg_mac_key *keys_derive(const struct hg_job *j,
				      const uint8_t *secret, int *rc)
{
	uint32_t W = j->cfg.workers;
	struct hg_mac_key *k = keys_alloc(W + 1);

	*rc = -ENOMEM;
	if (!k)
		return NULL;
	for (uint32_t w = 0; w <= W; w++) {
		*rc = hg_mac_key_derive(&k[w], j->cfg.mac, secret, j->cfg.job,
					w < W ? w : HG_AUTH_KEY_AGGREGATOR);
		if (*rc) {
			hg_eng_keys_free(k, W + 1);
			return NULL;
		}
	}
	return k;
}

static void job_free(struct hg_job *j)
{
	free(j->sets);
	free(j->acc);
	free(j->peers);
	free(j->up);
	free(j->view);
	hg_eng_keys_free(j->keys, j->cfg.workers + 1);
	hg_eng_keys_free(j->old_keys, j->cfg.workers + 1);
	hg_eng_keys_free(j->up_keys, UP_KEYS);
	memset(j, 0, sizeof(*j));
}

void hg_engine_destroy(struct hg_engine *e)
{
	if (!e)
		return;
	if (e->ntx)
		hg_port_free(e->port, e->tx, (uint16_t)e->ntx);
	if (e->nfree)
		hg_port_free(e->port, e->fr, (uint16_t)e->nfree);
	for (uint32_t i = 0; i < e->max_jobs; i++)
		job_free(&e->jobs[i]);
	free(e->table);
	free(e->jobs);
	free(e);
}

/* Rebuild the lookup table from the jobs in use (control path only). */
static void table_rebuild(struct hg_engine *e)
{
	e->last = NULL;
	memset(e->table, 0, (e->table_mask + 1) * sizeof(*e->table));
	for (uint32_t i = 0; i < e->max_jobs; i++) {
		uint32_t h;

		if (!e->jobs[i].in_use)
			continue;
		h = job_hash(e, e->jobs[i].cfg.job);
		while (e->table[h])
			h = (h + 1) & e->table_mask;
		e->table[h] = i + 1;
	}
}

int hg_engine_add_job(struct hg_engine *e, const struct hg_job_config *jc)
{
	struct hg_job *j = NULL;
	size_t nsets;

	if (!e || !jc)
		return -EINVAL;
	if (job_find(e, jc->job))
		return -EEXIST;
	if (jc->workers < 1 || jc->workers > HG_MAX_WORKERS || jc->slots < 1 ||
	    jc->slots > HG_ENGINE_MAX_SLOTS || jc->payload_bytes < 4 ||
	    jc->payload_bytes > HG_MAX_PAYLOAD || e->njobs >= e->max_jobs)
		return -ERANGE;
	for (uint32_t i = 0; i < e->max_jobs; i++) {
		if (!e->jobs[i].in_use) {
			j = &e->jobs[i];
			break;
		}
	}
	if (!j)
		return -ERANGE;
	if (jc->up && !jc->up_ipv4)
		return -EINVAL;
	if (jc->up && jc->up_leaves &&
	    (jc->up_worker >= jc->up_leaves || jc->up_leaves > HG_MAX_WORKERS ||
	     jc->up_base + jc->workers > HG_MAX_WORKERS))
		return -EINVAL;
	memset(j, 0, sizeof(*j));
	j->cfg = *jc;
	/* The secrets are not kept: only the keys derived from them. */
	hg_auth_wipe(j->cfg.secret, sizeof(j->cfg.secret));
	hg_auth_wipe(j->cfg.up_key, sizeof(j->cfg.up_key));
	hg_auth_wipe(j->cfg.up_reply_key, sizeof(j->cfg.up_reply_key));
	if (jc->auth && !j->cfg.mac)
		j->cfg.mac = hg_auth_default_mac();
	if (!j->cfg.incarnation)
		j->cfg.incarnation = hg_wire_incarnation_now();
	j->up_self = j->cfg.incarnation;
	j->acc_stride = (jc->payload_bytes + ACC_ALIGN - 1) &
			~(uint32_t)(ACC_ALIGN - 1);
	j->slot_shift = -1;
	if (!(jc->slots & (jc->slots - 1)))
		j->slot_shift = __builtin_ctz(jc->slots);
	else
		j->slot_recip = UINT64_MAX / jc->slots + 1;
	hg_eng_fast_template(e, j);
	nsets = 2 * (size_t)jc->slots;
	j->sets = calloc(nsets, sizeof(*j->sets));
	if (!j->sets)
		goto err_nomem;
	if (posix_memalign((void **)&j->acc, ACC_ALIGN, nsets * j->acc_stride)) {
		j->acc = NULL;
		goto err_free_job;
	}
	memset(j->acc, 0, nsets * j->acc_stride);
	j->peers = calloc(jc->workers, sizeof(*j->peers));
	if (!j->peers)
		goto err_free_job;
	j->view = calloc(nsets, sizeof(*j->view));
	if (!j->view)
		goto err_free_job;
	if (jc->up) {
		j->up = calloc(nsets, sizeof(*j->up));
		if (!j->up)
			goto err_free_job;
		if (!j->cfg.up_port)
			j->cfg.up_port = HG_UDP_PORT;
		if (!j->cfg.up_rto_ns)
			j->cfg.up_rto_ns = HG_UP_DEFAULT_RTO_NS;
		if (!j->cfg.up_give_up_ns)
			j->cfg.up_give_up_ns = HG_UP_DEFAULT_GIVE_UP_NS;
	}
	if (jc->auth) {
		int rc;

		j->keys = keys_derive(j, jc->secret, &rc);
		if (!rc && jc->up) {
			j->up_keys = keys_alloc(UP_KEYS);
			rc = !j->up_keys ?
				     -ENOMEM :
				     hg_mac_key_init(&j->up_keys[UPK_SEND],
						     j->cfg.mac, jc->up_key);
			if (!rc)
				rc = hg_mac_key_init(&j->up_keys[UPK_REPLY],
						     j->cfg.mac, jc->up_reply_key);
		}
		if (rc) {
			job_free(j);
			return rc;
		}
		j->mac_len = HG_MAC_LEN;
		hg_eng_fast_template(e, j); /* with the flag and the epoch */
	}
	j->in_use = true;
	e->njobs++;
	table_rebuild(e);
	/* Not the job's own group, which it only sends to (the job's other
	 * shards send there too); a leaf receives its root's results. */
	if (jc->up && jc->up_group && e->port->ops->join_group)
		e->port->ops->join_group(e->port->ctx, jc->up_group);
	return 0;

err_free_job:
	job_free(j);
err_nomem:
	return -ENOMEM;
}

int hg_engine_job_config(const struct hg_engine *e, uint32_t id,
			 struct hg_job_config *out)
{
	const struct hg_job *j;

	if (!e || !out)
		return -EINVAL;
	j = job_find(e, id);
	if (!j)
		return -ENOENT;
	*out = j->cfg;
	return 0;
}

int hg_engine_remove_job(struct hg_engine *e, uint32_t id)
{
	struct hg_job *j;

	if (!e)
		return -EINVAL;
	j = job_find(e, id);
	if (!j)
		return -ENOENT;
	job_free(j);
	e->njobs--;
	table_rebuild(e);
	return 0;
}

int hg_engine_rotate_key(struct hg_engine *e, uint32_t id,
			 const uint8_t *secret, uint64_t grace_ns)
{
	struct hg_mac_key *k;
	struct hg_job *j;
	int rc;

	if (!e || !secret)
		return -EINVAL;
	j = job_find(e, id);
	if (!j)
		return -ENOENT;
	if (!j->mac_len)
		return -EPERM;
	k = keys_derive(j, secret, &rc);
	if (!k)
		return rc;
	/* Only two epochs are held: a grace period still running ends. */
	hg_eng_keys_free(j->old_keys, j->cfg.workers + 1);
	j->old_keys = j->keys;
	j->old_until_ns = hg_port_now(e->port) + grace_ns;
	j->keys = k;
	j->epoch++;
	j->mac_ctr = 0;
	hg_eng_fast_template(e, j); /* the fast path takes the new epoch */
	return j->epoch;
}

int hg_engine_rotate_up_key(struct hg_engine *e, uint32_t id,
			    const uint8_t *key, const uint8_t *reply_key)
{
	struct hg_mac_key *n;
	struct hg_job *j;
	int rc;

	if (!e || !key || !reply_key)
		return -EINVAL;
	j = job_find(e, id);
	if (!j)
		return -ENOENT;
	if (!j->mac_len || !j->up)
		return -EPERM;
	/* next keys given again replace the first */
	n = &j->up_keys[UPK_NEXT_SEND];
	hg_mac_key_release(&n[0]);
	hg_mac_key_release(&n[1]);
	j->up_has_next = false;
	rc = hg_mac_key_init(&n[0], j->cfg.mac, key);
	if (!rc)
		rc = hg_mac_key_init(&n[1], j->cfg.mac, reply_key);
	if (rc) {
		hg_mac_key_release(&n[0]);
		hg_mac_key_release(&n[1]);
		return rc;
	}
	j->up_has_next = true;
	return (uint8_t)(j->up_epoch + 1);
}

void hg_eng_up_key_switch(struct hg_job *j)
{
	struct hg_mac_key *k = j->up_keys;

	if (!j->up_has_next)
		return;
	/* the current reply key becomes the previous one */
	hg_mac_key_release(&k[UPK_PREV_REPLY]);
	hg_mac_key_release(&k[UPK_SEND]);
	memcpy(&k[UPK_PREV_REPLY], &k[UPK_REPLY], sizeof(*k));
	memcpy(&k[UPK_SEND], &k[UPK_NEXT_SEND], 2 * sizeof(*k));
	hg_auth_wipe(&k[UPK_NEXT_SEND], 2 * sizeof(*k));
	j->up_has_prev = true;
	j->up_has_next = false;
	j->up_epoch++;
	j->up_ctr = 0;
}

int hg_engine_job_count(const struct hg_engine *e)
{
	return e ? (int)e->njobs : 0;
}

int hg_engine_counters(const struct hg_engine *e, uint64_t *out, size_t n)
{
	if (!e || (!out && n))
		return -EINVAL;
	if (n > HG_CNT__COUNT)
		n = HG_CNT__COUNT;
	memcpy(out, e->cnt, n * sizeof(*out));
	return (int)n;
}

int hg_engine_job_counters(const struct hg_engine *e, uint32_t id,
			   uint64_t *out, size_t n)
{
	const struct hg_job *j;

	if (!e || (!out && n))
		return -EINVAL;
	j = job_find(e, id);
	if (!j)
		return -ENOENT;
	if (n > HG_CNT__COUNT)
		n = HG_CNT__COUNT;
	memcpy(out, j->cnt, n * sizeof(*out));
	return (int)n;
}

int hg_engine_worker_counters(const struct hg_engine *e, uint32_t id,
			      uint32_t worker, uint64_t *out, size_t n)
{
	const struct hg_job *j;

	if (!e || (!out && n))
		return -EINVAL;
	j = job_find(e, id);
	if (!j)
		return -ENOENT;
	if (worker >= j->cfg.workers)
		return -ERANGE;
	if (n > HG_WCNT__COUNT)
		n = HG_WCNT__COUNT;
	memcpy(out, j->peers[worker].cnt, n * sizeof(*out));
	return (int)n;
}

int hg_engine_job_open_sets(const struct hg_engine *e, uint32_t id)
{
	const struct hg_job *j;
	int open = 0;

	if (!e)
		return -EINVAL;
	j = job_find(e, id);
	if (!j)
		return -ENOENT;
	for (size_t i = 0; i < 2 * (size_t)j->cfg.slots; i++)
		open += j->sets[i].state == SET_OPEN || j->sets[i].state == SET_UP;
	return open;
}
