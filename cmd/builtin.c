/* builtin.c - prepare tokenizer and shards from the built-in corpus. */
#include "builtin.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../io/formats/shard.h"
#include "../io/text/tokenizer.h"
#include "../io/util.h"

static int exists(const char *path)
{
	struct stat sb;
	return !stat(path, &sb);
}

/* Whether path is what builtin_prepare writes there (a run cut short
 * between the three files left it): the tokenizer's very bytes (tok), or a
 * shard of the built-in tokenizer (hash). Anything else is someone else's. */
static int is_builtin_file(const char *path, const struct tokenizer *tok, uint64_t hash)
{
	int same = 0;
	if (tok) {
		struct buf want = {0}, have = {0};
		tokenizer_serialize(tok, &want);
		struct stat sb;
		same = !stat(path, &sb) && S_ISREG(sb.st_mode) && (size_t)sb.st_size == want.len &&
		       !read_file(path, &have) && have.len == want.len &&
		       !memcmp(have.data, want.data, want.len);
		buf_free(&want);
		buf_free(&have);
	} else if (shard_sniff(path) == 1) {
		struct shard *sh = NULL;
		same = !shard_open(&sh, path) && shard_tokenizer_hash(sh) == hash;
		shard_close(sh);
	}
	return same;
}

/* mkdir -p */
int make_dirs(const char *path)
{
	char *p = xstrdup(path);
	for (char *s = p + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		if (mkdir(p, 0777) && errno != EEXIST) {
			int e = errno;
			free(p);
			return error("cannot create directory '%s': %s", path, strerror(e));
		}
		*s = '/';
	}
	int rc = 0;
	if (mkdir(p, 0777) && errno != EEXIST)
		rc = error("cannot create directory '%s': %s", path, strerror(errno));
	free(p);
	return rc;
}

/* Calls fn(paragraph, len, arg) for each blank-line-separated paragraph. */
static void each_paragraph(void (*fn)(const unsigned char *, size_t, void *), void *arg)
{
	for (int d = 0; d < builtin_corpus_count; d++) {
		const unsigned char *p = builtin_corpus[d].data, *end = p + builtin_corpus[d].len;
		while (p < end) {
			while (p < end && *p == '\n')
				p++;
			const unsigned char *q = p;
			while (q < end && !(q[0] == '\n' && q + 1 < end && q[1] == '\n'))
				q++;
			if (q > p)
				fn(p, (size_t)(q - p), arg);
			p = q;
		}
	}
}

static void count_paragraph(const unsigned char *p, size_t n, void *arg)
{
	bpe_counter_add(arg, p, n);
}

struct writer_ctx {
	const struct tokenizer *tok;
	struct shard_writer *train, *val;
	uint32_t *ids;
	size_t cap;
	int index, failed;
};

static void write_paragraph(const unsigned char *p, size_t n, void *arg)
{
	struct writer_ctx *w = arg;
	if (w->failed)
		return;
	/* n bytes never need more than max_ids(n) tokens (plus the separator) */
	if (tokenizer_max_ids(w->tok, n) + 2 > w->cap) {
		w->cap = tokenizer_max_ids(w->tok, n) + 2;
		w->ids = xrealloc(w->ids, w->cap * sizeof(uint32_t));
	}
	size_t k = tokenizer_encode(w->tok, p, n, w->ids);
	w->ids[k++] = tokenizer_eot_id(w->tok);
	struct shard_writer *dst = (w->index++ % 10 == 9) ? w->val : w->train;
	if (shard_writer_add_doc(dst, w->ids, k))
		w->failed = 1;
}

int builtin_prepare(const char *dir, int quiet, char **tok_path, char **train_path, char **val_path)
{
	*tok_path = path_join(dir, "builtin.tok");
	*train_path = path_join(dir, "builtin_train.shard");
	*val_path = path_join(dir, "builtin_val.shard");
	if (exists(*tok_path) && exists(*train_path) && exists(*val_path))
		return 0;
	if (make_dirs(dir))
		return -1;
	if (!quiet)
		fprintf(stderr, "asyncpp: preparing the built-in corpus (%d texts) in %s\n",
		builtin_corpus_count, dir);
	struct bpe_counter *counter = bpe_counter_new();
	each_paragraph(count_paragraph, counter);
	struct tokenizer *tok;
	struct bpe_train_opts opts = {.vocab_size = BUILTIN_VOCAB};
	int rc = bpe_train(&tok, counter, &opts);
	bpe_counter_free(counter);
	if (rc)
		return -1;
	struct writer_ctx w = {.tok = tok};
	uint64_t hash = tokenizer_hash(tok);
	uint32_t vocab = tokenizer_vocab_size(tok);
	const char *const paths[3] = {*tok_path, *train_path, *val_path};
	for (int i = 0; i < 3; i++)
		if (exists(paths[i]) && !is_builtin_file(paths[i], i == 0 ? tok : NULL, hash)) {
			tokenizer_free(tok);
			return error("'%s' is not the built-in corpus's file of that name (the "
				     "run prepares builtin.tok, builtin_train.shard and "
				     "builtin_val.shard there, and would replace it): move it away, "
				     "set data.train, or set train.out_dir to another directory",
				     paths[i]);
		}
	if (tokenizer_save(tok, *tok_path) ||
	    shard_writer_open(&w.train, *train_path, vocab, hash)) {
		tokenizer_free(tok);
		return -1;
	}
	if (shard_writer_open(&w.val, *val_path, vocab, hash)) {
		shard_writer_abort(w.train);
		tokenizer_free(tok);
		return -1;
	}
	each_paragraph(write_paragraph, &w);
	free(w.ids);
	tokenizer_free(tok);
	if (w.failed) {
		shard_writer_abort(w.train);
		shard_writer_abort(w.val);
		return -1;
	}
	rc = shard_writer_close(w.train);
	if (shard_writer_close(w.val))
		rc = -1;
	return rc;
}
