/* tokenizer.c - byte-level BPE: the tokenizer file, encoding, decoding.
 *
 * Encoding a pre-token: start from its bytes' ids and repeatedly merge the
 * adjacent pair of lowest rank (leftmost on ties). Loading checks that every
 * merge's parts are bytes or results of earlier merges, which makes this the
 * same as GPT-2's "merge every occurrence of the best pair" loop. Short
 * pieces use a plain scan; long ones a heap over a linked list, so a
 * megabyte of punctuation costs O(n log n), not O(n^2).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "added_tokens.h"
#include "pretok.h"
#include "regex_split.h"
#include "spm.h"
#include "tokenizer.h"
#include "unicode_nfc.h"

#define HDR_SIZE 48
#define EMPTY_KEY UINT64_MAX

struct tokenizer {
	uint32_t vocab, nmerges, nspecial, eot;
	uint32_t flags;           /* TOK_* */
	uint64_t hash;
	uint32_t pretok;          /* enum pretok_kind */
	pretok_next_fn next;      /* its scanner */
	uint32_t *lens;           /* [vocab] */
	uint64_t *off;            /* [vocab+1] offsets into bytes */
	unsigned char *bytes;     /* [off[vocab]] */
	uint32_t (*merges)[3];    /* [nmerges] left, right, result */
	uint32_t *special;        /* [nspecial] */
	unsigned char *is_special; /* [vocab] */
	uint32_t byte_id[256];
	uint64_t *pair_key;       /* open addressing: (left << 32 | right) */
	uint32_t *pair_rank;
	uint64_t pair_mask;
	int pair_shift;
	uint32_t *whole;          /* TOK_IGNORE_MERGES: ids of the tokens by their bytes,
				   * open addressing, UINT32_MAX empty; else NULL */
	uint64_t whole_mask;
	struct spm *spm;          /* TOK_SPM: normalizers, characters, decoding; else NULL */
	struct spm_params *spm_p; /* its parameters, as read or built */
	struct added_tokens *added; /* TOK_SPLIT_ADDED: the special tokens; else NULL */
	int added_nl;               /* one of them has a '\n' before its last byte */
	/* PRETOK_SPLIT_REGEX: the step's parameters as stored (u32 behavior, u32
	 * invert, the pattern) and the compiled regex; else NULL, 0 */
	unsigned char *rx_param;
	uint32_t rx_plen;
	struct regex_split *rx;
	/* tokenizer_max_ids(len) = len * ids_mult + ids_extra (bound_ids) */
	size_t ids_mult, ids_extra;
};

static inline uint64_t bytes_slot(const unsigned char *s, size_t n)
{
	return fnv1a64(FNV1A64_INIT, s, n) * 0x9E3779B97F4A7C15ULL;
}

/* TOK_IGNORE_MERGES: the non-special token with bytes s[0..n), or UINT32_MAX */
static inline uint32_t whole_lookup(const struct tokenizer *t, const unsigned char *s, size_t n)
{
	for (uint64_t i = bytes_slot(s, n) & t->whole_mask;; i = (i + 1) & t->whole_mask) {
		uint32_t id = t->whole[i];
		if (id == UINT32_MAX || (t->lens[id] == n && !memcmp(t->bytes + t->off[id], s, n)))
			return id;
	}
}

static inline uint64_t pair_slot(const struct tokenizer *t, uint64_t key)
{
	return (key * 0x9E3779B97F4A7C15ULL) >> t->pair_shift;
}

/* Rank of merging (a, b), or UINT32_MAX. */
static inline uint32_t pair_lookup(const struct tokenizer *t, uint32_t a, uint32_t b)
{
	uint64_t key = (uint64_t)a << 32 | b;
	for (uint64_t i = pair_slot(t, key);; i = (i + 1) & t->pair_mask) {
		if (t->pair_key[i] == key)
			return t->pair_rank[i];
		if (t->pair_key[i] == EMPTY_KEY)
			return UINT32_MAX;
	}
}

void tokenizer_free(struct tokenizer *t)
{
	if (!t)
		return;
	free(t->lens);
	free(t->off);
	free(t->bytes);
	free(t->merges);
	free(t->special);
	free(t->is_special);
	free(t->pair_key);
	free(t->pair_rank);
	free(t->whole);
	spm_free(t->spm);
	free(t->spm_p);
	added_tokens_free(t->added);
	free(t->rx_param);
	regex_split_free(t->rx);
	free(t);
}

/* TOK_IGNORE_MERGES: a merge may make a token made before (Hugging Face's
 * list of every split, Llama 3's) and use tokens made later; every token but
 * the special ones must be a byte or made, and the tokens' bytes distinct
 * (the map of whole tokens). */
static int whole_init(struct tokenizer *t, const unsigned char *made, const char *name)
{
	uint32_t V = t->vocab;
	int bits = 4;
	while (((uint64_t)1 << bits) < 2 * (uint64_t)V)
		bits++;
	t->whole_mask = ((uint64_t)1 << bits) - 1;
	t->whole = xmalloc(st_mult(t->whole_mask + 1, sizeof(*t->whole)));
	memset(t->whole, 0xff, (t->whole_mask + 1) * sizeof(*t->whole));
	for (uint32_t id = 0; id < V; id++) {
		if (t->is_special[id])
			continue;
		if (!made[id])
			return error("%s: token %u is neither a byte, a merge's result nor special",
				     name, id);
		const unsigned char *s = t->bytes + t->off[id];
		uint64_t i = bytes_slot(s, t->lens[id]) & t->whole_mask;
		for (; t->whole[i] != UINT32_MAX; i = (i + 1) & t->whole_mask)
			if (t->lens[t->whole[i]] == t->lens[id] &&
			    !memcmp(t->bytes + t->off[t->whole[i]], s, t->lens[id]))
				return error("%s: tokens %u and %u have the same bytes", name,
					     t->whole[i], id);
		t->whole[i] = id;
	}
	return 0;
}

/* Validate the arrays of t (lens, bytes, merges, special filled in) and build
 * the indices. name is for messages. */
/* The most ids an encoding of len bytes gives, as len * ids_mult +
 * ids_extra. A stretch of n bytes between added tokens gives at most n ids
 * (a token is at least one byte), 3n with TOK_NFC (NFC at most triples the
 * bytes), and (n + extra) * growth for a SentencePiece-style one (its
 * normalizers, spm_max_ids: affine in n); an added token of la bytes gives
 * one id and starts a stretch, which may add the extra again, so ids_mult
 * also covers (1 + extra) / la per byte of each. Being affine, the bound of
 * a text is at least the bounds of its pieces added up with one extra each
 * (cmd/encode.c places each piece's ids so). */
static void bound_ids(struct tokenizer *t)
{
	size_t g = t->flags & TOK_NFC ? 3 : 1, e = 0;
	if (t->spm) {
		e = spm_max_ids(t->spm, 0);
		g = spm_max_ids(t->spm, 1) - e;
	}
	t->ids_mult = g;
	t->ids_extra = e;
	for (uint32_t i = 0; t->added && i < t->nspecial; i++) {
		size_t la = t->lens[t->special[i]], need = (1 + e + la - 1) / la;
		if (need > t->ids_mult)
			t->ids_mult = need;
	}
}

