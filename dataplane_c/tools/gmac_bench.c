/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gmac_bench.c - nanoseconds per AES-GMAC tag (or per tag of the MAC named
 * by HOMAGG_BENCH_MAC: umac, aes-gmac, blake2b) on the process's MAC path
 * (HOMAGG_MAC_ISA, homagg/auth.h "hg_mac_isa"), for frames of the given
 * lengths (header + payload bytes).
 *
 * Each length is timed in batches of 50 tags of one hot frame (the
 * counter, and so the nonce, changes every tag); the best batch is
 * printed, which on a shared machine is the one no other process
 * interrupted.  Then the same length as the engine checks it: bursts of
 * 32 distinct frames of 8 workers, each under its worker's key, through
 * hg_mac_key_check_burst() (the E_K(J0) batched, the next frame and key
 * prefetched), best of the same number of bursts, ns per frame: the
 * frames and the keys' tables no longer all fit in L1 (32 KB of frames at
 * 1 KB payloads), as in the engine.  It compares paths run one after the
 * other on the same machine; it is not the engine's rate (`homagg bench
 * switch --auth --mac-isa all` is).
 *
 * Usage: [HOMAGG_BENCH_MAC=umac] HOMAGG_MAC_ISA=avx2 gmac_bench [batches] [len ...]
 *        (default 4000 batches of 32, 1056, 4128 and 8224 bytes)
 *
 * Built by `make tools` (build/release/tools/gmac_bench).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "auth_pvt.h"
#include "homagg/auth.h"
#include "homagg/wire.h"

#define BATCH 50
#define BURST 32  /* frames per burst (the engine's) */
#define WORKERS 8 /* keys per burst */

static double now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
	static const size_t def_lens[] = { 32, 1056, 4128, 8224 };
	static uint8_t frame[9216];
	static uint8_t burst[BURST][9216 + HG_MAC_LEN];
	uint8_t key[HG_AUTH_KEY_LEN], mac[HG_MAC_LEN];
	long batches = argc > 1 ? atol(argv[1]) : 4000;
	int nlens = argc > 2 ? argc - 2 : 4;
	struct hg_mac_req req[BURST];
	struct hg_mac_key *k, *wk;
	unsigned sink = 0;
	int isa = hg_mac_isa();
	const char *alg_name = getenv("HOMAGG_BENCH_MAC");
	uint32_t alg = HG_MAC_AES_GMAC;

	if (isa < 0) {
		fprintf(stderr, "HOMAGG_MAC_ISA=%s: %s\n",
			getenv("HOMAGG_MAC_ISA"),
			isa == -EINVAL ?
				"names no MAC path: set it to portable, "
				"pclmul, avx2 or avx512, or unset it" :
				"this CPU lacks that path: force a lower one or unset it");
		return 1;
	}
	if (alg_name && *alg_name) {
		if (!strcmp(alg_name, "umac")) {
			alg = HG_MAC_UMAC;
		} else if (!strcmp(alg_name, "blake2b")) {
			alg = HG_MAC_BLAKE2B;
		} else if (strcmp(alg_name, "aes-gmac")) {
			fprintf(stderr,
				"HOMAGG_BENCH_MAC=%s: umac, aes-gmac or blake2b\n",
				alg_name);
			return 1;
		}
	}
	if (batches < 1) {
		fprintf(stderr, "batches: a positive count, not %s\n", argv[1]);
		return 1;
	}
	for (size_t i = 0; i < sizeof(frame); i++)
		frame[i] = (uint8_t)(i * 131 + 7);
	for (size_t i = 0; i < sizeof(key); i++)
		key[i] = (uint8_t)(i * 29 + 1);
	for (size_t f = 0; f < BURST; f++)
		for (size_t i = 0; i < sizeof(burst[f]); i++)
			burst[f][i] = (uint8_t)(i * 131 + f * 17 + 7);
	if (posix_memalign((void **)&k, 64, sizeof(*k)) ||
	    posix_memalign((void **)&wk, 64, WORKERS * sizeof(*wk)) ||
	    hg_mac_key_init(k, alg, key)) {
		fprintf(stderr,
			"no key of that MAC on this host (AES-NI needed)\n");
		return 1;
	}
	for (int w = 0; w < WORKERS; w++) {
		key[0] = (uint8_t)(w + 1);
		if (hg_mac_key_init(&wk[w], alg, key)) {
			fprintf(stderr, "no key of that MAC on this host\n");
			return 1;
		}
	}
	for (int l = 0; l < nlens; l++) {
		size_t len = argc > 2 ? strtoul(argv[2 + l], NULL, 10) :
					def_lens[l];
		double best = 1e300;
		uint64_t ctr = 1;

		if (len < 32 || len > sizeof(frame)) {
			fprintf(stderr, "len: 32..%zu bytes, not %zu\n",
				sizeof(frame), len);
			return 1;
		}
		for (long b = 0; b < batches; b++) {
			double t0 = now_ns(), t;

			for (int i = 0; i < BATCH; i++) {
				hg_mac_key_sign(k, HG_AUTH_DIR_REQUEST, ctr++,
						frame, len, mac);
				sink += mac[0];
			}
			t = (now_ns() - t0) / BATCH;
			if (t < best)
				best = t;
		}
		printf("%s %zu bytes: %.1f ns per tag\n", hg_mac_isa_name(isa),
		       len, best);
		best = 1e300;
		for (long b = 0; b < batches; b++) {
			double t0, t;

			for (int f = 0; f < BURST; f++)
				req[f] = (struct hg_mac_req){
					.k = &wk[f % WORKERS],
					.counter = ctr++,
					.data = burst[f],
					.len = len,
					.mac = burst[f] + len,
				};
			t0 = now_ns();
			hg_mac_key_check_burst(HG_AUTH_DIR_REQUEST, req, BURST);
			t = (now_ns() - t0) / BURST;
			for (int f = 0; f < BURST; f++)
				sink += req[f].ok;
			if (t < best)
				best = t;
		}
		printf("%s %zu bytes: %.1f ns per frame in bursts of %d, %d keys\n",
		       hg_mac_isa_name(isa), len, best, BURST, WORKERS);
	}
	for (int w = 0; w < WORKERS; w++)
		hg_mac_key_release(&wk[w]);
	free(wk);
	hg_mac_key_release(k);
	free(k);
	return sink == 0xFFFFFFFFu; /* keeps the tags computed */
}
