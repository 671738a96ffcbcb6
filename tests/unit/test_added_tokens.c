/* test_added_tokens.c - io/text/added_tokens.c against its definition (Hugging
 * Face's AddedVocabulary: at the leftmost place where any token occurs, the
 * longest that occurs there), by brute force on random texts over a small
 * alphabet with tokens that are prefixes of each other and overlap. */
#include <string.h>

#include "../../io/text/added_tokens.h"
#include "../../io/text/tokenizer.h"
#include "../../io/util.h"
#include "../test.h"

TEST(added_tokens_leftmost_longest)
{
	static const char *tok[] = {"<|", "<|a|>", "<|ab|>", "a|>", "b", "ab", "<", "|>|"};
	enum { NT = sizeof(tok) / sizeof(tok[0]) };
	const unsigned char *s[NT];
	uint32_t ids[NT], len[NT];
	for (uint32_t i = 0; i < NT; i++)
		s[i] = (const unsigned char *)tok[i], len[i] = (uint32_t)strlen(tok[i]), ids[i] = 100 + i;
	struct added_tokens *a = added_tokens_new(NT, ids, s, len);
	uint64_t st = 3;
	unsigned char text[64];
	for (int iter = 0; iter < 3000; iter++) {
		size_t n = rng_next(&st) % sizeof(text);
		for (size_t i = 0; i < n; i++)
			text[i] = (unsigned char)"<|ab>x"[rng_next(&st) % 6];
		size_t at, want_at = n, want_len = 0;
		uint32_t id = 0, want_id = 0;
		for (size_t i = 0; i < n && !want_len; i++) /* the definition */
			for (uint32_t k = 0; k < NT; k++)
				if (len[k] <= n - i && !memcmp(text + i, s[k], len[k]) && len[k] > want_len)
					want_at = i, want_len = len[k], want_id = ids[k];
		size_t got = added_tokens_find(a, text, n, &at, &id);
		CHECK_MSG(got == want_len && at == want_at && (!got || id == want_id),
			  "'%.*s': found %zu bytes at %zu (id %u), wanted %zu at %zu (id %u)", (int)n,
			  text, got, at, id, want_len, want_at, want_id);
	}
	added_tokens_free(a);
	/* none: nothing found, *at is the length */
	struct added_tokens *e = added_tokens_new(0, NULL, NULL, NULL);
	size_t at;
	uint32_t id;
	CHECK(added_tokens_find(e, (const unsigned char *)"abc", 3, &at, &id) == 0 && at == 3);
	added_tokens_free(e);
}

/* A tokenizer of the 256 bytes and the special tokens names[n] with flags. */
static struct tokenizer *bytes_and(const char *const *names, uint32_t n, uint32_t flags)
{
	uint32_t lens[256 + 8], special[8];
	struct buf b = {0};
	for (int i = 0; i < 256; i++) {
		unsigned char c = (unsigned char)i;
		buf_append(&b, &c, 1);
		lens[i] = 1;
	}
	for (uint32_t i = 0; i < n; i++) {
		buf_append(&b, names[i], strlen(names[i]));
		lens[256 + i] = (uint32_t)strlen(names[i]);
		special[i] = 256 + i;
	}
	struct tokenizer *t = NULL;
	if (tokenizer_build_flags(&t, 256 + n, lens, b.data, 0, NULL, n, special, TOKENIZER_NO_ID,
				  flags))
		t = NULL;
	buf_free(&b);
	return t;
}

/* tokenize encode cuts large texts at tokenizer_split_point: never inside an
 * added token, and with NFC and added tokens the pieces give the whole's ids */
TEST(split_point_keeps_added_tokens_whole)
{
	static const char *const nl[] = {"<x\ny>"}, *const plain[] = {"<x>", "y\n"};
	struct tokenizer *a = bytes_and(nl, 1, TOK_SPLIT_ADDED | TOK_NFC);
	struct tokenizer *b = bytes_and(plain, 2, TOK_SPLIT_ADDED | TOK_NFC);
	CHECK(a && b);
	const char *text = "ab <x\ny> e\xcc\x81\nyz <x>\nyq\nr";
	size_t n = strlen(text);
	CHECK(tokenizer_split_point(a, text, n, 0) == n); /* "<x\ny>" could straddle any cut */
	size_t p = tokenizer_split_point(b, text, n, 0);
	CHECK(p > 0 && p < n);
	uint32_t whole[3 * 64], parts[3 * 64];
	CHECK(tokenizer_max_ids(b, n) == 3 * n);
	size_t k = tokenizer_encode(b, text, n, whole);
	size_t k1 = tokenizer_encode(b, text, p, parts);
	size_t k2 = tokenizer_encode(b, text + p, n - p, parts + k1);
	CHECK(k == k1 + k2 && !memcmp(whole, parts, k * sizeof(*whole)));
	/* e + U+0301 composed (2 bytes) */
	struct buf out = {0};
	CHECK(!tokenizer_decode(b, whole, k, 0, &out));
	CHECK(out.len == n - 1 && !memcmp(out.data, "ab <x\ny> \xc3\xa9\nyz <x>\nyq\nr", out.len));
	buf_free(&out);
	tokenizer_free(a);
	tokenizer_free(b);
}
