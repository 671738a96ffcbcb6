/* pretok_tiktoken.c - tiktoken's cl100k_base and o200k_base pre-tokenizers by
 * hand (the patterns and their semantics: pretok.h), and the kind table.
 *
 * Each function follows its pattern's alternatives in order; where a greedy
 * quantifier would backtrack, the comment says which match the regex
 * engine settles on and why the code finds the same one.
 */
#include <string.h>

#include "pretok.h"

static const char *const kind_names[PRETOK_NKINDS] = {
	[PRETOK_GPT2] = "gpt2", [PRETOK_CL100K] = "cl100k", [PRETOK_O200K] = "o200k",
	[PRETOK_GPT2_DIGITS] = "gpt2_digits", [PRETOK_QWEN] = "qwen",
	[PRETOK_SPLIT_REGEX] = "split_regex", [PRETOK_SPM] = "spm", [PRETOK_METASPACE] = "metaspace",
};

/* SentencePiece-style kinds: spm.c cuts the normalized text itself */
static size_t whole_text(const unsigned char *s, size_t n)
{
	(void)s;
	return n;
}

const char *pretok_kind_name(uint32_t kind)
{
	return kind < PRETOK_NKINDS ? kind_names[kind] : NULL;
}

int pretok_kind_parse(const char *name)
{
	for (int k = 0; k < PRETOK_NKINDS; k++)
		if (!strcmp(name, kind_names[k]))
			return k;
	return -1;
}

pretok_next_fn pretok_next_of(uint32_t kind)
{
	switch (kind) {
	case PRETOK_CL100K:
		return pretok_next_cl100k;
	case PRETOK_O200K:
		return pretok_next_o200k;
	case PRETOK_GPT2_DIGITS:
		return pretok_next_gpt2_digits;
	case PRETOK_QWEN:
		return pretok_next_qwen;
	case PRETOK_SPM:
	case PRETOK_METASPACE:
		return whole_text;
	default:
		return pretok_next;
	}
}

size_t pretok_split_point_of(uint32_t kind, const unsigned char *s, size_t n, size_t target)
{
	if (kind == PRETOK_GPT2 || kind == PRETOK_GPT2_DIGITS) /* a digit ends a piece anyway */
		return pretok_split_point(s, n, target);
	if (kind == PRETOK_SPLIT_REGEX) /* any regex: no cut is known to be safe */
		return n;
	if (kind == PRETOK_SPM || kind == PRETOK_METASPACE) /* normalizers see the whole text */
		return n;
	/* "x\nY", x printable ASCII, Y an ASCII letter or digit: the piece
	 * holding x ends at the '\n' at the latest (a punctuation run takes
	 * the "\n" but not Y), the '\n' alone is \s*[\r\n]+ otherwise, and
	 * matching from Y never looks back. */
	for (size_t p = target > 2 ? target : 2; p < n; p++) {
		unsigned y = s[p] | 0x20;
		if (s[p - 1] == '\n' && s[p - 2] > ' ' && s[p - 2] < 0x7F &&
		    ((y >= 'a' && y <= 'z') || (s[p] >= '0' && s[p] <= '9')))
			return p;
	}
	return n;
}

/* General categories of the ASCII characters. */
static const uint8_t ascii_gc[128] = {
	['\t'] = GC_SPACE, ['\n'] = GC_SPACE, ['\v'] = GC_SPACE, ['\f'] = GC_SPACE,
	['\r'] = GC_SPACE, [' '] = GC_SPACE,
	['0'] = GC_NUMBER, ['1'] = GC_NUMBER, ['2'] = GC_NUMBER, ['3'] = GC_NUMBER,
	['4'] = GC_NUMBER, ['5'] = GC_NUMBER, ['6'] = GC_NUMBER, ['7'] = GC_NUMBER,
	['8'] = GC_NUMBER, ['9'] = GC_NUMBER,
#define U(c) [c] = GC_LU
	U('A'), U('B'), U('C'), U('D'), U('E'), U('F'), U('G'), U('H'), U('I'), U('J'),
	U('K'), U('L'), U('M'), U('N'), U('O'), U('P'), U('Q'), U('R'), U('S'), U('T'),
	U('U'), U('V'), U('W'), U('X'), U('Y'), U('Z'),
#undef U
#define L(c) [c] = GC_LL
	L('a'), L('b'), L('c'), L('d'), L('e'), L('f'), L('g'), L('h'), L('i'), L('j'),
	L('k'), L('l'), L('m'), L('n'), L('o'), L('p'), L('q'), L('r'), L('s'), L('t'),
	L('u'), L('v'), L('w'), L('x'), L('y'), L('z'),
#undef L
};

