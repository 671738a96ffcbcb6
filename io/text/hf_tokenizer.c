/* hf_tokenizer.c - Hugging Face tokenizer.json <-> our tokenizer (see
 * tokenizer.h). Only what our encoder does exactly is accepted: byte-level
 * BPE (with ignore_merges or not, NFC or no normalizer) after GPT-2's,
 * Llama 3's, Qwen's or SmolLM's pre-tokenizer, or a Split with any other
 * regex (PCRE2), each recognised part by part; anything else is refused
 * naming its JSON path. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_parts.h"
#include "json.h"
#include "pretok.h"
#include "regex_split.h"
#include "tokenizer.h"

/* ---- a map from token strings to ids (struct smap: hf_parts.h) ---- */

static void smap_init(struct smap *m, uint32_t n, const char **s, size_t *len)
{
	m->s = s;
	m->len = len;
	m->mask = 1;
	while (m->mask < 2 * (size_t)n + 1)
		m->mask = m->mask * 2 + 1;
	m->slot = xcalloc(m->mask + 1, sizeof(*m->slot));
}

static long smap_find(const struct smap *m, const char *s, size_t n)
{
	for (size_t i = fnv1a64(FNV1A64_INIT, s, n) & m->mask; m->slot[i]; i = (i + 1) & m->mask) {
		uint32_t id = m->slot[i] - 1;
		if (m->len[id] == n && !memcmp(m->s[id], s, n))
			return id;
	}
	return -1;
}

/* add id (its string already in s/len); returns the id already there, or -1 */
static long smap_add(struct smap *m, uint32_t id)
{
	long old = smap_find(m, m->s[id], m->len[id]);
	if (old >= 0)
		return old;
	size_t i = fnv1a64(FNV1A64_INIT, m->s[id], m->len[id]) & m->mask;
	while (m->slot[i])
		i = (i + 1) & m->mask;
	m->slot[i] = id + 1;
	return -1;
}

/* ---- reading ---- */

static const char *type_of(const struct json *j)
{
	const struct json *t = json_get(j, "type");
	return t && t->type == JSON_STRING ? t->str : "?";
}

static int is_true(const struct json *obj, const char *key)
{
	const struct json *j = json_get(obj, key);
	return j && j->type == JSON_TRUE;
}

/* null or absent, or (when empty_ok) "" */
static int unset(const struct json *obj, const char *key, int empty_ok)
{
	const struct json *j = json_get(obj, key);
	return !j || j->type == JSON_NULL || (empty_ok && j->type == JSON_STRING && !j->len);
}

/* Llama 3's Split regex, which is cl100k_base's (pretok.h) */
static const char cl100k_regex[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}"
	"\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Qwen 2's and 3's: cl100k's with single digits (PRETOK_QWEN) */
static const char qwen_regex[] =
	"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}"
	"\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* The kind whose Split regex is re[0..n), or -1. */
static int split_kind(const char *re, size_t n)
{
	if (n == sizeof(cl100k_regex) - 1 && !memcmp(re, cl100k_regex, n))
		return PRETOK_CL100K;
	if (n == sizeof(qwen_regex) - 1 && !memcmp(re, qwen_regex, n))
		return PRETOK_QWEN;
	return -1;
}

/* A ByteLevel pre-tokenizer at JSON path at: no prefix space, and GPT-2's
 * regex when regex (Hugging Face's default) or none after a Split. */
static int check_bytelevel(const char *path, const struct json *p, const char *at, int regex)
{
	if (is_true(p, "add_prefix_space"))
		return error("%s:%d: %s.add_prefix_space: ByteLevel with add_prefix_space true is "
			     "not implemented (asyncpp adds no space)", path, p->line, at);
	const struct json *re = json_get(p, "use_regex");
	int has = !re || re->type == JSON_TRUE;
	if (has && !regex)
		return error("%s:%d: %s.use_regex: ByteLevel after a Split must not split again "
			     "(use_regex false, as Llama 3's)", path, p->line, at);
	if (!has && regex)
		return error("%s:%d: %s.use_regex: ByteLevel with use_regex false is implemented "
			     "only after Llama 3's or Qwen's Split", path, p->line, at);
	return 0;
}

/* The Splits that no scanner implements (PRETOK_SPLIT_REGEX): one, or a
 * chain of them; regexes JSON-owned. */
struct split_spec {
	struct split_step st[SPLIT_MAX_STEPS];
	size_t k;
};

/* The Split at JSON path at: Llama 3's or Qwen's regex, Isolated and not
 * inverted, is their scanner's kind; any other regex, behavior or invert
 * goes through PCRE2 (PRETOK_SPLIT_REGEX, *sp; compiled here so that a
 * refusal names the path). The kind in *kind. */
