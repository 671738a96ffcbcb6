/* suggest.c - "did you mean": the names nearest to a mistyped one (suggest.h). */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "suggest.h"
#include "util.h"

/* Names longer than this are never near (and the rows stay on the stack). */
#define SUGGEST_LONGEST 64

int suggest_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	if (la > SUGGEST_LONGEST || lb > SUGGEST_LONGEST)
		return (int)MAX(la, lb);
	/* optimal string alignment: three rows of the Levenshtein table */
	int rows[3][SUGGEST_LONGEST + 1];
	int *prev2 = rows[0], *prev = rows[1], *cur = rows[2];
	for (size_t j = 0; j <= lb; j++)
		prev[j] = (int)j;
	for (size_t i = 1; i <= la; i++) {
		cur[0] = (int)i;
		for (size_t j = 1; j <= lb; j++) {
			int ca = tolower((unsigned char)a[i - 1]);
			int cb = tolower((unsigned char)b[j - 1]);
			int d = MIN(prev[j] + 1, cur[j - 1] + 1);
			d = MIN(d, prev[j - 1] + (ca != cb));
			if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
			    tolower((unsigned char)a[i - 2]) == cb)
				d = MIN(d, prev2[j - 2] + 1);
			cur[j] = d;
		}
		int *t = prev2;
		prev2 = prev;
		prev = cur;
		cur = t;
	}
	return prev[lb];
}

void suggest_init(struct suggest *sg, const char *word)
{
	memset(sg, 0, sizeof(*sg));
	sg->word = word;
	sg->best = -1;
}

static int is_prefix_pair(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b), n = MIN(la, lb);
	return n >= 3 && !strncasecmp(a, b, n);
}

void suggest_offer(struct suggest *sg, const char *name)
{
	suggest_offer_as(sg, name, name);
}

void suggest_offer_as(struct suggest *sg, const char *name, const char *shown)
{
	if (!name || !*name || !sg->word)
		return;
	int len = (int)strlen(sg->word);
	int limit = MIN(3, MAX(1, len / 3));
	int d = suggest_distance(sg->word, name);
	if (is_prefix_pair(sg->word, name))
		d = MIN(d, 1); /* "import" names both import-hf and import-llmc */
	if (d > limit)
		return;
	if (sg->best >= 0 && d > sg->best)
		return;
	if (sg->best < 0 || d < sg->best) {
		sg->best = d;
		sg->n = 0;
	}
	for (int i = 0; i < sg->n; i++)
		if (!strcmp(sg->names[i], shown))
			return;
	if (sg->n < SUGGEST_MAX)
		sg->names[sg->n++] = shown;
}

int suggest_text(const struct suggest *sg, const char *fmt, char *out, size_t len)
{
	size_t used = 0;
	out[0] = '\0';
	for (int i = 0; i < sg->n; i++) {
		const char *sep = i == 0 ? "" : i == sg->n - 1 ? " or " : ", ";
		int w = snprintf(out + used, len - used, "%s", sep);
		if (w < 0 || (size_t)w >= len - used)
			break;
		used += (size_t)w;
		w = snprintf(out + used, len - used, fmt, sg->names[i]);
		if (w < 0 || (size_t)w >= len - used)
			break;
		used += (size_t)w;
	}
	return sg->n;
}
