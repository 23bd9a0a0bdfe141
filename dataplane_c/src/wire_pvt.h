/* SPDX-License-Identifier: Apache-2.0 */
/*
 * wire_pvt.h - frame layout helpers shared by wire.c, engine.c, the kernel
 * UDP port and the switch benchmark.
 *
 * Offsets of a HomAgg frame without IP options (what the aggregator sends;
 * what it receives may carry IP options, see hg_wire_parse()).
 */
#ifndef HOMAGG_WIRE_PVT_H
#define HOMAGG_WIRE_PVT_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "be32_pvt.h"

#include "homagg/codec.h"
#include "homagg/counters.h"
#include "homagg/kernels.h"
#include "homagg/wire.h"

#define HG_OFF_ETH 0
#define HG_OFF_IP 14
#define HG_OFF_UDP 34
#define HG_OFF_HDR 42
#define HG_OFF_PAYLOAD 74

static inline uint16_t hg_rd16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

/* One 16-bit store (gcc 12 leaves two byte stores apart): little-endian
 * hosts, as hg_st_be32(). */
static inline void hg_wr16(uint8_t *p, uint16_t v)
{
	v = __builtin_bswap16(v);
	memcpy(p, &v, 2);
}

/*
 * Internet checksum (RFC 1071) partial sum: the bytes as native-order 32-bit
 * words added into 64 bits (byte-order independent once folded, RFC 1071
 * section 2(B)).  A segment must start at an even offset of the checksummed
 * data; only the last segment may have an odd length.
 */
/* The bulk of hg_csum_add() for long buffers (wire.c: AVX2 when the CPU has
 * it, 16-bit halves summed in 32-bit lanes). */
uint64_t hg_csum_add_long(uint64_t sum, const uint8_t *p, size_t len);

/* 32-bit words (and a zero-padded tail) added to sum: the scalar loop. */
static inline uint64_t hg_csum_add_words(uint64_t sum, const uint8_t *p, size_t len)
{
	size_t i = 0;
	uint32_t w;

	for (; i + 4 <= len; i += 4) {
		memcpy(&w, p + i, 4);
		sum += w;
	}
	if (i < len) {
		w = 0;
		memcpy(&w, p + i, len - i);
		sum += w;
	}
	return sum;
}

static inline uint64_t hg_csum_add(uint64_t sum, const uint8_t *p, size_t len)
{
	if (len >= 128)
		return hg_csum_add_long(sum, p, len);
	return hg_csum_add_words(sum, p, len);
}

/* Fold to 16 bits (native order, as stored by memcpy into the frame). */
static inline uint16_t hg_csum_fold(uint64_t sum)
{
	sum = (sum & 0xffffffffu) + (sum >> 32);
	sum = (sum & 0xffffffffu) + (sum >> 32);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (uint16_t)sum;
}

/* Partial sum of an IPv4 header: a header without options (20 bytes, what
 * every sender here writes) in three loads, else the word loop. */
static inline uint64_t hg_ip_hdr_sum(const uint8_t *ip, size_t ihl)
{
	uint64_t a, b;
	uint32_t c;

	if (ihl != 20)
		return hg_csum_add(0, ip, ihl);
	memcpy(&a, ip, 8);
	memcpy(&b, ip + 8, 8);
	memcpy(&c, ip + 16, 4);
	/* 64-bit halves as 32-bit words: no carry is lost */
	return (a & 0xffffffffu) + (a >> 32) + (b & 0xffffffffu) + (b >> 32) + c;
}

/* IPv4 header checksum of hdr (ihl_bytes long), checksum field included. */
static inline uint16_t hg_ip_csum(const uint8_t *hdr, size_t ihl_bytes)
{
	return (uint16_t)~hg_csum_fold(hg_ip_hdr_sum(hdr, ihl_bytes));
}

/*
 * Write Ethernet + IPv4 (no options, DF, TTL 64) + UDP headers at f for a
 * UDP payload (HomAgg header + payload) of udp_payload bytes.  The UDP
 * checksum is left 0.
 */
static inline void hg_wire_put_l2l4(uint8_t *f, const struct hg_wire_addr *src,
				    const uint8_t dst_mac[6], uint32_t dst_ip,
				    uint16_t dst_port, size_t udp_payload)
{
	uint8_t *ip = f + HG_OFF_IP, *udp = f + HG_OFF_UDP;
	uint16_t c;

	memcpy(f, dst_mac, 6);
	memcpy(f + 6, src->mac, 6);
	f[12] = 0x08;
	f[13] = 0x00;
	ip[0] = 0x45;
	ip[1] = 0;
	hg_wr16(ip + 2, (uint16_t)(20 + 8 + udp_payload));
	hg_wr16(ip + 4, 0);
	hg_wr16(ip + 6, 0x4000);
	ip[8] = 64;
	ip[9] = 17;
	hg_wr16(ip + 10, 0);
	hg_st_be32(ip + 12, src->ipv4);
	hg_st_be32(ip + 16, dst_ip);
	c = hg_ip_csum(ip, 20);
	memcpy(ip + 10, &c, 2);
	hg_wr16(udp, src->port);
	hg_wr16(udp + 2, dst_port);
	hg_wr16(udp + 4, (uint16_t)(8 + udp_payload));
	hg_wr16(udp + 6, 0);
}

static inline void hg_wire_put_hdr(uint8_t *p, const struct hg_hdr *h)
{
	p[0] = h->version;
	p[1] = h->op;
	hg_wr16(p + 2, h->flags);
	hg_st_be32(p + 4, h->job);
	hg_st_be32(p + 8, h->token);
	hg_wr16(p + 12, h->worker);
	hg_wr16(p + 14, h->slot);
	hg_st_be32(p + 16, h->seq);
	hg_wr16(p + 20, h->lanes);
	p[22] = (uint8_t)h->exp;
	p[23] = h->shard;
	hg_st_be32(p + 24, h->incarnation);
	hg_st_be32(p + 28, h->nonce);
}

