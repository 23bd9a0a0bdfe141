/* SPDX-License-Identifier: Apache-2.0 */
/*
 * switch_main.c - homagg-switch, the DPDK aggregator daemon.
 *
 *   homagg-switch [EAL args] -- [--port-ip A.B.C.D] [--control PATH] ...
 *
 * One engine (engine.h) runs on the main lcore behind one hg_dpdk_port
 * (port_dpdk.h).  The same loop polls the control socket (control.h) every
 * millisecond, so the engine is only ever touched by one thread and needs
 * no locks.  docs/SWITCH.md documents the command line.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <rte_common.h>
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_telemetry.h>

#include "homagg/codec.h"
#include "homagg/counters.h"
#include "homagg/engine.h"
#include "homagg/errors.h"
#include "homagg/wire.h"
#include "control.h"
#include "port_dpdk.h"

#define RX_DESC 1024
#define TX_DESC 1024

struct opts {
	uint32_t ipv4;
	uint16_t udp_port;
	uint16_t port_id;
	const char *control;
	unsigned int lcores;
	unsigned int queues;
	double drop_rate;
	uint64_t seed;
	double stats_interval;    /* seconds, 0 = off */
	unsigned int idle_us;     /* sleep when idle, 0 = spin */
	unsigned int mbufs;
	unsigned int max_jobs;
	bool replicate;
	bool udp_csum;            /* verify received / fill sent UDP checksums */
};

struct daemon {
	struct opts o;
	struct rte_mempool *pool;
	struct hg_dpdk_port *dport;
	struct hg_port port;
	struct hg_engine *eng;
	struct hg_control *ctl;
	bool port_started;
	uint16_t mtu;                  /* of the port, from the PMD */
	volatile bool stop_requested;  /* by the shutdown command */
	/* counters published for the telemetry thread (relaxed atomics) */
	uint64_t snap[HG_CNT__COUNT];
	struct hg_dpdk_port_stats psnap;
};

/*
 * File-scope state, only where an API leaves no context argument: the
 * signal handler, and rte_telemetry_register_cmd() callbacks (22.11 passes
 * none).  Both only read or set flags; the data path never uses them.
 */
static volatile sig_atomic_t g_signalled;
static struct daemon *g_tel_daemon;

static void on_signal(int sig)
{
	g_signalled = sig;
}

static void usage(const char *prog)
{
	fprintf(stderr,
		"usage: %s [EAL args] -- [options]\n"
		"  --port-ip A.B.C.D     IPv4 address of the aggregator port (default 10.0.0.1)\n"
		"  --udp-port N          UDP port (default %d)\n"
		"  --port N              ethdev port id (default 0)\n"
		"  --control PATH        UNIX control socket (default /run/homagg-switch.sock)\n"
		"  --lcores N            engine lcores (default 1; only 1 is supported)\n"
		"  --queues N            rx/tx queues (default 1; only 1 is supported)\n"
		"  --drop-rate F         drop this fraction of received frames (0..1, seeded)\n"
		"  --seed N              seed of the drop generator (default 1)\n"
		"  --stats-interval S    print the counters every S seconds (0 = never)\n"
		"  --idle-us N           sleep N us when the port is idle (default 20, 0 = spin)\n"
		"  --mbufs N             mbufs in the pool (default 8191)\n"
		"  --max-jobs N          concurrent jobs (default 64)\n"
		"  --no-replicate        the link does not replicate multicast: unicast results\n"
		"  --no-udp-csum         neither verify nor fill UDP checksums (peers whose\n"
		"                        kernel leaves them to an offload, e.g. veth)\n",
		prog, HG_UDP_PORT);
}

