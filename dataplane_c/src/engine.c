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
 *
 * This file is the packet path (classify, combine, apply); the job table,
 * what the engine sends and the tree leaf are in engine_jobs.c, engine_tx.c
 * and engine_tree.c (see engine_pvt.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine_pvt.h"
#include "homagg/codec.h"
#include "prefetch_pvt.h"

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
 * no flag but RETRANS, SHADOW and OVERFLOW, job, token, shard, reserved 0;
 * an auth job's hg_job.fast_fix has AUTH and its epoch in the flags and
 * leaves the MAC counter free); fast_shape: those of its shape (IP and UDP length, op, lanes, exp).
 */
static const uint8_t FAST_OFF[FAST_WORDS] = { 12, 20, 34, 42, 50, 56, 64, 66 };
static const uint8_t fast_fixed[FAST_WORDS * 8] = {
	0xff, 0xff,
	0xff, 0,
	0,    0,
	0,    0, /* 12: type, version+IHL */
	0x3f, 0xff,
	0,    0xff,
	0,    0,
	0,    0, /* 20: fragment, protocol */
	0,    0,
	0xff, 0xff,
	0,    0,
	0,    0, /* 34: destination port */
	0xff, 0,
	0xff, (uint8_t) ~(HG_FLAG_RETRANS | HG_FLAG_SHADOW | HG_FLAG_OVERFLOW),
	0xff, 0xff,
	0xff, 0xff, /* 42: version, flags, job */
	0xff, 0xff,
	0xff, 0xff,
	0,    0,
	0,    0, /* 50: token */
	0,    0,
	0,    0,
	0,    0,
	0,    0, /* 56: slot, seq, lanes */
	0,    0xff,
	0,    0,
	0,    0,
	0,    0, /* 64: shard */
	0,    0,
	0,    0,
	0xff, 0xff,
	0xff, 0xff, /* 66: reserved */
};
static const uint8_t fast_shape[FAST_WORDS * 8] = {
	[4] = 0xff,         [5] = 0xff,         /* IP total length */
	[2 * 8 + 4] = 0xff, [2 * 8 + 5] = 0xff, /* UDP length */
	[3 * 8 + 1] = 0xff,                     /* op */
	[5 * 8 + 6] = 0xff, [5 * 8 + 7] = 0xff, /* lanes */
	[6 * 8] = 0xff,                         /* exp */
};

/* The fixed words of job j's contributions (see hg_job), no shape yet. */
void hg_eng_fast_template(const struct hg_engine *e, struct hg_job *j)
{
	uint8_t want[FAST_WORDS * 8] = {
		0x08,
		0x00,
		0x45,
		[8 + 3] = 17,
		[16 + 2] = (uint8_t)(e->self.port >> 8),
		[16 + 3] = (uint8_t)e->self.port,
		[24] = HG_PROTOCOL_VERSION,
	};

	uint8_t fix[FAST_WORDS * 8];

	memcpy(fix, fast_fixed, sizeof(fix));
	hg_st_be32(want + 24 + 4, j->cfg.job);
	hg_st_be32(want + 32, j->cfg.token);
	want[48 + 1] = j->cfg.shard;
	if (j->mac_len) { /* the flag, the current epoch; the counter */
		want[24 + 2] = j->epoch;
		want[24 + 3] = HG_FLAG_AUTH;
		memset(fix + 56 + 4, 0, 4);
	}
	for (int i = 0; i < FAST_WORDS; i++) {
		j->fast_want[i] = ld64(want + 8 * i);
		j->fast_fix[i] = ld64(fix + 8 * i);
		j->fast_mask[i] = ld64(fix + 8 * i) | ld64(fast_shape + 8 * i);
	}
	j->shape_len = 0;
	j->fast = true;
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
 * by retransmission.  Rare (a restart), so a scan of the 2 S sets.  A tree
 * leaf then takes a new incarnation toward its root (up_self).
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
	/* A tree leaf: its sets' seqs start over with this life, so it is a
	 * new life at the root too (the root empties what the leaf's earlier
	 * life left there; else the root's later seqs make them stale). */
	if (j->cfg.up)
		j->up_self = j->up_self + 1 ? j->up_self + 1 : 1;
}

/*
 * classify_fast() on a frame whose shape words differ from job j's latest
 * shape: the frame's fixed words must match, and its op, lanes, exp and
 * lengths pass the checks of hg_wire_parse_inl() and classify(); then they
 * become the job's shape.  Once per phase or short last chunk, not per
 * frame.
 */
