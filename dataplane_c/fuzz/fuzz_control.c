/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: the control socket's request path (control.c: jansson
 * parsing, field checks, the reply writer) behind stub callbacks that keep
 * a small job table, so add/remove sequences reach both their success and
 * their refusal paths.  The input is split into lines as the socket splits
 * a connection's bytes (a trailing CR is dropped, empty lines are skipped).
 *
 * Every reply must be one line of valid JSON: an object whose "ok" is a
 * boolean that agrees with the return code, and, when false, a string
 * "error" and a negative integer "code".  Anything else aborts.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "../dpdk/control.h"

#define JOBS 4

struct stub {
	uint32_t job[JOBS];
	bool used[JOBS];
	unsigned int shutdowns;
};

static int stub_add(void *ctx, const struct hg_ctl_job *j, char *err, size_t errlen)
{
	struct stub *s = ctx;
	int i, free_i = -1;

	for (i = 0; i < JOBS; i++) {
		if (s->used[i] && s->job[i] == j->job) {
			snprintf(err, errlen, "job %u already exists", j->job);
			return -EEXIST;
		}
		if (!s->used[i] && free_i < 0)
			free_i = i;
	}
	if (free_i < 0)
		return -ENOSPC;
	s->used[free_i] = true;
	s->job[free_i] = j->job;
	return 0;
}

static int stub_remove(void *ctx, uint32_t job)
{
	struct stub *s = ctx;
	int i;

	for (i = 0; i < JOBS; i++)
		if (s->used[i] && s->job[i] == job) {
			s->used[i] = false;
			return 0;
		}
	return -ENOENT;
}

static int stub_stats(void *ctx, json_t *reply)
{
	struct stub *s = ctx;

	return json_object_set_new(reply, "shutdowns", json_integer(s->shutdowns)) ?
		       -ENOMEM :
		       0;
}

static int stub_rotate(void *ctx, uint32_t job, const uint8_t *secret,
		       uint64_t grace_ns, char *err, size_t errlen)
{
	(void)ctx;
	(void)secret;
	(void)grace_ns;
	(void)err;
	(void)errlen;
	return job == 1 ? 1 : -ENOENT;
}

static int stub_rotate_up(void *ctx, uint32_t job, const uint8_t *key,
			  const uint8_t *reply_key, char *err, size_t errlen)
{
	(void)ctx;
	(void)key;
	(void)reply_key;
	(void)err;
	(void)errlen;
	return job == 1 ? 1 : -EPERM;
}

static void stub_shutdown(void *ctx)
{
	((struct stub *)ctx)->shutdowns++;
}

static const struct hg_ctl_ops ops = {
	.add_job = stub_add,
	.remove_job = stub_remove,
	.rotate_key = stub_rotate,
	.rotate_up_key = stub_rotate_up,
	.stats = stub_stats,
	.shutdown = stub_shutdown,
};

static struct stub g_stub;
static struct hg_control *g_ctl;
static char g_dir[] = "/tmp/hg-fuzz-control-XXXXXX";
static char g_path[64];

static void cleanup(void)
{
	hg_control_destroy(g_ctl);
	rmdir(g_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	const struct hg_ctl_limits lim = { .max_workers = 256,
					   .max_slots = 4096,
					   .max_payload = 1448 };

	if (!mkdtemp(g_dir))
		abort();
	snprintf(g_path, sizeof(g_path), "%s/control.sock", g_dir);
	g_ctl = hg_control_create(g_path, &ops, &g_stub, &lim);
	if (!g_ctl)
		abort();
	atexit(cleanup);
	return 0;
}

static void check_reply(const char *out, size_t cap, int rc)
{
	json_error_t e;
	json_t *r, *ok, *err, *code;
	size_t n = strnlen(out, cap);

	if (n == 0 || n == cap || memchr(out, '\n', n))
		abort();
	r = json_loadb(out, n, JSON_REJECT_DUPLICATES, &e);
	if (!r || !json_is_object(r))
		abort();
	ok = json_object_get(r, "ok");
	if (!json_is_boolean(ok) || json_is_true(ok) != (rc == 0))
		abort();
	if (!json_is_true(ok)) {
		err = json_object_get(r, "error");
		code = json_object_get(r, "code");
		if (!json_is_string(err) || !json_is_integer(code) ||
		    json_integer_value(code) >= 0 || json_integer_value(code) != rc)
			abort();
	}
	json_decref(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char out[16384];
	const char *p = (const char *)data, *end = p + size;

	memset(&g_stub, 0, sizeof(g_stub));
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t len = (size_t)((nl ? nl : end) - p);
		int rc;

		if (len && p[len - 1] == '\r')
			len--;
		if (len) {
			rc = hg_control_handle(g_ctl, p, len, out, sizeof(out));
			check_reply(out, sizeof(out), rc);
		}
		p = nl ? nl + 1 : end;
	}
	return 0;
}
