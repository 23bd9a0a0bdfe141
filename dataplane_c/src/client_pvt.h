/* SPDX-License-Identifier: Apache-2.0 */
/*
 * client_pvt.h - the worker client's state (struct hg_client), shared by
 * client.c (create, poll, the blocking allreduce), client_method.c (the
 * method sequencer), client_window.c (the window transport) and
 * client_rto.c (the retransmission timeout).
 */
#ifndef HOMAGG_CLIENT_PVT_H
#define HOMAGG_CLIENT_PVT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "auth_pvt.h"
#include "codec_pvt.h"
#include "homagg/auth.h"
#include "homagg/client.h"
#include "homagg/codec.h"
#include "homagg/wire.h"

#define BURST 64 /* a window's worth of frames per port call */
/*
 * pipeline_groups 0 (automatic): at most this many block groups.  Measured
 * on the 4-worker testbed (2^22 floats, dense, 1 Gbit/s, median of 5):
 * 8 groups 781 ms, 1 (unpipelined) 900 ms, 64 groups 1009 ms -- on a
 * CPU-bound host many small groups cost more than they overlap.
 */
#define HG_CLIENT_AUTO_GROUPS 8
/* Results of chunks sent after a missing one that declare it lost (TCP's
 * duplicate-ACK threshold): tolerates reordering by up to DUPTHRESH - 1. */
#define DUPTHRESH 3

/* The pipe (PROTOCOL.md "The pipe"): its least bound in chunks, its
 * bound before the aggregator's first RTT sample at most, the most chunks
 * a worker's pipes start with together ("Several pipes on one link":
 * hg_cl_pipe_start), and how long one bucket of Rmin's minimum lasts
 * (ns). */
#define PIPE_MIN 4
#define PIPE_START 8
#define PIPE_LINK_START 32
#define RMIN_BUCKET_NS 10000000000ull
/* How far a worker sends past a chunk whose slot an overdue chunk holds
 * (laps of K S chunks past the lowest unsent one): the other slots go on
 * meanwhile. */
#define AHEAD_LAPS 8
/* A window is stalled (sent again whole) only after a silence of its
 * aggregator of give_up_ns / STALL_WINDOW_DIV: in time for every open chunk's
 * STATUS to come back before the give-up names the missing workers. */
#define STALL_WINDOW_DIV 8
/* Turns a worker waits at most before its fast retransmission (PROTOCOL.md
 * Part 3): the first turn's STATUS is back after one, so later turns only
 * come when it was lost or late. */
#define TURNS_MAX 2
/* below a tree leaf, a chunk's first timeout in a step's tail: at most
 * this many Rmin (PROTOCOL.md "The tail of a step", rule 5) */
#define TAIL_RMINS 3
/* An aggregator that answered none of this many retransmissions in a row
 * stopped answering (a live one answers every resend its slot has, with
 * the result or a STATUS; one that lacked it adds it silently). */
#define STOPPED_UNANSWERED 3
/* A floor spurious timeouts taught the timeout halves after this long
 * without another one (hg_cl_spurious_timeout). */
#define STALL_MEMORY_NS 1000000000ULL
/* The start wait is 1.5 times the least of this many latest step-start
 * samples (hg_cl_start_sample). */
#define START_SAMPLES 8
/* done[] values: no result yet, the result, the result after a timeout
 * (a second copy then shows the timeout was spurious). */
enum { CH_PENDING = 0, CH_DONE = 1, CH_DONE_AFTER_TIMEOUT = 2 };
/* The blocking form's longest wait without a deadline (a safety net). */
#define IDLE_WAIT_NS 10000000ull
#define ETH_LEN 14
#define IP_LEN 20
#define UDP_LEN 8
#define BITMAP_BYTES (HG_MAX_WORKERS / 8)
/* A STATUS's bytes after its two bitmaps: a tree leaf's view of its root. */
#define TREE_TAIL (HG_STATUS_MAX_PAYLOAD - 2 * BITMAP_BYTES)

enum stage {
	ST_IDLE = 0,
	ST_RUNNING,
	ST_DONE,
	ST_FAILED,
};

/* One phase's run of lanes, aggregated with the phase's op. */
struct stream {
	enum hg_op op;
	int8_t exp;
	enum hg_phase phase;
	size_t in_off;  /* its lanes in c->tx[phase] from this byte */
	size_t out_off; /* its results in c->rx[phase] from this byte */
	size_t lanes;
	size_t in_lane, acc_lane;
	size_t per_chunk; /* lanes per chunk */
	size_t chunks;
	size_t first_chunk; /* index of its first chunk in the segment */
	uint32_t unit;      /* the unit it belongs to (seg.u) */
};

