/* SPDX-License-Identifier: Apache-2.0 */
/* switch_telemetry.c - homagg-switch's /homagg/stats telemetry command. */
#include <errno.h>

#include <rte_telemetry.h>

#include "log.h"
#include "switch_pvt.h"

/*
 * File-scope state, only where an API leaves no context argument:
 * rte_telemetry_register_cmd() callbacks (22.11 passes none).  It is only
 * read here; the data path never uses it.
 */
static struct daemon *g_tel_daemon;

static int tel_stats(const char *cmd, const char *params, struct rte_tel_data *t)
{
	struct daemon *d = g_tel_daemon;
	uint64_t c[HG_CNT__COUNT] = { 0 };
	unsigned int i, k;

	if (!d)
		return -EAGAIN;
	/* snapshots only: this runs on the telemetry thread */
	for (k = 0; k < d->nshards; k++)
		for (i = 0; i < HG_CNT__COUNT; i++)
			c[i] += __atomic_load_n(&d->shards[k].snap[i],
						__ATOMIC_RELAXED);
	rte_tel_data_start_dict(t);
	for (i = 0; i < HG_CNT__COUNT; i++)
		rte_tel_data_add_dict_u64(t, hg_counter_name((int)i), c[i]);
	return 0;
}

void hg_switch_telemetry_start(struct daemon *d)
{
	int rc;

	g_tel_daemon = d;
	rc = rte_telemetry_register_cmd("/homagg/stats", tel_stats,
					"HomAgg engine counters. No parameters");
	if (rc < 0)
		HG_LOG(ERR, "telemetry: /homagg/stats not registered (%d)", rc);
}

void hg_switch_telemetry_stop(void)
{
	g_tel_daemon = NULL;
}
