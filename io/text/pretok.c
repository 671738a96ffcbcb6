/* pretok.c - GPT-2 pre-tokenization by hand (see pretok.h). */
#include "pretok.h"

/* Classes of the ASCII characters, the common case. */
static const uint8_t ascii_class[128] = {
	['\t'] = UC_SPACE, ['\n'] = UC_SPACE, ['\v'] = UC_SPACE, ['\f'] = UC_SPACE,
	['\r'] = UC_SPACE, [' '] = UC_SPACE,
	['0'] = UC_NUMBER, ['1'] = UC_NUMBER, ['2'] = UC_NUMBER, ['3'] = UC_NUMBER,
	['4'] = UC_NUMBER, ['5'] = UC_NUMBER, ['6'] = UC_NUMBER, ['7'] = UC_NUMBER,
	['8'] = UC_NUMBER, ['9'] = UC_NUMBER,
#define L(c) [c] = UC_LETTER
	L('A'), L('B'), L('C'), L('D'), L('E'), L('F'), L('G'), L('H'), L('I'), L('J'),
	L('K'), L('L'), L('M'), L('N'), L('O'), L('P'), L('Q'), L('R'), L('S'), L('T'),
	L('U'), L('V'), L('W'), L('X'), L('Y'), L('Z'),
	L('a'), L('b'), L('c'), L('d'), L('e'), L('f'), L('g'), L('h'), L('i'), L('j'),
	L('k'), L('l'), L('m'), L('n'), L('o'), L('p'), L('q'), L('r'), L('s'), L('t'),
	L('u'), L('v'), L('w'), L('x'), L('y'), L('z'),
#undef L
};

size_t utf8_decode(const unsigned char *s, size_t n, uint32_t *cp)
{
	unsigned c = s[0];
	if (c < 0x80) {
		*cp = c;
		return 1;
	}
	if (c < 0xC2 || c > 0xF4)
		return 0;
	if (c < 0xE0) {
		if (n < 2 || (s[1] & 0xC0) != 0x80)
			return 0;
		*cp = ((c & 0x1F) << 6) | (s[1] & 0x3F);
		return 2;
	}
	if (c < 0xF0) {
		if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80)
			return 0;
		if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] > 0x9F))
			return 0; /* overlong, surrogate */
		*cp = ((c & 0x0F) << 12) | ((s[1] & 0x3F) << 6) | (s[2] & 0x3F);
		return 3;
	}
	if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
		return 0;
	if ((c == 0xF0 && s[1] < 0x90) || (c == 0xF4 && s[1] > 0x8F))
		return 0; /* overlong, beyond U+10FFFF */
	*cp = ((c & 0x07) << 18) | ((s[1] & 0x3F) << 12) | ((s[2] & 0x3F) << 6) | (s[3] & 0x3F);
	return 4;
}

/* Class of the character at s[0..n), n >= 1; its length in *len. */
static inline int char_class(const unsigned char *s, size_t n, size_t *len)
{
	if (s[0] < 0x80) {
		*len = 1;
		return ascii_class[s[0]];
	}
	uint32_t cp;
	size_t l = utf8_decode(s, n, &cp);
	if (!l) {
		*len = 1;
		return UC_OTHER;
	}
	*len = l;
	return unicode_class(cp);
}

size_t pretok_next(const unsigned char *s, size_t n)
{
	size_t i, l;
	int want;

	/* 's 't 're 've 'm 'll 'd */
	if (s[0] == '\'' && n >= 2) {
		unsigned c = s[1];
		if (c == 's' || c == 't' || c == 'm' || c == 'd')
			return 2;
		if (n >= 3 && (((c == 'r' || c == 'v') && s[2] == 'e') || (c == 'l' && s[2] == 'l')))
			return 3;
	}
	/* ' ?' before a letter, number or other run */
	if (s[0] == ' ' && n >= 2) {
		want = char_class(s + 1, n - 1, &l);
		if (want != UC_SPACE) {
			i = 1 + l;
			goto run;
		}
	}
	want = char_class(s, n, &l);
	if (want != UC_SPACE) {
		i = l;
		goto run;
	}
	/* \s+(?!\S) then \s+: a whitespace run, less its last character when
	 * a non-space follows and the run is longer than one character. */
	size_t last = 0;
	i = l;
	while (i < n) {
		if (char_class(s + i, n - i, &l) != UC_SPACE)
			return last ? last : i;
		last = i;
		i += l;
	}
	return n;
run:
	if (want == UC_LETTER) /* the ASCII letters are all UC_LETTER, and no other ASCII */
		i = ascii_run(s, i, n, 0x20);
	while (i < n && char_class(s + i, n - i, &l) == want)
		i += l;
	return i;
}

/* Digits apart, then GPT-2's pattern on the text between: a numeric
 * character is a piece; otherwise the piece is GPT-2's on the text up to the
 * next numeric character. GPT-2's scanner decides a piece by what it reads
 * up to the piece's end, the whitespace run from there and one character
 * more, so only a numeric character within that reach cuts it. */
size_t pretok_next_gpt2_digits(const unsigned char *s, size_t n)
{
	size_t l;
	if (char_class(s, n, &l) == UC_NUMBER)
		return l;
	size_t piece = pretok_next(s, n);
	for (size_t i = l; i < n; i += l) {
		int c = char_class(s + i, n - i, &l);
		if (c == UC_NUMBER)
			return pretok_next(s, i);
		if (i >= piece && c != UC_SPACE)
			break;
	}
	return piece;
}

size_t pretok_split_point(const unsigned char *s, size_t n, size_t target)
{
	/* "x\nY" with x and Y printable ASCII: the '\n' is a whitespace run of
	 * one character, which is a piece of its own whether Y follows or the
	 * text ends there. (After a longer run such as "\n\n", it is not: at
	 * the end of a text the run is one piece, before Y it is two.) */
	for (size_t p = target > 2 ? target : 2; p < n; p++)
		if (s[p - 1] == '\n' && s[p] > ' ' && s[p] < 0x7F && s[p - 2] > ' ' && s[p - 2] < 0x7F)
			return p;
	return n;
}
