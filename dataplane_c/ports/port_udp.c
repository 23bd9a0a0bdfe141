/* SPDX-License-Identifier: Apache-2.0 */
/* port_udp.c - homagg/port.h over kernel UDP sockets (see port_udp.h). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdbool.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "homagg/port_udp.h"
#include "homagg/wire.h"
#include "../src/wire_pvt.h"

#define UDP_BURST 64
#define FRAME_CAP (HG_ETH_IP_UDP_LEN + HG_HDR_LEN + HG_MAX_PAYLOAD)

struct hg_udp_port {
	struct hg_port port; /* handed out by hg_udp_port_port() */
	int ufd;             /* unicast socket */
	int gfd;             /* multicast socket, -1 until a join */
	uint32_t ipv4;       /* bound address, host order */
	uint16_t udp_port;
	uint16_t group_port;
	uint32_t rcvbuf;
	uint32_t sndbuf;
	uint16_t mtu; /* reported by get_info */
	bool gso;     /* runs of frames sent as one UDP_SEGMENT message */
	struct hg_udp_port_stats st;
	uint32_t npkts;
	uint32_t nfree;
	struct hg_pkt **free; /* stack of free packets */
	struct hg_pkt *pkts;
	uint8_t *mem; /* npkts * FRAME_CAP bytes */
};

/* ---- frame helpers -------------------------------------------------- */

/* Ethernet/IPv4/UDP headers in front of a received payload of n bytes;
 * the MACs stay zero: the kernel owns the link. */
static void synth_headers(uint8_t *f, uint32_t src, uint16_t sport,
			  uint32_t dst, uint16_t dport, uint16_t n)
{
	static const uint8_t no_mac[6];
	struct hg_wire_addr from = { .ipv4 = src, .port = sport };

	hg_wire_put_l2l4(f, &from, no_mac, dst, dport, n);
}

/* One datagram of a recvmmsg/sendmmsg batch: len bytes at base, from or
 * to addr. */
static void mmsg_one(struct mmsghdr *mm, struct iovec *iov,
		     struct sockaddr_in *addr, void *base, size_t len)
{
	iov->iov_base = base;
	iov->iov_len = len;
	memset(&mm->msg_hdr, 0, sizeof(mm->msg_hdr));
	mm->msg_hdr.msg_name = addr;
	mm->msg_hdr.msg_namelen = sizeof(*addr);
	mm->msg_hdr.msg_iov = iov;
	mm->msg_hdr.msg_iovlen = 1;
}

/* ---- ops ------------------------------------------------------------ */

static uint16_t rx_fd(struct hg_udp_port *p, int fd, uint32_t dst_ip,
		      uint16_t dst_port, struct hg_pkt **pkts, uint16_t n)
{
	struct mmsghdr mm[UDP_BURST];
	struct iovec iov[UDP_BURST];
	struct sockaddr_in from[UDP_BURST];
	struct hg_pkt *pk[UDP_BURST];
	uint16_t i, out = 0;
	int got;

	if (n > UDP_BURST)
		n = UDP_BURST;
	if (n > p->nfree)
		n = (uint16_t)p->nfree;
	if (n == 0)
		return 0;
	for (i = 0; i < n; i++) {
		pk[i] = p->free[p->nfree - 1 - i];
		mmsg_one(&mm[i], &iov[i], &from[i], pk[i]->data + HG_ETH_IP_UDP_LEN,
			 pk[i]->cap - HG_ETH_IP_UDP_LEN);
	}
	got = recvmmsg(fd, mm, n, MSG_DONTWAIT, NULL);
	if (got <= 0)
		return 0;
	p->nfree -= (uint32_t)got; /* pk[0..got) leave the free stack */
	for (i = 0; i < got; i++) {
		uint16_t len = (uint16_t)mm[i].msg_len;

		if (mm[i].msg_hdr.msg_flags & MSG_TRUNC) {
			p->st.rx_truncated++;
			p->free[p->nfree++] = pk[i];
			continue;
		}
		synth_headers(pk[i]->data, ntohl(from[i].sin_addr.s_addr),
			      ntohs(from[i].sin_port), dst_ip, dst_port, len);
		pk[i]->len = (uint16_t)(HG_ETH_IP_UDP_LEN + len);
		pk[i]->meta = 0;
		pkts[out++] = pk[i];
	}
	p->st.rx += out;
	return out;
}

