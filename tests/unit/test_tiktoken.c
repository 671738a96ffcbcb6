/* test_tiktoken.c - the cl100k and o200k pre-tokenizers, the tokenizer file's
 * pre-tokenizer section (format version 2), and the .tiktoken reader. The ids
 * against tiktoken itself: tests/scripts/tokenizer_tiktoken.sh. */
#include <stdlib.h>
#include <string.h>

#include "../../io/text/pretok.h"
#include "../../io/text/tokenizer.h"
#include "../../io/util.h"
#include "../test.h"

/* Pieces of s under kind, joined with '|'. */
static void split(uint32_t kind, const char *s, char *out)
{
	pretok_next_fn next = pretok_next_of(kind);
	size_t n = strlen(s), pos = 0;
	out[0] = 0;
	while (pos < n) {
		size_t l = next((const unsigned char *)s + pos, n - pos);
		if (pos)
			strcat(out, "|");
		strncat(out, s + pos, l);
		pos += l;
	}
}

TEST(pretok_cl100k_pattern)
{
	static const char *cases[][2] = {
		{"Hello world", "Hello| world"},
		{"HELLO'S I'll 'Re", "HELLO|'S| I|'ll| '|Re"},
		{"x'\xc5\xbf", "x|'\xc5\xbf"}, /* (?i)'s takes the long s */
		{"12345678", "123|456|78"},
		{"a  b", "a| | b"},
		{"x\r\n\r\n  y", "x|\r\n\r\n| | y"},
		{"a/\n/b", "a|/\n|/b"},
		{"end  ", "end|  "},
		{"\t\tx", "\t|\tx"},
		{"XMLHttpRequest", "XMLHttpRequest"},
		/* न म स ् त े: the marks are not \p{L} */
		{"\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87",
		 "\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8|\xe0\xa5\x8d\xe0\xa4\xa4|\xe0\xa5\x87"},
		{"a\xc2\x85" "b", "a|\xc2\x85" "b"}, /* U+0085 is \s here, unlike JavaScript */
		{" !!! ??\n\nz", " !!!| ??\n\n|z"},
		{"a\xff\xfe b", "a|\xff\xfe| b"},
	};
	char got[256];
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		split(PRETOK_CL100K, cases[i][0], got);
		CHECK_MSG(!strcmp(got, cases[i][1]), "cl100k: '%s' split as '%s', expected '%s'",
			  cases[i][0], got, cases[i][1]);
	}
}

TEST(pretok_o200k_pattern)
{
	static const char *cases[][2] = {
		{"Hello world", "Hello| world"},
		{"HELLO'S world's", "HELLO'S| world's"},
		{"XMLHttpRequest camelCase", "XMLHttp|Request| camel|Case"},
		{"a/\n/b", "a|/\n/|b"},
		{"12345678", "123|456|78"},
		{"x\r\n\r\n  y", "x|\r\n\r\n| | y"},
		/* marks join both letter classes: one piece */
		{"\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87",
		 "\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87"},
		/* Dž (Lt) is upper: "Džungla" is [Upper][Lower]+ */
		{"\xc7\x85ungla ABC", "\xc7\x85ungla| ABC"},
		{"'s", "'s"},
		{" !!! ??\n\nz", " !!!| ??\n\n|z"},
	};
	char got[256];
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		split(PRETOK_O200K, cases[i][0], got);
		CHECK_MSG(!strcmp(got, cases[i][1]), "o200k: '%s' split as '%s', expected '%s'",
			  cases[i][0], got, cases[i][1]);
	}
}

