/* SPDX-License-Identifier: Apache-2.0 */
/*
 * json.h - the control socket's JSON: a strict parser for one flat object
 * (string, number, true/false/null values; no nesting) and a small writer.
 *
 * The parser follows RFC 8259 for everything it accepts (number grammar,
 * string escapes including \uXXXX and surrogate pairs, whitespace) and
 * rejects with a message and a byte offset everything else: nested values,
 * duplicate keys, trailing bytes, control characters, \u0000, keys or
 * strings longer than the fixed limits, more than HG_JSON_MAX_FIELDS keys.
 */
#ifndef HOMAGG_DPDK_JSON_H
#define HOMAGG_DPDK_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HG_JSON_MAX_FIELDS 16
#define HG_JSON_MAX_KEY 32     /* bytes, with the NUL */
#define HG_JSON_MAX_STR 256    /* bytes, with the NUL */

enum hg_json_type {
	HG_JSON_STRING,
	HG_JSON_NUMBER,
	HG_JSON_BOOL,
	HG_JSON_NULL,
};

struct hg_json_field {
	char key[HG_JSON_MAX_KEY];
	enum hg_json_type type;
	char str[HG_JSON_MAX_STR];   /* HG_JSON_STRING: UTF-8, NUL-terminated */
	bool is_int;                 /* HG_JSON_NUMBER: integral, fits int64 */
	int64_t ival;                /* valid when is_int */
	bool bval;                   /* HG_JSON_BOOL */
};

struct hg_json_obj {
	struct hg_json_field f[HG_JSON_MAX_FIELDS];
	int n;
};

/*
 * Parse text[0..len) as one flat JSON object into o.  Returns 0, or -EINVAL
 * with a message in err (always NUL-terminated when errlen > 0).
 */
int hg_json_parse(const char *text, size_t len, struct hg_json_obj *o,
		  char *err, size_t errlen);

/* The field named key, or NULL. */
const struct hg_json_field *hg_json_get(const struct hg_json_obj *o,
					const char *key);

/* Writer into a fixed buffer; overflow is sticky and reported at the end. */
struct hg_json_out {
	char *buf;
	size_t cap;
	size_t len;
	bool overflow;
};

void hg_json_out_init(struct hg_json_out *w, char *buf, size_t cap);
void hg_json_raw(struct hg_json_out *w, const char *s);
/* A JSON string literal with every needed escape. */
void hg_json_str(struct hg_json_out *w, const char *s);
/* ,"key": (the comma only when the object already has a member) */
void hg_json_key(struct hg_json_out *w, const char *key);
void hg_json_u64(struct hg_json_out *w, uint64_t v);
void hg_json_i64(struct hg_json_out *w, int64_t v);
/* NUL-terminates; returns 0 or -ENOSPC. */
int hg_json_finish(struct hg_json_out *w);

#endif /* HOMAGG_DPDK_JSON_H */
