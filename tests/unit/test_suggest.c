/* test_suggest.c - "did you mean" (io/suggest.h): the edit distance and
 * which names are suggested. */
#include <string.h>

#include "../../io/suggest.h"
#include "../test.h"

TEST(distance_counts_edits_and_swaps)
{
	CHECK(suggest_distance("name", "name") == 0);
	CHECK(suggest_distance("NAME", "name") == 0); /* case is ignored */
	CHECK(suggest_distance("nme", "name") == 1);  /* a deletion */
	CHECK(suggest_distance("trian", "train") == 1); /* a swap of neighbours */
	CHECK(suggest_distance("lr", "wd") == 2);
	CHECK(suggest_distance("", "abc") == 3);
	CHECK(suggest_distance("kitten", "sitting") == 3);
}

static int suggests(const char *word, const char *const *names, int n, const char *want)
{
	struct suggest sg;
	char text[256];
	suggest_init(&sg, word);
	for (int i = 0; i < n; i++)
		suggest_offer(&sg, names[i]);
	suggest_text(&sg, "'%s'", text, sizeof(text));
	if (strcmp(text, want))
		printf("# '%s': got \"%s\", expected \"%s\"\n", word, text, want);
	return !strcmp(text, want);
}

TEST(nearest_names_only)
{
	static const char *const cmds[] = {"tokenize", "train", "eval", "sample", "inspect",
					   "bench", "plot", "export", "import-hf", "import-llmc"};
	int n = (int)(sizeof(cmds) / sizeof(cmds[0]));
	CHECK(suggests("trian", cmds, n, "'train'"));
	CHECK(suggests("tokenise", cmds, n, "'tokenize'"));
	CHECK(suggests("import", cmds, n, "'import-hf' or 'import-llmc'")); /* prefixes */
	CHECK(suggests("xyz", cmds, n, ""));     /* nothing near: no suggestion */
	CHECK(suggests("t", cmds, n, ""));       /* one letter is no prefix */
	static const char *const secs[] = {"model", "optim", "optim", "train"};
	CHECK(suggests("optimizer", secs, 4, "'optim'")); /* offered twice, named once */
	static const char *const keys[] = {"lr", "wd", "eps", "beta1", "beta2", "beta3"};
	CHECK(suggests("beta", keys, 6, "'beta1', 'beta2' or 'beta3'"));
	CHECK(suggests("lr_max", keys, 6, ""));
}

TEST(shown_form_is_kept)
{
	struct suggest sg;
	char text[64];
	suggest_init(&sg, "stpes");
	suggest_offer_as(&sg, "steps", "train.steps=10");
	suggest_offer_as(&sg, "seed", "train.seed=10");
	CHECK(suggest_text(&sg, "%s", text, sizeof(text)) == 1);
	CHECK(!strcmp(text, "train.steps=10"));
}
