/* SPDX-License-Identifier: Apache-2.0 */
/* json.c - flat-object JSON parser and writer of the control socket. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "json.h"

struct parser {
	const char *s;
	size_t len;
	size_t pos;
	char *err;
	size_t errlen;
};

static int fail(struct parser *p, const char *fmt, ...)
{
	va_list ap;
	int n = 0;

	if (p->errlen) {
		n = snprintf(p->err, p->errlen, "bad JSON at byte %zu: ", p->pos);
		if (n < 0 || (size_t)n >= p->errlen)
			return -EINVAL;
		va_start(ap, fmt);
		vsnprintf(p->err + n, p->errlen - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

static void skip_ws(struct parser *p)
{
	while (p->pos < p->len) {
		char c = p->s[p->pos];

		if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
			break;
		p->pos++;
	}
}

static int peek(const struct parser *p)
{
	return p->pos < p->len ? (unsigned char)p->s[p->pos] : -1;
}

static int hex4(struct parser *p, uint32_t *out)
{
	uint32_t v = 0;
	int i;

	if (p->len - p->pos < 4)
		return fail(p, "truncated \\u escape");
	for (i = 0; i < 4; i++) {
		char c = p->s[p->pos + i];

		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= (uint32_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v |= (uint32_t)(c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			v |= (uint32_t)(c - 'A' + 10);
		else
			return fail(p, "bad hex digit in \\u escape");
	}
	p->pos += 4;
	*out = v;
	return 0;
}

/* Append the UTF-8 form of cp to out[*n], keeping room for the NUL. */
static int put_utf8(struct parser *p, char *out, size_t cap, size_t *n,
		    uint32_t cp)
{
	unsigned char b[4];
	size_t k, i;

	if (cp < 0x80) {
		b[0] = (unsigned char)cp;
		k = 1;
	} else if (cp < 0x800) {
		b[0] = (unsigned char)(0xC0 | (cp >> 6));
		b[1] = (unsigned char)(0x80 | (cp & 0x3F));
		k = 2;
	} else if (cp < 0x10000) {
		b[0] = (unsigned char)(0xE0 | (cp >> 12));
		b[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
		b[2] = (unsigned char)(0x80 | (cp & 0x3F));
		k = 3;
	} else {
		b[0] = (unsigned char)(0xF0 | (cp >> 18));
		b[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
		b[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
		b[3] = (unsigned char)(0x80 | (cp & 0x3F));
		k = 4;
	}
	if (*n + k >= cap)
		return fail(p, "string longer than %zu bytes", cap - 1);
	for (i = 0; i < k; i++)
		out[(*n)++] = (char)b[i];
	return 0;
}

/* A string literal (p at the opening quote) into out[cap]. */
static int parse_string(struct parser *p, char *out, size_t cap)
{
	size_t n = 0;
	int rc;

	p->pos++;  /* opening quote */
	for (;;) {
		int c = peek(p);

		if (c < 0)
			return fail(p, "unterminated string");
		if (c == '"') {
			p->pos++;
			out[n] = '\0';
			return 0;
		}
		if (c < 0x20)
			return fail(p, "control character in string");
		if (c != '\\') {
			/* raw bytes are copied as they are (UTF-8 passes through) */
			if (n + 1 >= cap)
				return fail(p, "string longer than %zu bytes", cap - 1);
			out[n++] = (char)c;
			p->pos++;
			continue;
		}
		p->pos++;
		c = peek(p);
		if (c < 0)
			return fail(p, "unterminated escape");
		p->pos++;
		switch (c) {
		case '"': case '\\': case '/':
			rc = put_utf8(p, out, cap, &n, (uint32_t)c);
			break;
		case 'b':
			rc = put_utf8(p, out, cap, &n, '\b');
			break;
		case 'f':
			rc = put_utf8(p, out, cap, &n, '\f');
			break;
		case 'n':
			rc = put_utf8(p, out, cap, &n, '\n');
			break;
		case 'r':
			rc = put_utf8(p, out, cap, &n, '\r');
			break;
		case 't':
			rc = put_utf8(p, out, cap, &n, '\t');
			break;
		case 'u': {
			uint32_t cp, lo;

			rc = hex4(p, &cp);
			if (rc)
				return rc;
			if (cp >= 0xDC00 && cp <= 0xDFFF)
				return fail(p, "lone low surrogate");
			if (cp >= 0xD800 && cp <= 0xDBFF) {
				if (p->len - p->pos < 2 || p->s[p->pos] != '\\' ||
				    p->s[p->pos + 1] != 'u')
					return fail(p, "lone high surrogate");
				p->pos += 2;
				rc = hex4(p, &lo);
				if (rc)
					return rc;
				if (lo < 0xDC00 || lo > 0xDFFF)
					return fail(p, "bad low surrogate");
				cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
			}
			if (cp == 0)
				return fail(p, "\\u0000 is not allowed");
			rc = put_utf8(p, out, cap, &n, cp);
			break;
		}
		default:
			p->pos--;
			return fail(p, "bad escape '\\%c'", c);
		}
		if (rc)
			return rc;
	}
}

static bool is_digit(int c)
{
	return c >= '0' && c <= '9';
}

/* A number per the JSON grammar; integral values that fit get is_int. */
static int parse_number(struct parser *p, struct hg_json_field *f)
{
	size_t start = p->pos;
	bool neg = false, integral = true, overflow = false;
	uint64_t mag = 0;

	if (peek(p) == '-') {
		neg = true;
		p->pos++;
	}
	if (!is_digit(peek(p)))
		return fail(p, "bad number");
	if (peek(p) == '0') {
		p->pos++;
		if (is_digit(peek(p)))
			return fail(p, "leading zero in number");
	} else {
		while (is_digit(peek(p))) {
			uint64_t d = (uint64_t)(peek(p) - '0');

			if (mag > (UINT64_MAX - d) / 10)
				overflow = true;
			else
				mag = mag * 10 + d;
			p->pos++;
		}
	}
	if (peek(p) == '.') {
		integral = false;
		p->pos++;
		if (!is_digit(peek(p)))
			return fail(p, "bad fraction");
		while (is_digit(peek(p)))
			p->pos++;
	}
	if (peek(p) == 'e' || peek(p) == 'E') {
		integral = false;
		p->pos++;
		if (peek(p) == '+' || peek(p) == '-')
			p->pos++;
		if (!is_digit(peek(p)))
			return fail(p, "bad exponent");
		while (is_digit(peek(p)))
			p->pos++;
	}
	(void)start;
	f->type = HG_JSON_NUMBER;
	f->is_int = false;
	if (integral && !overflow) {
		if (!neg && mag <= (uint64_t)INT64_MAX) {
			f->is_int = true;
			f->ival = (int64_t)mag;
		} else if (neg && mag <= (uint64_t)INT64_MAX + 1) {
			f->is_int = true;
			f->ival = mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag;
		}
	}
	return 0;
}

static int parse_word(struct parser *p, const char *w)
{
	size_t n = strlen(w);

	if (p->len - p->pos < n || memcmp(p->s + p->pos, w, n) != 0)
		return fail(p, "unexpected character");
	p->pos += n;
	return 0;
}

static int parse_value(struct parser *p, struct hg_json_field *f)
{
	int c = peek(p);

	switch (c) {
	case '"':
		f->type = HG_JSON_STRING;
		return parse_string(p, f->str, sizeof(f->str));
	case 't':
		f->type = HG_JSON_BOOL;
		f->bval = true;
		return parse_word(p, "true");
	case 'f':
		f->type = HG_JSON_BOOL;
		f->bval = false;
		return parse_word(p, "false");
	case 'n':
		f->type = HG_JSON_NULL;
		return parse_word(p, "null");
	case '{':
	case '[':
		return fail(p, "nested objects and arrays are not supported");
	case -1:
		return fail(p, "unexpected end");
	default:
		if (c == '-' || is_digit(c))
			return parse_number(p, f);
		return fail(p, "unexpected character");
	}
}

int hg_json_parse(const char *text, size_t len, struct hg_json_obj *o,
		  char *err, size_t errlen)
{
	struct parser p = { text, len, 0, err, errlen };
	int rc, i;

	if (errlen)
		err[0] = '\0';
	o->n = 0;
	if (!text)
		return fail(&p, "no text");
	skip_ws(&p);
	if (peek(&p) != '{')
		return fail(&p, "expected an object");
	p.pos++;
	skip_ws(&p);
	if (peek(&p) == '}') {
		p.pos++;
		goto tail;
	}
	for (;;) {
		struct hg_json_field *f;

		skip_ws(&p);
		if (peek(&p) != '"')
			return fail(&p, "expected a key");
		if (o->n == HG_JSON_MAX_FIELDS)
			return fail(&p, "more than %d keys", HG_JSON_MAX_FIELDS);
		f = &o->f[o->n];
		memset(f, 0, sizeof(*f));
		rc = parse_string(&p, f->key, sizeof(f->key));
		if (rc)
			return rc;
		for (i = 0; i < o->n; i++)
			if (strcmp(o->f[i].key, f->key) == 0)
				return fail(&p, "duplicate key '%s'", f->key);
		skip_ws(&p);
		if (peek(&p) != ':')
			return fail(&p, "expected ':'");
		p.pos++;
		skip_ws(&p);
		rc = parse_value(&p, f);
		if (rc)
			return rc;
		o->n++;
		skip_ws(&p);
		if (peek(&p) == ',') {
			p.pos++;
			continue;
		}
		if (peek(&p) == '}') {
			p.pos++;
			break;
		}
		return fail(&p, "expected ',' or '}'");
	}
tail:
	skip_ws(&p);
	if (p.pos != p.len)
		return fail(&p, "trailing characters after the object");
	return 0;
}

const struct hg_json_field *hg_json_get(const struct hg_json_obj *o,
					const char *key)
{
	int i;

	for (i = 0; i < o->n; i++)
		if (strcmp(o->f[i].key, key) == 0)
			return &o->f[i];
	return NULL;
}

void hg_json_out_init(struct hg_json_out *w, char *buf, size_t cap)
{
	w->buf = buf;
	w->cap = cap;
	w->len = 0;
	w->overflow = cap == 0;
}

static void put(struct hg_json_out *w, const char *s, size_t n)
{
	if (w->overflow || w->len + n >= w->cap) {
		w->overflow = true;
		return;
	}
	memcpy(w->buf + w->len, s, n);
	w->len += n;
}

void hg_json_raw(struct hg_json_out *w, const char *s)
{
	put(w, s, strlen(s));
}

void hg_json_str(struct hg_json_out *w, const char *s)
{
	const unsigned char *u = (const unsigned char *)s;
	char esc[8];

	put(w, "\"", 1);
	for (; *u; u++) {
		switch (*u) {
		case '"':
			put(w, "\\\"", 2);
			break;
		case '\\':
			put(w, "\\\\", 2);
			break;
		case '\n':
			put(w, "\\n", 2);
			break;
		case '\r':
			put(w, "\\r", 2);
			break;
		case '\t':
			put(w, "\\t", 2);
			break;
		default:
			if (*u < 0x20) {
				snprintf(esc, sizeof(esc), "\\u%04x", *u);
				put(w, esc, 6);
			} else {
				put(w, (const char *)u, 1);
			}
		}
	}
	put(w, "\"", 1);
}

void hg_json_key(struct hg_json_out *w, const char *key)
{
	if (w->len > 0 && w->buf[w->len - 1] != '{')
		put(w, ",", 1);
	hg_json_str(w, key);
	put(w, ":", 1);
}

void hg_json_u64(struct hg_json_out *w, uint64_t v)
{
	char b[24];
	int n = snprintf(b, sizeof(b), "%" PRIu64, v);

	put(w, b, (size_t)n);
}

void hg_json_i64(struct hg_json_out *w, int64_t v)
{
	char b[24];
	int n = snprintf(b, sizeof(b), "%" PRId64, v);

	put(w, b, (size_t)n);
}

int hg_json_finish(struct hg_json_out *w)
{
	if (w->overflow) {
		if (w->cap)
			w->buf[0] = '\0';
		return -ENOSPC;
	}
	w->buf[w->len] = '\0';
	return 0;
}
