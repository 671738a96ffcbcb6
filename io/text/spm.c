/* spm.c - SentencePiece-style BPE: normalizers, Metaspace, character-level
 * initial symbols with byte fallback, decoding (see spm.h). The merges
 * themselves run in tokenizer.c (tokenizer_bpe_ids). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "pretok.h"
#include "spm.h"
#include "unicode_nfc.h"
#include "tokenizer.h"

struct spm {
	struct spm_params p;
	int pipe_kind;          /* PRETOK_SPM or PRETOK_METASPACE */
	uint32_t byte_id[256];  /* "<0xXX>" tokens (TOK_BYTE_FALLBACK), else UINT32_MAX */
	unsigned char *is_byte; /* [vocab]: 1 for a byte-fallback token */
	uint32_t *ckey, *cid;   /* single-character tokens: code point -> id, open addressing */
	uint32_t cmask;
	unsigned char meta[4];  /* the replacement character's UTF-8 */
	size_t meta_len;
	int cut;                /* 1: pieces may be cut before '▁' after another character */
	uint32_t flags;
	size_t extra, growth;   /* an encoding of len bytes has at most (len + extra) * growth ids */
};

#define NO_CP UINT32_MAX

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
		o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
		o[2] = (unsigned char)(0x80 | (cp & 0x3F));
		return 3;
	}
	o[0] = (unsigned char)(0xF0 | cp >> 18);
	o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
	o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
	o[3] = (unsigned char)(0x80 | (cp & 0x3F));
	return 4;
}

static inline uint32_t cp_slot(uint32_t cp, uint32_t mask)
{
	return (uint32_t)((cp * 0x9E3779B1u) >> 7) & mask;
}

static inline uint32_t char_id(const struct spm *s, uint32_t cp)
{
	for (uint32_t i = cp_slot(cp, s->cmask);; i = (i + 1) & s->cmask) {
		if (s->ckey[i] == cp)
			return s->cid[i];
		if (s->ckey[i] == NO_CP)
			return UINT32_MAX;
	}
}

/* The number of UTF-8 characters of s[0..n) (a stray byte counts as one). */
static size_t count_chars(const unsigned char *s, size_t n)
{
	size_t k = 0;
	uint32_t cp;
	for (size_t i = 0; i < n; k++) {
		size_t l = utf8_decode(s + i, n - i, &cp);
		i += l ? l : 1;
	}
	return k;
}

/* "<0xXX>" with XX upper-case hex, as Hugging Face spells a byte-fallback
 * token: its byte, or -1 */
static int fallback_byte(const unsigned char *s, size_t n)
{
	static const char hex[] = "0123456789ABCDEF";
	if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
		return -1;
	const char *h = memchr(hex, s[3], 16), *l = memchr(hex, s[4], 16);
	if (!s[3] || !s[4] || !h || !l)
		return -1;
	return (int)((h - hex) << 4 | (l - hex));
}

static int check_params(const struct spm_params *p, const char *name)
{
	if (p->nnorm > SPM_MAX_NORM)
		return error("%s: %u normalizer steps (at most %d)", name, p->nnorm, SPM_MAX_NORM);
	for (uint32_t i = 0; i < p->nnorm; i++) {
		const struct spm_norm *n = &p->norm[i];
		if (n->kind != NORM_PREPEND && n->kind != NORM_REPLACE && n->kind != NORM_NFC)
			return error("%s: normalizer %u has unknown kind %u: written by a newer "
				     "asyncpp?", name, i, n->kind);
		if (n->kind == NORM_NFC) { /* no strings */
			if (n->alen || n->blen)
				return error("%s: normalizer %u (NFC) with strings: file is corrupt",
					     name, i);
			continue;
		}
		if (n->alen > SPM_MAX_STR || n->blen > SPM_MAX_STR || !n->alen ||
		    (n->kind == NORM_PREPEND && n->blen) ||
		    !json_utf8_valid((const unsigned char *)n->a, n->alen) ||
		    !json_utf8_valid((const unsigned char *)n->b, n->blen))
			return error("%s: normalizer %u: bad strings", name, i);
		/* a Replace never makes more characters than the bytes it replaces
		 * (imports refuse others), which keeps tokenizer_max_ids near len */
		if (n->kind == NORM_REPLACE &&
		    count_chars((const unsigned char *)n->b, n->blen) > n->alen)
			return error("%s: normalizer %u replaces %u bytes by more characters", name, i,
				     n->alen);
	}
	if (p->prepend > META_NEVER || p->split > 1 || p->decode_strip > 1 ||
	    p->meta_cp > 0x10FFFF || (p->meta_cp >= 0xD800 && p->meta_cp < 0xE000) ||
	    p->meta_cp == ' ' || !p->meta_cp)
		return error("%s: bad Metaspace or decoder parameters", name);
	return 0;
}