static int check_split(const char *path, const struct json *p, const char *at, uint32_t *kind,
		       struct split_spec *sp, int chain)
{
	const struct json *pat = json_get(p, "pattern"), *re = json_get(pat, "Regex"),
			  *beh = json_get(p, "behavior"), *inv = json_get(p, "invert");
	if (!re || re->type != JSON_STRING)
		return error("%s:%d: %s.pattern: a Split pattern that is not a Regex is not "
			     "implemented", path, p->line, at);
	int b = beh && beh->type == JSON_STRING ? split_behavior_parse(beh->str) : -1;
	if (b < 0)
		return error("%s:%d: %s.behavior: Split behavior '%s' is not one of Removed, "
			     "Isolated, MergedWithPrevious, MergedWithNext, Contiguous", path,
			     p->line, at, beh && beh->type == JSON_STRING ? beh->str : "?");
	if (inv && inv->type != JSON_TRUE && inv->type != JSON_FALSE)
		return error("%s:%d: %s.invert: not true or false", path, p->line, at);
	int k = chain ? -1 : split_kind(re->str, re->len);
	if (k >= 0 && b == SPLIT_ISOLATED && !is_true(p, "invert")) {
		*kind = (uint32_t)k;
		return 0;
	}
	char where[512];
	snprintf(where, sizeof(where), "%s:%d: %s.pattern.Regex", path, re->line, at);
	struct regex_split *rx;
	if (regex_split_new(&rx, re->str, re->len, (uint32_t)b, is_true(p, "invert"), where))
		return -1;
	regex_split_free(rx);
	*kind = PRETOK_SPLIT_REGEX;
	sp->st[sp->k++] = (struct split_step){re->str, re->len, (uint32_t)b, is_true(p, "invert")};
	return 0;
}

/* A chain of Splits before ByteLevel (DeepSeek-V3's): list->kids[0..
 * len-1) all Splits, each through PCRE2 (a recognised regex too: PCRE2
 * reads those as their scanners split, tokenizer_split_regex.sh). */
static int check_split_chain(const char *path, const struct json *list, uint32_t *kind,
			     struct split_spec *sp)
{
	if (list->len - 1 > SPLIT_MAX_STEPS)
		return error("%s:%d: pre_tokenizer.pretokenizers: a chain of %zu Splits is not "
			     "implemented (asyncpp takes up to %d)", path, list->line,
			     list->len - 1, SPLIT_MAX_STEPS);
	for (size_t i = 0; i + 1 < list->len; i++) {
		char at[64];
		snprintf(at, sizeof(at), "pre_tokenizer.pretokenizers[%zu]", i);
		if (strcmp(type_of(&list->kids[i]), "Split"))
			return error("%s:%d: %s: pre-tokenizer '%s' is not implemented in a Sequence "
				     "of more than two (asyncpp implements Splits, then ByteLevel)",
				     path, list->kids[i].line, at, type_of(&list->kids[i]));
		if (check_split(path, &list->kids[i], at, kind, sp, 1))
			return -1;
	}
	return 0;
}

/* The pre-tokenizer: a lone ByteLevel (GPT-2's, also in a Sequence of one),
 * Sequence[Split(cl100k's regex), ByteLevel] (Llama 3's),
 * Sequence[Digits(individual), ByteLevel] (SmolLM's) or Sequence[Split,
 * Split, ..., ByteLevel] (DeepSeek-V3's). Its kind in *kind. */
static int check_pretok(const char *path, const struct json *root, uint32_t *kind,
			struct split_spec *sp)
{
	const struct json *j = json_get(root, "pre_tokenizer");
	if (!j || j->type == JSON_NULL)
		return error("%s: no pre_tokenizer: asyncpp implements ByteLevel, alone or after "
			     "Llama 3's Split or individual Digits", path);
	*kind = PRETOK_GPT2;
	if (!strcmp(type_of(j), "ByteLevel"))
		return check_bytelevel(path, j, "pre_tokenizer", 1);
	if (strcmp(type_of(j), "Sequence"))
		return error("%s:%d: pre_tokenizer: pre-tokenizer '%s' is not implemented (asyncpp "
			     "implements ByteLevel, alone or in a Sequence)", path, j->line,
			     type_of(j));
	const struct json *list = json_get(j, "pretokenizers");
	if (!list || list->type != JSON_ARRAY || !list->len ||
	    (list->len > 2 && strcmp(type_of(&list->kids[0]), "Split")))
		return error("%s:%d: pre_tokenizer.pretokenizers: a Sequence of %zu pre-tokenizers "
			     "is not implemented (asyncpp implements ByteLevel, alone or after "
			     "Llama 3's Split, individual Digits or a chain of Splits)", path, j->line,
			     list && list->type == JSON_ARRAY ? list->len : 0);
	const struct json *first = &list->kids[0], *last = &list->kids[list->len - 1];
	const char *at0 = "pre_tokenizer.pretokenizers[0]", *at1 = "pre_tokenizer.pretokenizers[1]";
	char at_n[64];
	snprintf(at_n, sizeof(at_n), "pre_tokenizer.pretokenizers[%zu]", list->len - 1);
	const char *at_last = list->len == 2 ? at1 : list->len == 1 ? at0 : at_n;
	if (list->len > 2) {
		if (check_split_chain(path, list, kind, sp))
			return -1;
	} else if (list->len == 2 && !strcmp(type_of(first), "Split")) {
		if (check_split(path, first, at0, kind, sp, 0))
			return -1;
	} else if (list->len == 2 && !strcmp(type_of(first), "Digits")) {
		if (!is_true(first, "individual_digits"))
			return error("%s:%d: %s.individual_digits: Digits with individual_digits "
				     "false is not implemented", path, first->line, at0);
		*kind = PRETOK_GPT2_DIGITS;
	} else if (list->len == 2) {
		return error("%s:%d: %s: pre-tokenizer '%s' is not implemented (before ByteLevel "
			     "asyncpp implements Llama 3's Split and individual Digits)", path,
			     first->line, at0, type_of(first));
	}
	if (strcmp(type_of(last), "ByteLevel"))
		return error("%s:%d: %s: pre-tokenizer '%s' is not implemented (asyncpp implements "
			     "only ByteLevel there)", path, last->line, at_last, type_of(last));
	return check_bytelevel(path, last, at_last,
			       *kind == PRETOK_GPT2 || *kind == PRETOK_GPT2_DIGITS);
}

