/* SPDX-License-Identifier: Apache-2.0 */
/*
 * switch_bench.c - homagg-switch-bench: packets per second of the
 * aggregator's data path on one lcore.
 *
 *   homagg-switch-bench [EAL args] -- [--workers W] [--slots S]
 *                       [--payload BYTES] [--seconds T] [--auth]
 *                       [--mac umac|aes-gmac|blake2b] [--json]
 *
 * One process, two lcores, net_ring between them: the engine lcore runs
 * exactly the daemon's data path (hg_engine_poll over hg_dpdk_port on an
 * ethdev made by rte_eth_from_rings), the generator lcore (the main one)
 * copies pre-built SUM32 frames of W workers into fresh mbufs, patches the
 * chunk sequence number, slot and shadow flag, enqueues them on the
 * engine's rx ring and frees the results from its tx ring.  The rate is
 * the engine's "received" counter over the measured interval; every frame
 * must also be "summed" (no drops), which the program checks.  With one
 * lcore both run in turn on it (the figure is then a lower bound).
 *
 * --auth: the job authenticates (a random secret); the generator MACs every
 * frame it patches with its worker's key (a new MAC counter per frame),
 * the engine verifies each one and MACs its results (docs/PROTOCOL.md
 * "Authentication"); --mac picks the algorithm (default: the host's,
 * hg_auth_default_mac()).
 *
 * The baseline, measured in the same run after the engine: for half the
 * time the engine lcore only pulls (receives each frame through the same
 * port, reads one byte of each of its cache lines, frees it).  Its
 * capacity ("pull_mpps") is what moving the frames from the generator's
 * core to this one costs on the machine, without the engine; the engine's
 * capacity is reported as a fraction of it ("engine_vs_pull").
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rte_cycles.h>
#include <rte_eal.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_memcpy.h>
#include <rte_ring.h>

#include <sodium.h>

#include "homagg/auth.h"
#include "homagg/codec.h"
#include "homagg/counters.h"
#include "homagg/errors.h"
#include "homagg/engine.h"
#include "homagg/kernels.h"
#include "homagg/wire.h"
#include "port_dpdk.h"
#include "../../src/auth_pvt.h"
#include "../../src/wire_pvt.h"

#define GEN_BURST 32
#define RING_SIZE 4096

enum lcore_mode { MODE_ENGINE, MODE_PULL };

struct bench {
	unsigned int workers, slots, payload;
	double seconds;
	bool json;
	bool auth;
	uint8_t secret[HG_AUTH_SECRET_LEN];
	struct hg_mac_key *keys; /* auth: one per worker */
	uint64_t *ctr;           /* auth: each worker's MAC counter */
	uint32_t mac;            /* auth: HG_MAC_* */
	struct rte_mempool *pool;
	struct rte_ring *to_engine, *from_engine;
	uint16_t port_id;
	struct hg_dpdk_port *dport;
	struct hg_port port;
	struct hg_engine *eng;
	uint8_t *tmpl; /* workers frames of flen bytes */
	uint16_t flen;
	volatile bool stop;
	volatile int mode; /* enum lcore_mode, set by the main lcore */
	uint16_t burst;    /* frames per poll, the engine's */
	uint64_t polls, empty_polls; /* written by the engine lcore only */
	uint64_t busy_tsc;  /* cycles spent in polls that received frames */
	uint64_t poll_cap;  /* longest credible poll, cycles */
	uint64_t preempted; /* polls longer than that */
	uint64_t gen_full;  /* generator found the rx ring full */
	uint64_t results;
	uint64_t alloc_fail;     /* generator found the pool empty */
	uint64_t pull_tsc;       /* MODE_PULL: busy cycles, as busy_tsc */
	uint64_t pulled;         /* MODE_PULL: frames pulled */
	uint64_t pull_preempted; /* MODE_PULL: polls longer than poll_cap */
	uint64_t pull_sink;      /* the bytes read, so the reads stay */
};

