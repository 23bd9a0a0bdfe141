/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The HomAgg frame (homagg/wire.h): validation of received frames, building
 * of frames, and the counter name table (homagg/counters.h).
 *
 * hg_wire_parse() is the engine's first and only look at a frame: it checks
 * every length against the frame before reading, so the engine may trust a
 * view it returned 0 for.  docs/PROTOCOL.md "The wire" is the specification.
 */
#include <errno.h>
#include <string.h>

#include "homagg/codec.h"
#include "homagg/counters.h"
#include "homagg/kernels.h"
#include "homagg/wire.h"
#include "wire_pvt.h"

static const char *const counter_names[] = {
#define HG_CNT_NAME_(name, str, doc) str,
	HG_FOREACH_COUNTER(HG_CNT_NAME_)
#undef HG_CNT_NAME_
};

int hg_counter_count(void)
{
	return HG_CNT__COUNT;
}

const char *hg_counter_name(int i)
{
	if (i < 0 || i >= HG_CNT__COUNT)
		return NULL;
	return counter_names[i];
}

void hg_wire_mcast_mac(uint32_t group_ipv4, uint8_t mac[6])
{
	mac[0] = 0x01;
	mac[1] = 0x00;
	mac[2] = 0x5e;
	mac[3] = (uint8_t)((group_ipv4 >> 16) & 0x7f);
	mac[4] = (uint8_t)(group_ipv4 >> 8);
	mac[5] = (uint8_t)group_ipv4;
}

int hg_wire_parse(const uint8_t *f, size_t len, uint16_t udp_port,
		  uint32_t flags, struct hg_wire_view *v)
{
	const uint8_t *ip, *udp, *h;
	size_t ihl, ip_len, udp_len, pay_len, want;
	unsigned frag;

	if (!f || !v)
		return -EINVAL;
	if (len < 14)
		return HG_CNT_TRUNCATED;
	if (f[12] != 0x08 || f[13] != 0x00)
		return HG_CNT_NOT_IP;
	if (len < 14 + 20)
		return HG_CNT_TRUNCATED;
	ip = f + HG_OFF_IP;
	ihl = (size_t)(ip[0] & 0x0f) * 4;
	if ((ip[0] >> 4) != 4 || ihl < 20)
		return HG_CNT_NOT_IP;
	ip_len = hg_rd16(ip + 2);
	/* Ethernet may pad a short frame: the IP length rules, not len. */
	if (ip_len < ihl || 14 + ip_len > len)
		return HG_CNT_TRUNCATED;
	frag = hg_rd16(ip + 6);
	if (frag & 0x3fff)              /* MF set or a fragment offset */
		return HG_CNT_NOT_IP;
	if (hg_csum_fold(hg_csum_add(0, ip, ihl)) != 0xffff)
		return HG_CNT_BAD_CSUM;
	if (ip[9] != 17)
		return HG_CNT_NOT_UDP;
	if (ip_len < ihl + 8)
		return HG_CNT_TRUNCATED;
	udp = ip + ihl;
	if (udp_port && hg_rd16(udp + 2) != udp_port)
		return HG_CNT_WRONG_PORT;
	udp_len = hg_rd16(udp + 4);
	if (udp_len < 8 + HG_HDR_LEN || udp_len > ip_len - ihl)
		return HG_CNT_TRUNCATED;
	if ((flags & HG_WIRE_F_UDP_CSUM) && (udp[6] | udp[7])) {
		uint8_t ph[4] = { 0, 17, udp[4], udp[5] };
		uint64_t s = hg_csum_add(0, ip + 12, 8);

		s = hg_csum_add(s, ph, 4);
		s = hg_csum_add(s, udp, udp_len);
		if (hg_csum_fold(s) != 0xffff)
			return HG_CNT_BAD_CSUM;
	}
	h = udp + 8;
	if (h[0] != HG_PROTOCOL_VERSION)
		return HG_CNT_BAD_VERSION;
	v->hdr.version = h[0];
	v->hdr.op = h[1];
	v->hdr.flags = hg_rd16(h + 2);
	v->hdr.job = hg_rd32(h + 4);
	v->hdr.token = hg_rd32(h + 8);
	v->hdr.worker = hg_rd16(h + 12);
	v->hdr.slot = hg_rd16(h + 14);
	v->hdr.seq = hg_rd32(h + 16);
	v->hdr.lanes = hg_rd16(h + 20);
	v->hdr.exp = (int8_t)h[22];
	v->hdr.reserved = h[23];
	if ((v->hdr.flags & ~HG_FLAGS_KNOWN) || v->hdr.reserved ||
	    ((v->hdr.flags & HG_FLAG_RESULT) && (v->hdr.flags & HG_FLAG_STATUS)))
		return HG_CNT_BAD_FLAGS;
	if (!hg_op_valid(v->hdr.op))
		return HG_CNT_BAD_OP;
	pay_len = udp_len - 8 - HG_HDR_LEN;
	if (v->hdr.flags & HG_FLAG_STATUS) {
		if (pay_len < 1 || pay_len > HG_MAX_WORKERS / 8)
			return HG_CNT_BAD_LANES;
	} else {
		want = (size_t)v->hdr.lanes *
		       ((v->hdr.flags & HG_FLAG_RESULT) ?
				hg_op_acc_lane_bytes(v->hdr.op) :
				hg_op_in_lane_bytes(v->hdr.op));
		if (pay_len != want || pay_len > HG_MAX_PAYLOAD)
			return HG_CNT_BAD_LANES;
	}
	memcpy(v->src.mac, f + 6, 6);
	memcpy(v->dst.mac, f, 6);
	v->src.ipv4 = hg_rd32(ip + 12);
	v->dst.ipv4 = hg_rd32(ip + 16);
	v->src.port = hg_rd16(udp);
	v->dst.port = hg_rd16(udp + 2);
	v->payload_off = (uint16_t)(14 + ihl + 8 + HG_HDR_LEN);
	v->payload_len = (uint16_t)pay_len;
	return 0;
}

int hg_wire_build(uint8_t *f, size_t cap, const struct hg_wire_addr *src,
		  const struct hg_wire_addr *dst, const struct hg_hdr *hdr,
		  const uint8_t *payload, size_t payload_len, uint32_t flags)
{
	size_t flen = HG_OFF_PAYLOAD + payload_len;

	if (!f || !src || !dst || !hdr || (payload_len && !payload))
		return -EINVAL;
	if (payload_len > HG_MAX_PAYLOAD)
		return -ERANGE;
	if (cap < flen)
		return -ENOSPC;
	hg_wire_put_l2l4(f, src, dst->mac, dst->ipv4, dst->port,
			 HG_HDR_LEN + payload_len);
	hg_wire_put_hdr(f + HG_OFF_HDR, hdr);
	if (payload_len)
		memmove(f + HG_OFF_PAYLOAD, payload, payload_len);
	if (flags & HG_WIRE_F_UDP_CSUM)
		hg_wire_put_udp_csum(f, hg_csum_add(0, f + HG_OFF_HDR,
						    HG_HDR_LEN + payload_len));
	return (int)flen;
}
