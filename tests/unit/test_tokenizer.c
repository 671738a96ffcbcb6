/* test_tokenizer.c - pre-tokenizer, BPE training, file format, round trips. */
#include <stdlib.h>
#include <string.h>

#include "../../io/text/pretok.h"
#include "../../io/text/tokenizer.h"
#include "../../io/util.h"
#include "../test.h"

size_t tokenizer_bpe_piece(const struct tokenizer *t, const void *s, size_t n, uint32_t *out,
			   int method);

static const char *corpus_files[] = {"animals.txt", "dialogues.txt", "garden.txt", "sea.txt",
				     "stories.txt", "town.txt"};

/* The built-in corpus, concatenated. */
static struct buf corpus(void)
{
	struct buf all = {0};
	for (size_t i = 0; i < ARRAY_SIZE(corpus_files); i++) {
		char name[64];
		snprintf(name, sizeof(name), "corpus/%s", corpus_files[i]);
		struct buf b = {0};
		if (!read_file(test_data(name), &b))
			buf_append(&all, b.data, b.len);
		buf_free(&b);
	}
	return all;
}

static struct tokenizer *train_corpus(uint32_t vocab)
{
	struct buf text = corpus();
	struct bpe_counter *c = bpe_counter_new();
	bpe_counter_add(c, text.data, text.len);
	struct tokenizer *tok = NULL;
	struct bpe_train_opts o = {.vocab_size = vocab};
	if (bpe_train(&tok, c, &o))
		tok = NULL;
	bpe_counter_free(c);
	buf_free(&text);
	return tok;
}

static void random_bytes(uint64_t *st, unsigned char *p, size_t n, int textlike)
{
	static const char *alpha[] = {"a", "b", "e", "the", " ", "  ", "\n", "\n\n", "'s", "'ll",
				      "1", "42", ".", ",", "!?", "\t", "é", "ß", "你", "👋",
				      "\xff", "\xc3", "\x80", "\xed\xa0\x80", "I", "'", "\r\n",
				      "x\nY", ".\n\nZ", " \nQ", "\xe3\x80\x80\nW", "\xc2\xa0\nk"};
	size_t i = 0;
	while (i < n) {
		if (!textlike) {
			p[i++] = (unsigned char)rng_next(st);
			continue;
		}
		const char *a = alpha[rng_next(st) % ARRAY_SIZE(alpha)];
		for (size_t k = 0; a[k] && i < n; k++)
			p[i++] = (unsigned char)a[k];
	}
}

TEST(utf8_decode_rejects_invalid)
{
	uint32_t cp;
	CHECK(utf8_decode((const unsigned char *)"A", 1, &cp) == 1 && cp == 'A');
	CHECK(utf8_decode((const unsigned char *)"\xc3\xa9", 2, &cp) == 2 && cp == 0xE9);
	CHECK(utf8_decode((const unsigned char *)"\xe2\x82\xac", 3, &cp) == 3 && cp == 0x20AC);
	CHECK(utf8_decode((const unsigned char *)"\xf4\x8f\xbf\xbf", 4, &cp) == 4 &&
	      cp == 0x10FFFF);
	CHECK(utf8_decode((const unsigned char *)"\xc0\x80", 2, &cp) == 0);     /* overlong */
	CHECK(utf8_decode((const unsigned char *)"\xe0\x80\x80", 3, &cp) == 0); /* overlong */
	CHECK(utf8_decode((const unsigned char *)"\xed\xa0\x80", 3, &cp) == 0); /* surrogate */
	CHECK(utf8_decode((const unsigned char *)"\xf4\x90\x80\x80", 4, &cp) == 0);
	CHECK(utf8_decode((const unsigned char *)"\xc3\xa9", 1, &cp) == 0);     /* truncated */
	CHECK(utf8_decode((const unsigned char *)"\x80", 1, &cp) == 0);
}