/*
 * One engine poll, timed.  A poll that took longer than poll_cap cycles was
 * preempted (a 64-frame burst in 250 us would be under 0.26 Mpps, below
 * the slowest path measured: the portable MAC at 8 KB, 32 frames in about
 * 51 us, which a cap of 50 us clipped): on a shared machine the thread is
 * descheduled for milliseconds, which is not the engine's cost, so such a
 * poll counts poll_cap cycles.  The clock read
 * costs ~20 ns per poll of up to 32 frames.
 */
static inline void add_busy(const struct bench *b, uint64_t t0, uint64_t *busy,
			    uint64_t *preempted)
{
	uint64_t d = rte_rdtsc() - t0;

	if (d > b->poll_cap) {
		d = b->poll_cap;
		(*preempted)++;
	}
	*busy += d;
}

static inline void timed_poll(struct bench *b)
{
	uint64_t t = rte_rdtsc();

	b->polls++;
	if (hg_engine_poll(b->eng) == 0) {
		b->empty_polls++;
		return;
	}
	add_busy(b, t, &b->busy_tsc, &b->preempted);
}

/*
 * One pull poll (the baseline): a burst from the same port, one byte read
 * from each cache line of every frame, the burst freed; timed and capped
 * as timed_poll().
 */
static inline void timed_pull(struct bench *b)
{
	struct hg_pkt *pk[HG_ENGINE_MAX_BURST];
	uint64_t t = rte_rdtsc(), sum = 0;
	uint16_t n = hg_port_rx(&b->port, pk, b->burst), i;

	if (!n)
		return;
	for (i = 0; i < n; i++) {
		const uint8_t *f = pk[i]->data, *end = f + pk[i]->len;
		const uint8_t *l = (const uint8_t *)((uintptr_t)f & ~(uintptr_t)63);

		for (; l < end; l += 64)
			sum += *(l < f ? f : l);
	}
	hg_port_free(&b->port, pk, n);
	b->pull_sink += sum;
	b->pulled += n;
	add_busy(b, t, &b->pull_tsc, &b->pull_preempted);
}

static inline void serve(struct bench *b)
{
	if (b->mode == MODE_PULL)
		timed_pull(b);
	else
		timed_poll(b);
}

static int engine_loop(void *arg)
{
	struct bench *b = arg;

	while (!b->stop)
		serve(b);
	return 0;
}

/* Frame of worker w (seq 0) into the template table. */
static int build_templates(struct bench *b)
{
	struct hg_wire_addr src, dst = { .mac = { 0x02, 0, 0, 0, 0, 1 },
					 .ipv4 = 0x0A000001,
					 .port = HG_UDP_PORT };
	uint8_t *payload = malloc(b->payload);
	unsigned int w, i;
	int len = 0;

	if (!payload)
		return -ENOMEM;
	b->flen = (uint16_t)(HG_ETH_IP_UDP_LEN + HG_HDR_LEN + b->payload +
			     (b->auth ? HG_MAC_LEN : 0));
	b->tmpl = calloc(b->workers, b->flen);
	if (!b->tmpl) {
		free(payload);
		return -ENOMEM;
	}
	for (w = 0; w < b->workers; w++) {
		struct hg_hdr h = {
			.version = HG_PROTOCOL_VERSION,
			.op = HG_OP_SUM32,
			.job = 1,
			.token = 0xBEEF,
			.worker = (uint16_t)w,
			.lanes = (uint16_t)(b->payload / 4),
			.incarnation = 1,
		};
		src = (struct hg_wire_addr){ .mac = { 0x02, 0, 0, 0, 1, (uint8_t)w },
					     .ipv4 = 0x0A000100 + w,
					     .port = 40000 };
		for (i = 0; i < b->payload; i++)
			payload[i] = (uint8_t)(i * 7 + w);
		len = hg_wire_build_keyed(b->tmpl + (size_t)w * b->flen, b->flen,
					  &src, &dst, &h, payload, b->payload,
					  0, b->auth ? &b->keys[w] : NULL,
					  HG_AUTH_DIR_REQUEST, 0);
		if (len != b->flen) {
			free(payload);
			return len < 0 ? len : -EPROTO;
		}
	}
	free(payload);
	return 0;
}

