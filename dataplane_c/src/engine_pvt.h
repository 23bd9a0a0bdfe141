/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine_pvt.h - what the engine's files share (homagg/engine.h is the
 * interface): the job, set and stage structures, the inline helpers of the
 * job table and the transmit queue, and the functions one file calls in
 * another.  The files, by concern:
 *
 *   engine.c          classification, combine and apply: the packet path
 *                     (hg_engine_process(), hg_engine_poll())
 *   engine_jobs.c     create/destroy, the job table, keys, counters
 *   engine_tx.c       the transmit queue, results, STATUS, retransmissions
 *   engine_tree.c     the tree leaf: partial sums up, the root's replies,
 *                     upward timers (hg_engine_timers())
 */
#ifndef HG_ENGINE_PVT_H
#define HG_ENGINE_PVT_H

#include <stdbool.h>
#include <stdint.h>

#include "auth_pvt.h"
#include "homagg/auth.h"
#include "homagg/counters.h"
#include "homagg/engine.h"
#include "homagg/kernels.h"
#include "homagg/port.h"
#include "homagg/wire.h"
#include "wire_pvt.h"

#define TX_MAX 512
#define FREE_MAX 256
#define ACC_ALIGN 64
/* classify_fast(): the eight-byte words of a frame it compares (offsets
 * in FAST_OFF). */
#define FAST_WORDS 8

/* Tree leaf defaults (docs/PROTOCOL.md "Tree"); the timeout doubles per
 * try up to 2^UP_MAX_BACKOFF times. */
#define HG_UP_DEFAULT_RTO_NS 1000000ull
#define HG_UP_DEFAULT_GIVE_UP_NS 10000000000ull
#define UP_MAX_BACKOFF 6
/* Root results of sets sent up later that overtake a forwarded set before
 * it goes up again at once (docs/PROTOCOL.md "Repairs in a tree"; a root
 * completes sets out of the leaf's order by as many as its other leaves'
 * repairs hold, so more than a worker's DUPTHRESH). */
#define UP_DUPTHRESH 16
/* The measured part of a leaf's upward timeout is at most this many
 * up_rto_ns (docs/PROTOCOL.md "Repairs in a tree"). */
#define UP_MAX_RTT_RTOS 64
/* A leaf repeats its report of a set still open there every
 * min(up_rto_ns, REPORT_REPEAT_NS); a root shows a leaf's missing-below
 * bits while its latest report from that leaf is at most REPORT_STALE_NS
 * old (docs/PROTOCOL.md "Who is missing in a tree"). */
#define REPORT_REPEAT_NS 1000000ull
#define REPORT_STALE_NS (4 * REPORT_REPEAT_NS)

/* The lanes of a frame to sum (all 0: nothing to sum): one word, so a
 * stage takes them in one copy. */
struct hg_lanes {
	uint16_t in_bytes; /* lanes * in_lane: the payload summed */
	uint8_t in_lane;   /* bytes of one lane of op */
	uint8_t acc_lane;
	uint8_t in_shift; /* log2(in_lane) */
};

/* SET_UP: a tree leaf's set, complete here and sent up, waiting for the
 * root's result (docs/PROTOCOL.md "Tree"). */
enum set_state { SET_EMPTY = 0, SET_OPEN = 1, SET_DONE = 2, SET_UP = 3 };

/* One shadow set of one slot. */
struct hg_set {
	uint64_t bitmap[HG_MAX_WORKERS / 64]; /* bit w: worker w counted */
	uint64_t psum; /* checksum partial sum of the result payload (DONE) */
	uint32_t seq;
	uint16_t lanes;
	uint16_t count;
	uint16_t status_count; /* count at its last STATUS to the group, or NO_STATUS */
	uint64_t opened; /* hg_job.accepted when its chunk's first frame came */
	uint8_t op;
	int8_t exp;
	uint8_t state; /* enum set_state */
};

/* A worker's first transmission of seq reports it lost from the set of
 * seq - LOSS_LAG (engine.c loss_report(); TCP's duplicate-ACK threshold). */
#define LOSS_LAG 3

/* hg_set.status_count of a set whose bitmap the group has not had. */
#define NO_STATUS UINT16_MAX

