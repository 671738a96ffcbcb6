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
	buf_append(b, o, n);
}

static int hex4(struct parser *p, uint32_t *v)
{
	*v = 0;
	if (p->n - p->i < 4)
		return -1;
	for (int k = 0; k < 4; k++) {
		int c = p->s[p->i++], d;
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

/* A string at p->i (the opening quote) into a malloc'ed NUL-terminated copy. */
static int parse_string(struct parser *p, char **out, size_t *len)
{
	struct buf b = {0};
	p->i++;
	for (;;) {
		if (p->i >= p->n) {
			buf_free(&b);
			return perr(p, "unterminated string");
		}
		unsigned c = p->s[p->i];
		if (c == '"') {
			p->i++;
			break;
		}
		if (c < 0x20) {
			buf_free(&b);
			return perr(p, "control character in a string");
		}
		if (c != '\\') {
			/* copy a run of plain bytes, then check it is UTF-8 */
			size_t j = p->i;
			while (j < p->n && p->s[j] != '"' && p->s[j] != '\\' && p->s[j] >= 0x20)
				j++;
			if (!json_utf8_valid(p->s + p->i, j - p->i)) {
				buf_free(&b);
				return perr(p, "string is not valid UTF-8");
			}
			buf_append(&b, p->s + p->i, j - p->i);
			p->i = j;
			continue;
		}
		if (++p->i >= p->n) {
			buf_free(&b);
			return perr(p, "unterminated escape");
		}
		c = p->s[p->i++];
		const char *simple = c ? strchr("\"\\/bfnrt", (int)c) : NULL;
		if (simple) {
			static const char map[] = "\"\\/\b\f\n\r\t";
			buf_append(&b, &map[simple - "\"\\/bfnrt"], 1);
			continue;
		}
		uint32_t cp, lo;
		if (c != 'u' || hex4(p, &cp)) {
			buf_free(&b);
			return perr(p, "bad escape in a string");
		}
		if (cp >= 0xD800 && cp < 0xDC00) {
			if (p->n - p->i < 2 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u' ||
			    (p->i += 2, hex4(p, &lo)) || lo < 0xDC00 || lo > 0xDFFF) {
				buf_free(&b);
				return perr(p, "bad surrogate pair in a \\u escape");
			}
			cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
		} else if (cp >= 0xDC00 && cp < 0xE000) {
			buf_free(&b);
			return perr(p, "lone surrogate in a \\u escape");
		}
		put_utf8(&b, cp);
	}
	*len = b.len;
	buf_append(&b, "", 1);
	*out = (char *)b.data;
	return 0;
}

static int parse_number(struct parser *p, struct json *j)
{
	size_t start = p->i;
	int neg = 0, integral = 1, overflow = 0;
	uint64_t v = 0;
	if (p->s[p->i] == '-') {
		neg = 1;
		p->i++;
	}
	if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9')
		return perr(p, "bad number");
	if (p->s[p->i] == '0' && p->i + 1 < p->n && p->s[p->i + 1] >= '0' && p->s[p->i + 1] <= '9')
		return perr(p, "number with a leading zero");
	while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
		unsigned d = p->s[p->i++] - '0';
		if (v > (UINT64_MAX - d) / 10)
			overflow = 1;
		else
			v = v * 10 + d;
	}
	if (p->i < p->n && p->s[p->i] == '.') {
		integral = 0;
		p->i++;
		if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9')
			return perr(p, "bad number: no digits after '.'");
		while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
			p->i++;
	}
	if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
		integral = 0;
		p->i++;
		if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-'))
			p->i++;
		if (p->i >= p->n || p->s[p->i] < '0' || p->s[p->i] > '9')
			return perr(p, "bad number: no digits in the exponent");
		while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
			p->i++;
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
