/* hf_spm.c - SentencePiece-style tokenizer.json files (Llama 2, TinyLlama,
 * Mistral) <-> our tokenizer (TOK_SPM, io/text/spm.h). Each part is
 * recognised and checked; anything else is refused naming its JSON path.
 *
 *   normalizer     null, Prepend, Replace (a String pattern, or a Regex
 *                  without metacharacters), NFC, or a Sequence of them
 *   pre_tokenizer  null (Llama 2's) or Metaspace (Mistral's)
 *   model          BPE: byte_fallback, fuse_unk, unk_token, ignore_merges;
 *                  dropout null; merges as strings or pairs
 *   decoder        Sequence[Replace(▁ -> ' '), ByteFallback, Fuse,
 *                  Strip(' ', 0 or 1, 0)] or Metaspace
 *   post_processor null or TemplateProcessing [SpecialToken X, Sequence A]
 *                  (X becomes the document separator: TOK_DOC_TEMPLATE)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_parts.h"
#include "json.h"
#include "pretok.h"
#include "spm.h"
#include "tokenizer.h"

static int is_string(const struct json *j)
{
	return j && j->type == JSON_STRING;
}

/* One UTF-8 character s[0..n): its code point, or -1 */
static long one_char(const char *s, size_t n)
{
	uint32_t cp;
	if (!n || utf8_decode((const unsigned char *)s, n, &cp) != n)
		return -1;
	return (long)cp;
}

int hf_spm_style(const struct json *root)
{
	const struct json *p = json_get(root, "pre_tokenizer");
	return !p || p->type == JSON_NULL ||
	       !strcmp(hf_type_of(p), "Metaspace") ||
	       hf_is_true(json_get(root, "model"), "byte_fallback");
}

/* A Replace's pattern: {"String": s} or {"Regex": r} where r has no regex
 * metacharacter (then it matches itself). */
static int replace_pattern(const char *path, const struct json *r, const char *at,
			   const struct json **pat)
{
	const struct json *p = json_get(r, "pattern");
	*pat = json_get(p, "String");
	if (is_string(*pat))
		return 0;
	*pat = json_get(p, "Regex");
	if (is_string(*pat) && !strpbrk((*pat)->str, "\\^$.|?*+()[]{}"))
		return 0;
	return error("%s:%d: %s.pattern: a Replace pattern that is a regular expression is not "
		     "implemented (asyncpp implements a String pattern)", path, r->line, at);
}

static int put_str(const char *path, const struct json *j, const char *at, const char *what,
		   char *dst, uint32_t *len, int line)
{
	if (!is_string(j) || j->len > SPM_MAX_STR || (!j->len && strcmp(what, "content")))
		return error("%s:%d: %s.%s: wanted a string of 1 to %d bytes", path, line, at, what,
			     SPM_MAX_STR);
	memcpy(dst, j->str, j->len);
	*len = (uint32_t)j->len;
	return 0;
}

/* One normalizer step at JSON path at into p */
static int read_norm_step(const char *path, const struct json *n, const char *at,
			  struct spm_params *p)
{
	const char *type = hf_type_of(n);
	if (strcmp(type, "Prepend") && strcmp(type, "Replace") && strcmp(type, "NFC"))
		return error("%s:%d: %s: normalizer '%s' is not implemented (asyncpp implements "
			     "Prepend, Replace, NFC and a Sequence of them)", path, n->line, at,
			     type);
	if (p->nnorm == SPM_MAX_NORM)
		return error("%s:%d: %s: more than %d normalizers", path, n->line, at, SPM_MAX_NORM);
	struct spm_norm *m = &p->norm[p->nnorm++];
	if (!strcmp(type, "NFC")) {
		m->kind = NORM_NFC;
		return 0;
	}
	if (!strcmp(type, "Prepend")) {
		m->kind = NORM_PREPEND;
		return put_str(path, json_get(n, "prepend"), at, "prepend", m->a, &m->alen, n->line);
	}
	m->kind = NORM_REPLACE;
	const struct json *pat;
	if (replace_pattern(path, n, at, &pat) ||
	    put_str(path, pat, at, "pattern", m->a, &m->alen, n->line) ||
	    put_str(path, json_get(n, "content"), at, "content", m->b, &m->blen, n->line))
		return -1;
	uint32_t chars = 0;
	for (uint32_t i = 0; i < m->blen; i++)
		chars += ((unsigned char)m->b[i] & 0xC0) != 0x80;
	if (chars > m->alen)
		return error("%s:%d: %s.content: a Replace that makes more characters than the bytes "
			     "it replaces is not implemented", path, n->line, at);
	return 0;
}

