/* test_spm.c - SentencePiece-style BPE (io/text/spm.h): the encoder against
 * a plain implementation of Hugging Face's algorithm (normalize, characters
 * or their byte-fallback tokens, then the lowest-rank leftmost merge until
 * none applies, over the whole text), the cut before '▁' it makes for speed,
 * decoding, and the tokenizer file's version 3 (round trip, refusals). The
 * ids against Hugging Face's tokenizers: tests/scripts/tokenizer_spm_families.sh. */
#include <stdlib.h>
#include <string.h>

#include "../../io/text/pretok.h"
#include "../../io/text/spm.h"
#include "../../io/text/tokenizer.h"
#include "../../io/util.h"
#include "../test.h"

#define META "\xe2\x96\x81"

/* <unk> <s> </s>, <0x00>..<0xFF>, then chars[], then one token per merge */
static const char *const chars[] = {META, "a", "b", "\xc3\xa9", "c"};
#define NCHARS 5
#define BASE (3 + 256)

struct toy {
	struct buf bytes;
	uint32_t lens[BASE + NCHARS + 64];
	uint32_t merges[64][3];
	char str[BASE + NCHARS + 64][64];
	uint32_t V, M;
};

static void add_token(struct toy *t, const char *s)
{
	strcpy(t->str[t->V], s);
	t->lens[t->V++] = (uint32_t)strlen(s);
	buf_append(&t->bytes, s, strlen(s));
}

static long find(const struct toy *t, const char *s)
{
	for (uint32_t i = 0; i < t->V; i++)
		if (!strcmp(t->str[i], s))
			return i;
	return -1;
}

/* A random toy vocabulary: up to nm merges of random pairs (no token holds
 * '▁' after another character unless meta_inside) */
static void toy_make(struct toy *t, uint64_t *st, int nm, int meta_inside)
{
	memset(t, 0, sizeof(*t));
	add_token(t, "<unk>");
	add_token(t, "<s>");
	add_token(t, "</s>");
	for (int b = 0; b < 256; b++) {
		char s[8];
		snprintf(s, sizeof(s), "<0x%02X>", b);
		add_token(t, s);
	}
	for (int i = 0; i < NCHARS; i++)
		add_token(t, chars[i]);
	for (int k = 0; k < 4 * nm && (int)t->M < nm; k++) {
		uint32_t a = BASE + (uint32_t)(rng_next(st) % (t->V - BASE));
		uint32_t b = BASE + (uint32_t)(rng_next(st) % (t->V - BASE));
		char cat[64];
		size_t la = strlen(t->str[a]), lb = strlen(t->str[b]);
		if (la + lb >= sizeof(cat))
			continue;
		memcpy(cat, t->str[a], la);
		memcpy(cat + la, t->str[b], lb + 1);
		const char *m = strstr(cat + 1, META);
		int bad = 0;
		for (; m; m = strstr(m + 1, META))
			if (m - cat < 3 || memcmp(m - 3, META, 3)) /* after another character */
				bad = 1;
		if ((bad && !meta_inside) || find(t, cat) >= 0)
			continue;
		int dup = 0;
		for (uint32_t r = 0; r < t->M; r++)
			dup |= t->merges[r][0] == a && t->merges[r][1] == b;
		if (dup)
			continue;
		add_token(t, cat);
		t->merges[t->M][0] = a;
		t->merges[t->M][1] = b;
		t->merges[t->M][2] = t->V - 1;
		t->M++;
	}
}

static struct tokenizer *toy_build(struct toy *t, uint32_t flags, uint32_t kind,
				   const struct spm_params *p)
{
	struct tokenizer *tok;
	uint32_t special[3] = {0, 1, 2};
	if (tokenizer_build_spm(&tok, t->V, t->lens, t->bytes.data, t->M,
				(const uint32_t(*)[3])t->merges, 3, special, 2, TOK_SPM | flags, kind, p))
		return NULL;
	return tok;
}

