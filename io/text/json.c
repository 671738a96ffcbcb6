/* json.c - the JSON reader (see json.h): recursive descent over the bytes. */
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "pretok.h"

struct parser {
	const char *name;
	const unsigned char *s;
	size_t n, i;
	int line;
};

static int perr(struct parser *p, const char *what)
{
	return error("%s:%d: %s", p->name, p->line, what);
}

static void skip_ws(struct parser *p)
{
	while (p->i < p->n) {
		unsigned char c = p->s[p->i];
		if (c == '\n')
			p->line++;
		else if (c != ' ' && c != '\t' && c != '\r')
			return;
		p->i++;
	}
}

int json_utf8_valid(const unsigned char *s, size_t n)
{
	uint32_t cp;
	for (size_t i = 0; i < n;) {
		size_t k = utf8_decode(s + i, n - i, &cp);
		if (!k)
			return 0;
		i += k;
	}
	return 1;
}

static void put_utf8(struct buf *b, uint32_t cp)
{
	unsigned char o[4];
	size_t n;
	if (cp < 0x80) {
		o[0] = (unsigned char)cp;
		n = 1;
	} else if (cp < 0x800) {
		o[0] = (unsigned char)(0xC0 | cp >> 6);
		o[1] = (unsigned char)(0x80 | (cp & 0x3F));
		n = 2;
	} else if (cp < 0x10000) {
		o[0] = (unsigned char)(0xE0 | cp >> 12);
		o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
		o[2] = (unsigned char)(0x80 | (cp & 0x3F));
		n = 3;
	} else {
		o[0] = (unsigned char)(0xF0 | cp >> 18);
		o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
		o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
		o[3] = (unsigned char)(0x80 | (cp & 0x3F));
		n = 4;
	}
	if (b->len + n < b->cap) { /* room for the bytes and a NUL: no call */
		memcpy(b->data + b->len, o, n);
		b->len += n;
	} else {
		buf_append(b, o, n);
	}
}

/* UTF-8 checked by a shift DFA (Per Vognsen's): the state is a bit offset,
 * and the state after byte b is (utf8_dfa[b] >> state) & 63, so the loop's
 * chain of dependent operations is a shift and a mask a byte. The states
 * follow utf8_decode's rules: no overlong forms, surrogates or code points
 * above U+10FFFF. A quote, a backslash or a control character leads to
 * U8_ERR too: the loop stops there, and the byte tells which it was. */
enum { U8_ACC = 0, U8_C1 = 6, U8_C2 = 12, U8_C3 = 18, U8_E0 = 24, U8_ED = 30, U8_F0 = 36,
       U8_F4 = 42, U8_ERR = 48 };
/* one row per kind of byte: the next state for each state (io/text/json.c's
 * history has the generator: a row is the sum of next << state) */
#define U8_PLAIN  0x0030c30c30c30c00ULL /* printable ASCII: ACC -> ACC */
#define U8_STOP   0x0030c30c30c30c30ULL /* ends the run, or is not UTF-8: -> ERR */
#define U8_X80_8F 0x00303301b0306030ULL /* continuation bytes, by the ranges */
#define U8_X90_9F 0x0030c0c1b0306030ULL /* that follow E0, ED, F0 and F4 */
#define U8_XA0_BF 0x0030c0cc06306030ULL
#define U8_LC2_DF 0x0030c30c30c30c06ULL /* lead bytes: ACC -> the state they need */
#define U8_LE0    0x0030c30c30c30c18ULL
#define U8_LE1_EF 0x0030c30c30c30c0cULL
#define U8_LED    0x0030c30c30c30c1eULL
#define U8_LF0    0x0030c30c30c30c24ULL
#define U8_LF1_F3 0x0030c30c30c30c12ULL
#define U8_LF4    0x0030c30c30c30c2aULL
static const uint64_t utf8_dfa[256] = {
	[0x00 ... 0x1F] = U8_STOP, [0x20 ... 0x21] = U8_PLAIN, [0x22] = U8_STOP,
	[0x23 ... 0x5B] = U8_PLAIN, [0x5C] = U8_STOP, [0x5D ... 0x7F] = U8_PLAIN,
	[0x80 ... 0x8F] = U8_X80_8F, [0x90 ... 0x9F] = U8_X90_9F, [0xA0 ... 0xBF] = U8_XA0_BF,
	[0xC0 ... 0xC1] = U8_STOP, [0xC2 ... 0xDF] = U8_LC2_DF, [0xE0] = U8_LE0,
	[0xE1 ... 0xEC] = U8_LE1_EF, [0xED] = U8_LED, [0xEE ... 0xEF] = U8_LE1_EF,
	[0xF0] = U8_LF0, [0xF1 ... 0xF3] = U8_LF1_F3, [0xF4] = U8_LF4, [0xF5 ... 0xFF] = U8_STOP,
};

