/* test_split_chain.c - a chain of Splits (io/text/regex_split.h): its
 * parameters' two layouts (one Split as files before chains wrote it) and
 * their corruptions, each step splitting the pieces of the one before
 * apart, and a match that runs out of PCRE2's limits counted, never
 * silent. The ids against Hugging Face's: tests/scripts/tokenizer_split_chain.sh. */
#include <stdlib.h>
#include <string.h>

#include "../../io/text/regex_split.h"
#include "../../io/util.h"
#include "../test.h"

TEST(split_params_one_step_keeps_the_old_layout)
{
	struct split_step st = {"\\s+", 3, SPLIT_MERGED_WITH_NEXT, 1}, got[SPLIT_MAX_STEPS];
	struct buf b = {0};
	split_params_put(&b, &st, 1);
	static const unsigned char old[] = {3, 0, 0, 0, 1, 0, 0, 0, '\\', 's', '+'};
	CHECK(b.len == sizeof(old) && !memcmp(b.data, old, sizeof(old)));
	size_t k = 0;
	CHECK(split_params_get(b.data, b.len, got, &k, "t") == 0);
	CHECK(k == 1 && got[0].n == 3 && !memcmp(got[0].re, "\\s+", 3) &&
	      got[0].behavior == SPLIT_MERGED_WITH_NEXT && got[0].invert == 1);
	buf_free(&b);
}

TEST(split_params_chain_round_trip_and_corruptions)
{
	struct split_step st[3] = {{"\\p{N}{1,3}", 10, SPLIT_ISOLATED, 0},
				   {"", 0, SPLIT_REMOVED, 1},
				   {"^a", 2, SPLIT_CONTIGUOUS, 0}};
	struct split_step got[SPLIT_MAX_STEPS];
	struct buf b = {0};
	split_params_put(&b, st, 3);
	size_t k = 0;
	CHECK(split_params_get(b.data, b.len, got, &k, "t") == 0 && k == 3);
	for (size_t i = 0; i < 3 && k == 3; i++)
		CHECK(got[i].n == st[i].n && !memcmp(got[i].re, st[i].re, st[i].n) &&
		      got[i].behavior == st[i].behavior && got[i].invert == st[i].invert);
	set_error_quiet(1);
	CHECK(split_params_get(b.data, b.len - 1, got, &k, "t") == -1); /* truncated */
	struct buf more = {0};
	buf_append(&more, b.data, b.len);
	buf_append(&more, "x", 1);
	CHECK(split_params_get(more.data, more.len, got, &k, "t") == -1); /* bytes after */
	unsigned char *p = more.data;
	put_le32(p + 4, 1); /* a chain of one: the other layout's */
	CHECK(split_params_get(p, b.len, got, &k, "t") == -1);
	put_le32(p + 4, SPLIT_MAX_STEPS + 1);
	CHECK(split_params_get(p, b.len, got, &k, "t") == -1);
	put_le32(p + 4, 3);
	put_le32(p + 8, SPLIT_NBEHAVIORS); /* the first step's behavior */
	CHECK(split_params_get(p, b.len, got, &k, "t") == -1);
	put_le32(p + 8, 0);
	put_le32(p + 16, 0xffffffffu); /* its length past the end */
	CHECK(split_params_get(p, b.len, got, &k, "t") == -1);
	CHECK(split_params_get(p, 7, got, &k, "t") == -1);
	set_error_quiet(0);
	buf_free(&b);
	buf_free(&more);
}

/* The pieces of s under the chain st[0..k), joined with '|'. */
static void pieces(const struct split_step *st, size_t k, const char *s, char *out)
{
	struct regex_split *rx;
	struct split_piece *p = NULL;
	size_t cap = 0;
	out[0] = 0;
	if (regex_split_new_chain(&rx, st, k, "t"))
		return;
	size_t n = regex_split_pieces(rx, (const unsigned char *)s, strlen(s), &p, &cap);
	for (size_t i = 0; i < n; i++) {
		if (i)
			strcat(out, "|");
		strncat(out, s + p[i].start, p[i].end - p[i].start);
	}
	free(p);
	regex_split_free(rx);
}

TEST(split_chain_steps_see_a_piece_alone)
{
	if (!regex_split_available())
		return;
	char out[256];
	/* ^ in the second step matches at every piece's start */
	struct split_step a[2] = {{"[0-9]", 5, SPLIT_ISOLATED, 0}, {"^t", 2, SPLIT_ISOLATED, 0}};
	pieces(a, 2, "tat1tot", out);
	CHECK_MSG(!strcmp(out, "t|at|1|t|ot"), "got '%s'", out);
	/* lookbehind stops at a piece's start; Removed drops text */
	struct split_step b[2] = {{" ", 1, SPLIT_REMOVED, 0}, {"(?<=a)b", 7, SPLIT_ISOLATED, 0}};
	pieces(b, 2, "ab a bab", out);
	CHECK_MSG(!strcmp(out, "a|b|a|ba|b"), "got '%s'", out);
	struct split_step c[2] = {{"a", 1, SPLIT_ISOLATED, 0}, {"(?<=a)b", 7, SPLIT_REMOVED, 0}};
	pieces(c, 2, "abab", out); /* "b" is a piece of its own: no 'a' before it to remove it */
	CHECK_MSG(!strcmp(out, "a|b|a|b"), "got '%s'", out);
}

TEST(split_match_limit_is_counted)
{
	if (!regex_split_available())
		return;
	struct split_step st = {"(a+)+$", 6, SPLIT_ISOLATED, 0};
	struct regex_split *rx;
	CHECK(regex_split_new_chain(&rx, &st, 1, "t") == 0);
	char s[64];
	memset(s, 'a', 40);
	strcpy(s + 40, "!");
	struct split_piece *p = NULL;
	size_t cap = 0, step = 9;
	CHECK(regex_split_failures(rx, &step) == 0);
	regex_split_pieces(rx, (const unsigned char *)"aa\n", 3, &p, &cap);
	CHECK(regex_split_failures(rx, &step) == 0); /* a short run matches */
	regex_split_pieces(rx, (const unsigned char *)s, strlen(s), &p, &cap);
	CHECK(regex_split_failures(rx, &step) == 1 && step == 0);
	free(p);
	regex_split_free(rx);
}