/* The normalizer: none, or NFC (Qwen's): *nfc. (A normalizer chain, for
 * Llama 2's and Mistral's, is another reader's.) */
static int check_normalizer(const char *path, const struct json *root, int *nfc)
{
	const struct json *j = json_get(root, "normalizer");
	*nfc = j && j->type != JSON_NULL && !strcmp(type_of(j), "NFC");
	if (j && j->type != JSON_NULL && !*nfc)
		return error("%s:%d: normalizer: normalizer '%s' is not implemented (asyncpp "
			     "implements none and NFC)", path, j->line, type_of(j));
	return 0;
}

static int check_pipeline(const char *path, const struct json *root, uint32_t *kind,
			  struct split_spec *sp)
{
	const struct json *j;
	if (check_pretok(path, root, kind, sp))
		return -1;
	j = json_get(root, "decoder");
	if (!j || j->type == JSON_NULL || strcmp(type_of(j), "ByteLevel"))
		return error("%s: decoder '%s' is not implemented (asyncpp implements only ByteLevel)",
			     path, j && j->type != JSON_NULL ? type_of(j) : "null");
	const struct json *m = json_get(root, "model");
	if (!m || m->type != JSON_OBJECT)
		return error("%s: no 'model' object", path);
	if (strcmp(type_of(m), "BPE"))
		return error("%s:%d: model type '%s' is not implemented (asyncpp implements only "
			     "BPE)", path, m->line, type_of(m));
	if (!unset(m, "dropout", 0))
		return error("%s: BPE dropout is not implemented", path);
	if (!unset(m, "continuing_subword_prefix", 1) || !unset(m, "end_of_word_suffix", 1))
		return error("%s: BPE continuing_subword_prefix / end_of_word_suffix are not "
			     "implemented", path);
	if (is_true(m, "byte_fallback"))
		return error("%s: BPE byte_fallback is not implemented", path);
	return 0;
}

struct vocab {
	uint32_t V;
	const char **s;       /* by id: the UTF-8 string (JSON-owned) */
	size_t *len;
	unsigned char *special;
};

/* An added token's options at added_tokens[i]: Hugging Face's lstrip,
 * rstrip and single_word change where it is found, and are refused when
 * true; normalized (matching in normalized text) is refused with a
 * normalizer, and means nothing without one. */
static int check_added(const char *path, const struct json *a, size_t i, int nfc)
{
	static const char *const refused[] = {"lstrip", "rstrip", "single_word"};
	for (int k = 0; k < 3; k++)
		if (is_true(a, refused[k]))
			return error("%s:%d: added_tokens[%zu].%s: an added token with %s true is not "
				     "implemented", path, a->line, i, refused[k], refused[k]);
	const struct json *norm = json_get(a, "normalized");
	/* Hugging Face's default: normalized unless special */
	int normalized = norm ? norm->type == JSON_TRUE : !is_true(a, "special");
	if (nfc && normalized)
		return error("%s:%d: added_tokens[%zu].normalized: an added token found in "
			     "normalized text is not implemented (asyncpp finds added tokens in the "
			     "raw text, as with normalized false)", path, a->line, i);
	return 0;
}

/* Whether an occurrence of a[0..na) and one of b[0..nb) can overlap in a
 * text: one holds the other, or an end of one is a start of the other. */
static int contains(const char *a, size_t na, const char *b, size_t nb)
{
	for (size_t i = 0; i + nb <= na; i++)
		if (!memcmp(a + i, b, nb))
			return 1;
	return 0;
}

static int may_overlap(const char *a, size_t na, const char *b, size_t nb)
{
	if (contains(a, na, b, nb) || contains(b, nb, a, na))
		return 1;
	for (size_t k = 1; k < na && k < nb; k++)
		if (!memcmp(a + na - k, b, k) || !memcmp(b + nb - k, a, k))
			return 1;
	return 0;
}

/* Hugging Face finds the added tokens with normalized false in the raw text
 * first, then those with normalized true in what is left; asyncpp finds all
 * in one leftmost-longest pass, which is the same unless a token of one
 * group can overlap one of the other (refused, naming both). Without a
 * normalizer, that is; with one, check_added refuses normalized true. */
static int raw_first(const struct json *t)
{
	const struct json *n = json_get(t, "normalized");
	return n ? n->type != JSON_TRUE : is_true(t, "special");
}

static int check_added_groups(const char *path, const struct json *added, size_t nadded)
{
	/* only pairs across the groups can differ: count them first, so that a
	 * file with thousands of each is refused instead of compared for
	 * minutes (real files hold one group, or a few dozen tokens) */
	size_t nraw = 0;
	for (size_t i = 0; i < nadded; i++)
		nraw += raw_first(&added->kids[i]) != 0;
	if (nraw * (nadded - nraw) > 1000000)
		return error("%s: added_tokens holds %zu tokens with normalized false and %zu with "
			     "normalized true, too many pairs to check for overlaps; not "
			     "implemented", path, nraw, nadded - nraw);
	for (size_t i = 0; i < nadded; i++)
		for (size_t j = i + 1; j < nadded; j++) {
			const struct json *a = &added->kids[i], *b = &added->kids[j];
			if (raw_first(a) == raw_first(b))
				continue;
			const struct json *ca = json_get(a, "content"), *cb = json_get(b, "content");
			if (may_overlap(ca->str, ca->len, cb->str, cb->len))
				return error("%s:%d: added_tokens[%zu] and added_tokens[%zu]: '%s' and "
					     "'%s' can overlap, and Hugging Face finds the one with "
					     "normalized false first; not implemented", path, b->line, i, j,
					     ca->str, cb->str);
		}
	return 0;
}

