/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prefetch_pvt.h - how a function that only prefetches is declared.
 *
 * gcc 12 -O2 finds such a function pure or const (a prefetch has no effect
 * it sees) and, once it can prove the function's loops finite, deletes
 * every call of it: the binary then prefetches nothing.  This hit the
 * engine's prefetch_range() and prefetch_data() (no payload of the next
 * frame was prefetched, which cost 5-10% of the engine lcore with 8 KB
 * frames from another core, `homagg bench switch --payload 8192`) and
 * lhc's prefetch_block().  Inlined before that analysis, the prefetches
 * stay (`objdump -d` shows them in the callers).
 */
#ifndef HOMAGG_PREFETCH_PVT_H
#define HOMAGG_PREFETCH_PVT_H

#define PREFETCH_FN static inline __attribute__((always_inline))

#endif /* HOMAGG_PREFETCH_PVT_H */