/* What the engine knows of one worker of a job. */
struct hg_peer {
	struct hg_wire_addr addr;     /* learned from its latest valid frame */
	uint32_t incarnation;         /* greatest accepted, 0 = none yet */
	uint64_t last;                /* hg_job.accepted at its latest frame
					* accepted into a set in this incarnation
					* (0: none; STATUS's active bitmap) */
	struct hg_mac_track mac;      /* auth: its MAC counter */
	uint64_t cnt[HG_WCNT__COUNT]; /* hg_engine_worker_counters() */
	uint64_t report_ns;           /* root: its latest leaf report came */
	uint16_t below_base, below_n; /* root: the job's worker ids its leaf
				       * reports cover (below_n 0: none) */
};

struct hg_job {
	struct hg_job_config cfg;
	bool in_use;
	uint32_t acc_stride; /* bytes between accumulators */
	int slot_shift;      /* log2(S) when S is a power of 2, else -1 */
	uint64_t slot_recip; /* else 2^64 / S rounded up (slot_quot()) */
	/*
	 * classify_fast(): frame words (FAST_WORDS) every contribution of
	 * this job has, masked by fast_fixed[] (see there), and the shape of
	 * the latest one it took (masked by fast_shape[]: op, lanes, exp and
	 * the two lengths they imply, checked once per shape); shape_len,
	 * shape_op: that shape's frame length and op facts (shape_len 0: no
	 * shape yet).  fast_fix, fast_mask: fast_fixed[] and fast_fixed[] |
	 * fast_shape[] as this job uses them (an auth job's frames carry
	 * HG_FLAG_AUTH and the job's key epoch in the flags and a MAC
	 * counter where the others have reserved zeros).  fast: the job
	 * takes that path.
	 */
	uint64_t fast_want[FAST_WORDS];
	uint64_t fast_fix[FAST_WORDS];
	uint64_t fast_mask[FAST_WORDS];
	uint32_t shape_len;
	struct hg_lanes shape;
	bool fast;
	/* The L2-L4 headers of a result to the job's group, built for a UDP
	 * payload of mc_plen bytes (0: not yet). */
	uint16_t mc_plen;
	uint8_t mc_l2l4[HG_OFF_HDR];
	struct hg_set *sets;     /* 2 * S, set of slot s shadow h: 2s+h */
	uint8_t *acc;            /* 2 * S * acc_stride, 64-byte aligned */
	struct hg_peer *peers;   /* W entries */
	struct hg_mac_key *keys; /* auth: W worker keys + the aggregator's */
	struct hg_mac_key *old_keys; /* the previous epoch's, within its grace */
	uint64_t old_until_ns;       /* end of old_keys' grace period */
	bool old_expired;            /* in e->expired, freed after the burst */
	uint8_t epoch;               /* current key epoch */
	uint64_t mac_ctr;            /* auth: replies MACed in this epoch */
	/* auth leaf (docs/PROTOCOL.md "Key epochs in a tree"): UP_KEYS keys,
	 * UPK_SEND/UPK_REPLY of upward epoch up_epoch (its own key at the
	 * root, the root's), UPK_NEXT_* of up_epoch + 1 when up_has_next,
	 * UPK_PREV_REPLY of up_epoch - 1 when up_has_prev */
	struct hg_mac_key *up_keys;
	uint8_t up_epoch;
	bool up_has_next, up_has_prev;
	uint64_t up_ctr; /* auth leaf: requests MACed in up_epoch */
	struct hg_mac_track up_track; /* auth leaf: the root's MAC counter */
	size_t mac_len;               /* auth: HG_MAC_LEN, else 0 */
	uint64_t cnt[HG_CNT__COUNT];
	uint64_t accepted;      /* frames accepted into a set so far */
	struct hg_up_timer *up; /* tree leaf: 2 * S upward timers, else NULL */
	uint64_t up_txn;        /* tree leaf: partial sums sent up so far */
	uint64_t up_passed;     /* tree leaf: the highest txn_first of a set
				 * the root answered (its RESULT, or a STATUS
				 * showing the leaf): every copy sent before
				 * it has reached the root or was lost */
	uint64_t up_reply_avg;  /* tree leaf: smoothed time from a send up */
	uint64_t up_reply_var;  /*   to the root's answer, and its deviation */
	bool up_reply_have;     /*   (0 samples: up_rto_ns / 2 holds off) */
	uint64_t up_rtt_avg;    /* tree leaf: smoothed round trip to the root */
	uint64_t up_rtt_var;    /*   (a first send to its RESULT) and its */
	bool up_rtt_have;       /*   deviation: the upward timeout */
	uint32_t up_backoff;    /* tree leaf: doublings of the upward timeout */
	uint64_t up_backoff_ns; /*   since its last sample; the last one then */
	uint32_t up_incarnation; /* tree leaf: the root's, 0 = none seen yet */
	uint32_t up_self;     /* tree leaf: its own incarnation at the root */
	struct hg_view *view; /* 2 * S: who is missing in a tree */
};