static int read_vocab(const char *path, const struct json *root, struct vocab *v, int nfc)
{
	const struct json *vocab = json_get(json_get(root, "model"), "vocab");
	const struct json *added = json_get(root, "added_tokens");
	if (!vocab || vocab->type != JSON_OBJECT)
		return error("%s: model.vocab is not an object", path);
	if (added && added->type != JSON_ARRAY && added->type != JSON_NULL)
		return error("%s: added_tokens is not an array", path);
	size_t nadded = added && added->type == JSON_ARRAY ? added->len : 0;
	int64_t max = -1;
	for (size_t i = 0; i < vocab->len; i++) {
		const struct json *k = &vocab->kids[i];
		if (k->type != JSON_NUMBER || !k->is_int || k->i < 0 || k->i >= TOKENIZER_MAX_VOCAB)
			return error("%s:%d: token '%s' has no valid id", path, k->line, k->key);
		max = MAX(max, k->i);
	}
	for (size_t i = 0; i < nadded; i++) {
		const struct json *a = &added->kids[i], *id = json_get(a, "id"),
				  *c = json_get(a, "content");
		if (!id || id->type != JSON_NUMBER || !id->is_int || id->i < 0 ||
		    id->i >= TOKENIZER_MAX_VOCAB || !c || c->type != JSON_STRING || !c->len)
			return error("%s:%d: added token needs an id and a non-empty content", path,
				     a->line);
		max = MAX(max, id->i);
	}
	v->V = (uint32_t)(max + 1);
	v->s = xcalloc(v->V + 1, sizeof(*v->s));
	v->len = xcalloc(v->V + 1, sizeof(*v->len));
	v->special = xcalloc(v->V + 1, 1);
	for (size_t i = 0; i < vocab->len; i++) {
		const struct json *k = &vocab->kids[i];
		if (v->s[k->i])
			return error("%s:%d: id %lld is given to '%s' and '%s'", path, k->line,
				     (long long)k->i, v->s[k->i], k->key);
		v->s[k->i] = k->key;
		v->len[k->i] = k->key_len;
	}
	for (size_t i = 0; i < nadded; i++) {
		const struct json *a = &added->kids[i], *c = json_get(a, "content");
		int64_t id = json_get(a, "id")->i;
		/* a token that is not special is found in text all the same (asyncpp
		 * holds both as special tokens) */
		if (check_added(path, a, i, nfc))
			return -1;
		if (v->special[id])
			return error("%s:%d: id %lld is added twice", path, a->line, (long long)id);
		if (v->s[id] && (v->len[id] != c->len || memcmp(v->s[id], c->str, c->len)))
			return error("%s:%d: added token '%s' has id %lld, which the vocabulary gives "
				     "to '%s'", path, a->line, c->str, (long long)id, v->s[id]);
		v->s[id] = c->str;
		v->len[id] = c->len;
		v->special[id] = 1;
	}
	for (uint32_t id = 0; id < v->V; id++)
		if (!v->s[id])
			return error("%s: no token has id %u (ids must run from 0 without gaps)", path,
				     id);
	return check_added_groups(path, added, nadded);
}

/* A merge entry: "a b" or ["a", "b"]. */
static int merge_parts(const struct json *e, const char **a, size_t *na, const char **b,
		       size_t *nb)
{
	if (e->type == JSON_STRING) {
		const char *sp = memchr(e->str, ' ', e->len);
		if (!sp || memchr(sp + 1, ' ', e->len - (size_t)(sp + 1 - e->str)))
			return -1;
		*a = e->str;
		*na = (size_t)(sp - e->str);
		*b = sp + 1;
		*nb = e->len - *na - 1;
		return 0;
	}
	if (e->type != JSON_ARRAY || e->len != 2 || e->kids[0].type != JSON_STRING ||
	    e->kids[1].type != JSON_STRING)
		return -1;
	*a = e->kids[0].str;
	*na = e->kids[0].len;
	*b = e->kids[1].str;
	*nb = e->kids[1].len;
	return 0;
}

/* A TemplateProcessing at JSON path at whose single template is
 * [SpecialToken X, Sequence A]: *sep = X's id (a special token, as
 * special_tokens.X.ids says). The pair template only applies to pairs of
 * texts, which asyncpp never encodes. */
static int read_template(const char *path, const struct json *t, const char *at,
			 const struct vocab *v, uint32_t *sep)
{
	const struct json *sg = json_get(t, "single"), *x = NULL, *a = NULL;
	if (sg && sg->type == JSON_ARRAY && sg->len == 2) {
		x = json_get(json_get(&sg->kids[0], "SpecialToken"), "id");
		a = json_get(json_get(&sg->kids[1], "Sequence"), "id");
	}
	if (!x || x->type != JSON_STRING || !a || a->type != JSON_STRING || strcmp(a->str, "A"))
		return error("%s:%d: %s.single: a template other than [SpecialToken, Sequence A] is "
			     "not implemented (tokenize encode puts one special token before each "
			     "document)", path, t->line, at);
	uint32_t id = 0;
	while (id < v->V && !(v->special[id] && v->len[id] == x->len && v->s[id] &&
			      !memcmp(v->s[id], x->str, x->len)))
		id++;
	if (id == v->V)
		return error("%s:%d: %s.single[0]: '%s' is not an added token", path, t->line, at,
			     x->str);
	const struct json *ids = json_get(json_get(json_get(t, "special_tokens"), x->str), "ids");
	if (!ids || ids->type != JSON_ARRAY || ids->len != 1 || ids->kids[0].type != JSON_NUMBER ||
	    !ids->kids[0].is_int || ids->kids[0].i != id)
		return error("%s:%d: %s.special_tokens: '%s' must give the one id %u", path, t->line,
			     at, x->str, id);
	*sep = id;
	return 0;
}

