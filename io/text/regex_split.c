/* regex_split.c - Split with any regex through PCRE2 (see regex_split.h).
 * Without PCRE2 in the build (no libpcre2-dev), regex_split_new refuses
 * every pattern, saying so. */
#include <stdlib.h>
#include <string.h>

#include "../util.h"
#include "pretok.h"
#include "regex_split.h"

static const char *const behavior_names[SPLIT_NBEHAVIORS] = {
	[SPLIT_REMOVED] = "Removed", [SPLIT_ISOLATED] = "Isolated",
	[SPLIT_MERGED_WITH_PREVIOUS] = "MergedWithPrevious",
	[SPLIT_MERGED_WITH_NEXT] = "MergedWithNext", [SPLIT_CONTIGUOUS] = "Contiguous",
};

const char *split_behavior_name(uint32_t b)
{
	return b < SPLIT_NBEHAVIORS ? behavior_names[b] : NULL;
}

int split_behavior_parse(const char *name)
{
	for (int b = 0; b < SPLIT_NBEHAVIORS; b++)
		if (!strcmp(name, behavior_names[b]))
			return b;
	return -1;
}

/* What Oniguruma (Ruby syntax, Hugging Face's) reads otherwise than PCRE2:
 * 0, or -1 after error(). */
static int onig_only(const char *p, size_t n, const char *where)
{
	int in_class = 0;
	for (size_t i = 0; i < n; i++) {
		char c = p[i];
		if (c == '\\' && i + 1 < n) {
			char e = p[++i];
			if (e && strchr("hHyYO", e)) /* \h is a hex digit in Oniguruma, ... */
				return error("%s: \\%c means another thing in Oniguruma (Hugging Face's "
					     "regexes) than in PCRE2: not implemented", where, e);
			if (e && strchr("wWbB", e)) /* Oniguruma's word: Alphabetic, M, Nd, Pc */
				return error("%s: \\%c: Oniguruma's word characters are not PCRE2's; "
					     "not implemented (write the classes out, e.g. \\p{L})",
					     where, e);
			continue;
		}
		if (in_class) {
			if (c == ']' && in_class == 1)
				in_class = 0;
			else if (c == '[' && i + 1 < n && p[i + 1] != ':')
				return error("%s: a class within a class (Oniguruma's [a[b]]) is not "
					     "implemented", where);
			else if (c == '&' && i + 1 < n && p[i + 1] == '&')
				return error("%s: class intersection (Oniguruma's &&) is not implemented",
					     where);
			continue;
		}
		if (c == '[') {
			in_class = 1;
			if (i + 1 < n && p[i + 1] == '^')
				i++;
			if (i + 1 < n && p[i + 1] == ']') /* a ']' first is a member */
				i++;
			continue;
		}
		if (c == '(' && i + 2 < n && p[i + 1] == '?') {
			if (p[i + 2] == '~')
				return error("%s: Oniguruma's absent operator (?~...) is not implemented",
					     where);
			/* inline options: Ruby's (?m) is PCRE2's (?s), and PCRE2's (?s) and
			 * others are not Ruby's */
			size_t j = i + 2;
			while (j < n && (p[j] == '-' || (p[j] >= 'a' && p[j] <= 'z')))
				j++;
			if (j > i + 2 && j < n && (p[j] == ':' || p[j] == ')'))
				for (size_t k = i + 2; k < j; k++)
					if (p[k] != 'i' && p[k] != 'x' && p[k] != '-')
						return error("%s: the inline option (?%c) is not "
							     "implemented (Oniguruma's options differ "
							     "from PCRE2's; asyncpp takes i and x)",
							     where, p[k]);
		}
	}
	return 0;
}

#ifdef ASYNCPP_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

struct regex_split {
	pcre2_code *code;
	uint32_t behavior;
	int invert;
};

int regex_split_available(void) { return 1; }

int regex_split_new(struct regex_split **rx, const char *pattern, size_t n, uint32_t behavior,
		    int invert, const char *where)
{
	*rx = NULL;
	if (behavior >= SPLIT_NBEHAVIORS)
		return error("%s: unknown Split behavior %u", where, behavior);
	if (onig_only(pattern, n, where))
		return -1;
	/* \s and \S as Oniguruma's: the White_Space property, which has U+0085
	 * (PCRE2's \s is the Z categories and five controls) */
	struct buf pat = {0};
	for (size_t i = 0; i < n; i++) {
		if (pattern[i] == '\\' && i + 1 < n) {
			char e = pattern[++i];
			if (e == 's' || e == 'S') {
				const char *w = e == 's' ? "\\p{White_Space}" : "\\P{White_Space}";
				buf_append(&pat, w, strlen(w));
			} else {
				buf_append(&pat, pattern + i - 1, 2);
			}
			continue;
		}
		buf_append(&pat, pattern + i, 1);
	}
	int err;
	PCRE2_SIZE at;
	/* UTF with Unicode \d \s \w (as Oniguruma's with UTF-8), ^ and $ at
	 * every line (Ruby's), bytes that are not UTF-8 never matched */
	pcre2_code *code = pcre2_compile((PCRE2_SPTR)(pat.len ? (char *)pat.data : ""), pat.len,
					 PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE |
					 PCRE2_MATCH_INVALID_UTF, &err, &at, NULL);
	buf_free(&pat);
	if (!code) {
		PCRE2_UCHAR msg[256];
		pcre2_get_error_message(err, msg, sizeof(msg));
		return error("%s: PCRE2 refuses the regex (near byte %zu, counting \\s as "
			     "\\p{White_Space}): %s", where, (size_t)at, (const char *)msg);
	}
	pcre2_jit_compile(code, PCRE2_JIT_COMPLETE); /* without JIT, the interpreter */
	struct regex_split *r = xcalloc(1, sizeof(*r));
	r->code = code;
	r->behavior = behavior;
	r->invert = invert;
	*rx = r;
	return 0;
}

