/* SPDX-License-Identifier: Apache-2.0 */
/* control.c - JSON-lines control socket of homagg-switch (see control.h). */
#define _GNU_SOURCE /* accept4 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <malloc.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <jansson.h>

#include "homagg/codec.h"
#include "homagg/errors.h"
#include "homagg/wire.h"
#include "control.h"

#define CTL_MAX_CONN 64
#define CTL_IN_CAP 4096
#define CTL_OUT_CAP 65536
#define CTL_REPLY_CAP 32768 /* job_stats of 256 workers: ~15 KB */

struct ctl_conn {
	int fd;       /* -1 = free */
	bool discard; /* skipping the rest of an overlong line */
	size_t in_len;
	size_t out_len;
	char in[CTL_IN_CAP];
	char out[CTL_OUT_CAP];
};

/* A registered job's share of the receive ring: its W x S frames. */
struct ctl_held {
	uint32_t job;
	uint32_t frames;
};

struct hg_control {
	int lfd;
	char path[108];
	const struct hg_ctl_ops *ops;
	void *ctx;
	struct hg_ctl_limits lim;
	struct ctl_held *held; /* the jobs added and not yet removed */
	size_t nheld, capheld;
	uint64_t held_frames; /* the sum of their frames */
	struct ctl_conn conn[CTL_MAX_CONN];
	char reply[CTL_REPLY_CAP];
};

/* jansson's free: its buffers (a parsed secret among them) are zeroed first. */
static void zeroing_free(void *p)
{
	if (p)
		hg_auth_wipe(p, malloc_usable_size(p));
	free(p);
}