/* post_processor: null, ByteLevel (bytelevel: its offsets only), a
 * TemplateProcessing (read_template), or a Sequence of those with at most
 * one template. *sep: the template's token, else TOKENIZER_NO_ID. */
static int read_post(const char *path, const struct json *root, int bytelevel,
		     const struct vocab *v, uint32_t *sep)
{
	const struct json *j = json_get(root, "post_processor");
	*sep = TOKENIZER_NO_ID;
	if (!j || j->type == JSON_NULL)
		return 0;
	int seq = !strcmp(type_of(j), "Sequence");
	const struct json *list = seq ? json_get(j, "processors") : NULL;
	if (seq && (!list || list->type != JSON_ARRAY))
		return error("%s:%d: post_processor.processors: not an array", path, j->line);
	size_t n = seq ? list->len : 1;
	for (size_t i = 0; i < n; i++) {
		const struct json *p = seq ? &list->kids[i] : j;
		char at[64];
		if (seq)
			snprintf(at, sizeof(at), "post_processor.processors[%zu]", i);
		else
			snprintf(at, sizeof(at), "post_processor");
		if (bytelevel && !strcmp(type_of(p), "ByteLevel"))
			continue;
		if (strcmp(type_of(p), "TemplateProcessing") || *sep != TOKENIZER_NO_ID)
			return error("%s:%d: %s: post-processor '%s' is not implemented (asyncpp "
				     "implements %sa TemplateProcessing that puts one special token "
				     "first)", path, p->line, at, type_of(p),
				     bytelevel ? "ByteLevel and " : "");
		if (read_template(path, p, at, v, sep))
			return -1;
	}
	return 0;
}

void hf_put_template(struct buf *j, const struct tokenizer *tok)
{
	size_t n;
	uint32_t id = tokenizer_eot_id(tok);
	const char *x = (const char *)tokenizer_token(tok, id, &n);
	char num[32];
	const char *mid = "{\"type\": \"TemplateProcessing\", "
			  "\"single\": [{\"SpecialToken\": {\"id\": ";
	buf_append(j, mid, strlen(mid));
	json_put_string(j, x, n);
	mid = ", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], "
	      "\"pair\": [{\"SpecialToken\": {\"id\": ";
	buf_append(j, mid, strlen(mid));
	json_put_string(j, x, n);
	mid = ", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, "
	      "{\"SpecialToken\": {\"id\": ";
	buf_append(j, mid, strlen(mid));
	json_put_string(j, x, n);
	mid = ", \"type_id\": 1}}, {\"Sequence\": {\"id\": \"B\", \"type_id\": 1}}], "
	      "\"special_tokens\": {";
	buf_append(j, mid, strlen(mid));
	json_put_string(j, x, n);
	mid = ": {\"id\": ";
	buf_append(j, mid, strlen(mid));
	json_put_string(j, x, n);
	snprintf(num, sizeof(num), ", \"ids\": [%u], \"tokens\": [", id);
	buf_append(j, num, strlen(num));
	json_put_string(j, x, n);
	buf_append(j, "]}}}", 4);
}

int hf_read_post(const char *path, const struct json *root, int bytelevel,
		 const struct hf_vocab *hv, uint32_t *sep)
{
	struct vocab v = {hv->V, hv->s, hv->len, hv->special};
	return read_post(path, root, bytelevel, &v, sep);
}