/* Generate until stop; returns frames enqueued. */
static uint64_t generate(struct bench *b, uint64_t until_tsc, bool share_lcore,
			 uint32_t *seq, unsigned int *worker)
{
	struct rte_mbuf *m[GEN_BURST];
	void *out[64];
	uint64_t sent = 0;
	unsigned int i, n;

	for (unsigned int iter = 0;
	     (iter & 63) || rte_get_tsc_cycles() < until_tsc; iter++) {
		n = rte_ring_dequeue_burst(b->from_engine, out, 64, NULL);
		if (n) {
			rte_pktmbuf_free_bulk((struct rte_mbuf **)out, n);
			b->results += n;
		}
		if (share_lcore)
			serve(b); /* the engine's share of this lcore */
		if (rte_ring_free_count(b->to_engine) < GEN_BURST) {
			b->gen_full++;
			continue;
		}
		if (rte_pktmbuf_alloc_bulk(b->pool, m, GEN_BURST) != 0) {
			b->alloc_fail++;
			continue;
		}
		for (i = 0; i < GEN_BURST; i++) {
			uint8_t *f = rte_pktmbuf_mtod(m[i], uint8_t *);
			uint8_t *h = f + HG_ETH_IP_UDP_LEN;
			uint32_t s = *seq;

			rte_memcpy(f, b->tmpl + (size_t)*worker * b->flen, b->flen);
			hg_wr16(h + 2, (((s / b->slots) & 1) ? HG_FLAG_SHADOW : 0) |
					       (b->auth ? HG_FLAG_AUTH : 0));
			hg_wr16(h + 14, (uint16_t)(s % b->slots));
			hg_st_be32(h + 16, s);
			if (b->auth) { /* what a worker computes per frame */
				uint64_t ctr = ++b->ctr[*worker];

				hg_st_be32(h + 28, (uint32_t)ctr);
				hg_mac_key_sign(&b->keys[*worker],
						HG_AUTH_DIR_REQUEST, ctr, h,
						HG_HDR_LEN + b->payload,
						h + HG_HDR_LEN + b->payload);
			}
			m[i]->data_len = b->flen;
			m[i]->pkt_len = b->flen;
			if (++*worker == b->workers) {
				*worker = 0;
				++*seq;
			}
		}
		n = rte_ring_enqueue_burst(b->to_engine, (void **)m, GEN_BURST,
					   NULL);
		if (n < GEN_BURST) /* cannot happen with one producer; be safe */
			rte_pktmbuf_free_bulk(m + n, GEN_BURST - n);
		sent += n;
	}
	return sent;
}

/*
 * Check hg_dpdk_port_fanout(): n clones of one frame, each header written
 * differently, sent through the port, must come out of the tx ring as n
 * whole frames (own header + the shared payload), and the shared payload
 * mbuf must return to the pool once all are freed.  Returns 0 or -EPROTO.
 */
