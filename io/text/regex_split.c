/* regex_split.c - Split with any regex through PCRE2 (see regex_split.h).
 * Without PCRE2 in the build (no libpcre2-dev), regex_split_new refuses
 * every pattern, saying so. */
#include <stdatomic.h>
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

void split_params_put(struct buf *out, const struct split_step *st, size_t k)
{
	unsigned char w[12];
	if (k == 1) { /* the layout of files written before chains */
		put_le32(w, st[0].behavior);
		put_le32(w + 4, (uint32_t)!!st[0].invert);
		buf_append(out, w, 8);
		buf_append(out, st[0].re, st[0].n);
		return;
	}
	put_le32(w, SPLIT_CHAIN_TAG);
	put_le32(w + 4, (uint32_t)k);
	buf_append(out, w, 8);
	for (size_t i = 0; i < k; i++) {
		put_le32(w, st[i].behavior);
		put_le32(w + 4, (uint32_t)!!st[i].invert);
		put_le32(w + 8, (uint32_t)st[i].n);
		buf_append(out, w, 12);
		buf_append(out, st[i].re, st[i].n);
	}
}

int split_params_get(const unsigned char *p, size_t n, struct split_step st[SPLIT_MAX_STEPS],
		     size_t *k, const char *where)
{
	*k = 0;
	if (n < 8)
		return error("%s: Split regex parameters of %zu bytes: file is corrupt", where, n);
	if (get_le32(p) != SPLIT_CHAIN_TAG) {
		if (get_le32(p) >= SPLIT_NBEHAVIORS || get_le32(p + 4) > 1)
			return error("%s: Split regex parameters with behavior %u, invert %u: file "
				     "is corrupt", where, get_le32(p), get_le32(p + 4));
		st[0] = (struct split_step){(const char *)p + 8, n - 8, get_le32(p),
					    (int)get_le32(p + 4)};
		*k = 1;
		return 0;
	}
	uint32_t count = get_le32(p + 4);
	if (count < 2 || count > SPLIT_MAX_STEPS)
		return error("%s: a chain of %u Splits (asyncpp takes 2 to %d): file is corrupt",
			     where, count, SPLIT_MAX_STEPS);
	size_t at = 8;
	for (uint32_t i = 0; i < count; i++) {
		if (n - at < 12 || get_le32(p + at) >= SPLIT_NBEHAVIORS || get_le32(p + at + 4) > 1 ||
		    get_le32(p + at + 8) > n - at - 12)
			return error("%s: Split %u of the chain: parameters truncated or out of "
				     "range: file is corrupt", where, i);
		uint32_t len = get_le32(p + at + 8);
		st[i] = (struct split_step){(const char *)p + at + 12, len, get_le32(p + at),
					    (int)get_le32(p + at + 4)};
		at += 12 + (size_t)len;
	}
	if (at != n)
		return error("%s: %zu bytes after the chain of Splits: file is corrupt", where, n - at);
	*k = count;
	return 0;
}

int regex_split_new(struct regex_split **rx, const char *pattern, size_t n, uint32_t behavior,
		    int invert, const char *where)
{
	struct split_step st = {pattern, n, behavior, invert};
	return regex_split_new_chain(rx, &st, 1, where);
}

#ifdef ASYNCPP_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

struct rx_step {
	pcre2_code *code;
	uint32_t behavior;
	int invert;
};

struct regex_split {
	size_t nsteps;
	struct rx_step step[SPLIT_MAX_STEPS];
	/* matches that failed at PCRE2's limits, and the step of the last one:
	 * written by any thread encoding with the (otherwise read-only) rx */
	_Atomic uint64_t fails;
	_Atomic size_t fail_step;
};

int regex_split_available(void) { return 1; }

/* step's regex as PCRE2 code, or NULL after error() */
static pcre2_code *compile_step(const struct split_step *st, const char *where)
{
	if (st->behavior >= SPLIT_NBEHAVIORS)
		return error("%s: unknown Split behavior %u", where, st->behavior), NULL;
	const char *pattern = st->re;
	size_t n = st->n;
	if (onig_only(pattern, n, where))
		return NULL;
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
		error("%s: PCRE2 refuses the regex (near byte %zu, counting \\s as "
		      "\\p{White_Space}): %s", where, (size_t)at, (const char *)msg);
		return NULL;
	}
	pcre2_jit_compile(code, PCRE2_JIT_COMPLETE); /* without JIT, the interpreter */
	return code;
}

int regex_split_new_chain(struct regex_split **rx, const struct split_step *st, size_t k,
			  const char *where)
{
	*rx = NULL;
	if (k < 1 || k > SPLIT_MAX_STEPS)
		return error("%s: a chain of %zu Splits is not implemented (asyncpp takes 1 to %d)",
			     where, k, SPLIT_MAX_STEPS);
	struct regex_split *r = xcalloc(1, sizeof(*r));
	for (size_t i = 0; i < k; i++) {
		char w[640];
		if (k > 1)
			snprintf(w, sizeof(w), "%s (Split %zu of the chain)", where, i);
		r->step[i].code = compile_step(&st[i], k > 1 ? w : where);
		if (!r->step[i].code) {
			regex_split_free(r);
			return -1;
		}
		r->step[i].behavior = st[i].behavior;
		r->step[i].invert = st[i].invert;
		r->nsteps = i + 1;
	}
	*rx = r;
	return 0;
}

void regex_split_free(struct regex_split *rx)
{
	if (!rx)
		return;
	for (size_t i = 0; i < rx->nsteps; i++)
		pcre2_code_free(rx->step[i].code);
	free(rx);
}

