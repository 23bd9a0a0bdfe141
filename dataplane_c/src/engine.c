/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The aggregation engine (homagg/engine.h).
 *
 * Per frame: hg_wire_parse() validates everything that can be checked
 * without state, then the job, token, worker, MAC flag, shard, slot, lanes
 * and exponent are checked against the job before a payload byte is read,
 * then the worker's incarnation (old: dropped; new: every set holding its
 * old life is emptied), then the shadow set of the chunk decides: start
 * over, stale, duplicate (replay / status) or combine.
 *
 * A burst is processed in two passes, as VPP nodes do (see
 * hg_engine_process()): the first classifies every frame (parse and the
 * checks against the job, which no frame of the burst can change; the usual
 * shape of frame through classify_fast()) and prefetches its set; the second runs the set logic and the kernel frame by
 * frame, in arrival order, prefetching the accumulator and payload of the
 * frames a few places ahead.  Counters and results are those of handling
 * the frames one at a time (tests/test_engine.py compares both).  Replies reuse the received buffer when it is large enough (the
 * completing packet becomes the multicast result, as in SwitchML), so a
 * multicast job allocates nothing per chunk.
 *
 * Accumulators are kept big-endian, exactly as on the wire, so a result is
 * one memcpy; see hg_engine_create() for the measurement behind that choice.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "auth_pvt.h"
#include "homagg/auth.h"
#include "homagg/codec.h"
#include "homagg/counters.h"
#include "homagg/engine.h"
#include "homagg/kernels.h"
#include "homagg/port.h"
#include "homagg/wire.h"
#include "prefetch_pvt.h"
#include "wire_pvt.h"

#define TX_MAX 512
#define FREE_MAX 256
#define ACC_ALIGN 64
/*
 * Second pass: prefetch the frame this many places ahead, up to
 * PREFETCH_BYTES of its accumulator and payload (the hardware prefetcher
 * follows the rest of a sequential run; 512 bytes cost more prefetch
 * instructions than the hot-cache 1 KB kernel saved).  Measured on the
 * shared 2-vCPU Intel Xeon VM (load average 13-16 from other jobs, so
 * every figure is noisy), `homagg bench switch --workers 8` (frames from
 * another core), best of 2 alternating runs against the unstaged engine:
 * engine lcore 4.8 vs 4.2 Mpps at 1 KB payloads, 1.01 vs 1.00 Mpps at 8 KB.
 */
#define PREFETCH_AHEAD 2
/* First pass: the headers of the frame this many places ahead are
 * prefetched (the first pass waited on them: ~30% of its samples under
 * `perf record -e cpu-clock`, `homagg bench engine`, W = 8). */
#define HDR_AHEAD 4
#define PREFETCH_BYTES 128
/*
 * The kernel runs over PIECE_BYTES of input at a time, and before each
 * piece the same bytes of the next frame's payload are prefetched (see
 * combine()).  With frames from another core (homagg-switch-bench, W = 8,
 * cycles per frame of the engine lcore's polls that received frames,
 * medians of 3-4 alternating runs, load 9-13 from other jobs): 8 KB
 * payloads 2700 vs 2800 before (W = 2: 2940 vs 3070), 1 KB 580 vs 640;
 * a 128-byte stride (3070) and prefetcht1 (2760) were worse.
 */
#define PIECE_BYTES 1024
/* classify_fast(): the eight-byte words of a frame it compares (offsets
 * in FAST_OFF). */
#define FAST_WORDS 8

/* Tree leaf defaults (docs/PROTOCOL.md "Tree"); the timeout doubles per
 * try up to 2^UP_MAX_BACKOFF times. */
#define HG_UP_DEFAULT_RTO_NS 1000000ull
#define HG_UP_DEFAULT_GIVE_UP_NS 10000000000ull
#define UP_MAX_BACKOFF 6

/* The lanes of a frame to sum (all 0: nothing to sum): one word, so a
 * stage takes them in one copy. */
struct hg_lanes {
	uint16_t in_bytes;             /* lanes * in_lane: the payload summed */
	uint8_t in_lane;               /* bytes of one lane of op */
	uint8_t acc_lane;
	uint8_t in_shift;              /* log2(in_lane) */
};

/* SET_UP: a tree leaf's set, complete here and sent up, waiting for the
 * root's result (docs/PROTOCOL.md "Tree"). */
enum set_state { SET_EMPTY = 0, SET_OPEN = 1, SET_DONE = 2, SET_UP = 3 };

/* One shadow set of one slot. */
struct hg_set {
	uint64_t bitmap[HG_MAX_WORKERS / 64]; /* bit w: worker w counted */
	uint64_t psum;     /* checksum partial sum of the result payload (DONE) */
	uint32_t seq;
	uint16_t lanes;
	uint16_t count;
	uint16_t status_count; /* count at its last STATUS to the group, or NO_STATUS */
	uint8_t op;
	int8_t exp;
	uint8_t state;     /* enum set_state */
};

/* hg_set.status_count of a set whose bitmap the group has not had. */
#define NO_STATUS UINT16_MAX

/* What the engine knows of one worker of a job. */
struct hg_peer {
	struct hg_wire_addr addr;      /* learned from its latest valid frame */
	uint32_t incarnation;          /* greatest accepted, 0 = none yet */
	struct hg_mac_track mac;       /* auth: its MAC counter */
	uint64_t cnt[HG_WCNT__COUNT];  /* hg_engine_worker_counters() */
};

struct hg_job {
	struct hg_job_config cfg;
	bool in_use;
	uint32_t acc_stride;           /* bytes between accumulators */
	int slot_shift;                /* log2(S) when S is a power of 2, else -1 */
	uint64_t slot_recip;           /* else 2^64 / S rounded up (slot_quot()) */
	/*
	 * classify_fast(): frame words (FAST_WORDS) every contribution of
	 * this job has, masked by fast_fixed[] (see there), and the shape of
	 * the latest one it took (masked by fast_shape[]: op, lanes, exp and
	 * the two lengths they imply, checked once per shape); shape_len,
	 * shape_op: that shape's frame length and op facts (shape_len 0: no
	 * shape yet).  fast: the job takes that path (not an auth job).
	 */
	uint64_t fast_want[FAST_WORDS];
	uint32_t shape_len;
	struct hg_lanes shape;
	bool fast;
	/* The L2-L4 headers of a result to the job's group, built for a UDP
	 * payload of mc_plen bytes (0: not yet). */
	uint16_t mc_plen;
	uint8_t mc_l2l4[HG_OFF_HDR];
	struct hg_set *sets;           /* 2 * S, set of slot s shadow h: 2s+h */
	uint8_t *acc;                  /* 2 * S * acc_stride, 64-byte aligned */
	struct hg_peer *peers;         /* W entries */
	struct hg_mac_key *keys;       /* auth: W worker keys + the aggregator's */
	struct hg_mac_key *old_keys;   /* the previous epoch's, within its grace */
	uint64_t old_until_ns;         /* end of old_keys' grace period */
	uint8_t epoch;                 /* current key epoch */
	uint64_t mac_ctr;              /* auth: replies MACed in this epoch */
	struct hg_mac_key *up_keys;    /* auth leaf: own key at the root, root's */
	uint64_t up_ctr;               /* auth leaf: requests MACed */
	struct hg_mac_track up_track;  /* auth leaf: the root's MAC counter */
	size_t mac_len;                /* auth: HG_MAC_LEN, else 0 */
	uint64_t cnt[HG_CNT__COUNT];
	struct hg_up_timer *up;        /* tree leaf: 2 * S upward timers, else NULL */
	uint32_t up_incarnation;       /* tree leaf: the root's, 0 = none seen yet */
};