/*
 * Who is missing in a tree (docs/PROTOCOL.md "Tree"), per set.  Root:
 * below, the job's worker ids the leaves reported missing from chunk
 * below_seq (below_set: any report of it).  Leaf: the root's latest STATUS
 * of forwarded chunk view_seq (have_view), and when its first and latest
 * reports of chunk report_seq went up (it repeats them while the chunk is
 * open there).  Only texts read it; nothing is summed by it.
 */
#define VIEW_BYTES (HG_MAX_WORKERS / 8)
struct hg_view {
	uint32_t below_seq, view_seq, report_seq;
	bool below_set, have_view, reported;
	uint64_t report_ns;         /* leaf: its latest report of report_seq */
	uint64_t report_first_ns;   /* leaf: its first report of report_seq */
	uint8_t root[VIEW_BYTES];   /* leaf: the root's worker bitmap */
	uint8_t active[VIEW_BYTES]; /* leaf: the root's active bitmap */
	uint8_t below[VIEW_BYTES];  /* missing-below bitmap (zeros: none) */
};

/* Tree leaf: the upward timer of one set (SET_UP). */
struct hg_up_timer {
	uint64_t first_ns; /* first sent up */
	uint64_t sent_ns;  /* last sent up */
	uint64_t due_ns;   /* resend then; UINT64_MAX: abandoned */
	uint32_t tries;
	uint64_t txn_first; /* the job's up_txn at its first send */
	uint64_t txn_last;  /* the same at its latest send or root STATUS
			     * showing it present: results of sets first
			     * sent after it overtake it */
	uint64_t txn_sent;  /* the same at its latest send */
	uint32_t overtaken;
	bool awaiting; /* sent up, and the root has not answered since */
	bool resent;   /* sent up more than once (no round-trip sample) */
	bool deferred; /* a resend a root STATUS asked for within the
			* hold-off: due_ns is its time, not an expiry */
};

/* What the first pass learned of one frame of a burst. */
struct hg_stage {
	struct hg_pkt *pkt;
	struct hg_job *job; /* NULL: dropped in the first pass */
	struct hg_set *set;
	uint8_t *acc;
	const uint8_t *in; /* payload */
	uint32_t seq;
	uint32_t incarnation;
	uint16_t udp_off; /* of the UDP header: the source port */
	uint16_t worker;
	uint16_t flags;
	uint16_t lanes;
	uint8_t op;
	int8_t exp;
	struct hg_lanes ln;
	bool up;       /* a root's RESULT or STATUS (tree leaf) */
	uint16_t plen; /* up: the payload's bytes */
	/* Auth job: the frame's MAC is checked with the burst's others
	 * (verify_burst) under mac_key (NULL: no check pending) over
	 * mac_bytes (header + payload); mac_rc: the first check after the
	 * MAC that failed (0: none), counted only if the MAC verifies. */
	const struct hg_mac_key *mac_key;
	uint16_t mac_bytes;
	uint16_t mac_rc;
};

struct hg_engine {
	struct hg_port *port;
	struct hg_wire_addr self; /* source of everything sent */
	bool can_replicate;
	uint32_t flags;
	uint32_t wire_flags;
	uint16_t burst;
	hg_kernel_fn kern[HG_OP__COUNT + 1];

	uint32_t max_jobs;
	uint32_t njobs;
	struct hg_job *last; /* job of the previous frame (NULL: none) */
	struct hg_job *jobs; /* max_jobs entries */
	uint32_t *table;     /* open addressing: job index + 1, 0 empty */
	uint32_t table_mask;

	uint64_t cnt[HG_CNT__COUNT];

	uint32_t ntx, nfree;
	struct hg_pkt *tx[TX_MAX];
	struct hg_pkt *fr[FREE_MAX];
	struct hg_pkt *rx[HG_ENGINE_MAX_BURST];
	struct hg_stage stage[HG_ENGINE_MAX_BURST];
	struct hg_mac_req mreq[HG_ENGINE_MAX_BURST]; /* verify_burst's */
	/* jobs whose previous key epoch's grace ended during this burst:
	 * their old keys are freed once the burst's MACs are checked */
	struct hg_job *expired[HG_ENGINE_MAX_BURST];
	uint32_t nexpired;
	bool one_at_a_time; /* hg_engine_set_staging(e, false) */
	uint64_t up_next;   /* earliest upward timer, UINT64_MAX: none */
};