static uint16_t udp_rx(void *ctx, struct hg_pkt **pkts, uint16_t n)
{
	struct hg_udp_port *p = ctx;
	uint16_t got;

	got = rx_fd(p, p->ufd, p->ipv4, p->udp_port, pkts, n);
	if (p->gfd >= 0 && got < n)
		/* the group socket is this port's second door: a result sent
		 * to the group is presented as addressed to our own address
		 * and port, which is what the client accepts */
		got += rx_fd(p, p->gfd, p->ipv4, p->udp_port, pkts + got,
			     (uint16_t)(n - got));
	return got;
}

static void udp_free(void *ctx, struct hg_pkt **pkts, uint16_t n)
{
	struct hg_udp_port *p = ctx;
	uint16_t i;

	for (i = 0; i < n; i++) {
		pkts[i]->len = 0;
		p->free[p->nfree++] = pkts[i];
	}
}

/* A frame the kernel can send: Ethernet + IPv4 without options + UDP. */
static bool frame_ok(const struct hg_pkt *pk)
{
	const uint8_t *ip = pk->data + HG_OFF_IP;

	return pk->len >= HG_ETH_IP_UDP_LEN &&
	       hg_rd16(pk->data + 12) == 0x0800 && ip[0] == 0x45 && ip[9] == 17;
}

/* Frames of one UDP_SEGMENT message at most (the kernel's limit is 64 or
 * more), and its UDP payload bytes at most (an IPv4 datagram's). */
#define GSO_SEGS 64
#define GSO_BYTES 65000

/* Whether a frame of len bytes to d can join a message of nseg frames to
 * to, segment size seg and bytes so far: the same destination, at most
 * seg bytes (the caller checks that the message's last frame was not
 * shorter) and room left. */
static bool gso_joins(const struct sockaddr_in *to, const struct sockaddr_in *d,
		      size_t seg, size_t len, size_t bytes, size_t nseg)
{
	return to->sin_addr.s_addr == d->sin_addr.s_addr &&
	       to->sin_port == d->sin_port && len <= seg && nseg < GSO_SEGS &&
	       bytes + len <= GSO_BYTES;
}

