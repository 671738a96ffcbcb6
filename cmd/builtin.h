/* builtin.h - the built-in corpus (testdata/corpus, compiled into the
 * binary) and the data a run with no data.train prepares from it. */
#ifndef ASYNCPP_BUILTIN_H
#define ASYNCPP_BUILTIN_H

#include <stddef.h>

struct builtin_doc {
	const char *name;
	const unsigned char *data;
	size_t len;
};
extern const struct builtin_doc builtin_corpus[];
extern const int builtin_corpus_count;
/* the man pages (man/NAME.1, .5, .7), for `asyncpp help` (cmd/help.c) */
extern const struct builtin_doc builtin_manpages[];
extern const int builtin_manpages_count;

/* Vocabulary of the tokenizer trained on the built-in corpus. */
#define BUILTIN_VOCAB 512

/* Make (or reuse) DIR/builtin.tok, DIR/builtin_train.shard and
 * DIR/builtin_val.shard from the built-in corpus: a BPE tokenizer trained
 * on it, every paragraph a document, every 10th paragraph in the validation
 * shard. Paths are returned malloc'ed; quiet: no progress message. */
int builtin_prepare(const char *dir, int quiet, char **tok_path, char **train_path, char **val_path);

#endif