/* A normalizer at JSON path at: one step, or a Sequence of them (nested
 * Sequences flattened, as Hugging Face runs them) */
static int read_norm(const char *path, const struct json *n, const char *at,
		     struct spm_params *p, int depth)
{
	if (strcmp(hf_type_of(n), "Sequence"))
		return read_norm_step(path, n, at, p);
	const struct json *list = json_get(n, "normalizers");
	if (!list || list->type != JSON_ARRAY)
		return error("%s:%d: %s.normalizers: not an array", path, n->line, at);
	if (depth == 4)
		return error("%s:%d: %s: Sequences nested more than 4 deep", path, n->line, at);
	for (size_t i = 0; i < list->len; i++) {
		char sub[160];
		snprintf(sub, sizeof(sub), "%.100s.normalizers[%zu]", at, i);
		if (read_norm(path, &list->kids[i], sub, p, depth + 1))
			return -1;
	}
	return 0;
}

static int read_normalizer(const char *path, const struct json *root, struct spm_params *p)
{
	const struct json *n = json_get(root, "normalizer");
	if (!n || n->type == JSON_NULL)
		return 0;
	return read_norm(path, n, "normalizer", p, 0);
}

/* Metaspace's prepend_scheme, or older files' add_prefix_space */
static int prepend_scheme(const char *path, const struct json *m, const char *at, uint32_t *out)
{
	const struct json *s = json_get(m, "prepend_scheme");
	if (!s || s->type == JSON_NULL) {
		const struct json *a = json_get(m, "add_prefix_space");
		*out = a && a->type == JSON_FALSE ? META_NEVER : META_ALWAYS;
		return 0;
	}
	static const char *const names[] = {"always", "first", "never"};
	for (uint32_t i = 0; i < 3; i++)
		if (is_string(s) && !strcmp(s->str, names[i]))
			return *out = i, 0;
	return error("%s:%d: %s.prepend_scheme: wanted always, first or never", path, m->line, at);
}

static int read_metaspace(const char *path, const struct json *m, const char *at,
			  struct spm_params *p)
{
	const struct json *r = json_get(m, "replacement"), *sp = json_get(m, "split");
	long cp = is_string(r) ? one_char(r->str, r->len) : -1;
	if (cp < 0 || cp == ' ')
		return error("%s:%d: %s.replacement: wanted one character other than ' '", path,
			     m->line, at);
	if (prepend_scheme(path, m, at, &p->prepend))
		return -1;
	p->meta_cp = (uint32_t)cp;
	p->split = !sp || sp->type != JSON_FALSE;
	return 0;
}

static int read_pretok(const char *path, const struct json *root, struct spm_params *p,
		       uint32_t *kind)
{
	const struct json *j = json_get(root, "pre_tokenizer");
	if (!j || j->type == JSON_NULL) {
		*kind = PRETOK_SPM;
		p->prepend = META_NEVER;
		return 0;
	}
	if (strcmp(hf_type_of(j), "Metaspace"))
		return error("%s:%d: pre_tokenizer: pre-tokenizer '%s' is not implemented with a "
			     "normalizer or byte_fallback (asyncpp implements none or Metaspace "
			     "there)", path, j->line, hf_type_of(j));
	*kind = PRETOK_METASPACE;
	return read_metaspace(path, j, "pre_tokenizer", p);
}