static int hex4(const unsigned char *s, size_t n, size_t *i, uint32_t *v)
{
	*v = 0;
	if (n - *i < 4)
		return -1;
	for (int k = 0; k < 4; k++) {
		int c = s[(*i)++], d;
		if (c >= '0' && c <= '9')
			d = c - '0';
		else if (c >= 'a' && c <= 'f')
			d = c - 'a' + 10;
		else if (c >= 'A' && c <= 'F')
			d = c - 'A' + 10;
		else
			return -1;
		*v = *v << 4 | (uint32_t)d;
	}
	return 0;
}

/* Bytes of s[0..n) before the first one a string scanner must look at: a
 * quote, a backslash, a control character or a non-ASCII byte. Eight bytes
 * at a time (each test below is nonzero exactly when some byte matches). */
static size_t plain_ascii_run(const unsigned char *s, size_t n)
{
	const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
	size_t j = 0;
	for (; j + 8 <= n; j += 8) {
		uint64_t v, q, b;
		memcpy(&v, s + j, 8);
		q = v ^ (ones * '"');
		b = v ^ (ones * '\\');
		if ((((v - ones * 0x20) & ~v) | ((q - ones) & ~q) | ((b - ones) & ~b) | v) & high)
			break;
	}
	while (j < n && s[j] >= 0x20 && s[j] < 0x80 && s[j] != '"' && s[j] != '\\')
		j++;
	return j;
}

/* The rest of a string whose opening quote is just before s[*i], through its
 * closing quote. The decoded bytes (escapes and surrogate pairs resolved, as
 * UTF-8) are appended to out when it is not NULL; *escaped is set when the
 * string had an escape. Returns NULL, or why it is not a valid string
 * (*i is then at the fault). */
static const char *string_body(const unsigned char *s, size_t n, size_t *i, struct buf *out,
			       int *escaped)
{
	size_t run = *i; /* start of the bytes not yet copied */
	for (;;) {
		*i += plain_ascii_run(s + *i, n - *i);
		if (*i >= n)
			return "unterminated string";
		unsigned c = s[*i];
		if (c >= 0x80) {
			/* text with non-ASCII characters: the DFA, to the end of the run */
			uint64_t st = U8_ACC, next;
			size_t j = *i, start = j;
			for (; j < n && (next = (utf8_dfa[s[j]] >> st) & 63) != U8_ERR; j++) {
				start = st == U8_ACC ? j : start;
				st = next;
			}
			if (st != U8_ACC || (j < n && s[j] >= 0x80)) {
				*i = st != U8_ACC ? start : j;
				return "string is not valid UTF-8";
			}
			*i = j;
			continue;
		}
		if (out && *i > run) {
			if (out->len + (*i - run) < out->cap) { /* no call for short runs */
				memcpy(out->data + out->len, s + run, *i - run);
				out->len += *i - run;
			} else {
				buf_append(out, s + run, *i - run);
			}
		}
		if (c == '"') {
			(*i)++;
			return NULL;
		}
		if (c < 0x20)
			return "control character in a string";
		/* a backslash */
		if (escaped)
			*escaped = 1;
		if (++*i >= n)
			return "unterminated escape";
		uint32_t cp, lo;
		switch (s[(*i)++]) {
		case '"': cp = '"'; break;
		case '\\': cp = '\\'; break;
		case '/': cp = '/'; break;
		case 'b': cp = '\b'; break;
		case 'f': cp = '\f'; break;
		case 'n': cp = '\n'; break;
		case 'r': cp = '\r'; break;
		case 't': cp = '\t'; break;
		case 'u':
			if (!hex4(s, n, i, &cp))
				break;
			/* fall through */
		default:
			return "bad escape in a string";
		}
		if (cp >= 0xD800 && cp < 0xDC00) {
			if (n - *i < 2 || s[*i] != '\\' || s[*i + 1] != 'u' ||
			    (*i += 2, hex4(s, n, i, &lo)) || lo < 0xDC00 || lo > 0xDFFF)
				return "bad surrogate pair in a \\u escape";
			cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
		} else if (cp >= 0xDC00 && cp < 0xE000) {
			return "lone surrogate in a \\u escape";
		}
		if (out)
			put_utf8(out, cp);
		run = *i;
	}
}