TEST(unicode_classes)
{
	CHECK(unicode_class('a') == UC_LETTER && unicode_class('7') == UC_NUMBER);
	CHECK(unicode_class(0xE9) == UC_LETTER);   /* é */
	CHECK(unicode_class(0x4F60) == UC_LETTER); /* 你 */
	CHECK(unicode_class(0xB2) == UC_NUMBER);   /* ² (No) */
	CHECK(unicode_class(0x216B) == UC_NUMBER); /* Ⅻ (Nl) */
	CHECK(unicode_class(0x663) == UC_NUMBER);  /* Arabic-Indic 3 */
	CHECK(unicode_class(0x3000) == UC_SPACE && unicode_class(0xA0) == UC_SPACE);
	CHECK(unicode_class(0xFEFF) == UC_SPACE);  /* JavaScript's \s */
	CHECK(unicode_class(0x85) == UC_OTHER && unicode_class(0x1C) == UC_OTHER);
	CHECK(unicode_class(0x301) == UC_OTHER);   /* combining acute (Mn) */
	CHECK(unicode_class(0x1F44B) == UC_OTHER); /* 👋 */
}

/* Pieces of s, joined with '|'. */
static void split(const char *s, char *out)
{
	size_t n = strlen(s), pos = 0;
	out[0] = 0;
	while (pos < n) {
		size_t l = pretok_next((const unsigned char *)s + pos, n - pos);
		if (pos)
			strcat(out, "|");
		strncat(out, s + pos, l);
		pos += l;
	}
}

TEST(pretok_gpt2_pattern)
{
	static const char *cases[][2] = {
		{"Hello world", "Hello| world"},
		{"I'll don't", "I|'ll| don|'t"},
		{"It'S", "It|'|S"},
		{"a  b", "a| | b"},
		{"a   \n\n  b", "a|   \n\n | b"},
		{"end  ", "end|  "},
		{"x\n", "x|\n"},
		{"\ny", "\n|y"},
		{"12345 3.14", "12345| 3|.|14"},
		{" !!! ??", " !!!| ??"},
		{"caf\xc3\xa9 na\xc3\xafve", "caf\xc3\xa9| na\xc3\xafve"},
		{"a\xff\xfe b", "a|\xff\xfe| b"},
		{"''s", "''|s"},
		{"a\t b", "a|\t| b"},
		{"x\xc2\xb2", "x|\xc2\xb2"},
	};
	char got[256];
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		split(cases[i][0], got);
		CHECK_MSG(!strcmp(got, cases[i][1]), "'%s' split as '%s', expected '%s'",
			  cases[i][0], got, cases[i][1]);
	}
}

TEST(pretok_lossless_and_split_points)
{
	uint64_t st = 7;
	unsigned char buf[3000];
	for (int iter = 0; iter < 200; iter++) {
		size_t n = 1 + rng_next(&st) % sizeof(buf);
		random_bytes(&st, buf, n, iter & 1);
		size_t pos = 0;
		while (pos < n) {
			size_t l = pretok_next(buf + pos, n - pos);
			CHECK(l >= 1 && l <= n - pos);
			pos += l;
		}
		/* cutting at split points gives exactly the same pieces */
		size_t cuts[8], nc = 0;
		for (size_t at = 0; nc < 8;) {
			at = pretok_split_point(buf, n, at + 1 + rng_next(&st) % 64);
			if (at >= n)
				break;
			cuts[nc++] = at;
		}
		size_t whole[3000], nwhole = 0, parts[3000], nparts = 0;
		for (pos = 0; pos < n;)
			whole[nwhole++] = pos += pretok_next(buf + pos, n - pos);
		for (size_t c = 0, start = 0; c <= nc; c++) {
			size_t end = c < nc ? cuts[c] : n;
			for (pos = start; pos < end;)
				parts[nparts++] = pos += pretok_next(buf + pos, end - pos);
			start = end;
		}
		CHECK_MSG(nwhole == nparts && !memcmp(whole, parts, nwhole * sizeof(size_t)),
			  "pieces differ after cutting at %zu points", nc);
	}
}