/* ---- across the engine's files ------------------------------------------ */

void hg_eng_keys_free(struct hg_mac_key *k, size_t n);
void hg_eng_flush_tx(struct hg_engine *e);
struct hg_pkt *hg_eng_out_pkt(struct hg_engine *e, struct hg_job *j,
			      struct hg_pkt **reuse, size_t need);
void hg_eng_send_result(struct hg_engine *e, struct hg_job *j,
			const struct hg_set *s, const uint8_t *acc, uint16_t w,
			struct hg_pkt **reuse);
bool hg_eng_send_status(struct hg_engine *e, struct hg_job *j,
			const struct hg_set *s, uint16_t w, struct hg_pkt **reuse);
bool hg_eng_send_loss_report(struct hg_engine *e, struct hg_job *j,
			     const struct hg_set *s, uint16_t w, bool group,
			     struct hg_pkt **reuse);
void hg_eng_answer_retrans(struct hg_engine *e, struct hg_job *j,
			   struct hg_set *s, uint16_t w, struct hg_pkt **reuse);
void hg_eng_up_forward(struct hg_engine *e, struct hg_job *j, struct hg_set *s,
		       const uint8_t *acc, struct hg_pkt **reuse);
void hg_eng_up_worker_retrans(struct hg_engine *e, struct hg_job *j,
			      struct hg_set *s, const uint8_t *acc, uint16_t w,
			      struct hg_pkt **reuse);
bool hg_eng_up_classify(struct hg_engine *e, struct hg_pkt *pkt,
			const struct hg_wire_view *v, uint16_t flags,
			struct hg_stage *st);
void hg_eng_up_apply(struct hg_engine *e, struct hg_stage *st);
void hg_eng_up_report(struct hg_engine *e, struct hg_job *j,
		      const struct hg_set *s);
size_t hg_eng_tree_tail(const struct hg_job *j, const struct hg_set *s,
			uint64_t now, uint8_t *out);

/* Clear bits base .. base + n - 1 of a missing-below bitmap. */
static inline void bits_clear(uint8_t *b, uint32_t base, uint32_t n)
{
	for (uint32_t i = base; i < base + n && i < HG_MAX_WORKERS; i++)
		b[i / 8] &= (uint8_t) ~(1u << (i % 8));
}
void hg_eng_fast_template(const struct hg_engine *e, struct hg_job *j);

/* ---- job table (engine_jobs.c) ---------------------------------------- */

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

/* ---- transmit queue (engine_tx.c) --------------------------------------- */

static inline void queue_tx(struct hg_engine *e, struct hg_pkt *p)
{
	if (e->ntx == TX_MAX)
		hg_eng_flush_tx(e);
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

/* Flags of a reply about set s: its shadow bit plus kind. */
/* Whether replies to HG_WORKER_ALL go as one frame to the job's group. */
static inline bool hg_eng_to_group(const struct hg_engine *e,
				   const struct hg_job *j)
{
	return e->can_replicate && j->cfg.group_ipv4;
}

enum {
	UPK_SEND,
	UPK_REPLY,
	UPK_NEXT_SEND,
	UPK_NEXT_REPLY,
	UPK_PREV_REPLY,
	UP_KEYS
};

/* The key that checks worker w's frame of auth job j by its key epoch
 * (NULL: none, a bad MAC): engine.c, "Key epochs". */
const struct hg_mac_key *hg_eng_worker_key(struct hg_engine *e, struct hg_job *j,
					   uint32_t w, uint16_t flags);

/* Auth leaf j's next upward keys become its keys (a root reply of the next
 * epoch verified, or a resend upward): docs/PROTOCOL.md "Key epochs in a
 * tree". */
void hg_eng_up_key_switch(struct hg_job *j);

static inline uint16_t set_flags(const struct hg_job *j, const struct hg_set *s,
				 uint16_t kind)
{
	return (uint16_t)(kind | (((s - j->sets) & 1) ? HG_FLAG_SHADOW : 0));
}

#endif /* HG_ENGINE_PVT_H */