void regex_split_free(struct regex_split *rx)
{
	if (!rx)
		return;
	pcre2_code_free(rx->code);
	free(rx);
}

struct seg {
	size_t start, end;
	int match;
};

static void push(struct seg **v, size_t *len, size_t *cap, size_t s, size_t e, int m)
{
	if (*len == *cap) {
		*cap = *cap ? 2 * *cap : 64;
		*v = xrealloc(*v, st_mult(*cap, sizeof(**v)));
	}
	(*v)[(*len)++] = (struct seg){s, e, m};
}

static size_t char_len(const unsigned char *s, size_t n, size_t at)
{
	uint32_t cp;
	size_t l = at < n ? utf8_decode(s + at, n - at, &cp) : 0;
	return l ? l : 1;
}

/* The matches as Oniguruma's find_iter gives them (the onig crate: an empty
 * match where the last match ended is skipped by one character), with the
 * text between: Hugging Face's Pattern::find_matches. */
static size_t find_matches(const struct regex_split *rx, const unsigned char *s, size_t n,
			   struct seg **v, size_t *cap)
{
	size_t len = 0, prev = 0, last_end = 0, last_match_end = SIZE_MAX;
	pcre2_match_data *md = pcre2_match_data_create_from_pattern(rx->code, NULL);
	uint32_t opts = 0;
	while (last_end <= n) {
		int rc = pcre2_match(rx->code, s, n, last_end, opts, md, NULL);
		if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !opts) { /* the interpreter has more room */
			opts = PCRE2_NO_JIT;
			continue;
		}
		if (rc < 0) /* no match (or a match limit: the rest is text between) */
			break;
		PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
		size_t b = ov[0], e = ov[1];
		if (b == e && last_match_end == e) {
			last_end += char_len(s, n, last_end);
			continue;
		}
		last_end = e;
		last_match_end = e;
		if (prev != b)
			push(v, &len, cap, prev, b, 0);
		push(v, &len, cap, b, e, 1);
		prev = e;
	}
	pcre2_match_data_free(md);
	if (prev != n)
		push(v, &len, cap, prev, n, 0);
	return len;
}

size_t regex_split_pieces(const struct regex_split *rx, const unsigned char *s, size_t n,
			  struct split_piece **pieces, size_t *cap)
{
	struct seg *m = NULL;
	size_t mcap = 0, nm = n ? find_matches(rx, s, n, &m, &mcap) : 0, k = 0;
	for (size_t i = 0; i < nm && rx->invert; i++)
		m[i].match = !m[i].match;
	/* Hugging Face's behaviors, fold for fold (NormalizedString::split);
	 * out[] is built in m[] itself, never ahead of the reading */
	int prev_match = 0;
	switch (rx->behavior) {
	case SPLIT_REMOVED:
		for (size_t i = 0; i < nm; i++)
			if (!m[i].match)
				m[k++] = m[i];
		break;
	case SPLIT_ISOLATED:
		k = nm;
		break;
	case SPLIT_MERGED_WITH_PREVIOUS:
		for (size_t i = 0; i < nm; i++) {
			if (m[i].match && !prev_match && k)
				m[k - 1].end = m[i].end;
			else
				m[k++] = m[i];
			prev_match = m[i].match;
		}
		break;
	case SPLIT_MERGED_WITH_NEXT: /* from the end */
		for (size_t i = nm; i-- > 0;) {
			int is = m[i].match;
			if (is && !prev_match && k) /* into the piece after it */
				m[nm - k].start = m[i].start;
			else
				m[nm - 1 - k++] = m[i];
			prev_match = is;
		}
		memmove(m, m + nm - k, k * sizeof(*m));
		break;
	case SPLIT_CONTIGUOUS:
		for (size_t i = 0; i < nm; i++) {
			if (m[i].match == prev_match && k)
				m[k - 1].end = m[i].end;
			else
				m[k++] = m[i];
			prev_match = m[i].match;
		}
		break;
	}
	size_t np = 0;
	for (size_t i = 0; i < k; i++) {
		if (m[i].start == m[i].end) /* pieces of no bytes are dropped */
			continue;
		if (np == *cap) {
			*cap = *cap ? 2 * *cap : 64;
			*pieces = xrealloc(*pieces, st_mult(*cap, sizeof(**pieces)));
		}
		(*pieces)[np++] = (struct split_piece){m[i].start, m[i].end};
	}
	free(m);
	return np;
}

int regex_split_lossless(const struct regex_split *rx)
{
	return rx->behavior != SPLIT_REMOVED;
}

#else /* no PCRE2 */

int regex_split_available(void) { return 0; }

int regex_split_new(struct regex_split **rx, const char *pattern, size_t n, uint32_t behavior,
		    int invert, const char *where)
{
	*rx = NULL;
	if (onig_only(pattern, n, where))
		return -1;
	return error("%s: this asyncpp was built without PCRE2 (install libpcre2-dev and "
		     "rebuild), which a Split regex without a scanner of its own needs", where);
}

void regex_split_free(struct regex_split *rx) { (void)rx; }

size_t regex_split_pieces(const struct regex_split *rx, const unsigned char *s, size_t n,
			  struct split_piece **pieces, size_t *cap)
{
	return 0;
}

int regex_split_lossless(const struct regex_split *rx) { return 1; }

#endif
