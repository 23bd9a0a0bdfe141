/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: the wire parser and the engine on an in-memory port with
 * three jobs, the third authenticated with a fixed secret (the seed corpus,
 * corpus_engine/, is written by make_corpus.py for them, its job 3 frames
 * with valid MACs).  The input is a sequence of records
 *
 *   ctl (1 byte) | len (2 bytes, big-endian) | frame (len bytes)
 *
 * ctl bit 0: recompute the frame's IPv4 header checksum, bit 1: zero its
 * UDP checksum, so the fuzzer reaches the engine past the checksums; bit 2
 * of the first record: engine without UDP checksums; bit 3: leave the frame
 * queued, to reach the engine in one burst with the frames after it.  Every
 * frame the engine transmits must itself parse as a valid RESULT or STATUS
 * frame, and no buffer may leak.  A second engine takes the same frames one
 * at a time through the full parser only (hg_engine_set_staging(false));
 * both must send the same frames, byte for byte, and end with the same
 * counters: the staged path and its fast path change nothing.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "homagg/counters.h"
#include "homagg/engine.h"
#include "homagg/port_mem.h"
#include "homagg/wire.h"

#define POOL 96
#define BUF 2048

static void fix_ip_csum(uint8_t *f, size_t len)
{
	size_t ihl;
	uint32_t s = 0;

	if (len < 34)
		return;
	ihl = (size_t)(f[14] & 0x0f) * 4;
	if (ihl < 20 || 14 + ihl > len)
		return;
	f[24] = f[25] = 0;
	for (size_t i = 0; i < ihl; i += 2)
		s += (uint32_t)(f[14 + i] << 8 | f[15 + i]);
	while (s >> 16)
		s = (s & 0xffff) + (s >> 16);
	s = ~s & 0xffff;
	f[24] = (uint8_t)(s >> 8);
	f[25] = (uint8_t)s;
}

/* The target's jobs (make_corpus.py's JOBS); job 3's secret is 1, 2, .., 32. */
static const struct {
	uint32_t job, token, group_ipv4;
	uint16_t workers, slots, payload_bytes, shard;
	uint8_t auth;
} jobs[] = {
	{ .job = 1,
	  .token = 77,
	  .workers = 3,
	  .slots = 4,
	  .payload_bytes = 1024,
	  .group_ipv4 = 0xef010203 },
	{ .job = 2, .token = 99, .workers = 2, .slots = 1, .payload_bytes = 64, .shard = 1 },
	{ .job = 3, .token = 55, .workers = 2, .slots = 2, .payload_bytes = 256, .auth = 1 },
};

/* One engine on its own in-memory port, with the target's jobs. */
struct side {
	struct hg_port_mem *m;
	struct hg_engine *e;
};

static void side_create(struct side *sd, const uint8_t *data, size_t size,
			bool staged)
{
	struct hg_port_mem_config pc;
	struct hg_engine_config ec;
	struct hg_job_config jc;

	hg_port_mem_config_init(&pc);
	pc.pool = POOL;
	pc.buf_size = BUF;
	pc.can_replicate = size && (data[size - 1] & 1);
	sd->m = hg_port_mem_create(&pc);
	if (!sd->m)
		abort();
	hg_engine_config_init(&ec);
	ec.port = hg_port_mem_port(sd->m);
	ec.max_jobs = 4;
	if (size && (data[0] & 4))
		ec.flags = 0;
	sd->e = hg_engine_create(&ec);
	if (!sd->e || hg_engine_set_staging(sd->e, staged))
		abort();
	for (size_t k = 0; k < sizeof(jobs) / sizeof(jobs[0]); k++) {
		memset(&jc, 0, sizeof(jc));
		jc.job = jobs[k].job;
		jc.token = jobs[k].token;
		jc.workers = jobs[k].workers;
		jc.slots = jobs[k].slots;
		jc.payload_bytes = jobs[k].payload_bytes;
		jc.group_ipv4 = jobs[k].group_ipv4;
		jc.shard = jobs[k].shard;
		jc.incarnation = 7;
		jc.auth = jobs[k].auth;
		jc.mac = HG_MAC_BLAKE2B; /* make_corpus.py's MAC: any host has it */
		for (size_t i = 0; jc.auth && i < sizeof(jc.secret); i++)
			jc.secret[i] = (uint8_t)(i + 1); /* make_corpus.py's SECRET */
		if (hg_engine_add_job(sd->e, &jc))
			abort();
	}
}

/* Poll both engines until their ports are drained; what they send must be
 * the same and well formed. */
static void poll_both(struct side *sd)
{
	static uint8_t out[2][BUF];

	while (hg_engine_poll(sd[0].e) > 0)
		;
	while (hg_engine_poll(sd[1].e) > 0)
		;
	for (;;) {
		struct hg_wire_view v;
		int n = hg_port_mem_pop_tx(sd[0].m, out[0], sizeof(out[0]));
		int n1 = hg_port_mem_pop_tx(sd[1].m, out[1], sizeof(out[1]));

		if (n != n1 || (n > 0 && memcmp(out[0], out[1], (size_t)n)))
			abort();
		if (n <= 0)
			break;
		if (hg_wire_parse(out[0], (size_t)n, 0, HG_WIRE_F_UDP_CSUM, &v) ||
		    !(v.hdr.flags & (HG_FLAG_RESULT | HG_FLAG_STATUS)))
			abort();
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint64_t cnt[2][HG_CNT__COUNT];
	struct side sd[2];
	uint8_t frame[BUF];
	size_t off = 0;

	side_create(&sd[0], data, size, true);
	side_create(&sd[1], data, size, false);
	while (off + 3 <= size) {
		uint8_t ctl = data[off];
		size_t len = (size_t)data[off + 1] << 8 | data[off + 2];
		int r0, r1;

		off += 3;
		if (len > size - off)
			len = size - off;
		if (len > BUF)
			len = BUF;
		memcpy(frame, data + off, len);
		off += len;
		if ((ctl & 2) && len >= 42)
			frame[40] = frame[41] = 0;
		if (ctl & 1)
			fix_ip_csum(frame, len);
		r0 = hg_port_mem_inject(sd[0].m, frame, len);
		r1 = hg_port_mem_inject(sd[1].m, frame, len);
		if (r0 != r1)
			abort();
		if (!(ctl & 8) || r0)
			poll_both(sd);
	}
	poll_both(sd);
	for (int k = 0; k < 2; k++) {
		if (hg_engine_counters(sd[k].e, cnt[k], HG_CNT__COUNT) !=
			    HG_CNT__COUNT ||
		    hg_port_mem_free_count(sd[k].m) != POOL)
			abort();
	}
	if (memcmp(cnt[0], cnt[1], sizeof(cnt[0])))
		abort();
	for (int k = 0; k < 2; k++) {
		hg_engine_destroy(sd[k].e);
		hg_port_mem_destroy(sd[k].m);
	}
	return 0;
}
