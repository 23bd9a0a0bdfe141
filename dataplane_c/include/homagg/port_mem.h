/* SPDX-License-Identifier: Apache-2.0 */
/*
 * homagg/port_mem.h - an in-memory port backend for tests and benchmarks.
 *
 * Frames injected with hg_port_mem_inject() are what rx_burst returns, in
 * order; frames the user of the port transmits are kept in a queue read back
 * with hg_port_mem_pop_tx().  Buffers come from a fixed pool allocated at
 * creation; hg_port_mem_free_count() lets tests check nothing leaked.  The
 * clock is whatever hg_port_mem_set_time() set.
 */
#ifndef HOMAGG_PORT_MEM_H
#define HOMAGG_PORT_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "homagg/port.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cdef-begin */
struct hg_port_mem;

struct hg_port_mem_config {
	uint32_t pool;      /* packet buffers, 1..1048576 */
	uint16_t buf_size;  /* bytes per buffer, 64..65535 */
	bool can_replicate; /* hg_port_info.can_replicate */
	uint8_t mac[6];
	uint32_t ipv4;     /* host order */
	uint16_t udp_port; /* host order */
	uint16_t mtu;
	uint32_t tx_limit; /* frames tx_burst accepts in all; 0 = unlimited */
};

/* Defaults: pool 4096 buffers of 9216 bytes, 02:00:00:00:00:01,
 * 10.0.0.254, HG_UDP_PORT, MTU 9000, no replication, no tx limit. */
void hg_port_mem_config_init(struct hg_port_mem_config *c);
struct hg_port_mem *hg_port_mem_create(const struct hg_port_mem_config *c);
void hg_port_mem_destroy(struct hg_port_mem *m);
/* The port to hand to an engine; valid until hg_port_mem_destroy(). */
struct hg_port *hg_port_mem_port(struct hg_port_mem *m);

/* Queue a copy of a frame for rx.  0, -EINVAL, -ENOSPC (longer than a
 * buffer), -ENOMEM (pool empty). */
int hg_port_mem_inject(struct hg_port_mem *m, const uint8_t *frame, size_t len);
/* Take the oldest transmitted frame: its length (copied to buf), 0 when
 * none is queued, -ENOSPC when cap is too small (the frame stays). */
int hg_port_mem_pop_tx(struct hg_port_mem *m, uint8_t *buf, size_t cap);
uint32_t hg_port_mem_rx_pending(const struct hg_port_mem *m);
uint32_t hg_port_mem_tx_pending(const struct hg_port_mem *m);
/* Buffers in the pool (neither queued nor held by a user). */
uint32_t hg_port_mem_free_count(const struct hg_port_mem *m);
void hg_port_mem_set_time(struct hg_port_mem *m, uint64_t ns);
void hg_port_mem_set_tx_limit(struct hg_port_mem *m, uint32_t limit);
/* Groups joined through the port's join_group op. */
uint32_t hg_port_mem_groups(const struct hg_port_mem *m);
/* cdef-end */

#ifdef __cplusplus
}
#endif

#endif /* HOMAGG_PORT_MEM_H */