static int check_fanout(struct bench *b)
{
	struct hg_pkt *src, *out[8];
	struct rte_mbuf *sm;
	void *got[8];
	uint16_t n, i, hdr = HG_ETH_IP_UDP_LEN + HG_HDR_LEN;
	unsigned int avail0;
	int rc = 0;

	if (hg_port_alloc(&b->port, &src, 1) != 1)
		return -ENOMEM;
	memcpy(src->data, b->tmpl, b->flen);
	src->len = b->flen;
	sm = src->priv;
	avail0 = rte_mempool_avail_count(b->pool);
	n = hg_dpdk_port_fanout(b->dport, src, hdr, out, 8);
	if (n != 8 || rte_mbuf_refcnt_read(sm) != 9)
		rc = -EPROTO;
	for (i = 0; i < n; i++)
		out[i]->data[0] = (uint8_t)(0xA0 + i); /* per-clone header */
	if (hg_port_tx(&b->port, out, n) != n)
		rc = -EPROTO;
	hg_port_free(&b->port, &src, 1); /* the clones keep the payload */
	if (rte_ring_dequeue_bulk(b->from_engine, got, n, NULL) != n)
		return -EPROTO;
	for (i = 0; i < n; i++) {
		struct rte_mbuf *m = got[i];
		uint8_t buf[HG_ETH_IP_UDP_LEN + HG_HDR_LEN + HG_MAX_PAYLOAD];
		const uint8_t *f;

		if (m->pkt_len != b->flen || m->nb_segs != 2)
			rc = -EPROTO;
		f = rte_pktmbuf_read(m, 0, b->flen, buf);
		if (!f || f[0] != 0xA0 + i ||
		    memcmp(f + 1, b->tmpl + 1, b->flen - 1) != 0)
			rc = -EPROTO;
		rte_pktmbuf_free(m);
	}
	/* every mbuf is back: the source, its clones and their headers */
	if (rte_mempool_avail_count(b->pool) != avail0 + 1)
		rc = -EPROTO;
	return rc;
}

static int parse(int argc, char **argv, struct bench *b)
{
	static const struct option lo[] = {
		{ "workers", required_argument, NULL, 'w' },
		{ "slots", required_argument, NULL, 's' },
		{ "payload", required_argument, NULL, 'p' },
		{ "seconds", required_argument, NULL, 't' },
		{ "json", no_argument, NULL, 'j' },
		{ "auth", no_argument, NULL, 'a' },
		{ "mac", required_argument, NULL, 'm' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	b->workers = 8;
	b->slots = 256;
	b->payload = HG_DEFAULT_PAYLOAD;
	b->seconds = 2.0;
	optind = 1;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 'w':
			b->workers = (unsigned int)atoi(optarg);
			break;
		case 's':
			b->slots = (unsigned int)atoi(optarg);
			break;
		case 'p':
			b->payload = (unsigned int)atoi(optarg);
			break;
		case 't':
			b->seconds = atof(optarg);
			break;
		case 'j':
			b->json = true;
			break;
		case 'a':
			b->auth = true;
			break;
		case 'm':
			if (!strcmp(optarg, "umac")) {
				b->mac = HG_MAC_UMAC;
			} else if (!strcmp(optarg, "aes-gmac")) {
				b->mac = HG_MAC_AES_GMAC;
			} else if (!strcmp(optarg, "blake2b")) {
				b->mac = HG_MAC_BLAKE2B;
			} else {
				fprintf(stderr,
					"--mac: umac, aes-gmac or blake2b, not %s\n",
					optarg);
				return -EINVAL;
			}
			b->auth = true;
			break;
		default:
			return -EINVAL;
		}
	}
	if (b->workers < 1 || b->workers > HG_MAX_WORKERS || b->slots < 1 ||
	    b->slots > HG_ENGINE_MAX_SLOTS || b->payload < 4 ||
	    b->payload % 4 || b->payload > HG_MAX_PAYLOAD || !(b->seconds > 0)) {
		fprintf(stderr,
			"bad arguments: --workers 1..%d, --slots 1..%d, "
			"--payload a multiple of 4 in 4..%d, --seconds > 0\n",
			HG_MAX_WORKERS, HG_ENGINE_MAX_SLOTS, HG_MAX_PAYLOAD);
		return -EINVAL;
	}
	return 0;
}

