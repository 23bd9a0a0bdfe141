/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The engine benchmark (homagg/bench.h).
 *
 * A null port hands out scratch buffers for unicast results and drops
 * whatever is transmitted, so only the engine is measured.  The S * W input
 * frames are built once; each round re-stamps their seq and shadow flag (six
 * bytes; a frame the engine turned into a result gets its whole 74-byte
 * header back), which is part of the measured loop.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "homagg/bench.h"
#include "homagg/codec.h"
#include "homagg/counters.h"
#include "homagg/engine.h"
#include "homagg/port.h"
#include "homagg/wire.h"
#include "wire_pvt.h"

#define SCRATCH 1024
#define BENCH_ROUNDS 10
#define META_SCRATCH 1u

struct bench_port {
	struct hg_pkt *scratch_free[SCRATCH];
	uint32_t nscratch;
	struct hg_pkt scratch[SCRATCH];
	uint8_t *scratch_mem;
	bool multicast;
	uint64_t sent;
};

static void bp_release(struct bench_port *b, struct hg_pkt **p, uint16_t n)
{
	for (uint16_t i = 0; i < n; i++)
		if (p[i]->meta == META_SCRATCH)
			b->scratch_free[b->nscratch++] = p[i];
}

static uint16_t bp_rx(void *ctx, struct hg_pkt **p, uint16_t n)
{
	(void)ctx;
	(void)p;
	(void)n;
	return 0;
}

static uint16_t bp_tx(void *ctx, struct hg_pkt **p, uint16_t n)
{
	struct bench_port *b = ctx;

	b->sent += n;
	bp_release(b, p, n);
	return n;
}

static uint16_t bp_alloc(void *ctx, struct hg_pkt **p, uint16_t n)
{
	struct bench_port *b = ctx;
	uint16_t i;

	for (i = 0; i < n && b->nscratch; i++)
		p[i] = b->scratch_free[--b->nscratch];
	return i;
}

static void bp_free(void *ctx, struct hg_pkt **p, uint16_t n)
{
	bp_release(ctx, p, n);
}

static int bp_info(void *ctx, struct hg_port_info *info)
{
	struct bench_port *b = ctx;

	memset(info, 0, sizeof(*info));
	info->mac[0] = 0x02;
	info->mac[5] = 0x01;
	info->ipv4 = 0x0a0000fe;
	info->udp_port = HG_UDP_PORT;
	info->mtu = 9000;
	info->can_replicate = b->multicast;
	return 0;
}

static uint64_t bp_now(void *ctx)
{
	(void)ctx;
	return 0;
}