static struct spm_params llama_params(void)
{
	struct spm_params p;
	memset(&p, 0, sizeof(p));
	p.nnorm = 2;
	p.norm[0] = (struct spm_norm){.kind = NORM_PREPEND, .alen = 3};
	memcpy(p.norm[0].a, META, 3);
	p.norm[1] = (struct spm_norm){.kind = NORM_REPLACE, .alen = 1, .blen = 3};
	p.norm[1].a[0] = ' ';
	memcpy(p.norm[1].b, META, 3);
	p.prepend = META_NEVER;
	p.meta_cp = SPM_META_DEFAULT;
	p.decode_strip = 1;
	p.unk = 0;
	return p;
}

/* The plain algorithm on the whole normalized text: strings, merged by the
 * lowest rank, leftmost first. */
static size_t plain_encode(const struct toy *t, const char *text, uint32_t *out)
{
	char norm[4096] = META;
	size_t n = 3;
	for (const char *c = text; *c; c++) {
		if (*c == ' ')
			memcpy(norm + n, META, 3), n += 3;
		else
			norm[n++] = *c;
	}
	uint32_t sym[4096];
	size_t k = 0;
	for (size_t i = 0; i < n;) {
		uint32_t cp;
		size_t l = utf8_decode((const unsigned char *)norm + i, n - i, &cp);
		char one[8] = {0};
		memcpy(one, norm + i, l ? l : 1);
		long id = l ? find(t, one) : -1;
		if (id >= 0 && id >= BASE)
			sym[k++] = (uint32_t)id;
		else
			for (size_t j = 0; j < (l ? l : 1); j++)
				sym[k++] = 3 + (unsigned char)norm[i + j];
		i += l ? l : 1;
	}
	for (;;) {
		uint32_t best = UINT32_MAX;
		size_t at = 0;
		for (size_t i = 0; i + 1 < k; i++)
			for (uint32_t r = 0; r < t->M && r < best; r++)
				if (t->merges[r][0] == sym[i] && t->merges[r][1] == sym[i + 1])
					best = r, at = i;
		if (best == UINT32_MAX)
			break;
		sym[at] = t->merges[best][2];
		memmove(sym + at + 1, sym + at + 2, (k - at - 2) * sizeof(*sym));
		k--;
	}
	memcpy(out, sym, k * sizeof(*sym));
	return k;
}

static void random_text(uint64_t *st, char *buf, size_t cap)
{
	static const char *const alpha[] = {"a", "b", "c", " ", "  ", "\xc3\xa9", "x", META, "\n"};
	size_t n = 0, len = 1 + rng_next(st) % 60;
	buf[0] = 0;
	for (size_t i = 0; i < len; i++) {
		const char *a = alpha[rng_next(st) % ARRAY_SIZE(alpha)];
		if (n + strlen(a) + 1 >= cap)
			break;
		strcpy(buf + n, a);
		n += strlen(a);
	}
}

TEST(spm_encode_is_plain_bpe_over_the_whole_text)
{
	uint64_t st = 7;
	for (int v = 0; v < 40; v++) {
		struct toy t;
		toy_make(&t, &st, 40, v & 1);
		struct spm_params p = llama_params();
		struct tokenizer *tok = toy_build(&t, TOK_BYTE_FALLBACK | TOK_FUSE_UNK, PRETOK_SPM, &p);
		CHECK_MSG(tok != NULL, "%s", last_error());
		if (!tok)
			continue;
		struct tok_cache *c = tok_cache_new(tok);
		for (int it = 0; it < 60; it++) {
			char text[512];
			uint32_t want[4096], got[4096], cached[4096];
			random_text(&st, text, sizeof(text));
			size_t n = strlen(text), nw = plain_encode(&t, text, want);
			size_t ng = tokenizer_encode(tok, text, n, got);
			size_t nc = tokenizer_encode_cached(tok, c, text, n, cached);
			CHECK(ng <= tokenizer_max_ids(tok, n));
			CHECK_MSG(ng == nw && !memcmp(got, want, ng * 4), "vocabulary %d: '%s'", v, text);
			CHECK(nc == ng && !memcmp(cached, got, ng * 4));
			/* decode gives the text back (it holds no '▁' of its own) */
			if (!strstr(text, META)) {
				struct buf d = {0};
				CHECK(tokenizer_decode(tok, got, ng, 0, &d) == 0);
				CHECK_MSG(d.len == n && !memcmp(d.data, text, n), "decoded '%.*s' for '%s'",
					  (int)d.len, (char *)d.data, text);
				buf_free(&d);
			}
		}
		tok_cache_free(c);
		tokenizer_free(tok);
		buf_free(&t.bytes);
	}
}