/* Tree leaf: the upward timer of one set (SET_UP). */
struct hg_up_timer {
	uint64_t first_ns;             /* first sent up */
	uint64_t sent_ns;              /* last sent up */
	uint64_t due_ns;               /* resend then; UINT64_MAX: abandoned */
	uint32_t tries;
};

/* What the first pass learned of one frame of a burst. */
struct hg_stage {
	struct hg_pkt *pkt;
	struct hg_job *job;            /* NULL: dropped in the first pass */
	struct hg_set *set;
	uint8_t *acc;
	const uint8_t *in;             /* payload */
	uint32_t seq;
	uint32_t incarnation;
	uint16_t udp_off;              /* of the UDP header: the source port */
	uint16_t worker;
	uint16_t flags;
	uint16_t lanes;
	uint8_t op;
	int8_t exp;
	struct hg_lanes ln;
	bool up;                       /* a root's RESULT or STATUS (tree leaf) */
};

struct hg_engine {
	struct hg_port *port;
	struct hg_wire_addr self;      /* source of everything sent */
	bool can_replicate;
	uint32_t flags;
	uint32_t wire_flags;
	uint16_t burst;
	hg_kernel_fn kern[HG_OP__COUNT + 1];

	uint32_t max_jobs;
	uint32_t njobs;
	struct hg_job *last;           /* job of the previous frame (NULL: none) */
	struct hg_job *jobs;           /* max_jobs entries */
	uint32_t *table;               /* open addressing: job index + 1, 0 empty */
	uint32_t table_mask;

	uint64_t cnt[HG_CNT__COUNT];

	uint32_t ntx, nfree;
	struct hg_pkt *tx[TX_MAX];
	struct hg_pkt *fr[FREE_MAX];
	struct hg_pkt *rx[HG_ENGINE_MAX_BURST];
	struct hg_stage stage[HG_ENGINE_MAX_BURST];
	bool one_at_a_time;            /* hg_engine_set_staging(e, false) */
	uint64_t up_next;              /* earliest upward timer, UINT64_MAX: none */
};

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

static void keys_free(struct hg_mac_key *k, size_t n)
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
			keys_free(k, W + 1);
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
	keys_free(j->keys, j->cfg.workers + 1);
	keys_free(j->old_keys, j->cfg.workers + 1);
	keys_free(j->up_keys, 2);
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

static inline uint32_t job_hash(const struct hg_engine *e, uint32_t id)
{
	return (id * 0x9e3779b1u) & e->table_mask;
}

static inline struct hg_job *job_find(const struct hg_engine *e, uint32_t id)
{
	uint32_t h;

	if (e->last && e->last->cfg.job == id)
		return e->last;
	h = job_hash(e, id);

	for (;;) {
		uint32_t x = e->table[h];

		if (!x)
			return NULL;
		if (e->jobs[x - 1].cfg.job == id)
			return &e->jobs[x - 1];
		h = (h + 1) & e->table_mask;
	}
}

/* seq / S: a shift or a multiply by the rounded-up reciprocal, exact for
 * every 32-bit seq (Lemire, Kaser and Kurz, "Faster remainder by direct
 * computation", 2019). */
static inline uint32_t slot_quot(const struct hg_job *j, uint32_t seq)
{
	if (j->slot_shift >= 0)
		return seq >> j->slot_shift;
	return (uint32_t)(((unsigned __int128)j->slot_recip * seq) >> 64);
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

/* Eight bytes of a frame as one word, in memory order. */
static inline uint64_t ld64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return v;
}

/*
 * classify_fast()'s words: frame bytes 12-27 (Ethernet type, IPv4 version,
 * header and total length, fragment, protocol), 34-41 (UDP ports, length,
 * checksum) and 42-73 (the HomAgg header), in words that do not cross a
 * cache line of a 64-byte aligned frame (a load across two lines showed as
 * the first pass's hottest instruction under perf).  fast_fixed: the bits
 * every contribution of a job has alike (IPv4, version 4 without options,
 * no MF flag nor fragment offset, UDP to the engine's port, header version,
 * no flag but RETRANS, SHADOW and OVERFLOW, job, token, shard, reserved 0);
 * fast_shape: those of its shape (IP and UDP length, op, lanes, exp).
 */
static const uint8_t FAST_OFF[FAST_WORDS] = { 12, 20, 34, 42, 50, 56, 64, 66 };
static const uint8_t fast_fixed[FAST_WORDS * 8] = {
	0xff, 0xff, 0xff, 0, 0, 0, 0, 0,            /* 12: type, version+IHL */
	0x3f, 0xff, 0, 0xff, 0, 0, 0, 0,            /* 20: fragment, protocol */
	0, 0, 0xff, 0xff, 0, 0, 0, 0,               /* 34: destination port */
	0xff, 0, 0xff, (uint8_t)~(HG_FLAG_RETRANS | HG_FLAG_SHADOW |
				  HG_FLAG_OVERFLOW),
	0xff, 0xff, 0xff, 0xff,                     /* 42: version, flags, job */
	0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0,         /* 50: token */
	0, 0, 0, 0, 0, 0, 0, 0,                     /* 56: slot, seq, lanes */
	0, 0xff, 0, 0, 0, 0, 0, 0,                  /* 64: shard */
	0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,         /* 66: reserved */
};
static const uint8_t fast_shape[FAST_WORDS * 8] = {
	[4] = 0xff, [5] = 0xff,                     /* IP total length */
	[2 * 8 + 4] = 0xff, [2 * 8 + 5] = 0xff,     /* UDP length */
	[3 * 8 + 1] = 0xff,                         /* op */
	[5 * 8 + 6] = 0xff, [5 * 8 + 7] = 0xff,     /* lanes */
	[6 * 8] = 0xff,                             /* exp */
};

/* The fixed words of job j's contributions (see hg_job), no shape yet. */
static void fast_template(const struct hg_engine *e, struct hg_job *j)
{
	uint8_t want[FAST_WORDS * 8] = {
		0x08, 0x00, 0x45, [8 + 3] = 17,
		[16 + 2] = (uint8_t)(e->self.port >> 8),
		[16 + 3] = (uint8_t)e->self.port,
		[24] = HG_PROTOCOL_VERSION,
	};

	hg_st_be32(want + 24 + 4, j->cfg.job);
	hg_st_be32(want + 32, j->cfg.token);
	want[48 + 1] = j->cfg.shard;
	for (int i = 0; i < FAST_WORDS; i++)
		j->fast_want[i] = ld64(want + 8 * i);
	j->shape_len = 0;
	j->fast = !j->cfg.auth;
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
	j->acc_stride = (jc->payload_bytes + ACC_ALIGN - 1) & ~(uint32_t)(ACC_ALIGN - 1);
	j->slot_shift = -1;
	if (!(jc->slots & (jc->slots - 1)))
		j->slot_shift = __builtin_ctz(jc->slots);
	else
		j->slot_recip = UINT64_MAX / jc->slots + 1;
	fast_template(e, j);
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
			j->up_keys = keys_alloc(2);
			rc = !j->up_keys ? -ENOMEM :
			     hg_mac_key_init(&j->up_keys[0], j->cfg.mac, jc->up_key);
			if (!rc)
				rc = hg_mac_key_init(&j->up_keys[1], j->cfg.mac,
						     jc->up_reply_key);
		}
		if (rc) {
			job_free(j);
			return rc;
		}
		j->mac_len = HG_MAC_LEN;
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
	if (!j->mac_len || j->up)
		return -EPERM;
	k = keys_derive(j, secret, &rc);
	if (!k)
		return rc;
	/* Only two epochs are held: a grace period still running ends. */
	keys_free(j->old_keys, j->cfg.workers + 1);
	j->old_keys = j->keys;
	j->old_until_ns = hg_port_now(e->port) + grace_ns;
	j->keys = k;
	j->epoch++;
	j->mac_ctr = 0;
	return j->epoch;
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

/* ---- packet path -------------------------------------------------------- */