TEST(pretok_kinds_lossless_and_split_points)
{
	static const char *alpha[] = {"a", "B", "e", "the", " ", "  ", "\n", "\n\n", "'s", "'LL",
				      "1", "42", ".", "/", "\t", "\xc3\xa9", "\xc7\x85", "\xe4\xbd\xa0",
				      "\xf0\x9f\x91\x8b", "\xcc\x81", "\xff", "\xc3", "\x80", "'",
				      "\r\n", "x\nY", "x\n/", ".\n\nZ", " \nQ", "\xc2\x85", "\n7"};
	uint64_t st = 11;
	unsigned char buf[3000];
	for (uint32_t kind = PRETOK_CL100K; kind <= PRETOK_O200K; kind++) {
		pretok_next_fn next = pretok_next_of(kind);
		for (int iter = 0; iter < 200; iter++) {
			size_t n = 1 + rng_next(&st) % sizeof(buf), i = 0;
			while (i < n) {
				const char *a = alpha[rng_next(&st) % ARRAY_SIZE(alpha)];
				for (size_t k = 0; a[k] && i < n; k++)
					buf[i++] = (unsigned char)a[k];
			}
			size_t whole[3000], nwhole = 0, parts[3000], nparts = 0, pos;
			for (pos = 0; pos < n;) {
				size_t l = next(buf + pos, n - pos);
				CHECK(l >= 1 && l <= n - pos);
				whole[nwhole++] = pos += l;
			}
			/* cutting at split points gives exactly the same pieces */
			for (size_t start = 0, at = 0; start < n; start = at) {
				at = pretok_split_point_of(kind, buf, n, at + 1 + rng_next(&st) % 64);
				for (pos = start; pos < at;)
					parts[nparts++] = pos += next(buf + pos, at - pos);
			}
			CHECK_MSG(nwhole == nparts && !memcmp(whole, parts, nwhole * sizeof(size_t)),
				  "%s: pieces differ after cutting at split points",
				  pretok_kind_name(kind));
		}
	}
}

static void b64(struct buf *out, const unsigned char *p, size_t n)
{
	static const char al[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	for (size_t i = 0; i < n; i += 3) {
		unsigned w = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0) |
			     (i + 2 < n ? p[i + 2] : 0);
		char q[4] = {al[w >> 18], al[(w >> 12) & 63], i + 1 < n ? al[(w >> 6) & 63] : '=',
			     i + 2 < n ? al[w & 63] : '='};
		buf_append(out, q, 4);
	}
}

/* A rank file: the 256 bytes (ranks 0..255 in byte order), then extra[]
 * with ranks from 256. */
static void rank_file(struct buf *out, const char *const *extra, size_t nextra)
{
	char line[32];
	for (int b = 0; b < 256 + (int)nextra; b++) {
		unsigned char c = (unsigned char)b;
		if (b < 256)
			b64(out, &c, 1);
		else
			b64(out, (const unsigned char *)extra[b - 256], strlen(extra[b - 256]));
		buf_append(out, line, (size_t)snprintf(line, sizeof(line), " %d\n", b));
	}
}

static const char *const extra[] = {"ab", "  ", "abc", "cd", "abcd"};

TEST(tiktoken_import_small)
{
	struct buf f = {0};
	rank_file(&f, extra, ARRAY_SIZE(extra));
	const char *names[] = {"<|endoftext|>", "<|x|>"};
	const uint32_t ids[] = {262, 264};
	struct tokenizer *t;
	CHECK(!tiktoken_import_mem(&t, f.data, f.len, "small", PRETOK_CL100K, 2, names, ids));
	CHECK(tokenizer_vocab_size(t) == 265 && tokenizer_nmerges(t) == 5);
	CHECK(tokenizer_eot_id(t) == 262 && tokenizer_pretok(t) == PRETOK_CL100K);
	/* 261 and 263: no rank or special token has them */
	size_t l;
	const unsigned char *p = tokenizer_token(t, 263, &l);
	CHECK(tokenizer_is_special(t, 261) && l == 14 && !memcmp(p, "<|unused_263|>", 14));
	uint32_t m[3];
	tokenizer_merge(t, 4, m); /* abcd: BPE on its bytes ends in abc + d */
	CHECK_MSG(m[0] == 258 && m[1] == 'd' && m[2] == 260, "abcd = %u + %u", m[0], m[1]);
	uint32_t out[32];
	size_t n = tokenizer_encode(t, "abcd abc", 8, out);
	CHECK_MSG(n == 3 && out[0] == 260 && out[1] == ' ' && out[2] == 258,
		  "%zu ids: %u %u %u", n, out[0], out[1], out[2]);
	/* the file holds the kind */
	struct buf ser = {0};
	tokenizer_serialize(t, &ser);
	CHECK(get_le32(ser.data + 8) == 2);
	struct tokenizer *back;
	CHECK(!tokenizer_load_mem(&back, ser.data, ser.len, "ser"));
	CHECK(tokenizer_pretok(back) == PRETOK_CL100K &&
	      tokenizer_hash(back) == tokenizer_hash(t));
	tokenizer_free(back);
	/* GPT-2's kind is still written as version 1 */
	uint64_t h2 = tokenizer_hash(t);
	CHECK(!tokenizer_set_pretok(t, PRETOK_GPT2));
	CHECK(tokenizer_hash(t) != h2);
	ser.len = 0;
	tokenizer_serialize(t, &ser);
	CHECK(get_le32(ser.data + 8) == 1);
	CHECK(!tokenizer_load_mem(&back, ser.data, ser.len, "ser") &&
	      tokenizer_pretok(back) == PRETOK_GPT2);
	tokenizer_free(back);
	buf_free(&ser);
	tokenizer_free(t);
	buf_free(&f);
}

