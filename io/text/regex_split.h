/* regex_split.h - Hugging Face's Split pre-tokenizer with any regex, through
 * PCRE2 (JIT, UTF and Unicode properties), for tokenizer.json files whose
 * Split regex has no hand-written scanner (pretok.h).
 *
 * Split cuts text at the regex's matches (leftmost, as Oniguruma's find_iter
 * walks them; an empty match is a piece of no bytes), optionally inverted
 * (the matches and the text between swap roles), and then by behavior:
 * Removed drops the matches, Isolated keeps each match a piece, MergedWith-
 * Previous / MergedWithNext join a match to the piece before / after,
 * Contiguous joins runs of matches (and runs of non-matches). Pieces of no
 * bytes are dropped. (tokenizers' src/normalizer.rs, NormalizedString::split.)
 *
 * Hugging Face's regexes are Oniguruma's, Ruby syntax: ^ and $ match at
 * every line, (?m) is PCRE2's (?s). Patterns using what PCRE2 reads
 * otherwise are refused (see regex_split_check). A byte that is not UTF-8
 * never matches (PCRE2_MATCH_INVALID_UTF), so it falls between matches.
 */
#ifndef ASYNCPP_REGEX_SPLIT_H
#define ASYNCPP_REGEX_SPLIT_H

#include <stddef.h>
#include <stdint.h>

/* Split behaviors, as stored in the tokenizer file (never renumbered). */
enum split_behavior {
	SPLIT_REMOVED = 0,
	SPLIT_ISOLATED = 1,
	SPLIT_MERGED_WITH_PREVIOUS = 2,
	SPLIT_MERGED_WITH_NEXT = 3,
	SPLIT_CONTIGUOUS = 4,
	SPLIT_NBEHAVIORS
};
/* Hugging Face's name of a behavior ("Removed", ...), or NULL */
const char *split_behavior_name(uint32_t b);
/* the behavior named name, or -1 */
int split_behavior_parse(const char *name);

struct regex_split;

/* Whether this asyncpp was built with PCRE2. */
int regex_split_available(void);

/* Compile pattern[0..n) for splitting with behavior and invert. Returns 0,
 * or -1 after error() naming where (a prefix for the message, e.g. the file
 * and JSON path): a syntax PCRE2 refuses (with its message and offset), a
 * construct that Oniguruma reads otherwise, or no PCRE2 in this build. */
int regex_split_new(struct regex_split **rx, const char *pattern, size_t n, uint32_t behavior,
		    int invert, const char *where);
void regex_split_free(struct regex_split *rx);

/* The pieces of s[0..n): (start, end) byte offsets in order into *pieces
 * (grown with xrealloc, *cap its room); returns their count. With Removed
 * the pieces need not cover the text. Thread-safe on a shared rx. */
struct split_piece {
	size_t start, end;
};
size_t regex_split_pieces(const struct regex_split *rx, const unsigned char *s, size_t n,
			  struct split_piece **pieces, size_t *cap);

/* Whether the pieces always cover the text (every behavior but Removed). */
int regex_split_lossless(const struct regex_split *rx);

#endif
