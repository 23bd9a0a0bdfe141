/* SPDX-License-Identifier: Apache-2.0 */
/*
 * switch_main.c - homagg-switch, the DPDK aggregator daemon.
 *
 *   homagg-switch [EAL args] -- [--port-ip A.B.C.D] [--control PATH] ...
 *
 * With --lcores 1 (the default) one engine (engine.h) runs on the main
 * lcore behind one hg_dpdk_port (port_dpdk.h), and the same loop polls the
 * control socket (control.h) every millisecond, so the engine is only ever
 * touched by one thread.  With --lcores N > 1 the main lcore dispatches:
 * it receives from the ethdev, hands each frame to engine (job id + slot)
 * % N on its own lcore through a ring, sends what the engines put in their
 * tx rings, and serves the control socket.  Every engine holds every job
 * and serves the slots that map to it, so one job's slots are spread over
 * all N lcores (a slot is only ever touched by one of them).  Job changes
 * reach each engine through a mailbox its lcore serves between polls, so
 * again nothing runs concurrently with a poll and the packet path takes no
 * locks.  docs/SWITCH.md documents the command line.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <net/if.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <rte_common.h>
#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_malloc.h>
#include <rte_mbuf.h>
#include <rte_pause.h>
#include <rte_ring.h>
#include <rte_telemetry.h>

#include "homagg/auth.h"
#include "homagg/codec.h"
#include "homagg/counters.h"
#include "homagg/engine.h"
#include "homagg/errors.h"
#include "homagg/wire.h"
#include "control.h"
#include "log.h"
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
	unsigned int idle_polls;  /* empty polls before the first sleep */
	unsigned int mbufs;
	unsigned int max_jobs;
	unsigned int mtu;         /* 0 = the port's (kernel interface or PMD) */
	bool replicate;
	bool udp_csum;            /* verify received / fill sent UDP checksums */
};

/* A request to an engine lcore (job changes must run on the lcore that
 * polls the engine: engine.h forbids concurrent control and poll). */
enum { MB_IDLE, MB_REQ, MB_DONE };
enum { MB_ADD, MB_REMOVE };

struct mailbox {
	int state;                 /* MB_*, acquire/release atomics */
	int op;
	struct hg_job_config jc;
	uint32_t job;
	int rc;
};

/* One engine.  With --lcores 1 the only shard runs on the main lcore on
 * the ethdev port itself; with N > 1 each runs on its own lcore on a
 * ring-mode port fed by the dispatcher ((job id + slot) % N picks the
 * shard; every shard holds every job). */
struct shard {
	struct daemon *d;
	struct hg_dpdk_port *dport;    /* ring-mode port (N > 1) */
	struct hg_port port;
	struct hg_engine *eng;
	struct rte_ring *rx_ring;
	struct rte_ring *tx_ring;
	unsigned int lcore;
	bool launched;
	struct mailbox mb;
	uint64_t snap[HG_CNT__COUNT];  /* published counters (relaxed atomics) */
} __rte_cache_aligned;