static void flush_tx(struct hg_engine *e)
{
	uint32_t sent = 0;

	while (sent < e->ntx) {
		uint32_t n = e->ntx - sent;
		uint16_t k;

		if (n > 0xffff)
			n = 0xffff;
		k = hg_port_tx(e->port, e->tx + sent, (uint16_t)n);
		sent += k;
		if (k < n)
			break;
	}
	if (sent < e->ntx) {
		e->cnt[HG_CNT_TX_FULL] += e->ntx - sent;
		hg_port_free(e->port, e->tx + sent, (uint16_t)(e->ntx - sent));
	}
	e->ntx = 0;
}

static inline void queue_tx(struct hg_engine *e, struct hg_pkt *p)
{
	if (e->ntx == TX_MAX)
		flush_tx(e);
	e->tx[e->ntx++] = p;
}

static inline void queue_free(struct hg_engine *e, struct hg_pkt *p)
{
	if (e->nfree == FREE_MAX) {
		hg_port_free(e->port, e->fr, FREE_MAX);
		e->nfree = 0;
	}
	e->fr[e->nfree++] = p;
}

static inline void count(struct hg_engine *e, struct hg_job *j, int c)
{
	e->cnt[c]++;
	if (j)
		j->cnt[c]++;
}

/* A buffer for a reply of need bytes: the received one if it is still
 * unused and large enough, else a new one from the port (NULL: counted). */
static struct hg_pkt *out_pkt(struct hg_engine *e, struct hg_job *j,
			      struct hg_pkt **reuse, size_t need)
{
	struct hg_pkt *p = *reuse;

	if (p && p->cap >= need) {
		*reuse = NULL;
		return p;
	}
	if (hg_port_alloc(e->port, &p, 1) != 1 || p->cap < need) {
		if (p && p->cap < need)
			hg_port_free(e->port, &p, 1);
		count(e, j, HG_CNT_NO_BUFFER);
		return NULL;
	}
	return p;
}

/*
 * Write a reply frame (result or status) into p: to worker w's learned
 * address, or to the job's group when w is HG_WORKER_ALL.  psum is the
 * checksum partial sum of the payload (ignored without checksums).  An
 * auth job's reply carries HG_FLAG_AUTH and the aggregator's MAC; its
 * checksum is then summed over the whole datagram (the MAC may start at an
 * odd offset, and the MAC costs far more than that pass).
 */
static void put_reply(struct hg_engine *e, struct hg_job *j, struct hg_pkt *p,
		      const struct hg_set *s, uint16_t flags, uint16_t w,
		      const uint8_t *payload, size_t plen, uint64_t psum)
{
	struct hg_hdr h = {
		.version = HG_PROTOCOL_VERSION,
		.op = s->op,
		.flags = (uint16_t)(flags | (j->mac_len ? HG_FLAG_AUTH |
					     j->epoch << HG_FLAG_EPOCH_SHIFT : 0)),
		.job = j->cfg.job,
		.token = j->cfg.token,
		.worker = w,
		.slot = (uint16_t)((s - j->sets) / 2),
		.seq = s->seq,
		.lanes = s->lanes,
		.exp = s->exp,
		.shard = j->cfg.shard,
		.incarnation = j->cfg.incarnation,
		.nonce = j->mac_len ? (uint32_t)++j->mac_ctr : 0,
	};
	uint8_t *f = p->data;

	if (w == HG_WORKER_ALL) {
		/* the same headers for every result of this size: built once */
		size_t udp_payload = HG_HDR_LEN + plen + j->mac_len;

		if (j->mc_plen != udp_payload) {
			uint8_t mac[6];

			hg_wire_mcast_mac(j->cfg.group_ipv4, mac);
			hg_wire_put_l2l4(j->mc_l2l4, &e->self, mac,
					 j->cfg.group_ipv4, e->self.port,
					 udp_payload);
			j->mc_plen = (uint16_t)udp_payload;
		}
		memcpy(f, j->mc_l2l4, HG_OFF_HDR);
	} else {
		const struct hg_wire_addr *a = &j->peers[w].addr;

		hg_wire_put_l2l4(f, &e->self, a->mac, a->ipv4, a->port,
				 HG_HDR_LEN + plen + j->mac_len);
	}
	hg_wire_put_hdr(f + HG_OFF_HDR, &h);
	if (f + HG_OFF_PAYLOAD != payload)
		memcpy(f + HG_OFF_PAYLOAD, payload, plen);
	if (j->mac_len) {
		hg_mac_key_sign(&j->keys[j->cfg.workers], HG_AUTH_DIR_REPLY,
				j->mac_ctr, f + HG_OFF_HDR, HG_HDR_LEN + plen,
				f + HG_OFF_PAYLOAD + plen);
		psum = hg_csum_add(0, f + HG_OFF_PAYLOAD,
				   plen + j->mac_len);
	}
	if (e->wire_flags & HG_WIRE_F_UDP_CSUM)
		hg_wire_put_udp_csum(f, hg_csum_add(psum, f + HG_OFF_HDR,
						    HG_HDR_LEN));
	p->len = (uint16_t)(HG_OFF_PAYLOAD + plen + j->mac_len);
}

/* Flags of a reply about set s: its shadow bit plus kind. */
static inline uint16_t set_flags(const struct hg_job *j, const struct hg_set *s,
				 uint16_t kind)
{
	return (uint16_t)(kind | (((s - j->sets) & 1) ? HG_FLAG_SHADOW : 0));
}

/* Send a complete set's result to worker w (HG_WORKER_ALL: to every worker). */
static void send_result(struct hg_engine *e, struct hg_job *j,
			const struct hg_set *s, const uint8_t *acc, uint16_t w,
			struct hg_pkt **reuse)
{
	size_t plen = (size_t)s->lanes * hg_op_acc_lane(s->op);
	uint16_t fl = set_flags(j, s, HG_FLAG_RESULT);
	struct hg_pkt *p;

	if (w != HG_WORKER_ALL || (e->can_replicate && j->cfg.group_ipv4)) {
		p = out_pkt(e, j, reuse, HG_OFF_PAYLOAD + plen + j->mac_len);
		if (!p)
			return;
		put_reply(e, j, p, s, fl, w, acc, plen, s->psum);
		queue_tx(e, p);
		count(e, j, HG_CNT_RESULTS_SENT);
		return;
	}
	for (uint32_t i = 0; i < j->cfg.workers; i++) {
		p = out_pkt(e, j, reuse, HG_OFF_PAYLOAD + plen + j->mac_len);
		if (!p)
			continue;
		put_reply(e, j, p, s, fl, (uint16_t)i, acc, plen, s->psum);
		queue_tx(e, p);
		count(e, j, HG_CNT_RESULTS_SENT);
	}
}

/* STATUS to worker w (HG_WORKER_ALL: the job's group): the set's worker
 * bitmap, W bits, bit w%8 of byte w/8.  False when no buffer was free. */
static bool send_status(struct hg_engine *e, struct hg_job *j,
			const struct hg_set *s, uint16_t w,
			struct hg_pkt **reuse)
{
	uint8_t bits[HG_MAX_WORKERS / 8];
	size_t plen = (j->cfg.workers + 7) / 8;
	struct hg_pkt *p;
	uint64_t psum = 0;

	for (size_t i = 0; i < plen; i++)
		bits[i] = (uint8_t)(s->bitmap[i / 8] >> (8 * (i % 8)));
	p = out_pkt(e, j, reuse, HG_OFF_PAYLOAD + plen + j->mac_len);
	if (!p)
		return false;
	if (e->wire_flags & HG_WIRE_F_UDP_CSUM)
		psum = hg_csum_add(0, bits, plen);
	put_reply(e, j, p, s, set_flags(j, s, HG_FLAG_STATUS), w, bits, plen,
		  psum);
	queue_tx(e, p);
	count(e, j, HG_CNT_STATUS_SENT);
	return true;
}