/* Category of the character at s[0..n), n >= 1; its length in *len. A byte
 * that starts no valid UTF-8 sequence is a character of its own, GC_OTHER. */
static inline int gc_at(const unsigned char *s, size_t n, size_t *len)
{
	if (s[0] < 0x80) {
		*len = 1;
		return ascii_gc[s[0]];
	}
	uint32_t cp;
	size_t l = utf8_decode(s, n, &cp);
	*len = l ? l : 1;
	return l ? unicode_gc(cp) : GC_OTHER;
}

static inline int is_letter(int g) { return g >= GC_LU && g <= GC_LO; }
/* [^\s\p{L}\p{N}] */
static inline int is_punct(int g) { return g == GC_OTHER || g == GC_MARK; }
/* [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] and [\p{Ll}\p{Lm}\p{Lo}\p{M}] */
static inline int is_upper(int g) { return g != GC_LL && g >= GC_LU && g <= GC_MARK; }
static inline int is_lower(int g) { return g >= GC_LL && g <= GC_MARK && g != GC_LT; }

/* [^\r\n\p{L}\p{N}]: the optional character before a letter run. */
static inline int is_prefix(int g, unsigned char c)
{
	return !is_letter(g) && g != GC_NUMBER && c != '\r' && c != '\n';
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d) at s: its length, or 0. Case folding maps
 * only U+017F (long s, UTF-8 c5 bf) onto these ASCII letters. */
static size_t contraction(const unsigned char *s, size_t n)
{
	if (n < 2 || s[0] != '\'')
		return 0;
	unsigned c = s[1] | 0x20; /* ASCII letters to lower case; nothing else becomes one */
	if (c == 's' || c == 't' || c == 'm' || c == 'd')
		return 2;
	if (n < 3)
		return 0;
	if (s[1] == 0xC5 && s[2] == 0xBF)
		return 3;
	unsigned c2 = s[2] | 0x20;
	if (((c == 'r' || c == 'v') && c2 == 'e') || (c == 'l' && c2 == 'l'))
		return 3;
	return 0;
}

/* End of the run from i of characters whose category satisfies pred. */
#define RUN(i, pred)                                                          \
	do {                                                                  \
		size_t l_;                                                    \
		while ((i) < n && pred(gc_at(s + (i), n - (i), &l_)))         \
			(i) += l_;                                            \
	} while (0)

/* \p{N}{1,max} from a number of length l. */
static size_t digits(const unsigned char *s, size_t n, size_t l, int max)
{
	size_t i = l, l2;
	for (int k = 1; k < max && i < n && gc_at(s + i, n - i, &l2) == GC_NUMBER; k++)
		i += l2;
	return i;
}

/* The rest of both patterns, from a character of category g and length l
 * that no letter alternative took:
 *   ?[^\s\p{L}\p{N}]+[\r\n]* (o200k, slash set: [\r\n/]*, which takes a '/'
 * after a '\n', as in "/\n/"), \s*[\r\n]+, \s+(?!\S), \s+. */
static size_t punct_or_space(const unsigned char *s, size_t n, int g, size_t l, int slash)
{
	size_t i, l2;
	if (s[0] == ' ' && n > 1 && is_punct(gc_at(s + 1, n - 1, &l2)))
		g = GC_OTHER, l = 1 + l2;
	if (g != GC_SPACE) { /* punctuation */
		i = l;
		RUN(i, is_punct);
		while (i < n && (s[i] == '\r' || s[i] == '\n' || (slash && s[i] == '/')))
			i++;
		return i;
	}
	/* A whitespace run: through its last '\r' or '\n' (\s* backs off to
	 * the last place [\r\n]+ matches, which then runs to there); else all
	 * of it at the end of the text; else less its last character when it
	 * has two or more (\s+(?!\S) backs off one); else its one character. */
	size_t last_nl = 0, last = 0;
	for (i = 0; i < n; i += l) {
		if (gc_at(s + i, n - i, &l) != GC_SPACE)
			break;
		if (s[i] == '\r' || s[i] == '\n')
			last_nl = i + 1;
		last = i;
	}
	if (last_nl)
		return last_nl;
	if (i == n || !last)
		return i;
	return last;
}