/* A plain reference trainer: recount every pair after every merge. */
TEST(train_matches_bruteforce)
{
	struct buf text = corpus();
	CHECK(text.len > 10000);
	/* unique words and counts */
	size_t nw = 0, cap = 0, *wn = NULL;
	uint32_t **ws = NULL;
	uint64_t *wc = NULL;
	for (size_t pos = 0; pos < text.len;) {
		size_t l = pretok_next(text.data + pos, text.len - pos);
		size_t k;
		for (k = 0; k < nw; k++) {
			if (wn[k] != l)
				continue;
			size_t j = 0;
			while (j < l && ws[k][j] == text.data[pos + j])
				j++;
			if (j == l)
				break;
		}
		if (k == nw) {
			if (nw == cap) {
				cap = cap ? 2 * cap : 256;
				ws = xrealloc(ws, cap * sizeof(*ws));
				wn = xrealloc(wn, cap * sizeof(*wn));
				wc = xrealloc(wc, cap * sizeof(*wc));
			}
			ws[nw] = xmalloc(l * sizeof(uint32_t));
			for (size_t j = 0; j < l; j++)
				ws[nw][j] = text.data[pos + j];
			wn[nw] = l;
			wc[nw++] = 0;
		}
		wc[k]++;
		pos += l;
	}
	const uint32_t V = 340, M = V - 257;
	uint32_t ref[340][2];
	uint64_t *pc = xcalloc((size_t)V * V, sizeof(uint64_t));
	for (uint32_t m = 0; m < M; m++) {
		memset(pc, 0, (size_t)V * V * sizeof(uint64_t));
		for (size_t k = 0; k < nw; k++)
			for (size_t j = 0; j + 1 < wn[k]; j++)
				pc[(size_t)ws[k][j] * V + ws[k][j + 1]] += wc[k];
		size_t best = 0;
		for (size_t p = 1; p < (size_t)V * V; p++)
			if (pc[p] > pc[best])
				best = p;
		uint32_t a = (uint32_t)(best / V), b = (uint32_t)(best % V), c = 256 + m;
		ref[m][0] = a;
		ref[m][1] = b;
		for (size_t k = 0; k < nw; k++) {
			size_t o = 0;
			for (size_t j = 0; j < wn[k];) {
				if (j + 1 < wn[k] && ws[k][j] == a && ws[k][j + 1] == b) {
					ws[k][o++] = c;
					j += 2;
				} else {
					ws[k][o++] = ws[k][j++];
				}
			}
			wn[k] = o;
		}
	}
	struct tokenizer *tok = train_corpus(V);
	CHECK(tok);
	CHECK(tokenizer_vocab_size(tok) == V && tokenizer_eot_id(tok) == V - 1);
	struct buf ser = {0};
	tokenizer_serialize(tok, &ser);
	size_t moff = 48 + 4 * (size_t)V + get_le64(ser.data + 32);
	for (uint32_t m = 0; m < M; m++) {
		uint32_t a = get_le32(ser.data + moff + 12 * m), b = get_le32(ser.data + moff + 12 * m + 4);
		CHECK_MSG(a == ref[m][0] && b == ref[m][1],
			  "merge %u: trainer (%u %u), reference (%u %u)", m, a, b, ref[m][0], ref[m][1]);
	}
	buf_free(&ser);
	tokenizer_free(tok);
	for (size_t k = 0; k < nw; k++)
		free(ws[k]);
	free(ws);
	free(wn);
	free(wc);
	free(pc);
	buf_free(&text);
}

TEST(train_deterministic_and_save_load)
{
	struct tokenizer *a = train_corpus(500), *b = train_corpus(500), *c;
	CHECK(a && b);
	CHECK(tokenizer_hash(a) == tokenizer_hash(b));
	char path[512];
	snprintf(path, sizeof(path), "%s/t.tok", test_tmpdir());
	CHECK(tokenizer_save(a, path) == 0);
	CHECK(tokenizer_load(&c, path) == 0);
	CHECK(tokenizer_hash(c) == tokenizer_hash(a));
	CHECK(tokenizer_vocab_size(c) == 500 && tokenizer_eot_id(c) == 499);
	size_t len;
	const unsigned char *p = tokenizer_token(c, 499, &len);
	CHECK(len == 13 && !memcmp(p, TOKENIZER_EOT, 13));
	struct buf x = {0}, y = {0};
	tokenizer_serialize(a, &x);
	tokenizer_serialize(c, &y);
	CHECK(x.len == y.len && !memcmp(x.data, y.data, x.len));
	FILE *fp = fopen("/dev/null", "w");
	CHECK(tokenizer_inspect(path, fp) == 0);
	fclose(fp);
	/* a different vocabulary has a different identity */
	struct tokenizer *d = train_corpus(501);
	CHECK(d && tokenizer_hash(d) != tokenizer_hash(a));
	tokenizer_free(a);
	tokenizer_free(b);
	tokenizer_free(c);
	tokenizer_free(d);
	buf_free(&x);
	buf_free(&y);
}