/* Is normalizer step i "prepend the replacement" (j = 0) or "replace ' ' by it" (j = 1)? */
static int is_llama_step(const struct spm *s, uint32_t i, int j)
{
	const struct spm_norm *m = &s->p.norm[i];
	if (j == 0)
		return m->kind == NORM_PREPEND && m->alen == s->meta_len &&
		       !memcmp(m->a, s->meta, s->meta_len);
	return m->kind == NORM_REPLACE && m->alen == 1 && m->a[0] == ' ' &&
	       m->blen == s->meta_len && !memcmp(m->b, s->meta, s->meta_len);
}

/* The most ids an encoding gives: an id is at least one byte of the
 * normalized text, which a Replace may lengthen (a step that makes blen
 * bytes of alen multiplies the length by at most ceil(blen / alen)) and a
 * Prepend or Metaspace lengthens by its string. Llama 2's and Mistral's
 * shapes (Prepend and Replace of ' ' by the replacement, or none, and the
 * replacement a token) give one id for the ' ' a replacement takes: at most
 * len + 2 ids. */
static void bound_ids(struct spm *s, int meta_token)
{
	int meta = s->pipe_kind == PRETOK_METASPACE;
	if (meta_token && (s->p.nnorm == 0 ||
	    (s->p.nnorm == 2 && is_llama_step(s, 0, 0) && is_llama_step(s, 1, 1)))) {
		s->extra = 2;
		s->growth = 1;
		return;
	}
	s->extra = meta ? s->meta_len : 0;
	s->growth = meta ? s->meta_len : 1;
	for (uint32_t i = 0; i < s->p.nnorm; i++) {
		const struct spm_norm *m = &s->p.norm[i];
		if (m->kind == NORM_PREPEND)
			s->extra += m->alen;
		else if (m->kind == NORM_NFC) /* NFC at most triples the bytes */
			s->growth *= 3;
		else
			s->growth *= (m->blen + m->alen - 1) / m->alen > 1 ?
				     (m->blen + m->alen - 1) / m->alen : 1;
	}
}

int spm_new(struct spm **out, const struct tokenizer *t, const struct spm_params *p,
	    const char *name)
{
	*out = NULL;
	if (check_params(p, name))
		return -1;
	uint32_t V = tokenizer_vocab_size(t);
	struct spm *s = xcalloc(1, sizeof(*s));
	s->p = *p;
	s->pipe_kind = (int)tokenizer_pretok(t);
	if (s->pipe_kind == PRETOK_SPM && (p->prepend != META_NEVER || p->split)) {
		free(s);
		return error("%s: Metaspace parameters without Metaspace", name);
	}
	s->flags = tokenizer_flags(t);
	s->meta_len = put_utf8(s->meta, p->meta_cp);
	s->is_byte = xcalloc(V ? V : 1, 1);
	uint32_t bits = 4;
	while (((uint64_t)1 << bits) < 2 * (uint64_t)V)
		bits++;
	s->cmask = (uint32_t)(((uint64_t)1 << bits) - 1);
	s->ckey = xmalloc(st_mult((size_t)s->cmask + 1, sizeof(*s->ckey)));
	s->cid = xmalloc(st_mult((size_t)s->cmask + 1, sizeof(*s->cid)));
	memset(s->ckey, 0xff, ((size_t)s->cmask + 1) * sizeof(*s->ckey));
	for (int b = 0; b < 256; b++)
		s->byte_id[b] = UINT32_MAX;
	int meta_token = 0, meta_inside = 0;
	for (uint32_t id = 0; id < V; id++) {
		size_t n;
		const unsigned char *tk = tokenizer_token(t, id, &n);
		if (tokenizer_is_special(t, id))
			continue;
		if (!json_utf8_valid(tk, n)) {
			error("%s: token %u is not UTF-8", name, id);
			goto fail;
		}
		int b = fallback_byte(tk, n);
		if (b >= 0 && (s->flags & TOK_BYTE_FALLBACK)) {
			s->byte_id[b] = id;
			s->is_byte[id] = 1;
		}
		uint32_t cp;
		size_t l = utf8_decode(tk, n, &cp);
		if (l == n) { /* a single character */
			uint32_t i = cp_slot(cp, s->cmask);
			for (; s->ckey[i] != NO_CP; i = (i + 1) & s->cmask)
				if (s->ckey[i] == cp) {
					error("%s: tokens %u and %u are the same character", name,
					      s->cid[i], id);
					goto fail;
				}
			s->ckey[i] = cp;
			s->cid[i] = id;
			meta_token |= cp == p->meta_cp;
		}
		/* the replacement character after another character */
		for (size_t i = 0; i < n;) {
			size_t k = utf8_decode(tk + i, n - i, &cp);
			if (cp == p->meta_cp && i && !(i >= s->meta_len &&
			    !memcmp(tk + i - s->meta_len, s->meta, s->meta_len)))
				meta_inside = 1;
			i += k;
		}
	}
	if (s->flags & TOK_BYTE_FALLBACK)
		for (int b = 0; b < 256; b++)
			if (s->byte_id[b] == UINT32_MAX) {
				error("%s: byte_fallback without a token <0x%02X>", name, b);
				goto fail;
			}
	if (p->unk != TOKENIZER_NO_ID && p->unk >= V) {
		error("%s: unknown-token id %u out of range (vocabulary %u)", name, p->unk, V);
		goto fail;
	}
	s->cut = meta_token && !meta_inside && !(s->flags & TOK_IGNORE_MERGES);
	bound_ids(s, meta_token);
	*out = s;
	return 0;
fail:
	spm_free(s);
	return -1;
}

