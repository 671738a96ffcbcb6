/* test_unicode_nfc.c - io/text/unicode_nfc.c against Python's
 * unicodedata.normalize('NFC', ...): testdata/nfc_golden.txt holds its
 * output on every code point NFC could touch (alone, decomposed, among
 * marks, reversed), Hangul jamo and random mark sequences (written by
 * tests/gen_nfc_golden.py); the Unicode version must be our tables'. Also:
 * the expansion bound, the fast check, bytes that are not UTF-8, long runs
 * of marks, and the output cap. */
#include <stdlib.h>
#include <string.h>

#include "../../io/text/pretok.h"
#include "../../io/text/unicode_nfc.h"
#include "../../io/util.h"
#include "../test.h"

static size_t nfc(const char *s, size_t n, struct buf *out)
{
	out->len = 0;
	buf_reserve(out, UTF8_NFC_MAX(n) + 1);
	size_t k = utf8_nfc(s, n, (char *)out->data, UTF8_NFC_MAX(n));
	out->len = k;
	return k;
}

TEST(nfc_equals_python_on_golden)
{
	struct buf f = {0}, o = {0};
	CHECK(!read_file(test_data("nfc_golden.txt"), &f));
	char *p = (char *)f.data, *end = p + f.len;
	char *nl = memchr(p, '\n', (size_t)(end - p));
	CHECK(nl);
	char want_version[64];
	snprintf(want_version, sizeof(want_version), "unicode\t%s", unicode_nfc_version);
	CHECK_MSG((size_t)(nl - p) == strlen(want_version) && !memcmp(p, want_version, nl - p),
		  "golden file's %.*s, tables' Unicode %s", (int)(nl - p), p, unicode_nfc_version);
	CHECK(!strcmp(unicode_nfc_version, unicode_tables_version));
	size_t cases = 0;
	for (p = nl + 1; p < end; p = nl + 1) {
		nl = memchr(p, '\n', (size_t)(end - p));
		CHECK(nl);
		char *tab = memchr(p, '\t', (size_t)(nl - p));
		CHECK(tab);
		size_t n = (size_t)(tab - p), wn = (size_t)(nl - tab - 1);
		size_t k = nfc(p, n, &o);
		CHECK_MSG(k == wn && !memcmp(o.data, tab + 1, wn), "line %zu: '%.*s' gave '%.*s', "
			  "Python '%.*s'", cases + 2, (int)n, p, (int)k, (char *)o.data, (int)wn,
			  tab + 1);
		CHECK(k <= UTF8_NFC_MAX(n));
		/* quick check says normal only where it is, and NFC is idempotent */
		CHECK(!utf8_is_nfc_quick(p, n) || (k == n && !memcmp(p, o.data, n)));
		struct buf o2 = {0};
		CHECK(nfc((char *)o.data, k, &o2) == k && !memcmp(o2.data, o.data, k));
		buf_free(&o2);
		cases++;
	}
	CHECK(cases > 10000);
	buf_free(&f);
	buf_free(&o);
}

/* every code point alone: NFC within UTF8_NFC_MAX, ASCII and already-normal
 * text copied */
TEST(nfc_bound_and_fast_path)
{
	struct buf o = {0};
	char u[4];
	size_t worst = 0;
	for (uint32_t cp = 0x80; cp < 0x110000; cp++) {
		if (cp >= 0xD800 && cp < 0xE000)
			continue;
		size_t n = cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
		if (n == 2)
			u[0] = (char)(0xC0 | cp >> 6), u[1] = (char)(0x80 | (cp & 63));
		else if (n == 3)
			u[0] = (char)(0xE0 | cp >> 12), u[1] = (char)(0x80 | (cp >> 6 & 63)),
			u[2] = (char)(0x80 | (cp & 63));
		else
			u[0] = (char)(0xF0 | cp >> 18), u[1] = (char)(0x80 | (cp >> 12 & 63)),
			u[2] = (char)(0x80 | (cp >> 6 & 63)), u[3] = (char)(0x80 | (cp & 63));
		size_t k = nfc(u, n, &o);
		worst = MAX(worst, (k + n - 1) / n);
	}
	CHECK_MSG(worst <= 3, "a code point grows %zux", worst);
	const char *ascii = "The quick brown fox, 12 jumps.\n\t~";
	CHECK(utf8_is_nfc_quick(ascii, strlen(ascii)));
	CHECK(nfc(ascii, strlen(ascii), &o) == strlen(ascii) && !memcmp(o.data, ascii, o.len));
	const char *e = "e\xcc\x81"; /* e + U+0301 -> U+00E9 */
	CHECK(!utf8_is_nfc_quick(e, 3));
	CHECK(nfc(e, 3, &o) == 2 && !memcmp(o.data, "\xc3\xa9", 2));
	buf_free(&o);
}

/* bytes that start no UTF-8 sequence stay, and block composition */
TEST(nfc_keeps_bad_bytes)
{
	struct buf o = {0};
	const char s[] = "e\xff\xcc\x81" "\xc3" "a\xcc\x81\x80";
	CHECK(nfc(s, sizeof(s) - 1, &o) == sizeof(s) - 2);
	CHECK(!memcmp(o.data, "e\xff\xcc\x81\xc3\xc3\xa1\x80", o.len));
	buf_free(&o);
}

/* a long run of marks of mixed classes (the counting sort) equals the
 * insertion sort's order: stable by class */
TEST(nfc_long_mark_run)
{
	struct buf in = {0}, o = {0};
	buf_append(&in, "a", 1);
	/* U+0316 (220), U+0301 (230), U+0345 (240), U+05B0 (10): 4 x 50 */
	static const char *m[] = {"\xcc\x96", "\xcc\x81", "\xcd\x85", "\xd6\xb0"};
	for (int i = 0; i < 200; i++)
		buf_append(&in, m[i % 4], 2);
	size_t k = nfc((char *)in.data, in.len, &o);
	/* a + U+0301 do not compose first: U+05B0 (10) and U+0316 (220) sort
	 * before it, and then it is not blocked (lower classes) -> U+00E1 */
	CHECK(k == in.len - 1);
	CHECK(!memcmp(o.data, "\xc3\xa1", 2));
	size_t at = 2;
	for (int c = 0; c < 4; c++) {
		static const int order[] = {3, 0, 1, 2};
		int want = c == 2 ? 49 : 50;
		for (int i = 0; i < want; i++, at += 2)
			CHECK_MSG(!memcmp(o.data + at, m[order[c]], 2), "class %d, mark %d", c, i);
	}
	buf_free(&in);
	buf_free(&o);
}

TEST(nfc_output_cap)
{
	char out[4];
	/* U+1D160 (4 bytes) -> three 4-byte characters */
	size_t k = utf8_nfc("\xf0\x9d\x85\xa0", 4, out, sizeof(out));
	CHECK(k == 12);
	CHECK(!memcmp(out, "\xf0\x9d\x85\x98", 4));
}