/* Fix the identity hash and checksum of a tokenizer file after an edit. */
static void reseal(struct buf *f)
{
	uint64_t h = fnv1a64(FNV1A64_INIT, f->data + 8, 32);
	h = fnv1a64(h, f->data + 48, f->len - 4 - 48);
	put_le64(f->data + 40, h);
	put_le32(f->data + f->len - 4, crc32c(0, f->data, f->len - 4));
}

TEST(spm_file_round_trip_and_refusals)
{
	uint64_t st = 3;
	struct toy t;
	toy_make(&t, &st, 20, 0);
	struct spm_params p = llama_params();
	struct tokenizer *tok = toy_build(&t, TOK_BYTE_FALLBACK, PRETOK_SPM, &p), *u;
	CHECK(tok != NULL);
	struct buf f = {0}, g = {0};
	tokenizer_serialize(tok, &f);
	CHECK(get_le32(f.data + 8) == 3);
	CHECK(tokenizer_load_mem(&u, f.data, f.len, "mem") == 0);
	tokenizer_serialize(u, &g);
	CHECK(g.len == f.len && !memcmp(g.data, f.data, f.len));
	CHECK(tokenizer_hash(u) == tokenizer_hash(tok));
	CHECK(tokenizer_spm(u) && tokenizer_spm(u)->nnorm == 2 && tokenizer_spm(u)->unk == 0);
	tokenizer_free(u);
	/* the normalizer kinds: NFC takes no strings, 9 is unknown */
	set_error_quiet(1);
	/* the parameters: nnorm = 2, then Prepend (kind 1) of 3 bytes */
	size_t params = 0;
	for (size_t i = f.len - 16; i > 48 && !params; i--) /* the last section */
		if (get_le32(f.data + i) == 2 && get_le32(f.data + i + 4) == NORM_PREPEND &&
		    get_le32(f.data + i + 8) == 3)
			params = i;
	CHECK(params > 0);
	memcpy(g.data, f.data, f.len);
	put_le32(g.data + params + 4, NORM_NFC);
	reseal(&g);
	CHECK_MSG(tokenizer_load_mem(&u, g.data, g.len, "mem") == -1 &&
		  strstr(last_error(), "normalizer 0 (NFC) with strings: file is corrupt"), "%s",
		  last_error());
	put_le32(g.data + params + 4, 9);
	reseal(&g);
	CHECK(tokenizer_load_mem(&u, g.data, g.len, "mem") == -1 &&
	      strstr(last_error(), "unknown kind 9"));
	/* version 3 must be SentencePiece-style, and such a tokenizer version 3 */
	memcpy(g.data, f.data, f.len);
	put_le32(g.data + 8, 2);
	reseal(&g);
	CHECK(tokenizer_load_mem(&u, g.data, g.len, "mem") == -1 &&
	      strstr(last_error(), "version 2 with flags"));
	/* a truncated parameter section */
	memcpy(g.data, f.data, f.len);
	put_le32(g.data + params - 4, get_le32(g.data + params - 4) - 4);
	memmove(g.data + f.len - 8, g.data + f.len - 4, 4);
	g.len = f.len - 4;
	reseal(&g);
	CHECK(tokenizer_load_mem(&u, g.data, g.len, "mem") == -1);
	set_error_quiet(0);
	buf_free(&f);
	buf_free(&g);
	tokenizer_free(tok);
	buf_free(&t.bytes);
}

