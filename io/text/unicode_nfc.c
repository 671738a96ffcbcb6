/* unicode_nfc.c - NFC over UTF-8 (see unicode_nfc.h). The algorithm is
 * UAX #15's: decompose each character fully (canonical mappings, Hangul by
 * arithmetic), sort each run of non-starters stably by combining class, then
 * compose each character with the last starter when nothing between them
 * blocks it (a character of class 0, or one of the same or a higher class).
 *
 * A character with NFC_QC Yes and class 0 is a boundary: nothing before it
 * composes with it or reorders across it. So text splits into segments that
 * begin at boundaries; a segment of boundaries alone is already normal and
 * is copied, and any other is normalized on its own.
 */
#include <stdlib.h>
#include <string.h>

#include "../util.h"
#include "pretok.h"
#include "unicode_nfc.h"

/* io/text/unicode_nfc_tables.c; what each holds: gen_unicode_nfc.py */
extern const uint8_t nfc_ccc_stage1[0x1100], nfc_ccc_stage2[][256];
extern const uint8_t nfc_prop_stage1[0x1100], nfc_prop_stage2[][256];
extern const uint32_t nfc_ndecomp, nfc_decomp_cp[], nfc_decomp_at[], nfc_decomp_data[];
extern const uint32_t nfc_ncomp, nfc_comp_cp[];
extern const uint64_t nfc_comp_key[];

enum { QC_YES = 0, QC_MAYBE = 1, QC_NO = 2, HAS_DECOMP = 4 };

/* Hangul syllables (Unicode's chapter 3.12) */
enum {
	S_BASE = 0xAC00, L_BASE = 0x1100, V_BASE = 0x1161, T_BASE = 0x11A7,
	L_COUNT = 19, V_COUNT = 21, T_COUNT = 28, N_COUNT = V_COUNT * T_COUNT,
	S_COUNT = L_COUNT * N_COUNT,
};

static inline int ccc_of(uint32_t cp)
{
	return nfc_ccc_stage2[nfc_ccc_stage1[cp >> 8]][cp & 255];
}

static inline int prop_of(uint32_t cp)
{
	return nfc_prop_stage2[nfc_prop_stage1[cp >> 8]][cp & 255];
}

/* The character at s[0..n), n >= 1: its length in *len, its code point in
 * *cp; returns whether it is a boundary (also a byte that starts no valid
 * sequence: *cp is then UINT32_MAX). */
static inline int char_at(const unsigned char *s, size_t n, size_t *len, uint32_t *cp)
{
	if (s[0] < 0x80) {
		*len = 1;
		*cp = s[0];
		return 1;
	}
	size_t l = utf8_decode(s, n, cp);
	if (!l) {
		*len = 1;
		*cp = UINT32_MAX;
		return 1;
	}
	*len = l;
	return (prop_of(*cp) & 3) == QC_YES && !ccc_of(*cp);
}

/* ---- a growable code point buffer, on the stack while short ---- */

struct cpbuf {
	uint32_t *cp;
	size_t n, cap;
	uint32_t local[64];
};

static void cp_push(struct cpbuf *b, uint32_t cp)
{
	if (b->n == b->cap) {
		size_t cap = st_mult(b->cap, 2);
		uint32_t *p = xmalloc(st_mult(cap, sizeof(*p)));
		memcpy(p, b->cp, b->n * sizeof(*p));
		if (b->cp != b->local)
			free(b->cp);
		b->cp = p;
		b->cap = cap;
	}
	b->cp[b->n++] = cp;
}

static void decompose(struct cpbuf *b, uint32_t cp)
{
	if (cp - S_BASE < S_COUNT) {
		uint32_t s = cp - S_BASE;
		cp_push(b, L_BASE + s / N_COUNT);
		cp_push(b, V_BASE + s % N_COUNT / T_COUNT);
		if (s % T_COUNT)
			cp_push(b, T_BASE + s % T_COUNT);
		return;
	}
	if (!(prop_of(cp) & HAS_DECOMP)) {
		cp_push(b, cp);
		return;
	}
	size_t lo = 0, hi = nfc_ndecomp;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (nfc_decomp_cp[mid] < cp)
			lo = mid + 1;
		else
			hi = mid;
	}
	uint32_t at = nfc_decomp_at[lo];
	for (uint32_t i = 0; i < (at & 255); i++)
		cp_push(b, nfc_decomp_data[(at >> 8) + i]);
}

/* Sort p[0..n) (all non-starters) stably by combining class. */
static void sort_run(uint32_t *p, size_t n)
{
	if (n <= 32) { /* insertion sort: the usual run is one to three marks */
		for (size_t i = 1; i < n; i++) {
			uint32_t c = p[i];
			int k = ccc_of(c);
			size_t j = i;
			for (; j && ccc_of(p[j - 1]) > k; j--)
				p[j] = p[j - 1];
			p[j] = c;
		}
		return;
	}
	/* counting sort, so that a long run of marks costs O(n) */
	size_t count[257] = {0};
	for (size_t i = 0; i < n; i++)
		count[ccc_of(p[i]) + 1]++;
	for (int k = 1; k < 257; k++)
		count[k] += count[k - 1];
	uint32_t *t = xmalloc(st_mult(n, sizeof(*t)));
	for (size_t i = 0; i < n; i++)
		t[count[ccc_of(p[i])]++] = p[i];
	memcpy(p, t, n * sizeof(*t));
	free(t);
}