/* A string at p->i (the opening quote) into a malloc'ed NUL-terminated copy. */
static int parse_string(struct parser *p, char **out, size_t *len)
{
	struct buf b = {0};
	p->i++;
	const char *why = string_body(p->s, p->n, &p->i, &b, NULL);
	if (why) {
		buf_free(&b);
		return perr(p, why);
	}
	*len = b.len;
	buf_append(&b, "", 1);
	*out = (char *)b.data;
	return 0;
}

static int is_digit(unsigned c) { return c >= '0' && c <= '9'; }

/* The number at s[*i] (a '-' or a digit): moves *i past it and tells whether
 * it is integral. Returns NULL, or why it is not a valid number. */
static const char *number_end(const unsigned char *s, size_t n, size_t *i, int *integral)
{
	*integral = 1;
	if (s[*i] == '-')
		(*i)++;
	if (*i >= n || !is_digit(s[*i]))
		return "bad number";
	if (s[*i] == '0' && *i + 1 < n && is_digit(s[*i + 1]))
		return "number with a leading zero";
	while (*i < n && is_digit(s[*i]))
		(*i)++;
	if (*i < n && s[*i] == '.') {
		*integral = 0;
		if (++*i >= n || !is_digit(s[*i]))
			return "bad number: no digits after '.'";
		while (*i < n && is_digit(s[*i]))
			(*i)++;
	}
	if (*i < n && (s[*i] == 'e' || s[*i] == 'E')) {
		*integral = 0;
		(*i)++;
		if (*i < n && (s[*i] == '+' || s[*i] == '-'))
			(*i)++;
		if (*i >= n || !is_digit(s[*i]))
			return "bad number: no digits in the exponent";
		while (*i < n && is_digit(s[*i]))
			(*i)++;
	}
	return NULL;
}

static int parse_number(struct parser *p, struct json *j)
{
	size_t start = p->i;
	int integral, neg = p->s[p->i] == '-', overflow = 0;
	const char *why = number_end(p->s, p->n, &p->i, &integral);
	if (why)
		return perr(p, why);
	uint64_t v = 0;
	if (integral)
		for (size_t k = start + neg; k < p->i; k++) {
			unsigned d = p->s[k] - '0';
			if (v > (UINT64_MAX - d) / 10)
				overflow = 1;
			else
				v = v * 10 + d;
		}
	char tmp[64];
	size_t k = p->i - start;
	if (k >= sizeof(tmp)) {
		/* long literals: strtod on a heap copy */
		char *big = xmalloc(k + 1);
		memcpy(big, p->s + start, k);
		big[k] = 0;
		j->num = strtod(big, NULL);
		free(big);
	} else {
		memcpy(tmp, p->s + start, k);
		tmp[k] = 0;
		j->num = strtod(tmp, NULL);
	}
	j->type = JSON_NUMBER;
	if (integral && !overflow && v <= (uint64_t)INT64_MAX + neg) {
		j->is_int = 1;
		j->i = neg ? (int64_t)(0 - v) : (int64_t)v;
	}
	return 0;
}

static int parse_value(struct parser *p, struct json *j, int depth);
static void free_kids(struct json *j);

static int same_name(const struct json *a, const struct json *b)
{
	return a->key_len == b->key_len && !memcmp(a->key, b->key, a->key_len);
}

/* Where member k's name goes in slot[mask + 1] (open addressing on FNV-1a):
 * the slot holding a kept member of that name (index + 1), or an empty one. */
static size_t name_slot(const struct json *kids, const size_t *slot, size_t mask,
			const struct json *k)
{
	uint64_t h = fnv1a64(FNV1A64_INIT, k->key, k->key_len);
	size_t s = (size_t)h & mask;
	while (slot[s] && !same_name(&kids[slot[s] - 1], k))
		s = (s + 1) & mask;
	return s;
}

