/* SPDX-License-Identifier: Apache-2.0 */
/* switch_opts.c - homagg-switch's command line (docs/SWITCH.md). */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "homagg/wire.h"
#include "log.h"
#include "switch_pvt.h"

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
		"  --idle-max-us N       longest sleep: an idle port sleeps a sixteenth\n"
		"                        of the time it has been idle, from --idle-us\n"
		"                        up to N us (default 1000; N <= --idle-us: a\n"
		"                        fixed --idle-us)\n"
		"  --mbufs N             mbufs in the pool (default 8191; at least\n"
		"                        the rx and tx rings' descriptors + 1024)\n"
		"  --rx-ring N           rx descriptors of a descriptor-ring PMD (NIC,\n"
		"                        af_xdp), 64..32768 (default 1024); af_packet's\n"
		"                        ring is its vdev's framecnt (default 512)\n"
		"  --max-jobs N          concurrent jobs (default 64)\n"
		"  --mtu N               MTU of the link, 576..9000 (default: the kernel\n"
		"                        interface's for af_packet/af_xdp/tap, else the PMD's);\n"
		"                        9000 for jumbo payloads of up to 8192 bytes\n"
		"  --no-replicate        the link does not replicate multicast: unicast results\n"
		"  --no-udp-csum         neither verify nor fill UDP checksums (peers whose\n"
		"                        kernel leaves them to an offload, e.g. veth)\n"
		"  --log-format F        text (default) or json: one JSON object per line\n",
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

int hg_switch_parse_opts(int argc, char **argv, struct opts *o)
{
	enum {
		O_IP = 256,
		O_UDP,
		O_PORT,
		O_CTL,
		O_LCORES,
		O_QUEUES,
		O_DROP,
		O_SEED,
		O_STATS,
		O_IDLE,
		O_IDLE_POLLS,
		O_IDLE_MAX,
		O_MBUFS,
		O_JOBS,
		O_NOREP,
		O_NOCSUM,
		O_MTU,
		O_RX_RING,
		O_LOG_FORMAT,
		O_HELP
	};
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
		{ "idle-max-us", required_argument, NULL, O_IDLE_MAX },
		{ "mbufs", required_argument, NULL, O_MBUFS },
		{ "max-jobs", required_argument, NULL, O_JOBS },
		{ "no-replicate", no_argument, NULL, O_NOREP },
		{ "no-udp-csum", no_argument, NULL, O_NOCSUM },
		{ "mtu", required_argument, NULL, O_MTU },
		{ "rx-ring", required_argument, NULL, O_RX_RING }, /* in enum order */
		{ "log-format", required_argument, NULL, O_LOG_FORMAT },
		{ "help", no_argument, NULL, O_HELP },
		{ NULL, 0, NULL, 0 },
	};
	struct in_addr a;
	unsigned long v;
	char *end;
	int c;

	*o = (struct opts){
		.ipv4 = 0x0A000001,
		.udp_port = HG_UDP_PORT,
		.port_id = 0,
		.control = "/run/homagg-switch.sock",
		.lcores = 1,
		.queues = 1,
		.drop_rate = 0.0,
		.seed = 1,
		.stats_interval = 0,
		.idle_us = 20,
		.idle_polls = 256,
		.idle_max_us = 1000,
		.mbufs = 8191,
		.rx_ring = 1024,
		.max_jobs = 64,
		.replicate = true,
		.udp_csum = true,
	};
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case O_IP:
			if (inet_pton(AF_INET, optarg, &a) != 1) {
				HG_LOG(ERR, "--port-ip: not an IPv4 address: %s",
				       optarg);
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
			if (errno || end == optarg || *end ||
			    !(o->drop_rate >= 0.0) || o->drop_rate > 1.0)
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
			if (errno || end == optarg || *end ||
			    !(o->stats_interval >= 0.0))
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
		case O_IDLE_MAX:
			if (parse_ulong(optarg, 0, 1000000, &v))
				goto bad;
			o->idle_max_us = (unsigned int)v;
			break;
		case O_MBUFS:
			if (parse_ulong(optarg, 1023, 1u << 24, &v))
				goto bad;
			o->mbufs = (unsigned int)v;
			break;
		case O_RX_RING:
			if (parse_ulong(optarg, 64, 32768, &v))
				goto bad;
			o->rx_ring = (unsigned int)v;
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
		case O_LOG_FORMAT:
			/* applied before the EAL starts: hg_switch_log_format() */
			if (strcmp(optarg, "text") && strcmp(optarg, "json")) {
				HG_LOG(ERR,
				       "--log-format: must be text or json, not %s",
				       optarg);
				return -EINVAL;
			}
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

bool hg_switch_log_json_wanted(int argc, char **argv)
{
	bool json = false;
	int i = 1;

	while (i < argc && strcmp(argv[i], "--"))
		i++;
	for (; i < argc; i++) {
		if (strcmp(argv[i], "--log-format") == 0 && i + 1 < argc)
			json = strcmp(argv[++i], "json") == 0;
		else if (strncmp(argv[i], "--log-format=", 13) == 0)
			json = strcmp(argv[i] + 13, "json") == 0;
	}
	return json;
}
