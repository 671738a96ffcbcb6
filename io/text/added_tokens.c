/* added_tokens.c - leftmost-longest search for added tokens (see
 * added_tokens.h). The tokens are grouped by their first byte, longest
 * first; the text is scanned for bytes that start a token (for the usual
 * "<|...|>" tokens only '<'), where each candidate is compared in turn. */
#include <stdlib.h>
#include <string.h>

#include "../util.h"
#include "added_tokens.h"

struct added_tokens {
	uint32_t n;
	uint32_t start[257]; /* tokens starting with byte b: [start[b], start[b + 1]) */
	uint32_t *ids, *len;
	const unsigned char **s;
};

struct ent {
	uint32_t id, len;
	const unsigned char *s;
};

static int by_byte_then_longest(const void *x, const void *y)
{
	const struct ent *a = x, *b = y;
	if (a->s[0] != b->s[0])
		return a->s[0] < b->s[0] ? -1 : 1;
	if (a->len != b->len)
		return a->len > b->len ? -1 : 1;
	return a->id < b->id ? -1 : a->id > b->id;
}

struct added_tokens *added_tokens_new(uint32_t n, const uint32_t *ids,
				      const unsigned char *const *s, const uint32_t *len)
{
	struct added_tokens *a = xcalloc(1, sizeof(*a));
	struct ent *e = xmalloc(st_mult(n ? n : 1, sizeof(*e)));
	uint32_t m = 0;
	for (uint32_t i = 0; i < n; i++)
		if (len[i])
			e[m++] = (struct ent){ids[i], len[i], s[i]};
	qsort(e, m, sizeof(*e), by_byte_then_longest);
	a->n = m;
	a->ids = xmalloc(st_mult(m ? m : 1, sizeof(*a->ids)));
	a->len = xmalloc(st_mult(m ? m : 1, sizeof(*a->len)));
	a->s = xmalloc(st_mult(m ? m : 1, sizeof(*a->s)));
	for (uint32_t i = 0; i < m; i++) {
		a->ids[i] = e[i].id, a->len[i] = e[i].len, a->s[i] = e[i].s;
		a->start[e[i].s[0] + 1] = i + 1;
	}
	for (int b = 1; b < 257; b++) /* bytes that start nothing: an empty range */
		a->start[b] = MAX(a->start[b], a->start[b - 1]);
	free(e);
	return a;
}

void added_tokens_free(struct added_tokens *a)
{
	if (!a)
		return;
	free(a->ids);
	free(a->len);
	free(a->s);
	free(a);
}

size_t added_tokens_find(const struct added_tokens *a, const unsigned char *s, size_t n,
			 size_t *at, uint32_t *id)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t lo = a->start[s[i]], hi = a->start[s[i] + 1];
		for (uint32_t k = lo; k < hi; k++) /* longest first */
			if (a->len[k] <= n - i && !memcmp(s + i, a->s[k], a->len[k])) {
				*at = i;
				*id = a->ids[k];
				return a->len[k];
			}
	}
	*at = n;
	return 0;
}