/*
 * Answer worker w's retransmission of open set s, already counted, with a
 * STATUS (docs/PROTOCOL.md Part 3, fast retransmission): to the job's group
 * where there is one, so every worker that waits for this slot learns
 * whether it is missing, but once per bitmap.  A bitmap the group already
 * had goes to w and to the workers it lacks (they may have taken the
 * group's copy as older than their latest transmission), each a unicast
 * counted in "status_repeats": at most W frames, at most one per worker.
 * Its bits only grow until the set starts over or is cleared
 * (status_count = NO_STATUS then), so the same count is the same bitmap.
 */
static void answer_retrans(struct hg_engine *e, struct hg_job *j,
			   struct hg_set *s, uint16_t w, struct hg_pkt **reuse)
{
	if (!e->can_replicate || !j->cfg.group_ipv4) {
		send_status(e, j, s, w, reuse);
		return;
	}
	if (s->status_count != s->count) {
		if (send_status(e, j, s, HG_WORKER_ALL, reuse))
			s->status_count = s->count;
		return;
	}
	if (send_status(e, j, s, w, reuse))
		count(e, j, HG_CNT_STATUS_REPEATS);
	for (uint32_t i = 0; i < j->cfg.workers; i++) {
		if (s->bitmap[i / 64] & (1ull << (i % 64)) ||
		    !j->peers[i].addr.ipv4)
			continue; /* present, or never heard from */
		if (send_status(e, j, s, (uint16_t)i, reuse))
			count(e, j, HG_CNT_STATUS_REPEATS);
	}
}

/* ---- tree leaf (docs/PROTOCOL.md "Tree") -------------------------------- */

/* The op a leaf's partial sum goes up with: an NC8 accumulator is already
 * int32 lanes, so it goes up as SUM32; OR, MAX8 and SUM32 keep theirs. */
static inline uint8_t up_op(uint8_t op)
{
	return op == HG_OP_NC8 ? HG_OP_SUM32 : op;
}

/* Why a partial sum goes up: first, on its timer (the timeout doubles),
 * or asked by a root STATUS or a worker's retransmission (it does not). */
enum up_why { UP_FIRST, UP_TIMER, UP_ASKED };

/*
 * Send set s's partial sum (its accumulator) up to the root, as worker
 * up_worker of the root's job (a resend with HG_FLAG_RETRANS), and arm the
 * set's timer with the timeout doubled per timer expiry.  reuse: a buffer
 * to take if large enough (NULL: allocate one).  Without a buffer the
 * frame is not sent (no_buffer) but the timer still runs.
 */
static void up_send(struct hg_engine *e, struct hg_job *j, struct hg_set *s,
		    const uint8_t *acc, enum up_why why, struct hg_pkt **reuse)
{
	bool retrans = why != UP_FIRST;
	size_t i = (size_t)(s - j->sets);
	struct hg_up_timer *t = &j->up[i];
	uint8_t op = up_op(s->op);
	size_t plen = (size_t)s->lanes * hg_op_in_lane(op);
	struct hg_hdr h = {
		.version = HG_PROTOCOL_VERSION,
		.op = op,
		.flags = set_flags(j, s, retrans ? HG_FLAG_RETRANS : 0),
		.job = j->cfg.job,
		.token = j->cfg.token,
		.worker = j->cfg.up_worker,
		.slot = (uint16_t)(i / 2),
		.seq = s->seq,
		.lanes = s->lanes,
		.exp = op == s->op ? s->exp : 0,
		.shard = j->cfg.up_shard,
		.incarnation = j->cfg.incarnation,
		.nonce = j->mac_len ? (uint32_t)++j->up_ctr : 0,
	};
	struct hg_pkt *none = NULL;
	uint64_t now = hg_port_now(e->port);
	struct hg_pkt *p;
	uint8_t *f;

	if (j->mac_len)
		h.flags |= HG_FLAG_AUTH;
	if (why == UP_FIRST) {
		t->first_ns = now;
		t->tries = 0;
	} else if (why == UP_TIMER) {
		t->tries++;
	}
	t->sent_ns = now;
	t->due_ns = now + (j->cfg.up_rto_ns << (t->tries < UP_MAX_BACKOFF ?
						t->tries : UP_MAX_BACKOFF));
	if (t->due_ns < e->up_next)
		e->up_next = t->due_ns;
	count(e, j, retrans ? HG_CNT_UP_RETRANSMISSIONS : HG_CNT_UP_SENT);
	p = out_pkt(e, j, reuse ? reuse : &none,
		    HG_OFF_PAYLOAD + plen + j->mac_len);
	if (!p)
		return;
	f = p->data;
	hg_wire_put_l2l4(f, &e->self, j->cfg.up_mac, j->cfg.up_ipv4,
			 j->cfg.up_port, HG_HDR_LEN + plen + j->mac_len);
	hg_wire_put_hdr(f + HG_OFF_HDR, &h);
	memcpy(f + HG_OFF_PAYLOAD, acc, plen);
	if (j->mac_len)
		hg_mac_key_sign(&j->up_keys[0], HG_AUTH_DIR_REQUEST, j->up_ctr,
				f + HG_OFF_HDR, HG_HDR_LEN + plen,
				f + HG_OFF_PAYLOAD + plen);
	if (e->wire_flags & HG_WIRE_F_UDP_CSUM)
		hg_wire_put_udp_csum(f, hg_csum_add(0, f + HG_OFF_HDR,
						    HG_HDR_LEN + plen + j->mac_len));
	p->len = (uint16_t)(HG_OFF_PAYLOAD + plen + j->mac_len);
	queue_tx(e, p);
}

/* Set s reached its W_l contributions at a leaf: it goes up. */
static void up_forward(struct hg_engine *e, struct hg_job *j, struct hg_set *s,
		       const uint8_t *acc, struct hg_pkt **reuse)
{
	s->state = SET_UP;
	up_send(e, j, s, acc, UP_FIRST, reuse);
}

/*
 * Resend set s at once (a root STATUS without this leaf, or a worker's
 * retransmission at least holdoff_ns after the last send), unless the
 * set was abandoned or its give-up time has passed (then it is abandoned
 * here: counted once).
 */
static void up_asked(struct hg_engine *e, struct hg_job *j, struct hg_set *s,
		     const uint8_t *acc, uint64_t holdoff_ns, struct hg_pkt **reuse)
{
	struct hg_up_timer *t = &j->up[s - j->sets];
	uint64_t now = hg_port_now(e->port);

	if (t->due_ns == UINT64_MAX || now - t->sent_ns < holdoff_ns)
		return;
	if (now - t->first_ns >= j->cfg.up_give_up_ns) {
		t->due_ns = UINT64_MAX;
		count(e, j, HG_CNT_UP_ABANDONED);
		return;
	}
	up_send(e, j, s, acc, UP_ASKED, reuse);
}

/*
 * A worker's retransmission of a set already sent up: it is counted (a
 * STATUS with every bit set tells it so) and never summed again; the
 * partial sum goes up again at once unless it went less than half an
 * upward timeout ago (the workers' timers then hurry the leaf's).
 */
static void up_worker_retrans(struct hg_engine *e, struct hg_job *j,
			      struct hg_set *s, const uint8_t *acc, uint16_t w,
			      struct hg_pkt **reuse)
{
	send_status(e, j, s, w, reuse);
	up_asked(e, j, s, acc, j->cfg.up_rto_ns / 2, NULL);
}

/*
 * First pass over a RESULT or STATUS frame: taken (true) when its job is a
 * tree leaf's, then either staged (st->up) or counted and freed; false for
 * any other job (the caller drops it as bad_flags).  The frame must come
 * from the parent's address and port and match the job as the root knows
 * it (token, worker up_worker or all, shard, slot and shadow, lanes).
 * st->worker carries whether a STATUS has this leaf's bit.
 */
