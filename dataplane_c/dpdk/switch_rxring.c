/* SPDX-License-Identifier: Apache-2.0 */
/*
 * switch_rxring.c - the port's receive capacity: how many frames its
 * receive ring holds while the engine is busy (add_job refuses a job whose
 * frames in flight exceed it, docs/SWITCH.md "Receive ring"), and how many
 * frames the ring had no room for (the port's rx_missed counter).
 *
 * Two kinds of PMD:
 *  - descriptor rings (NICs, af_xdp, tap, ring): the ring is the rx queue's
 *    descriptors (--rx-ring, as the PMD adjusted it); a full ring is counted
 *    by the ethdev's imissed;
 *  - net_af_packet: the kernel's TPACKET ring of framecnt frames (its vdev
 *    argument, DPDK's default 512) whatever the descriptor count; DPDK 22.11
 *    does not read the kernel's drop count, so the daemon asks the PMD's
 *    packet sockets itself (PACKET_STATISTICS, which resets it on every
 *    read: the drops are summed here).
 */
#include <dirent.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <rte_bus.h>
#include <rte_dev.h>
#include <rte_devargs.h>
#include <rte_ethdev.h>

#include "switch_pvt.h"

#define AF_PACKET_DEFAULT_FRAMES 512 /* DPDK net_af_packet's framecnt */

/* framecnt=N in an af_packet vdev's arguments; the PMD's default without. */
static unsigned int af_packet_frames(const struct rte_eth_dev_info *info)
{
	const struct rte_devargs *da = info->device ?
					       rte_dev_devargs(info->device) :
					       NULL;
	const char *p = da && da->args ? da->args : "";
	unsigned long v;

	for (; (p = strstr(p, "framecnt=")) != NULL; p++)
		if (p == da->args || p[-1] == ',') {
			v = strtoul(p + strlen("framecnt="), NULL, 0);
			return v ? (unsigned int)RTE_MIN(v, 1ul << 24) :
				   AF_PACKET_DEFAULT_FRAMES;
		}
	return AF_PACKET_DEFAULT_FRAMES;
}

/* The process's AF_PACKET sockets bound to if_index: the PMD's rings. */
static void find_packet_sockets(struct daemon *d, uint32_t if_index)
{
	struct sockaddr_ll sll;
	struct dirent *e;
	DIR *dir = opendir("/proc/self/fd");
	socklen_t len;
	long fd;

	if (!dir)
		return;
	while ((e = readdir(dir)) != NULL && d->npkt_fds < RTE_DIM(d->pkt_fds)) {
		fd = strtol(e->d_name, NULL, 10);
		if (e->d_name[0] == '.' || fd == dirfd(dir))
			continue;
		len = sizeof(sll);
		memset(&sll, 0, sizeof(sll));
		if (getsockname((int)fd, (struct sockaddr *)&sll, &len) == 0 &&
		    sll.sll_family == AF_PACKET &&
		    (uint32_t)sll.sll_ifindex == if_index)
			d->pkt_fds[d->npkt_fds++] = (int)fd;
	}
	closedir(dir);
}

void hg_switch_rx_ring_probe(struct daemon *d,
			     const struct rte_eth_dev_info *info, uint16_t nrx)
{
	if (info->driver_name && strcmp(info->driver_name, "net_af_packet") == 0) {
		d->rx_ring = af_packet_frames(info);
		d->rx_ring_source = "af_packet framecnt";
		find_packet_sockets(d, info->if_index);
	} else {
		d->rx_ring = nrx;
		d->rx_ring_source = "rx descriptors";
	}
}

uint64_t hg_switch_rx_missed(struct daemon *d)
{
	struct tpacket_stats st;
	struct rte_eth_stats es;
	socklen_t len;
	unsigned int i;

	for (i = 0; i < d->npkt_fds; i++) {
		len = sizeof(st);
		if (getsockopt(d->pkt_fds[i], SOL_PACKET, PACKET_STATISTICS,
			       &st, &len) == 0)
			d->ring_drops += st.tp_drops;
	}
	if (rte_eth_stats_get(d->o.port_id, &es) != 0)
		es.imissed = 0;
	return d->ring_drops + es.imissed;
}
