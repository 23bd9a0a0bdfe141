/* SPDX-License-Identifier: Apache-2.0 */
/*
 * homagg/counters.h - the engine's counters, one X-macro table.
 *
 * HG_FOREACH_COUNTER(X) expands X(NAME, "name", "what it counts") once per
 * counter; it generates enum hg_counter (HG_CNT_NAME) and the name table
 * behind hg_counter_name().  Every drop reason of the wire parser and the
 * engine is a counter: hg_wire_parse() returns the counter index of the
 * reason (HG_CNT_RECEIVED, index 0, is never a drop reason, so 0 means
 * "valid").  Python reads the names through hg_counter_count() and
 * hg_counter_name() (homagg/wire.h) and gets a dict.
 */
#ifndef HOMAGG_COUNTERS_H
#define HOMAGG_COUNTERS_H

/* clang-format off */
#define HG_FOREACH_COUNTER(X)                                                  \
	X(RECEIVED, "received", "frames handed to the engine")                   \
	X(SUMMED, "summed", "payloads combined into a slot")                     \
	X(COMPLETED, "completed", "slots that reached W contributions")           \
	X(DUPLICATES, "duplicates", "packets of a worker already counted")        \
	X(REPLAYS, "replays", "results sent again to one worker (duplicate after completion)") \
	X(RESULTS_SENT, "results_sent", "result frames queued for transmission")  \
	X(STATUS_SENT, "status_sent", "status frames (worker bitmap) queued")     \
	X(STATUS_REPEATS, "status_repeats", "status frames unicast to the asking and the missing workers: the group already had that bitmap") \
	X(STALE, "stale", "packets older than their shadow set's chunk")          \
	X(NOT_IP, "not_ip", "not IPv4 over Ethernet, IP options bad, or a fragment") \
	X(NOT_UDP, "not_udp", "IPv4 but not UDP")                                  \
	X(WRONG_PORT, "wrong_port", "UDP to another port")                         \
	X(TRUNCATED, "truncated", "a header or length runs past the frame")       \
	X(BAD_CSUM, "bad_csum", "IPv4 header or UDP checksum wrong")              \
	X(BAD_VERSION, "bad_version", "HomAgg version not HG_PROTOCOL_VERSION")   \
	X(UNKNOWN_JOB, "unknown_job", "job id not configured")                    \
	X(BAD_TOKEN, "bad_token", "token differs from the job's")                 \
	X(BAD_WORKER, "bad_worker", "worker id >= W")                             \
	X(BAD_SLOT, "bad_slot", "slot >= S, slot != seq % S, or shadow flag wrong") \
	X(BAD_LANES, "bad_lanes", "lane count disagrees with the length, the job's payload or the slot") \
	X(BAD_OP, "bad_op", "unknown op, or op differs from the slot's")          \
	X(BAD_FLAGS, "bad_flags", "unknown flag bits, reserved bytes set, incarnation 0, or RESULT/STATUS from a worker") \
	X(BAD_EXP, "bad_exp", "exp not 0 (non-NC8), outside 0..31 (NC8), or differs from the slot's") \
	X(NO_BUFFER, "no_buffer", "no packet buffer for a result or status frame") \
	X(TX_FULL, "tx_full", "frames the port refused to transmit (freed)")     \
	X(BAD_MAC, "bad_mac", "MAC missing or wrong (auth job), or a MAC on a job without auth") \
	X(BAD_SHARD, "bad_shard", "shard differs from the aggregator's index for the job") \
	X(OLD_INCARNATION, "old_incarnation", "frames of a worker's earlier incarnation") \
	X(INCARNATION_RESETS, "incarnation_resets", "sets emptied: a worker came back with a new incarnation") \
	X(UP_SENT, "up_sent", "tree leaf: partial sums sent up to the root (first transmissions)") \
	X(UP_RETRANSMISSIONS, "up_retransmissions", "tree leaf: partial sums sent up again") \
	X(UP_RESENT_TIMER, "up_resent_timer", "tree leaf: partial sums sent up again at their timer's expiry") \
	X(UP_RESENT_OVERTAKEN, "up_resent_overtaken", "tree leaf: partial sums sent up again after root results of later sets overtook them") \
	X(UP_RESENT_LACKING, "up_resent_lacking", "tree leaf: partial sums sent up again for a root STATUS lacking the leaf that told of a lost copy (at once or after the hold-off)") \
	X(UP_RESENT_WORKER, "up_resent_worker", "tree leaf: partial sums sent up again for a worker's retransmission") \
	X(UP_RESULTS, "up_results", "tree leaf: root results accepted and sent to the workers") \
	X(UP_STATUS, "up_status", "tree leaf: STATUS frames from the root") \
	X(UP_STALE, "up_stale", "tree leaf: root replies for no forwarded set or not matching it") \
	X(UP_ABANDONED, "up_abandoned", "tree leaf: forwarded sets no longer resent (give-up time passed)") \
	X(UP_ROOT_RESTARTS, "up_root_restarts", "tree leaf: the root's incarnation changed (the leaf took a new one)") \
	X(UP_REPORTS, "up_reports", "tree leaf: reports of its missing workers sent to the root") \
	X(LEAF_REPORTS, "leaf_reports", "tree root: leaf reports of missing workers taken")
/* clang-format on */

enum hg_counter {
#define HG_CNT_ENUM_(name, str, doc) HG_CNT_##name,
	HG_FOREACH_COUNTER(HG_CNT_ENUM_)
#undef HG_CNT_ENUM_
		HG_CNT__COUNT
};

/*
 * HG_FOREACH_WORKER_COUNTER(X): what the engine counts per job and worker
 * (hg_engine_worker_counters()), for frames that reached the set logic
 * (their job, token, worker id and slot are valid).  Names through
 * hg_worker_counter_name() (homagg/wire.h).
 */
/* clang-format off */
#define HG_FOREACH_WORKER_COUNTER(X)                                           \
	X(SUMMED, "summed", "payloads of the worker combined into a slot")        \
	X(DUPLICATES, "duplicates", "frames of a chunk the worker already counted") \
	X(RETRANS, "retransmissions", "frames flagged RETRANS (the worker resent)") \
	X(DROPPED, "dropped", "frames dropped by the set logic (stale, old_incarnation, bad_op, bad_lanes, bad_exp)")
/* clang-format on */

enum hg_worker_counter {
#define HG_WCNT_ENUM_(name, str, doc) HG_WCNT_##name,
	HG_FOREACH_WORKER_COUNTER(HG_WCNT_ENUM_)
#undef HG_WCNT_ENUM_
		HG_WCNT__COUNT
};

#endif /* HOMAGG_COUNTERS_H */