struct daemon {
	struct opts o;
	struct rte_mempool *pool;
	struct hg_dpdk_port *dport;    /* the ethdev port */
	struct hg_port port;
	struct shard *shards;
	unsigned int nshards;
	struct hg_control *ctl;
	bool port_started;
	uint16_t mtu;                  /* of the link (--mtu, kernel interface, PMD) */
	uint16_t data_room;            /* of every mbuf: a whole frame of the MTU */
	volatile bool stop_requested;  /* by the shutdown command */
	volatile bool stop_engines;    /* engine lcores leave their loop */
	uint64_t dispatch_full;        /* frames a full shard ring refused */
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
		"  --lcores N            engines (default 1, on the main lcore); N > 1: one\n"
		"                        lcore each plus the main lcore as dispatcher\n"
		"  --queues N            rx/tx queues of the port (only 1 is supported)\n"
		"  --drop-rate F         drop this fraction of received frames (0..1, seeded)\n"
		"  --seed N              seed of the drop generator (default 1)\n"
		"  --stats-interval S    print the counters every S seconds (0 = never)\n"
		"  --idle-us N           sleep N us when the port is idle (default 20, 0 = spin)\n"
		"  --idle-polls N        empty polls before the first sleep (default 256)\n"
		"  --mbufs N             mbufs in the pool (default 8191)\n"
		"  --max-jobs N          concurrent jobs (default 64)\n"
		"  --mtu N               MTU of the link, 576..9000 (default: the kernel\n"
		"                        interface's for af_packet/af_xdp/tap, else the PMD's);\n"
		"                        9000 for jumbo payloads of up to 8192 bytes\n"
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
	       O_SEED, O_STATS, O_IDLE, O_IDLE_POLLS, O_MBUFS, O_JOBS, O_NOREP, O_NOCSUM,
	       O_MTU, O_HELP };
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
		{ "idle-polls", required_argument, NULL, O_IDLE_POLLS },
		{ "mbufs", required_argument, NULL, O_MBUFS },
		{ "max-jobs", required_argument, NULL, O_JOBS },
		{ "no-replicate", no_argument, NULL, O_NOREP },
		{ "no-udp-csum", no_argument, NULL, O_NOCSUM },
		{ "mtu", required_argument, NULL, O_MTU },
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
		.idle_polls = 256,
		.mbufs = 8191, .max_jobs = 64, .replicate = true, .udp_csum = true,
	};
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case O_IP:
			if (inet_pton(AF_INET, optarg, &a) != 1) {
				HG_LOG(ERR, "--port-ip: not an IPv4 address: %s", optarg);
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
		case O_IDLE_POLLS:
			if (parse_ulong(optarg, 1, 1u << 24, &v))
				goto bad;
			o->idle_polls = (unsigned int)v;
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
		case O_MTU:
			if (parse_ulong(optarg, 576, 9000, &v))
				goto bad;
			o->mtu = (unsigned int)v;
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
		HG_LOG(ERR, "unexpected argument: %s", argv[optind]);
		return -EINVAL;
	}
	if (o->queues != 1) {
		/* every packet of a job must reach the engine that holds the job;
		 * RSS hashes the 5-tuple, which spreads a job's workers over
		 * queues: more engines are fed by a dispatcher lcore instead */
		HG_LOG(ERR, "--queues: only 1 is supported (use --lcores)");
		return -ENOTSUP;
	}
	if (o->lcores > 64) {
		HG_LOG(ERR, "--lcores: at most 64 engines");
		return -ERANGE;
	}
	return 0;
bad:
	HG_LOG(ERR, "bad value for --%s: %s", lo[c - O_IP].name, optarg);
	return -EINVAL;
}

/* ---- engines ------------------------------------------------------- */

static void shard_publish(struct shard *sh)
{
	uint64_t c[HG_CNT__COUNT];
	unsigned int i;

	hg_engine_counters(sh->eng, c, HG_CNT__COUNT);
	for (i = 0; i < HG_CNT__COUNT; i++)
		__atomic_store_n(&sh->snap[i], c[i], __ATOMIC_RELAXED);
}

/* The engine counters summed over the shards.  With one shard on the main
 * lcore they are read directly (this is that lcore); otherwise from the
 * snapshots the engine lcores publish every millisecond. */
static void counters_sum(struct daemon *d, uint64_t *out)
{
	unsigned int i, k;

	if (d->nshards == 1 && !d->shards[0].launched) {
		hg_engine_counters(d->shards[0].eng, out, HG_CNT__COUNT);
		return;
	}
	memset(out, 0, sizeof(uint64_t) * HG_CNT__COUNT);
	for (k = 0; k < d->nshards; k++)
		for (i = 0; i < HG_CNT__COUNT; i++)
			out[i] += __atomic_load_n(&d->shards[k].snap[i],
						  __ATOMIC_RELAXED);
}