/* An object whose member name repeats keeps one member of that name: the
 * last one's value in the first one's place, as Python's json and
 * serde_json (which Hugging Face's readers use) do. So every lookup, and
 * every walk over the members, sees the value those readers see. */
static void merge_duplicates(struct json *j)
{
	if (j->len < 2)
		return;
	size_t mask = 15, kept = 0;
	while (mask < 2 * j->len)
		mask = mask * 2 + 1;
	size_t *slot = xcalloc(mask + 1, sizeof(*slot));
	for (size_t i = 0; i < j->len; i++) {
		struct json *k = &j->kids[i];
		size_t s = name_slot(j->kids, slot, mask, k);
		if (!slot[s]) {
			slot[s] = ++kept;
			if (kept - 1 != i)
				j->kids[kept - 1] = *k;
			continue;
		}
		struct json *first = &j->kids[slot[s] - 1];
		char *key = first->key;
		first->key = NULL;
		free_kids(first);
		free(k->key);
		*first = *k;
		first->key = key;
	}
	j->len = kept;
	free(slot);
}

/* array or object at p->i (its opening bracket) */
static int parse_container(struct parser *p, struct json *j, int depth)
{
	int object = p->s[p->i] == '{';
	char close = object ? '}' : ']';
	size_t cap = 0;
	j->type = object ? JSON_OBJECT : JSON_ARRAY;
	if (depth >= JSON_MAX_DEPTH)
		return perr(p, "nesting too deep");
	p->i++;
	skip_ws(p);
	if (p->i < p->n && p->s[p->i] == close) {
		p->i++;
		return 0;
	}
	for (;;) {
		if (j->len == cap) {
			cap = cap ? 2 * cap : 4;
			j->kids = xrealloc(j->kids, st_mult(cap, sizeof(*j->kids)));
		}
		struct json *k = &j->kids[j->len];
		memset(k, 0, sizeof(*k));
		j->len++;
		skip_ws(p);
		if (object) {
			if (p->i >= p->n || p->s[p->i] != '"')
				return perr(p, "expected a member name (a string)");
			if (parse_string(p, &k->key, &k->key_len))
				return -1;
			skip_ws(p);
			if (p->i >= p->n || p->s[p->i] != ':')
				return perr(p, "expected ':' after a member name");
			p->i++;
			skip_ws(p);
		}
		if (parse_value(p, k, depth + 1))
			return -1;
		skip_ws(p);
		if (p->i < p->n && p->s[p->i] == ',') {
			p->i++;
			continue;
		}
		if (p->i < p->n && p->s[p->i] == close) {
			p->i++;
			if (object)
				merge_duplicates(j);
			return 0;
		}
		return perr(p, object ? "expected ',' or '}'" : "expected ',' or ']'");
	}
}

static int literal(struct parser *p, const char *word)
{
	size_t k = strlen(word);
	if (p->n - p->i < k || memcmp(p->s + p->i, word, k))
		return -1;
	p->i += k;
	return 0;
}

static int parse_value(struct parser *p, struct json *j, int depth)
{
	j->line = p->line;
	if (p->i >= p->n)
		return perr(p, "unexpected end of the file");
	switch (p->s[p->i]) {
	case '{':
	case '[':
		return parse_container(p, j, depth);
	case '"':
		j->type = JSON_STRING;
		return parse_string(p, &j->str, &j->len);
	case 't':
		j->type = JSON_TRUE;
		return literal(p, "true") ? perr(p, "bad literal") : 0;
	case 'f':
		j->type = JSON_FALSE;
		return literal(p, "false") ? perr(p, "bad literal") : 0;
	case 'n':
		j->type = JSON_NULL;
		return literal(p, "null") ? perr(p, "bad literal") : 0;
	default:
		if (p->s[p->i] == '-' || (p->s[p->i] >= '0' && p->s[p->i] <= '9'))
			return parse_number(p, j);
		return perr(p, "expected a JSON value");
	}
}

static void free_kids(struct json *j)
{
	if (j->type == JSON_ARRAY || j->type == JSON_OBJECT)
		for (size_t i = 0; i < j->len; i++)
			free_kids(&j->kids[i]);
	free(j->kids);
	free(j->key);
	free(j->str);
}

void json_free(struct json *j)
{
	if (!j)
		return;
	free_kids(j);
	free(j);
}

