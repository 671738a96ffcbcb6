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

/* One Split of a chain: its regex pattern[0..n) (not owned), behavior and
 * invert. A pre_tokenizer Sequence of several Splits (DeepSeek-V3's) is a
 * chain: each step splits every piece the step before made, apart (Hugging
 * Face's PreTokenizedString: a piece's regex sees that piece alone, so ^, $
 * and lookaround stop at its ends). */
struct split_step {
	const char *re;
	size_t n;
	uint32_t behavior;
	int invert;
};
#define SPLIT_MAX_STEPS 16

/* The chain as the tokenizer file stores it (the Split regex kind's
 * parameters). One step: u32 behavior, u32 invert, the pattern (the layout
 * of files written before chains). Several: u32 SPLIT_CHAIN_TAG (not a
 * behavior, so the layouts never meet), u32 count, then per step u32
 * behavior, u32 invert, u32 pattern length, the pattern. split_params_put
 * appends st[0..k) to out; split_params_get reads p[0..n) into st (patterns
 * pointing into p) and *k: 0, or -1 after error() (prefixed by where) for a
 * corrupt layout. */
#define SPLIT_CHAIN_TAG 0x4E494843u /* "CHIN" */
struct buf;
void split_params_put(struct buf *out, const struct split_step *st, size_t k);
int split_params_get(const unsigned char *p, size_t n, struct split_step st[SPLIT_MAX_STEPS],
		     size_t *k, const char *where);

/* Whether this asyncpp was built with PCRE2. */
int regex_split_available(void);

/* Compile pattern[0..n) for splitting with behavior and invert. Returns 0,
 * or -1 after error() naming where (a prefix for the message, e.g. the file
 * and JSON path): a syntax PCRE2 refuses (with its message and offset), a
 * construct that Oniguruma reads otherwise, or no PCRE2 in this build. */
int regex_split_new(struct regex_split **rx, const char *pattern, size_t n, uint32_t behavior,
		    int invert, const char *where);
/* The chain st[0..k) (1 <= k <= SPLIT_MAX_STEPS), compiled; messages as
 * regex_split_new's, naming the step when k > 1. */
int regex_split_new_chain(struct regex_split **rx, const struct split_step *st, size_t k,
			  const char *where);
void regex_split_free(struct regex_split *rx);

/* The pieces of s[0..n): (start, end) byte offsets in order into *pieces
 * (grown with xrealloc, *cap its room); returns their count. With Removed
 * the pieces need not cover the text. Thread-safe on a shared rx. */
struct split_piece {
	size_t start, end;
};
size_t regex_split_pieces(const struct regex_split *rx, const unsigned char *s, size_t n,
			  struct split_piece **pieces, size_t *cap);

/* A match that ran into PCRE2's limits (match, depth, heap, memory) even
 * when retried with raised ones ends that text's matches there, and is
 * counted: the count so far (all threads), and in *step the step whose
 * regex failed last. Encoding with such a tokenizer must fail, never keep
 * the pieces (tokenizer_regex_failures). */
uint64_t regex_split_failures(const struct regex_split *rx, size_t *step);

/* Whether the pieces always cover the text (every behavior but Removed). */
int regex_split_lossless(const struct regex_split *rx);

#endif