/* The decoder: what decodes to ' ' and whether one leading ' ' goes. */
static int read_decoder(const char *path, const struct json *root, struct spm_params *p,
			uint32_t kind)
{
	const struct json *d = json_get(root, "decoder");
	uint32_t cp = 0;
	if (d && !strcmp(hf_type_of(d), "Metaspace")) {
		struct spm_params q = *p;
		if (read_metaspace(path, d, "decoder", &q))
			return -1;
		cp = q.meta_cp;
		p->decode_strip = q.prepend != META_NEVER;
	} else if (d && !strcmp(hf_type_of(d), "Sequence")) {
		static const char *const want[] = {"Replace", "ByteFallback", "Fuse", "Strip"};
		const struct json *list = json_get(d, "decoders");
		if (!list || list->type != JSON_ARRAY || list->len < 3 || list->len > 4)
			return error("%s:%d: decoder.decoders: asyncpp implements Replace, "
				     "ByteFallback, Fuse and Strip", path, d->line);
		for (size_t i = 0; i < list->len; i++)
			if (strcmp(hf_type_of(&list->kids[i]), want[i]))
				return error("%s:%d: decoder.decoders[%zu]: decoder '%s' is not "
					     "implemented there (asyncpp implements Replace, "
					     "ByteFallback, Fuse, Strip in that order)", path,
					     list->kids[i].line, i, hf_type_of(&list->kids[i]));
		const struct json *r = &list->kids[0], *pat, *c = json_get(r, "content");
		if (replace_pattern(path, r, "decoder.decoders[0]", &pat))
			return -1;
		long x = one_char(pat->str, pat->len);
		if (x < 0 || !is_string(c) || strcmp(c->str, " "))
			return error("%s:%d: decoder.decoders[0]: asyncpp implements a Replace of "
				     "one character by ' '", path, r->line);
		cp = (uint32_t)x;
		if (list->len == 4) {
			const struct json *s = &list->kids[3], *st = json_get(s, "start"),
					  *sp = json_get(s, "stop"), *sc = json_get(s, "content");
			if (!is_string(sc) || strcmp(sc->str, " ") || !st || !st->is_int ||
			    st->i < 0 || st->i > 1 || !sp || !sp->is_int || sp->i)
				return error("%s:%d: decoder.decoders[3]: asyncpp implements a Strip "
					     "of at most one leading ' ' (start 0 or 1, stop 0)", path,
					     s->line);
			p->decode_strip = (uint32_t)st->i;
		}
	} else {
		return error("%s: decoder: decoder '%s' is not implemented with SentencePiece-style "
			     "BPE (asyncpp implements Metaspace or Sequence[Replace, ByteFallback, "
			     "Fuse, Strip])", path, d && d->type != JSON_NULL ? hf_type_of(d) : "null");
	}
	if (kind == PRETOK_METASPACE && cp != p->meta_cp)
		return error("%s:%d: decoder: its replacement U+%04X is not the pre-tokenizer's "
			     "U+%04X", path, d->line, cp, p->meta_cp);
	p->meta_cp = cp;
	return 0;
}

static int read_model(const char *path, const struct json *root, uint32_t *flags)
{
	const struct json *m = json_get(root, "model");
	if (!m || m->type != JSON_OBJECT)
		return error("%s: no 'model' object", path);
	if (strcmp(hf_type_of(m), "BPE"))
		return error("%s:%d: model: model type '%s' is not implemented (asyncpp implements "
			     "only BPE)", path, m->line, hf_type_of(m));
	if (!hf_unset(m, "dropout", 0))
		return error("%s:%d: model.dropout: BPE dropout is not implemented (wanted null)",
			     path, json_get(m, "dropout")->line);
	if (!hf_unset(m, "continuing_subword_prefix", 1) || !hf_unset(m, "end_of_word_suffix", 1))
		return error("%s:%d: model.continuing_subword_prefix / model.end_of_word_suffix: "
			     "not implemented", path, m->line);
	*flags = TOK_SPM;
	if (hf_is_true(m, "byte_fallback"))
		*flags |= TOK_BYTE_FALLBACK;
	if (hf_is_true(m, "fuse_unk"))
		*flags |= TOK_FUSE_UNK;
	if (hf_is_true(m, "ignore_merges"))
		*flags |= TOK_IGNORE_MERGES;
	return 0;
}

static long find_token(const struct hf_vocab *v, const char *s, size_t n)
{
	for (uint32_t id = 0; id < v->V; id++)
		if (v->len[id] == n && !memcmp(v->s[id], s, n))
			return id;
	return -1;
}