/*
 * A unit: step `step` of the method for block group `group` (without
 * pipelining: the step for the whole tensor), its streams seg.s[first_stream
 * .. + nstreams - 1] and chunks first_chunk .. + nchunks - 1 of the segment.
 */
struct unit {
	uint32_t group, step;
	uint32_t first_stream, nstreams;
	size_t first_chunk, nchunks;
	size_t ndone; /* chunks with their result */
	bool decoded;
};

/*
 * A segment: a run of consecutively numbered chunks whose window state is
 * kept together -- one step without pipelining, the whole allreduce with it
 * (docs/PROTOCOL.md "Pipelined block groups").  Its units are appended in
 * schedule order as they are numbered; its chunk count grows with them.
 */
struct segment {
	struct stream *s;
	uint32_t nstreams, cap_streams;
	struct unit *u;
	uint32_t nunits, cap_units;
	uint32_t lo_unit; /* every unit below is complete and decoded */
	uint64_t base;    /* chunk number c of its first chunk */
	size_t nchunks;   /* chunks numbered so far */
	size_t next_send; /* every chunk below was sent */
	size_t ndone;
	uint64_t completions; /* units that completed (decoding looks when it moves) */
	uint64_t seen;        /* completions the sequencer has looked at */
	bool first; /* the allreduce's first segment (hg_cl_start_class) */
};

/* A chunk in flight, at ring index a * S + seq % S. */
struct flight {
	uint64_t chunk; /* its chunk number c */
	uint32_t seq;   /* its sequence number at its aggregator */
	uint32_t agg;   /* a = chunk % K */
	uint32_t unit;  /* its unit in the segment (seg.u) */
	bool busy;
	bool unsent; /* the port refused it: send at the next poll */
	bool have_status;
	/* a STATUS of its chunk came before its first transmission: its
	 * result waited for a repair and is no RTT sample */
	bool status_before;
	bool timed_out; /* its timer expired; not yet judged spurious */
	bool present;   /* a STATUS showed our contribution in the slot */
	bool replied;   /* a STATUS of it came since its latest transmission */
	bool spurious;  /* a timeout of it was spurious: its result
				 * teaches the floor (hg_cl_note_silence) */
	uint16_t overtaken; /* results of chunks sent after its latest transmission */
	uint32_t tries;     /* transmissions so far */
	uint64_t txn_first; /* transmission order number of its first sending */
	uint64_t txn_last;  /*   and of its latest, or the latest of all when a
				 * STATUS showed it present (results of chunks
				 * first sent after it overtake it) */
	uint64_t fast_at;   /* a fast retransmission is due then (0: none) */
	uint64_t first_tx;  /* when it was queued for its first transmission */
	uint64_t last_tx;   /* its latest transmission */
	uint64_t armed; /* its timer runs from here (see hg_cl_chunk_deadline) */
	uint64_t stalled; /* the longest silence of its aggregator while it
				 * was in flight (ns; hg_cl_path_result) */
	uint64_t silence; /* the longest stall of its aggregator it waited
				 * through (ns; hg_cl_note_silence) */
	uint64_t rto;     /* its timeout: the client's at the first
				 * transmission, backed off at every expiry */
	uint8_t bitmap[BITMAP_BYTES];
	uint8_t tree_len; /* bytes of tree: the STATUS's root view */
	uint8_t tree[TREE_TAIL];
	/* 1 + the latest chunk of this flight slot that a STATUS came for
	 * before we sent it (0: none) */
	uint64_t status_ahead;
};

/*
 * A smoothed mean and mean deviation of samples, ns (RFC 6298 section 2:
 * alpha = 1/8, beta = 1/4; the first sample r gives r and r / 2).
 */
struct smooth {
	bool have;
	uint64_t avg, var;
};

/*
 * One aggregator of the job: where its chunks go, its RTT estimator (ns,
 * RFC 6298; rto_est: SRTT + max(G, 4 RTTVAR), clamped, from the last
 * sample; rto: what a new chunk is armed with, rto_est backed off by
 * timeouts since that sample), and the order of its results in the step.
 */