/* Re-seal a tokenizer file after an edit: hash, then crc. */
static void reseal(struct buf *b)
{
	uint64_t hash = fnv1a64(FNV1A64_INIT, b->data + 8, 32);
	hash = fnv1a64(hash, b->data + 48, b->len - 4 - 48);
	put_le64(b->data + 40, hash);
	put_le32(b->data + b->len - 4, crc32c(0, b->data, b->len - 4));
}

TEST(tokenizer_v2_section_rejects)
{
	struct buf f = {0}, ser = {0};
	rank_file(&f, extra, 2);
	struct tokenizer *t, *back;
	CHECK(!tiktoken_import_mem(&t, f.data, f.len, "small", PRETOK_O200K, 0, NULL, NULL));
	tokenizer_serialize(t, &ser);
	size_t sec = ser.len - 4 - 12;
	set_error_quiet(1);
	put_le32(ser.data + sec + 4, 77);
	reseal(&ser);
	CHECK(tokenizer_load_mem(&back, ser.data, ser.len, "k") &&
	      strstr(last_error(), "unknown pre-tokenizer kind 77"));
	put_le32(ser.data + sec + 4, PRETOK_GPT2); /* written as version 1 */
	reseal(&ser);
	CHECK(tokenizer_load_mem(&back, ser.data, ser.len, "k") &&
	      strstr(last_error(), "written as version 1"));
	put_le32(ser.data + sec + 4, PRETOK_O200K);
	put_le32(ser.data + sec, 2);
	reseal(&ser);
	CHECK(tokenizer_load_mem(&back, ser.data, ser.len, "k") &&
	      strstr(last_error(), "chain of 2 steps"));
	put_le32(ser.data + sec, 1);
	put_le32(ser.data + sec + 8, 5);
	reseal(&ser);
	CHECK(tokenizer_load_mem(&back, ser.data, ser.len, "k") &&
	      strstr(last_error(), "parameters"));
	/* version 2 without its section */
	put_le32(ser.data + sec + 8, 0);
	ser.len -= 12;
	put_le32(ser.data + sec, 0); /* the crc's place */
	reseal(&ser);
	CHECK(tokenizer_load_mem(&back, ser.data, ser.len, "k") &&
	      strstr(last_error(), "pre-tokenizer section"));
	put_le32(ser.data + 8, 3);
	reseal(&ser);
	CHECK(tokenizer_load_mem(&back, ser.data, ser.len, "k") &&
	      strstr(last_error(), "version 3"));
	set_error_quiet(0);
	tokenizer_free(t);
	buf_free(&ser);
	buf_free(&f);
}

/* The rank file with line `at` (1-based) replaced by text (NULL: deleted). */
static int import_edited(size_t at, const char *text, uint32_t nspecial,
			 const char *const *names, const uint32_t *ids)
{
	struct buf f = {0}, g = {0};
	rank_file(&f, extra, ARRAY_SIZE(extra));
	size_t line = 1;
	for (size_t i = 0; i < f.len;) {
		const unsigned char *nl = memchr(f.data + i, '\n', f.len - i);
		size_t l = (size_t)(nl - (f.data + i)) + 1;
		if (line++ != at)
			buf_append(&g, f.data + i, l);
		else if (text)
			buf_append(&g, text, strlen(text));
		i += l;
	}
	struct tokenizer *t = NULL;
	set_error_quiet(1);
	int rc = tiktoken_import_mem(&t, g.data, g.len, "r.tiktoken", PRETOK_CL100K, nspecial,
				     names, ids);
	set_error_quiet(0);
	tokenizer_free(t);
	buf_free(&f);
	buf_free(&g);
	return rc;
}