TEST(spm_metaspace_split_and_prepend)
{
	uint64_t st = 1;
	struct toy t;
	toy_make(&t, &st, 0, 0);
	/* merges ▁+▁ (rank 0) and ▁+a */
	uint32_t m = BASE, a = BASE + 1;
	add_token(&t, META META);
	t.merges[0][0] = m, t.merges[0][1] = m, t.merges[0][2] = t.V - 1;
	add_token(&t, META "a");
	t.merges[1][0] = m, t.merges[1][1] = a, t.merges[1][2] = t.V - 1;
	t.M = 2;
	struct spm_params p;
	memset(&p, 0, sizeof(p));
	p.meta_cp = SPM_META_DEFAULT;
	p.unk = TOKENIZER_NO_ID;
	uint32_t ids[16];
	for (int split = 0; split < 2; split++) {
		p.split = (uint32_t)split;
		p.prepend = META_FIRST;
		struct tokenizer *tok = toy_build(&t, TOK_BYTE_FALLBACK, PRETOK_METASPACE, &p);
		CHECK(tok != NULL);
		/* "  a": "▁▁a", which starts with '▁': nothing prepended */
		size_t n = tokenizer_encode(tok, "  a", 3, ids);
		if (split)
			CHECK(n == 2 && ids[0] == m && ids[1] == BASE + NCHARS + 1);
		else
			CHECK(n == 2 && ids[0] == BASE + NCHARS && ids[1] == a);
		/* "a": "▁a" */
		CHECK(tokenizer_encode(tok, "a", 1, ids) == 1 && ids[0] == BASE + NCHARS + 1);
		tokenizer_free(tok);
	}
	p.prepend = META_NEVER;
	p.split = 0;
	struct tokenizer *tok = toy_build(&t, TOK_BYTE_FALLBACK, PRETOK_METASPACE, &p);
	CHECK(tokenizer_encode(tok, "a", 1, ids) == 1 && ids[0] == a);
	tokenizer_free(tok);
	buf_free(&t.bytes);
}

/* A Replace whose content is no token (bytes that fall back) gives more ids
 * than the text has bytes: the bound says so, and the encoder keeps to it. */
TEST(spm_max_ids_bounds_a_lengthening_replace)
{
	uint64_t st = 5;
	struct toy t;
	toy_make(&t, &st, 0, 0);
	struct spm_params p = llama_params();
	p.norm[1] = (struct spm_norm){.kind = NORM_REPLACE, .alen = 1, .blen = 2};
	p.norm[1].a[0] = 'a';
	memcpy(p.norm[1].b, "\xc9\x90", 2); /* U+0250, no token: two byte tokens */
	struct tokenizer *tok = toy_build(&t, TOK_BYTE_FALLBACK, PRETOK_SPM, &p);
	CHECK(tok != NULL);
	uint32_t ids[64];
	size_t n = tokenizer_encode(tok, "aaaa", 4, ids);
	CHECK(n == 9 && ids[0] == BASE && ids[1] == 3 + 0xc9 && ids[2] == 3 + 0x90);
	CHECK(n <= tokenizer_max_ids(tok, 4));
	tokenizer_free(tok);
	/* Llama 2's shape with '▁' a token: at most len + 2 */
	p = llama_params();
	tok = toy_build(&t, TOK_BYTE_FALLBACK, PRETOK_SPM, &p);
	CHECK(tokenizer_max_ids(tok, 100) == 102);
	tokenizer_free(tok);
	buf_free(&t.bytes);
}