int hf_tokenizer_read(struct tokenizer **tok, const char *path, long eos_hint)
{
	struct json *root;
	struct vocab v = {0};
	struct smap map = {0};
	struct buf bytes = {0}, cat = {0};
	uint32_t *lens = NULL, (*merges)[3] = NULL, *special = NULL, nspecial = 0;
	unsigned char *made = NULL;
	int rc = -1;
	*tok = NULL;
	if (json_parse_file(&root, path))
		return -1;
	if (root->type != JSON_OBJECT) {
		error("%s: not a JSON object", path);
		goto out;
	}
	if (hf_spm_style(root)) { /* Llama 2's, Mistral's: hf_spm.c */
		rc = hf_spm_read(tok, path, root, eos_hint);
		goto out;
	}
	uint32_t kind = PRETOK_GPT2, dup_id = 0, ignore_merges = 0;
	int dup_line = 0, nfc = 0;
	size_t dup_rank = 0;
	struct split_spec sp = {0};
	uint32_t sep = TOKENIZER_NO_ID;
	if (check_normalizer(path, root, &nfc) || check_pipeline(path, root, &kind, &sp) ||
	    read_vocab(path, root, &v, nfc) || read_post(path, root, 1, &v, &sep))
		goto out;
	ignore_merges = (uint32_t)is_true(json_get(root, "model"), "ignore_merges");
	const struct json *ml = json_get(json_get(root, "model"), "merges");
	if (!ml || ml->type != JSON_ARRAY) {
		error("%s: model.merges is not an array", path);
		goto out;
	}
	smap_init(&map, v.V, v.s, v.len);
	lens = xcalloc(v.V, sizeof(*lens));
	special = xcalloc(v.V, sizeof(*special));
	made = xcalloc(v.V, 1);
	uint32_t eot = TOKENIZER_NO_ID;
	for (uint32_t id = 0; id < v.V; id++) {
		long dup = v.special[id] ? -1 : smap_add(&map, id);
		if (dup >= 0) {
			error("%s: tokens %ld and %u are both '%s'", path, dup, id, v.s[id]);
			goto out;
		}
		size_t start = bytes.len;
		if (v.special[id]) {
			special[nspecial++] = id;
			buf_append(&bytes, v.s[id], v.len[id]);
			if (v.len[id] == strlen(TOKENIZER_EOT) && !memcmp(v.s[id], TOKENIZER_EOT, v.len[id]))
				eot = id;
		} else {
			const unsigned char *s = (const unsigned char *)v.s[id];
			for (size_t i = 0; i < v.len[id];) {
				uint32_t cp = s[i];
				size_t l = 1;
				if (cp >= 0x80 && (cp & 0xE0) == 0xC0 && i + 1 < v.len[id])
					cp = (cp & 0x1F) << 6 | (s[i + 1] & 0x3F), l = 2;
				else if (cp >= 0x80)
					cp = UINT32_MAX;
				int b = cp == UINT32_MAX ? -1 : gpt2_byte_of_cp(cp);
				if (b < 0) {
					error("%s: token '%s' (id %u) is not spelled in the byte-level "
					      "alphabet", path, v.s[id], id);
					goto out;
				}
				unsigned char ch = (unsigned char)b;
				buf_append(&bytes, &ch, 1);
				i += l;
			}
			made[id] = bytes.len - start == 1;
		}
		lens[id] = (uint32_t)(bytes.len - start);
	}
	if (eot == TOKENIZER_NO_ID && eos_hint >= 0 && (uint64_t)eos_hint < v.V &&
	    v.special[eos_hint])
		eot = (uint32_t)eos_hint;
	for (uint32_t i = 0; i < nspecial && eot == TOKENIZER_NO_ID; i++)
		if (v.len[special[i]] == strlen(TOKENIZER_EOT_LLAMA3) &&
		    !memcmp(v.s[special[i]], TOKENIZER_EOT_LLAMA3, v.len[special[i]]))
			eot = special[i];
	merges = xmalloc(st_mult(ml->len + 1, sizeof(*merges)));
	for (size_t r = 0; r < ml->len; r++) {
		const char *a, *b;
		size_t na, nb;
		if (merge_parts(&ml->kids[r], &a, &na, &b, &nb)) {
			error("%s:%d: merge %zu is not \"LEFT RIGHT\" or [\"LEFT\", \"RIGHT\"]", path,
			      ml->kids[r].line, r);
			goto out;
		}
		cat.len = 0;
		buf_append(&cat, a, na);
		buf_append(&cat, b, nb);
		long ia = smap_find(&map, a, na), ib = smap_find(&map, b, nb),
		     ic = smap_find(&map, (const char *)cat.data, cat.len);
		if (ia < 0 || ib < 0 || ic < 0) {
			error("%s:%d: merge %zu ('%.*s' '%.*s') uses or makes a token not in the "
			      "vocabulary", path, ml->kids[r].line, r, (int)na, a, (int)nb, b);
			goto out;
		}
		if (made[ic] && !dup_line)
			dup_line = ml->kids[r].line, dup_rank = r, dup_id = (uint32_t)ic;
		made[ic] = 1;
		merges[r][0] = (uint32_t)ia;
		merges[r][1] = (uint32_t)ib;
		merges[r][2] = (uint32_t)ic;
	}
	if (dup_line && !ignore_merges) {
		error("%s:%d: merge %zu makes '%s', which a byte or an earlier merge already "
		      "makes; asyncpp implements that only with ignore_merges true (as Llama 3's)",
		      path, dup_line, dup_rank, v.s[dup_id]);
		goto out;
	}
	for (uint32_t id = 0; id < v.V; id++)
		if (!made[id] && !v.special[id]) {
			error("%s: token '%s' (id %u) is neither a byte, a merge's result nor special; "
			      "asyncpp cannot hold it", path, v.s[id], id);
			goto out;
		}
	if (sep != TOKENIZER_NO_ID) /* the template's token starts each document */
		eot = sep;
	rc = tokenizer_build_flags(tok, v.V, lens, bytes.data, (uint32_t)ml->len,
				   (const uint32_t(*)[3])merges, nspecial, special, eot,
				   (ignore_merges ? TOK_IGNORE_MERGES : 0) | (nfc ? TOK_NFC : 0) |
				   (nspecial ? TOK_SPLIT_ADDED : 0) |
				   (sep != TOKENIZER_NO_ID ? TOK_DOC_TEMPLATE : 0));
	if (rc)
		error("%s: not a consistent byte-level BPE tokenizer", path);
	else if (kind == PRETOK_SPLIT_REGEX)
		rc = tokenizer_set_split_chain(*tok, sp.st, sp.k, path);
	else if (kind != PRETOK_GPT2)
		rc = tokenizer_set_pretok(*tok, kind);
	if (rc) {
		tokenizer_free(*tok);
		*tok = NULL;
	}
out:
	json_free(root);
	free(v.s);
	free(v.len);
	free(v.special);
	free(map.slot);
	buf_free(&bytes);
	buf_free(&cat);
	free(lens);
	free(merges);
	free(special);
	free(made);
	return rc;
}

/* ---- writing ---- */

