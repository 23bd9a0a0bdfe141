/* SPDX-License-Identifier: Apache-2.0 */
/*
 * switch_main.c - homagg-switch, the DPDK aggregator daemon: EAL, port
 * setup, the main loop, signals and teardown (switch_pvt.h lists the other
 * files and how the shards and the dispatcher share the work).
 *
 *   homagg-switch [EAL args] -- [--port-ip A.B.C.D] [--control PATH] ...
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <net/if.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <rte_common.h>
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_malloc.h>
#include <rte_mbuf.h>

#include "homagg/auth.h"
#include "homagg/codec.h"
#include "homagg/errors.h"
#include "homagg/wire.h"
#include "log.h"
#include "switch_pvt.h"

#define TX_DESC 1024

/*
 * File-scope state, only where an API leaves no context argument: the
 * signal handler only sets it; the data path never uses it.
 */
static volatile sig_atomic_t g_signalled;

static void on_signal(int sig)
{
	g_signalled = sig;
}

/* ---- setup and loop ------------------------------------------------- */

/* The MTU of the kernel interface behind a PMD that has one (af_packet,
 * af_xdp and tap report its if_index); 0 when there is none. */
static uint16_t kernel_mtu(uint32_t if_index)
{
	char name[IF_NAMESIZE];
	struct ifreq ifr;
	int fd, rc;

	if (!if_index || !if_indextoname(if_index, name))
		return 0;
	fd = socket(AF_INET, SOCK_DGRAM, 0);
	if (fd < 0)
		return 0;
	memset(&ifr, 0, sizeof(ifr));
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
	rc = ioctl(fd, SIOCGIFMTU, &ifr);
	close(fd);
	if (rc != 0 || ifr.ifr_mtu <= 0)
		return 0;
	return (uint16_t)RTE_MIN(ifr.ifr_mtu, 65535);
}

/*
 * The largest job payload whose frames fit the link: an IPv4 packet of the
 * MTU holds IPv4, UDP and HomAgg headers, the payload and the optional
 * 16-byte MAC (docs/PROTOCOL.md Part 2); a multiple of 4, at most
 * HG_MAX_PAYLOAD.  1424 bytes at MTU 1500, 8192 at 9000.
 */
static uint32_t payload_limit(uint16_t mtu)
{
	uint32_t room = (uint32_t)mtu - 20 - 8 - HG_HDR_LEN - HG_MAC_LEN;

	return RTE_MIN((uint32_t)HG_MAX_PAYLOAD, room) & ~3u;
}

static int port_setup(struct daemon *d)
{
	struct rte_eth_conf conf;
	struct rte_eth_dev_info info;
	uint16_t nrx = (uint16_t)d->o.rx_ring, ntx = TX_DESC,
		 pid = d->o.port_id, kmtu, overhead;
	unsigned int mbufs;
	int socket, rc;

	if (!rte_eth_dev_is_valid_port(pid)) {
		HG_LOG(ERR,
		       "ethdev port %u does not exist (%u available): "
		       "pass a --vdev or a device in the EAL arguments",
		       pid, rte_eth_dev_count_avail());
		return -ENODEV;
	}
	socket = rte_eth_dev_socket_id(pid);
	if (socket < 0)
		socket = (int)rte_socket_id();
	memset(&conf, 0, sizeof(conf));
	memset(&info, 0, sizeof(info));
	if (rte_eth_dev_info_get(pid, &info) != 0)
		memset(&info, 0, sizeof(info));
	/* the link's MTU: --mtu, else the kernel interface's, else the PMD's */
	kmtu = kernel_mtu(info.if_index);
	if (d->o.mtu)
		d->mtu = (uint16_t)d->o.mtu;
	else if (kmtu)
		d->mtu = kmtu;
	else if (rte_eth_dev_get_mtu(pid, &d->mtu) != 0)
		d->mtu = RTE_ETHER_MTU;
	d->mtu = RTE_MAX(RTE_MIN(d->mtu, (uint16_t)9000), (uint16_t)576);
	if (kmtu && kmtu < d->mtu)
		HG_LOG(WARNING,
		       "--mtu %u: the port's interface has MTU %u: longer "
		       "frames will not arrive",
		       d->mtu, kmtu);
	/*
	 * One whole frame of the MTU per mbuf, so a PMD need not scatter it:
	 * the MTU plus room for the Ethernet header, CRC, a VLAN tag and the
	 * 66 bytes af_packet keeps before a frame (its framesz must not exceed
	 * data room + 32), rounded up to 1 KiB: 2048 at MTU 1500, 9216 at 9000.
	 * Frames a PMD scatters anyway are linearised by the backend.
	 */
	d->data_room = (uint16_t)RTE_MAX((unsigned int)RTE_MBUF_DEFAULT_DATAROOM,
					 RTE_ALIGN_CEIL((unsigned int)d->mtu + 128,
							1024u));
	/* the pool fills both rings and still has mbufs for the frames in
	 * the engine and in a burst: it grows with --rx-ring */
	mbufs = RTE_MAX(d->o.mbufs, d->o.rx_ring + TX_DESC + 1024u);
	d->pool = hg_dpdk_pool_create("hg_pool", mbufs, d->data_room, socket);
	if (!d->pool) {
		HG_LOG(ERR, "mbuf pool (%u mbufs of %u bytes): %s", mbufs,
		       d->data_room, rte_strerror(rte_errno));
		return -ENOMEM;
	}
	/* a PMD that manages the MTU (a NIC sizing its rx buffers) is given
	 * it; one that accepts shorter frames only (af_packet reports 1518:
	 * the kernel interface decides) keeps its own */
	overhead = (info.max_mtu != UINT16_MAX &&
		    info.max_rx_pktlen > info.max_mtu) ?
			   (uint16_t)(info.max_rx_pktlen - info.max_mtu) :
			   RTE_ETHER_HDR_LEN + RTE_ETHER_CRC_LEN;
	if (d->mtu <= info.max_mtu && d->mtu + overhead <= info.max_rx_pktlen)
		conf.rxmode.mtu = d->mtu;
	if (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS)
		conf.txmode.offloads |= RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
	rc = rte_eth_dev_configure(pid, 1, 1, &conf);
	if (rc == 0)
		rc = rte_eth_dev_adjust_nb_rx_tx_desc(pid, &nrx, &ntx);
	if (rc == 0)
		rc = rte_eth_rx_queue_setup(pid, 0, nrx, socket, NULL, d->pool);
	if (rc == 0)
		rc = rte_eth_tx_queue_setup(pid, 0, ntx, socket, NULL);
	if (rc == 0)
		rc = rte_eth_dev_start(pid);
	if (rc < 0) {
		HG_LOG(ERR, "port %u setup: %s", pid, rte_strerror(-rc));
		return rc;
	}
	d->port_started = true;
	hg_switch_rx_ring_probe(d, &info, nrx);
	/* multicast and frames for other MACs of the segment (best effort:
	 * some virtual PMDs have no such switch and receive everything) */
	rte_eth_promiscuous_enable(pid);
	rte_eth_allmulticast_enable(pid);
	return 0;
}