static int parse_ulong(const char *s, unsigned long lo, unsigned long hi,
		       unsigned long *v)
{
	char *end;

	errno = 0;
	*v = strtoul(s, &end, 0);
	if (errno || end == s || *end || *v < lo || *v > hi || s[0] == '-')
		return -EINVAL;
	return 0;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
	enum { O_IP = 256, O_UDP, O_PORT, O_CTL, O_LCORES, O_QUEUES, O_DROP,
	       O_SEED, O_STATS, O_IDLE, O_MBUFS, O_JOBS, O_NOREP, O_NOCSUM, O_HELP };
	static const struct option lo[] = {
		{ "port-ip", required_argument, NULL, O_IP },
		{ "udp-port", required_argument, NULL, O_UDP },
		{ "port", required_argument, NULL, O_PORT },
		{ "control", required_argument, NULL, O_CTL },
		{ "lcores", required_argument, NULL, O_LCORES },
		{ "queues", required_argument, NULL, O_QUEUES },
		{ "drop-rate", required_argument, NULL, O_DROP },
		{ "seed", required_argument, NULL, O_SEED },
		{ "stats-interval", required_argument, NULL, O_STATS },
		{ "idle-us", required_argument, NULL, O_IDLE },
		{ "mbufs", required_argument, NULL, O_MBUFS },
		{ "max-jobs", required_argument, NULL, O_JOBS },
		{ "no-replicate", no_argument, NULL, O_NOREP },
		{ "no-udp-csum", no_argument, NULL, O_NOCSUM },
		{ "help", no_argument, NULL, O_HELP },
		{ NULL, 0, NULL, 0 },
	};
	struct in_addr a;
	unsigned long v;
	char *end;
	int c;

	*o = (struct opts){
		.ipv4 = 0x0A000001, .udp_port = HG_UDP_PORT, .port_id = 0,
		.control = "/run/homagg-switch.sock", .lcores = 1, .queues = 1,
		.drop_rate = 0.0, .seed = 1, .stats_interval = 0, .idle_us = 20,
		.mbufs = 8191, .max_jobs = 64, .replicate = true, .udp_csum = true,
	};
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case O_IP:
			if (inet_pton(AF_INET, optarg, &a) != 1) {
				fprintf(stderr, "--port-ip: not an IPv4 address: %s\n", optarg);
				return -EINVAL;
			}
			o->ipv4 = ntohl(a.s_addr);
			break;
		case O_UDP:
			if (parse_ulong(optarg, 1, 65535, &v))
				goto bad;
			o->udp_port = (uint16_t)v;
			break;
		case O_PORT:
			if (parse_ulong(optarg, 0, RTE_MAX_ETHPORTS - 1, &v))
				goto bad;
			o->port_id = (uint16_t)v;
			break;
		case O_CTL:
			o->control = optarg;
			break;
		case O_LCORES:
		case O_QUEUES:
			if (parse_ulong(optarg, 1, 1024, &v))
				goto bad;
			if (c == O_LCORES)
				o->lcores = (unsigned int)v;
			else
				o->queues = (unsigned int)v;
			break;
		case O_DROP:
			errno = 0;
			o->drop_rate = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(o->drop_rate >= 0.0) ||
			    o->drop_rate > 1.0)
				goto bad;
			break;
		case O_SEED:
			if (parse_ulong(optarg, 0, ULONG_MAX, &v))
				goto bad;
			o->seed = v;
			break;
		case O_STATS:
			errno = 0;
			o->stats_interval = strtod(optarg, &end);
			if (errno || end == optarg || *end || !(o->stats_interval >= 0.0))
				goto bad;
			break;
		case O_IDLE:
			if (parse_ulong(optarg, 0, 1000000, &v))
				goto bad;
			o->idle_us = (unsigned int)v;
			break;
		case O_MBUFS:
			if (parse_ulong(optarg, 1023, 1u << 24, &v))
				goto bad;
			o->mbufs = (unsigned int)v;
			break;
		case O_JOBS:
			if (parse_ulong(optarg, 1, HG_ENGINE_MAX_JOBS, &v))
				goto bad;
			o->max_jobs = (unsigned int)v;
			break;
		case O_NOREP:
			o->replicate = false;
			break;
		case O_NOCSUM:
			o->udp_csum = false;
			break;
		case 'h':
		case O_HELP:
			usage(argv[0]);
			exit(0);
		default:
			usage(argv[0]);
			return -EINVAL;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "unexpected argument: %s\n", argv[optind]);
		return -EINVAL;
	}
	if (o->lcores != 1 || o->queues != 1) {
		/* every packet of a job must reach the engine that holds the job;
		 * RSS hashes the 5-tuple, which spreads a job's workers over
		 * queues, so more queues need job-affine steering first */
		fprintf(stderr, "--lcores/--queues: only 1 is supported\n");
		return -ENOTSUP;
	}
	return 0;