static void put_cp(struct buf *b, uint32_t cp)
{
	unsigned char o[2];
	if (cp < 0x80) {
		o[0] = (unsigned char)cp;
		buf_append(b, o, 1);
	} else {
		o[0] = (unsigned char)(0xC0 | cp >> 6);
		o[1] = (unsigned char)(0x80 | (cp & 0x3F));
		buf_append(b, o, 2);
	}
}

static int write_file(const char *dir, const char *name, const struct buf *b)
{
	size_t n = strlen(dir) + strlen(name) + 2;
	char *path = xmalloc(n);
	snprintf(path, n, "%s/%s", dir, name);
	int rc = atomic_write_file(path, b->data, b->len);
	free(path);
	return rc;
}

static void put_s(struct buf *b, const char *s)
{
	buf_append(b, s, strlen(s));
}

/* "LEFT RIGHT" of merge mg as a JSON string */
static void cat_pair(struct buf *b, const char **s, const size_t *len, const uint32_t mg[3])
{
	struct buf t = {0};
	buf_append(&t, s[mg[0]], len[mg[0]]);
	buf_append(&t, " ", 1);
	buf_append(&t, s[mg[1]], len[mg[1]]);
	json_put_string(b, (const char *)t.data, t.len);
	buf_free(&t);
}

/* The pre-tokenizer of kind as check_pretok reads it back. */
static void put_pretok(struct buf *j, const struct tokenizer *tok)
{
	uint32_t kind = tokenizer_pretok(tok);
	if (kind == PRETOK_GPT2) {
		put_s(j, "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
			 "\"trim_offsets\": true, \"use_regex\": true}");
		return;
	}
	put_s(j, "{\"type\": \"Sequence\", \"pretokenizers\": [\n    ");
	const char *re;
	struct split_step st[SPLIT_MAX_STEPS];
	size_t k;
	if (!tokenizer_split_chain(tok, st, &k)) {
		for (size_t i = 0; i < k; i++) {
			put_s(j, "{\"type\": \"Split\", \"pattern\": {\"Regex\": ");
			json_put_string(j, st[i].re, st[i].n);
			put_s(j, "}, \"behavior\": \"");
			put_s(j, split_behavior_name(st[i].behavior));
			put_s(j, st[i].invert ? "\", \"invert\": true},\n    "
					      : "\", \"invert\": false},\n    ");
		}
	} else if (kind == PRETOK_CL100K || kind == PRETOK_QWEN) {
		re = kind == PRETOK_QWEN ? qwen_regex : cl100k_regex;
		put_s(j, "{\"type\": \"Split\", \"pattern\": {\"Regex\": ");
		json_put_string(j, re, strlen(re));
		put_s(j, "}, \"behavior\": \"Isolated\", \"invert\": false},\n    ");
	} else {
		put_s(j, "{\"type\": \"Digits\", \"individual_digits\": true},\n    ");
	}
	put_s(j, "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": true, "
		 "\"use_regex\": ");
	put_s(j, kind == PRETOK_GPT2_DIGITS ? "true}]}" : "false}]}");
}

