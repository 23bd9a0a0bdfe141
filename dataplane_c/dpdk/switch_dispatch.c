/* SPDX-License-Identifier: Apache-2.0 */
/* switch_dispatch.c - homagg-switch's dispatcher (--lcores > 1). */
#include <rte_mbuf.h>

#include "homagg/wire.h"
#include "switch_pvt.h"

/*
 * The shard of a received frame: (job id + slot) % N, read where a HomAgg
 * header sits in an IPv4 (no options) / UDP frame, so consecutive slots of
 * one job go to consecutive lcores.  Anything else goes to shard 0, whose
 * engine counts it as the drop it is (a frame with a bad slot lands on
 * some shard, which drops it the same way).
 */
static inline unsigned int shard_of_frame(const struct daemon *d,
					  const struct hg_pkt *pk)
{
	const uint8_t *f = pk->data, *h = f + HG_ETH_IP_UDP_LEN;
	uint32_t job, slot;

	if (pk->len < HG_ETH_IP_UDP_LEN + HG_HDR_LEN || f[12] != 0x08 ||
	    f[13] != 0x00 || f[14] != 0x45)
		return 0;
	job = (uint32_t)h[4] << 24 | (uint32_t)h[5] << 16 |
	      (uint32_t)h[6] << 8 | h[7];
	slot = (uint32_t)h[14] << 8 | h[15];
	return (unsigned int)(((uint64_t)job + slot) % d->nshards);
}

/* The dispatcher (--lcores > 1): frames from the ethdev to the shard of
 * their job, frames of every shard to the ethdev.  Returns whether any
 * frame moved. */
bool hg_switch_dispatch(struct daemon *d)
{
	struct rte_mbuf *by[64][32];
	uint16_t cnt[64] = { 0 };
	struct hg_pkt *pk[32];
	struct rte_mbuf *m[64];
	uint16_t n, i, k, sent;
	bool moved;

	n = hg_port_rx(&d->port, pk, 32); /* drops injected, ARP answered */
	moved = n > 0;
	for (i = 0; i < n; i++) {
		k = (uint16_t)shard_of_frame(d, pk[i]);
		by[k][cnt[k]++] = pk[i]->priv;
	}
	for (k = 0; n && k < d->nshards; k++) {
		if (!cnt[k])
			continue;
		sent = (uint16_t)rte_ring_sp_enqueue_burst(d->shards[k].rx_ring,
							   (void **)by[k],
							   cnt[k], NULL);
		if (sent < cnt[k]) {
			d->dispatch_full += cnt[k] - sent;
			rte_pktmbuf_free_bulk(by[k] + sent, cnt[k] - sent);
		}
	}
	for (k = 0; k < d->nshards; k++) {
		n = (uint16_t)rte_ring_sc_dequeue_burst(d->shards[k].tx_ring,
							(void **)m, 64, NULL);
		if (!n)
			continue;
		moved = true;
		sent = hg_dpdk_port_tx_mbufs(d->dport, m, n);
		if (sent < n)
			rte_pktmbuf_free_bulk(m + sent, n - sent);
	}
	return moved;
}