/* Run a pending mailbox request (on the shard's own lcore). */
static void shard_serve(struct shard *sh)
{
	struct mailbox *mb = &sh->mb;

	if (__atomic_load_n(&mb->state, __ATOMIC_ACQUIRE) != MB_REQ)
		return;
	mb->rc = mb->op == MB_ADD ? hg_engine_add_job(sh->eng, &mb->jc) :
				    hg_engine_remove_job(sh->eng, mb->job);
	hg_auth_wipe(mb->jc.secret, sizeof(mb->jc.secret));
	shard_publish(sh);
	__atomic_store_n(&mb->state, MB_DONE, __ATOMIC_RELEASE);
}

/* Ask shard sh to add or remove a job; waits (bounded) for the answer. */
static int shard_call(struct shard *sh, int op, const struct hg_job_config *jc,
		      uint32_t job)
{
	struct mailbox *mb = &sh->mb;
	uint64_t deadline;
	int rc;

	if (!sh->launched)   /* the engine is polled by this very lcore */
		return op == MB_ADD ? hg_engine_add_job(sh->eng, jc) :
				      hg_engine_remove_job(sh->eng, job);
	if (__atomic_load_n(&mb->state, __ATOMIC_ACQUIRE) != MB_IDLE)
		return -EBUSY;   /* an earlier request timed out */
	mb->op = op;
	if (jc)
		mb->jc = *jc;
	mb->job = job;
	__atomic_store_n(&mb->state, MB_REQ, __ATOMIC_RELEASE);
	deadline = rte_get_tsc_cycles() + 2 * rte_get_tsc_hz();
	while (__atomic_load_n(&mb->state, __ATOMIC_ACQUIRE) != MB_DONE) {
		if (rte_get_tsc_cycles() > deadline)
			return -ETIMEDOUT;
		rte_pause();
	}
	rc = mb->rc;
	__atomic_store_n(&mb->state, MB_IDLE, __ATOMIC_RELEASE);
	return rc;
}

/*
 * The shard of a received frame: (job id + slot) % N, read where a HomAgg
 * header sits in an IPv4 (no options) / UDP frame, so consecutive slots of
 * one job go to consecutive lcores.  Anything else goes to shard 0, whose
 * engine counts it as the drop it is (a frame with a bad slot lands on
 * some shard, which drops it the same way).
 */
static inline unsigned int shard_of_frame(const struct daemon *d,
					  const struct hg_pkt *pk)
{
	const uint8_t *f = pk->data, *h = f + HG_ETH_IP_UDP_LEN;
	uint32_t job, slot;

	if (pk->len < HG_ETH_IP_UDP_LEN + HG_HDR_LEN || f[12] != 0x08 ||
	    f[13] != 0x00 || f[14] != 0x45)
		return 0;
	job = (uint32_t)h[4] << 24 | (uint32_t)h[5] << 16 |
	      (uint32_t)h[6] << 8 | h[7];
	slot = (uint32_t)h[14] << 8 | h[15];
	return (unsigned int)(((uint64_t)job + slot) % d->nshards);
}

/* Idle backoff: after --idle-polls polls in a row that moved nothing, sleep
 * --idle-us between polls until a poll moves a frame again.  On a machine
 * whose cores are shared with the workers (a testbed on one host) a spinning
 * lcore takes a core from them; a dedicated core can spin (--idle-us 0). */
static void idle_sleep(const struct daemon *d, unsigned int *idle, bool moved)
{
	if (moved) {
		*idle = 0;
	} else if (d->o.idle_us && ++*idle >= d->o.idle_polls) {
		struct timespec ts = { (time_t)(d->o.idle_us / 1000000),
				       (long)(d->o.idle_us % 1000000) * 1000 };

		nanosleep(&ts, NULL);
	}
}