static uint16_t udp_tx(void *ctx, struct hg_pkt **pkts, uint16_t n)
{
	struct hg_udp_port *p = ctx;
	struct mmsghdr mm[UDP_BURST];
	struct iovec iov[UDP_BURST];
	struct sockaddr_in to[UDP_BURST];
	union {
		char buf[CMSG_SPACE(sizeof(uint16_t))];
		struct cmsghdr align;
	} cm[UDP_BURST];
	uint16_t idx[UDP_BURST]; /* packet index of each message's first frame */
	uint16_t nfr[UDP_BURST]; /* frames of each message */
	uint16_t i, m = 0, nv = 0, taken;
	size_t seg = 0, bytes = 0;
	uint64_t frames = 0;
	int sent;

	if (n > UDP_BURST)
		n = UDP_BURST;
	for (i = 0; i < n; i++) {
		const uint8_t *ip = pkts[i]->data + HG_OFF_IP;
		const uint8_t *udp = pkts[i]->data + HG_OFF_UDP;
		size_t len;
		struct sockaddr_in d = { .sin_family = AF_INET };

		if (!frame_ok(pkts[i]))
			continue;
		d.sin_addr.s_addr = htonl(hg_ld_be32(ip + 16));
		d.sin_port = htons(hg_rd16(udp + 2));
		len = pkts[i]->len - HG_ETH_IP_UDP_LEN;
		iov[nv].iov_base = pkts[i]->data + HG_ETH_IP_UDP_LEN;
		iov[nv].iov_len = len;
		/* only the last segment of a message may be shorter */
		if (p->gso && m && iov[nv - 1].iov_len == seg &&
		    gso_joins(&to[m - 1], &d, seg, len, bytes, nfr[m - 1])) {
			mm[m - 1].msg_hdr.msg_iovlen++;
			nfr[m - 1]++;
			bytes += len;
			nv++;
			continue;
		}
		to[m] = d;
		memset(&mm[m].msg_hdr, 0, sizeof(mm[m].msg_hdr));
		mm[m].msg_hdr.msg_name = &to[m];
		mm[m].msg_hdr.msg_namelen = sizeof(to[m]);
		mm[m].msg_hdr.msg_iov = &iov[nv];
		mm[m].msg_hdr.msg_iovlen = 1;
		idx[m] = i;
		nfr[m] = 1;
		seg = len;
		bytes = len;
		nv++;
		m++;
	}
	/* a run of several frames: one message the kernel segments at seg */
	for (i = 0; i < m; i++) {
		struct cmsghdr *c;
		uint16_t gs;

		if (mm[i].msg_hdr.msg_iovlen < 2)
			continue;
		mm[i].msg_hdr.msg_control = cm[i].buf;
		mm[i].msg_hdr.msg_controllen = sizeof(cm[i].buf);
		c = CMSG_FIRSTHDR(&mm[i].msg_hdr);
		c->cmsg_level = SOL_UDP;
		c->cmsg_type = UDP_SEGMENT;
		c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
		gs = (uint16_t)mm[i].msg_hdr.msg_iov[0].iov_len;
		memcpy(CMSG_DATA(c), &gs, sizeof(gs));
	}
	sent = m ? sendmmsg(p->ufd, mm, m, MSG_DONTWAIT) : 0;
	if (sent < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS) {
			sent = 0; /* full: the caller keeps the rest */
		} else if (p->gso && mm[0].msg_hdr.msg_iovlen > 1) {
			/* the path does not segment (e.g. no checksum offload):
			 * frame by frame from now on; the caller resends */
			p->gso = false;
			p->st.tx_gso_refused++;
			sent = 0;
		} else {
			if (errno == EMSGSIZE) { /* larger than the path MTU */
				p->st.tx_too_big++;
				p->st.tx_too_big_bytes = HG_ETH_IP_UDP_LEN -
							 HG_OFF_IP +
							 iov[0].iov_len;
			}
			/* e.g. no route: this datagram cannot leave; take it
			 * (dropped) so the client's timer handles it rather
			 * than a tight resend loop */
			p->st.tx_errors++;
			frames -= 1; /* compensated below: not sent */
			sent = 1;
		}
	}
	for (i = 0; i < (uint16_t)sent; i++) {
		frames += nfr[i];
		if (nfr[i] > 1) {
			p->st.tx_gso++;
			p->st.tx_gso_frames += nfr[i];
		}
	}
	/* the taken prefix ends at the first message not sent */
	taken = (uint16_t)sent < m ? idx[sent] : n;
	for (i = 0; i < taken; i++)
		if (!frame_ok(pkts[i]))
			p->st.tx_bad++;
	p->st.tx += frames;
	udp_free(p, pkts, taken);
	return taken;
}

static uint16_t udp_alloc(void *ctx, struct hg_pkt **pkts, uint16_t n)
{
	struct hg_udp_port *p = ctx;
	uint16_t i;

	if (n > p->nfree)
		n = (uint16_t)p->nfree;
	for (i = 0; i < n; i++) {
		pkts[i] = p->free[--p->nfree];
		pkts[i]->len = 0;
	}
	return n;
}

static int udp_info(void *ctx, struct hg_port_info *info)
{
	struct hg_udp_port *p = ctx;

	memset(info, 0, sizeof(*info));
	info->ipv4 = p->ipv4;
	info->udp_port = p->udp_port;
	info->mtu = p->mtu;
	info->can_replicate = true; /* the kernel delivers to every member */
	return 0;
}

static uint64_t udp_now(void *ctx)
{
	struct timespec ts;

	(void)ctx;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void set_rcvbuf(int fd, uint32_t bytes)
{
	int v = (int)bytes;

	/* FORCE needs CAP_NET_ADMIN; otherwise the kernel caps at rmem_max */
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &v, sizeof(v)) < 0)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v));
}

/*
 * A datagram is charged to the socket's send buffer until the link sends
 * it, so a window of frames queued behind a shaped link must fit there:
 * with the kernel's default (212 KB) a window of 64 8 KB frames got EAGAIN
 * for about a third of them (8269 refused frames in 3 allreduces of 2^22
 * floats, 4 workers, 1 Gbit/s testbed), resent out of order at the next
 * poll, and the reordering fired about 60 spurious fast retransmissions
 * per allreduce.
 */