static int tok_init(struct tokenizer *t, const char *name)
{
	uint32_t V = t->vocab;
	if (!pretok_kind_name(t->pretok))
		return error("%s: unknown pre-tokenizer kind %u (this asyncpp knows gpt2, cl100k, "
			     "o200k, gpt2_digits, qwen, split_regex, spm, metaspace): written by a "
			     "newer asyncpp?", name, t->pretok);
	t->next = pretok_next_of(t->pretok);
	if (t->pretok == PRETOK_SPLIT_REGEX && !t->rx) {
		size_t wn = strlen(name) + 32, k;
		char *where = xmalloc(wn);
		snprintf(where, wn, "%s: the Split regex", name);
		struct split_step st[SPLIT_MAX_STEPS];
		int rc = split_params_get(t->rx_param, t->rx_plen, st, &k, where) ||
			 regex_split_new_chain(&t->rx, st, k, where);
		free(where);
		if (rc)
			return -1;
	} else if (t->pretok != PRETOK_SPLIT_REGEX && t->rx_plen) {
		return error("%s: pre-tokenizer kind %u with %u bytes of parameters (it takes none)",
			     name, t->pretok, t->rx_plen);
	}
	if (V > TOKENIZER_MAX_VOCAB)
		return error("%s: vocabulary size %u exceeds %u", name, V, TOKENIZER_MAX_VOCAB);
	if (t->flags & ~(uint32_t)TOK_KNOWN_FLAGS)
		return error("%s: unknown flags 0x%x", name, t->flags);
	if ((t->flags & TOK_DOC_TEMPLATE) && t->eot == TOKENIZER_NO_ID)
		return error("%s: flag doc-template without a separator token: file is corrupt",
			     name);
	if ((t->flags & TOK_SPLIT_ADDED) && !t->nspecial) /* one file form per tokenizer */
		return error("%s: flag split-added without special tokens: file is corrupt", name);
	int spm = (t->flags & TOK_SPM) != 0;
	if (spm != (t->pretok == PRETOK_SPM || t->pretok == PRETOK_METASPACE) ||
	    spm != (t->spm_p != NULL))
		return error("%s: SentencePiece-style flag 0x%x with pre-tokenizer %s%s", name,
			     t->flags, pretok_kind_name(t->pretok),
			     t->spm_p ? "" : " and no SentencePiece parameters");
	if (!spm && (t->flags & (TOK_BYTE_FALLBACK | TOK_FUSE_UNK)))
		return error("%s: byte_fallback and fuse_unk (flags 0x%x) need a "
			     "SentencePiece-style tokenizer", name, t->flags);
	if (spm && (t->flags & TOK_NFC)) /* spm's normalizer chain holds its NFC */
		return error("%s: flags 0x%x: NFC is a normalizer step of a SentencePiece-style "
			     "tokenizer: file is corrupt", name, t->flags);
	/* Hugging Face's merges: checked below */
	int loose = (t->flags & (TOK_IGNORE_MERGES | TOK_SPM)) != 0;
	if (!loose && (uint64_t)256 + t->nmerges + t->nspecial != V)
		return error("%s: vocabulary size %u is not 256 bytes + %u merges + %u special tokens",
			     name, V, t->nmerges, t->nspecial);
	t->off = xmalloc(st_mult(V + 1, sizeof(*t->off)));
	t->off[0] = 0;
	for (uint32_t i = 0; i < V; i++) {
		if (!t->lens[i])
			return error("%s: token %u is empty", name, i);
		t->off[i + 1] = t->off[i] + t->lens[i];
	}
	t->is_special = xcalloc(V ? V : 1, 1);
	for (uint32_t i = 0; i < t->nspecial; i++) {
		uint32_t id = t->special[i];
		if (id >= V)
			return error("%s: special token id %u out of range (vocabulary %u)", name, id, V);
		if (t->is_special[id])
			return error("%s: special token id %u listed twice", name, id);
		t->is_special[id] = 1;
	}
	if (t->eot != TOKENIZER_NO_ID && (t->eot >= V || !t->is_special[t->eot]))
		return error("%s: end-of-text id %u is not a special token", name, t->eot);
	/* made[id]: 1 for byte tokens and results of merges seen so far */
	unsigned char *made = xcalloc(V ? V : 1, 1);
	int rc = -1;
	for (int b = 0; b < 256; b++)
		t->byte_id[b] = UINT32_MAX;
	for (uint32_t i = 0; i < V; i++) {
		if (spm) /* its base symbols are characters (spm.c): every token may start */
			made[i] = 1;
		if (spm || t->is_special[i] || t->lens[i] != 1)
			continue;
		unsigned char b = t->bytes[t->off[i]];
		if (t->byte_id[b] != UINT32_MAX) {
			error("%s: tokens %u and %u are both the byte 0x%02x", name, t->byte_id[b], i, b);
			goto out;
		}
		t->byte_id[b] = i;
		made[i] = 1;
	}
	for (int b = 0; b < 256 && !spm; b++)
		if (t->byte_id[b] == UINT32_MAX) {
			error("%s: no token for the byte 0x%02x", name, b);
			goto out;
		}
	int bits = 4;
	while (((uint64_t)1 << bits) < 2 * (uint64_t)t->nmerges)
		bits++;
	t->pair_mask = ((uint64_t)1 << bits) - 1;
	t->pair_shift = 64 - bits;
	t->pair_key = xmalloc(st_mult(t->pair_mask + 1, sizeof(*t->pair_key)));
	t->pair_rank = xmalloc(st_mult(t->pair_mask + 1, sizeof(*t->pair_rank)));
	memset(t->pair_key, 0xff, (t->pair_mask + 1) * sizeof(*t->pair_key));
	for (uint32_t r = 0; r < t->nmerges; r++) {
		uint32_t a = t->merges[r][0], b = t->merges[r][1], c = t->merges[r][2];
		if (a >= V || b >= V || c >= V) {
			error("%s: merge %u (%u %u -> %u) has an id out of range (vocabulary %u)",
			      name, r, a, b, c, V);
			goto out;
		}
		if (loose ? t->is_special[a] || t->is_special[b] : !made[a] || !made[b]) {
			error("%s: merge %u uses token %u before a byte or an earlier merge makes it",
			      name, r, made[a] ? b : a);
			goto out;
		}
		if ((made[c] && !loose) || t->is_special[c]) {
			error("%s: merge %u: result %u is a byte, special or earlier token", name, r, c);
			goto out;
		}
		if ((uint64_t)t->lens[a] + t->lens[b] != t->lens[c] ||
		    memcmp(t->bytes + t->off[a], t->bytes + t->off[c], t->lens[a]) ||
		    memcmp(t->bytes + t->off[b], t->bytes + t->off[c] + t->lens[a], t->lens[b])) {
			error("%s: merge %u: token %u is not token %u followed by token %u",
			      name, r, c, a, b);
			goto out;
		}
		made[c] = 1;
		uint64_t key = (uint64_t)a << 32 | b, i;
		for (i = pair_slot(t, key); t->pair_key[i] != EMPTY_KEY; i = (i + 1) & t->pair_mask)
			if (t->pair_key[i] == key) {
				error("%s: merge %u repeats merge %u", name, r, t->pair_rank[i]);
				goto out;
			}
		t->pair_key[i] = key;
		t->pair_rank[i] = r;
	}
	if ((t->flags & TOK_IGNORE_MERGES) && whole_init(t, made, name))
		goto out;
	if (spm && spm_new(&t->spm, t, t->spm_p, name))
		goto out;
	if ((t->flags & TOK_SPLIT_ADDED) && !t->added) {
		const unsigned char **sp = xmalloc(st_mult(t->nspecial, sizeof(*sp)));
		uint32_t *len = xmalloc(st_mult(t->nspecial, sizeof(*len)));
		for (uint32_t i = 0; i < t->nspecial; i++) {
			sp[i] = t->bytes + t->off[t->special[i]], len[i] = t->lens[t->special[i]];
			if (memchr(sp[i], '\n', len[i] - 1))
				t->added_nl = 1;
		}
		t->added = added_tokens_new(t->nspecial, t->special, sp, len);
		free(sp);
		free(len);
	}
	bound_ids(t);
	rc = 0;
out:
	free(made);
	return rc;
}