int main(int argc, char **argv)
{
	static struct bench bb;
	struct bench *b = &bb;
	struct hg_engine_config ec;
	struct hg_job_config jc;
	uint64_t c0[HG_CNT__COUNT], c1[HG_CNT__COUNT], hz, t0, t1, drops = 0;
	unsigned int engine_lcore, worker = 0, i;
	uint32_t seq = 0;
	bool share;
	int n, rc, ret;
	double mpps, engine_mpps, busy_frac, pull_mpps;
	uint64_t t_start;

	n = rte_eal_init(argc, argv);
	if (n < 0) {
		fprintf(stderr, "EAL: %s\n", rte_strerror(rte_errno));
		return 1;
	}
	if (parse(argc - n, argv + n, b) < 0)
		goto fail;
	/* one frame per mbuf, as in the daemon (a jumbo payload: 9216-byte
	 * data rooms); fewer mbufs for big frames keep the pool in -m 256 */
	b->pool = hg_dpdk_pool_create(
		"bench_pool", b->payload > 1400 ? 8191 : 16383,
		(uint16_t)RTE_MAX((unsigned int)RTE_MBUF_DEFAULT_DATAROOM,
				  RTE_ALIGN_CEIL(HG_ETH_IP_UDP_LEN + HG_HDR_LEN +
							 b->payload + 128,
						 1024)),
		(int)rte_socket_id());
	b->to_engine = rte_ring_create("bench_rx", RING_SIZE, (int)rte_socket_id(),
				       RING_F_SP_ENQ | RING_F_SC_DEQ);
	b->from_engine = rte_ring_create("bench_tx", RING_SIZE,
					 (int)rte_socket_id(),
					 RING_F_SP_ENQ | RING_F_SC_DEQ);
	if (!b->pool || !b->to_engine || !b->from_engine) {
		fprintf(stderr, "pool/rings: %s\n", rte_strerror(rte_errno));
		goto fail;
	}
	rc = rte_eth_from_rings("net_ring_bench", &b->to_engine, 1,
				&b->from_engine, 1, rte_socket_id());
	if (rc < 0) {
		fprintf(stderr, "rte_eth_from_rings: %s\n",
			rte_strerror(rte_errno));
		goto fail;
	}
	b->port_id = (uint16_t)rc;
	{
		struct rte_eth_conf conf;

		memset(&conf, 0, sizeof(conf));
		if (rte_eth_dev_configure(b->port_id, 1, 1, &conf) < 0 ||
		    rte_eth_rx_queue_setup(b->port_id, 0, RING_SIZE, 0, NULL,
					   b->pool) < 0 ||
		    rte_eth_tx_queue_setup(b->port_id, 0, RING_SIZE, 0, NULL) < 0 ||
		    rte_eth_dev_start(b->port_id) < 0) {
			fprintf(stderr, "port setup failed\n");
			goto fail;
		}
	}
	b->dport = hg_dpdk_port_create(
		&(struct hg_dpdk_port_conf){ .port_id = b->port_id,
					     .pool = b->pool,
					     .ipv4 = 0x0A000001,
					     .udp_port = HG_UDP_PORT,
					     .can_replicate = true });
	if (!b->dport)
		goto fail;
	b->port = hg_dpdk_port_ops(b->dport);
	hg_engine_config_init(&ec);
	ec.port = &b->port;
	b->burst = ec.burst;
	b->eng = hg_engine_create(&ec);
	if (!b->eng)
		goto fail;
	jc = (struct hg_job_config){ .job = 1,
				     .token = 0xBEEF,
				     .workers = b->workers,
				     .slots = b->slots,
				     .payload_bytes = b->payload,
				     .group_ipv4 = 0xEF010101,
				     .incarnation = 1,
				     .auth = b->auth };
	if (b->auth) {
		if (sodium_init() < 0)
			goto fail;
		if (!b->mac)
			b->mac = hg_auth_default_mac();
		if (b->mac != HG_MAC_BLAKE2B && hg_mac_isa() < 0) {
			fprintf(stderr, "HOMAGG_MAC_ISA=%s: %s\n",
				getenv("HOMAGG_MAC_ISA"),
				hg_mac_isa() == -EINVAL ?
					"names no MAC path: set it to portable, "
					"pclmul, avx2 or avx512, or unset it" :
					"this CPU lacks that path: force a lower one "
					"or unset it");
			goto fail;
		}
		if (!hg_auth_mac_available(b->mac)) {
			fprintf(stderr,
				"--mac %s: this CPU lacks AES-NI%s; use --mac blake2b\n",
				b->mac == HG_MAC_UMAC ? "umac" : "aes-gmac",
				b->mac == HG_MAC_UMAC ? "" : " or PCLMULQDQ");
			goto fail;
		}
		jc.mac = b->mac;
		randombytes_buf(b->secret, sizeof(b->secret));
		memcpy(jc.secret, b->secret, sizeof(jc.secret));
		if (posix_memalign((void **)&b->keys, 64,
				   b->workers * sizeof(*b->keys)))
			goto fail;
		memset(b->keys, 0, b->workers * sizeof(*b->keys));
		b->ctr = calloc(b->workers, sizeof(*b->ctr));
		if (!b->ctr)
			goto fail;
		for (i = 0; i < b->workers; i++)
			if (hg_mac_key_derive(&b->keys[i], b->mac, b->secret, 1,
					      i) < 0)
				goto fail;
	}
	rc = hg_engine_add_job(b->eng, &jc);
	if (rc < 0) {
		fprintf(stderr, "add_job: %s\n", hg_strerror(rc));
		goto fail;
	}
	rc = build_templates(b);
	if (rc < 0) {
		fprintf(stderr, "templates: %s\n", hg_strerror(rc));
		goto fail;
	}

	rc = check_fanout(b);
	if (rc < 0) {
		fprintf(stderr, "fan-out check failed: %s\n", hg_strerror(rc));
		goto fail;
	}

	b->poll_cap = rte_get_tsc_hz() / 4000; /* 250 us */
	engine_lcore = rte_get_next_lcore(rte_lcore_id(), 1, 0);
	share = engine_lcore >= RTE_MAX_LCORE;
	if (!share && rte_eal_remote_launch(engine_loop, b, engine_lcore) != 0)
		goto fail;
	hz = rte_get_tsc_hz();
	t_start = rte_get_tsc_cycles();
	/* warm-up, then the measured interval */
	generate(b, rte_get_tsc_cycles() + hz / 4, share, &seq, &worker);
	hg_engine_counters(b->eng, c0, HG_CNT__COUNT);
	t0 = rte_get_tsc_cycles();
	generate(b, t0 + (uint64_t)(b->seconds * (double)hz), share, &seq, &worker);
	hg_engine_counters(b->eng, c1, HG_CNT__COUNT);
	t1 = rte_get_tsc_cycles();
	/* the baseline: the same frames only pulled, for half the time */
	b->mode = MODE_PULL;
	generate(b, rte_get_tsc_cycles() + (uint64_t)(b->seconds / 2 * (double)hz),
		 share, &seq, &worker);
	b->stop = true;
	if (!share)
		rte_eal_wait_lcore(engine_lcore);

	for (i = HG_CNT_STALE; i < HG_CNT__COUNT; i++)
		drops += c1[i] - c0[i];
	mpps = (double)(c1[HG_CNT_RECEIVED] - c0[HG_CNT_RECEIVED]) /
	       ((double)(t1 - t0) / (double)hz) / 1e6;
	/* the engine lcore's capacity: every frame it received (warm-up
	 * included) over the cycles of the polls that received frames */
	busy_frac = (double)b->busy_tsc / (double)(t1 - t_start);
	engine_mpps = b->busy_tsc ?
			      (double)c1[HG_CNT_RECEIVED] /
				      ((double)b->busy_tsc / (double)hz) / 1e6 :
			      0.0;
	pull_mpps = b->pull_tsc ?
			    (double)b->pulled /
				    ((double)b->pull_tsc / (double)hz) / 1e6 :
			    0.0;
	if (b->json)
		printf("{\"workers\":%u,\"mpps\":%.3f,\"engine_mpps\":%.3f,"
		       "\"gbps\":%.2f,\"payload_gbps\":%.2f,"
		       "\"engine_payload_gbps\":%.2f,\"payload\":%u,\"frame\":%u,\"slots\":%u,"
		       "\"seconds\":%.3f,\"lcores\":%u,\"isa\":\"%s\","
		       "\"received\":%" PRIu64 ",\"summed\":%" PRIu64
		       ",\"completed\":%" PRIu64 ",\"drops\":%" PRIu64
		       ",\"engine_busy\":%.4f,\"generator_blocked\":%" PRIu64
		       ",\"generator_no_mbuf\":%" PRIu64
		       ",\"preempted_polls\":%" PRIu64
		       ",\"pull_mpps\":%.3f,\"pull_payload_gbps\":%.2f"
		       ",\"engine_vs_pull\":%.3f,\"pulled\":%" PRIu64
		       ",\"auth\":%s,\"mac\":\"%s\",\"mac_isa\":\"%s\""
		       ",\"fanout_checked\":true}\n",
		       b->workers, mpps, engine_mpps,
		       mpps * 1e6 * b->flen * 8 / 1e9,
		       mpps * 1e6 * b->payload * 8 / 1e9,
		       engine_mpps * 1e6 * b->payload * 8 / 1e9, b->payload,
		       b->flen, b->slots, (double)(t1 - t0) / (double)hz,
		       share ? 1u : 2u, hg_isa_name(hg_isa_best()),
		       c1[HG_CNT_RECEIVED] - c0[HG_CNT_RECEIVED],
		       c1[HG_CNT_SUMMED] - c0[HG_CNT_SUMMED],
		       c1[HG_CNT_COMPLETED] - c0[HG_CNT_COMPLETED], drops,
		       busy_frac, b->gen_full, b->alloc_fail, b->preempted,
		       pull_mpps, pull_mpps * 1e6 * b->payload * 8 / 1e9,
		       pull_mpps > 0 ? engine_mpps / pull_mpps : 0.0, b->pulled,
		       b->auth ? "true" : "false",
		       !b->auth                  ? "none" :
		       b->mac == HG_MAC_AES_GMAC ? "aes-gmac" :
		       b->mac == HG_MAC_UMAC     ? "umac" :
						   "blake2b",
		       b->auth && b->mac != HG_MAC_BLAKE2B ?
			       hg_mac_isa_name(hg_mac_isa()) :
			       "none");
	else
		printf("W=%u payload=%u: %.3f Mpps end to end (%.2f Gbit/s of "
		       "%u-byte frames, %.2f Gbit/s of payload, %s), engine lcore "
		       "capacity %.3f Mpps (%.2f Gbit/s of payload) = %.2f of an "
		       "lcore that only pulls the frames (%.3f Mpps), %" PRIu64
		       " drops\n",
		       b->workers, b->payload, mpps, mpps * 1e6 * b->flen * 8 / 1e9,
		       b->flen, mpps * 1e6 * b->payload * 8 / 1e9,
		       share ? "generator and engine on one lcore" :
			       "generator and engine on two lcores",
		       engine_mpps, engine_mpps * 1e6 * b->payload * 8 / 1e9,
		       pull_mpps > 0 ? engine_mpps / pull_mpps : 0.0, pull_mpps,
		       drops);
	ret = drops ? 2 : 0;
	goto out;
fail:
	ret = 1;
out:
	for (i = 0; b->keys && i < b->workers; i++)
		hg_mac_key_release(&b->keys[i]);
	free(b->keys);
	free(b->ctr);
	hg_auth_wipe(b->secret, sizeof(b->secret));
	hg_engine_destroy(b->eng);
	hg_dpdk_port_destroy(b->dport);
	free(b->tmpl);
	rte_eal_cleanup();
	return ret;
}