int hf_spm_read(struct tokenizer **tok, const char *path, const struct json *root,
		long eos_hint)
{
	struct spm_params p;
	struct hf_vocab v = {0};
	struct smap map = {0};
	struct buf bytes = {0}, cat = {0};
	uint32_t *lens = NULL, (*merges)[3] = NULL, *special = NULL, nspecial = 0, kind = 0, flags = 0;
	uint32_t sep = TOKENIZER_NO_ID;
	int rc = -1;
	*tok = NULL;
	memset(&p, 0, sizeof(p));
	p.unk = TOKENIZER_NO_ID;
	if (read_normalizer(path, root, &p) || read_pretok(path, root, &p, &kind) ||
	    read_decoder(path, root, &p, kind) || read_model(path, root, &flags) ||
	    hf_read_vocab(path, root, &v, p.nnorm > 0) || hf_read_post(path, root, 0, &v, &sep))
		goto out;
	const struct json *m = json_get(root, "model"), *unk = json_get(m, "unk_token");
	if (is_string(unk)) {
		long id = find_token(&v, unk->str, unk->len);
		if (id < 0) {
			error("%s:%d: model.unk_token: '%s' is not in the vocabulary", path, unk->line,
			      unk->str);
			goto out;
		}
		p.unk = (uint32_t)id;
	} else if (unk && unk->type != JSON_NULL) {
		error("%s:%d: model.unk_token: not a string", path, unk->line);
		goto out;
	}
	const struct json *ml = json_get(m, "merges");
	if (!ml || ml->type != JSON_ARRAY) {
		error("%s: model.merges is not an array", path);
		goto out;
	}
	hf_smap_init(&map, v.V, v.s, v.len);
	lens = xcalloc(v.V, sizeof(*lens));
	special = xcalloc(v.V, sizeof(*special));
	uint32_t eot = TOKENIZER_NO_ID;
	for (uint32_t id = 0; id < v.V; id++) {
		long dup = v.special[id] ? -1 : hf_smap_add(&map, id);
		if (dup >= 0) {
			error("%s: tokens %ld and %u are both '%s'", path, dup, id, v.s[id]);
			goto out;
		}
		if (!v.len[id]) {
			error("%s: token %u is empty", path, id);
			goto out;
		}
		if (v.special[id])
			special[nspecial++] = id;
		buf_append(&bytes, v.s[id], v.len[id]);
		lens[id] = (uint32_t)v.len[id];
	}
	/* the end of text: <|endoftext|>, the model's eos, else </s> */
	static const char *const eots[] = {TOKENIZER_EOT, "</s>"};
	for (int k = 0; k < 2 && eot == TOKENIZER_NO_ID; k++) {
		long id = find_token(&v, eots[k], strlen(eots[k]));
		if (id >= 0 && v.special[id])
			eot = (uint32_t)id;
		if (!k && eot == TOKENIZER_NO_ID && eos_hint >= 0 && (uint64_t)eos_hint < v.V &&
		    v.special[eos_hint])
			eot = (uint32_t)eos_hint;
	}
	merges = xmalloc(st_mult(ml->len + 1, sizeof(*merges)));
	for (size_t r = 0; r < ml->len; r++) {
		const char *a, *b;
		size_t na, nb;
		if (hf_merge_parts(&ml->kids[r], &a, &na, &b, &nb)) {
			error("%s:%d: model.merges[%zu] is not \"LEFT RIGHT\" or [\"LEFT\", \"RIGHT\"]",
			      path, ml->kids[r].line, r);
			goto out;
		}
		cat.len = 0;
		buf_append(&cat, a, na);
		buf_append(&cat, b, nb);
		long ia = hf_smap_find(&map, a, na), ib = hf_smap_find(&map, b, nb),
		     ic = hf_smap_find(&map, (const char *)cat.data, cat.len);
		if (ia < 0 || ib < 0 || ic < 0) {
			error("%s:%d: model.merges[%zu] ('%.*s' '%.*s') uses or makes a token not in "
			      "the vocabulary", path, ml->kids[r].line, r, (int)na, a, (int)nb, b);
			goto out;
		}
		merges[r][0] = (uint32_t)ia;
		merges[r][1] = (uint32_t)ib;
		merges[r][2] = (uint32_t)ic;
	}
	/* Hugging Face's encode finds the added tokens in the text first */
	if (nspecial)
		flags |= TOK_SPLIT_ADDED;
	if (sep != TOKENIZER_NO_ID) { /* the template's token starts each document */
		eot = sep;
		flags |= TOK_DOC_TEMPLATE;
	}
	rc = tokenizer_build_spm(tok, v.V, lens, bytes.data, (uint32_t)ml->len,
				 (const uint32_t(*)[3])merges, nspecial, special, eot, flags, kind, &p);
	if (rc)
		error("%s: not a consistent SentencePiece-style BPE tokenizer", path);
out:
	free(v.s);
	free(v.len);
	free(v.special);
	free(map.slot);
	buf_free(&bytes);
	buf_free(&cat);
	free(lens);
	free(merges);
	free(special);
	return rc;
}