/* The file version that holds t: 1 for GPT-2's pre-tokenizer, so that such
 * files (and their identity hashes) stay what earlier versions wrote. */
static uint32_t file_version(const struct tokenizer *t)
{
	if (t->flags & TOK_SPM)
		return 3;
	return t->pretok == PRETOK_GPT2 ? 1 : 2;
}

/* Serialize with the hash field zero, then fill hash and crc. */
void tokenizer_serialize(const struct tokenizer *t, struct buf *out)
{
	size_t start = out->len;
	unsigned char h[HDR_SIZE] = {0}, w[12];
	memcpy(h, TOKENIZER_MAGIC, 8);
	put_le32(h + 8, file_version(t));
	put_le32(h + 12, t->flags);
	put_le32(h + 16, t->vocab);
	put_le32(h + 20, t->nmerges);
	put_le32(h + 24, t->nspecial);
	put_le32(h + 28, t->eot);
	put_le64(h + 32, t->off[t->vocab]);
	buf_append(out, h, HDR_SIZE);
	for (uint32_t i = 0; i < t->vocab; i++) {
		put_le32(w, t->lens[i]);
		buf_append(out, w, 4);
	}
	buf_append(out, t->bytes, t->off[t->vocab]);
	for (uint32_t r = 0; r < t->nmerges; r++) {
		for (int k = 0; k < 3; k++)
			put_le32(w + 4 * k, t->merges[r][k]);
		buf_append(out, w, 12);
	}
	for (uint32_t i = 0; i < t->nspecial; i++) {
		put_le32(w, t->special[i]);
		buf_append(out, w, 4);
	}
	if (file_version(t) == 2) { /* the pre-tokenizer section: one step */
		put_le32(w, 1);
		put_le32(w + 4, t->pretok);
		put_le32(w + 8, t->rx_plen);
		buf_append(out, w, 12);
		if (t->rx_plen)
			buf_append(out, t->rx_param, t->rx_plen);
	} else if (file_version(t) == 3) { /* one step with its SentencePiece parameters */
		struct buf par = {0};
		spm_params_put(t->spm_p, &par);
		put_le32(w, 1);
		put_le32(w + 4, t->pretok);
		put_le32(w + 8, (uint32_t)par.len);
		buf_append(out, w, 12);
		buf_append(out, par.data, par.len);
		buf_free(&par);
	}
	unsigned char *p = out->data + start;
	size_t n = out->len - start;
	uint64_t hash = fnv1a64(FNV1A64_INIT, p + 8, 32);
	hash = fnv1a64(hash, p + HDR_SIZE, n - HDR_SIZE);
	put_le64(p + 40, hash);
	put_le32(w, crc32c(0, p, n));
	buf_append(out, w, 4);
}

static int tok_finish(struct tokenizer *t, const char *name)
{
	if (tok_init(t, name))
		return -1;
	struct buf b = {0};
	tokenizer_serialize(t, &b);
	t->hash = get_le64(b.data + 40);
	buf_free(&b);
	return 0;
}

int tokenizer_build(struct tokenizer **tok, uint32_t vocab, const uint32_t *lens,
		    const unsigned char *bytes, uint32_t nmerges, const uint32_t (*merges)[3],
		    uint32_t nspecial, const uint32_t *special, uint32_t eot)
{
	return tokenizer_build_flags(tok, vocab, lens, bytes, nmerges, merges, nspecial, special,
				     eot, 0);
}

int tokenizer_build_flags(struct tokenizer **tok, uint32_t vocab, const uint32_t *lens,
			  const unsigned char *bytes, uint32_t nmerges,
			  const uint32_t (*merges)[3], uint32_t nspecial, const uint32_t *special,
			  uint32_t eot, uint32_t flags)
{
	return tokenizer_build_spm(tok, vocab, lens, bytes, nmerges, merges, nspecial, special, eot,
				   flags, PRETOK_GPT2, NULL);
}

int tokenizer_build_spm(struct tokenizer **tok, uint32_t vocab, const uint32_t *lens,
			const unsigned char *bytes, uint32_t nmerges, const uint32_t (*merges)[3],
			uint32_t nspecial, const uint32_t *special, uint32_t eot, uint32_t flags,
			uint32_t kind, const struct spm_params *p)
{
	*tok = NULL;
	if (vocab > TOKENIZER_MAX_VOCAB || nmerges > TOKENIZER_MAX_VOCAB ||
	    nspecial > TOKENIZER_MAX_VOCAB)
		return error("tokenizer: sizes out of range (vocabulary %u)", vocab);
	struct tokenizer *t = xcalloc(1, sizeof(*t));
	t->vocab = vocab;
	t->nmerges = nmerges;
	t->nspecial = nspecial;
	t->eot = eot;
	t->flags = flags;
	t->pretok = kind;
	if (p) {
		t->spm_p = xmalloc(sizeof(*t->spm_p));
		*t->spm_p = *p;
	}
	t->lens = xmalloc(st_mult(vocab ? vocab : 1, 4));
	if (vocab)
		memcpy(t->lens, lens, (size_t)vocab * 4);
	size_t total = 0;
	for (uint32_t i = 0; i < vocab; i++)
		total = st_add(total, lens[i]);
	t->bytes = xmalloc(total ? total : 1);
	if (total)
		memcpy(t->bytes, bytes, total);
	/* merges and special may be NULL when there are none (memcpy wants a
	 * pointer even for 0 bytes) */
	t->merges = xmalloc(st_mult(nmerges ? nmerges : 1, sizeof(*t->merges)));
	if (nmerges)
		memcpy(t->merges, merges, (size_t)nmerges * sizeof(*t->merges));
	t->special = xmalloc(st_mult(nspecial ? nspecial : 1, 4));
	if (nspecial)
		memcpy(t->special, special, (size_t)nspecial * 4);
	if (tok_finish(t, "tokenizer")) {
		tokenizer_free(t);
		return -1;
	}
	*tok = t;
	return 0;
}

uint32_t tokenizer_pretok(const struct tokenizer *t) { return t->pretok; }
uint32_t tokenizer_flags(const struct tokenizer *t) { return t->flags; }
const struct spm_params *tokenizer_spm(const struct tokenizer *t) { return t->spm_p; }