int json_parse(struct json **out, const char *text, size_t len, const char *name)
{
	struct parser p = {name, (const unsigned char *)text, len, 0, 1};
	struct json *j = xcalloc(1, sizeof(*j));
	*out = NULL;
	skip_ws(&p);
	if (parse_value(&p, j, 0)) {
		json_free(j);
		return -1;
	}
	skip_ws(&p);
	if (p.i != p.n) {
		json_free(j);
		return perr(&p, "trailing characters after the JSON value");
	}
	*out = j;
	return 0;
}

int json_parse_file(struct json **out, const char *path)
{
	struct buf b = {0};
	*out = NULL;
	if (read_file(path, &b))
		return -1;
	int rc = json_parse(out, (const char *)b.data, b.len, path);
	buf_free(&b);
	return rc;
}

/* ---- JSON Lines records: check the whole value, decode one member ---- */

struct scan {
	const unsigned char *s;
	size_t n, i;
	const char *why;
};

static int scan_fail(struct scan *p, const char *why)
{
	p->why = why;
	return -1;
}

static void scan_ws(struct scan *p)
{
	for (; p->i < p->n; p->i++) {
		unsigned char c = p->s[p->i];
		if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
			return;
	}
}

/* The string whose opening quote is at p->i; decoded into out unless NULL. */
static int scan_string(struct scan *p, struct buf *out, int *escaped)
{
	p->i++;
	p->why = string_body(p->s, p->n, &p->i, out, escaped);
	return p->why ? -1 : 0;
}

static int scan_value(struct scan *p, int depth, enum json_type *type);

/* Skip the array or object at p->i, checking it. */
static int scan_container(struct scan *p, int depth)
{
	int object = p->s[p->i] == '{';
	unsigned char close = object ? '}' : ']';
	if (depth >= JSON_MAX_DEPTH)
		return scan_fail(p, "nesting too deep");
	p->i++;
	scan_ws(p);
	if (p->i < p->n && p->s[p->i] == close) {
		p->i++;
		return 0;
	}
	for (;;) {
		enum json_type t;
		scan_ws(p);
		if (object) {
			if (p->i >= p->n || p->s[p->i] != '"')
				return scan_fail(p, "expected a member name (a string)");
			if (scan_string(p, NULL, NULL))
				return -1;
			scan_ws(p);
			if (p->i >= p->n || p->s[p->i] != ':')
				return scan_fail(p, "expected ':' after a member name");
			p->i++;
			scan_ws(p);
		}
		if (scan_value(p, depth + 1, &t))
			return -1;
		scan_ws(p);
		if (p->i < p->n && p->s[p->i] == ',') {
			p->i++;
			continue;
		}
		if (p->i < p->n && p->s[p->i] == close) {
			p->i++;
			return 0;
		}
		return scan_fail(p, object ? "expected ',' or '}'" : "expected ',' or ']'");
	}
}

static int scan_literal(struct scan *p, const char *word)
{
	size_t k = strlen(word);
	if (p->n - p->i < k || memcmp(p->s + p->i, word, k))
		return scan_fail(p, "bad literal");
	p->i += k;
	return 0;
}

/* Skip the value at p->i, checking it as parse_value does. */
static int scan_value(struct scan *p, int depth, enum json_type *type)
{
	int integral;
	if (p->i >= p->n)
		return scan_fail(p, "unexpected end of the record");
	switch (p->s[p->i]) {
	case '{':
	case '[':
		*type = p->s[p->i] == '{' ? JSON_OBJECT : JSON_ARRAY;
		return scan_container(p, depth);
	case '"':
		*type = JSON_STRING;
		return scan_string(p, NULL, NULL);
	case 't':
		*type = JSON_TRUE;
		return scan_literal(p, "true");
	case 'f':
		*type = JSON_FALSE;
		return scan_literal(p, "false");
	case 'n':
		*type = JSON_NULL;
		return scan_literal(p, "null");
	default:
		*type = JSON_NUMBER;
		if (p->s[p->i] != '-' && !is_digit(p->s[p->i]))
			return scan_fail(p, "expected a JSON value");
		p->why = number_end(p->s, p->n, &p->i, &integral);
		return p->why ? -1 : 0;
	}
}