__attribute__((noinline, cold)) static bool fast_new_shape(struct hg_job *j,
							   const uint8_t *f)
{
	const uint8_t *h = f + HG_OFF_HDR;
	const struct hg_op_info *oi;
	uint32_t lanes = hg_rd16(h + 20), udp_len;
	unsigned op = h[1];
	uint64_t bad = 0;

	for (int i = 0; i < FAST_WORDS; i++)
		bad |= (ld64(f + FAST_OFF[i]) ^ j->fast_want[i]) & j->fast_fix[i];
	if (bad || op - 1u >= HG_OP__COUNT)
		return false;
	oi = &hg_op_table[op - 1];
	/* The UDP datagram is the header and lanes * in_lane bytes of
	 * payload, the IP packet that datagram; the payload is then at most
	 * payload_bytes <= HG_MAX_PAYLOAD too (every op's in_lane <=
	 * acc_lane). */
	udp_len = 8 + HG_HDR_LEN + lanes * oi->in_lane + (uint32_t)j->mac_len;
	if (hg_rd16(f + HG_OFF_UDP + 4) != udp_len ||
	    hg_rd16(f + HG_OFF_IP + 2) != udp_len + 20 ||
	    lanes * oi->acc_lane > j->cfg.payload_bytes ||
	    (uint8_t)h[22] > (uint8_t)oi->exp_max) /* exp in 0..exp_max */
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
 * RESULT or STATUS flag; HG_FLAG_AUTH and the current key epoch exactly
 * when the job has auth) for the job of the previous frame.  An auth
 * frame's MAC is then checked with the burst's others (verify_burst), as
 * from the full path.  Eight masked compares of frame words against the job's
 * template (fast_want: its fixed fields and its latest shape), then what
 * differs per frame (worker, slot and seq, incarnation, IP checksum, frame
 * length), in one branch.  false for anything else and for any frame that
 * fails a check: the full path then finds the counter it is dropped under.
 * A frame taken here is one the full path takes, with the same stage
 * (tests/test_engine.py compares both on hostile and mutated frames).
 * Parse and classify went from ~280 to ~150 instructions per frame, the
 * engine outside the kernel from 619 to 434 with the other changes of the
 * same commits (callgrind, the `homagg bench engine` loop, W = 8, 1 KB;
 * the next-frame prefetches included, see PREFETCH_FN).  Auth jobs took
 * the full parser until 2026-12-02: this path saves them about 200
 * instructions per frame (callgrind, an engine of W = 8 on the in-memory
 * port, 1 KB payloads, the pclmul MAC path: 5089 vs 5287 per frame in
 * hg_engine_poll, MAC included).
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
		bad |= (ld64(f + FAST_OFF[i]) ^ j->fast_want[i]) & j->fast_mask[i];
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
	st->flags = hg_rd16(h + 2); /* the high byte: 0 or the epoch */
	st->lanes = hg_rd16(h + 20);
	st->op = h[1];
	st->exp = (int8_t)h[22];
	st->ln = j->shape;
	st->up = false;
	if (j->mac_len) { /* the current epoch's key (fast_want) */
		st->mac_key = &j->keys[w];
		st->mac_bytes = (uint16_t)(HG_HDR_LEN + j->shape.in_bytes);
		st->mac_rc = 0;
	}
	__builtin_prefetch(st->set, 1);
	return true;
}

/*
 * The key that checks worker w's frame of auth job j (NULL: none does, a
 * bad MAC).  Its key epoch picks the keys: the job's current one, or the
 * previous one within its grace period; the first frame of that epoch
 * after it puts the job on e->expired, whose old keys hg_engine_process
 * wipes once the burst's MACs are checked (a frame before it in the burst
 * may still hold one).
 */
const struct hg_mac_key *hg_eng_worker_key(struct hg_engine *e, struct hg_job *j,
					   uint32_t w, uint16_t flags)
{
	uint8_t epoch = (uint8_t)(flags >> HG_FLAG_EPOCH_SHIFT);

	if (!(flags & HG_FLAG_AUTH))
		return NULL;
	if (epoch == j->epoch)
		return &j->keys[w];
	if (!j->old_keys || j->old_expired || epoch != (uint8_t)(j->epoch - 1))
		return NULL;
	if (hg_port_now(e->port) >= j->old_until_ns) {
		j->old_expired = true;
		e->expired[e->nexpired++] = j;
		return NULL;
	}
	return &j->old_keys[w];
}

/*
 * The MACs of the burst's auth frames (stages [0, n) with a mac_key),
 * checked together (hg_mac_key_check_burst), then taken in order as
 * classify() would have one by one: a frame's counter is extended from
 * its sender's state as the frames before it left it (checked again, alone,
 * in the rare case that differs from the batch's), a bad MAC is counted
 * before any check after it, a good one updates that state.  The stages
 * that remain are moved down in order; returns their count.
 */