/* An engine lcore (--lcores > 1). */
static int shard_loop(void *arg)
{
	struct shard *sh = arg;
	struct daemon *d = sh->d;
	const uint64_t period = rte_get_tsc_hz() / 1000;
	uint64_t next = 0;
	unsigned int idle = 0, iter = 0;

	while (!d->stop_engines) {
		int n = hg_engine_poll(sh->eng);

		idle_sleep(d, &idle, n > 0);
		shard_serve(sh);
		if ((++iter & 255) == 0 || idle) {
			uint64_t now = rte_get_tsc_cycles();

			if (now >= next) {
				next = now + period;
				shard_publish(sh);
			}
		}
	}
	shard_serve(sh);
	shard_publish(sh);
	return 0;
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
		.shard = j->shard,
		.incarnation = j->incarnation,
		.auth = j->auth,
	};
	unsigned int k;
	int rc = 0;

	memcpy(jc.secret, j->secret, sizeof(jc.secret));

	/* On every shard (each serves its slots of the job); all or none. */
	for (k = 0; k < d->nshards && !rc; k++)
		rc = shard_call(&d->shards[k], MB_ADD, &jc, j->job);
	if (rc && rc != -EEXIST)
		while (--k > 0)
			shard_call(&d->shards[k - 1], MB_REMOVE, NULL, j->job);
	hg_auth_wipe(jc.secret, sizeof(jc.secret));
	if (rc == -EEXIST)
		snprintf(err, errlen, "job %u already exists", j->job);
	else if (rc == -ETIMEDOUT || rc == -EBUSY)
		snprintf(err, errlen, "the engine lcore of job %u did not answer",
			 j->job);
	return rc;
}

static int ctl_remove_job(void *ctx, uint32_t job)
{
	struct daemon *d = ctx;
	unsigned int k;
	int rc = 0, r;

	for (k = 0; k < d->nshards; k++)
		if ((r = shard_call(&d->shards[k], MB_REMOVE, NULL, job)) && !rc)
			rc = r;
	return rc;
}

/* The counters under "stats" (engine) and "port" (backend, dispatcher). */
static int ctl_stats(void *ctx, json_t *reply)
{
	struct daemon *d = ctx;
	uint64_t c[HG_CNT__COUNT];
	struct hg_dpdk_port_stats ps;
	struct rte_eth_stats es;
	json_t *eng = json_object(), *port, *summed;
	unsigned int i;
	int rc;

	counters_sum(d, c);
	for (i = 0; eng && i < HG_CNT__COUNT; i++)
		if (json_object_set_new(eng, hg_counter_name((int)i),
					json_integer((json_int_t)c[i])) < 0)
			break;
	hg_dpdk_port_get_stats(d->dport, &ps);
	/* the ethdev's own count of frames received: every one of them is
	 * in exactly one of drop_injected, drop_segmented, arp_replies,
	 * arp_other and rx */
	if (rte_eth_stats_get(d->o.port_id, &es) != 0)
		es.ipackets = 0;
	port = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
			 "ipackets", (json_int_t)es.ipackets,
			 "rx", (json_int_t)ps.rx, "tx", (json_int_t)ps.tx,
			 "tx_refused", (json_int_t)ps.tx_refused,
			 "drop_injected", (json_int_t)ps.drop_injected,
			 "rx_linearized", (json_int_t)ps.rx_linearized,
			 "drop_segmented", (json_int_t)ps.drop_segmented,
			 "arp_replies", (json_int_t)ps.arp_replies,
			 "arp_other", (json_int_t)ps.arp_other,
			 "alloc_fail", (json_int_t)ps.alloc_fail,
			 "dispatch_full", (json_int_t)d->dispatch_full);
	if (!eng || i < HG_CNT__COUNT || !port) {
		json_decref(eng);
		json_decref(port);
		return -ENOMEM;
	}
	/* each set takes its value's reference, also when it fails */
	rc = json_object_set_new(reply, "stats", eng);
	rc |= json_object_set_new(reply, "port", port);
	rc |= json_object_set_new(reply, "engines", json_integer(d->nshards));
	/* What each engine lcore summed (the spread of one job's slots). */
	summed = json_array();
	for (i = 0; summed && i < d->nshards; i++) {
		uint64_t v = d->nshards == 1 && !d->shards[0].launched ?
			     c[HG_CNT_SUMMED] :
			     __atomic_load_n(&d->shards[i].snap[HG_CNT_SUMMED],
					     __ATOMIC_RELAXED);

		rc |= json_array_append_new(summed, json_integer((json_int_t)v));
	}
	rc |= json_object_set_new(reply, "engine_summed", summed);
	return rc ? -ENOMEM : 0;
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

