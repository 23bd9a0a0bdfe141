/* SPDX-License-Identifier: Apache-2.0 */
/* log.c - registers homagg-switch's rte_log type; the JSON-lines log
 * stream of --log-format json (see log.h). */
#define _GNU_SOURCE /* fopencookie, pipe2 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
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
	static const char *const names[] = { "",       "emerg", "alert",
					     "crit",   "error", "warning",
					     "notice", "info",  "debug" };

	return level < sizeof(names) / sizeof(names[0]) ? names[level] : "debug";
}

/* One event {"ts","level","logger","msg"} as one line on stdout (where
 * rte_log's default stream writes): one stdio call per line, so the lines
 * of several threads never interleave. */
static void emit(const char *level, const char *logger, char *msg)
{
	struct timeval tv;
	struct tm tm;
	char ts[64], *line;
	json_t *ev;

	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	snprintf(ts, sizeof(ts), "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ",
		 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
		 tm.tm_min, tm.tm_sec, (long)tv.tv_usec);
	/* jansson takes UTF-8 only: other bytes and controls become '?' */
	for (char *p = msg; *p; p++)
		if ((unsigned char)*p >= 0x80 || (unsigned char)*p < 0x20)
			*p = '?';
	ev = json_pack("{s:s, s:s, s:s, s:s}", "ts", ts, "level", level,
		       "logger", logger, "msg", msg);
	line = ev ? json_dumps(ev, JSON_COMPACT) : NULL;
	if (line) {
		fprintf(stdout, "%s\n", line);
		fflush(stdout);
	}
	free(line);
	json_decref(ev);
}

/* An rte_log message: its level and log type are rte_log's current ones.
 * The "homagg-switch: " prefix of HG_LOG is dropped: "logger" says where
 * the event comes from. */
static void emit_rte(char *msg)
{
	static const char prefix[] = "homagg-switch: ";

	if (strncmp(msg, prefix, sizeof(prefix) - 1) == 0)
		msg += sizeof(prefix) - 1;
	emit(level_name(rte_log_cur_msg_loglevel()),
	     rte_log_cur_msg_logtype() == hg_switch_logtype ? "homagg.switch" :
							      "dpdk",
	     msg);
}

static ssize_t json_log_write(void *cookie, const char *buf, size_t size)
{
	struct json_log *j = cookie;
	size_t i;

	for (i = 0; i < size; i++) {
		if (buf[i] == '\n' || j->len == sizeof(j->line) - 1) {
			j->line[j->len] = '\0';
			if (j->len)
				emit_rte(j->line);
			j->len = 0;
			if (buf[i] == '\n')
				continue;
		}
		j->line[j->len++] = buf[i];
	}
	return (ssize_t)size;
}

/* What libraries write to stderr themselves (libbpf and libxdp under
 * af_xdp, ...): each line one event of logger "stderr". */
static void *stderr_pump(void *arg)
{
	FILE *in = arg;
	char line[LOG_LINE_CAP];

	while (fgets(line, sizeof(line), in)) {
		line[strcspn(line, "\n")] = '\0';
		if (line[0])
			emit("info", "stderr", line);
	}
	fclose(in);
	return NULL;
}

static pthread_t g_pump; /* the stderr pump of this process */

/* At exit: close the pipe's only write end, so the pump reads what is left,
 * writes it and ends. */
static void stderr_pump_stop(void)
{
	close(STDERR_FILENO);
	pthread_join(g_pump, NULL);
}

int hg_switch_log_json(void)
{
	static struct json_log cookie; /* one log stream per process */
	cookie_io_functions_t io = { .write = json_log_write };
	FILE *f = fopencookie(&cookie, "w", io), *in;
	int p[2];

	if (!f || rte_openlog_stream(f) < 0)
		return -1;
	if (pipe2(p, O_CLOEXEC) < 0)
		return -1;
	in = fdopen(p[0], "r");
	if (!in || dup2(p[1], STDERR_FILENO) < 0 ||
	    pthread_create(&g_pump, NULL, stderr_pump, in) != 0) {
		if (in)
			fclose(in);
		else
			close(p[0]);
		close(p[1]);
		return -1;
	}
	close(p[1]);
	atexit(stderr_pump_stop);
	return 0;
}