void spm_free(struct spm *s)
{
	if (!s)
		return;
	free(s->is_byte);
	free(s->ckey);
	free(s->cid);
	free(s);
}

const struct spm_params *spm_params(const struct spm *s) { return &s->p; }

size_t spm_max_ids(const struct spm *s, size_t len)
{
	return st_mult(st_add(len, s->extra), s->growth);
}

/* ---- the file's section ---- */

void spm_params_put(const struct spm_params *p, struct buf *out)
{
	unsigned char w[4];
#define PUT(v) (put_le32(w, (v)), buf_append(out, w, 4))
	PUT(p->nnorm);
	for (uint32_t i = 0; i < p->nnorm; i++) {
		PUT(p->norm[i].kind);
		PUT(p->norm[i].alen);
		buf_append(out, p->norm[i].a, p->norm[i].alen);
		PUT(p->norm[i].blen);
		buf_append(out, p->norm[i].b, p->norm[i].blen);
	}
	PUT(p->prepend);
	PUT(p->split);
	PUT(p->meta_cp);
	PUT(p->decode_strip);
	PUT(p->unk);
#undef PUT
}

int spm_params_get(struct spm_params *o, const unsigned char *p, size_t n, const char *name)
{
	size_t at = 0;
	memset(o, 0, sizeof(*o));
#define GET(v) do { if (n - at < 4) goto trunc; (v) = get_le32(p + at); at += 4; } while (0)
	GET(o->nnorm);
	if (o->nnorm > SPM_MAX_NORM)
		return error("%s: %u normalizer steps (at most %d)", name, o->nnorm, SPM_MAX_NORM);
	for (uint32_t i = 0; i < o->nnorm; i++) {
		struct spm_norm *m = &o->norm[i];
		GET(m->kind);
		GET(m->alen);
		if (m->alen > SPM_MAX_STR || n - at < m->alen)
			goto trunc;
		memcpy(m->a, p + at, m->alen);
		at += m->alen;
		GET(m->blen);
		if (m->blen > SPM_MAX_STR || n - at < m->blen)
			goto trunc;
		memcpy(m->b, p + at, m->blen);
		at += m->blen;
	}
	GET(o->prepend);
	GET(o->split);
	GET(o->meta_cp);
	GET(o->decode_strip);
	GET(o->unk);
#undef GET
	if (at != n)
		return error("%s: %zu bytes after the SentencePiece parameters", name, n - at);
	return check_params(o, name);
trunc:
	return error("%s: truncated SentencePiece parameters", name);
}

/* ---- encoding ---- */

/* Append s[0..n) to out with every a[0..alen) replaced by b[0..blen). */
static void replace_all(struct buf *out, const unsigned char *s, size_t n, const char *a,
			size_t alen, const char *b, size_t blen)
{
	size_t i = 0, from = 0;
	while (i + alen <= n) {
		const unsigned char *hit = alen == 1 ? memchr(s + i, a[0], n - i) : NULL;
		if (alen == 1) {
			if (!hit)
				break;
			i = (size_t)(hit - s);
		} else if (memcmp(s + i, a, alen)) {
			i++;
			continue;
		}
		buf_append(out, s + from, i - from);
		buf_append(out, b, blen);
		i += alen;
		from = i;
	}
	buf_append(out, s + from, n - from);
}

/* Normalize and apply Metaspace's replacement and prepending: text into
 * *out (two buffers swapped between steps); first: text starts the
 * document (not after an added token). */