static int tel_stats(const char *cmd, const char *params,
		     struct rte_tel_data *t)
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
	uint16_t nrx = RX_DESC, ntx = TX_DESC, pid = d->o.port_id, kmtu, overhead;
	int socket, rc;

	if (!rte_eth_dev_is_valid_port(pid)) {
		HG_LOG(ERR, "ethdev port %u does not exist (%u available): "
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
		HG_LOG(WARNING, "--mtu %u: the port's interface has MTU %u: longer "
		       "frames will not arrive", d->mtu, kmtu);
	/*
	 * One whole frame of the MTU per mbuf, so a PMD need not scatter it:
	 * the MTU plus room for the Ethernet header, CRC, a VLAN tag and the
	 * 66 bytes af_packet keeps before a frame (its framesz must not exceed
	 * data room + 32), rounded up to 1 KiB: 2048 at MTU 1500, 9216 at 9000.
	 * Frames a PMD scatters anyway are linearised by the backend.
	 */
	d->data_room = (uint16_t)RTE_MAX((unsigned int)RTE_MBUF_DEFAULT_DATAROOM,
					 RTE_ALIGN_CEIL((unsigned int)d->mtu + 128, 1024u));
	d->pool = hg_dpdk_pool_create("hg_pool", d->o.mbufs, d->data_room, socket);
	if (!d->pool) {
		HG_LOG(ERR, "mbuf pool (%u mbufs of %u bytes): %s", d->o.mbufs,
		       d->data_room, rte_strerror(rte_errno));
		return -ENOMEM;
	}
	/* a PMD that manages the MTU (a NIC sizing its rx buffers) is given
	 * it; one that accepts shorter frames only (af_packet reports 1518:
	 * the kernel interface decides) keeps its own */
	overhead = (info.max_mtu != UINT16_MAX && info.max_rx_pktlen > info.max_mtu) ?
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

	counters_sum(d, c);
	hg_dpdk_port_get_stats(d->dport, &ps);
	n = (size_t)snprintf(line, sizeof(line), "port rx=%" PRIu64 " tx=%"
			     PRIu64 " drop_injected=%" PRIu64 " arp=%" PRIu64,
			     ps.rx, ps.tx, ps.drop_injected, ps.arp_replies);
	for (i = 0; i < HG_CNT__COUNT && n < sizeof(line); i++)
		if (c[i])
			n += (size_t)snprintf(line + n, sizeof(line) - n,
					      " %s=%" PRIu64,
					      hg_counter_name((int)i), c[i]);
	HG_LOG(NOTICE, "stats: %s", line);
}

/* The dispatcher (--lcores > 1): frames from the ethdev to the shard of
 * their job, frames of every shard to the ethdev.  Returns whether any
 * frame moved. */
static bool dispatch(struct daemon *d)
{
	struct rte_mbuf *by[64][32];
	uint16_t cnt[64] = { 0 };
	struct hg_pkt *pk[32];
	struct rte_mbuf *m[64];
	uint16_t n, i, k, sent;
	bool moved;

	n = hg_port_rx(&d->port, pk, 32);   /* drops injected, ARP answered */
	moved = n > 0;
	for (i = 0; i < n; i++) {
		k = (uint16_t)shard_of_frame(d, pk[i]);
		by[k][cnt[k]++] = pk[i]->priv;
	}
	for (k = 0; n && k < d->nshards; k++) {
		if (!cnt[k])
			continue;
		sent = (uint16_t)rte_ring_sp_enqueue_burst(d->shards[k].rx_ring,
							   (void **)by[k], cnt[k], NULL);
		if (sent < cnt[k]) {
			d->dispatch_full += cnt[k] - sent;
			rte_pktmbuf_free_bulk(by[k] + sent, cnt[k] - sent);
		}
	}
	for (k = 0; k < d->nshards; k++) {
		n = (uint16_t)rte_ring_sc_dequeue_burst(d->shards[k].tx_ring,
							(void **)m, 64, NULL);
		if (!n)
			continue;
		moved = true;
		sent = hg_dpdk_port_tx_mbufs(d->dport, m, n);
		if (sent < n)
			rte_pktmbuf_free_bulk(m + sent, n - sent);
	}
	return moved;
}

static int run(struct daemon *d)
{
	const uint64_t hz = rte_get_tsc_hz();
	const uint64_t ctl_period = hz / 1000;
	uint64_t stats_period = (uint64_t)(d->o.stats_interval * (double)hz);
	uint64_t now = rte_get_tsc_cycles();
	uint64_t next_ctl = now, next_stats = now + stats_period;
	struct shard *one = d->nshards == 1 ? &d->shards[0] : NULL;
	unsigned int idle = 0;

	while (!g_signalled && !d->stop_requested) {
		if (one)
			idle_sleep(d, &idle, hg_engine_poll(one->eng) > 0);
		else
			idle_sleep(d, &idle, dispatch(d));
		now = rte_get_tsc_cycles();
		if (now < next_ctl)
			continue;
		next_ctl = now + ctl_period;
		if (hg_control_poll(d->ctl) < 0)
			HG_LOG(ERR, "control socket: %s", strerror(errno));
		if (one)
			shard_publish(one);   /* for the telemetry thread */
		if (stats_period && now >= next_stats) {
			next_stats = now + stats_period;
			log_counters(d);
		}
	}
	return 0;
}

static void stop_engines(struct daemon *d)
{
	unsigned int k;

	d->stop_engines = true;
	for (k = 0; k < d->nshards; k++)
		if (d->shards[k].launched)
			rte_eal_wait_lcore(d->shards[k].lcore);
}

static void teardown(struct daemon *d)
{
	unsigned int k;

	g_tel_daemon = NULL;
	hg_control_destroy(d->ctl);
	if (d->shards) {
		stop_engines(d);
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

/* Create the shards' engines (and, with N > 1, their rings and ports). */
static int shards_setup(struct daemon *d)
{
	struct hg_engine_config ec;
	unsigned int k, lcore = rte_get_main_lcore();

	d->nshards = d->o.lcores;
	if (d->nshards > 1 && rte_lcore_count() < d->nshards + 1) {
		HG_LOG(ERR, "--lcores %u needs %u EAL lcores (e.g. -l 0-%u): "
			"one dispatcher and one per engine", d->nshards,
			d->nshards + 1, d->nshards);
		return -EINVAL;
	}
	d->shards = rte_zmalloc("hg_shards", sizeof(*d->shards) * d->nshards,
				RTE_CACHE_LINE_SIZE);
	if (!d->shards)
		return -ENOMEM;
	for (k = 0; k < d->nshards; k++) {
		struct shard *sh = &d->shards[k];

		sh->d = d;
		if (d->nshards == 1) {
			sh->port = d->port;
		} else {
			char name[RTE_RING_NAMESIZE];

			snprintf(name, sizeof(name), "hg_rx%u", k);
			sh->rx_ring = rte_ring_create(name, 4096, (int)rte_socket_id(),
						      RING_F_SP_ENQ | RING_F_SC_DEQ);
			snprintf(name, sizeof(name), "hg_tx%u", k);
			sh->tx_ring = rte_ring_create(name, 4096, (int)rte_socket_id(),
						      RING_F_SP_ENQ | RING_F_SC_DEQ);
			if (!sh->rx_ring || !sh->tx_ring)
				return -ENOMEM;
			sh->dport = hg_dpdk_port_create(&(struct hg_dpdk_port_conf){
				.port_id = d->o.port_id, .pool = d->pool,
				.ipv4 = d->o.ipv4, .udp_port = d->o.udp_port,
				.can_replicate = d->o.replicate, .mtu = d->mtu,
				.rx_ring = sh->rx_ring, .tx_ring = sh->tx_ring });
			if (!sh->dport)
				return -ENOMEM;
			sh->port = hg_dpdk_port_ops(sh->dport);
		}
		hg_engine_config_init(&ec);
		ec.port = &sh->port;
		ec.max_jobs = d->o.max_jobs;
		ec.udp_port = d->o.udp_port;
		if (!d->o.udp_csum)
			ec.flags &= ~(uint32_t)HG_ENGINE_F_UDP_CSUM;
		sh->eng = hg_engine_create(&ec);
		if (!sh->eng) {
			HG_LOG(ERR, "engine: could not create");
			return -ENOMEM;
		}
		shard_publish(sh);
	}
	if (d->nshards == 1)
		return 0;
	for (k = 0; k < d->nshards; k++) {
		struct shard *sh = &d->shards[k];

		lcore = rte_get_next_lcore(lcore, 1, 0);
		sh->lcore = lcore;
		if (rte_eal_remote_launch(shard_loop, sh, lcore) != 0) {
			HG_LOG(ERR, "lcore %u: could not launch", lcore);
			return -EBUSY;
		}
		sh->launched = true;
	}
	return 0;
}

int main(int argc, char **argv)
{
	static struct daemon dm;   /* one per process */
	struct daemon *d = &dm;
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
		HG_LOG(ERR, "EAL init failed: %s", rte_strerror(rte_errno));
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
		.seed = d->o.seed, .mtu = d->mtu });
	if (!d->dport) {
		HG_LOG(ERR, "port backend: %s", strerror(errno));
		goto out;
	}
	d->port = hg_dpdk_port_ops(d->dport);
	if (shards_setup(d) < 0)
		goto out;
	lim.max_workers = HG_MAX_WORKERS;
	lim.max_slots = HG_ENGINE_MAX_SLOTS;
	/* a packet is one IP datagram of at most the MTU */
	lim.max_payload = payload_limit(d->mtu);
	lim.mtu = d->mtu;
	d->ctl = hg_control_create(d->o.control, &ctl_ops, d, &lim);
	if (!d->ctl) {
		HG_LOG(ERR, "control socket %s: %s", d->o.control,
			strerror(errno));
		goto out;
	}
	g_tel_daemon = d;
	rc = rte_telemetry_register_cmd("/homagg/stats", tel_stats,
					"HomAgg engine counters. No parameters");
	if (rc < 0)
		HG_LOG(ERR, "telemetry: /homagg/stats not registered (%d)", rc);

	a.s_addr = htonl(d->o.ipv4);
	inet_ntop(AF_INET, &a, ip, sizeof(ip));
	{
		struct hg_port_info pi;

		d->port.ops->get_info(d->port.ctx, &pi);
		HG_LOG(NOTICE, "ready port=%u mac=%02x:%02x:%02x:%02x:%02x:%02x "
		       "ip=%s udp=%u control=%s drop_rate=%g engines=%u mtu=%u "
		       "max_payload=%u mbuf_data_room=%u",
		       d->o.port_id, pi.mac[0], pi.mac[1], pi.mac[2], pi.mac[3],
		       pi.mac[4], pi.mac[5], ip, d->o.udp_port, d->o.control,
		       d->o.drop_rate, d->nshards, d->mtu, lim.max_payload,
		       d->data_room);
	}
	run(d);
	stop_engines(d);
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