static const struct hg_port_ops bench_ops = {
	.rx_burst = bp_rx,
	.tx_burst = bp_tx,
	.alloc_bulk = bp_alloc,
	.free_bulk = bp_free,
	.get_info = bp_info,
	.now_ns = bp_now,
	.join_group = NULL,
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void hg_bench_engine_config_init(struct hg_bench_engine_config *c)
{
	if (!c)
		return;
	memset(c, 0, sizeof(*c));
	c->workers = 8;
	c->payload_bytes = HG_DEFAULT_PAYLOAD;
	c->slots = 16;
	c->burst = 32;
	c->seconds = 1.0;
	c->multicast = true;
	c->udp_csum = false;
	c->isa = HG_ISA_BEST;
}

/* xorshift64: payload contents (any values; sums wrap). */
static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Stamp seq and shadow flag fl into a frame (its slot is fixed); with
 * checksums, recompute the UDP checksum over the whole datagram, as a
 * sender without offload would. */
static inline void stamp(uint8_t *f, uint32_t seq, uint16_t fl, bool csum,
			 size_t plen)
{
	hg_wr16(f + HG_OFF_HDR + 2, fl);
	hg_st_be32(f + HG_OFF_HDR + 16, seq);
	if (csum) {
		f[HG_OFF_UDP + 6] = f[HG_OFF_UDP + 7] = 0;
		hg_wire_put_udp_csum(f, hg_csum_add(0, f + HG_OFF_HDR,
						    HG_HDR_LEN + plen));
	}
}

int hg_bench_engine(const struct hg_bench_engine_config *c,
		    struct hg_bench_engine_result *r)
{
	struct hg_engine_config ec;
	struct hg_job_config jc;
	struct hg_port port;
	struct bench_port *bp;
	struct hg_engine *e = NULL;
	struct hg_pkt *pk = NULL, **order = NULL;
	uint8_t *mem = NULL, *tmpl = NULL, *accs = NULL;
	uint64_t cnt[HG_CNT__COUNT], seed = 0x9e3779b97f4a7c15ull;
	hg_kernel_fn kern;
	size_t plen, flen, cap, npk;
	uint32_t W, S, lanes, seq = 0;
	double t0, t1, rate;
	int rc = -ENOMEM;

	if (!c || !r)
		return -EINVAL;
	W = c->workers;
	S = c->slots;
	plen = c->payload_bytes;
	if (W < 1 || W > HG_MAX_WORKERS || S < 1 || S > 4096 || plen < 4 ||
	    plen > HG_MAX_PAYLOAD || plen % 4 || c->burst < 1 ||
	    c->burst > HG_ENGINE_MAX_BURST || c->seconds <= 0)
		return -ERANGE;
	kern = hg_kernel(HG_OP_SUM32, c->isa);
	if (!kern)
		return -EINVAL;
	memset(r, 0, sizeof(*r));
	lanes = (uint32_t)(plen / 4);
	flen = HG_OFF_PAYLOAD + plen;
	cap = (flen + 63) & ~(size_t)63;
	npk = (size_t)S * W;

	bp = calloc(1, sizeof(*bp));
	if (!bp)
		goto out;
	bp->multicast = c->multicast;
	bp->scratch_mem = malloc((size_t)SCRATCH * cap);
	pk = calloc(npk, sizeof(*pk));
	order = calloc(npk, sizeof(*order));
	tmpl = malloc((size_t)W * HG_OFF_PAYLOAD);
	if (posix_memalign((void **)&mem, 64, npk * cap))
		mem = NULL;
	if (posix_memalign((void **)&accs, 64, (size_t)S * cap))
		accs = NULL;
	if (!bp->scratch_mem || !pk || !order || !tmpl || !mem || !accs)
		goto out;
	for (uint32_t i = 0; i < SCRATCH; i++) {
		bp->scratch[i].data = bp->scratch_mem + (size_t)i * cap;
		bp->scratch[i].cap = (uint16_t)cap;
		bp->scratch[i].meta = META_SCRATCH;
		bp->scratch_free[bp->nscratch++] = &bp->scratch[i];
	}
	port.ops = &bench_ops;
	port.ctx = bp;

	/* Frames: chunk-major (all W frames of chunk 0, then chunk 1, ...). */
	for (uint32_t w = 0; w < W; w++) {
		struct hg_wire_addr src = { { 2, 0, 0, 1, (uint8_t)(w >> 8),
					      (uint8_t)w },
					    0x0a010000u + w,
					    (uint16_t)(40000 + w) };
		struct hg_wire_addr dst = { { 2, 0, 0, 0, 0, 1 },
					    0x0a0000fe,
					    HG_UDP_PORT };
		struct hg_hdr h = { .version = HG_PROTOCOL_VERSION,
				    .op = HG_OP_SUM32,
				    .job = 1,
				    .token = 77,
				    .worker = (uint16_t)w,
				    .lanes = (uint16_t)lanes,
				    .incarnation = 1 };

		hg_wire_build(tmpl + (size_t)w * HG_OFF_PAYLOAD, HG_OFF_PAYLOAD,
			      &src, &dst, &h, NULL, 0, 0);
		/* The template's lengths are those of the full frame. */
		hg_wire_put_l2l4(tmpl + (size_t)w * HG_OFF_PAYLOAD, &src,
				 dst.mac, dst.ipv4, dst.port, HG_HDR_LEN + plen);
	}
	for (uint32_t s = 0; s < S; s++) {
		for (uint32_t w = 0; w < W; w++) {
			size_t i = (size_t)s * W + w;
			uint8_t *f = mem + i * cap;

			memcpy(f, tmpl + (size_t)w * HG_OFF_PAYLOAD,
			       HG_OFF_PAYLOAD);
			hg_wr16(f + HG_OFF_HDR + 14, (uint16_t)s);
			for (size_t b = 0; b < plen; b += 8) {
				uint64_t x = rnd(&seed);

				memcpy(f + HG_OFF_PAYLOAD + b, &x,
				       plen - b < 8 ? plen - b : 8);
			}
			pk[i].data = f;
			pk[i].len = (uint16_t)flen;
			pk[i].cap = (uint16_t)cap;
		}
	}

	hg_engine_config_init(&ec);
	ec.port = &port;
	ec.max_jobs = 1;
	ec.flags = c->udp_csum ? HG_ENGINE_F_UDP_CSUM : 0;
	ec.isa = c->isa;
	e = hg_engine_create(&ec);
	if (!e)
		goto out;
	memset(&jc, 0, sizeof(jc));
	jc.job = 1;
	jc.token = 77;
	jc.workers = W;
	jc.slots = S;
	jc.payload_bytes = (uint32_t)plen;
	jc.group_ipv4 = c->multicast ? 0xef010203u : 0;
	rc = hg_engine_add_job(e, &jc);
	if (rc)
		goto out;

	/*
	 * The machine may be shared: engine and raw kernel run in alternating
	 * phases of seconds / BENCH_ROUNDS each, so both see the same noise;
	 * the best phase of each is reported next to the means.
	 */
	for (int round = 0; round < BENCH_ROUNDS; round++) {
		uint64_t before = r->packets;

		/* Engine: staged bursts, then (one_at_a_time) frame by frame. */
		for (int mode = 0; mode < (c->one_at_a_time ? 2 : 1); mode++) {
			uint64_t *packets = mode ? &r->one_packets : &r->packets;
			double *seconds = mode ? &r->one_seconds : &r->seconds;
			double *mpps = mode ? &r->one_mpps : &r->mpps;

			hg_engine_set_staging(e, mode == 0);
			before = *packets;
			t0 = now_s();
			do {
				for (int rep = 0; rep < 16; rep++) {
					size_t n = 0;

					for (uint32_t s = 0; s < S; s++, seq++) {
						/* once per chunk: a division per
						 * frame is not the engine's cost */
						uint16_t fl = ((seq / S) & 1) ?
								      HG_FLAG_SHADOW :
								      0;

						for (uint32_t w = 0; w < W; w++) {
							size_t i = (size_t)s * W + w;
							uint8_t *f = pk[i].data;

							/* Turned into a reply: restore its header. */
							if (f[HG_OFF_HDR + 3] &
							    (HG_FLAG_RESULT |
							     HG_FLAG_STATUS)) {
								memcpy(f,
								       tmpl + (size_t)w * HG_OFF_PAYLOAD,
								       HG_OFF_PAYLOAD);
								hg_wr16(f + HG_OFF_HDR +
										14,
									(uint16_t)s);
							}
							stamp(f, seq, fl,
							      c->udp_csum, plen);
							pk[i].len = (uint16_t)flen;
							order[n++] = &pk[i];
							if (n == c->burst) {
								hg_engine_process(
									e, order,
									(uint32_t)n);
								n = 0;
							}
						}
					}
					if (n)
						hg_engine_process(e, order,
								  (uint32_t)n);
					*packets += npk;
				}
				t1 = now_s();
			} while (t1 - t0 < c->seconds / BENCH_ROUNDS);
			*seconds += t1 - t0;
			rate = (double)(*packets - before) / (t1 - t0) / 1e6;
			if (rate > *mpps)
				*mpps = rate;
		}

		/* Raw kernel over the same payloads, same order, one accumulator per slot. */
		before = r->raw_packets;
		t0 = now_s();
		do {
			for (int rep = 0; rep < 16; rep++) {
				for (uint32_t s = 0; s < S; s++)
					for (uint32_t w = 0; w < W; w++)
						kern(accs + (size_t)s * cap,
						     pk[(size_t)s * W + w].data +
							     HG_OFF_PAYLOAD,
						     lanes, 0);
				r->raw_packets += npk;
			}
			t1 = now_s();
		} while (t1 - t0 < c->seconds / BENCH_ROUNDS);
		r->raw_seconds += t1 - t0;
		rate = (double)(r->raw_packets - before) / (t1 - t0) / 1e6;
		if (rate > r->raw_kernel_mpps)
			r->raw_kernel_mpps = rate;
	}
	r->mpps_mean = (double)r->packets / r->seconds / 1e6;
	if (r->one_seconds > 0)
		r->one_mpps_mean = (double)r->one_packets / r->one_seconds / 1e6;
	r->raw_kernel_mpps_mean = (double)r->raw_packets / r->raw_seconds / 1e6;
	hg_engine_counters(e, cnt, HG_CNT__COUNT);
	r->completed = cnt[HG_CNT_COMPLETED];
	r->results_sent = cnt[HG_CNT_RESULTS_SENT];
	for (int i = HG_CNT_STALE; i < HG_CNT__COUNT; i++)
		r->dropped += cnt[i];
	rc = 0;
out:
	hg_engine_destroy(e);
	free(accs);
	free(mem);
	free(tmpl);
	free(order);
	free(pk);
	if (bp)
		free(bp->scratch_mem);
	free(bp);
	return rc;
}
