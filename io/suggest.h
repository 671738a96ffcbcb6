/* suggest.h - "did you mean": the names nearest to a mistyped one.
 *
 * A word is near a name when their edit distance (insertions, deletions,
 * substitutions and swaps of two neighbours, ignoring case) is at most a
 * third of the word's length (at least 1, at most 3), or when one is a
 * prefix of the other and the shorter has 3 or more characters
 * ("optimizer" and "optim"; such a pair counts as distance 1). Of the
 * near names, those at the smallest distance are suggested (at most
 * SUGGEST_MAX), as git suggests commands:
 *
 *	struct suggest sg;
 *	suggest_init(&sg, word);
 *	for (each name) suggest_offer(&sg, name);
 *	suggest_text(&sg, "'%s'", text, sizeof(text)); -> "'name'" or "'a' or 'b'"
 */
#ifndef ASYNCPP_SUGGEST_H
#define ASYNCPP_SUGGEST_H

#include <stddef.h>

#define SUGGEST_MAX 4

struct suggest {
	const char *word;
	int best;                       /* distance of the names kept; -1: none yet */
	int n;                          /* names kept (at most SUGGEST_MAX) */
	const char *names[SUGGEST_MAX]; /* the offered names (their shown forms) */
};

void suggest_init(struct suggest *sg, const char *word);
/* Consider one name; a name offered twice counts once. */
void suggest_offer(struct suggest *sg, const char *name);
/* The same, measured by `name` but kept (and shown) as `shown` (which
 * must live as long as sg): "steps" shown as "train.steps". */
void suggest_offer_as(struct suggest *sg, const char *name, const char *shown);
/* The names kept, each written with fmt (one %s), joined "a, b or c";
 * "" when none is near. Returns the number of names. */
int suggest_text(const struct suggest *sg, const char *fmt, char *out, size_t len);
/* The edit distance of a and b as above (0 when equal but for case). */
int suggest_distance(const char *a, const char *b);

#endif