/* ---- writing ---- */

static void put_s(struct buf *b, const char *s)
{
	buf_append(b, s, strlen(s));
}

static void put_n(struct buf *b, const char *fmt, uint32_t v)
{
	char num[128];
	snprintf(num, sizeof(num), fmt, v);
	put_s(b, num);
}

static int write_in(const char *dir, const char *name, const struct buf *b)
{
	size_t n = strlen(dir) + strlen(name) + 2;
	char *path = xmalloc(n);
	snprintf(path, n, "%s/%s", dir, name);
	int rc = atomic_write_file(path, b->data, b->len);
	free(path);
	return rc;
}

static void put_meta(struct buf *j, const struct spm_params *p)
{
	unsigned char m[4];
	size_t l = 0;
	uint32_t cp = p->meta_cp;
	if (cp < 0x80)
		m[l++] = (unsigned char)cp;
	else if (cp < 0x800)
		m[l++] = (unsigned char)(0xC0 | cp >> 6), m[l++] = (unsigned char)(0x80 | (cp & 63));
	else if (cp < 0x10000)
		m[l++] = (unsigned char)(0xE0 | cp >> 12),
		m[l++] = (unsigned char)(0x80 | (cp >> 6 & 63)),
		m[l++] = (unsigned char)(0x80 | (cp & 63));
	else
		m[l++] = (unsigned char)(0xF0 | cp >> 18),
		m[l++] = (unsigned char)(0x80 | (cp >> 12 & 63)),
		m[l++] = (unsigned char)(0x80 | (cp >> 6 & 63)),
		m[l++] = (unsigned char)(0x80 | (cp & 63));
	json_put_string(j, (const char *)m, l);
}

/* normalizer, pre_tokenizer, post_processor and decoder, as hf_spm_read
 * reads them back */