/* A root reply to auth leaf j: epoch 0, the root's aggregator key. */
static bool up_verify(struct hg_job *j, const struct hg_pkt *pkt,
		      const struct hg_wire_view *v, uint16_t flags)
{
	const uint8_t *h = pkt->data + v->payload_off - HG_HDR_LEN;
	uint64_t ctr;

	if (!(flags & HG_FLAG_AUTH) || (flags >> HG_FLAG_EPOCH_SHIFT))
		return false;
	ctr = hg_mac_track_counter(&j->up_track, h);
	if (!hg_mac_key_check(&j->up_keys[1], HG_AUTH_DIR_REPLY, ctr, h,
			      HG_HDR_LEN + v->payload_len,
			      pkt->data + v->payload_off + v->payload_len))
		return false;
	hg_mac_track_update(&j->up_track, h, ctr);
	return true;
}

static bool up_classify(struct hg_engine *e, struct hg_pkt *pkt,
			const struct hg_wire_view *v, uint16_t flags,
			struct hg_stage *st)
{
	struct hg_job *j = job_find(e, v->hdr.job);
	uint32_t S, q, expect_shadow, uw;
	int rc;

	if (!j || !j->up)
		return false;
	e->last = j;
	j->cnt[HG_CNT_RECEIVED]++;
	uw = j->cfg.up_worker;
	if (v->hdr.token != j->cfg.token) {
		rc = HG_CNT_BAD_TOKEN;
		goto drop;
	}
	if (v->src.ipv4 != j->cfg.up_ipv4 || v->src.port != j->cfg.up_port) {
		rc = HG_CNT_BAD_FLAGS; /* a reply, but not from the root */
		goto drop;
	}
	if (v->hdr.worker != uw && v->hdr.worker != HG_WORKER_ALL) {
		rc = HG_CNT_BAD_WORKER;
		goto drop;
	}
	if (j->mac_len ? !up_verify(j, pkt, v, flags) : (flags & HG_FLAG_AUTH)) {
		rc = HG_CNT_BAD_MAC;
		goto drop;
	}
	if (v->hdr.shard != j->cfg.up_shard) {
		rc = HG_CNT_BAD_SHARD;
		goto drop;
	}
	S = j->cfg.slots;
	q = slot_quot(j, v->hdr.seq);
	expect_shadow = (q & 1) ? HG_FLAG_SHADOW : 0;
	if (v->hdr.slot >= S || v->hdr.slot != v->hdr.seq - q * S ||
	    (flags & HG_FLAG_SHADOW) != expect_shadow) {
		rc = HG_CNT_BAD_SLOT;
		goto drop;
	}
	if (!(flags & HG_FLAG_STATUS) &&
	    (size_t)v->hdr.lanes * hg_op_acc_lane(v->hdr.op) > j->cfg.payload_bytes) {
		rc = HG_CNT_BAD_LANES;
		goto drop;
	}
	if (v->hdr.exp != 0) {
		rc = HG_CNT_BAD_EXP;
		goto drop;
	}
	st->pkt = pkt;
	st->job = j;
	st->set = &j->sets[2 * (size_t)v->hdr.slot + (expect_shadow ? 1 : 0)];
	st->acc = j->acc + (size_t)(st->set - j->sets) * j->acc_stride;
	st->in = pkt->data + v->payload_off;
	st->seq = v->hdr.seq;
	st->flags = flags;
	st->lanes = v->hdr.lanes;
	st->op = v->hdr.op;
	st->exp = 0;
	st->incarnation = v->hdr.incarnation;
	st->worker = (flags & HG_FLAG_STATUS) && uw / 8 < v->payload_len &&
		     (st->in[uw / 8] >> (uw % 8) & 1);
	memset(&st->ln, 0, sizeof(st->ln)); /* nothing to prefetch for apply() */
	st->up = true;
	return true;

drop:
	count(e, j, rc);
	queue_free(e, pkt);
	return true;
}

/*
 * Second pass over a root's reply: a RESULT of a forwarded set becomes the
 * set's result and goes to the leaf's workers; a STATUS without this
 * leaf's bit sends the partial sum up again at once.  Anything not about a
 * forwarded set (late copies, a set started over) is up_stale.  A root
 * reply with another incarnation than the root's earlier ones: the root
 * lost its state, so the leaf takes a new incarnation for its job and its
 * workers end their allreduce as after a restart of the leaf.
 */
static void up_apply(struct hg_engine *e, struct hg_stage *st)
{
	struct hg_job *j = st->job;
	struct hg_set *s = st->set;
	struct hg_pkt *pkt = st->pkt;
	size_t bytes;

	if (st->incarnation != j->up_incarnation) {
		if (j->up_incarnation) {
			j->cfg.incarnation = j->cfg.incarnation + 1 ?
					     j->cfg.incarnation + 1 : 1;
			count(e, j, HG_CNT_UP_ROOT_RESTARTS);
		}
		j->up_incarnation = st->incarnation;
	}

	if (s->state != SET_UP || s->seq != st->seq ||
	    s->lanes != st->lanes || up_op(s->op) != st->op) {
		count(e, j, HG_CNT_UP_STALE);
		queue_free(e, pkt);
		return;
	}
	if (st->flags & HG_FLAG_STATUS) {
		count(e, j, HG_CNT_UP_STATUS);
		if (!st->worker)
			up_asked(e, j, s, st->acc, 0, &pkt);
		if (pkt)
			queue_free(e, pkt);
		return;
	}
	bytes = (size_t)s->lanes * hg_op_acc_lane(s->op);
	memcpy(st->acc, st->in, bytes);
	s->state = SET_DONE;
	s->psum = (e->wire_flags & HG_WIRE_F_UDP_CSUM) ?
		  hg_csum_add(0, st->acc, bytes) : 0;
	count(e, j, HG_CNT_UP_RESULTS);
	send_result(e, j, s, st->acc, HG_WORKER_ALL, &pkt);
	if (pkt)
		queue_free(e, pkt);
}

int hg_engine_timers(struct hg_engine *e)
{
	uint64_t now, next = UINT64_MAX;
	int resent = 0;

	if (!e)
		return -EINVAL;
	if (e->up_next == UINT64_MAX)
		return 0;
	now = hg_port_now(e->port);
	if (now < e->up_next)
		return 0;
	e->up_next = UINT64_MAX; /* up_send() lowers it again */
	for (uint32_t k = 0; k < e->max_jobs; k++) {
		struct hg_job *j = &e->jobs[k];

		if (!j->in_use || !j->up)
			continue;
		for (size_t i = 0; i < 2 * (size_t)j->cfg.slots; i++) {
			struct hg_up_timer *t = &j->up[i];

			if (j->sets[i].state != SET_UP || t->due_ns == UINT64_MAX)
				continue;
			if (t->due_ns > now) {
				if (t->due_ns < next)
					next = t->due_ns;
				continue;
			}
			if (now - t->first_ns >= j->cfg.up_give_up_ns) {
				t->due_ns = UINT64_MAX;
				count(e, j, HG_CNT_UP_ABANDONED);
				continue;
			}
			up_send(e, j, &j->sets[i], j->acc + i * j->acc_stride,
				UP_TIMER, NULL);
			resent++;
		}
	}
	if (next < e->up_next)
		e->up_next = next;
	if (e->ntx)
		flush_tx(e);
	return resent;
}

uint64_t hg_engine_next_deadline(const struct hg_engine *e)
{
	return e ? e->up_next : UINT64_MAX;
}

static inline bool serial_newer(uint32_t a, uint32_t b)
{
	return (int32_t)(a - b) > 0;
}

