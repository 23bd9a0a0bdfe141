/* SPDX-License-Identifier: Apache-2.0 */
/*
 * control.h - the daemon's control socket: a UNIX stream socket speaking
 * JSON lines.  One request object per line, one reply object per line:
 *
 *   {"cmd":"add_job","job":7,"token":99,"workers":4,"slots":64,
 *    "payload":1024,"group":"239.1.1.1","shard":0,"incarnation":N,
 *    "auth":"<64 hex digits: the job secret>","mac":"aes-gmac",
 *    "parent":{"ip":"10.0.0.9","mac":"02:..","worker":1,"port":48879,
 *              "shard":0,"group":"239.2.0.1","rto_us":1000}}
 *                                 payload, group, shard, incarnation, auth,
 *                                 parent optional; the secret is never
 *                                 echoed; parent makes this aggregator a
 *                                 tree leaf below that root (ip, mac and
 *                                 worker required; docs/PROTOCOL.md "Tree")
 *                                 -> {"ok":true,"job":7,"incarnation":N}
 *                                 refused (-ERANGE) when W x S, alone or
 *                                 with the jobs registered, exceeds the
 *                                 receive ring (hg_ctl_limits.rx_ring)
 *                                 mac: "aes-gmac" or "blake2b" (default:
 *                                 this host's, hg_auth_default_mac())
 *   {"cmd":"rotate_key","job":7,"auth":"<64 hex digits>","grace_ms":10000}
 *                                 the job's next key epoch (docs/PROTOCOL.md
 *                                 "Key epochs"); grace_ms optional
 *                                 -> {"ok":true,"job":7,"epoch":1}
 *   {"cmd":"rotate_key","job":7,"parent":{"key":"<64 hex>",
 *    "reply_key":"<64 hex>"}}      a tree leaf's keys of the root's next
 *                                 epoch ("Key epochs in a tree")
 *                                 -> {"ok":true,"job":7,"up_epoch":1}
 *   {"cmd":"remove_job","job":7}
 *   {"cmd":"stats"}      -> {"ok":true,"stats":{counter:value,...},...,
 *                            "jobs":[7,...]}
 *   {"cmd":"job_stats","job":7}
 *                        -> {"ok":true,"job":7,"counters":{...},
 *                            "worker_counters":{name:[per worker],...},...}
 *   {"cmd":"shutdown"}
 *
 * Every reply is {"ok":true,...} or {"ok":false,"error":"...","code":-errno};
 * the error names the offending field ("field 'workers': must be 1..256").  A bad
 * request is answered and forgotten: it never stops the daemon.  Requests
 * are parsed by jansson (RFC 8259, UTF-8 checked, duplicate keys refused)
 * and every reply is serialised by it, so every reply is one line of valid
 * JSON whatever the request was; a client's string quoted in an error is
 * cut at 64 bytes on a UTF-8 character boundary.  A request's bytes are
 * wiped from the input buffer once handled, and jansson's memory is zeroed
 * before it is freed (hg_control_create sets its allocator), so a secret
 * does not outlive its request in the daemon's memory.
 *
 * The socket is polled without blocking from the data-path loop
 * (hg_control_poll), so the callbacks run on the lcore that owns the engine
 * and need no locking.
 */
#ifndef HOMAGG_DPDK_CONTROL_H
#define HOMAGG_DPDK_CONTROL_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "homagg/auth.h"

struct hg_ctl_job {
	uint32_t job;
	uint32_t token;
	uint32_t workers;
	uint32_t slots;
	uint32_t payload;     /* bytes per packet */
	uint32_t group;       /* IPv4 host order; 0 = no multicast group */
	uint8_t shard;        /* this aggregator's index among the job's */
	uint32_t incarnation; /* the job's incarnation, never 0 here */
	uint8_t auth;         /* 1: authenticated job, secret below */
	uint8_t secret[HG_AUTH_SECRET_LEN];
	uint32_t mac; /* HG_MAC_*, 0 = the host's default */
	/* parent: a tree leaf's root (homagg/engine.h up_* fields) */
	uint8_t up;
	uint8_t up_mac[6];
	uint32_t up_ipv4; /* host order */
	uint16_t up_port;
	uint16_t up_worker;
	uint16_t up_base;   /* the job's id of the leaf's first worker */
	uint16_t up_leaves; /* L (0: no reports, no root view) */
	uint8_t up_shard;
	uint32_t up_group; /* host order, 0 = none */
	uint64_t up_rto_ns;
	/* an auth leaf: its key at the root, the root's aggregator key
	 * (homagg/engine.h up_key, up_reply_key; wiped like secret) */
	uint8_t up_key[HG_AUTH_KEY_LEN];
	uint8_t up_reply_key[HG_AUTH_KEY_LEN];
};

struct hg_ctl_limits {
	uint32_t max_workers;
	uint32_t max_slots;
	uint32_t max_payload; /* bytes: the largest payload the port's frames hold */
	uint32_t mtu; /* of the port's link, named when a payload is refused */
	uint32_t rx_ring; /* frames the receive ring holds: the sum of the W x S of
				* the jobs registered at most (0: no limit) */
	const char *rx_ring_source; /* what sets rx_ring, named when a job is refused */
};

struct hg_ctl_ops {
	/* 0 or -errno; err (may be left empty) explains a failure. */
	int (*add_job)(void *ctx, const struct hg_ctl_job *j, char *err,
		       size_t errlen);
	int (*remove_job)(void *ctx, uint32_t job);
	/* The job's next key epoch (>= 0) or -errno; err explains a failure. */
	int (*rotate_key)(void *ctx, uint32_t job, const uint8_t *secret,
			  uint64_t grace_ns, char *err, size_t errlen);
	/* Tree leaf job's keys of the root's next epoch: the next upward
	 * epoch (>= 0) or -errno.  NULL: refused as -ENOTSUP. */
	int (*rotate_up_key)(void *ctx, uint32_t job, const uint8_t *key,
			     const uint8_t *reply_key, char *err, size_t errlen);
	/* Add members ("name": value) to the reply object; 0 or -errno. */
	int (*stats)(void *ctx, json_t *reply);
	/* Add one job's members to the reply object; 0, -ENOENT (no such
	 * job) or -errno.  NULL: the command answers -ENOTSUP. */
	int (*job_stats)(void *ctx, uint32_t job, json_t *reply);
	/* Ask the daemon to stop (it replies first). */
	void (*shutdown)(void *ctx);
};

/* Bind and listen on path (an old socket file is replaced).  The socket
 * file is created owner-only (0600) whatever the umask.  NULL with errno
 * set on failure. */
struct hg_control *hg_control_create(const char *path, const struct hg_ctl_ops *ops,
				     void *ctx, const struct hg_ctl_limits *lim);
/* Close every connection and unlink the socket file.  Accepts NULL. */
void hg_control_destroy(struct hg_control *c);

/* Accept, read, answer what is ready, without blocking.  Returns the number
 * of requests handled, or -errno on a failure of the listening socket. */
int hg_control_poll(struct hg_control *c);

/*
 * Handle one request line; the reply (without newline) goes to out.  Used by
 * hg_control_poll and directly by tests.  Returns 0 when the request
 * succeeded, -errno when it was answered with an error.
 */
int hg_control_handle(struct hg_control *c, const char *line, size_t len,
		      char *out, size_t outlen);

#endif /* HOMAGG_DPDK_CONTROL_H */