int tokenizer_set_split_regex(struct tokenizer *t, const char *pattern, size_t n,
			      uint32_t behavior, int invert, const char *where)
{
	struct split_step st = {pattern, n, behavior, invert};
	return tokenizer_set_split_chain(t, &st, 1, where);
}

int tokenizer_set_split_chain(struct tokenizer *t, const struct split_step *st, size_t k,
			      const char *where)
{
	struct regex_split *rx;
	size_t total = 0;
	for (size_t i = 0; i < k; i++)
		total += st[i].n;
	if (total > TOKENIZER_MAX_VOCAB)
		return error("%s: Split regexes of %zu bytes are too long", where, total);
	if (regex_split_new_chain(&rx, st, k, where))
		return -1;
	regex_split_free(t->rx);
	free(t->rx_param);
	t->rx = rx;
	struct buf p = {0};
	split_params_put(&p, st, k);
	t->rx_plen = (uint32_t)p.len;
	t->rx_param = p.data;
	t->pretok = PRETOK_SPLIT_REGEX;
	t->next = pretok_next_of(t->pretok);
	struct buf b = {0};
	tokenizer_serialize(t, &b);
	t->hash = get_le64(b.data + 40);
	buf_free(&b);
	return 0;
}

int tokenizer_split_regex(const struct tokenizer *t, const char **pattern, size_t *n,
			  uint32_t *behavior, int *invert)
{
	struct split_step st[SPLIT_MAX_STEPS];
	size_t k;
	if (tokenizer_split_chain(t, st, &k) || k != 1)
		return -1;
	*behavior = st[0].behavior;
	*invert = st[0].invert;
	*pattern = st[0].re;
	*n = st[0].n;
	return 0;
}

int tokenizer_split_chain(const struct tokenizer *t, struct split_step st[SPLIT_MAX_STEPS],
			  size_t *k)
{
	*k = 0;
	if (t->pretok != PRETOK_SPLIT_REGEX) /* tok_init checked the parameters */
		return -1;
	return split_params_get(t->rx_param, t->rx_plen, st, k, "tokenizer");
}

uint64_t tokenizer_regex_failures(const struct tokenizer *t, const char **pattern, size_t *n)
{
	struct split_step st[SPLIT_MAX_STEPS];
	size_t k, step;
	uint64_t fails = t->rx ? regex_split_failures(t->rx, &step) : 0;
	if (!fails || tokenizer_split_chain(t, st, &k) || step >= k)
		return fails;
	*pattern = st[step].re;
	*n = st[step].n;
	return fails;
}

int tokenizer_set_pretok(struct tokenizer *t, uint32_t kind)
{
	if (kind == PRETOK_SPLIT_REGEX)
		return error("tokenizer: the Split regex kind needs its regex "
			     "(tokenizer_set_split_regex)");
	if (!pretok_kind_name(kind))
		return error("tokenizer: unknown pre-tokenizer kind %u", kind);
	if ((t->flags & TOK_SPM) || kind == PRETOK_SPM || kind == PRETOK_METASPACE)
		return error("tokenizer: a SentencePiece-style pre-tokenizer is set when building "
			     "(tokenizer_build_spm)");
	t->pretok = kind;
	t->next = pretok_next_of(kind);
	struct buf b = {0};
	tokenizer_serialize(t, &b);
	t->hash = get_le64(b.data + 40);
	buf_free(&b);
	return 0;
}

/* The pre-tokenizer section of a version-2 file, p[0..n): a u32 count of
 * steps, then per step a u32 kind, a u32 parameter length and the
 * parameters. This asyncpp's kinds are single steps, with parameters only
 * for the Split regex (into t, checked by tok_init) and, in a version-3
 * file, the SentencePiece-style kinds (t->spm_p), and GPT-2's is never in
 * one (a file is in the one form tokenizer_serialize writes). */
static int read_pretok_section(const unsigned char *p, size_t n, struct tokenizer *t,
			       uint32_t version, const char *name)
{
	uint32_t *kind = &t->pretok;
	if (version == 2 && n >= 12 && get_le32(p) == 1 && get_le32(p + 4) == PRETOK_SPLIT_REGEX) {
		if ((uint64_t)n != 12ULL + get_le32(p + 8))
			return error("%s: pre-tokenizer section of %zu bytes, its step says %llu",
				     name, n, 12ULL + get_le32(p + 8));
		*kind = PRETOK_SPLIT_REGEX;
		t->rx_plen = get_le32(p + 8);
		t->rx_param = xmalloc(t->rx_plen ? t->rx_plen : 1);
		memcpy(t->rx_param, p + 12, t->rx_plen);
		return 0;
	}
	if (n < 4)
		return error("%s: truncated pre-tokenizer section (%zu bytes)", name, n);
	uint32_t steps = get_le32(p);
	if (steps != 1)
		return error("%s: a pre-tokenizer chain of %u steps (this asyncpp reads one): "
			     "written by a newer asyncpp?", name, steps);
	if (version == 3) { /* SentencePiece-style: the step's parameters */
		if (n < 12 || get_le32(p + 8) != n - 12)
			return error("%s: pre-tokenizer section of %zu bytes, its step says %u bytes "
				     "of parameters", name, n, n < 12 ? 0 : get_le32(p + 8));
		*kind = get_le32(p + 4);
		if (*kind != PRETOK_SPM && *kind != PRETOK_METASPACE)
			return error("%s: version 3 with pre-tokenizer kind %u (version 3 holds the "
				     "SentencePiece-style kinds): file is corrupt", name, *kind);
		t->spm_p = xmalloc(sizeof(*t->spm_p));
		return spm_params_get(t->spm_p, p + 12, n - 12, name);
	}
	if (n != 12)
		return error("%s: pre-tokenizer section of %zu bytes, expected 12", name, n);
	*kind = get_le32(p + 4);
	if (*kind == PRETOK_SPM || *kind == PRETOK_METASPACE)
		return error("%s: version 2 with the SentencePiece-style pre-tokenizer %s, which "
			     "is written as version 3: file is corrupt", name, pretok_kind_name(*kind));
	if (*kind == PRETOK_GPT2) /* one tokenizer, one file and one hash */
		return error("%s: version 2 with GPT-2's pre-tokenizer, which is written as "
			     "version 1: file is corrupt", name);
	if (get_le32(p + 8))
		return error("%s: pre-tokenizer kind %u with %u bytes of parameters (it takes none)",
			     name, *kind, get_le32(p + 8));
	return 0;
}