uint64_t regex_split_failures(const struct regex_split *rx, size_t *step)
{
	*step = atomic_load(&rx->fail_step);
	return atomic_load(&rx->fails);
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

/* Whether rc is PCRE2 running out of a limit (not a no-match, not a bug) */
static int is_limit(int rc)
{
	return rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
	       rc == PCRE2_ERROR_HEAPLIMIT || rc == PCRE2_ERROR_NOMEMORY ||
	       rc == PCRE2_ERROR_JIT_STACKLIMIT;
}

/* The retry's limits: 10 times PCRE2's default match and depth limits
 * (10^7 each; about a second of backtracking), no heap limit beyond
 * memory. A match that needs more is counted as failed
 * (regex_split_failures). */
#define RETRY_MATCH_LIMIT 100000000u

/* The matches as Oniguruma's find_iter gives them (the onig crate: an empty
 * match where the last match ended is skipped by one character), with the
 * text between: Hugging Face's Pattern::find_matches. A match that runs
 * into PCRE2's limits is retried once with the interpreter and raised
 * limits; failing again, it is counted and the rest is text between. */
static size_t find_matches(struct regex_split *rx, size_t step, const unsigned char *s,
			   size_t n, struct seg **v, size_t *cap)
{
	const struct rx_step *st = &rx->step[step];
	size_t len = 0, prev = 0, last_end = 0, last_match_end = SIZE_MAX;
	pcre2_match_data *md = pcre2_match_data_create_from_pattern(st->code, NULL);
	pcre2_match_context *mc = NULL;
	uint32_t opts = 0;
	while (last_end <= n) {
		int rc = pcre2_match(st->code, s, n, last_end, opts, md, mc);
		if (rc == PCRE2_ERROR_NOMATCH)
			break;
		if (is_limit(rc) && !mc) { /* the interpreter, with more room */
			mc = pcre2_match_context_create(NULL);
			pcre2_set_match_limit(mc, RETRY_MATCH_LIMIT);
			pcre2_set_depth_limit(mc, RETRY_MATCH_LIMIT);
			pcre2_set_heap_limit(mc, UINT32_MAX);
			opts = PCRE2_NO_JIT;
			continue;
		}
		if (rc < 0) { /* never silent: encoding with rx fails */
			atomic_fetch_add(&rx->fails, 1);
			atomic_store(&rx->fail_step, step);
			break;
		}
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
	pcre2_match_context_free(mc);
	pcre2_match_data_free(md);
	if (prev != n)
		push(v, &len, cap, prev, n, 0);
	return len;
}

/* One step's pieces of s[0..n), offset by base, appended to *out (*len of
 * them, *cap its room). */
static void split_step(struct regex_split *rx, size_t step, const unsigned char *s, size_t n,
		       size_t base, struct split_piece **out, size_t *len, size_t *cap)
{
	const struct rx_step *st = &rx->step[step];
	struct seg *m = NULL;
	size_t mcap = 0, nm = n ? find_matches(rx, step, s, n, &m, &mcap) : 0, k = 0;
	for (size_t i = 0; i < nm && st->invert; i++)
		m[i].match = !m[i].match;
	/* Hugging Face's behaviors, fold for fold (NormalizedString::split);
	 * out[] is built in m[] itself, never ahead of the reading */
	int prev_match = 0;
	switch (st->behavior) {
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
	for (size_t i = 0; i < k; i++) {
		if (m[i].start == m[i].end) /* pieces of no bytes are dropped */
			continue;
		if (*len == *cap) {
			*cap = *cap ? 2 * *cap : 64;
			*out = xrealloc(*out, st_mult(*cap, sizeof(**out)));
		}
		(*out)[(*len)++] = (struct split_piece){base + m[i].start, base + m[i].end};
	}
	free(m);
}

size_t regex_split_pieces(const struct regex_split *crx, const unsigned char *s, size_t n,
			  struct split_piece **pieces, size_t *cap)
{
	/* only the failure counters are written (atomically); rx is
	 * allocated by regex_split_new_chain, never a const object */
	struct regex_split *rx = (struct regex_split *)crx;
	size_t np = 0;
	split_step(rx, 0, s, n, 0, pieces, &np, cap);
	/* each further step splits every piece of the one before, apart */
	struct split_piece *prev = NULL;
	size_t pcap = 0;
	for (size_t step = 1; step < rx->nsteps; step++) {
		struct split_piece *t = prev;
		size_t tcap = pcap, nprev = np;
		prev = *pieces, pcap = *cap;
		*pieces = t, *cap = tcap, np = 0;
		for (size_t i = 0; i < nprev; i++)
			split_step(rx, step, s + prev[i].start, prev[i].end - prev[i].start,
				   prev[i].start, pieces, &np, cap);
	}
	free(prev);
	return np;
}

int regex_split_lossless(const struct regex_split *rx)
{
	for (size_t i = 0; i < rx->nsteps; i++)
		if (rx->step[i].behavior == SPLIT_REMOVED)
			return 0;
	return 1;
}

#else /* no PCRE2 */

int regex_split_available(void) { return 0; }

int regex_split_new_chain(struct regex_split **rx, const struct split_step *st, size_t k,
			  const char *where)
{
	*rx = NULL;
	for (size_t i = 0; i < k; i++)
		if (onig_only(st[i].re, st[i].n, where))
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

uint64_t regex_split_failures(const struct regex_split *rx, size_t *step)
{
	*step = 0;
	return 0;
}

int regex_split_lossless(const struct regex_split *rx) { return 1; }

#endif