bad:
	fprintf(stderr, "bad value for --%s: %s\n", lo[c - O_IP].name, optarg);
	return -EINVAL;
}

/* ---- control callbacks ---------------------------------------------- */

static int ctl_add_job(void *ctx, const struct hg_ctl_job *j, char *err,
		       size_t errlen)
{
	struct daemon *d = ctx;
	struct hg_job_config jc = {
		.job = j->job,
		.token = j->token,
		.workers = j->workers,
		.slots = j->slots,
		.payload_bytes = j->payload,
		.group_ipv4 = j->group,
	};
	int rc = hg_engine_add_job(d->eng, &jc);

	if (rc == -EEXIST)
		snprintf(err, errlen, "job %u already exists", j->job);
	return rc;
}

static int ctl_remove_job(void *ctx, uint32_t job)
{
	struct daemon *d = ctx;

	return hg_engine_remove_job(d->eng, job);
}

static void ctl_stats(void *ctx, struct hg_json_out *w)
{
	struct daemon *d = ctx;
	uint64_t c[HG_CNT__COUNT];
	struct hg_dpdk_port_stats ps;
	unsigned int i;

	hg_engine_counters(d->eng, c, HG_CNT__COUNT);
	hg_json_key(w, "stats");
	hg_json_raw(w, "{");
	for (i = 0; i < HG_CNT__COUNT; i++) {
		hg_json_key(w, hg_counter_name((int)i));
		hg_json_u64(w, c[i]);
	}
	hg_json_raw(w, "}");
	hg_dpdk_port_get_stats(d->dport, &ps);
	hg_json_key(w, "port");
	hg_json_raw(w, "{");
	hg_json_key(w, "rx");
	hg_json_u64(w, ps.rx);
	hg_json_key(w, "tx");
	hg_json_u64(w, ps.tx);
	hg_json_key(w, "tx_refused");
	hg_json_u64(w, ps.tx_refused);
	hg_json_key(w, "drop_injected");
	hg_json_u64(w, ps.drop_injected);
	hg_json_key(w, "drop_segmented");
	hg_json_u64(w, ps.drop_segmented);
	hg_json_key(w, "arp_replies");
	hg_json_u64(w, ps.arp_replies);
	hg_json_key(w, "alloc_fail");
	hg_json_u64(w, ps.alloc_fail);
	hg_json_raw(w, "}");
}

static void ctl_shutdown(void *ctx)
{
	struct daemon *d = ctx;

	d->stop_requested = true;
}

static const struct hg_ctl_ops ctl_ops = {
	.add_job = ctl_add_job,
	.remove_job = ctl_remove_job,
	.stats = ctl_stats,
	.shutdown = ctl_shutdown,
};

/* ---- telemetry ------------------------------------------------------ */

static void publish_snapshot(struct daemon *d)
{
	uint64_t c[HG_CNT__COUNT];
	unsigned int i;

	hg_engine_counters(d->eng, c, HG_CNT__COUNT);
	for (i = 0; i < HG_CNT__COUNT; i++)
		__atomic_store_n(&d->snap[i], c[i], __ATOMIC_RELAXED);
}

static int tel_stats(const char *cmd, const char *params,
		     struct rte_tel_data *t)
{
	struct daemon *d = g_tel_daemon;
	unsigned int i;

	if (!d)
		return -EAGAIN;
	rte_tel_data_start_dict(t);
	for (i = 0; i < HG_CNT__COUNT; i++)
		rte_tel_data_add_dict_u64(t, hg_counter_name((int)i),
					  __atomic_load_n(&d->snap[i], __ATOMIC_RELAXED));
	return 0;
}