struct agg {
	struct hg_wire_addr dst;
	struct smooth rtt;   /* SRTT (avg) and RTTVAR (var) */
	struct smooth path;  /* the same of the samples no stall lengthened
				 * (hg_cl_path_sample): the workers' turns */
	struct smooth reply; /* below a tree leaf: a retransmission to the
			      * STATUS answering it (hg_cl_reply_sample) */
	uint64_t rto_est, rto;
	uint64_t rto_first; /* the timeout before its first RTT sample (0: cfg.rto_ns) */
	uint64_t stall;   /* the floor of rto_est that spurious timeouts
				 * taught (ns, 0: none; see hg_cl_spurious_timeout) */
	uint64_t t_stall; /* when stall was last raised or halved */
	uint64_t late; /* the silence of the latest result of a timed-out chunk */
	uint64_t t_res;     /* when its latest new result arrived (0: none) */
	uint64_t t_backoff; /* when rto was last backed off */
	uint64_t t_timeout; /* when a timer last expired (0: never) */
	size_t hi_done;     /* 1 + its highest chunk (of the step) with its
				 * result (0: none) */
	size_t lo_open; /* each of its chunks of the step below has its result */
	uint64_t t_hi;  /* when the result of chunk hi_done - 1 arrived */
	uint64_t t_first_tx; /* when its first chunk of the step was sent (0: not yet) */
	uint64_t start_results; /* st.results_received at the allreduce's start */
	uint64_t start_sent;    /* st.packets_sent then */
	uint32_t incarnation; /* of this allreduce's first reply (0: none yet) */
	struct hg_mac_track mac; /* auth: its MAC counter */
	/* its latest STATUS of this allreduce (any chunk): who it lacked */
	bool have_status;
	uint32_t unanswered; /* retransmissions to it since its latest reply */
	uint64_t status_chunk;
	uint8_t status_bitmap[BITMAP_BYTES];
	uint8_t status_tree_len;
	uint8_t status_tree[TREE_TAIL];
	/* the latest whole root view (a tree leaf's tail) a STATUS of this
	 * allreduce carried, of chunk view_chunk: for a give-up whose chunk's
	 * STATUS came before the leaf had one */
	uint64_t view_chunk;
	uint8_t view_tree_len;
	uint8_t view_tree[TREE_TAIL];
	struct hg_client_agg_stats st;
	/* The pipe (PROTOCOL.md "The pipe"), when cfg.pipe_gain_pct: its
	 * bound in chunks (0: no sample yet, hg_cl_pipe_start); and Rmin's two
	 * buckets: the least sample since t_rmin and in the RMIN_BUCKET_NS
	 * before it. */
	double cwnd;
	uint64_t rmin, rmin_prev, t_rmin;
};

/* A growable scratch buffer, kept across allreduces. */
struct buf {
	uint8_t *p;
	size_t cap;
};

struct hg_client {
	struct hg_client_config cfg;
	struct hg_port_info me;
	struct hg_wire_addr src; /* this worker */
	struct agg *agg;         /* K entries */
	uint32_t naggs;          /* K */

	/* the allreduce in progress */
	enum stage stage;
	int rc; /* result once ST_DONE / ST_FAILED */
	struct hg_params p;
	const struct hg_method_info *mi; /* the method (after auto's choice) */
	uint32_t step; /* index of the current step in mi->steps
				 * (unpipelined) */
	/*
	 * Block groups (docs/PROTOCOL.md "Pipelined block groups"): G groups
	 * of gb blocks; the schedule's next unit is (round - rstep, rstep).
	 */
	uint32_t groups, group_blocks;
	uint32_t round, rstep;
	size_t ph_lanes[HG_PH__COUNT]; /* lanes of each phase numbered this allreduce */
	/* the block range the phase codecs work on: blocks gb0 .. gb0 + gnb - 1,
	 * elements ge0 .. ge0 + gn - 1 */
	size_t gb0, gnb, ge0, gn;
	uint32_t sent_phases; /* phases of the steps completed so far (mask) */
	bool choose_again;    /* auto: choose again after the index step */
	const float *x;
	float *y;
	size_t n, nblocks;
	struct hg_lhc *lhc; /* the current group's (glhc[cur_group]) */
	struct hg_lhc_scratch lhc_scratch; /* the candidate list between them */
	struct hg_scan *scan; /* the one-pass encode of x (lhc, union, auto) */
	struct buf lcounts;   /* this worker's counts, one lane per block */
	struct buf gcounts;   /* the global counts, one lane per block */
	struct segment st;
	uint64_t start_results; /* results_received at the start */
	uint64_t start_sent;

	uint64_t next_chunk; /* chunk number c of the next chunk */
	uint64_t txn;        /* transmissions so far: their order numbers */
	bool tx_blocked;     /* the port refused frames in the latest poll */
	uint64_t t_win_full; /* since when a numbered chunk waits for its slot
				 * (0: none waits; stats.window_full_ns) */
	/*
	 * Step-start wait, ns: the time from a step's first transmission to
	 * its first result includes the slowest peer's computing of the step
	 * (every worker starts a step when it has decoded the previous one).
	 * 1.5 times the least of the latest START_SAMPLES samples, one per
	 * step and aggregator, of its class (hg_cl_start_class: an
	 * allreduce's first step, or a later one); chunks of an aggregator
	 * without a result in the step yet wait max(RTO, start_wait).
	 */
	uint64_t start_s[2][START_SAMPLES]; /* the latest samples (rings) */
	uint64_t start_n[2];                /* samples taken */
	uint64_t start_wait[2];
	struct flight *fl; /* K * S entries */
	struct buf done;   /* one byte per chunk of the segment */
	struct buf glast;  /* pipelined: per group, its latest unit (uint32) */
	struct buf glhc; /* per group, its lhc (struct hg_lhc *; lhc, union) */
	struct buf gmethod; /* pipelined auto: per group, its method so far (uint8) */
	uint32_t cur_group; /* the group the phase codecs work on (lhc: its glhc) */
	struct buf tx[HG_PH__COUNT]; /* per phase: this worker's lanes */
	struct buf rx[HG_PH__COUNT]; /* per phase: the aggregated lanes */