int tokenizer_load_mem(struct tokenizer **tok, const void *data, size_t n, const char *name)
{
	const unsigned char *p = data;
	*tok = NULL;
	if (n < HDR_SIZE + 4)
		return error("%s: truncated tokenizer file (%zu bytes)", name, n);
	if (memcmp(p, TOKENIZER_MAGIC, 8))
		return error("%s: not a tokenizer file (bad magic)", name);
	uint32_t version = get_le32(p + 8);
	if (version < 1 || version > TOKENIZER_VERSION)
		return error("%s: unsupported tokenizer file version %u (this asyncpp reads 1 to %u)",
			     name, version, TOKENIZER_VERSION);
	if (get_le32(p + 12) & ~(uint32_t)TOK_KNOWN_FLAGS)
		return error("%s: unknown flags 0x%x", name, get_le32(p + 12));
	if ((version == 3) != ((get_le32(p + 12) & TOK_SPM) != 0))
		return error("%s: version %u with flags 0x%x (version 3 is the SentencePiece-style "
			     "tokenizers'): file is corrupt", name, version, get_le32(p + 12));
	uint32_t V = get_le32(p + 16), M = get_le32(p + 20), S = get_le32(p + 24);
	uint64_t L = get_le64(p + 32);
	if (V > TOKENIZER_MAX_VOCAB || M > TOKENIZER_MAX_VOCAB || S > TOKENIZER_MAX_VOCAB ||
	    L > ((uint64_t)1 << 40))
		return error("%s: header sizes out of range (vocabulary %u, %u merges, %u special, "
			     "%" PRIu64 " token bytes)", name, V, M, S, L);
	uint64_t want = HDR_SIZE + 4ULL * V + L + 12ULL * M + 4ULL * S + 4;
	if (version >= 2 && want < n) /* the pre-tokenizer section, checked below */
		want = n;
	if (want != n)
		return error("%s: %s: %zu bytes, header says %" PRIu64, name,
			     n < want ? "truncated" : "trailing bytes", n, want);
	uint32_t crc = crc32c(0, p, n - 4);
	if (crc != get_le32(p + n - 4))
		return error("%s: checksum mismatch (crc32c %08x, stored %08x): file is corrupt",
			     name, crc, get_le32(p + n - 4));
	uint64_t hash = fnv1a64(FNV1A64_INIT, p + 8, 32);
	hash = fnv1a64(hash, p + HDR_SIZE, n - 4 - HDR_SIZE);
	if (hash != get_le64(p + 40))
		return error("%s: identity hash mismatch: file is corrupt", name);

	struct tokenizer *t = xcalloc(1, sizeof(*t));
	t->vocab = V;
	t->nmerges = M;
	t->nspecial = S;
	t->eot = get_le32(p + 28);
	t->flags = get_le32(p + 12);
	t->hash = hash;
	t->pretok = PRETOK_GPT2;
	const unsigned char *q = p + HDR_SIZE;
	t->lens = xmalloc(st_mult(V ? V : 1, 4));
	uint64_t sum = 0;
	for (uint32_t i = 0; i < V; i++, q += 4) {
		t->lens[i] = get_le32(q);
		sum += t->lens[i];
	}
	if (sum != L) {
		error("%s: token lengths add up to %" PRIu64 " bytes, header says %" PRIu64,
		      name, sum, L);
		goto fail;
	}
	t->bytes = xmalloc(L ? L : 1);
	memcpy(t->bytes, q, L);
	q += L;
	t->merges = xmalloc(st_mult(M ? M : 1, sizeof(*t->merges)));
	for (uint32_t r = 0; r < M; r++, q += 12)
		for (int k = 0; k < 3; k++)
			t->merges[r][k] = get_le32(q + 4 * k);
	t->special = xmalloc(st_mult(S ? S : 1, 4));
	for (uint32_t i = 0; i < S; i++, q += 4)
		t->special[i] = get_le32(q);
	if (version >= 2 && read_pretok_section(q, (size_t)(p + n - 4 - q), t, version, name))
		goto fail;
	if (tok_init(t, name))
		goto fail;
	*tok = t;
	return 0;
fail:
	tokenizer_free(t);
	return -1;
}

int tokenizer_load(struct tokenizer **tok, const char *path)
{
	struct buf b = {0};
	*tok = NULL;
	if (read_file(path, &b))
		return -1;
	int rc = tokenizer_load_mem(tok, b.data, b.len, path);
	buf_free(&b);
	return rc;
}

int tokenizer_save(const struct tokenizer *t, const char *path)
{
	struct buf b = {0};
	struct atomic_file af;
	tokenizer_serialize(t, &b);
	int rc = -1;
	if (atomic_open(&af, path))
		goto out;
	if (atomic_write(&af, b.data, b.len)) {
		atomic_abort(&af);
		goto out;
	}
	rc = atomic_commit(&af);
out:
	buf_free(&b);
	return rc;
}

uint32_t tokenizer_vocab_size(const struct tokenizer *t) { return t->vocab; }
uint32_t tokenizer_eot_id(const struct tokenizer *t) { return t->eot; }
uint32_t tokenizer_nmerges(const struct tokenizer *t) { return t->nmerges; }
void tokenizer_merge(const struct tokenizer *t, uint32_t r, uint32_t out[3])
{
	memcpy(out, t->merges[r], sizeof(t->merges[r]));
}
uint64_t tokenizer_hash(const struct tokenizer *t) { return t->hash; }
int tokenizer_is_special(const struct tokenizer *t, uint32_t id)
{
	return id < t->vocab && t->is_special[id];
}

const unsigned char *tokenizer_token(const struct tokenizer *t, uint32_t id, size_t *len)
{
	*len = t->lens[id];
	return t->bytes + t->off[id];
}

/* ---- BPE on one pre-token ---- */

/* sym[0..n) holds byte ids; merge in place, return the new count. */
static size_t bpe_scan(const struct tokenizer *t, uint32_t *sym, size_t n)
{
	while (n > 1) {
		uint32_t best = UINT32_MAX;
		size_t at = 0;
		for (size_t i = 0; i + 1 < n; i++) {
			uint32_t r = pair_lookup(t, sym[i], sym[i + 1]);
			if (r < best) {
				best = r;
				at = i;
			}
		}
		if (best == UINT32_MAX)
			break;
		sym[at] = t->merges[best][2];
		memmove(sym + at + 1, sym + at + 2, (n - at - 2) * sizeof(*sym));
		n--;
	}
	return n;
}

struct heap_ent {
	uint32_t rank, pos;
};