/* ---- setup and loop ------------------------------------------------- */

static int port_setup(struct daemon *d)
{
	struct rte_eth_conf conf;
	struct rte_eth_dev_info info;
	uint16_t nrx = RX_DESC, ntx = TX_DESC, pid = d->o.port_id;
	int socket, rc;

	if (!rte_eth_dev_is_valid_port(pid)) {
		fprintf(stderr, "ethdev port %u does not exist (%u available): "
			"pass a --vdev or a device in the EAL arguments\n",
			pid, rte_eth_dev_count_avail());
		return -ENODEV;
	}
	socket = rte_eth_dev_socket_id(pid);
	if (socket < 0)
		socket = (int)rte_socket_id();
	/* one frame of the port's MTU per mbuf (jumbo MTUs included): the
	 * backend handles single-segment frames only */
	if (rte_eth_dev_get_mtu(pid, &d->mtu) != 0 || d->mtu < 576)
		d->mtu = RTE_ETHER_MTU;
	d->pool = hg_dpdk_pool_create("hg_pool", d->o.mbufs,
				      (uint16_t)RTE_MAX(RTE_MBUF_DEFAULT_DATAROOM,
							d->mtu + RTE_ETHER_HDR_LEN + 8),
				      socket);
	if (!d->pool) {
		fprintf(stderr, "mbuf pool: %s\n", rte_strerror(rte_errno));
		return -ENOMEM;
	}
	memset(&conf, 0, sizeof(conf));
	rc = rte_eth_dev_info_get(pid, &info);
	if (rc == 0 && (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS))
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
		fprintf(stderr, "port %u setup: %s\n", pid, rte_strerror(-rc));
		return rc;
	}
	d->port_started = true;
	/* multicast and frames for other MACs of the segment (best effort:
	 * some virtual PMDs have no such switch and receive everything) */
	rte_eth_promiscuous_enable(pid);
	rte_eth_allmulticast_enable(pid);
	return 0;
}

static void print_counters(struct daemon *d, FILE *f)
{
	uint64_t c[HG_CNT__COUNT];
	struct hg_dpdk_port_stats ps;
	unsigned int i;

	hg_engine_counters(d->eng, c, HG_CNT__COUNT);
	hg_dpdk_port_get_stats(d->dport, &ps);
	fprintf(f, "stats: port rx=%" PRIu64 " tx=%" PRIu64 " drop_injected=%"
		PRIu64 " arp=%" PRIu64, ps.rx, ps.tx, ps.drop_injected,
		ps.arp_replies);
	for (i = 0; i < HG_CNT__COUNT; i++)
		if (c[i])
			fprintf(f, " %s=%" PRIu64, hg_counter_name((int)i), c[i]);
	fprintf(f, "\n");
	fflush(f);
}

static int run(struct daemon *d)
{
	const uint64_t hz = rte_get_tsc_hz();
	const uint64_t ctl_period = hz / 1000;
	uint64_t stats_period = (uint64_t)(d->o.stats_interval * (double)hz);
	uint64_t now = rte_get_tsc_cycles();
	uint64_t next_ctl = now, next_stats = now + stats_period;
	unsigned int idle = 0;

	while (!g_signalled && !d->stop_requested) {
		int n = hg_engine_poll(d->eng);

		if (n > 0) {
			idle = 0;
		} else if (d->o.idle_us && ++idle >= 256) {
			struct timespec ts = { 0, (long)d->o.idle_us * 1000 };

			nanosleep(&ts, NULL);
		}
		now = rte_get_tsc_cycles();
		if (now < next_ctl)
			continue;
		next_ctl = now + ctl_period;
		if (hg_control_poll(d->ctl) < 0)
			fprintf(stderr, "control socket: %s\n", strerror(errno));
		publish_snapshot(d);
		if (stats_period && now >= next_stats) {
			next_stats = now + stats_period;
			print_counters(d, stdout);
		}
	}
	return 0;
}