/* The primary composite of (a, b), or 0. */
static uint32_t compose(uint32_t a, uint32_t b)
{
	if (a - L_BASE < L_COUNT && b - V_BASE < V_COUNT)
		return S_BASE + ((a - L_BASE) * V_COUNT + (b - V_BASE)) * T_COUNT;
	if (a - S_BASE < S_COUNT && (a - S_BASE) % T_COUNT == 0 && b - T_BASE - 1 < T_COUNT - 1)
		return a + (b - T_BASE);
	uint64_t key = (uint64_t)a << 21 | b;
	size_t lo = 0, hi = nfc_ncomp;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (nfc_comp_key[mid] < key)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < nfc_ncomp && nfc_comp_key[lo] == key ? nfc_comp_cp[lo] : 0;
}

struct out {
	unsigned char *p;
	size_t len, cap;
};

static void put(struct out *o, const unsigned char *s, size_t n)
{
	if (o->len < o->cap)
		memcpy(o->p + o->len, s, MIN(n, o->cap - o->len));
	o->len += n;
}

static void put_cp(struct out *o, uint32_t cp)
{
	unsigned char u[4];
	size_t n;
	if (cp < 0x80) {
		u[0] = (unsigned char)cp, n = 1;
	} else if (cp < 0x800) {
		u[0] = (unsigned char)(0xC0 | cp >> 6), u[1] = (unsigned char)(0x80 | (cp & 63)), n = 2;
	} else if (cp < 0x10000) {
		u[0] = (unsigned char)(0xE0 | cp >> 12), u[1] = (unsigned char)(0x80 | (cp >> 6 & 63));
		u[2] = (unsigned char)(0x80 | (cp & 63)), n = 3;
	} else {
		u[0] = (unsigned char)(0xF0 | cp >> 18), u[1] = (unsigned char)(0x80 | (cp >> 12 & 63));
		u[2] = (unsigned char)(0x80 | (cp >> 6 & 63)), u[3] = (unsigned char)(0x80 | (cp & 63));
		n = 4;
	}
	put(o, u, n);
}

/* Normalize the segment s[0..n): valid UTF-8 whose first character may be
 * a boundary and no other is. */
static void normalize_segment(const unsigned char *s, size_t n, struct out *o)
{
	struct cpbuf b = {0};
	b.cp = b.local;
	b.cap = sizeof(b.local) / sizeof(b.local[0]);
	for (size_t i = 0, l; i < n; i += l) {
		uint32_t cp;
		char_at(s + i, n - i, &l, &cp);
		decompose(&b, cp);
	}
	for (size_t i = 0; i < b.n;) { /* canonical ordering */
		if (!ccc_of(b.cp[i])) {
			i++;
			continue;
		}
		size_t j = i;
		while (j < b.n && ccc_of(b.cp[j]))
			j++;
		sort_run(b.cp + i, j - i);
		i = j;
	}
	/* canonical composition (UAX #15's sample code): last is the class of
	 * the last character kept after the starter, 256 before any starter */
	size_t starter = 0, kept = 1;
	int last = ccc_of(b.cp[0]) ? 256 : 0;
	for (size_t i = 1; i < b.n; i++) {
		uint32_t c = b.cp[i];
		int k = ccc_of(c);
		uint32_t comp = last == 256 ? 0 : compose(b.cp[starter], c);
		if (comp && (last < k || last == 0)) {
			b.cp[starter] = comp;
			continue;
		}
		if (!k)
			starter = kept;
		last = k;
		b.cp[kept++] = c;
	}
	for (size_t i = 0; i < kept; i++)
		put_cp(o, b.cp[i]);
	if (b.cp != b.local)
		free(b.cp);
}

size_t utf8_nfc(const char *in, size_t n, char *out, size_t cap)
{
	const unsigned char *s = (const unsigned char *)in;
	struct out o = {(unsigned char *)out, 0, cap};
	size_t seg = 0, seg_out = 0, i = 0, l;
	uint32_t cp;
	while (i < n) {
		if (char_at(s + i, n - i, &l, &cp)) {
			seg = i, seg_out = o.len;
			put(&o, s + i, l);
			i += l;
			if (cp == UINT32_MAX) /* a bad byte composes with nothing */
				seg = i, seg_out = o.len;
			continue;
		}
		/* the segment from the last boundary through the next one */
		size_t end = i + l;
		while (end < n && !char_at(s + end, n - end, &l, &cp))
			end += l;
		o.len = seg_out;
		normalize_segment(s + seg, end - seg, &o);
		seg = end, seg_out = o.len;
		i = end;
	}
	return o.len;
}

int utf8_is_nfc_quick(const char *in, size_t n)
{
	const unsigned char *s = (const unsigned char *)in;
	int last = 0;
	for (size_t i = 0, l; i < n; i += l) {
		uint32_t cp;
		if (char_at(s + i, n - i, &l, &cp)) {
			last = 0;
			continue;
		}
		int k = ccc_of(cp);
		if ((prop_of(cp) & 3) != QC_YES || (k && last > k))
			return 0;
		last = k;
	}
	return 1;
}