static void normalize(const struct spm *s, const unsigned char *text, size_t len, int first,
		      struct buf *out, struct buf *tmp)
{
	out->len = 0;
	buf_append(out, text, len);
	for (uint32_t i = 0; i < s->p.nnorm && out->len; i++) {
		const struct spm_norm *m = &s->p.norm[i];
		tmp->len = 0;
		if (m->kind == NORM_PREPEND) {
			buf_append(tmp, m->a, m->alen);
			buf_append(tmp, out->data, out->len);
		} else if (m->kind == NORM_NFC) {
			if (utf8_is_nfc_quick((const char *)out->data, out->len))
				continue;
			buf_reserve(tmp, UTF8_NFC_MAX(out->len));
			tmp->len = utf8_nfc((const char *)out->data, out->len, (char *)tmp->data,
					    UTF8_NFC_MAX(out->len));
		} else {
			replace_all(tmp, out->data, out->len, m->a, m->alen, m->b, m->blen);
		}
		struct buf x = *out;
		*out = *tmp;
		*tmp = x;
	}
	if (s->pipe_kind != PRETOK_METASPACE || !out->len)
		return;
	tmp->len = 0;
	/* "first": only the stretch at the start of the text (Hugging Face: the
	 * split whose original offset is 0), not one after an added token */
	if ((s->p.prepend == META_ALWAYS || (s->p.prepend == META_FIRST && first)) &&
	    !(out->len >= s->meta_len && !memcmp(out->data, s->meta, s->meta_len)) &&
	    out->data[0] != ' ')
		buf_append(tmp, s->meta, s->meta_len);
	replace_all(tmp, out->data, out->len, " ", 1, (const char *)s->meta, s->meta_len);
	struct buf x = *out;
	*out = *tmp;
	*tmp = x;
}

size_t spm_piece(const struct tokenizer *t, const struct spm *s, const unsigned char *p,
		 size_t n, uint32_t *out)
{
	if (s->flags & TOK_IGNORE_MERGES) {
		uint32_t id = tokenizer_whole_id(t, p, n);
		if (id != UINT32_MAX) {
			out[0] = id;
			return 1;
		}
	}
	size_t k = 0;
	int last_unk = 0;
	for (size_t i = 0; i < n;) {
		uint32_t cp, id = UINT32_MAX;
		size_t l = utf8_decode(p + i, n - i, &cp);
		if (l)
			id = char_id(s, cp);
		else
			l = 1; /* a stray byte: a character of its own, never a token */
		if (id != UINT32_MAX) {
			out[k++] = id;
			last_unk = 0;
		} else if (s->flags & TOK_BYTE_FALLBACK) {
			for (size_t j = 0; j < l; j++)
				out[k++] = s->byte_id[p[i + j]];
			last_unk = 0;
		} else if (s->p.unk != TOKENIZER_NO_ID) {
			if (!(last_unk && (s->flags & TOK_FUSE_UNK)))
				out[k++] = s->p.unk;
			last_unk = 1;
		} /* else Hugging Face drops the character */
		i += l;
	}
	return tokenizer_bpe_ids(t, out, k);
}

/* The end of the piece that starts s[0..n): the next replacement character
 * (split, or the cut of spm.h: only after another character), else n. */
static size_t next_piece(const struct spm *s, const unsigned char *p, size_t n)
{
	const unsigned char *m = s->meta;
	size_t ml = s->meta_len, i = 0;
	if (!s->p.split) /* skip the run of replacement characters the piece starts with */
		while (i + ml <= n && !memcmp(p + i, m, ml))
			i += ml;
	else if (n >= ml && !memcmp(p, m, ml))
		i = ml;
	for (;;) {
		const unsigned char *hit = memchr(p + i, m[0], n - i);
		if (!hit)
			return n;
		i = (size_t)(hit - p);
		if (i && i + ml <= n && !memcmp(p + i, m, ml))
			return i;
		i++;
	}
}

size_t spm_encode(const struct tokenizer *t, const struct spm *s, struct tok_cache *c,
		  const void *text, size_t len, int first, uint32_t *out)
{
	struct buf a = {0}, b = {0};
	normalize(s, text, len, first, &a, &b);
	size_t nout = 0;
	int cut = s->p.split && s->pipe_kind == PRETOK_METASPACE ? 1 : s->cut;
	for (size_t pos = 0; pos < a.len;) {
		size_t l = cut ? next_piece(s, a.data + pos, a.len - pos) : a.len - pos;
		nout += c ? tokenizer_piece_cached(t, c, a.data + pos, l, a.data + a.len,
						     out + nout)
			  : spm_piece(t, s, a.data + pos, l, out + nout);
		pos += l;
	}
	buf_free(&a);
	buf_free(&b);
	return nout;
}