	/* auth: this worker's key, then the aggregator's, of the current key
	 * epoch; of the next (given, not yet used); of the previous (the
	 * aggregator's only, for its replies still in that epoch) */
	struct hg_mac_key keys[2];
	struct hg_mac_key next[2];
	struct hg_mac_key prev_agg;
	bool has_next, has_prev;
	uint8_t epoch;
	uint64_t mac_ctr; /* frames MACed in this epoch */
	size_t mac_len;   /* auth: HG_MAC_LEN, else 0 */

	struct hg_client_stats stats;
	char err[512];
};

/* client.c */
int hg_cl_buf_need(struct buf *b, size_t n);
/* Send with the next key epoch from now on (auth, when given one). */
void hg_cl_key_switch(struct hg_client *c);
void hg_cl_release_lhc(struct hg_client *c);
/* The allreduce failed with rc (a negative errno): returns rc. */
int hg_cl_fail(struct hg_client *c, int rc);
/* The same, with the error text what. */
int hg_cl_fail_text(struct hg_client *c, int rc, const char *what);

/* client_method.c: the sequencer */
int hg_cl_advance(struct hg_client *c);
/* A result completed chunk k of the segment (counts it for its unit). */
void hg_cl_chunk_done(struct hg_client *c, size_t k);
void hg_cl_release_segment(struct hg_client *c);

/* client_window.c: the window transport */
const struct stream *hg_cl_chunk_stream(const struct hg_client *c, size_t k);
void hg_cl_rx_all(struct hg_client *c, uint64_t now);
void hg_cl_tx_new(struct hg_client *c, uint64_t now);
int hg_cl_tx_expired(struct hg_client *c, uint64_t now);
uint64_t hg_cl_next_deadline(const struct hg_client *c, uint64_t now);

/* client_rto.c: the retransmission timeout */
uint64_t hg_cl_rto_backoff(const struct hg_client *c, uint64_t rto);
/* Rmin of aggregator ag: its least RTT sample of the last 10-20 s (0: none) */
uint64_t hg_cl_rtt_min(const struct agg *ag);
uint32_t hg_cl_pipe_start(const struct hg_client *c);
void hg_cl_rtt_sample(const struct hg_client *c, struct agg *ag, uint64_t r,
		      uint64_t now, bool full);
unsigned hg_cl_start_class(const struct hg_client *c);
void hg_cl_start_sample(struct hg_client *c, struct agg *ag, uint64_t s,
			uint64_t now);
void hg_cl_path_result(struct hg_client *c, struct agg *ag, uint64_t now);
void hg_cl_path_sample(struct agg *ag, const struct flight *fl, uint64_t r);
void hg_cl_spurious_timeout(struct hg_client *c, struct agg *ag,
			    struct flight *fl, uint64_t silence, uint64_t now);
void hg_cl_stall_floor(const struct hg_client *c, struct agg *ag,
		       uint64_t silence, uint64_t now);
void hg_cl_note_silence(struct hg_client *c, struct agg *ag, uint64_t now);
uint32_t hg_cl_chunk_rank(const struct hg_client *c, uint64_t chunk);
uint64_t hg_cl_turn_offset(const struct hg_client *c, const struct agg *ag,
			   uint64_t chunk);
void hg_cl_reply_sample(const struct hg_client *c, struct agg *ag, uint64_t r);
uint64_t hg_cl_turn_ns(const struct hg_client *c, const struct agg *ag);
uint64_t hg_cl_chunk_rto(const struct hg_client *c, const struct flight *fl);
uint64_t hg_cl_chunk_deadline(const struct hg_client *c, const struct flight *fl);
bool hg_cl_step_start(const struct hg_client *c, const struct flight *fl);

/* The tail of the step: every chunk of it sent once (PROTOCOL.md Part 3,
 * "The tail of a step"), so no new chunk can show a loss by overtaking
 * and no window waits behind the open ones. */
static inline bool hg_cl_tail(const struct hg_client *c)
{
	return c->st.next_send >= c->st.nchunks;
}

#endif