static inline int ent_less(struct heap_ent a, struct heap_ent b)
{
	return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(struct heap_ent *h, size_t *n, struct heap_ent e)
{
	size_t i = (*n)++;
	while (i && ent_less(e, h[(i - 1) / 2])) {
		h[i] = h[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	h[i] = e;
}

static struct heap_ent heap_pop(struct heap_ent *h, size_t *n)
{
	struct heap_ent top = h[0], e = h[--*n];
	size_t i = 0;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= *n)
			break;
		if (c + 1 < *n && ent_less(h[c + 1], h[c]))
			c++;
		if (!ent_less(h[c], e))
			break;
		h[i] = h[c];
		i = c;
	}
	if (*n)
		h[i] = e;
	return top;
}

#define DEAD UINT32_MAX

static size_t bpe_heap(const struct tokenizer *t, uint32_t *sym, size_t n)
{
	if (n < 2)
		return n;
	size_t *next = xmalloc(st_mult(n, sizeof(size_t)));
	size_t *prev = xmalloc(st_mult(n, sizeof(size_t)));
	/* at most n-1 initial pairs, two more per merge, n-1 merges */
	struct heap_ent *h = xmalloc(st_mult(3 * n, sizeof(*h)));
	size_t nh = 0;
	for (size_t i = 0; i < n; i++) {
		next[i] = i + 1; /* n: none */
		prev[i] = i ? i - 1 : SIZE_MAX;
	}
	for (size_t i = 0; i + 1 < n; i++) {
		uint32_t r = pair_lookup(t, sym[i], sym[i + 1]);
		if (r != UINT32_MAX)
			heap_push(h, &nh, (struct heap_ent){r, (uint32_t)i});
	}
	while (nh) {
		struct heap_ent e = heap_pop(h, &nh);
		size_t i = e.pos, j = next[i];
		if (sym[i] == DEAD || j >= n || pair_lookup(t, sym[i], sym[j]) != e.rank)
			continue;
		sym[i] = t->merges[e.rank][2];
		sym[j] = DEAD;
		next[i] = next[j];
		if (next[j] < n)
			prev[next[j]] = i;
		if (prev[i] != SIZE_MAX) {
			uint32_t r = pair_lookup(t, sym[prev[i]], sym[i]);
			if (r != UINT32_MAX)
				heap_push(h, &nh, (struct heap_ent){r, (uint32_t)prev[i]});
		}
		if (next[i] < n) {
			uint32_t r = pair_lookup(t, sym[i], sym[next[i]]);
			if (r != UINT32_MAX)
				heap_push(h, &nh, (struct heap_ent){r, (uint32_t)i});
		}
	}
	size_t m = 0;
	for (size_t i = 0; i < n; i = next[i])
		sym[m++] = sym[i];
	free(next);
	free(prev);
	free(h);
	return m;
}

#define SCAN_MAX 64 /* pieces up to this many bytes use bpe_scan */

size_t tokenizer_bpe_ids(const struct tokenizer *t, uint32_t *sym, size_t n)
{
	if (n <= SCAN_MAX)
		return bpe_scan(t, sym, n);
	if (n > UINT32_MAX)
		return n; /* positions are 32-bit; never reached by real pieces */
	return bpe_heap(t, sym, n);
}

uint32_t tokenizer_whole_id(const struct tokenizer *t, const void *s, size_t n)
{
	return t->whole && n > 1 ? whole_lookup(t, s, n) : UINT32_MAX;
}

/* Encode one pre-token s[0..n) into out; returns the count. */
static size_t encode_piece(const struct tokenizer *t, const unsigned char *s, size_t n,
			   uint32_t *out)
{
	if (t->spm)
		return spm_piece(t, t->spm, s, n, out);
	if (t->whole && n > 1) { /* ignore_merges: a piece that is a token is taken whole */
		uint32_t id = whole_lookup(t, s, n);
		if (id != UINT32_MAX) {
			out[0] = id;
			return 1;
		}
	}
	for (size_t i = 0; i < n; i++)
		out[i] = t->byte_id[s[i]];
	if (n <= SCAN_MAX)
		return bpe_scan(t, out, n);
	if (n > UINT32_MAX)
		return n; /* positions are 32-bit; never reached by real pieces */
	return bpe_heap(t, out, n);
}

size_t tokenizer_bpe_piece(const struct tokenizer *t, const void *s, size_t n, uint32_t *out,
			   int method)
{
	const unsigned char *p = s;
	for (size_t i = 0; i < n; i++)
		out[i] = t->byte_id[p[i]];
	return method ? bpe_heap(t, out, n) : bpe_scan(t, out, n);
}

static size_t encode_cached_piece(const struct tokenizer *t, struct tok_cache *c,
				  const unsigned char *w, size_t l, const unsigned char *end,
				  uint32_t *out);

/* PRETOK_SPLIT_REGEX: the regex's pieces of the whole text (its matches
 * depend on what comes before and after), each encoded apart; c may be
 * NULL. */
static size_t encode_regex(const struct tokenizer *t, struct tok_cache *c,
			   const unsigned char *s, size_t len, uint32_t *out)
{
	struct split_piece *p = NULL;
	size_t cap = 0, np = regex_split_pieces(t->rx, s, len, &p, &cap), nout = 0;
	for (size_t i = 0; i < np; i++) {
		const unsigned char *w = s + p[i].start;
		size_t l = p[i].end - p[i].start;
		nout += c ? encode_cached_piece(t, c, w, l, s + len, out + nout)
			  : encode_piece(t, w, l, out + nout);
	}
	free(p);
	return nout;
}

static size_t encode_plain(const struct tokenizer *t, const void *text, size_t len,
			   uint32_t *out)
{
	if (t->spm)
		return spm_encode(t, t->spm, NULL, text, len, 1, out);
	const unsigned char *s = text;
	size_t pos = 0, nout = 0;
	if (t->rx)
		return encode_regex(t, NULL, s, len, out);
	while (pos < len) {
		size_t l = t->next(s + pos, len - pos);
		nout += encode_piece(t, s + pos, l, out + nout);
		pos += l;
	}
	return nout;
}

/* ---- the pre-token cache ----
 *
 * On real text most pre-tokens repeat, so encoding is mostly this lookup:
 * it is laid out for few cache misses. A slot (8 bytes) holds 32 bits of
 * the piece's hash and where its record starts in the arena; the record is
 * one run of 64-bit words: a header (the piece's length and id count), the
 * piece's bytes zero-padded to whole words, then its ids two to a word. A
 * hit reads the slot and one record, and compares the piece word by word
 * (the words the hash was computed from), so no memcmp call. A full table
 * or arena is cleared, and fills again from the text. */

#define CACHE_BITS 16
#define CACHE_MAX_PIECE 32 /* longer pieces are encoded each time */
#define CACHE_WORDS (CACHE_MAX_PIECE / 8)
#define CACHE_ARENA ((size_t)1 << (CACHE_BITS + 3)) /* 64-bit words: 4 MB */

struct cache_slot {
	uint32_t tag; /* the hash's high 32 bits, made odd; 0: empty */
	uint32_t rec; /* the record's first word in the arena */
};

struct tok_cache {
	struct cache_slot *slots;
	size_t used, top; /* slots used, arena words used */
	uint64_t *arena;
};

struct tok_cache *tok_cache_new(const struct tokenizer *t)
{
	(void)t;
	struct tok_cache *c = xcalloc(1, sizeof(*c));
	c->slots = xcalloc((size_t)1 << CACHE_BITS, sizeof(*c->slots));
	c->arena = xmalloc(CACHE_ARENA * sizeof(*c->arena));
	return c;
}

void tok_cache_free(struct tok_cache *c)
{
	if (!c)
		return;
	free(c->slots);
	free(c->arena);
	free(c);
}

static void cache_clear(struct tok_cache *c)
{
	memset(c->slots, 0, ((size_t)1 << CACHE_BITS) * sizeof(*c->slots));
	c->used = 0;
	c->top = 0;
}

/* The piece w[0..n) (2 <= n <= CACHE_MAX_PIECE) as little-endian 64-bit
 * words zero-padded (into wd), and its hash. end is the end of the text:
 * a word that lies wholly before it is loaded whole and masked, else byte by
 * byte. */
static inline uint64_t piece_words(const unsigned char *w, size_t n, const unsigned char *end,
				   uint64_t wd[CACHE_WORDS])
{
	uint64_t h = 0x9E3779B97F4A7C15ULL ^ n;
	size_t k = 0, i = 0;
	for (; i + 8 <= n; i += 8, k++) {
		memcpy(&wd[k], w + i, 8);
		h = (h ^ wd[k]) * 0xff51afd7ed558ccdULL;
		h ^= h >> 32;
	}
	if (i < n) {
		uint64_t x = 0;
		if ((size_t)(end - (w + i)) >= 8) {
			memcpy(&x, w + i, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
			x &= ~0ULL << (8 * (8 - (n - i))); /* the piece's bytes lead */
#else
			x &= ~0ULL >> (8 * (8 - (n - i))); /* the piece's bytes are the low ones */
#endif
		} else {
			memcpy(&x, w + i, n - i);
		}
		wd[k] = x;
		h = (h ^ x) * 0xc4ceb9fe1a85ec53ULL;
		h ^= h >> 29;
	}
	return h;
}

/* One pre-token w[0..l) through the cache (end: the end of the text, which
 * piece_words may read up to); returns its count of ids. */
static size_t encode_cached_piece(const struct tokenizer *t, struct tok_cache *c,
				  const unsigned char *w, size_t l, const unsigned char *end,
				  uint32_t *out)
{
	const size_t mask = ((size_t)1 << CACHE_BITS) - 1;
	if (l == 1 && !t->spm) { /* a SentencePiece-style byte may be no token */
		out[0] = t->byte_id[w[0]];
		return 1;
	}
	if (l > CACHE_MAX_PIECE)
		return encode_piece(t, w, l, out);
	uint64_t wd[CACHE_WORDS];
	uint64_t h = piece_words(w, l, end, wd);
	uint32_t tag = (uint32_t)(h >> 32) | 1;
	size_t nw = (l + 7) / 8, i = h & mask;
	struct cache_slot *sl;
	for (;; i = (i + 1) & mask) {
		sl = &c->slots[i];
		if (!sl->tag)
			break;
		const uint64_t *r = c->arena + sl->rec;
		if (sl->tag != tag || (r[0] & 0xff) != l)
			continue;
		size_t k = 0;
		while (k < nw && r[1 + k] == wd[k])
			k++;
		if (k < nw)
			continue;
		size_t m = r[0] >> 8, j = 0; /* two ids a word, inline (m is small) */
		for (r += 1 + nw; j + 2 <= m; j += 2)
			memcpy(out + j, r + j / 2, 2 * sizeof(*out));
		if (j < m)
			memcpy(out + j, r + j / 2, sizeof(*out));
		return m;
	}
	size_t m = encode_piece(t, w, l, out);
	size_t need = 1 + nw + (m + 1) / 2;
	if (c->used * 2 >= mask || c->top + need > CACHE_ARENA) {
		cache_clear(c);
		for (i = h & mask; c->slots[i].tag; i = (i + 1) & mask)
			;
		sl = &c->slots[i];
	}
	uint64_t *r = c->arena + c->top;
	r[0] = l | m << 8;
	memcpy(r + 1, wd, nw * sizeof(*wd));
	r[nw + (m + 1) / 2] = 0; /* the pad of an odd count */
	memcpy(r + 1 + nw, out, m * sizeof(*out));
	sl->tag = tag;
	sl->rec = (uint32_t)c->top;
	c->top += need;
	c->used++;
	return m;
}

static size_t encode_cached_plain(const struct tokenizer *t, struct tok_cache *c,
				  const void *text, size_t len, uint32_t *out)
{
	if (t->spm)
		return spm_encode(t, t->spm, c, text, len, 1, out);
	const unsigned char *s = text;
	size_t pos = 0, nout = 0;
	if (t->rx)
		return encode_regex(t, c, s, len, out);
	while (pos < len) {
		size_t l = t->next(s + pos, len - pos);
		nout += encode_cached_piece(t, c, s + pos, l, s + len, out + nout);
		pos += l;
	}
	return nout;
}

/* ---- added tokens and NFC (TOK_SPLIT_ADDED, TOK_NFC) ---- */

size_t tokenizer_max_ids(const struct tokenizer *t, size_t len)
{
	return st_add(st_mult(len, t->ids_mult), t->ids_extra);
}

/* s[0..n) between added tokens: normalized (NFC, unless it is already
 * normal: the quick check), pre-tokenized and merged; c may be NULL. A
 * SentencePiece-style tokenizer normalizes each stretch as Hugging Face
 * does (a Prepend on each, Metaspace's "first" only on the one at the start
 * of the text: first). */
static size_t encode_segment(const struct tokenizer *t, struct tok_cache *c,
			     const unsigned char *s, size_t n, int first, struct buf *tmp,
			     uint32_t *out)
{
	if (t->spm)
		return spm_encode(t, t->spm, c, s, n, first, out);
	if ((t->flags & TOK_NFC) && !utf8_is_nfc_quick((const char *)s, n)) {
		tmp->len = 0;
		buf_reserve(tmp, UTF8_NFC_MAX(n));
		tmp->len = utf8_nfc((const char *)s, n, (char *)tmp->data, UTF8_NFC_MAX(n));
		s = tmp->data, n = tmp->len;
	}
	return c ? encode_cached_plain(t, c, s, n, out) : encode_plain(t, s, n, out);
}

/* Hugging Face's order: the added tokens out of the raw text first, then
 * each stretch between them apart. */
static size_t encode_full(const struct tokenizer *t, struct tok_cache *c, const void *text,
			  size_t len, uint32_t *out)
{
	const unsigned char *s = text;
	struct buf tmp = {0};
	size_t pos = 0, nout = 0;
	while (pos < len) {
		size_t at = len - pos, k = 0;
		uint32_t id = 0;
		if (t->added)
			k = added_tokens_find(t->added, s + pos, len - pos, &at, &id);
		if (at)
			nout += encode_segment(t, c, s + pos, at, !pos, &tmp, out + nout);
		if (k)
			out[nout++] = id;
		pos += at + k;
	}
	buf_free(&tmp);
	return nout;
}

size_t tokenizer_split_point(const struct tokenizer *t, const void *text, size_t len,
			     size_t target)
{
	/* a cut is right after a '\n': inside an added token only if one holds
	 * a '\n' before its end; NFC keeps the text on each side apart (a '\n'
	 * and an ASCII character compose with nothing) */
	if (t->added_nl)
		return len;
	return pretok_split_point_of(t->pretok, text, len, target);
}

size_t tokenizer_encode(const struct tokenizer *t, const void *text, size_t len, uint32_t *out)
{
	if (t->flags & (TOK_NFC | TOK_SPLIT_ADDED))
		return encode_full(t, NULL, text, len, out);
	return encode_plain(t, text, len, out);
}

size_t tokenizer_piece_cached(const struct tokenizer *t, struct tok_cache *c, const void *piece,
			      size_t l, const void *end, uint32_t *out)
{
	return encode_cached_piece(t, c, piece, l, end, out);
}

size_t tokenizer_encode_cached(const struct tokenizer *t, struct tok_cache *c,
			       const void *text, size_t len, uint32_t *out)
{
	if (t->flags & (TOK_NFC | TOK_SPLIT_ADDED))
		return encode_full(t, c, text, len, out);
	return encode_cached_plain(t, c, text, len, out);
}

int tokenizer_decode(const struct tokenizer *t, const uint32_t *ids, size_t n, int flags,
		     struct buf *out)
{
	for (size_t i = 0; i < n && t->spm; i++)
		if (ids[i] >= t->vocab)
			return error("token id %u out of range (vocabulary %u)", ids[i], t->vocab);
	if (t->spm) {
		spm_decode(t, t->spm, ids, n, flags & TOK_DECODE_SKIP_SPECIAL,
			   !(flags & TOK_DECODE_CONTINUE), out);
		return 0;
	}
	for (size_t i = 0; i < n; i++) {
		uint32_t id = ids[i];
		if (id >= t->vocab)
			return error("token id %u out of range (vocabulary %u)", id, t->vocab);
		if ((flags & TOK_DECODE_SKIP_SPECIAL) && t->is_special[id])
			continue;
		buf_append(out, t->bytes + t->off[id], t->lens[id]);
	}
	return 0;
}

/* Print bytes as a C-like quoted string. */
static void print_quoted(FILE *out, const unsigned char *p, size_t n)
{
	fputc('"', out);
	for (size_t i = 0; i < n; i++) {
		unsigned c = p[i];
		if (c == '"' || c == '\\')
			fprintf(out, "\\%c", c);
		else if (c == '\n')
			fputs("\\n", out);
		else if (c == '\t')
			fputs("\\t", out);
		else if (c < 0x20 || c >= 0x7f)
			fprintf(out, "\\x%02x", c);
		else
			fputc(c, out);
	}
	fputc('"', out);
}

/* The Split regex kind: one line per step of the chain, in order; a
 * control character in a regex as its escape (\r, \n, \t, \xHH), which
 * the regex reads the same. */
static void print_split_chain(FILE *out, const struct tokenizer *t)
{
	struct split_step st[SPLIT_MAX_STEPS];
	size_t k = 0;
	tokenizer_split_chain(t, st, &k); /* tok_init read them */
	for (size_t i = 0; i < k; i++) {
		fputs(i ? "                then Split regex " : "pre-tokenizer:  Split regex ", out);
		for (size_t j = 0; j < st[i].n; j++) {
			unsigned char c = (unsigned char)st[i].re[j];
			if (c == '\r' || c == '\n' || c == '\t')
				fputs(c == '\r' ? "\\r" : c == '\n' ? "\\n" : "\\t", out);
			else if (c < 0x20 || c == 0x7f)
				fprintf(out, "\\x%02x", c);
			else
				fputc(c, out);
		}
		fprintf(out, " (%s%s; PCRE2)\n", split_behavior_name(st[i].behavior),
			st[i].invert ? ", inverted" : "");
	}
}

int tokenizer_inspect(const char *path, FILE *out)
{
	struct buf b = {0};
	struct tokenizer *t;
	if (read_file(path, &b))
		return -1;
	if (tokenizer_load_mem(&t, b.data, b.len, path)) {
		buf_free(&b);
		return -1;
	}
	fprintf(out, "%s: asyncpp tokenizer, format version %u, %zu bytes\n", path,
		get_le32(b.data + 8), b.len);
	if (t->flags & TOK_SPM)
		fprintf(out, "vocabulary:     %u tokens (%u special; %u merges)\n", t->vocab,
			t->nspecial, t->nmerges);
	else if (t->flags & TOK_IGNORE_MERGES) /* several merges may make one token */
		fprintf(out, "vocabulary:     %u tokens (256 bytes, %u special; %u merges, whole "
			"pieces taken first)\n", t->vocab, t->nspecial, t->nmerges);
	else
		fprintf(out, "vocabulary:     %u tokens (256 bytes, %u merges, %u special)\n",
			t->vocab, t->nmerges, t->nspecial);
	if (t->spm) {
		struct buf d = {0};
		spm_describe(t->spm, &d);
		fwrite(d.data, 1, d.len, out);
		buf_free(&d);
	} else if (t->pretok == PRETOK_GPT2)
		fprintf(out, "pre-tokenizer:  GPT-2 pattern (Unicode %s tables)\n",
			unicode_tables_version);
	else if (t->pretok == PRETOK_GPT2_DIGITS)
		fprintf(out, "pre-tokenizer:  digits apart, then GPT-2 pattern (SmolLM's; "
			"Unicode %s tables)\n", unicode_tables_version);
	else if (t->pretok == PRETOK_SPLIT_REGEX)
		print_split_chain(out, t);
	else if (t->pretok == PRETOK_QWEN)
		fprintf(out, "pre-tokenizer:  qwen pattern (cl100k's with single digits; Unicode %s "
			"tables)\n", unicode_tables_version);
	else
		fprintf(out, "pre-tokenizer:  %s pattern (tiktoken's; Unicode %s tables)\n",
			pretok_kind_name(t->pretok), unicode_tables_version);
	if (t->flags & TOK_NFC)
		fprintf(out, "normalizer:     NFC (Unicode %s tables)\n", unicode_nfc_version);
	if (t->flags & TOK_SPLIT_ADDED)
		fprintf(out, "special tokens: found in the text first (Hugging Face's encode)\n");
	if (t->flags & TOK_IGNORE_MERGES)
		fprintf(out, "BPE:            ignore_merges (a pre-token that is a token is taken "
			"whole; Hugging Face's merges)\n");
	fprintf(out, "token bytes:    %" PRIu64 "\n", t->off[t->vocab]);
	uint32_t longest = 0;
	for (uint32_t i = 0; i < t->vocab; i++)
		if (!t->is_special[i] && t->lens[i] > t->lens[longest])
			longest = i;
	fprintf(out, "longest token:  %u (%u bytes) ", longest, t->lens[longest]);
	print_quoted(out, t->bytes + t->off[longest], t->lens[longest]);
	fputc('\n', out);
	uint32_t unused = 0;
	for (uint32_t i = 0; i < t->nspecial; i++) {
		uint32_t id = t->special[i];
		static const char filler[] = "<|unused_"; /* tiktoken's unused ids */
		if (t->lens[id] > sizeof(filler) - 1 &&
		    !memcmp(t->bytes + t->off[id], filler, sizeof(filler) - 1)) {
			unused++;
			continue;
		}
		fprintf(out, "special token:  %u ", id);
		print_quoted(out, t->bytes + t->off[id], t->lens[id]);
		fprintf(out, "%s\n", id != t->eot ? ""
				     : (t->flags & TOK_DOC_TEMPLATE) ? " (before each document: "
				     "TemplateProcessing)" : " (end of text)");
	}
	if (unused)
		fprintf(out, "unused ids:     %u (special tokens <|unused_ID|>)\n", unused);
	for (uint32_t r = 0; r < t->nmerges && r < 5; r++) {
		const uint32_t *m = t->merges[r];
		fprintf(out, "merge %-8u %u ", r, m[0]);
		print_quoted(out, t->bytes + t->off[m[0]], t->lens[m[0]]);
		fprintf(out, " + %u ", m[1]);
		print_quoted(out, t->bytes + t->off[m[1]], t->lens[m[1]]);
		fprintf(out, " -> %u\n", m[2]);
	}
	fprintf(out, "hash:           %016" PRIx64 "\n", t->hash);
	fprintf(out, "checksum:       crc32c %08x ok\n", get_le32(b.data + b.len - 4));
	tokenizer_free(t);
	buf_free(&b);
	return 0;
}