static void set_sndbuf(int fd, uint32_t bytes)
{
	int v = (int)bytes;

	/* FORCE needs CAP_NET_ADMIN; otherwise the kernel caps at wmem_max */
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &v, sizeof(v)) < 0)
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v));
}

static int udp_join(void *ctx, uint32_t group)
{
	struct hg_udp_port *p = ctx;
	struct ip_mreqn mr;
	int one = 1, zero = 0;

	if ((group >> 28) != 0xE)
		return -EINVAL;
	if (p->gfd < 0) {
		struct sockaddr_in sa = { .sin_family = AF_INET,
					  .sin_port = htons(p->group_port),
					  .sin_addr.s_addr = htonl(INADDR_ANY) };
		int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);

		if (fd < 0)
			return -errno;
		if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
		    setsockopt(fd, IPPROTO_IP, IP_MULTICAST_ALL, &zero,
			       sizeof(zero)) < 0 ||
		    bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
			int e = errno;

			close(fd);
			return -e;
		}
		set_rcvbuf(fd, p->rcvbuf);
		p->gfd = fd;
	}
	memset(&mr, 0, sizeof(mr));
	mr.imr_multiaddr.s_addr = htonl(group);
	mr.imr_address.s_addr = htonl(p->ipv4);
	if (setsockopt(p->gfd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &mr, sizeof(mr)) < 0 &&
	    errno != EADDRINUSE) /* already a member */
		return -errno;
	return 0;
}

/*
 * Block in ppoll(2) on the unicast socket (and the group socket) until a
 * datagram is ready, the socket can take more (tx), or the clock reaches
 * until_ns: a nanosecond timeout, so a result wakes the worker at once and
 * a deadline is kept without a sleep-and-poll loop.
 */
static int wait_fds(struct hg_udp_port *p, uint64_t until_ns, bool tx)
{
	struct pollfd pf[2];
	struct timespec ts, *tsp = NULL;
	uint64_t now = udp_now(p);
	int n = 1, rc;

	pf[0].fd = p->ufd;
	pf[0].events = (short)(POLLIN | (tx ? POLLOUT : 0));
	if (p->gfd >= 0) {
		pf[1].fd = p->gfd;
		pf[1].events = POLLIN;
		n = 2;
	}
	if (until_ns != UINT64_MAX) {
		uint64_t d = until_ns > now ? until_ns - now : 0;

		ts.tv_sec = (time_t)(d / 1000000000u);
		ts.tv_nsec = (long)(d % 1000000000u);
		tsp = &ts;
	}
	p->st.waits++;
	rc = ppoll(pf, (nfds_t)n, tsp, NULL);
	if (rc < 0)
		return errno == EINTR ? 0 : -errno;
	if (rc == 0)
		p->st.wait_timeouts++;
	return rc > 0;
}

static int udp_wait(void *ctx, uint64_t until_ns, bool tx)
{
	return wait_fds(ctx, until_ns, tx);
}

static const struct hg_port_ops udp_ops = {
	.rx_burst = udp_rx,
	.tx_burst = udp_tx,
	.alloc_bulk = udp_alloc,
	.free_bulk = udp_free,
	.get_info = udp_info,
	.now_ns = udp_now,
	.join_group = udp_join,
	.wait = udp_wait,
};

/* ---- lifecycle ------------------------------------------------------ */

/* A UDP socket bound to ipv4:port (port 0: an ephemeral one), its address
 * in *sa; -1 with errno set, nothing left open. */