static void round_trip(struct tokenizer *tok, int textlike, uint64_t seed)
{
	uint64_t st = seed;
	struct tok_cache *cache = tok_cache_new(tok);
	unsigned char text[4096];
	uint32_t ids[4096], ids2[4096];
	for (int iter = 0; iter < 300; iter++) {
		size_t n = rng_next(&st) % sizeof(text);
		random_bytes(&st, text, n, textlike);
		size_t k = tokenizer_encode(tok, text, n, ids);
		size_t k2 = tokenizer_encode_cached(tok, cache, text, n, ids2);
		CHECK(k <= n && k == k2 && !memcmp(ids, ids2, k * sizeof(*ids)));
		for (size_t i = 0; i < k; i++)
			CHECK(ids[i] < tokenizer_vocab_size(tok) && !tokenizer_is_special(tok, ids[i]));
		struct buf out = {0};
		CHECK(tokenizer_decode(tok, ids, k, 0, &out) == 0);
		CHECK_MSG(out.len == n && !memcmp(out.data, text, n), "round trip differs (%zu bytes)",
			  n);
		buf_free(&out);
	}
	tok_cache_free(cache);
}

TEST(round_trip_random_bytes)
{
	struct tokenizer *tok = train_corpus(1000);
	CHECK(tok);
	round_trip(tok, 0, 1);
	round_trip(tok, 1, 2);
	tokenizer_free(tok);
}

TEST(encode_plain_text_has_no_specials)
{
	struct tokenizer *tok = train_corpus(400);
	CHECK(tok);
	uint32_t ids[64];
	size_t n = tokenizer_encode(tok, TOKENIZER_EOT, 13, ids);
	CHECK(n > 1);
	for (size_t i = 0; i < n; i++)
		CHECK(ids[i] != tokenizer_eot_id(tok));
	/* decode: an id beyond the vocabulary is an error; specials can be skipped */
	uint32_t bad[2] = {tokenizer_eot_id(tok), 400};
	struct buf out = {0};
	set_error_quiet(1);
	CHECK(tokenizer_decode(tok, bad, 2, 0, &out) == -1);
	set_error_quiet(0);
	out.len = 0;
	CHECK(tokenizer_decode(tok, bad, 1, TOK_DECODE_SKIP_SPECIAL, &out) == 0 && out.len == 0);
	buf_free(&out);
	tokenizer_free(tok);
}

TEST(scan_and_heap_bpe_agree)
{
	struct tokenizer *tok = train_corpus(2000);
	CHECK(tok);
	uint64_t st = 3;
	unsigned char text[600];
	uint32_t a[600], b[600];
	struct buf c = corpus();
	for (int iter = 0; iter < 400; iter++) {
		size_t n = 1 + rng_next(&st) % sizeof(text);
		if (iter % 3 == 0) {
			random_bytes(&st, text, n, 1);
		} else { /* slices of real text, with its spaces and punctuation */
			size_t at = rng_next(&st) % (c.len - n);
			memcpy(text, c.data + at, n);
		}
		size_t na = tokenizer_bpe_piece(tok, text, n, a, 0);
		size_t nb = tokenizer_bpe_piece(tok, text, n, b, 1);
		CHECK_MSG(na == nb && !memcmp(a, b, na * sizeof(*a)), "scan and heap differ, %zu bytes",
			  n);
	}
	/* a long run goes through the heap inside tokenizer_encode */
	static unsigned char run[100000];
	memset(run, '=', sizeof(run));
	static uint32_t ids[100000];
	size_t k = tokenizer_encode(tok, run, sizeof(run), ids);
	struct buf out = {0};
	CHECK(tokenizer_decode(tok, ids, k, 0, &out) == 0 && out.len == sizeof(run));
	buf_free(&out);
	buf_free(&c);
	tokenizer_free(tok);
}

/* Serialize tok, let edit() change it, and fix crc and hash afterwards when
 * refix is set, so that only the semantic checks can reject it. */
