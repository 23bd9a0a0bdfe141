/* SPDX-License-Identifier: Apache-2.0 */
/*
 * log.h - homagg-switch's log type, "homagg.switch", registered with
 * rte_log at NOTICE.  Its level is set like any DPDK log type with the EAL
 * argument --log-level (e.g. `--log-level homagg.switch:debug`, or
 * `--log-level homagg.switch:warning` to keep only warnings and errors).
 *
 * Logs are for events a person reads (start, stop, a failed setup step,
 * the --stats-interval lines); what the data path drops is counted, never
 * logged (engine counters, port counters).
 */
#ifndef HOMAGG_DPDK_LOG_H
#define HOMAGG_DPDK_LOG_H

#include <rte_log.h>

/* The id rte_log gave "homagg.switch" (set by a constructor in log.c:
 * rte_log's registration API leaves no context to hang it on). */
extern int hg_switch_logtype;

/* HG_LOG(ERR, "port %u: %s", ...): one line, prefixed "homagg-switch: ". */
#define HG_LOG(level, fmt, ...)                                                \
	rte_log(RTE_LOG_##level, hg_switch_logtype,                            \
		"homagg-switch: " fmt "\n", ##__VA_ARGS__)

/*
 * --log-format json: every rte_log message (homagg-switch's and DPDK's)
 * becomes one JSON object per line on stdout,
 *   {"ts":"2026-12-01T21:40:00.123456Z","level":"notice",
 *    "logger":"homagg.switch","msg":"ready port=0 ..."}
 * (logger "dpdk" for DPDK's own types).  What libraries write to stderr
 * themselves (libbpf, libxdp) goes through a pipe and becomes events of
 * logger "stderr", level "info".  Called before rte_eal_init() so EAL's
 * messages are JSON too.  0, or -1 with errno when the stream, the pipe or
 * its thread cannot be made.
 */
int hg_switch_log_json(void);

#endif /* HOMAGG_DPDK_LOG_H */
