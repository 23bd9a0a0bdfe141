/* SPDX-License-Identifier: Apache-2.0 */
/* log.c - registers homagg-switch's rte_log type; the JSON-lines log
 * stream of --log-format json (see log.h). */
#define _GNU_SOURCE   /* fopencookie */
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

#include <jansson.h>

#include "log.h"

RTE_LOG_REGISTER(hg_switch_logtype, homagg.switch, NOTICE);

#define LOG_LINE_CAP 4096

/* rte_log writes a message (one or more lines) into the stream and
 * flushes; the cookie collects bytes up to each newline. */
struct json_log {
	size_t len;
	char line[LOG_LINE_CAP];
};

static const char *level_name(uint32_t level)
{
	static const char *const names[] = { "", "emerg", "alert", "crit", "error",
		"warning", "notice", "info", "debug" };

	return level < sizeof(names) / sizeof(names[0]) ? names[level] : "debug";
}

/* One event: {"ts","level","logger","msg"} on stdout (where rte_log's
 * default stream writes).  The "homagg-switch: " prefix of HG_LOG is
 * dropped: "logger" says where the event comes from. */
static void emit(char *msg)
{
	static const char prefix[] = "homagg-switch: ";
	int type = rte_log_cur_msg_logtype();
	struct timeval tv;
	struct tm tm;
	char ts[64];
	json_t *ev;

	if (strncmp(msg, prefix, sizeof(prefix) - 1) == 0)
		msg += sizeof(prefix) - 1;
	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ",
		 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
		 tm.tm_min, tm.tm_sec, (long)tv.tv_usec);
	/* jansson takes UTF-8 only: other bytes and controls become '?' */
	for (char *p = msg; *p; p++)
		if ((unsigned char)*p >= 0x80 || (unsigned char)*p < 0x20)
			*p = '?';
	ev = json_pack("{s:s, s:s, s:s, s:s}", "ts", ts,
		       "level", level_name(rte_log_cur_msg_loglevel()),
		       "logger", type == hg_switch_logtype ? "homagg.switch" : "dpdk",
		       "msg", msg);
	if (!ev)
		return;
	json_dumpf(ev, stdout, JSON_COMPACT);
	fputc('\n', stdout);
	fflush(stdout);
	json_decref(ev);
}

static ssize_t json_log_write(void *cookie, const char *buf, size_t size)
{
	struct json_log *j = cookie;
	size_t i;

	for (i = 0; i < size; i++) {
		if (buf[i] == '\n' || j->len == sizeof(j->line) - 1) {
			j->line[j->len] = '\0';
			if (j->len)
				emit(j->line);
			j->len = 0;
			if (buf[i] == '\n')
				continue;
		}
		j->line[j->len++] = buf[i];
	}
	return (ssize_t)size;
}

int hg_switch_log_json(void)
{
	static struct json_log cookie;   /* one log stream per process */
	cookie_io_functions_t io = { .write = json_log_write };
	FILE *f = fopencookie(&cookie, "w", io);

	if (!f)
		return -1;
	return rte_openlog_stream(f);
}
