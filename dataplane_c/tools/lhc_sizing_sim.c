/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lhc_sizing_sim.c - expected wire bytes of one lhc block as a function of
 * its candidate count N and sub-table size T (docs/PROTOCOL.md "Sketch
 * sizing measurements").
 *
 * A block with N candidates costs 12 T sketch bytes plus 4 bytes per
 * candidate left unresolved by peeling (its fallback lane).  For each
 * (N, T) this runs R random blocks -- the protocol's cell mapping
 * (hg_hash with a fresh SKETCH key per trial, the same keys for every T of
 * one N: common random numbers make the T-curves smooth) -- peels them and
 * prints the stall rate, the mean unresolved count and the expected bytes
 * 12 T + 4 E[U], also against the bound 1.23 x 4 x N.
 *
 * Usage: lhc_sizing_sim N T_lo T_hi [T_step] [trials]
 *
 * Built by `make tools` (build/release/tools/lhc_sizing_sim).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hash_pvt.h"

struct sim {
	uint32_t *c;   /* 3 cells per candidate */
	uint32_t *cnt; /* per cell: candidates left */
	uint32_t *ids; /* per cell: XOR of the ranks left */
	uint32_t *stack;
	uint8_t *done;
};

/* Unresolved candidates of one random block (order-free peel). */
static uint32_t peel_once(struct sim *s, uint64_t key, uint32_t n, uint32_t t)
{
	uint32_t nc = 3 * t, sp = 0, left = n;

	memset(s->cnt, 0, nc * sizeof(*s->cnt));
	memset(s->ids, 0, nc * sizeof(*s->ids));
	memset(s->done, 0, n);
	for (uint32_t j = 0; j < n; j++) {
		uint64_t h = hg_hash(key, j);

		for (uint32_t r = 0; r < 3; r++) {
			uint32_t k = r * t +
				     (uint32_t)((((h >> (21 * r)) & 0x1FFFFFu) * t) >>
						21);

			s->c[3 * j + r] = k;
			s->cnt[k]++;
			s->ids[k] ^= j;
		}
	}
	for (uint32_t k = 0; k < nc; k++)
		if (s->cnt[k] == 1)
			s->stack[sp++] = k;
	while (sp) {
		uint32_t k = s->stack[--sp], j;

		if (s->cnt[k] != 1)
			continue;
		j = s->ids[k];
		left--;
		for (uint32_t r = 0; r < 3; r++) {
			uint32_t q = s->c[3 * j + r];

			s->cnt[q]--;
			s->ids[q] ^= j;
			if (s->cnt[q] == 1)
				s->stack[sp++] = q;
		}
	}
	return left;
}

static void run(struct sim *s, uint32_t n, uint32_t t, uint32_t trials)
{
	uint64_t unres = 0, stalled = 0;

	for (uint32_t i = 0; i < trials; i++) {
		uint64_t key = hg_mix64(0x51A11ull + ((uint64_t)n << 32) + i);
		uint32_t u = t ? peel_once(s, key, n, t) : n;

		unres += u;
		stalled += u != 0;
	}
	{
		double eu = (double)unres / trials;
		double bytes = 12.0 * t + 4.0 * eu;

		printf("%6u %6u %7.3f %8u %9.5f %10.4f %10.1f %7.4f\n", n, t,
		       3.0 * t / n, trials, (double)stalled / trials, eu, bytes,
		       bytes / (1.23 * 4 * n));
		fflush(stdout);
	}
}

int main(int argc, char **argv)
{
	struct sim s;
	uint32_t cap_n = 65536, cap_t = 200000;

	if (argc < 4) {
		fprintf(stderr, "usage: %s N T_lo T_hi [T_step] [trials]\n",
			argv[0]);
		return 1;
	}
	s.c = malloc(3 * sizeof(uint32_t) * cap_n);
	s.cnt = malloc(3 * sizeof(uint32_t) * cap_t);
	s.ids = malloc(3 * sizeof(uint32_t) * cap_t);
	s.stack = malloc(3 * sizeof(uint32_t) * cap_t + 3 * 4 * cap_n);
	s.done = malloc(cap_n);
	printf("%6s %6s %7s %8s %9s %10s %10s %7s\n", "N", "T", "cells/N",
	       "trials", "stall", "mean_unres", "exp_bytes", "x_bound");
	{
		uint32_t n = (uint32_t)strtoul(argv[1], NULL, 0);
		uint32_t lo = (uint32_t)strtoul(argv[2], NULL, 0);
		uint32_t hi = (uint32_t)strtoul(argv[3], NULL, 0);
		uint32_t step = argc > 4 ? (uint32_t)strtoul(argv[4], NULL, 0) : 1;
		uint32_t trials = argc > 5 ? (uint32_t)strtoul(argv[5], NULL, 0) :
					     1000;

		if (n > cap_n || hi > cap_t)
			return 1;
		for (uint32_t t = lo; t <= hi; t += step ? step : 1)
			run(&s, n, t, trials);
	}
	return 0;
}