int hf_tokenizer_write(const struct tokenizer *tok, const char *dir, int gpt2_files,
		       int max_length)
{
	uint32_t kind = tokenizer_pretok(tok);
	if (tokenizer_flags(tok) & TOK_SPM)
		return hf_spm_write(tok, dir, max_length);
	if (kind == PRETOK_O200K)
		return error("%s: the tokenizer's pre-tokenizer is %s; tokenizer.json export "
			     "writes GPT-2's, Llama 3's (cl100k), SmolLM's (gpt2_digits) and "
			     "Qwen's so far", dir, pretok_kind_name(kind));
	if (kind != PRETOK_GPT2 || (tokenizer_flags(tok) & ~TOK_SPLIT_ADDED))
		gpt2_files = 0; /* vocab.json and merges.txt cannot say how to split */
	uint32_t V = tokenizer_vocab_size(tok), M = tokenizer_nmerges(tok);
	uint32_t eot = tokenizer_eot_id(tok);
	struct buf spelled = {0}, j = {0}, vj = {0}, mt = {0};
	size_t *off = xmalloc(st_mult(V + 1, sizeof(*off))), *len = xcalloc(V + 1, sizeof(*len));
	const char **s = xcalloc(V + 1, sizeof(*s));
	struct smap map;
	int rc = -1;
	/* every token as its HF string */
	for (uint32_t id = 0; id < V; id++) {
		size_t n;
		const unsigned char *t = tokenizer_token(tok, id, &n);
		off[id] = spelled.len;
		if (tokenizer_is_special(tok, id)) {
			if (!json_utf8_valid(t, n)) {
				error("%s: special token %u is not UTF-8; tokenizer.json cannot hold it",
				      dir, id);
				goto out;
			}
			buf_append(&spelled, t, n);
		} else {
			for (size_t i = 0; i < n; i++)
				put_cp(&spelled, gpt2_cp_of_byte(t[i]));
		}
		len[id] = spelled.len - off[id];
	}
	for (uint32_t id = 0; id < V; id++)
		s[id] = (const char *)spelled.data + off[id];
	smap_init(&map, V, s, len);
	for (uint32_t id = 0; id < V; id++) {
		long dup = smap_add(&map, id);
		if (dup >= 0) {
			error("%s: tokens %ld and %u have the same bytes; a Hugging Face vocabulary "
			      "maps each string to one id", dir, dup, id);
			free(map.slot);
			goto out;
		}
	}
	free(map.slot);

	put_s(&j, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n"
		  "  \"added_tokens\": [");
	int first = 1;
	for (uint32_t id = 0; id < V; id++) {
		if (!tokenizer_is_special(tok, id))
			continue;
		char head[64];
		snprintf(head, sizeof(head), "%s\n    {\"id\": %u, \"content\": ", first ? "" : ",",
			 id);
		put_s(&j, head);
		json_put_string(&j, s[id], len[id]);
		put_s(&j, ", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
			  "\"normalized\": false, \"special\": true}");
		first = 0;
	}
	put_s(&j, tokenizer_flags(tok) & TOK_NFC ? "\n  ],\n  \"normalizer\": {\"type\": \"NFC\"},"
		  : "\n  ],\n  \"normalizer\": null,");
	put_s(&j, "\n  \"pre_tokenizer\": ");
	put_pretok(&j, tok);
	put_s(&j, ",\n  \"post_processor\": ");
	if (tokenizer_flags(tok) & TOK_DOC_TEMPLATE)
		put_s(&j, "{\"type\": \"Sequence\", \"processors\": [");
	put_s(&j, "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
		  "\"trim_offsets\": false, \"use_regex\": true}");
	if (tokenizer_flags(tok) & TOK_DOC_TEMPLATE) {
		put_s(&j, ", ");
		hf_put_template(&j, tok);
		put_s(&j, "]}");
	}
	put_s(&j, ",\n"
		  "  \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, "
		  "\"trim_offsets\": true, \"use_regex\": true},\n"
		  "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n"
		  "    \"unk_token\": null,\n    \"continuing_subword_prefix\": \"\",\n"
		  "    \"end_of_word_suffix\": \"\",\n    \"fuse_unk\": false,\n"
		  "    \"byte_fallback\": false,\n");
	put_s(&j, tokenizer_flags(tok) & TOK_IGNORE_MERGES ? "    \"ignore_merges\": true,\n" : "");
	put_s(&j, "    \"vocab\": {");
	/* vocab.json: the same map */
	put_s(&vj, "{");
	for (uint32_t id = 0; id < V; id++) {
		char num[32];
		put_s(&j, id ? ",\n      " : "\n      ");
		json_put_string(&j, s[id], len[id]);
		snprintf(num, sizeof(num), ": %u", id);
		put_s(&j, num);
		if (id)
			put_s(&vj, ", ");
		json_put_string(&vj, s[id], len[id]);
		put_s(&vj, num);
	}
	put_s(&vj, "}\n");
	put_s(&j, "\n    },\n    \"merges\": [");
	put_s(&mt, "#version: 0.2\n");
	for (uint32_t r = 0; r < M; r++) {
		uint32_t mg[3];
		tokenizer_merge(tok, r, mg);
		put_s(&j, r ? ",\n      " : "\n      ");
		cat_pair(&j, s, len, mg);
		buf_append(&mt, s[mg[0]], len[mg[0]]);
		buf_append(&mt, " ", 1);
		buf_append(&mt, s[mg[1]], len[mg[1]]);
		buf_append(&mt, "\n", 1);
	}
	put_s(&j, "\n    ]\n  }\n}\n");
	struct buf tc = {0};
	char line[256];
	put_s(&tc, "{\n  \"tokenizer_class\": \"PreTrainedTokenizerFast\",\n");
	if (eot != TOKENIZER_NO_ID) {
		const char *keys[] = {"bos_token", "eos_token", "unk_token"};
		/* a template's token starts a document: the bos alone */
		for (int k = 0; k < ((tokenizer_flags(tok) & TOK_DOC_TEMPLATE) ? 1 : 3); k++) {
			snprintf(line, sizeof(line), "  \"%s\": ", keys[k]);
			put_s(&tc, line);
			json_put_string(&tc, s[eot], len[eot]);
			put_s(&tc, ",\n");
		}
	}
	snprintf(line, sizeof(line), "  \"model_max_length\": %d,\n  \"add_prefix_space\": false,\n"
		 "  \"clean_up_tokenization_spaces\": false\n}\n", max_length);
	put_s(&tc, line);
	rc = write_file(dir, "tokenizer.json", &j);
	if (!rc)
		rc = write_file(dir, "tokenizer_config.json", &tc);
	if (!rc && gpt2_files)
		rc = write_file(dir, "vocab.json", &vj);
	if (!rc && gpt2_files)
		rc = write_file(dir, "merges.txt", &mt);
	buf_free(&tc);
out:
	buf_free(&spelled);
	buf_free(&j);
	buf_free(&vj);
	buf_free(&mt);
	free(off);
	free(len);
	free(s);
	return rc;
}

/* ---- shared with hf_spm.c (hf_parts.h) ---- */

void hf_smap_init(struct smap *m, uint32_t n, const char **s, size_t *len)
{
	smap_init(m, n, s, len);
}
long hf_smap_find(const struct smap *m, const char *s, size_t n) { return smap_find(m, s, n); }
long hf_smap_add(struct smap *m, uint32_t id) { return smap_add(m, id); }
const char *hf_type_of(const struct json *j) { return type_of(j); }
int hf_is_true(const struct json *obj, const char *key) { return is_true(obj, key); }
int hf_unset(const struct json *obj, const char *key, int empty_ok)
{
	return unset(obj, key, empty_ok);
}
int hf_merge_parts(const struct json *e, const char **a, size_t *na, const char **b, size_t *nb)
{
	return merge_parts(e, a, na, b, nb);
}

int hf_read_vocab(const char *path, const struct json *root, struct hf_vocab *out,
		  int normalizer)
{
	struct vocab v = {0};
	int rc = read_vocab(path, root, &v, normalizer);
	*out = (struct hf_vocab){v.V, v.s, v.len, v.special};
	return rc;
}