/*
 * Fill the UDP checksum of a frame built by hg_wire_put_l2l4(); data_sum is
 * hg_csum_add(0, ...) over the UDP payload (HomAgg header + payload), so a
 * payload sent to several workers is summed once.
 */
static inline void hg_wire_put_udp_csum(uint8_t *f, uint64_t data_sum)
{
	uint8_t *ip = f + HG_OFF_IP, *udp = f + HG_OFF_UDP;
	uint8_t ph[4] = { 0, 17, udp[4], udp[5] };
	uint64_t s = data_sum;
	uint16_t c;

	s = hg_csum_add(s, ip + 12, 8); /* source and destination address */
	s = hg_csum_add(s, ph, 4);      /* zero, protocol, UDP length */
	s = hg_csum_add(s, udp, 8);     /* UDP header, checksum field 0 */
	c = (uint16_t)~hg_csum_fold(s);
	if (c == 0)
		c = 0xffff;
	memcpy(udp + 6, &c, 2);
}

/*
 * The UDP checksum of a received datagram (udp_len bytes at udp, IPv4
 * header at ip) is absent (0) or right.
 */
static inline bool hg_udp_csum_ok(const uint8_t *ip, const uint8_t *udp,
				  size_t udp_len)
{
	uint8_t ph[4] = { 0, 17, udp[4], udp[5] };
	uint64_t s;

	if (!(udp[6] | udp[7]))
		return true;
	s = hg_csum_add(0, ip + 12, 8);
	s = hg_csum_add(s, ph, 4);
	s = hg_csum_add(s, udp, udp_len);
	return hg_csum_fold(s) == 0xffff;
}

/*
 * The body of hg_wire_parse() (arguments not NULL), inline so the engine's
 * per-frame path has no call and keeps the view in registers.
 */
static inline int hg_wire_parse_inl(const uint8_t *f, size_t len, uint16_t udp_port,
				    uint32_t flags, struct hg_wire_view *v)
{
	const uint8_t *ip, *udp, *h;
	size_t ihl, ip_len, udp_len, pay_len, want;
	unsigned frag;

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
	if (frag & 0x3fff) /* MF set or a fragment offset */
		return HG_CNT_NOT_IP;
	if (hg_csum_fold(hg_ip_hdr_sum(ip, ihl)) != 0xffff)
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
	if ((flags & HG_WIRE_F_UDP_CSUM) && !hg_udp_csum_ok(ip, udp, udp_len))
		return HG_CNT_BAD_CSUM;
	h = udp + 8;
	if (h[0] != HG_PROTOCOL_VERSION)
		return HG_CNT_BAD_VERSION;
	v->hdr.version = h[0];
	v->hdr.op = h[1];
	v->hdr.flags = hg_rd16(h + 2);
	v->hdr.job = hg_ld_be32(h + 4);
	v->hdr.token = hg_ld_be32(h + 8);
	v->hdr.worker = hg_rd16(h + 12);
	v->hdr.slot = hg_rd16(h + 14);
	v->hdr.seq = hg_ld_be32(h + 16);
	v->hdr.lanes = hg_rd16(h + 20);
	v->hdr.exp = (int8_t)h[22];
	v->hdr.shard = h[23];
	v->hdr.incarnation = hg_ld_be32(h + 24);
	v->hdr.nonce = hg_ld_be32(h + 28);
	if ((v->hdr.flags & ~HG_FLAGS_KNOWN) ||
	    (!(v->hdr.flags & HG_FLAG_AUTH) &&
	     (v->hdr.nonce || (v->hdr.flags >> HG_FLAG_EPOCH_SHIFT))) ||
	    !v->hdr.incarnation ||
	    ((v->hdr.flags & HG_FLAG_RESULT) && (v->hdr.flags & HG_FLAG_STATUS)))
		return HG_CNT_BAD_FLAGS;
	if (v->hdr.op < 1 || v->hdr.op > HG_OP__COUNT)
		return HG_CNT_BAD_OP;
	pay_len = udp_len - 8 - HG_HDR_LEN;
	if (v->hdr.flags & HG_FLAG_AUTH) {
		if (pay_len < HG_MAC_LEN)
			return HG_CNT_TRUNCATED;
		pay_len -= HG_MAC_LEN;
	}
	if (v->hdr.flags & HG_FLAG_STATUS) {
		if (pay_len < 1 || pay_len > HG_STATUS_MAX_PAYLOAD)
			return HG_CNT_BAD_LANES;
	} else {
		want = (size_t)v->hdr.lanes * ((v->hdr.flags & HG_FLAG_RESULT) ?
						       hg_op_acc_lane(v->hdr.op) :
						       hg_op_in_lane(v->hdr.op));
		if (pay_len != want || pay_len > HG_MAX_PAYLOAD)
			return HG_CNT_BAD_LANES;
	}
	memcpy(v->src.mac, f + 6, 6);
	memcpy(v->dst.mac, f, 6);
	v->src.ipv4 = hg_ld_be32(ip + 12);
	v->dst.ipv4 = hg_ld_be32(ip + 16);
	v->src.port = hg_rd16(udp);
	v->dst.port = hg_rd16(udp + 2);
	v->payload_off = (uint16_t)(14 + ihl + 8 + HG_HDR_LEN);
	v->payload_len = (uint16_t)pay_len;
	return 0;
}

#endif /* HOMAGG_WIRE_PVT_H */