static int load_edited(struct tokenizer *tok, void (*edit)(struct buf *), int refix)
{
	struct buf b = {0};
	tokenizer_serialize(tok, &b);
	edit(&b);
	if (refix) {
		uint64_t h = fnv1a64(FNV1A64_INIT, b.data + 8, 32);
		h = fnv1a64(h, b.data + 48, b.len - 52);
		put_le64(b.data + 40, h);
		put_le32(b.data + b.len - 4, crc32c(0, b.data, b.len - 4));
	}
	struct tokenizer *t;
	set_error_quiet(1);
	int rc = tokenizer_load_mem(&t, b.data, b.len, "edited.tok");
	set_error_quiet(0);
	if (!rc)
		tokenizer_free(t);
	buf_free(&b);
	return rc;
}

static void edit_magic(struct buf *b) { b->data[0] = 'X'; }
static void edit_version(struct buf *b) { put_le32(b->data + 8, 3); }
static void edit_merge_range(struct buf *b)
{
	uint32_t V = get_le32(b->data + 16);
	size_t moff = 48 + 4 * (size_t)V + get_le64(b->data + 32);
	put_le32(b->data + moff + 4, V + 5);
}
static void edit_merge_order(struct buf *b)
{
	/* the first merge uses a token that only a later merge makes */
	uint32_t V = get_le32(b->data + 16);
	size_t moff = 48 + 4 * (size_t)V + get_le64(b->data + 32);
	put_le32(b->data + moff, 300);
}
static void edit_special(struct buf *b)
{
	put_le32(b->data + b->len - 8, get_le32(b->data + 16));
}
static void edit_nothing(struct buf *b) { (void)b; }

TEST(load_rejects_corruption)
{
	struct tokenizer *tok = train_corpus(320);
	CHECK(tok);
	CHECK(load_edited(tok, edit_nothing, 1) == 0);
	CHECK(load_edited(tok, edit_magic, 0) == -1 && strstr(last_error(), "bad magic"));
	CHECK(load_edited(tok, edit_version, 0) == -1 && strstr(last_error(), "version 3"));
	CHECK(load_edited(tok, edit_merge_range, 1) == -1 && strstr(last_error(), "out of range"));
	CHECK(load_edited(tok, edit_merge_order, 1) == -1);
	CHECK(load_edited(tok, edit_special, 1) == -1 && strstr(last_error(), "special"));
	struct buf b = {0};
	tokenizer_serialize(tok, &b);
	struct tokenizer *t;
	set_error_quiet(1);
	/* every truncation */
	for (size_t n = 0; n < b.len; n++) {
		int rc = tokenizer_load_mem(&t, b.data, n, "cut.tok");
		CHECK_MSG(rc == -1, "truncation to %zu bytes accepted", n);
	}
	/* every flipped byte */
	for (size_t i = 0; i < b.len; i++) {
		b.data[i] ^= 0x20;
		int rc = tokenizer_load_mem(&t, b.data, b.len, "flip.tok");
		b.data[i] ^= 0x20;
		CHECK_MSG(rc == -1, "flipped byte %zu accepted", i);
	}
	/* one byte more */
	buf_append(&b, "x", 1);
	CHECK(tokenizer_load_mem(&t, b.data, b.len, "long.tok") == -1);
	set_error_quiet(0);
	CHECK(strstr(last_error(), "long.tok"));
	buf_free(&b);
	tokenizer_free(tok);
}

TEST(inspect_reports_corruption)
{
	struct tokenizer *tok = train_corpus(300);
	CHECK(tok);
	char path[512];
	snprintf(path, sizeof(path), "%s/c.tok", test_tmpdir());
	CHECK(tokenizer_save(tok, path) == 0);
	FILE *fp = fopen(path, "r+b");
	CHECK(fp);
	fseek(fp, 100, SEEK_SET);
	fputc('!', fp);
	fclose(fp);
	FILE *out = fopen("/dev/null", "w");
	set_error_quiet(1);
	int rc = tokenizer_inspect(path, out);
	set_error_quiet(0);
	fclose(out);
	CHECK(rc == -1 && strstr(last_error(), "checksum"));
	tokenizer_free(tok);
}