/* One log line of the port counters and the non-zero engine counters. */
static void log_counters(struct daemon *d)
{
	uint64_t c[HG_CNT__COUNT];
	struct hg_dpdk_port_stats ps;
	char line[4096];
	size_t n;
	unsigned int i;

	hg_switch_counters_sum(d, c);
	hg_dpdk_port_get_stats(d->dport, &ps);
	n = (size_t)snprintf(line, sizeof(line),
			     "port rx=%" PRIu64 " tx=%" PRIu64
			     " drop_injected=%" PRIu64 " arp=%" PRIu64,
			     ps.rx, ps.tx, ps.drop_injected, ps.arp_replies);
	for (i = 0; i < HG_CNT__COUNT && n < sizeof(line); i++)
		if (c[i])
			n += (size_t)snprintf(line + n, sizeof(line) - n,
					      " %s=%" PRIu64,
					      hg_counter_name((int)i), c[i]);
	HG_LOG(NOTICE, "stats: %s", line);
}

static int run(struct daemon *d)
{
	const uint64_t hz = rte_get_tsc_hz();
	const uint64_t ctl_period = hz / 1000;
	uint64_t stats_period = (uint64_t)(d->o.stats_interval * (double)hz);
	uint64_t now = rte_get_tsc_cycles();
	uint64_t next_ctl = now, next_stats = now + stats_period;
	struct shard *one = d->nshards == 1 ? &d->shards[0] : NULL;
	struct idle idle = { 0 };

	if (one)
		one->start_tsc = now;
	while (!g_signalled && !d->stop_requested) {
		if (one)
			idle_sleep(d, &idle, hg_switch_shard_poll(one) > 0);
		else
			idle_sleep(d, &idle, hg_switch_dispatch(d));
		now = rte_get_tsc_cycles();
		if (now < next_ctl)
			continue;
		next_ctl = now + ctl_period;
		if (hg_control_poll(d->ctl) < 0)
			HG_LOG(ERR, "control socket: %s", strerror(errno));
		if (one)
			hg_switch_shard_publish(one); /* for the telemetry thread */
		if (stats_period && now >= next_stats) {
			next_stats = now + stats_period;
			log_counters(d);
		}
	}
	return 0;
}

