/* test_hf_families.c - SmolLM's pre-tokenizer (digits apart, then GPT-2's
 * pattern) against its definition, and the ignore_merges flag of the
 * tokenizer file. The ids against Hugging Face's tokenizers:
 * tests/scripts/tokenizer_hf_families.sh. */
#include <stdlib.h>
#include <string.h>

#include "../../io/text/pretok.h"
#include "../../io/text/tokenizer.h"
#include "../../io/util.h"
#include "../test.h"

/* length of the numeric character at s[0..n), or 0 */
static size_t numeric_at(const unsigned char *s, size_t n)
{
	uint32_t cp;
	size_t l = utf8_decode(s, n, &cp);
	return l && unicode_class(cp) == UC_NUMBER ? l : 0;
}

TEST(pretok_gpt2_digits_is_digits_then_gpt2)
{
	static const char *alpha[] = {"a", "B", "the", " ", "  ", "\n", "\n\n", "'s", "1", "42",
				      ".", "\t", "\xc3\xa9", "\xc2\xbd" /* ½ */, "\xc2\xb2" /* ² */,
				      "\xd9\xa3" /* ٣ */, "\xe2\x85\xab" /* Ⅻ */, "\xff", "\xc3",
				      " 7", "x\nY", "\n7", "\xe3\x80\x80"};
	uint64_t st = 5;
	unsigned char buf[2000];
	pretok_next_fn next = pretok_next_of(PRETOK_GPT2_DIGITS);
	CHECK(next == pretok_next_gpt2_digits);
	CHECK(!strcmp(pretok_kind_name(PRETOK_GPT2_DIGITS), "gpt2_digits"));
	for (int iter = 0; iter < 300; iter++) {
		size_t n = 1 + rng_next(&st) % sizeof(buf), i = 0;
		while (i < n) {
			const char *a = alpha[rng_next(&st) % ARRAY_SIZE(alpha)];
			for (size_t k = 0; a[k] && i < n; k++)
				buf[i++] = (unsigned char)a[k];
		}
		/* the definition: each numeric character a piece, GPT-2's pieces of
		 * the text between */
		size_t want[2000], nwant = 0, got[2000], ngot = 0, parts[2000], nparts = 0;
		for (size_t pos = 0; pos < n;) {
			size_t l = numeric_at(buf + pos, n - pos), end = pos;
			if (l) {
				want[nwant++] = pos += l;
				continue;
			}
			while (end < n && !numeric_at(buf + end, n - end))
				end++;
			while (pos < end)
				want[nwant++] = pos += pretok_next(buf + pos, end - pos);
		}
		for (size_t pos = 0; pos < n;) {
			size_t l = next(buf + pos, n - pos);
			CHECK(l >= 1 && l <= n - pos);
			got[ngot++] = pos += l;
		}
		CHECK_MSG(ngot == nwant && !memcmp(got, want, ngot * sizeof(size_t)),
			  "iteration %d: pieces differ from Digits then GPT-2's", iter);
		/* cutting at split points gives exactly the same pieces */
		for (size_t start = 0, at = 0; start < n; start = at) {
			at = pretok_split_point_of(PRETOK_GPT2_DIGITS, buf, n,
						   at + 1 + rng_next(&st) % 64);
			for (size_t pos = start; pos < at;)
				parts[nparts++] = pos += next(buf + pos, at - pos);
		}
		CHECK(nparts == ngot && !memcmp(parts, got, ngot * sizeof(size_t)));
	}
}

/* bytes, then "yz" (y z), "xy" (x y), "xyz" (xy z) and with alias "xyz"
 * again (x yz); <|endoftext|> last */
static int build(struct tokenizer **t, int alias, uint32_t flags)
{
	static const char *extra[] = {"yz", "xy", "xyz"};
	uint32_t lens[260], merges[4][3] = {{'y', 'z', 256}, {'x', 'y', 257}, {257, 'z', 258},
					    {'x', 256, 258}};
	struct buf bytes = {0};
	for (int b = 0; b < 256; b++) {
		unsigned char c = (unsigned char)b;
		buf_append(&bytes, &c, 1);
		lens[b] = 1;
	}
	for (int k = 0; k < 3; k++) {
		buf_append(&bytes, extra[k], strlen(extra[k]));
		lens[256 + k] = (uint32_t)strlen(extra[k]);
	}
	buf_append(&bytes, TOKENIZER_EOT, strlen(TOKENIZER_EOT));
	lens[259] = (uint32_t)strlen(TOKENIZER_EOT);
	uint32_t special = 259;
	int rc = tokenizer_build_flags(t, 260, lens, bytes.data, 3 + (uint32_t)alias,
				       (const uint32_t(*)[3])merges, 1, &special, 259, flags);
	buf_free(&bytes);
	return rc;
}

TEST(ignore_merges_flag)
{
	struct tokenizer *t, *u;
	uint32_t ids[16];
	set_error_quiet(1);
	/* a second merge making a token needs the flag */
	CHECK(build(&t, 1, 0) == -1);
	CHECK(build(&t, 0, 0x80) == -1 && strstr(last_error(), "unknown flags 0x80"));
	set_error_quiet(0);
	CHECK(build(&t, 0, 0) == 0);
	CHECK(tokenizer_encode(t, "xyz", 3, ids) == 2 && ids[0] == 'x' && ids[1] == 256);
	tokenizer_free(t);
	CHECK(build(&t, 0, TOK_IGNORE_MERGES) == 0);
	CHECK(tokenizer_encode(t, "xyz", 3, ids) == 1 && ids[0] == 258);
	CHECK(tokenizer_encode(t, "xyzy", 4, ids) == 3 && ids[1] == 256);
	struct tok_cache *c = tok_cache_new(t);
	CHECK(tokenizer_encode_cached(t, c, "xyz\nxyz", 7, ids) == 3 && ids[0] == 258 &&
	      ids[2] == 258);
	tok_cache_free(c);
	/* the flag is in the file and its hash */
	struct buf f = {0};
	tokenizer_serialize(t, &f);
	CHECK(tokenizer_load_mem(&u, f.data, f.len, "mem") == 0);
	CHECK(tokenizer_flags(u) == TOK_IGNORE_MERGES && tokenizer_hash(u) == tokenizer_hash(t));
	tokenizer_free(u);
	struct tokenizer *plain;
	CHECK(build(&plain, 0, 0) == 0);
	CHECK(tokenizer_hash(plain) != tokenizer_hash(t));
	tokenizer_free(plain);
	tokenizer_free(t);
	buf_free(&f);
	/* "xyzz" is no token: yz merges, then only the second merge x + yz
	 * makes xyz (without it: x, yz, z) */
	CHECK(build(&t, 0, TOK_IGNORE_MERGES) == 0);
	CHECK(tokenizer_encode(t, "xyzz", 4, ids) == 3 && ids[0] == 'x' && ids[1] == 256);
	tokenizer_free(t);
	CHECK(build(&t, 1, TOK_IGNORE_MERGES) == 0);
	CHECK(tokenizer_encode(t, "xyz", 3, ids) == 1 && ids[0] == 258);
	CHECK(tokenizer_encode(t, "xyzz", 4, ids) == 2 && ids[0] == 258 && ids[1] == 'z');
	tokenizer_free(t);
}