/*
 * Worker w of job j came back with a greater incarnation: every set holding
 * a contribution of its earlier life is emptied, open, complete or sent up
 * alike (PROTOCOL.md Part 2, "Incarnations").  A new life numbers its chunks
 * from 0 again, so a result of the old life must never be replayed to it
 * (same seq: it would be taken for the new sum) nor make its chunks stale
 * (greater seq).  The other workers' contributions to an open set come back
 * by retransmission.  Rare (a restart), so a scan of the 2 S sets.
 */
static void incarnation_reset(struct hg_engine *e, struct hg_job *j, uint32_t w)
{
	const uint64_t bit = 1ull << (w % 64);

	for (size_t i = 0; i < 2 * (size_t)j->cfg.slots; i++) {
		struct hg_set *s = &j->sets[i];

		if (s->state == SET_EMPTY || !(s->bitmap[w / 64] & bit))
			continue;
		memset(s->bitmap, 0, sizeof(s->bitmap));
		s->count = 0;
		s->psum = 0;
		s->status_count = NO_STATUS;
		s->state = SET_EMPTY;
		count(e, j, HG_CNT_INCARNATION_RESETS);
	}
}

/*
 * classify_fast() on a frame whose shape words differ from job j's latest
 * shape: the frame's fixed words must match, and its op, lanes, exp and
 * lengths pass the checks of hg_wire_parse_inl() and classify(); then they
 * become the job's shape.  Once per phase or short last chunk, not per
 * frame.
 */
__attribute__((noinline, cold))
static bool fast_new_shape(struct hg_job *j, const uint8_t *f)
{
	const uint8_t *h = f + HG_OFF_HDR;
	const struct hg_op_info *oi;
	uint32_t lanes = hg_rd16(h + 20), udp_len;
	unsigned op = h[1];
	uint64_t bad = 0;

	for (int i = 0; i < FAST_WORDS; i++)
		bad |= (ld64(f + FAST_OFF[i]) ^ j->fast_want[i]) &
		       ld64(fast_fixed + 8 * i);
	if (bad || op - 1u >= HG_OP__COUNT)
		return false;
	oi = &hg_op_table[op - 1];
	/* The UDP datagram is the header and lanes * in_lane bytes of
	 * payload, the IP packet that datagram; the payload is then at most
	 * payload_bytes <= HG_MAX_PAYLOAD too (every op's in_lane <=
	 * acc_lane). */
	udp_len = 8 + HG_HDR_LEN + lanes * oi->in_lane;
	if (hg_rd16(f + HG_OFF_UDP + 4) != udp_len ||
	    hg_rd16(f + HG_OFF_IP + 2) != udp_len + 20 ||
	    lanes * oi->acc_lane > j->cfg.payload_bytes ||
	    (uint8_t)h[22] > (uint8_t)oi->exp_max)   /* exp in 0..exp_max */
		return false;
	for (int i = 0; i < FAST_WORDS; i++) {
		uint64_t m = ld64(fast_shape + 8 * i);

		j->fast_want[i] = (j->fast_want[i] & ~m) |
				  (ld64(f + FAST_OFF[i]) & m);
	}
	j->shape_len = HG_OFF_UDP + udp_len;
	j->shape.in_bytes = (uint16_t)(lanes * oi->in_lane);
	j->shape.in_lane = oi->in_lane;
	j->shape.acc_lane = oi->acc_lane;
	j->shape.in_shift = (uint8_t)__builtin_ctz(oi->in_lane);
	return true;
}

/*
 * The first pass's fast path: a contribution of the shape every worker
 * sends (IPv4 without options, not a fragment, to the engine's port, no
 * RESULT, STATUS or AUTH flag) for the job of the previous frame, when that
 * job has no auth.  Eight masked compares of frame words against the job's
 * template (fast_want: its fixed fields and its latest shape), then what
 * differs per frame (worker, slot and seq, incarnation, IP checksum, frame
 * length), in one branch.  false for anything else and for any frame that
 * fails a check: the full path then finds the counter it is dropped under.
 * A frame taken here is one the full path takes, with the same stage
 * (tests/test_engine.py compares both on hostile and mutated frames).
 * Parse and classify went from ~280 to ~150 instructions per frame, the
 * engine outside the kernel from 619 to 434 with the other changes of the
 * same commits (callgrind, the `homagg bench engine` loop, W = 8, 1 KB;
 * the next-frame prefetches included, see PREFETCH_FN).
 */
static inline bool classify_fast(struct hg_engine *e, struct hg_pkt *pkt,
				 struct hg_stage *st)
{
	const uint8_t *f = pkt->data, *h = f + HG_OFF_HDR;
	struct hg_job *j = e->last;
	uint64_t bad = 0;
	uint32_t w, seq, slot, inc, q, S;
	size_t set;

	if (!j || !j->fast || pkt->len < HG_OFF_PAYLOAD)
		return false;
#pragma GCC unroll 8
	for (int i = 0; i < FAST_WORDS; i++)
		bad |= (ld64(f + FAST_OFF[i]) ^ j->fast_want[i]) &
		       (ld64(fast_fixed + 8 * i) | ld64(fast_shape + 8 * i));
	if ((bad || !j->shape_len) && !fast_new_shape(j, f))
		return false;
	w = hg_rd16(h + 12);
	slot = hg_rd16(h + 14);
	seq = hg_ld_be32(h + 16);
	inc = hg_ld_be32(h + 24);
	S = j->cfg.slots;
	q = slot_quot(j, seq);
	bad = (pkt->len < j->shape_len) | (inc == 0) | (w >= j->cfg.workers) |
	      (slot >= S) | (slot != seq - q * S) |
	      (!(h[3] & HG_FLAG_SHADOW) != !(q & 1)) |
	      /* the IP checksum: the ones' complement sum folds to 0xffff
	       * iff the sum (not 0: ip[0] is 0x45) is a multiple of 0xffff,
	       * 2^16 being 1 modulo 0xffff; a multiply, not a fold */
	      (hg_ip_hdr_sum(f + HG_OFF_IP, 20) % 0xffff != 0);
	if (bad || ((e->wire_flags & HG_WIRE_F_UDP_CSUM) &&
		    !hg_udp_csum_ok(f + HG_OFF_IP, f + HG_OFF_UDP,
				    j->shape_len - HG_OFF_UDP)))
		return false;

	j->cnt[HG_CNT_RECEIVED]++;
	set = 2 * (size_t)slot + (q & 1);
	st->pkt = pkt;
	st->job = j;
	st->set = &j->sets[set];
	st->acc = j->acc + set * j->acc_stride;
	st->in = f + HG_OFF_PAYLOAD;
	st->udp_off = HG_OFF_UDP;
	st->seq = seq;
	st->incarnation = inc;
	st->worker = (uint16_t)w;
	st->flags = h[3];                 /* the high byte is 0 (fast_fixed) */
	st->lanes = hg_rd16(h + 20);
	st->op = h[1];
	st->exp = (int8_t)h[22];
	st->ln = j->shape;
	st->up = false;
	__builtin_prefetch(st->set, 1);
	return true;
}

/*
 * Does worker w's frame of auth job j verify?  Its key epoch picks the
 * keys: the job's current one, or the previous one within its grace period
 * (whose keys are wiped at the first frame of that epoch after it).
 */
static bool worker_verify(struct hg_engine *e, struct hg_job *j, uint32_t w,
			  const struct hg_pkt *pkt,
			  const struct hg_wire_view *v, uint16_t flags)
{
	const uint8_t *h = pkt->data + v->payload_off - HG_HDR_LEN;
	uint8_t epoch = (uint8_t)(flags >> HG_FLAG_EPOCH_SHIFT);
	const struct hg_mac_key *k;
	uint64_t ctr;

	if (!(flags & HG_FLAG_AUTH))
		return false;
	if (epoch == j->epoch) {
		k = &j->keys[w];
	} else if (j->old_keys && epoch == (uint8_t)(j->epoch - 1)) {
		if (hg_port_now(e->port) >= j->old_until_ns) {
			keys_free(j->old_keys, j->cfg.workers + 1);
			j->old_keys = NULL;
			return false;
		}
		k = &j->old_keys[w];
	} else {
		return false;
	}
	ctr = hg_mac_track_counter(&j->peers[w].mac, h);
	if (!hg_mac_key_check(k, HG_AUTH_DIR_REQUEST, ctr, h,
			      HG_HDR_LEN + v->payload_len,
			      pkt->data + v->payload_off + v->payload_len))
		return false;
	hg_mac_track_update(&j->peers[w].mac, h, ctr);
	return true;
}