/* ---- decoding ---- */

void spm_decode(const struct tokenizer *t, const struct spm *s, const uint32_t *ids, size_t n,
		int skip_special, int at_start, struct buf *out)
{
	int strip = at_start && s->p.decode_strip;
	for (size_t i = 0; i < n; i++) {
		size_t len;
		const unsigned char *tk = tokenizer_token(t, ids[i], &len);
		if (tokenizer_is_special(t, ids[i])) {
			if (!skip_special)
				buf_append(out, tk, len);
			/* a new document follows the end-of-text token (the shard's
			 * separator, a template's token with TOK_DOC_TEMPLATE); after
			 * an added token from the text Hugging Face's Strip does not
			 * apply (it strips a sequence's start) */
			if (ids[i] == tokenizer_eot_id(t))
				strip = s->p.decode_strip;
			continue;
		}
		if (s->is_byte[ids[i]]) {
			unsigned char byte = (unsigned char)fallback_byte(tk, len);
			if (!(strip && byte == ' '))
				buf_append(out, &byte, 1);
			strip = 0;
			continue;
		}
		size_t from = 0;
		for (size_t j = 0; j < len;) {
			if (len - j >= s->meta_len && !memcmp(tk + j, s->meta, s->meta_len)) {
				buf_append(out, tk + from, j - from);
				if (!strip)
					buf_append(out, " ", 1);
				strip = 0;
				j += s->meta_len;
				from = j;
				continue;
			}
			if (strip && tk[j] == ' ') { /* a token that spells ' ' itself */
				buf_append(out, tk + from, j - from);
				from = j + 1;
			}
			strip = 0;
			j++;
		}
		buf_append(out, tk + from, len - from);
	}
}

static void put_escaped(struct buf *out, const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		char e[8];
		unsigned char c = (unsigned char)s[i];
		if (c == ' ')
			buf_append(out, "' '", 3);
		else if (c < 0x20 || c == '"' || c == '\\') {
			snprintf(e, sizeof(e), "\\x%02x", c);
			buf_append(out, e, strlen(e));
		} else
			buf_append(out, &s[i], 1);
	}
}

void spm_describe(const struct spm *s, struct buf *out)
{
	char line[160];
	if (!s->p.nnorm)
		buf_append(out, "normalizer:     none\n", 21);
	for (uint32_t i = 0; i < s->p.nnorm; i++) {
		const struct spm_norm *m = &s->p.norm[i];
		if (m->kind == NORM_NFC) {
			buf_append(out, "normalizer:     NFC\n", 20);
			continue;
		}
		snprintf(line, sizeof(line), "normalizer:     %s ",
			 m->kind == NORM_PREPEND ? "Prepend" : "Replace");
		buf_append(out, line, strlen(line));
		put_escaped(out, m->a, m->alen);
		if (m->kind == NORM_REPLACE) {
			buf_append(out, " -> ", 4);
			put_escaped(out, m->b, m->blen);
		}
		buf_append(out, "\n", 1);
	}
	static const char *const scheme[] = {"always", "first", "never"};
	if (s->pipe_kind == PRETOK_METASPACE)
		snprintf(line, sizeof(line), "pre-tokenizer:  Metaspace U+%04" PRIX32 ", prepend %s, "
			 "split %s\n", s->p.meta_cp, scheme[s->p.prepend], s->p.split ? "true" : "false");
	else
		snprintf(line, sizeof(line), "pre-tokenizer:  none (SentencePiece-style: the text "
			 "is one piece)\n");
	buf_append(out, line, strlen(line));
	snprintf(line, sizeof(line), "BPE:            SentencePiece-style (characters first)%s%s, "
		 "unknown token %s\n", s->flags & TOK_BYTE_FALLBACK ? ", byte_fallback" : "",
		 s->flags & TOK_FUSE_UNK ? ", fuse_unk" : "",
		 s->p.unk == TOKENIZER_NO_ID ? "none" : "below");
	buf_append(out, line, strlen(line));
	if (s->p.unk != TOKENIZER_NO_ID) {
		snprintf(line, sizeof(line), "unknown token:  %" PRIu32 "\n", s->p.unk);
		buf_append(out, line, strlen(line));
	}
	snprintf(line, sizeof(line), "decoder:        U+%04" PRIX32 " -> ' ', byte fallback%s\n",
		 s->p.meta_cp, s->p.decode_strip ? ", one leading ' ' stripped" : "");
	buf_append(out, line, strlen(line));
}
