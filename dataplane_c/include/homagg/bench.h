/* SPDX-License-Identifier: Apache-2.0 */
/*
 * homagg/bench.h - the engine benchmark, in C so Python's overhead is not
 * measured.  It feeds pre-built SUM32 frames of W workers through
 * hg_engine_process() on the calling thread, and in the same run times the
 * raw SUM32 kernel over the same payload bytes in the same order: the ratio
 * says how much of the kernel's speed the engine keeps.
 */
#ifndef HOMAGG_BENCH_H
#define HOMAGG_BENCH_H

#include <stdbool.h>
#include <stdint.h>

#include "homagg/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cdef-begin */
struct hg_bench_engine_config {
	uint32_t workers; /* W, 1..HG_MAX_WORKERS */
	uint32_t payload_bytes; /* SUM32 payload per frame, multiple of 4, 4..HG_MAX_PAYLOAD */
	uint32_t slots; /* S: chunks in flight (the frames pre-built: S * W) */
	uint32_t burst; /* frames per hg_engine_process() call, 1..HG_ENGINE_MAX_BURST */
	double seconds; /* time budget of each of the two measurements */
	bool multicast; /* results to a group on a replicating port, else unicast */
	bool udp_csum; /* frames carry UDP checksums (computed in the timed loop, as a
				    sender without offload would), the engine checks and fills them */
	enum hg_isa isa;
	bool one_at_a_time; /* also time the engine handling each frame completely before
				    the next (hg_engine_set_staging(e, false)), in a third
				    alternating phase: the staged burst's baseline */
};

struct hg_bench_engine_result {
	uint64_t packets; /* frames through the engine */
	double seconds;
	double mpps;          /* best of the alternating phases */
	double mpps_mean;     /* packets / seconds */
	uint64_t raw_packets; /* payloads through the raw kernel */
	double raw_seconds;
	double raw_kernel_mpps; /* best phase */
	double raw_kernel_mpps_mean;
	uint64_t one_packets; /* one_at_a_time: frames through the unstaged engine */
	double one_seconds;
	double one_mpps; /* best phase (0 without one_at_a_time) */
	double one_mpps_mean;
	uint64_t completed; /* engine counter: chunks completed */
	uint64_t results_sent;
	uint64_t dropped; /* frames counted under any drop reason (expect 0) */
};

/* Defaults: W 8, 1024 bytes, 16 slots, burst 32, 1 s, multicast, no UDP
 * checksums (offloaded to the NIC), HG_ISA_BEST. */
void hg_bench_engine_config_init(struct hg_bench_engine_config *c);
/* 0, -EINVAL, -ERANGE, -ENOMEM. */
int hg_bench_engine(const struct hg_bench_engine_config *c,
		    struct hg_bench_engine_result *r);
/* cdef-end */

#ifdef __cplusplus
}
#endif

#endif /* HOMAGG_BENCH_H */