static void put_pipeline(struct buf *j, const struct tokenizer *tok, const struct spm_params *p,
			 uint32_t kind)
{
	static const char *const scheme[] = {"always", "first", "never"};
	put_s(j, "  \"normalizer\": ");
	if (!p->nnorm)
		put_s(j, "null");
	else
		put_s(j, "{\"type\": \"Sequence\", \"normalizers\": [");
	for (uint32_t i = 0; i < p->nnorm; i++) {
		const struct spm_norm *m = &p->norm[i];
		put_s(j, i ? ", " : "");
		if (m->kind == NORM_NFC) {
			put_s(j, "{\"type\": \"NFC\"");
		} else if (m->kind == NORM_PREPEND) {
			put_s(j, "{\"type\": \"Prepend\", \"prepend\": ");
			json_put_string(j, m->a, m->alen);
		} else {
			put_s(j, "{\"type\": \"Replace\", \"pattern\": {\"String\": ");
			json_put_string(j, m->a, m->alen);
			put_s(j, "}, \"content\": ");
			json_put_string(j, m->b, m->blen);
		}
		put_s(j, "}");
	}
	put_s(j, p->nnorm ? "]},\n  \"pre_tokenizer\": " : ",\n  \"pre_tokenizer\": ");
	if (kind == PRETOK_METASPACE) {
		put_s(j, "{\"type\": \"Metaspace\", \"replacement\": ");
		put_meta(j, p);
		put_s(j, ", \"prepend_scheme\": \"");
		put_s(j, scheme[p->prepend]);
		put_s(j, p->split ? "\", \"split\": true}" : "\", \"split\": false}");
	} else {
		put_s(j, "null");
	}
	put_s(j, ",\n  \"post_processor\": ");
	if (tokenizer_flags(tok) & TOK_DOC_TEMPLATE)
		hf_put_template(j, tok);
	else
		put_s(j, "null");
	put_s(j, ",\n  \"decoder\": {\"type\": \"Sequence\", "
		 "\"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": ");
	put_meta(j, p);
	put_s(j, "}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, "
		 "{\"type\": \"Strip\", \"content\": \" \", \"start\": ");
	put_n(j, "%u, \"stop\": 0}]},\n", p->decode_strip);
}

int hf_spm_write(const struct tokenizer *tok, const char *dir, int max_length)
{
	const struct spm_params *p = tokenizer_spm(tok);
	uint32_t V = tokenizer_vocab_size(tok), M = tokenizer_nmerges(tok), fl = tokenizer_flags(tok);
	uint32_t eot = tokenizer_eot_id(tok);
	struct buf j = {0}, tc = {0};
	int rc = -1;
	for (uint32_t id = 0; id < V; id++) { /* the file's tokens are UTF-8 (checked on load) */
		size_t n;
		const unsigned char *t = tokenizer_token(tok, id, &n);
		if (!json_utf8_valid(t, n)) {
			error("%s: token %u is not UTF-8; tokenizer.json cannot hold it", dir, id);
			goto out;
		}
	}
	put_s(&j, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n"
		  "  \"added_tokens\": [");
	int first = 1;
	for (uint32_t id = 0; id < V; id++) {
		size_t n;
		const char *t = (const char *)tokenizer_token(tok, id, &n);
		if (!tokenizer_is_special(tok, id))
			continue;
		put_n(&j, first ? "\n    {\"id\": %u, \"content\": " : ",\n    {\"id\": %u, "
		      "\"content\": ", id);
		json_put_string(&j, t, n);
		put_s(&j, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
			  "\"normalized\": false, \"special\": true}");
		first = 0;
	}
	put_s(&j, "\n  ],\n");
	put_pipeline(&j, tok, p, tokenizer_pretok(tok));
	put_s(&j, "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n"
		  "    \"unk_token\": ");
	if (p->unk == TOKENIZER_NO_ID) {
		put_s(&j, "null");
	} else {
		size_t n;
		const char *t = (const char *)tokenizer_token(tok, p->unk, &n);
		json_put_string(&j, t, n);
	}
	put_s(&j, ",\n    \"continuing_subword_prefix\": null,\n    \"end_of_word_suffix\": null,\n");
	put_s(&j, fl & TOK_FUSE_UNK ? "    \"fuse_unk\": true,\n" : "    \"fuse_unk\": false,\n");
	put_s(&j, fl & TOK_BYTE_FALLBACK ? "    \"byte_fallback\": true,\n" :
		  "    \"byte_fallback\": false,\n");
	put_s(&j, fl & TOK_IGNORE_MERGES ? "    \"ignore_merges\": true,\n" :
		  "    \"ignore_merges\": false,\n");
	put_s(&j, "    \"vocab\": {");
	for (uint32_t id = 0; id < V; id++) {
		size_t n;
		const char *t = (const char *)tokenizer_token(tok, id, &n);
		put_s(&j, id ? ",\n      " : "\n      ");
		json_put_string(&j, t, n);
		put_n(&j, ": %u", id);
	}
	put_s(&j, "\n    },\n    \"merges\": [");
	for (uint32_t r = 0; r < M; r++) { /* the pairs form: a token may hold ' ' */
		uint32_t mg[3];
		size_t na, nb;
		tokenizer_merge(tok, r, mg);
		const char *a = (const char *)tokenizer_token(tok, mg[0], &na);
		const char *b = (const char *)tokenizer_token(tok, mg[1], &nb);
		put_s(&j, r ? ",\n      [" : "\n      [");
		json_put_string(&j, a, na);
		put_s(&j, ", ");
		json_put_string(&j, b, nb);
		put_s(&j, "]");
	}
	put_s(&j, "\n    ]\n  }\n}\n");
	put_s(&tc, "{\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\",\n");
	/* a template's token starts a document: the bos */
	const char *const keys[] = {tokenizer_flags(tok) & TOK_DOC_TEMPLATE ? "bos_token"
									 : "eos_token", "unk_token"};
	uint32_t ids[] = {eot, p->unk};
	for (int k = 0; k < 2; k++) {
		if (ids[k] == TOKENIZER_NO_ID)
			continue;
		size_t n;
		const char *t = (const char *)tokenizer_token(tok, ids[k], &n);
		put_s(&tc, "  \"");
		put_s(&tc, keys[k]);
		put_s(&tc, "\": ");
		json_put_string(&tc, t, n);
		put_s(&tc, ",\n");
	}
	put_n(&tc, "  \"model_max_length\": %u,\n  \"clean_up_tokenization_spaces\": false\n}\n",
	      (uint32_t)max_length);
	rc = write_in(dir, "tokenizer.json", &j);
	if (!rc)
		rc = write_in(dir, "tokenizer_config.json", &tc);
out:
	buf_free(&j);
	buf_free(&tc);
	return rc;
}