/* Is the member name just scanned, s[start..end) with its quotes, key? */
static int name_is(const unsigned char *s, size_t start, size_t end, int escaped, const char *key,
		   size_t klen)
{
	if (!escaped)
		return end - start - 2 == klen && !memcmp(s + start + 1, key, klen);
	struct buf b = {0};
	size_t i = start + 1;
	string_body(s, end, &i, &b, NULL);
	int same = b.len == klen && !memcmp(b.data, key, klen);
	buf_free(&b);
	return same;
}

enum json_record json_record_string(const char *text, size_t len, const char *key,
				    struct buf *out, struct json_record_error *e)
{
	struct scan p = {(const unsigned char *)text, len, 0, NULL};
	size_t klen = strlen(key);
	enum json_type t = JSON_NULL;
	int seen = 0;
	memset(e, 0, sizeof(*e));
	out->len = 0;
	scan_ws(&p);
	if (p.i < p.n && p.s[p.i] != '{') {
		if (scan_value(&p, 0, &t))
			goto invalid;
		scan_ws(&p);
		if (p.i != p.n)
			goto trailing;
		e->type = t;
		return JSON_RECORD_NOT_OBJECT;
	}
	if (p.i >= p.n) {
		scan_fail(&p, "no JSON value");
		goto invalid;
	}
	/* the members of the object, as scan_container, looking for key */
	p.i++;
	scan_ws(&p);
	if (p.i < p.n && p.s[p.i] == '}') {
		p.i++;
	} else {
		for (;;) {
			scan_ws(&p);
			if (p.i >= p.n || p.s[p.i] != '"') {
				scan_fail(&p, "expected a member name (a string)");
				goto invalid;
			}
			size_t start = p.i;
			int escaped = 0;
			if (scan_string(&p, NULL, &escaped))
				goto invalid;
			/* the last member of that name counts, as in json_parse */
			int match = name_is(p.s, start, p.i, escaped, key, klen);
			if (match)
				out->len = 0;
			scan_ws(&p);
			if (p.i >= p.n || p.s[p.i] != ':') {
				scan_fail(&p, "expected ':' after a member name");
				goto invalid;
			}
			p.i++;
			scan_ws(&p);
			if (match && p.i < p.n && p.s[p.i] == '"') {
				t = JSON_STRING;
				if (scan_string(&p, out, NULL))
					goto invalid;
			} else if (scan_value(&p, 1, match ? &t : &(enum json_type){0})) {
				goto invalid;
			}
			seen |= match;
			scan_ws(&p);
			if (p.i < p.n && p.s[p.i] == ',') {
				p.i++;
				continue;
			}
			if (p.i < p.n && p.s[p.i] == '}') {
				p.i++;
				break;
			}
			scan_fail(&p, "expected ',' or '}'");
			goto invalid;
		}
	}
	scan_ws(&p);
	if (p.i != p.n)
		goto trailing;
	if (!seen)
		return JSON_RECORD_NO_MEMBER;
	if (t != JSON_STRING) {
		e->type = t;
		out->len = 0;
		return JSON_RECORD_NOT_STRING;
	}
	return JSON_RECORD_OK;
trailing:
	scan_fail(&p, "trailing characters after the JSON value");
invalid:
	out->len = 0;
	e->why = p.why;
	e->at = p.i;
	return JSON_RECORD_INVALID;
}

const struct json *json_get(const struct json *j, const char *key)
{
	if (!j || j->type != JSON_OBJECT)
		return NULL;
	size_t k = strlen(key);
	for (size_t i = 0; i < j->len; i++)
		if (j->kids[i].key_len == k && !memcmp(j->kids[i].key, key, k))
			return &j->kids[i];
	return NULL;
}

const char *json_type_name(enum json_type t)
{
	static const char *const names[] = {"null", "false", "true", "a number", "a string",
					    "an array", "an object"};
	return (unsigned)t < ARRAY_SIZE(names) ? names[t] : "?";
}

void json_put_string(struct buf *b, const char *s, size_t n)
{
	buf_append(b, "\"", 1);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		char esc[8];
		if (c == '"' || c == '\\') {
			esc[0] = '\\';
			esc[1] = (char)c;
			buf_append(b, esc, 2);
		} else if (c < 0x20) {
			static const char hex[] = "0123456789abcdef";
			memcpy(esc, "\\u00", 4);
			esc[4] = hex[c >> 4];
			esc[5] = hex[c & 15];
			buf_append(b, esc, 6);
		} else {
			buf_append(b, &s[i], 1);
		}
	}
	buf_append(b, "\"", 1);
}