static void teardown(struct daemon *d)
{
	g_tel_daemon = NULL;
	hg_control_destroy(d->ctl);
	hg_engine_destroy(d->eng);
	hg_dpdk_port_destroy(d->dport);
	if (d->port_started) {
		rte_eth_dev_stop(d->o.port_id);
		rte_eth_dev_close(d->o.port_id);
	}
	rte_mempool_free(d->pool);
}

int main(int argc, char **argv)
{
	static struct daemon dm;   /* large (counter snapshot); one per process */
	struct daemon *d = &dm;
	struct hg_engine_config ec;
	struct hg_ctl_limits lim;
	struct sigaction sa;
	int eal_args, rc, status = 1;
	char ip[INET_ADDRSTRLEN];
	struct in_addr a;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	eal_args = rte_eal_init(argc, argv);
	if (eal_args < 0) {
		fprintf(stderr, "EAL init failed: %s\n", rte_strerror(rte_errno));
		return 1;
	}
	argc -= eal_args;
	argv += eal_args;
	argv[0] = "homagg-switch";
	if (parse_opts(argc, argv, &d->o) < 0)
		goto out_eal;

	if (port_setup(d) < 0)
		goto out;
	d->dport = hg_dpdk_port_create(&(struct hg_dpdk_port_conf){
		.port_id = d->o.port_id, .rx_queue = 0, .tx_queue = 0,
		.pool = d->pool, .ipv4 = d->o.ipv4, .udp_port = d->o.udp_port,
		.can_replicate = d->o.replicate, .drop_rate = d->o.drop_rate,
		.seed = d->o.seed });
	if (!d->dport) {
		fprintf(stderr, "port backend: %s\n", strerror(errno));
		goto out;
	}
	d->port = hg_dpdk_port_ops(d->dport);
	hg_engine_config_init(&ec);
	ec.port = &d->port;
	ec.max_jobs = d->o.max_jobs;
	ec.udp_port = d->o.udp_port;
	if (!d->o.udp_csum)
		ec.flags &= ~(uint32_t)HG_ENGINE_F_UDP_CSUM;
	d->eng = hg_engine_create(&ec);
	if (!d->eng) {
		fprintf(stderr, "engine: could not create\n");
		goto out;
	}
	lim.max_workers = HG_MAX_WORKERS;
	lim.max_slots = HG_ENGINE_MAX_SLOTS;
	/* a packet is one IP datagram of at most the MTU */
	lim.max_payload = RTE_MIN((uint32_t)HG_MAX_PAYLOAD,
				  (uint32_t)(d->mtu - 20 - 8 - HG_HDR_LEN)) & ~3u;
	d->ctl = hg_control_create(d->o.control, &ctl_ops, d, &lim);
	if (!d->ctl) {
		fprintf(stderr, "control socket %s: %s\n", d->o.control,
			strerror(errno));
		goto out;
	}
	g_tel_daemon = d;
	rc = rte_telemetry_register_cmd("/homagg/stats", tel_stats,
					"HomAgg engine counters. No parameters");
	if (rc < 0)
		fprintf(stderr, "telemetry: /homagg/stats not registered (%d)\n", rc);

	a.s_addr = htonl(d->o.ipv4);
	inet_ntop(AF_INET, &a, ip, sizeof(ip));
	{
		struct hg_port_info pi;

		d->port.ops->get_info(d->port.ctx, &pi);
		printf("homagg-switch: ready port=%u mac=%02x:%02x:%02x:%02x:%02x:%02x "
		       "ip=%s udp=%u control=%s drop_rate=%g\n", d->o.port_id,
		       pi.mac[0], pi.mac[1], pi.mac[2], pi.mac[3], pi.mac[4],
		       pi.mac[5], ip, d->o.udp_port, d->o.control, d->o.drop_rate);
		fflush(stdout);
	}
	run(d);
	if (d->o.stats_interval > 0)
		print_counters(d, stdout);
	printf("homagg-switch: stopping (%s)\n",
	       g_signalled ? strsignal(g_signalled) : "shutdown command");
	fflush(stdout);
	status = 0;
out:
	teardown(d);
out_eal:
	rte_eal_cleanup();
	return status;
}