static int bound_socket(uint32_t ipv4, uint16_t port, struct sockaddr_in *sa)
{
	socklen_t sl = sizeof(*sa);
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), e;

	if (fd < 0)
		return -1;
	*sa = (struct sockaddr_in){ .sin_family = AF_INET,
				    .sin_port = htons(port),
				    .sin_addr.s_addr = htonl(ipv4) };
	if (bind(fd, (struct sockaddr *)sa, sizeof(*sa)) < 0 ||
	    getsockname(fd, (struct sockaddr *)sa, &sl) < 0) {
		e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

struct hg_udp_port *hg_udp_port_create(const struct hg_udp_port_config *cfg)
{
	struct sockaddr_in sa;
	struct hg_udp_port *p;
	uint32_t i;
	int e, pmtu_do = IP_PMTUDISC_DO;

	if (!cfg || (cfg->mtu && (cfg->mtu < 576 || cfg->mtu > 9000))) {
		errno = EINVAL;
		return NULL;
	}
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->gfd = -1;
	p->npkts = cfg->packets ? cfg->packets : 1024;
	p->group_port = cfg->group_port ? cfg->group_port : HG_UDP_PORT;
	p->rcvbuf = cfg->rcvbuf ? cfg->rcvbuf : 4u << 20;
	p->sndbuf = cfg->sndbuf ? cfg->sndbuf : 4u << 20;
	p->mtu = cfg->mtu ? cfg->mtu : 1500;
	p->gso = cfg->gso != 0;
	p->pkts = calloc(p->npkts, sizeof(*p->pkts));
	p->free = calloc(p->npkts, sizeof(*p->free));
	p->mem = malloc((size_t)p->npkts * FRAME_CAP);
	if (!p->pkts || !p->free || !p->mem) {
		errno = ENOMEM;
		goto err_free;
	}
	for (i = 0; i < p->npkts; i++) {
		p->pkts[i].data = p->mem + (size_t)i * FRAME_CAP;
		p->pkts[i].cap = FRAME_CAP;
		p->pkts[i].priv = p;
		p->free[i] = &p->pkts[i];
	}
	p->nfree = p->npkts;

	p->ufd = bound_socket(cfg->bind_ipv4, cfg->bind_port, &sa);
	if (p->ufd < 0)
		goto err_free;
	if (!cfg->bind_port && ntohs(sa.sin_port) == p->group_port) {
		/* The kernel's ephemeral port is the group port (both in
		 * 32768..60999 by default): the group socket's bind of
		 * *:group_port would then fail (EADDRINUSE; this socket has no
		 * SO_REUSEADDR).  Bind another while this one still holds
		 * it, so the kernel cannot give the same port again. */
		int held = p->ufd;

		p->ufd = bound_socket(cfg->bind_ipv4, 0, &sa);
		e = errno;
		close(held);
		errno = e;
		if (p->ufd < 0)
			goto err_free;
	}
	set_rcvbuf(p->ufd, p->rcvbuf);
	set_sndbuf(p->ufd, p->sndbuf);
	/* Don't fragment: a datagram larger than the path MTU fails with
	 * EMSGSIZE (counted, tx_too_big) instead of leaving as fragments the
	 * aggregator drops. */
	if (setsockopt(p->ufd, IPPROTO_IP, IP_MTU_DISCOVER, &pmtu_do,
		       sizeof(pmtu_do)) < 0)
		goto err_close;
	p->ipv4 = ntohl(sa.sin_addr.s_addr);
	p->udp_port = ntohs(sa.sin_port);
	p->port.ops = &udp_ops;
	p->port.ctx = p;
	return p;

err_close:
	e = errno;
	close(p->ufd);
	errno = e;
err_free:
	e = errno;
	free(p->mem);
	free(p->free);
	free(p->pkts);
	free(p);
	errno = e;
	return NULL;
}

void hg_udp_port_destroy(struct hg_udp_port *p)
{
	if (!p)
		return;
	if (p->gfd >= 0)
		close(p->gfd);
	close(p->ufd);
	free(p->mem);
	free(p->free);
	free(p->pkts);
	free(p);
}

struct hg_port *hg_udp_port_port(struct hg_udp_port *p)
{
	return p ? &p->port : NULL;
}

int hg_udp_port_local(const struct hg_udp_port *p, uint32_t *ipv4, uint16_t *udp_port)
{
	if (!p || !ipv4 || !udp_port)
		return -EINVAL;
	*ipv4 = p->ipv4;
	*udp_port = p->udp_port;
	return 0;
}

int hg_udp_port_wait(struct hg_udp_port *p, uint64_t timeout_ns)
{
	if (!p)
		return -EINVAL;
	return wait_fds(p,
			timeout_ns > UINT64_MAX - udp_now(p) ?
				UINT64_MAX :
				udp_now(p) + timeout_ns,
			false);
}

int hg_udp_port_get_stats(const struct hg_udp_port *p, struct hg_udp_port_stats *st)
{
	if (!p || !st)
		return -EINVAL;
	*st = p->st;
	return 0;
}