/*
 * First pass over one frame: everything no frame of the burst can change
 * (the frame itself, the job table, the job's W, S and payload size).  A
 * frame that fails is counted and freed here (job = NULL); a valid one gets
 * its set and accumulator located and the set prefetched.  A check of
 * state that frames change (a set's seq, op, lanes, exp, bitmap) belongs to
 * the second pass, together with every check ordered after it.
 */
static void classify(struct hg_engine *e, struct hg_pkt *pkt,
		     struct hg_stage *st)
{
	struct hg_wire_view v;
	struct hg_job *j = NULL;
	uint32_t S, w, q, expect_shadow;
	uint16_t flags;
	size_t acc_bytes;
	int rc;

	st->job = NULL;
	rc = hg_wire_parse_inl(pkt->data, pkt->len, e->self.port, e->wire_flags,
			       &v);
	if (rc)
		goto drop;
	/*
	 * The flags again from the frame (in L1), not from v: the compiler
	 * widens the 16-bit field's load to 32 bits, which spans two stores of
	 * the parser and stalls store forwarding (~20% of this function under
	 * perf, `homagg bench engine`).
	 */
	flags = hg_rd16(pkt->data + v.payload_off - HG_HDR_LEN + 2);
	st->up = false;
	if (flags & (HG_FLAG_RESULT | HG_FLAG_STATUS)) {
		/* Only a tree leaf takes replies: its root's. */
		if (up_classify(e, pkt, &v, flags, st))
			return;
		rc = HG_CNT_BAD_FLAGS;
		goto drop;
	}
	j = job_find(e, v.hdr.job);
	if (!j) {
		rc = HG_CNT_UNKNOWN_JOB;
		goto drop;
	}
	e->last = j;
	j->cnt[HG_CNT_RECEIVED]++;
	if (v.hdr.token != j->cfg.token) {
		rc = HG_CNT_BAD_TOKEN;
		goto drop;
	}
	w = v.hdr.worker;
	if (w >= j->cfg.workers) {
		rc = HG_CNT_BAD_WORKER;
		goto drop;
	}
	/* Before anything that changes state (incarnation, slot, address). */
	if (j->mac_len ? !worker_verify(e, j, w, pkt, &v, flags)
		       : (flags & HG_FLAG_AUTH)) {
		rc = HG_CNT_BAD_MAC;
		goto drop;
	}
	if (v.hdr.shard != j->cfg.shard) {
		rc = HG_CNT_BAD_SHARD;
		goto drop;
	}
	S = j->cfg.slots;
	q = slot_quot(j, v.hdr.seq);
	expect_shadow = (q & 1) ? HG_FLAG_SHADOW : 0;
	if (v.hdr.slot >= S || v.hdr.slot != v.hdr.seq - q * S ||
	    (flags & HG_FLAG_SHADOW) != expect_shadow) {
		rc = HG_CNT_BAD_SLOT;
		goto drop;
	}
	/* op is valid (hg_wire_parse_inl): its lanes straight from the table */
	st->ln.in_lane = (uint8_t)hg_op_table[v.hdr.op - 1].in_lane;
	st->ln.acc_lane = (uint8_t)hg_op_table[v.hdr.op - 1].acc_lane;
	st->ln.in_shift = (uint8_t)__builtin_ctz(st->ln.in_lane);
	st->ln.in_bytes = (uint16_t)(v.hdr.lanes * st->ln.in_lane);
	acc_bytes = (size_t)v.hdr.lanes * st->ln.acc_lane;
	if (acc_bytes > j->cfg.payload_bytes) {
		rc = HG_CNT_BAD_LANES;
		goto drop;
	}
	if (v.hdr.exp < 0 || v.hdr.exp > hg_op_table[v.hdr.op - 1].exp_max) {
		rc = HG_CNT_BAD_EXP;
		goto drop;
	}

	st->pkt = pkt;
	st->job = j;
	st->set = &j->sets[2 * (size_t)v.hdr.slot + (expect_shadow ? 1 : 0)];
	st->acc = j->acc + (size_t)(st->set - j->sets) * j->acc_stride;
	st->in = pkt->data + v.payload_off;
	/* the source address is read from the frame again when it is
	 * learned: a copy of v.src here is assembled by narrow stores and
	 * read back wide, which stalls store forwarding (measured: a quarter
	 * of this function's cycles under perf, `homagg bench engine`) */
	st->udp_off = (uint16_t)(v.payload_off - HG_HDR_LEN - 8);
	st->seq = v.hdr.seq;
	st->incarnation = v.hdr.incarnation;
	st->worker = (uint16_t)w;
	st->flags = flags;
	st->lanes = v.hdr.lanes;
	st->op = v.hdr.op;
	st->exp = v.hdr.exp;
	__builtin_prefetch(st->set, 1);
	return;

drop:
	count(e, j, rc);
	queue_free(e, pkt);
}

/* Prefetch the cache lines of bytes [from, to) of p, for reading. */
PREFETCH_FN void prefetch_range(const uint8_t *p, size_t from, size_t to)
{
	const uint8_t *end = p + to;

	/* four lines per turn: the loop costs fewer instructions than the
	 * prefetches themselves */
	for (p += from & ~(size_t)63; p + 192 < end; p += 256) {
		__builtin_prefetch(p, 0);
		__builtin_prefetch(p + 64, 0);
		__builtin_prefetch(p + 128, 0);
		__builtin_prefetch(p + 192, 0);
	}
	for (; p < end; p += 64)
		__builtin_prefetch(p, 0);
}

/*
 * Combine a contribution into the set's accumulator.  The first one of a
 * set whose lanes keep their width is copied in one piece (the identity
 * combined with in is in).  Otherwise the kernel runs over PIECE_BYTES of
 * input at a time, and before each piece the same bytes of the next
 * frame's payload (nx, NULL: none) are prefetched, so the frame after this
 * one streams in while this one is summed (frames written by another core
 * or a NIC are not in this core's cache).  The copy prefetches nothing:
 * alone it streams a cold payload faster than interleaved with the next
 * frame's prefetches (8 KB, W = 2: 2940 vs 3300 cycles per frame).
 */
static inline void combine(const struct hg_engine *e, const struct hg_set *s,
			   const struct hg_stage *st, const struct hg_stage *nx)
{
	const size_t il = st->ln.in_lane, al = st->ln.acc_lane;
	const size_t in_bytes = st->ln.in_bytes;
	const size_t nx_bytes = nx ? nx->ln.in_bytes : 0;
	const size_t step = PIECE_BYTES >> st->ln.in_shift; /* lanes per piece */
	uint8_t *acc = st->acc;
	const uint8_t *in = st->in;
	size_t done = 0;

	if (s->count == 0) {
		if (il == al) {
			memcpy(acc, in, in_bytes);
			return;
		}
		memset(acc, hg_op_identity_byte(s->op), (size_t)s->lanes * al);
	}
	if (in_bytes <= PIECE_BYTES) {          /* one piece */
		if (nx_bytes)
			prefetch_range(nx->in, 0, nx_bytes < in_bytes ?
						  nx_bytes : in_bytes);
		e->kern[s->op](acc, in, s->lanes, s->exp);
		if (nx_bytes > in_bytes)
			prefetch_range(nx->in, in_bytes, nx_bytes);
		return;
	}
	do {
		size_t n = s->lanes - done < step ? s->lanes - done : step;
		size_t from = done * il, to = from + n * il;

		if (nx_bytes > from)
			prefetch_range(nx->in, from, to < nx_bytes ? to : nx_bytes);
		e->kern[s->op](acc + done * al, in + from, n, s->exp);
		done += n;
	} while (done < s->lanes);
	if (nx_bytes > in_bytes)
		prefetch_range(nx->in, in_bytes, nx_bytes);
}

