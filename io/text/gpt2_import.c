/* gpt2_import.c - build a tokenizer from GPT-2's encoder.json and vocab.bpe.
 *
 * encoder.json maps token strings to ids; the strings spell bytes through
 * GPT-2's bytes_to_unicode table (printable Latin-1 bytes stand for
 * themselves, the other 68 bytes for U+0100 upwards, in byte order).
 * vocab.bpe lists the merges in rank order, one "LEFT RIGHT" pair a line
 * after a "#version" line. <|endoftext|> becomes the special end-of-text id.
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"

/* codepoint -> byte for the bytes_to_unicode alphabet, -1 elsewhere */
int gpt2_byte_of_cp(uint32_t cp)
{
	static int table[324];
	static int ready;
	if (!ready) {
		int n = 0;
		for (int i = 0; i < 324; i++)
			table[i] = -1;
		for (int b = 0; b < 256; b++) {
			int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) ||
					(b >= 0xAE && b <= 0xFF);
			table[printable ? b : 256 + n++] = b;
		}
		ready = 1;
	}
	return cp < 324 ? table[cp] : -1;
}

uint32_t gpt2_cp_of_byte(unsigned char b)
{
	int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
	if (printable)
		return b;
	uint32_t n = 0; /* non-printable bytes below b */
	for (int i = 0; i < b; i++)
		n += !((i >= '!' && i <= '~') || (i >= 0xA1 && i <= 0xAC) || i >= 0xAE);
	return 256 + n;
}

static size_t put_utf8(unsigned char *o, uint32_t cp)
{
	if (cp < 0x80) {
		o[0] = (unsigned char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (unsigned char)(0xC0 | cp >> 6);
		o[1] = (unsigned char)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (unsigned char)(0xE0 | cp >> 12);
		o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
		o[2] = (unsigned char)(0x80 | (cp & 0x3F));
		return 3;
	}
	o[0] = (unsigned char)(0xF0 | cp >> 18);
	o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
	o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
	o[3] = (unsigned char)(0x80 | (cp & 0x3F));
	return 4;
}

/* ---- a string -> id map over the UTF-8 token names ---- */

struct names {
	struct buf text;     /* names, concatenated */
	uint32_t *off, *len; /* by id */
	uint32_t *slot;      /* id + 1, 0 empty */
	size_t mask;
	uint32_t nids;       /* ids seen: max id + 1 */
	uint32_t cap;
};

static uint64_t name_hash(const void *p, size_t n)
{
	return fnv1a64(FNV1A64_INIT, p, n);
}

static int names_find(const struct names *nm, const void *p, size_t n)
{
	for (size_t i = name_hash(p, n) & nm->mask; nm->slot[i]; i = (i + 1) & nm->mask) {
		uint32_t id = nm->slot[i] - 1;
		if (nm->len[id] == n && !memcmp(nm->text.data + nm->off[id], p, n))
			return (int)id;
	}
	return -1;
}

/* ---- encoder.json ---- */

struct jp {
	const char *path;
	const unsigned char *s;
	size_t n, i;
};

static int jp_error(struct jp *p, const char *what)
{
	int line = 1;
	for (size_t k = 0; k < p->i && k < p->n; k++)
		line += p->s[k] == '\n';
	return error("%s:%d: %s", p->path, line, what);
}

static void jp_ws(struct jp *p)
{
	while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\n' || p->s[p->i] == '\r' ||
			       p->s[p->i] == '\t'))
		p->i++;
}

static int jp_hex4(struct jp *p, uint32_t *v)
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

