/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lhc_stall_sim.c - measures how often lhc peeling stalls, per candidate
 * count n, through the public codec API (docs/PROTOCOL.md "Sketch sizing").
 *
 * For each n: blocks of 65536 elements (one worker), each with exactly n
 * non-zero elements at uniformly random distinct positions, a new seed per
 * round; the full pipeline index -> sketch -> peel is run and the stalled
 * blocks are counted.  Usage: lhc_stall_sim [cells_per_candidate] [blocks] [n]
 * (0 = the protocol's default sizing) [only_this_n].
 *
 * Built by `make tools` (build/release/tools/lhc_stall_sim).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "homagg/codec.h"
#include "homagg/mix.h"

#define BLOCK 65536u

static uint64_t rng_state = 0x1234567ull;

static uint64_t rng(void)
{
	return hg_splitmix64(&rng_state);
}

int main(int argc, char **argv)
{
	static const uint32_t ns[] = { 1,   2,    3,    4,     6,    8,   12,
				       16,  24,   32,   48,    64,   128, 256,
				       512, 1024, 4096, 16384, 65536 };
	float cpc = argc > 1 ? strtof(argv[1], NULL) : 0.0f;
	size_t total_blocks = argc > 2 ? strtoul(argv[2], NULL, 0) : 20000;
	uint32_t only = argc > 3 ? (uint32_t)strtoul(argv[3], NULL, 0) : 0;

	printf("%8s %8s %10s %10s %12s\n", "n", "cells", "blocks", "stalled",
	       "stall_rate");
	for (size_t t = 0; t < sizeof(ns) / sizeof(ns[0]); t++) {
		uint32_t n = ns[t];
		if (only && n != only)
			continue;
		size_t nb = 64, rounds, stalled = 0, cells = 0, blocks = 0;
		size_t len = nb * BLOCK;
		float *x = calloc(len, sizeof(float));
		int8_t *codes = malloc(nb);
		uint8_t *counts = malloc(4 * nb);
		uint32_t *perm = malloc(BLOCK * sizeof(uint32_t));

		rounds = (total_blocks + nb - 1) / nb;
		/* large n costs more per block: fewer blocks suffice */
		if (n >= 4096)
			rounds = rounds / 8 + 1;
		for (size_t r = 0; r < rounds; r++) {
			struct hg_params p = { .block = BLOCK,
					       .workers = 1,
					       .seed = rng(),
					       .sketch_cells_per_candidate = cpc };
			struct hg_lhc_info info;
			struct hg_lhc *l;
			uint8_t *idx, *sk;

			memset(x, 0, len * sizeof(float));
			for (size_t b = 0; b < nb; b++) {
				for (uint32_t i = 0; i < BLOCK; i++)
					perm[i] = i;
				for (uint32_t i = 0; i < n; i++) {
					uint32_t j = i + (uint32_t)(rng() %
								    (BLOCK - i));
					uint32_t tmp = perm[i];

					perm[i] = perm[j];
					perm[j] = tmp;
					x[b * BLOCK + perm[i]] = 1.0f + (float)i;
				}
			}
			if (hg_exp_nnz_encode(&p, x, len, codes, counts, NULL))
				return 1;
			/* claim full blocks: the plan picks bitmaps, so the
			 * candidates are exactly the n non-zeros */
			for (size_t b = 0; b < nb; b++)
				memcpy(counts + 4 * b, "\0\1\0\0", 4);
			l = hg_lhc_create(&p, len, codes, counts);
			hg_lhc_get_info(l, &info);
			idx = malloc(info.index_bytes);
			hg_lhc_index_encode(l, x, idx);
			hg_lhc_set_index(l, idx);
			hg_lhc_get_info(l, &info);
			sk = malloc(4 * info.sketch_lanes);
			hg_lhc_sketch_encode(l, x, sk);
			if (hg_lhc_peel(l, sk))
				return 2;
			hg_lhc_get_info(l, &info);
			stalled += info.stalled_blocks;
			cells = info.sketch_lanes / nb;
			blocks += nb;
			free(idx);
			free(sk);
			hg_lhc_destroy(l);
		}
		printf("%8u %8zu %10zu %10zu %12.5f\n", n, cells, blocks,
		       stalled, (double)stalled / (double)blocks);
		fflush(stdout);
		free(x);
		free(codes);
		free(counts);
		free(perm);
	}
	return 0;
}