/* cl100k's pattern with \p{N}{1,max_digits} (3), or Qwen's \p{N} (1): the
 * number alternative never competes with the others (they all refuse a
 * \p{N} at the start: the prefix of a letter run excludes it, as does the
 * punctuation class), so its bound changes nothing else. */
static size_t cl100k_like(const unsigned char *s, size_t n, int max_digits)
{
	size_t l, l2, i, k;
	/* (?i:'s|'t|'re|'ve|'m|'ll|'d) */
	if (s[0] == '\'' && (k = contraction(s, n)))
		return k;
	int g = gc_at(s, n, &l);
	/* [^\r\n\p{L}\p{N}]?\p{L}+ */
	if (is_letter(g)) {
		i = ascii_run(s, l, n, 0x20); /* exactly the ASCII characters in \p{L} */
		RUN(i, is_letter);
		return i;
	}
	if (is_prefix(g, s[0]) && l < n && is_letter(gc_at(s + l, n - l, &l2))) {
		i = ascii_run(s, l + l2, n, 0x20);
		RUN(i, is_letter);
		return i;
	}
	if (g == GC_NUMBER)
		return digits(s, n, l, max_digits);
	return punct_or_space(s, n, g, l, 0);
}

size_t pretok_next_cl100k(const unsigned char *s, size_t n) { return cl100k_like(s, n, 3); }
size_t pretok_next_qwen(const unsigned char *s, size_t n) { return cl100k_like(s, n, 1); }

/* o200k's first alternative from j, after the optional prefix:
 * [Upper]*[Lower]+(?i:'s|...)? where Upper = Lu Lt Lm Lo M and Lower = Ll Lm
 * Lo M. Returns its end, or 0 when it does not match. [Upper]* takes the
 * whole run of Upper first; when an Ll follows, [Lower]+ runs from there.
 * Otherwise [Upper]* backs off to the last character of the run that is also
 * Lower (Lm, Lo, M), which is then all of [Lower]+ (the character after it
 * is Lu, Lt, or the end of the run, none of them Lower). */
static size_t o200k_upper_lower(const unsigned char *s, size_t n, size_t j)
{
	size_t i = j, l, last_lower = 0;
	int g = GC_OTHER;
	for (; i < n; i += l) {
		g = gc_at(s + i, n - i, &l);
		if (!is_upper(g))
			break;
		if (is_lower(g))
			last_lower = i + l;
	}
	size_t end;
	if (i < n && g == GC_LL) {
		end = ascii_run(s, i + l, n, 0); /* a-z: exactly the ASCII in Lower */
		RUN(end, is_lower);
	} else if (last_lower) {
		end = last_lower;
	} else {
		return 0;
	}
	return end + contraction(s + end, n - end);
}

/* o200k's second alternative from j: [Upper]+[Lower]*(?i:'s|...)?; 0 when
 * it does not match. Greedy all through: no backing off can help. */
static size_t o200k_upper(const unsigned char *s, size_t n, size_t j)
{
	size_t i = j;
	RUN(i, is_upper);
	if (i == j)
		return 0;
	RUN(i, is_lower);
	return i + contraction(s + i, n - i);
}

size_t pretok_next_o200k(const unsigned char *s, size_t n)
{
	size_t l, e;
	int g = gc_at(s, n, &l);
	/* each letter alternative with the optional [^\r\n\p{L}\p{N}] first,
	 * then without it (a mark M can be the prefix or the run's start) */
	int pre = is_prefix(g, s[0]) && l < n;
	if ((pre && (e = o200k_upper_lower(s, n, l))) || (e = o200k_upper_lower(s, n, 0)))
		return e;
	if ((pre && (e = o200k_upper(s, n, l))) || (e = o200k_upper(s, n, 0)))
		return e;
	if (g == GC_NUMBER)
		return digits(s, n, l, 3);
	return punct_or_space(s, n, g, l, 1);
}