/* A JSON string at p->i into out (UTF-8). */
static int jp_string(struct jp *p, struct buf *out)
{
	out->len = 0;
	if (p->i >= p->n || p->s[p->i] != '"')
		return jp_error(p, "expected a string");
	p->i++;
	for (;;) {
		if (p->i >= p->n)
			return jp_error(p, "unterminated string");
		unsigned c = p->s[p->i++];
		if (c == '"')
			return 0;
		if (c < 0x20)
			return jp_error(p, "control character in string");
		if (c != '\\') {
			unsigned char ch = (unsigned char)c;
			buf_append(out, &ch, 1);
			continue;
		}
		if (p->i >= p->n)
			return jp_error(p, "unterminated escape");
		c = p->s[p->i++];
		const char *simple = strchr("\"\\/bfnrt", (int)c);
		if (c && simple) {
			static const char map[] = "\"\\/\b\f\n\r\t";
			buf_append(out, &map[simple - "\"\\/bfnrt"], 1);
			continue;
		}
		if (c != 'u')
			return jp_error(p, "bad escape in string");
		uint32_t cp, lo;
		if (jp_hex4(p, &cp))
			return jp_error(p, "bad \\u escape");
		if (cp >= 0xD800 && cp < 0xDC00) {
			if (p->n - p->i < 2 || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u')
				return jp_error(p, "lone surrogate in \\u escape");
			p->i += 2;
			if (jp_hex4(p, &lo) || lo < 0xDC00 || lo > 0xDFFF)
				return jp_error(p, "bad surrogate pair");
			cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
		} else if (cp >= 0xDC00 && cp < 0xE000) {
			return jp_error(p, "lone surrogate in \\u escape");
		}
		unsigned char u[4];
		buf_append(out, u, put_utf8(u, cp));
	}
}

static int read_encoder(const char *path, struct names *nm)
{
	struct buf f = {0}, key = {0};
	if (read_file(path, &f))
		return -1;
	struct jp p = {path, f.data, f.len, 0};
	int rc = -1;
	size_t count = 0;
	nm->cap = 1024;
	nm->off = xcalloc(nm->cap, sizeof(*nm->off));
	nm->len = xcalloc(nm->cap, sizeof(*nm->len));
	unsigned char *seen = xcalloc(nm->cap, 1);
	jp_ws(&p);
	if (p.i >= p.n || p.s[p.i++] != '{') {
		jp_error(&p, "expected '{'");
		goto out;
	}
	jp_ws(&p);
	if (p.i < p.n && p.s[p.i] == '}')
		p.i++;
	else
		for (;;) {
			jp_ws(&p);
			if (jp_string(&p, &key))
				goto out;
			jp_ws(&p);
			if (p.i >= p.n || p.s[p.i++] != ':') {
				jp_error(&p, "expected ':'");
				goto out;
			}
			jp_ws(&p);
			uint64_t id = 0;
			size_t d = 0;
			while (p.i < p.n && p.s[p.i] >= '0' && p.s[p.i] <= '9' && d < 9) {
				id = id * 10 + (p.s[p.i++] - '0');
				d++;
			}
			if (!d || id >= TOKENIZER_MAX_VOCAB ||
			    (p.i < p.n && p.s[p.i] >= '0' && p.s[p.i] <= '9')) {
				jp_error(&p, "expected a token id (0..16777215)");
				goto out;
			}
			if (id >= nm->cap) {
				uint32_t ncap = nm->cap;
				while (ncap <= id)
					ncap *= 2;
				nm->off = xrealloc(nm->off, st_mult(ncap, sizeof(*nm->off)));
				nm->len = xrealloc(nm->len, st_mult(ncap, sizeof(*nm->len)));
				seen = xrealloc(seen, ncap);
				memset(seen + nm->cap, 0, ncap - nm->cap);
				nm->cap = ncap;
			}
			if (seen[id]) {
				jp_error(&p, "token id listed twice");
				goto out;
			}
			seen[id] = 1;
			nm->off[id] = (uint32_t)nm->text.len;
			nm->len[id] = (uint32_t)key.len;
			buf_append(&nm->text, key.data, key.len);
			if (id + 1 > nm->nids)
				nm->nids = (uint32_t)id + 1;
			count++;
			jp_ws(&p);
			if (p.i < p.n && p.s[p.i] == ',') {
				p.i++;
				continue;
			}
			if (p.i < p.n && p.s[p.i] == '}') {
				p.i++;
				break;
			}
			jp_error(&p, "expected ',' or '}'");
			goto out;
		}
	jp_ws(&p);
	if (p.i != p.n) {
		jp_error(&p, "trailing characters after the object");
		goto out;
	}
	if (count != nm->nids) {
		error("%s: token ids are not 0..%u without gaps", path, nm->nids ? nm->nids - 1 : 0);
		goto out;
	}
	nm->mask = 1;
	while (nm->mask < 2 * (size_t)count)
		nm->mask = nm->mask * 2 + 1;
	nm->slot = xcalloc(nm->mask + 1, sizeof(*nm->slot));
	for (uint32_t id = 0; id < nm->nids; id++) {
		const unsigned char *s = nm->text.data + nm->off[id];
		if (names_find(nm, s, nm->len[id]) >= 0) {
			error("%s: token string of id %u listed twice", path, id);
			goto out;
		}
		size_t i = name_hash(s, nm->len[id]) & nm->mask;
		while (nm->slot[i])
			i = (i + 1) & nm->mask;
		nm->slot[i] = id + 1;
	}
	rc = 0;
out:
	free(seen);
	buf_free(&f);
	buf_free(&key);
	return rc;
}

int gpt2_import(struct tokenizer **tok, const char *encoder_json, const char *vocab_bpe)
{
	struct names nm = {0};
	struct buf bpe = {0}, bytes = {0}, cat = {0};
	uint32_t *lens = NULL, (*merges)[3] = NULL, *special = NULL;
	uint32_t nmerges = 0, mcap = 0, nspecial = 0, eot = TOKENIZER_NO_ID;
	int rc = -1;
	*tok = NULL;
	if (read_encoder(encoder_json, &nm) || read_file(vocab_bpe, &bpe))
		goto out;
	uint32_t V = nm.nids;
	lens = xcalloc(V ? V : 1, sizeof(*lens));
	special = xmalloc(st_mult(V ? V : 1, sizeof(*special)));
	/* token bytes */
	for (uint32_t id = 0; id < V; id++) {
		const unsigned char *s = nm.text.data + nm.off[id];
		size_t n = nm.len[id], start = bytes.len;
		if (n == strlen(TOKENIZER_EOT) && !memcmp(s, TOKENIZER_EOT, n)) {
			special[nspecial++] = eot = id;
			buf_append(&bytes, s, n);
			lens[id] = (uint32_t)n;
			continue;
		}
		for (size_t i = 0; i < n;) {
			uint32_t cp = s[i];
			size_t l = 1;
			if (cp >= 0x80) {
				if ((cp & 0xE0) == 0xC0 && i + 1 < n)
					cp = (cp & 0x1F) << 6 | (s[i + 1] & 0x3F), l = 2;
				else
					cp = UINT32_MAX;
			}
			int b = cp == UINT32_MAX ? -1 : gpt2_byte_of_cp(cp);
			if (b < 0) {
				error("%s: token %u is not spelled in GPT-2's byte alphabet",
				      encoder_json, id);
				goto out;
			}
			unsigned char ch = (unsigned char)b;
			buf_append(&bytes, &ch, 1);
			i += l;
		}
		lens[id] = (uint32_t)(bytes.len - start);
	}
	/* merges */
	char *line = (char *)bpe.data, *end = line + bpe.len;
	for (int lineno = 1; line < end; lineno++) {
		char *nl = memchr(line, '\n', (size_t)(end - line));
		char *le = nl ? nl : end;
		size_t len = (size_t)(le - line);
		if (len && line[len - 1] == '\r')
			len--;
		if (!(lineno == 1 && len && line[0] == '#') && len) {
			char *sp = memchr(line, ' ', len);
			if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - line))) {
				error("%s:%d: expected 'LEFT RIGHT'", vocab_bpe, lineno);
				goto out;
			}
			int a = names_find(&nm, line, (size_t)(sp - line));
			int b = names_find(&nm, sp + 1, len - (size_t)(sp + 1 - line));
			cat.len = 0;
			buf_append(&cat, line, (size_t)(sp - line));
			buf_append(&cat, sp + 1, len - (size_t)(sp + 1 - line));
			int c = names_find(&nm, cat.data, cat.len);
			if (a < 0 || b < 0 || c < 0) {
				error("%s:%d: merge of tokens not in %s", vocab_bpe, lineno,
				      encoder_json);
				goto out;
			}
			if (nmerges == mcap) {
				mcap = mcap ? 2 * mcap : 1024;
				merges = xrealloc(merges, st_mult(mcap, sizeof(*merges)));
			}
			merges[nmerges][0] = (uint32_t)a;
			merges[nmerges][1] = (uint32_t)b;
			merges[nmerges][2] = (uint32_t)c;
			nmerges++;
		}
		line = nl ? nl + 1 : end;
	}
	rc = tokenizer_build(tok, V, lens, bytes.data, nmerges, (const uint32_t(*)[3])merges,
			     nspecial, special, eot);
	if (rc)
		error("%s, %s: not a consistent GPT-2 tokenizer", encoder_json, vocab_bpe);
out:
	free(nm.off);
	free(nm.len);
	free(nm.slot);
	buf_free(&nm.text);
	buf_free(&bpe);
	buf_free(&bytes);
	buf_free(&cat);
	free(lens);
	free(merges);
	free(special);
	return rc;
}