struct hg_control *hg_control_create(const char *path, const struct hg_ctl_ops *ops,
				     void *ctx, const struct hg_ctl_limits *lim)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct hg_control *c;
	int i, e;

	if (!path || !ops || !lim || strlen(path) >= sizeof(sa.sun_path)) {
		errno = EINVAL;
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	json_set_alloc_funcs(malloc, zeroing_free);
	c->ops = ops;
	c->ctx = ctx;
	c->lim = *lim;
	for (i = 0; i < CTL_MAX_CONN; i++)
		c->conn[i].fd = -1;
	snprintf(c->path, sizeof(c->path), "%s", path);
	memcpy(sa.sun_path, path, strlen(path) + 1);
	c->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (c->lfd < 0)
		goto err_free;
	unlink(path);
	/* bind() creates the file with the socket inode's mode less the umask:
	 * owner-only from the start, with no window where others could connect */
	if (fchmod(c->lfd, 0600) < 0 ||
	    bind(c->lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    listen(c->lfd, 128) < 0)
		goto err_close;
	return c;

err_close:
	e = errno;
	close(c->lfd);
	errno = e;
err_free:
	e = errno;
	free(c);
	errno = e;
	return NULL;
}

void hg_control_destroy(struct hg_control *c)
{
	int i;

	if (!c)
		return;
	for (i = 0; i < CTL_MAX_CONN; i++)
		if (c->conn[i].fd >= 0)
			close(c->conn[i].fd);
	close(c->lfd);
	unlink(c->path);
	free(c->held);
	free(c);
}

/* ---- request handling ---------------------------------------------- */

/* Every byte of a reply comes from jansson's serialiser, so a reply is valid
 * JSON (and valid UTF-8: jansson refuses other strings) for every input. */

#define CTL_ECHO_MAX 64 /* bytes of a client's string quoted in an error */

/*
 * The length of the longest prefix of s of at most max bytes that does not
 * end inside a UTF-8 sequence (s is valid UTF-8: jansson decoded it).
 */
static int clip_utf8(const char *s, size_t max)
{
	size_t n = strlen(s);

	if (n <= max)
		return (int)n;
	n = max;
	while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
		n--;
	return (int)n;
}

/* A JSON string of msg: a message cut inside a UTF-8 sequence is clipped,
 * and one that is still not UTF-8 has its non-ASCII bytes replaced. */
static json_t *message_string(char *msg, bool truncated)
{
	json_t *s;
	char *p;

	if (truncated)
		msg[clip_utf8(msg, strlen(msg))] = '\0';
	s = json_string(msg);
	if (s)
		return s;
	for (p = msg; *p; p++)
		if ((unsigned char)*p >= 0x80)
			*p = '?';
	return json_string(msg);
}

/* {"ok":false,"error":msg,"code":rc} into *reply; returns rc. */
static int reply_error(json_t **reply, int rc, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int reply_error(json_t **reply, int rc, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	json_decref(*reply);
	*reply = json_pack("{s:b, s:o, s:i}", "ok", 0, "error",
			   message_string(msg, n < 0 || (size_t)n >= sizeof(msg)),
			   "code", rc);
	return rc;
}

/* {"ok":true} plus, when key is set, "key":value. */
static json_t *reply_ok(const char *key, json_int_t value)
{
	return key ? json_pack("{s:b, s:I}", "ok", 1, key, value) :
		     json_pack("{s:b}", "ok", 1);
}

/*
 * An integer field in [lo, hi] (absent: dflt, unless required).  Returns 0,
 * or -EINVAL / -ERANGE with the error reply in *reply.
 */
static int get_uint(const json_t *o, const char *key, bool required, json_int_t lo,
		    json_int_t hi, json_int_t dflt, json_int_t *v, json_t **reply)
{
	const json_t *f = json_object_get(o, key);

	if (!f) {
		if (required)
			return reply_error(reply, -EINVAL,
					   "field '%s': missing", key);
		*v = dflt;
		return 0;
	}
	if (!json_is_integer(f))
		return reply_error(reply, -EINVAL,
				   "field '%s': must be an integer", key);
	*v = json_integer_value(f);
	if (*v < lo || *v > hi)
		return reply_error(reply, -ERANGE, "field '%s': must be %lld..%lld",
				   key, (long long)lo, (long long)hi);
	return 0;
}

/* Strict: every key of o must be in the NULL-terminated list allowed. */
static int check_keys(const json_t *o, const char *const *allowed, json_t **reply)
{
	const char *key;
	json_t *v;
	int k;

	json_object_foreach ((json_t *)o, key, v) {
		for (k = 0; allowed[k]; k++)
			if (strcmp(key, allowed[k]) == 0)
				break;
		if (!allowed[k])
			return reply_error(reply, -EINVAL, "field '%.*s': unknown",
					   clip_utf8(key, CTL_ECHO_MAX), key);
	}
	return 0;
}

/*
 * 32 bytes given as 64 hex digits (a job secret, a key) from string f into
 * out.  jansson's copy of the string is wiped at once (its memory is also
 * zeroed when freed: zeroing_free); on a bad string out is wiped.  0 or
 * -EINVAL (the caller names the field).
 */
static int get_hex32(const json_t *f, uint8_t out[32])
{
	const char *h = json_is_string(f) ? json_string_value(f) : "";
	size_t len = strlen(h);
	int rc = 0;

	if (len != 64)
		rc = -EINVAL;
	for (int i = 0; !rc && i < 32; i++) {
		unsigned int b;

		if (!isxdigit((unsigned char)h[2 * i]) ||
		    !isxdigit((unsigned char)h[2 * i + 1]) ||
		    sscanf(h + 2 * i, "%2x", &b) != 1)
			rc = -EINVAL;
		else
			out[i] = (uint8_t)b;
	}
	if (rc)
		hg_auth_wipe(out, 32);
	if (len)
		hg_auth_wipe((char *)h, len);
	return rc;
}

/*
 * The optional "auth" field: the job secret as 64 hex digits.  Its value
 * never appears in a reply (nor anywhere else: the daemon logs no request).
 * The port's payload limit already leaves room for the MAC.
 */
static int get_secret(const json_t *o, struct hg_ctl_job *j, json_t **reply)
{
	const json_t *f = json_object_get(o, "auth");

	if (!f || json_is_null(f))
		return 0;
	if (get_hex32(f, j->secret))
		return reply_error(reply, -EINVAL,
				   "field 'auth': must be the job secret as a string of "
				   "%d hexadecimal digits",
				   2 * HG_AUTH_SECRET_LEN);
	j->auth = 1;
	return 0;
}

/* What a request may leave of a secret or key in the job record. */
static void ctl_job_wipe(struct hg_ctl_job *j)
{
	hg_auth_wipe(j->secret, sizeof(j->secret));
	hg_auth_wipe(j->up_key, sizeof(j->up_key));
	hg_auth_wipe(j->up_reply_key, sizeof(j->up_reply_key));
}

/* The optional "mac" field of an auth job: its algorithm. */
static int get_mac(const json_t *o, struct hg_ctl_job *j, json_t **reply)
{
	const json_t *f = json_object_get(o, "mac");
	const char *s = json_is_string(f) ? json_string_value(f) : "";

	if (!f || json_is_null(f))
		return 0;
	if (!j->auth)
		return reply_error(reply, -EINVAL,
				   "field 'mac': only with 'auth' (the job secret)");
	if (!strcmp(s, "umac"))
		j->mac = HG_MAC_UMAC;
	else if (!strcmp(s, "aes-gmac"))
		j->mac = HG_MAC_AES_GMAC;
	else if (!strcmp(s, "blake2b"))
		j->mac = HG_MAC_BLAKE2B;
	else
		return reply_error(reply, -EINVAL,
				   "field 'mac': must be \"umac\", \"aes-gmac\" or "
				   "\"blake2b\"");
	if (!hg_auth_mac_available(j->mac))
		return reply_error(reply, -ENOTSUP,
				   j->mac == HG_MAC_UMAC ?
					   "field 'mac': this host's CPU lacks AES-NI "
					   "for umac: use \"blake2b\"" :
					   "field 'mac': this host's CPU lacks AES-NI or "
					   "PCLMULQDQ for aes-gmac: use \"blake2b\"");
	return 0;
}

/* check_keys, then the required "job" (a uint32) into *job.  Returns 0,
 * or -EINVAL / -ERANGE with the error reply in *reply. */
static int keys_and_job(const json_t *o, const char *const *keys,
			json_int_t *job, json_t **reply)
{
	int rc = check_keys(o, keys, reply);

	if (rc)
		return rc;
	return get_uint(o, "job", true, 0, UINT32_MAX, 0, job, reply);
}

/* An IPv4 address string field of o (absent: 0 unless required);
 * multicast: must be 224/4. */
static int get_ipv4(const json_t *o, const char *key, bool required,
		    bool multicast, uint32_t *out, json_t **reply)
{
	const json_t *g = json_object_get(o, key);
	struct in_addr a;

	*out = 0;
	if (!g || json_is_null(g))
		return required ? reply_error(reply, -EINVAL,
					      "field '%s': missing", key) :
				  0;
	if (!json_is_string(g) || inet_pton(AF_INET, json_string_value(g), &a) != 1)
		return reply_error(reply, -EINVAL,
				   "field '%s': must be an IPv4 address string",
				   key);
	*out = ntohl(a.s_addr);
	if (multicast && (*out >> 28) != 0xE)
		return reply_error(reply, -EINVAL,
				   "field '%s': %s is not a multicast address",
				   key, json_string_value(g));
	return 0;
}

/*
 * The optional "parent" object: this aggregator is a tree leaf below the
 * root it names (docs/PROTOCOL.md "Tree").  ip, mac and worker (the leaf's
 * id at the root) are required; port, shard, group (the root's result
 * group, joined), rto_us, base (the job's id of the leaf's first worker)
 * and leaves (L: with base, the leaf reports its missing workers to the
 * root and passes the root's view to its workers, docs/PROTOCOL.md "Who
 * is missing in a tree") are optional.  A leaf of an authenticated job
 * ("auth", the leaf job's own secret) also needs "key" (its key as worker
 * `worker` of the root's job) and "reply_key" (the root's aggregator key),
 * 64 hex digits each, derived from the root job's secret by whoever
 * registers the tree: the leaf never holds the root's secret.
 */
/* parent.key and parent.reply_key of object p (both required) into
 * j->up_key and j->up_reply_key. */
static int get_up_keys(const json_t *p, struct hg_ctl_job *j, json_t **reply)
{
	static const char *const auth_keys[] = { "key", "reply_key" };

	for (int k = 0; k < 2; k++) {
		const json_t *f = json_object_get(p, auth_keys[k]);
		uint8_t *out = k ? j->up_reply_key : j->up_key;

		if (!f || json_is_null(f))
			return reply_error(reply, -EINVAL,
					   "field 'parent.%s': "
					   "missing: an authenticated leaf needs %s "
					   "from the root job's secret (64 hex digits)",
					   auth_keys[k],
					   k ? "the root's aggregator key" :
					       "its own key at the root");
		if (get_hex32(f, out))
			return reply_error(reply, -EINVAL,
					   "field 'parent.%s': must "
					   "be a key as a string of %d hexadecimal "
					   "digits",
					   auth_keys[k], 2 * HG_AUTH_KEY_LEN);
	}
	return 0;
}

static int get_parent(struct hg_control *c, const json_t *o,
		      struct hg_ctl_job *j, json_t **reply)
{
	static const char *const keys[] = { "ip",     "mac",    "worker",
					    "port",   "shard",  "group",
					    "rto_us", "key",    "reply_key",
					    "base",   "leaves", NULL };
	static const char *const auth_keys[] = { "key", "reply_key" };
	const json_t *p = json_object_get(o, "parent"), *m;
	unsigned int b[6];
	json_int_t v;
	char tail;
	int rc;

	if (!p || json_is_null(p))
		return 0;
	if (!json_is_object(p))
		return reply_error(reply, -EINVAL,
				   "field 'parent': must be an "
				   "object {\"ip\":..,\"mac\":..,\"worker\":..}");
	if ((rc = check_keys(p, keys, reply)) ||
	    (rc = get_ipv4(p, "ip", true, false, &j->up_ipv4, reply)) ||
	    (rc = get_ipv4(p, "group", false, true, &j->up_group, reply)))
		return rc;
	m = json_object_get(p, "mac");
	if (!m || !json_is_string(m) ||
	    sscanf(json_string_value(m), "%2x:%2x:%2x:%2x:%2x:%2x%c", &b[0],
		   &b[1], &b[2], &b[3], &b[4], &b[5], &tail) != 6)
		return reply_error(reply, -EINVAL,
				   "field 'parent.mac': must be "
				   "a MAC address string like \"02:00:00:00:00:01\"");
	for (int i = 0; i < 6; i++)
		j->up_mac[i] = (uint8_t)b[i];
	if ((rc = get_uint(p, "worker", true, 0, c->lim.max_workers - 1, 0, &v,
			   reply)))
		return rc;
	j->up_worker = (uint16_t)v;
	if ((rc = get_uint(p, "leaves", false, 0, HG_MAX_WORKERS, 0, &v, reply)))
		return rc;
	j->up_leaves = (uint16_t)v;
	if (j->up_leaves && j->up_worker >= j->up_leaves)
		return reply_error(reply, -EINVAL,
				   "field 'parent.worker': must be below "
				   "'parent.leaves' (the leaf's index at the root)");
	if ((rc = get_uint(p, "base", false, 0, HG_MAX_WORKERS - 1, 0, &v, reply)))
		return rc;
	j->up_base = (uint16_t)v;
	if (j->up_base + j->workers > HG_MAX_WORKERS)
		return reply_error(reply, -ERANGE,
				   "field 'parent.base': the leaf's workers "
				   "base..base+workers-1 must be job workers "
				   "below %u",
				   HG_MAX_WORKERS);
	if ((rc = get_uint(p, "port", false, 1, 65535, HG_UDP_PORT, &v, reply)))
		return rc;
	j->up_port = (uint16_t)v;
	if ((rc = get_uint(p, "shard", false, 0, 63, 0, &v, reply)))
		return rc;
	j->up_shard = (uint8_t)v;
	if ((rc = get_uint(p, "rto_us", false, 1, 10000000, 0, &v, reply)))
		return rc;
	j->up_rto_ns = (uint64_t)v * 1000;
	for (int k = 0; k < 2 && !j->auth; k++) {
		const json_t *f = json_object_get(p, auth_keys[k]);

		if (f && !json_is_null(f))
			return reply_error(reply, -EINVAL,
					   "field 'parent.%s': only "
					   "with 'auth' (the leaf job's secret)",
					   auth_keys[k]);
	}
	if (j->auth && (rc = get_up_keys(p, j, reply)))
		return rc;
	j->up = 1;
	return 0;
}

/*
 * Every worker may have S chunks in flight, one frame each towards this
 * aggregator: W x S frames can wait in the port's receive ring while the
 * engine is busy.  A ring that holds fewer drops frames of every window
 * (measured: 4 x 256 frames of 8 KB into af_packet's 512 gave thousands of
 * retransmissions per allreduce), so such a job is refused, with the fix.
 */
#define CTL_HELD_NAMED 8 /* jobs named in a refusal, then how many more */

/* "job 7: 512, job 8: 384" (the first CTL_HELD_NAMED jobs holding the ring)
 * into buf. */
static void held_list(const struct hg_control *c, char *buf, size_t len)
{
	size_t i, n = 0;

	buf[0] = '\0';
	for (i = 0; i < c->nheld && i < CTL_HELD_NAMED && n < len; i++)
		n += (size_t)snprintf(buf + n, len - n, "%sjob %u: %u",
				      i ? ", " : "", c->held[i].job,
				      c->held[i].frames);
	if (c->nheld > CTL_HELD_NAMED && n < len)
		snprintf(buf + n, len - n, " and %zu more",
			 c->nheld - CTL_HELD_NAMED);
}

/*
 * The jobs registered together share the ring: a job that fits alone is
 * still refused when its frames and those already held add up to more.
 */
static int check_in_flight_total(struct hg_control *c,
				 const struct hg_ctl_job *j, json_t **reply)
{
	uint64_t frames = (uint64_t)j->workers * j->slots;
	uint64_t total = c->held_frames + frames;
	uint64_t fit = c->held_frames < c->lim.rx_ring ?
			       (c->lim.rx_ring - c->held_frames) / j->workers :
			       0;
	char jobs[256], fix[64] = "";
	size_t i;

	if (!c->lim.rx_ring || total <= c->lim.rx_ring)
		return 0;
	for (i = 0; i < c->nheld; i++)
		if (c->held[i].job == j->job)
			return 0; /* the engine answers "already exists" */
	held_list(c, jobs, sizeof(jobs));
	if (fit)
		snprintf(fix, sizeof(fix), "use at most %llu slots, ",
			 (unsigned long long)fit);
	return reply_error(reply, -ERANGE,
			   "field 'slots': %u workers x %u slots = %llu frames "
			   "in flight, with the %llu held by the jobs already on "
			   "this aggregator (%s), make %llu frames, more than its "
			   "receive ring of %u frames (%s): %sremove one of those "
			   "jobs first, or a daemon with a larger ring (af_packet: "
			   "framecnt=N in its --vdev; other PMDs: --rx-ring N)",
			   j->workers, j->slots, (unsigned long long)frames,
			   (unsigned long long)c->held_frames, jobs,
			   (unsigned long long)total, c->lim.rx_ring,
			   c->lim.rx_ring_source ? c->lim.rx_ring_source : "rx ring",
			   fix);
}

static int check_in_flight(struct hg_control *c, const struct hg_ctl_job *j,
			   json_t **reply)
{
	uint64_t frames = (uint64_t)j->workers * j->slots;
	uint32_t fit = c->lim.rx_ring / j->workers;

	if (!c->lim.rx_ring || frames <= c->lim.rx_ring)
		return check_in_flight_total(c, j, reply);
	return reply_error(reply, -ERANGE,
			   "field 'slots': %u workers x %u slots = %llu frames "
			   "of %u-byte payloads in flight exceed this "
			   "aggregator's receive ring of %u frames (%s): use at "
			   "most %u %s, or a daemon with a larger ring (af_packet: framecnt=N "
			   "in its --vdev; other PMDs: --rx-ring N)",
			   j->workers, j->slots, (unsigned long long)frames,
			   j->payload, c->lim.rx_ring,
			   c->lim.rx_ring_source ? c->lim.rx_ring_source : "rx ring",
			   fit ? fit : c->lim.rx_ring, fit ? "slots" : "workers");
}

/* Room for one more entry in c->held: 0 or -ENOMEM. */
static int held_reserve(struct hg_control *c)
{
	struct ctl_held *h;
	size_t cap;

	if (c->nheld < c->capheld)
		return 0;
	cap = c->capheld ? 2 * c->capheld : 16;
	h = realloc(c->held, cap * sizeof(*h));
	if (!h)
		return -ENOMEM;
	c->held = h;
	c->capheld = cap;
	return 0;
}

/* The job gives its frames back (nothing when it held none). */
static void held_release(struct hg_control *c, uint32_t job)
{
	size_t i;

	for (i = 0; i < c->nheld; i++)
		if (c->held[i].job == job) {
			c->held_frames -= c->held[i].frames;
			memmove(&c->held[i], &c->held[i + 1],
				(c->nheld - i - 1) * sizeof(c->held[0]));
			c->nheld--;
			return;
		}
}

static int do_add_job(struct hg_control *c, const json_t *o, json_t **reply)
{
	static const char *const keys[] = { "cmd",     "job",    "token",
					    "workers", "slots",  "payload",
					    "group",   "shard",  "incarnation",
					    "auth",    "parent", "mac",
					    NULL };
	struct hg_ctl_job j = { 0 };
	char err[256] = "";
	json_int_t v;
	int rc;

	if ((rc = keys_and_job(o, keys, &v, reply)))
		return rc;
	j.job = (uint32_t)v;
	if ((rc = get_uint(o, "token", true, 0, UINT32_MAX, 0, &v, reply)))
		return rc;
	j.token = (uint32_t)v;
	if ((rc = get_uint(o, "workers", true, 1, c->lim.max_workers, 0, &v, reply)))
		return rc;
	j.workers = (uint32_t)v;
	if ((rc = get_uint(o, "slots", true, 1, c->lim.max_slots, 0, &v, reply)))
		return rc;
	j.slots = (uint32_t)v;
	if ((rc = get_uint(o, "payload", false, 4, HG_MAX_PAYLOAD, 1024, &v, reply)))
		return rc;
	if (v % 4)
		return reply_error(reply, -EINVAL,
				   "field 'payload': must be a multiple of 4");
	if (v > c->lim.max_payload)
		return reply_error(reply, -ERANGE,
				   "field 'payload': %lld bytes do not fit this "
				   "aggregator's frames: at most %u bytes at MTU %u "
				   "(payloads up to %d need a link and daemon with "
				   "MTU 9000: --mtu 9000)",
				   (long long)v, c->lim.max_payload, c->lim.mtu,
				   HG_MAX_PAYLOAD);
	j.payload = (uint32_t)v;
	if ((rc = check_in_flight(c, &j, reply)))
		return rc;
	if ((rc = get_ipv4(o, "group", false, true, &j.group, reply)))
		return rc;
	if ((rc = get_uint(o, "shard", false, 0, 63, 0, &v, reply)))
		return rc;
	j.shard = (uint8_t)v;
	if ((rc = get_uint(o, "incarnation", false, 1, UINT32_MAX, 0, &v, reply)))
		return rc;
	j.incarnation = v ? (uint32_t)v : hg_wire_incarnation_now();
	rc = get_secret(o, &j, reply);
	if (!rc)
		rc = get_mac(o, &j, reply);
	if (!rc)
		rc = get_parent(c, o, &j, reply);
	if (rc) {
		ctl_job_wipe(&j);
		return rc;
	}
	rc = held_reserve(c);
	if (!rc)
		rc = c->ops->add_job(c->ctx, &j, err, sizeof(err));
	ctl_job_wipe(&j);
	if (rc < 0)
		return reply_error(reply, rc, "add_job %u: %s", j.job,
				   err[0] ? err : hg_strerror(rc));
	c->held[c->nheld++] = (struct ctl_held){ j.job, j.workers * j.slots };
	c->held_frames += j.workers * j.slots;
	*reply = reply_ok("job", j.job);
	if (*reply)
		json_object_set_new(*reply, "incarnation",
				    json_integer(j.incarnation));
	return 0;
}

static int do_remove_job(struct hg_control *c, const json_t *o, json_t **reply)
{
	static const char *const keys[] = { "cmd", "job", NULL };
	json_int_t v;
	int rc;

	if ((rc = keys_and_job(o, keys, &v, reply)))
		return rc;
	rc = c->ops->remove_job(c->ctx, (uint32_t)v);
	if (rc < 0)
		return reply_error(reply, rc, "remove_job %u: %s", (uint32_t)v,
				   hg_strerror(rc));
	held_release(c, (uint32_t)v);
	*reply = reply_ok("job", v);
	return 0;
}

/* rotate_key with "parent" (a tree leaf's keys of the root's next epoch,
 * docs/PROTOCOL.md "Key epochs in a tree"): replies with "up_epoch". */
static int rotate_up_key(struct hg_control *c, const json_t *o, uint32_t job,
			 json_t **reply)
{
	static const char *const keys[] = { "key", "reply_key", NULL };
	const json_t *p = json_object_get(o, "parent");
	struct hg_ctl_job j = { .job = job };
	char err[256] = "";
	int rc;

	if (json_object_get(o, "auth") || json_object_get(o, "grace_ms"))
		return reply_error(reply, -EINVAL,
				   "field 'parent': the root's next keys for a "
				   "tree leaf, without 'auth' or 'grace_ms' "
				   "(rotate the leaf's own secret in a request "
				   "of its own)");
	if (!json_is_object(p))
		return reply_error(reply, -EINVAL,
				   "field 'parent': must be an object "
				   "{\"key\":..,\"reply_key\":..}");
	if (!c->ops->rotate_up_key)
		return reply_error(reply, -ENOTSUP,
				   "rotate_key: 'parent' not supported here");
	rc = check_keys(p, keys, reply);
	if (!rc)
		rc = get_up_keys(p, &j, reply);
	if (!rc) {
		rc = c->ops->rotate_up_key(c->ctx, job, j.up_key,
					   j.up_reply_key, err, sizeof(err));
		if (rc < 0)
			rc = reply_error(reply, rc, "rotate_key %u: %s", job,
					 err[0] ? err : hg_strerror(rc));
		else if (!(*reply = reply_ok("job", job)) ||
			 json_object_set_new(*reply, "up_epoch",
					     json_integer(rc)) < 0)
			rc = -ENOMEM;
		else
			rc = 0;
	}
	ctl_job_wipe(&j);
	return rc;
}

static int do_rotate_key(struct hg_control *c, const json_t *o, json_t **reply)
{
	static const char *const keys[] = { "cmd",      "job",    "auth",
					    "grace_ms", "parent", NULL };
	struct hg_ctl_job j = { 0 };
	char err[256] = "";
	json_int_t v, grace;
	int rc;

	if ((rc = keys_and_job(o, keys, &v, reply)))
		return rc;
	j.job = (uint32_t)v;
	if (json_object_get(o, "parent"))
		return rotate_up_key(c, o, j.job, reply);
	if ((rc = get_uint(o, "grace_ms", false, 0, 86400000, 10000, &grace, reply)))
		return rc;
	if ((rc = get_secret(o, &j, reply)))
		return rc;
	if (!j.auth)
		return reply_error(reply, -EINVAL,
				   "field 'auth': missing (the new epoch's secret "
				   "as %d hexadecimal digits; or 'parent' with a "
				   "tree leaf's keys of the root's next epoch)",
				   2 * HG_AUTH_SECRET_LEN);
	rc = c->ops->rotate_key(c->ctx, j.job, j.secret,
				(uint64_t)grace * 1000000, err, sizeof(err));
	hg_auth_wipe(j.secret, sizeof(j.secret));
	if (rc < 0)
		return reply_error(reply, rc, "rotate_key %u: %s", j.job,
				   err[0] ? err : hg_strerror(rc));
	*reply = reply_ok("job", j.job);
	if (json_object_set_new(*reply, "epoch", json_integer(rc)) < 0)
		return -ENOMEM;
	return 0;
}

/* A request without arguments ({"cmd": ...} alone): checked, and *reply
 * set to an empty ok reply to fill in. */
static int no_args_reply(const json_t *o, json_t **reply)
{
	static const char *const keys[] = { "cmd", NULL };
	int rc;

	if ((rc = check_keys(o, keys, reply)))
		return rc;
	*reply = reply_ok(NULL, 0);
	return *reply ? 0 : -ENOMEM;
}

static int stats_jobs(struct hg_control *c, json_t **reply);

static int do_stats(struct hg_control *c, const json_t *o, json_t **reply)
{
	int rc;

	if ((rc = no_args_reply(o, reply)))
		return rc;
	rc = c->ops->stats(c->ctx, *reply);
	if (rc < 0)
		return reply_error(reply, rc, "stats: %s", hg_strerror(rc));
	return stats_jobs(c, reply);
}

/* "jobs": the ids of the jobs registered, in the order they were added. */
static int stats_jobs(struct hg_control *c, json_t **reply)
{
	json_t *a = json_array();
	size_t i;

	for (i = 0; a && i < c->nheld; i++)
		if (json_array_append_new(a, json_integer(c->held[i].job)) < 0)
			break;
	if (!a || i < c->nheld || json_object_set_new(*reply, "jobs", a) < 0) {
		json_decref(a);
		return reply_error(reply, -ENOMEM, "stats: %s",
				   hg_strerror(-ENOMEM));
	}
	return 0;
}

static int do_job_stats(struct hg_control *c, const json_t *o, json_t **reply)
{
	static const char *const keys[] = { "cmd", "job", NULL };
	json_int_t v;
	int rc;

	if ((rc = keys_and_job(o, keys, &v, reply)))
		return rc;
	*reply = reply_ok("job", v);
	if (!*reply)
		return -ENOMEM;
	rc = c->ops->job_stats ? c->ops->job_stats(c->ctx, (uint32_t)v, *reply) :
				 -ENOTSUP;
	if (rc < 0)
		return reply_error(reply, rc, "job_stats %u: %s", (uint32_t)v,
				   rc == -ENOENT ? "no such job" : hg_strerror(rc));
	return 0;
}

static int do_shutdown(struct hg_control *c, const json_t *o, json_t **reply)
{
	int rc;

	if ((rc = no_args_reply(o, reply)))
		return rc;
	c->ops->shutdown(c->ctx);
	return 0;
}

/* Parse and answer one request; the reply object goes to *reply. */
static int dispatch(struct hg_control *c, const char *line, size_t len,
		    json_t **reply)
{
	static const struct {
		const char *name;
		int (*fn)(struct hg_control *, const json_t *, json_t **);
	} cmds[] = {
		{ "add_job", do_add_job },
		{ "remove_job", do_remove_job },
		{ "rotate_key", do_rotate_key },
		{ "stats", do_stats },
		{ "job_stats", do_job_stats },
		{ "shutdown", do_shutdown },
	};
	json_error_t e;
	const json_t *cmd;
	const char *name;
	json_t *o;
	size_t i;
	int rc;

	/* RFC 8259 with UTF-8 checked, no NUL in strings, no duplicate keys,
	 * nothing after the value */
	o = json_loadb(line, len, JSON_REJECT_DUPLICATES, &e);
	if (!o)
		return reply_error(reply, -EINVAL, "bad JSON at byte %d: %s",
				   e.position, e.text);
	if (!json_is_object(o)) {
		rc = reply_error(reply, -EINVAL,
				 "bad JSON at byte 0: expected an object");
		goto out;
	}
	cmd = json_object_get(o, "cmd");
	if (!cmd) {
		rc = reply_error(reply, -EINVAL, "field 'cmd': missing");
		goto out;
	}
	if (!json_is_string(cmd)) {
		rc = reply_error(reply, -EINVAL, "field 'cmd': must be a string");
		goto out;
	}
	name = json_string_value(cmd);
	for (i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		if (strcmp(name, cmds[i].name) == 0) {
			rc = cmds[i].fn(c, o, reply);
			goto out;
		}
	rc = reply_error(reply, -EINVAL,
			 "field 'cmd': unknown command '%.*s' (add_job, "
			 "remove_job, rotate_key, stats, job_stats, shutdown)",
			 clip_utf8(name, CTL_ECHO_MAX), name);
out:
	json_decref(o);
	return rc;
}

/* Serialise reply (and drop it) into out as one line without newline.
 * Returns rc, or -ENOMEM / -ENOSPC with a fixed error reply in out. */
static int reply_dump(json_t *reply, int rc, char *out, size_t outlen)
{
	static const char nomem[] = "{\"ok\":false,\"error\":\"out of memory\",\"code\":-12}";
	static const char toolong[] = "{\"ok\":false,\"error\":\"reply too long\",\"code\":-28}";
	size_t n;

	if (!reply) {
		snprintf(out, outlen, "%s", nomem);
		return -ENOMEM;
	}
	n = json_dumpb(reply, out, outlen, JSON_COMPACT);
	json_decref(reply);
	if (n == 0 || n >= outlen) {
		snprintf(out, outlen, "%s", toolong);
		return -ENOSPC;
	}
	out[n] = '\0';
	return rc;
}

int hg_control_handle(struct hg_control *c, const char *line, size_t len,
		      char *out, size_t outlen)
{
	json_t *reply = NULL;
	int rc = dispatch(c, line, len, &reply);

	return reply_dump(reply, rc, out, outlen);
}

/* ---- socket plumbing ------------------------------------------------ */

static void conn_close(struct ctl_conn *k)
{
	close(k->fd);
	k->fd = -1;
	k->discard = false;
	k->in_len = 0;
	k->out_len = 0;
}

/* Send what is buffered; false when the connection broke. */
static bool conn_flush(struct ctl_conn *k)
{
	while (k->out_len) {
		ssize_t n = send(k->fd, k->out, k->out_len, MSG_NOSIGNAL);

		if (n < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return true;
			if (errno == EINTR)
				continue;
			return false;
		}
		memmove(k->out, k->out + n, k->out_len - (size_t)n);
		k->out_len -= (size_t)n;
	}
	return true;
}

/* Queue reply + newline; false when a client does not read its replies. */
static bool conn_queue(struct ctl_conn *k, const char *s)
{
	size_t n = strlen(s);

	if (k->out_len + n + 1 > sizeof(k->out))
		return false;
	memcpy(k->out + k->out_len, s, n);
	k->out[k->out_len + n] = '\n';
	k->out_len += n + 1;
	return true;
}

/* Answer every complete line in k's input; returns requests handled or -1
 * when k must be closed. */
static int conn_process(struct hg_control *c, struct ctl_conn *k)
{
	int handled = 0;
	size_t start = 0, i;

	for (i = 0; i < k->in_len; i++) {
		size_t len;

		if (k->in[i] != '\n')
			continue;
		len = i - start;
		if (k->discard) {
			/* the tail of an overlong request: already answered */
			k->discard = false;
		} else {
			if (len && k->in[start + len - 1] == '\r')
				len--;
			if (len) {
				hg_control_handle(c, k->in + start, len,
						  c->reply, sizeof(c->reply));
				if (!conn_queue(k, c->reply))
					return -1;
				handled++;
			}
		}
		start = i + 1;
	}
	if (k->discard)
		start = k->in_len;
	memmove(k->in, k->in + start, k->in_len - start);
	k->in_len -= start;
	/* the handled requests (a secret among them) leave no copy behind */
	hg_auth_wipe(k->in + k->in_len, start);
	if (k->in_len == sizeof(k->in)) {
		/* a line longer than the buffer: answer once, skip to its end */
		json_t *reply = NULL;

		reply_error(&reply, -EINVAL, "request longer than %d bytes",
			    CTL_IN_CAP - 1);
		reply_dump(reply, 0, c->reply, sizeof(c->reply));
		if (!conn_queue(k, c->reply))
			return -1;
		k->discard = true;
		hg_auth_wipe(k->in, k->in_len);
		k->in_len = 0;
		handled++;
	}
	return handled;
}

int hg_control_poll(struct hg_control *c)
{
	int handled = 0, i;

	/* existing connections first: closed ones free their slot */
	for (i = 0; i < CTL_MAX_CONN; i++) {
		struct ctl_conn *k = &c->conn[i];
		bool eof = false;
		int r;

		if (k->fd < 0)
			continue;
		while (k->in_len < sizeof(k->in)) {
			ssize_t n = recv(k->fd, k->in + k->in_len,
					 sizeof(k->in) - k->in_len, 0);

			if (n > 0) {
				k->in_len += (size_t)n;
				continue;
			}
			if (n == 0)
				eof = true;
			else if (errno == EINTR)
				continue;
			else if (errno != EAGAIN && errno != EWOULDBLOCK)
				eof = true;
			break;
		}
		r = conn_process(c, k);
		if (r < 0) {
			conn_close(k);
			continue;
		}
		handled += r;
		/* after EOF, replies already queued are sent once, then close */
		if (!conn_flush(k) || eof)
			conn_close(k);
	}
	for (;;) {
		int fd = accept4(c->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK ||
			    errno == EINTR || errno == ECONNABORTED)
				break;
			return -errno;
		}
		for (i = 0; i < CTL_MAX_CONN; i++)
			if (c->conn[i].fd < 0)
				break;
		if (i == CTL_MAX_CONN) {
			static const char busy[] = "{\"ok\":false,\"error\":\"too many control connections\"}\n";
			ssize_t n = send(fd, busy, sizeof(busy) - 1, MSG_NOSIGNAL);

			(void)n;
			close(fd);
			continue;
		}
		c->conn[i].fd = fd;
		c->conn[i].discard = false;
		c->conn[i].in_len = 0;
		c->conn[i].out_len = 0;
	}
	return handled;
}
