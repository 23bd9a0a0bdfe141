/* SPDX-License-Identifier: Apache-2.0 */
/* control.c - JSON-lines control socket of homagg-switch (see control.h). */
#define _GNU_SOURCE   /* accept4 */
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "homagg/errors.h"
#include "homagg/wire.h"
#include "control.h"

#define CTL_MAX_CONN 64
#define CTL_IN_CAP 4096
#define CTL_OUT_CAP 65536
#define CTL_REPLY_CAP 16384

struct ctl_conn {
	int fd;               /* -1 = free */
	bool discard;         /* skipping the rest of an overlong line */
	size_t in_len;
	size_t out_len;
	char in[CTL_IN_CAP];
	char out[CTL_OUT_CAP];
};

struct hg_control {
	int lfd;
	char path[108];
	const struct hg_ctl_ops *ops;
	void *ctx;
	struct hg_ctl_limits lim;
	struct ctl_conn conn[CTL_MAX_CONN];
	char reply[CTL_REPLY_CAP];
};

struct hg_control *hg_control_create(const char *path,
				     const struct hg_ctl_ops *ops, void *ctx,
				     const struct hg_ctl_limits *lim)
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
	if (bind(c->lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
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
	free(c);
}

/* ---- request handling ---------------------------------------------- */

static int reply_error(char *out, size_t outlen, int rc, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int reply_error(char *out, size_t outlen, int rc, const char *fmt, ...)
{
	struct hg_json_out w;
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	hg_json_out_init(&w, out, outlen);
	hg_json_raw(&w, "{\"ok\":false,\"error\":");
	hg_json_str(&w, msg);
	hg_json_key(&w, "code");
	hg_json_i64(&w, rc);
	hg_json_raw(&w, "}");
	if (hg_json_finish(&w) < 0)
		snprintf(out, outlen, "{\"ok\":false,\"error\":\"reply too long\"}");
	return rc;
}

/*
 * An integer field in [lo, hi].  Returns 0, or -EINVAL / -ERANGE with the
 * reply already written.
 */
static int get_uint(const struct hg_json_obj *o, const char *key, bool required,
		    int64_t lo, int64_t hi, int64_t dflt, int64_t *v,
		    char *out, size_t outlen)
{
	const struct hg_json_field *f = hg_json_get(o, key);

	if (!f) {
		if (required)
			return reply_error(out, outlen, -EINVAL,
					   "field '%s': missing", key);
		*v = dflt;
		return 0;
	}
	if (f->type != HG_JSON_NUMBER || !f->is_int)
		return reply_error(out, outlen, -EINVAL,
				   "field '%s': must be an integer", key);
	if (f->ival < lo || f->ival > hi)
		return reply_error(out, outlen, -ERANGE,
				   "field '%s': must be %lld..%lld", key,
				   (long long)lo, (long long)hi);
	*v = f->ival;
	return 0;
}

/* Every key of o must be in the NULL-terminated list allowed. */
static int check_keys(const struct hg_json_obj *o, const char *const *allowed,
		      char *out, size_t outlen)
{
	int i, k;

	for (i = 0; i < o->n; i++) {
		for (k = 0; allowed[k]; k++)
			if (strcmp(o->f[i].key, allowed[k]) == 0)
				break;
		if (!allowed[k])
			return reply_error(out, outlen, -EINVAL,
					   "field '%s': unknown", o->f[i].key);
	}
	return 0;
}

static int do_add_job(struct hg_control *c, const struct hg_json_obj *o,
		      char *out, size_t outlen)
{
	static const char *const keys[] = { "cmd", "job", "token", "workers",
		"slots", "payload", "group", "shard", "incarnation", NULL };
	struct hg_ctl_job j = { 0 };
	const struct hg_json_field *g;
	char err[256] = "";
	int64_t v;
	int rc;

	rc = check_keys(o, keys, out, outlen);
	if (rc)
		return rc;
	if ((rc = get_uint(o, "job", true, 0, UINT32_MAX, 0, &v, out, outlen)))
		return rc;
	j.job = (uint32_t)v;
	if ((rc = get_uint(o, "token", true, 0, UINT32_MAX, 0, &v, out, outlen)))
		return rc;
	j.token = (uint32_t)v;
	if ((rc = get_uint(o, "workers", true, 1, c->lim.max_workers, 0, &v,
			   out, outlen)))
		return rc;
	j.workers = (uint32_t)v;
	if ((rc = get_uint(o, "slots", true, 1, c->lim.max_slots, 0, &v,
			   out, outlen)))
		return rc;
	j.slots = (uint32_t)v;
	if ((rc = get_uint(o, "payload", false, 4, c->lim.max_payload, 1024,
			   &v, out, outlen)))
		return rc;
	if (v % 4)
		return reply_error(out, outlen, -EINVAL,
				   "field 'payload': must be a multiple of 4");
	j.payload = (uint32_t)v;
	g = hg_json_get(o, "group");
	if (g && g->type != HG_JSON_NULL) {
		struct in_addr a;

		if (g->type != HG_JSON_STRING || inet_pton(AF_INET, g->str, &a) != 1)
			return reply_error(out, outlen, -EINVAL,
					   "field 'group': must be an IPv4 address string");
		j.group = ntohl(a.s_addr);
		if ((j.group >> 28) != 0xE)
			return reply_error(out, outlen, -EINVAL,
					   "field 'group': %s is not a multicast address",
					   g->str);
	}
	if ((rc = get_uint(o, "shard", false, 0, 63, 0, &v, out, outlen)))
		return rc;
	j.shard = (uint8_t)v;
	if ((rc = get_uint(o, "incarnation", false, 1, UINT32_MAX, 0, &v,
			   out, outlen)))
		return rc;
	j.incarnation = v ? (uint32_t)v : hg_wire_incarnation_now();
	rc = c->ops->add_job(c->ctx, &j, err, sizeof(err));
	if (rc < 0)
		return reply_error(out, outlen, rc, "add_job %u: %s", j.job,
				   err[0] ? err : hg_strerror(rc));
	snprintf(out, outlen, "{\"ok\":true,\"job\":%u,\"incarnation\":%u}",
		 j.job, j.incarnation);
	return 0;
}

static int do_remove_job(struct hg_control *c, const struct hg_json_obj *o,
			 char *out, size_t outlen)
{
	static const char *const keys[] = { "cmd", "job", NULL };
	int64_t v;
	int rc;

	rc = check_keys(o, keys, out, outlen);
	if (rc)
		return rc;
	if ((rc = get_uint(o, "job", true, 0, UINT32_MAX, 0, &v, out, outlen)))
		return rc;
	rc = c->ops->remove_job(c->ctx, (uint32_t)v);
	if (rc < 0)
		return reply_error(out, outlen, rc, "remove_job %u: %s",
				   (uint32_t)v, hg_strerror(rc));
	snprintf(out, outlen, "{\"ok\":true,\"job\":%u}", (uint32_t)v);
	return 0;
}

static int do_stats(struct hg_control *c, const struct hg_json_obj *o,
		    char *out, size_t outlen)
{
	static const char *const keys[] = { "cmd", NULL };
	struct hg_json_out w;
	int rc;

	rc = check_keys(o, keys, out, outlen);
	if (rc)
		return rc;
	hg_json_out_init(&w, out, outlen);
	hg_json_raw(&w, "{\"ok\":true");
	c->ops->stats(c->ctx, &w);
	hg_json_raw(&w, "}");
	if (hg_json_finish(&w) < 0)
		return reply_error(out, outlen, -ENOSPC, "stats: reply too long");
	return 0;
}

int hg_control_handle(struct hg_control *c, const char *line, size_t len,
		      char *out, size_t outlen)
{
	struct hg_json_obj o;
	const struct hg_json_field *cmd;
	char err[256];
	int rc;

	rc = hg_json_parse(line, len, &o, err, sizeof(err));
	if (rc < 0)
		return reply_error(out, outlen, rc, "%s", err);
	cmd = hg_json_get(&o, "cmd");
	if (!cmd)
		return reply_error(out, outlen, -EINVAL, "field 'cmd': missing");
	if (cmd->type != HG_JSON_STRING)
		return reply_error(out, outlen, -EINVAL,
				   "field 'cmd': must be a string");
	if (strcmp(cmd->str, "add_job") == 0)
		return do_add_job(c, &o, out, outlen);
	if (strcmp(cmd->str, "remove_job") == 0)
		return do_remove_job(c, &o, out, outlen);
	if (strcmp(cmd->str, "stats") == 0)
		return do_stats(c, &o, out, outlen);
	if (strcmp(cmd->str, "shutdown") == 0) {
		static const char *const keys[] = { "cmd", NULL };

		rc = check_keys(&o, keys, out, outlen);
		if (rc)
			return rc;
		snprintf(out, outlen, "{\"ok\":true}");
		c->ops->shutdown(c->ctx);
		return 0;
	}
	return reply_error(out, outlen, -EINVAL,
			   "field 'cmd': unknown command '%.64s' (add_job, "
			   "remove_job, stats, shutdown)", cmd->str);
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
				hg_control_handle(c, k->in + start, len, c->reply,
						  sizeof(c->reply));
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
	if (k->in_len == sizeof(k->in)) {
		/* a line longer than the buffer: answer once, skip to its end */
		reply_error(c->reply, sizeof(c->reply), -EINVAL,
			    "request longer than %d bytes", CTL_IN_CAP - 1);
		if (!conn_queue(k, c->reply))
			return -1;
		k->discard = true;
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
			if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ||
			    errno == ECONNABORTED)
				break;
			return -errno;
		}
		for (i = 0; i < CTL_MAX_CONN; i++)
			if (c->conn[i].fd < 0)
				break;
		if (i == CTL_MAX_CONN) {
			static const char busy[] =
				"{\"ok\":false,\"error\":\"too many control connections\"}\n";
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