static uint32_t verify_burst(struct hg_engine *e, uint32_t n)
{
	uint32_t nr = 0, out = 0;

	for (uint32_t k = 0; k < n; k++) {
		const struct hg_stage *st = &e->stage[k];
		struct hg_mac_req *r;

		if (!st->mac_key)
			continue;
		r = &e->mreq[nr++];
		r->k = st->mac_key;
		r->data = st->in - HG_HDR_LEN;
		r->len = st->mac_bytes;
		r->mac = r->data + st->mac_bytes;
		r->counter = hg_mac_track_counter(&st->job->peers[st->worker].mac,
						  r->data);
	}
	hg_mac_key_check_burst(HG_AUTH_DIR_REQUEST, e->mreq, nr);
	nr = 0;
	for (uint32_t k = 0; k < n; k++) {
		struct hg_stage *st = &e->stage[k];

		if (st->mac_key) {
			const struct hg_mac_req *r = &e->mreq[nr++];
			struct hg_mac_track *t = &st->job->peers[st->worker].mac;
			uint64_t ctr = hg_mac_track_counter(t, r->data);
			bool ok = ctr == r->counter ?
					  r->ok :
					  hg_mac_key_check(r->k,
							   HG_AUTH_DIR_REQUEST,
							   ctr, r->data, r->len,
							   r->mac);

			st->mac_key = NULL;
			if (!ok || st->mac_rc) {
				if (ok)
					hg_mac_track_update(t, r->data, ctr);
				count(e, st->job, ok ? st->mac_rc : HG_CNT_BAD_MAC);
				queue_free(e, st->pkt);
				continue;
			}
			hg_mac_track_update(t, r->data, ctr);
		}
		if (out != k)
			e->stage[out] = *st;
		out++;
	}
	return out;
}

/*
 * First pass over one frame: everything no frame of the burst can change
 * (the frame itself, the job table, the job's W, S and payload size).  A
 * frame that fails is counted and freed here (job = NULL); a valid one gets
 * its set and accumulator located and the set prefetched.  A check of
 * state that frames change (a set's seq, op, lanes, exp, bitmap) belongs to
 * the second pass, together with every check ordered after it.
 */
