/* SPDX-License-Identifier: Apache-2.0 */
/* Internals of the software NIC model (homagg/nic.h).  Not public. */
#ifndef HOMAGG_NIC_PVT_H
#define HOMAGG_NIC_PVT_H

#include <stdbool.h>
#include <stdint.h>

#include "homagg/nic.h"

#define NIC_NONE UINT32_MAX
#define NIC_NO_PORT 0xffff
#define NIC_ETH_HLEN 14
#define NIC_WIRE_OVERHEAD 20 /* preamble + SFD (8) + inter-frame gap (12) */

enum nic_buf_state { BUF_FREE = 0, BUF_USER, BUF_FABRIC };

/* One pool buffer: the hg_pkt the user sees, and where it is. */
struct nic_buf {
	struct hg_pkt pkt; /* pkt.priv points back here */
	uint32_t idx;
	uint8_t state;
	uint16_t src; /* sending port */
	uint16_t dst; /* receiving port once switched */
};

enum nic_ev_kind { EV_SWITCH = 1, EV_DELIVER };

/* A frame due somewhere at time t; seq breaks ties in push order. */
struct nic_ev {
	uint64_t t;
	uint64_t seq;
	uint32_t buf;
	uint32_t kind;
};

struct nic_held {
	uint32_t buf;
	uint32_t left;     /* later frames still to go past it */
	uint64_t deadline; /* released at this time at the latest */
};

/* One direction of one port's link: fault stage, serialiser, propagation. */
struct nic_link {
	struct hg_nic_faults faults;
	bool active; /* some fault is configured */
	uint8_t dir;
	uint64_t rng[4]; /* xoshiro256** */
	uint64_t busy_until;
	uint64_t carry; /* remainder of the serialisation division */
	uint64_t last_arrival;
	uint32_t nheld;
	struct nic_held held[HG_NIC_MAX_HOLD];
};

struct hg_nic_port {
	struct hg_port port; /* ops + ctx = this */
	struct hg_nic_fabric *f;
	uint16_t id;
	struct hg_nic_port_config cfg;
	uint64_t mac_key;
	struct nic_link link[2];
	uint32_t *rxq;
	uint32_t rx_head, rx_count;
	uint64_t *txq; /* departure times of frames still in the tx ring */
	uint32_t tx_head, tx_count, tx_cap;
	uint32_t groups[HG_NIC_MAX_GROUPS];
	unsigned ngroups;
	uint64_t ctr[HG_NIC_PC__COUNT];
};

struct hg_nic_fabric {
	struct hg_nic_fabric_config cfg;
	uint64_t now;
	uint64_t seq;
	struct nic_buf *bufs;
	uint8_t *mem;
	uint32_t *freelist;
	uint32_t nfree;
	struct nic_ev *heap;
	uint32_t nheap;
	struct hg_nic_port **ports;
	uint16_t nports;
	uint32_t *mac_table; /* open addressing: port id + 1, 0 = empty */
	uint32_t mac_mask; /* table size - 1 (a power of two >= 2 * max_ports) */
	uint32_t nheld;    /* frames held back over all links */
	uint64_t hold_deadline; /* earliest deadline of a held frame */
	uint64_t ctr[HG_NIC_FC__COUNT];
	uint64_t trace_hash;
	uint64_t trace_count;
	struct hg_nic_trace_rec *trace;
};

/* nic_fabric.c */
uint32_t nic_buf_alloc(struct hg_nic_fabric *f);
void nic_buf_free(struct hg_nic_fabric *f, uint32_t b);
uint32_t nic_buf_copy(struct hg_nic_fabric *f, uint32_t b);
void nic_ev_push(struct hg_nic_fabric *f, uint64_t t, uint32_t buf, uint32_t kind);
void nic_trace(struct hg_nic_fabric *f, uint32_t b, uint16_t dst, uint8_t kind,
	       uint8_t dir);
void nic_hold_recompute(struct hg_nic_fabric *f);

static inline struct nic_buf *nic_buf(struct hg_nic_fabric *f, uint32_t b)
{
	return &f->bufs[b];
}

int nic_mac_lookup(const struct hg_nic_fabric *f, uint64_t key);
void nic_mac_insert(struct hg_nic_fabric *f, uint64_t key, uint16_t id);

/* nic_link.c */
void nic_link_init(struct nic_link *l, uint64_t seed, uint16_t port, uint8_t dir);
int nic_link_set_faults(struct nic_link *l, const struct hg_nic_faults *fl);
void nic_link_enter(struct hg_nic_fabric *f, struct hg_nic_port *p, uint8_t dir,
		    uint32_t b);
bool nic_link_release_due(struct hg_nic_fabric *f, uint64_t t);

/* nic_port.c */
void nic_port_deliver(struct hg_nic_fabric *f, uint32_t b);
void nic_port_destroy(struct hg_nic_port *p);

#endif /* HOMAGG_NIC_PVT_H */
