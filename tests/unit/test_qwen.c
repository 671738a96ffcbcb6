/* test_qwen.c - Qwen's pre-tokenizer (PRETOK_QWEN) against its definition:
 * cl100k's pattern with \p{N} in place of \p{N}{1,3}, so its pieces are
 * cl100k's with each number piece cut into its characters (the number
 * alternative competes with no other). The ids against Hugging Face's
 * tokenizers: tests/scripts/tokenizer_qwen.sh. */
#include <string.h>

#include "../../io/text/pretok.h"
#include "../../io/util.h"
#include "../test.h"

static int is_number_piece(const unsigned char *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		uint32_t cp;
		size_t l = utf8_decode(s + i, n - i, &cp);
		if (!l || unicode_gc(cp) != GC_NUMBER)
			return 0;
		i += l;
	}
	return 1;
}

TEST(pretok_qwen_is_cl100k_with_single_digits)
{
	static const char *alpha[] = {"a", "B", "the", " ", "  ", "\n", "\r\n", "'s", "'LL", "1",
				      "42", "9999", ".", "!?", "\t", "\xc3\xa9", "\xc2\xbd",
				      "\xc2\xb2", "\xd9\xa3", "\xe2\x85\xab", "\xff", "\xc3", " 7",
				      "x\nY", "\n7", "\xe3\x80\x80", "\xcc\x81", "\xe4\xb8\xad"};
	uint64_t st = 11;
	unsigned char buf[1500];
	CHECK(pretok_next_of(PRETOK_QWEN) == pretok_next_qwen);
	CHECK(!strcmp(pretok_kind_name(PRETOK_QWEN), "qwen") && pretok_kind_parse("qwen") ==
	      PRETOK_QWEN);
	for (int iter = 0; iter < 400; iter++) {
		size_t n = 1 + rng_next(&st) % sizeof(buf), i = 0;
		while (i < n) {
			const char *a = alpha[rng_next(&st) % ARRAY_SIZE(alpha)];
			for (size_t k = 0; a[k] && i < n; k++)
				buf[i++] = (unsigned char)a[k];
		}
		size_t q = 0; /* qwen's position, which must follow cl100k's pieces */
		for (size_t c = 0; c < n;) {
			size_t l = pretok_next_cl100k(buf + c, n - c);
			if (is_number_piece(buf + c, l)) {
				for (size_t j = c; j < c + l;) {
					uint32_t cp;
					size_t cl = utf8_decode(buf + j, n - j, &cp);
					CHECK_MSG(pretok_next_qwen(buf + q, n - q) == cl,
						  "iteration %d: at %zu a digit piece", iter, q);
					q += cl, j += cl;
				}
			} else {
				CHECK_MSG(pretok_next_qwen(buf + q, n - q) == l,
					  "iteration %d: at %zu qwen's piece is not cl100k's", iter, q);
				q += l;
			}
			c += l;
		}
	}
	/* a cut that pretok_split_point_of allows splits nothing apart */
	const char *t = "ab 123\nx9 c\n\nd\n7y";
	size_t n = strlen(t), p = pretok_split_point_of(PRETOK_QWEN, (const unsigned char *)t, n, 0);
	CHECK(p == 7);
}