static void classify(struct hg_engine *e, struct hg_pkt *pkt, struct hg_stage *st)
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
	if (flags & (HG_FLAG_RESULT | HG_FLAG_STATUS | HG_FLAG_LOSS)) {
		/* Only a tree leaf takes replies: its root's. */
		if (hg_eng_up_classify(e, pkt, &v, flags, st))
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
	/*
	 * Before anything that changes state (incarnation, slot, address):
	 * an auth frame's MAC is checked with the burst's others
	 * (verify_burst), and a check below that fails is counted only if
	 * the MAC verifies (mac_rc), as if checked one by one.
	 */
	st->mac_rc = 0;
	if (j->mac_len) {
		st->mac_key = hg_eng_worker_key(e, j, w, flags);
		if (!st->mac_key) {
			rc = HG_CNT_BAD_MAC;
			goto drop;
		}
		st->pkt = pkt;
		st->job = j;
		st->worker = (uint16_t)w;
		st->in = pkt->data + v.payload_off;
		st->mac_bytes = (uint16_t)(HG_HDR_LEN + v.payload_len);
	} else if (flags & HG_FLAG_AUTH) {
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
	if (st->job) { /* its MAC first (verify_burst) */
		st->mac_rc = (uint16_t)rc;
		return;
	}
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
	if (in_bytes <= PIECE_BYTES) { /* one piece */
		if (nx_bytes)
			prefetch_range(nx->in, 0,
				       nx_bytes < in_bytes ? nx_bytes : in_bytes);
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

/*
 * Worker w's first transmission of chunk seq came: a worker sends its chunks
 * of an aggregator in sequence order, so the set of seq - LOSS_LAG still
 * open without w lost w's frame (or w holds it back for the lost result of
 * the slot's previous chunk).  Tell the group at once, with a STATUS marked
 * HG_FLAG_LOSS (docs/PROTOCOL.md Part 3, "Loss reports"): w resends, the
 * workers present learn that the slot waits for a repair.  Beyond
 * HG_REPORT_GROUP_MAX workers only the chunk's first STATUS reaches the
 * group; a later report goes to w alone.  A tree leaf
 * tells its root too (a leaf report), whose STATUS then reaches the other
 * leaves' workers (docs/PROTOCOL.md "Repairs in a tree").
 */
static void loss_report(struct hg_engine *e, struct hg_job *j, uint32_t w,
			uint32_t seq, struct hg_pkt **pkt)
{
	uint32_t q = seq - LOSS_LAG, quot;
	struct hg_set *s;
	bool group;

	if (seq < LOSS_LAG)
		return;
	quot = slot_quot(j, q);
	s = &j->sets[2 * (size_t)(q - quot * j->cfg.slots) + (quot & 1)];
	if (s->state != SET_OPEN || s->seq != q || s->bitmap[w / 64] >> (w % 64) & 1)
		return;
	group = hg_eng_to_group(e, j) && (s->status_count == NO_STATUS ||
					  j->cfg.workers <= HG_REPORT_GROUP_MAX);
	if (hg_eng_send_loss_report(e, j, s, (uint16_t)w, group, pkt) && group)
		s->status_count = s->count;
	if (j->up && j->cfg.up_leaves)
		hg_eng_up_report(e, j, s);
}

/*
 * Root: leaf w's partial sum of set s came, so none of the workers its
 * reports cover is missing from that chunk any more (docs/PROTOCOL.md "Who
 * is missing in a tree").
 */
static void clear_below(struct hg_job *j, const struct hg_set *s, uint32_t w)
{
	struct hg_view *vw = &j->view[s - j->sets];

	if (vw->below_set && vw->below_seq == s->seq)
		bits_clear(vw->below, j->peers[w].below_base, j->peers[w].below_n);
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
		hg_eng_up_apply(e, st);
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
			j->peers[w].last = 0;
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
		s->opened = j->accepted;
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

	/* Valid: learn where this worker is (frame checked by classify()),
	 * and that it is sending (the active bitmap of hg_eng_send_status()). */
	j->peers[w].last = ++j->accepted;
	memcpy(j->peers[w].addr.mac, pkt->data + 6, 6);
	j->peers[w].addr.ipv4 = hg_ld_be32(pkt->data + HG_OFF_IP + 12);
	j->peers[w].addr.port = hg_rd16(pkt->data + st->udp_off);

	if (s->bitmap[w / 64] & (1ull << (w % 64))) {
		count(e, j, HG_CNT_DUPLICATES);
		j->peers[w].cnt[HG_WCNT_DUPLICATES]++;
		if (s->state == SET_DONE) {
			hg_eng_send_result(e, j, s, acc, (uint16_t)w, &pkt);
			count(e, j, HG_CNT_REPLAYS);
		} else if (s->state == SET_UP) {
			if (st->flags & HG_FLAG_RETRANS)
				hg_eng_up_worker_retrans(e, j, s, acc,
							 (uint16_t)w, &pkt);
		} else if (st->flags & HG_FLAG_RETRANS) {
			hg_eng_answer_retrans(e, j, s, (uint16_t)w, &pkt);
		}
		if (pkt)
			queue_free(e, pkt);
		return;
	}

	combine(e, s, st, nx);
	if (!(st->flags & HG_FLAG_RETRANS))
		loss_report(e, j, w, st->seq, &pkt);
	s->bitmap[w / 64] |= 1ull << (w % 64);
	s->count++;
	if (j->peers[w].below_n) /* a root: leaf w's sum has all its workers */
		clear_below(j, s, w);
	count(e, j, HG_CNT_SUMMED);
	j->peers[w].cnt[HG_WCNT_SUMMED]++;
	if (s->count == j->cfg.workers) {
		count(e, j, HG_CNT_COMPLETED);
		if (j->up) {
			hg_eng_up_forward(e, j, s, acc, &pkt);
		} else {
			s->state = SET_DONE;
			if (e->wire_flags & HG_WIRE_F_UDP_CSUM)
				s->psum = hg_csum_add(0, acc,
						      (size_t)s->lanes *
							      st->ln.acc_lane);
			hg_eng_send_result(e, j, s, acc, HG_WORKER_ALL, &pkt);
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
		bool auth = false;

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
			st->mac_key = NULL;
			if (e->one_at_a_time || !classify_fast(e, pkts[i + k], st))
				classify(e, pkts[i + k], st);
			if (st->job) {
				valid++;
				auth |= st->mac_key != NULL;
			}
		}
		if (auth)
			valid = verify_burst(e, valid);
		while (e->nexpired) { /* no stage holds their keys now */
			struct hg_job *j = e->expired[--e->nexpired];

			hg_eng_keys_free(j->old_keys, j->cfg.workers + 1);
			j->old_keys = NULL;
			j->old_expired = false;
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
		hg_eng_flush_tx(e);
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