/* Second pass over one classified frame: the set logic and the kernel; nx
 * is the frame applied next (NULL: none), whose payload is prefetched. */
static void apply(struct hg_engine *e, struct hg_stage *st,
		  const struct hg_stage *nx)
{
	struct hg_job *j = st->job;
	struct hg_set *s = st->set;
	struct hg_pkt *pkt = st->pkt;
	uint8_t *acc = st->acc;
	uint32_t w = st->worker;
	int rc;

	if (st->up) {
		up_apply(e, st);
		return;
	}
	if (st->flags & HG_FLAG_RETRANS)
		j->peers[w].cnt[HG_WCNT_RETRANS]++;
	/* The incarnation table changes with frames of the burst: checked here. */
	if (st->incarnation != j->peers[w].incarnation) {
		if (j->peers[w].incarnation) {
			if (hg_wire_incarnation_older(st->incarnation,
						      j->peers[w].incarnation)) {
				rc = HG_CNT_OLD_INCARNATION;
				goto drop;
			}
			/* The worker's new life: nothing of the old one is summed. */
			incarnation_reset(e, j, w);
		}
		j->peers[w].incarnation = st->incarnation;
	}

	if (s->state == SET_EMPTY || serial_newer(st->seq, s->seq)) {
		/* A newer chunk for this set: the previous one is complete. */
		memset(s->bitmap, 0, sizeof(s->bitmap));
		s->seq = st->seq;
		s->lanes = st->lanes;
		s->op = st->op;
		s->exp = st->exp;
		s->count = 0;
		s->status_count = NO_STATUS;
		s->psum = 0;
		s->state = SET_OPEN;
	} else if (s->seq != st->seq) {
		rc = HG_CNT_STALE;
		goto drop;
	} else if (s->op != st->op) {
		rc = HG_CNT_BAD_OP;
		goto drop;
	} else if (s->lanes != st->lanes) {
		rc = HG_CNT_BAD_LANES;
		goto drop;
	} else if (s->exp != st->exp) {
		rc = HG_CNT_BAD_EXP;
		goto drop;
	}

	/* Valid: learn where this worker is (frame checked by classify()). */
	memcpy(j->peers[w].addr.mac, pkt->data + 6, 6);
	j->peers[w].addr.ipv4 = hg_ld_be32(pkt->data + HG_OFF_IP + 12);
	j->peers[w].addr.port = hg_rd16(pkt->data + st->udp_off);

	if (s->bitmap[w / 64] & (1ull << (w % 64))) {
		count(e, j, HG_CNT_DUPLICATES);
		j->peers[w].cnt[HG_WCNT_DUPLICATES]++;
		if (s->state == SET_DONE) {
			send_result(e, j, s, acc, (uint16_t)w, &pkt);
			count(e, j, HG_CNT_REPLAYS);
		} else if (s->state == SET_UP) {
			if (st->flags & HG_FLAG_RETRANS)
				up_worker_retrans(e, j, s, acc, (uint16_t)w, &pkt);
		} else if (st->flags & HG_FLAG_RETRANS) {
			answer_retrans(e, j, s, (uint16_t)w, &pkt);
		}
		if (pkt)
			queue_free(e, pkt);
		return;
	}

	combine(e, s, st, nx);
	s->bitmap[w / 64] |= 1ull << (w % 64);
	s->count++;
	count(e, j, HG_CNT_SUMMED);
	j->peers[w].cnt[HG_WCNT_SUMMED]++;
	if (s->count == j->cfg.workers) {
		count(e, j, HG_CNT_COMPLETED);
		if (j->up) {
			up_forward(e, j, s, acc, &pkt);
		} else {
			s->state = SET_DONE;
			if (e->wire_flags & HG_WIRE_F_UDP_CSUM)
				s->psum = hg_csum_add(0, acc, (size_t)s->lanes *
						      st->ln.acc_lane);
			send_result(e, j, s, acc, HG_WORKER_ALL, &pkt);
		}
	}
	if (pkt)
		queue_free(e, pkt);
	return;

drop:
	count(e, j, rc);
	j->peers[w].cnt[HG_WCNT_DROPPED]++;
	queue_free(e, pkt);
}

/* Prefetch the start (PREFETCH_BYTES) of a classified frame's accumulator
 * and payload; lines past a shorter one are harmless (a prefetch never
 * faults) and cost less than a loop.  A root's reply has nothing to sum. */
PREFETCH_FN void prefetch_data(const struct hg_stage *st)
{
	if (!st->ln.in_bytes)
		return;
	for (size_t off = 0; off < PREFETCH_BYTES; off += 64) {
		__builtin_prefetch(st->acc + off, 1);
		__builtin_prefetch(st->in + off, 0);
	}
}

/* The headers of a frame (up to byte 74 of an option-less one: two lines). */
PREFETCH_FN void prefetch_hdr(const struct hg_pkt *p)
{
	__builtin_prefetch(p->data, 0);
	__builtin_prefetch(p->data + 64, 0);
}

/*
 * The burst in chunks of up to HG_ENGINE_MAX_BURST frames: classify them
 * all, then apply them in order.  One at a time (hg_engine_set_staging(e,
 * false)): classify and apply each frame before the next, for comparison.
 */
int hg_engine_process(struct hg_engine *e, struct hg_pkt **pkts, uint32_t n)
{
	if (!e || (!pkts && n))
		return -EINVAL;
	for (uint32_t i = 0; i < n;) {
		uint32_t m = n - i, k, valid = 0;

		if (m > HG_ENGINE_MAX_BURST)
			m = HG_ENGINE_MAX_BURST;
		if (e->one_at_a_time)
			m = 1;
		e->cnt[HG_CNT_RECEIVED] += m;
		for (k = 0; k < m && k < HDR_AHEAD; k++)
			prefetch_hdr(pkts[i + k]);
		for (k = 0; k < m; k++) {
			struct hg_stage *st = &e->stage[valid];

			if (k + HDR_AHEAD < m)
				prefetch_hdr(pkts[i + k + HDR_AHEAD]);
			if (e->one_at_a_time || !classify_fast(e, pkts[i + k], st))
				classify(e, pkts[i + k], st);
			if (st->job)
				valid++;
		}
		for (k = 0; k < valid; k++) {
			if (k + PREFETCH_AHEAD < valid)
				prefetch_data(&e->stage[k + PREFETCH_AHEAD]);
			apply(e, &e->stage[k],
			      k + 1 < valid ? &e->stage[k + 1] : NULL);
		}
		i += m;
	}
	if (e->ntx)
		flush_tx(e);
	if (e->nfree) {
		hg_port_free(e->port, e->fr, (uint16_t)e->nfree);
		e->nfree = 0;
	}
	return (int)n;
}

int hg_engine_set_staging(struct hg_engine *e, bool staged)
{
	if (!e)
		return -EINVAL;
	e->one_at_a_time = !staged;
	return 0;
}

int hg_engine_poll(struct hg_engine *e)
{
	uint16_t n;

	if (!e)
		return -EINVAL;
	if (e->up_next != UINT64_MAX)
		hg_engine_timers(e);
	n = hg_port_rx(e->port, e->rx, e->burst);
	if (!n)
		return 0;
	return hg_engine_process(e, e->rx, n);
}