TEST(tiktoken_reader_rejects)
{
	CHECK(!import_edited(0, NULL, 0, NULL, NULL));
	CHECK(import_edited(258, "YW*j 257\n", 0, NULL, NULL) &&
	      strstr(last_error(), "r.tiktoken:258: the token is not valid base64"));
	CHECK(import_edited(258, "YWJ 257\n", 0, NULL, NULL) &&
	      strstr(last_error(), "r.tiktoken:258: the token is not valid base64"));
	CHECK(import_edited(258, "ICA=257\n", 0, NULL, NULL) &&
	      strstr(last_error(), "r.tiktoken:258: expected 'BASE64 RANK'"));
	CHECK(import_edited(258, "ICA= 25x\n", 0, NULL, NULL) &&
	      strstr(last_error(), "r.tiktoken:258: the rank is not a decimal"));
	CHECK(import_edited(258, "ICA= 256\n", 0, NULL, NULL) &&
	      strstr(last_error(), "r.tiktoken:258: rank 256 repeats line 257's"));
	CHECK(import_edited(258, "YWI= 257\n", 0, NULL, NULL) &&
	      strstr(last_error(), "r.tiktoken:258: the token of rank 257 repeats line 257's"));
	CHECK(import_edited(258, "ICA= 999\n", 0, NULL, NULL) &&
	      strstr(last_error(), "r.tiktoken:258: rank 999, but rank 257 is missing"));
	CHECK(import_edited(258, "ICA= 99999999\n", 0, NULL, NULL) &&
	      strstr(last_error(), "r.tiktoken:258: rank too large"));
	/* a token past 1024 bytes: its merges would cost the square of its length */
	char longtok[1500];
	memset(longtok, 'Y', 1368); /* base64 of 1026 bytes */
	strcpy(longtok + 1368, " 257\n");
	CHECK(import_edited(258, longtok, 0, NULL, NULL) &&
	      strstr(last_error(), "r.tiktoken:258: a token of more than 1024 bytes"));
	memset(longtok, 'Y', 1364); /* 1023 bytes: read (then refused as no merge) */
	strcpy(longtok + 1364, " 257\n");
	CHECK(import_edited(258, longtok, 0, NULL, NULL) &&
	      !strstr(last_error(), "more than 1024 bytes"));
	CHECK(import_edited(66, NULL, 0, NULL, NULL) && strstr(last_error(), "rank 65 is missing"));
	CHECK(import_edited(66, "YWJjZGU= 65\n", 0, NULL, NULL) &&
	      strstr(last_error(), "no token for the byte 0x41"));
	/* "xyz": neither "xy" nor "yz" is a token */
	CHECK(import_edited(258, "eHl6 257\n", 0, NULL, NULL) &&
	      strstr(last_error(), "r.tiktoken:258: the token of rank 257 is not the merge"));
	const char *names[] = {"<|a|>", "<|b|>"};
	const uint32_t low[] = {270, 3}, same[] = {300, 300};
	CHECK(import_edited(0, NULL, 2, names, low) && strstr(last_error(), "<|b|> has id 3"));
	CHECK(import_edited(0, NULL, 2, names, same) && strstr(last_error(), "both have id 300"));
	struct tokenizer *t;
	set_error_quiet(1);
	CHECK(tiktoken_import_mem(&t, "", 0, "e", PRETOK_CL100K, 0, NULL, NULL) &&
	      strstr(last_error(), "0 tokens"));
	CHECK(tiktoken_import_mem(&t, "", TIKTOKEN_MAX_BYTES + 1, "h", PRETOK_CL100K, 0, NULL,
				  NULL) &&
	      strstr(last_error(), "at most 256 MiB"));
	set_error_quiet(0);
}

TEST(tiktoken_count_and_export_refused)
{
	static const char ranks[] = "a 0\n\nb 1\r\n\r\nc 2";
	CHECK(tiktoken_count_ranks(ranks, sizeof(ranks) - 1) == 3); /* 18 read past it (ASan) */
	CHECK(tiktoken_count_ranks("", 0) == 0 && tiktoken_count_ranks("\n\n", 2) == 0);
	/* tokenizer.json holds only GPT-2's pre-tokenizer so far: refused, not
	 * written with the wrong one */
	struct buf f = {0};
	rank_file(&f, extra, 2);
	struct tokenizer *t;
	CHECK(!tiktoken_import_mem(&t, f.data, f.len, "small", PRETOK_O200K, 0, NULL, NULL));
	char dir[600];
	snprintf(dir, sizeof(dir), "%s/hf", test_tmpdir());
	set_error_quiet(1);
	CHECK(hf_tokenizer_write(t, dir, 0, 64) == -1 && strstr(last_error(), "o200k"));
	set_error_quiet(0);
	tokenizer_free(t);
	buf_free(&f);
}