static void teardown(struct daemon *d)
{
	unsigned int k;

	hg_switch_telemetry_stop();
	hg_control_destroy(d->ctl);
	if (d->shards) {
		hg_switch_stop_engines(d);
		for (k = 0; k < d->nshards; k++) {
			struct shard *sh = &d->shards[k];

			hg_engine_destroy(sh->eng);
			hg_dpdk_port_destroy(sh->dport);
			rte_ring_free(sh->rx_ring);
			rte_ring_free(sh->tx_ring);
		}
		rte_free(d->shards);
	}
	hg_dpdk_port_destroy(d->dport);
	if (d->port_started) {
		rte_eth_dev_stop(d->o.port_id);
		rte_eth_dev_close(d->o.port_id);
	}
	rte_mempool_free(d->pool);
}

int main(int argc, char **argv)
{
	static struct daemon dm; /* one per process */
	struct daemon *d = &dm;
	struct hg_ctl_limits lim;
	struct sigaction sa;
	int eal_args, status = 1;
	char ip[INET_ADDRSTRLEN];
	struct in_addr a;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	if (hg_switch_log_json_wanted(argc, argv) && hg_switch_log_json() < 0)
		fprintf(stderr, "homagg-switch: --log-format json: %s\n",
			strerror(errno));
	eal_args = rte_eal_init(argc, argv);
	if (eal_args < 0) {
		HG_LOG(ERR, "EAL init failed: %s", rte_strerror(rte_errno));
		return 1;
	}
	argc -= eal_args;
	argv += eal_args;
	argv[0] = "homagg-switch";
	if (hg_switch_parse_opts(argc, argv, &d->o) < 0)
		goto out_eal;
	if (hg_mac_isa() < 0) {
		HG_LOG(ERR, "HOMAGG_MAC_ISA=%s: %s", getenv("HOMAGG_MAC_ISA"),
		       hg_mac_isa() == -EINVAL ?
			       "names no MAC path: set it to portable, pclmul, avx2 "
			       "or avx512, or unset it" :
			       "this CPU lacks that path: force a lower one or unset it");
		goto out_eal;
	}

	if (port_setup(d) < 0)
		goto out;
	d->dport = hg_dpdk_port_create(
		&(struct hg_dpdk_port_conf){ .port_id = d->o.port_id,
					     .rx_queue = 0,
					     .tx_queue = 0,
					     .pool = d->pool,
					     .ipv4 = d->o.ipv4,
					     .udp_port = d->o.udp_port,
					     .can_replicate = d->o.replicate,
					     .drop_rate = d->o.drop_rate,
					     .seed = d->o.seed,
					     .mtu = d->mtu });
	if (!d->dport) {
		HG_LOG(ERR, "port backend: %s", strerror(errno));
		goto out;
	}
	d->port = hg_dpdk_port_ops(d->dport);
	if (hg_switch_shards_setup(d) < 0)
		goto out;
	lim.max_workers = HG_MAX_WORKERS;
	lim.max_slots = HG_ENGINE_MAX_SLOTS;
	/* a packet is one IP datagram of at most the MTU */
	lim.max_payload = payload_limit(d->mtu);
	lim.mtu = d->mtu;
	/* a job's frames in flight wait in the port's ring (and with a
	 * dispatcher in a shard's ring of 4095) while the engine is busy */
	lim.rx_ring = d->nshards > 1 ? RTE_MIN(d->rx_ring, 4095u) : d->rx_ring;
	d->rx_ring_limit = lim.rx_ring;
	lim.rx_ring_source = d->nshards > 1 && d->rx_ring > 4095u ?
				     "engine lcore rings" :
				     d->rx_ring_source;
	d->ctl = hg_control_create(d->o.control, &hg_switch_ctl_ops, d, &lim);
	if (!d->ctl) {
		HG_LOG(ERR, "control socket %s: %s", d->o.control, strerror(errno));
		goto out;
	}
	hg_switch_telemetry_start(d);

	a.s_addr = htonl(d->o.ipv4);
	inet_ntop(AF_INET, &a, ip, sizeof(ip));
	{
		struct hg_port_info pi;

		d->port.ops->get_info(d->port.ctx, &pi);
		HG_LOG(NOTICE,
		       "ready port=%u mac=%02x:%02x:%02x:%02x:%02x:%02x "
		       "ip=%s udp=%u control=%s drop_rate=%g engines=%u mtu=%u "
		       "max_payload=%u mbuf_data_room=%u rx_ring=%u mac_isa=%s",
		       d->o.port_id, pi.mac[0], pi.mac[1], pi.mac[2], pi.mac[3],
		       pi.mac[4], pi.mac[5], ip, d->o.udp_port, d->o.control,
		       d->o.drop_rate, d->nshards, d->mtu, lim.max_payload,
		       d->data_room, lim.rx_ring, hg_mac_isa_name(hg_mac_isa()));
	}
	run(d);
	hg_switch_stop_engines(d);
	if (d->o.stats_interval > 0)
		log_counters(d);
	HG_LOG(NOTICE, "stopping (%s)",
	       g_signalled ? strsignal(g_signalled) : "shutdown command");
	status = 0;
out:
	teardown(d);
out_eal:
	rte_eal_cleanup();
	return status;
}
