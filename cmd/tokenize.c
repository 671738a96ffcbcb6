/* tokenize.c - `asyncpp tokenize`: train a BPE tokenizer, import GPT-2's,
 * encode text into train/val shards, decode shards back to text.
 *
 * Encoding splits every document into pieces at safe points (see
 * pretok_split_point), encodes the pieces on all cores with one pre-token
 * cache per thread, and writes documents in input order, each preceded by
 * <|endoftext|>. Decoding drops <|endoftext|>, so with --val-fraction 0
 * decode(encode(FILES)) is the concatenation of FILES, byte for byte.
 */
#include <errno.h>
#include <inttypes.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "../io/text/pretok.h"
#include "../io/formats/shard.h"
#include "../io/text/tokenizer.h"
#include "../io/util.h"
#include "cmd.h"
#include "opts.h"

static const char *const usage[] = {
	"asyncpp tokenize train [--vocab N] -o TOK FILE...",
	"asyncpp tokenize import-gpt2 -o TOK ENCODER_JSON VOCAB_BPE",
	"asyncpp tokenize encode -t TOK [-o PREFIX] [--val-fraction F] [--seed S] [--docs MODE] [--chunk-tokens N] [-j N] FILE...|-",
	"asyncpp tokenize encode -t TOK --ids [--docs MODE] [-j N] FILE...|-",
	"asyncpp tokenize decode -t TOK [-o FILE] [--show-eot] SHARD...",
	NULL,
};

static const char *description =
	"Train a byte-level BPE tokenizer, import GPT-2's, encode text into token shards\n"
	"(PREFIX_train.shard, PREFIX_val.shard), or decode shards back into text.";

static long vocab = 8192, seed = 1, threads = 0, chunk_tokens = SHARD_CHUNK_TOKENS;
static double val_fraction = 0.01;
static const char *tok_path, *output, *docs_mode = "file";
static int show_eot, quiet, print_ids, force;

static const struct option options[] = {
	OPT_STRING('t', "tokenizer", &tok_path, "TOK", "tokenizer file (encode, decode)"),
	OPT_STRING('o', "output", &output, "PATH",
		   "tokenizer to write (train, import-gpt2); shard prefix (encode, default "
		   "'tokens'); text file (decode, default stdout)"),
	OPT_INT(0, "vocab", &vocab, "N", "vocabulary size, <|endoftext|> included (train; 8192)"),
	OPT_DOUBLE(0, "val-fraction", &val_fraction, "F",
		   "fraction of documents for the val shard (encode; 0.01)"),
	OPT_INT(0, "seed", &seed, "S", "seed of the train/val split (encode; 1)"),
	OPT_STRING(0, "docs", &docs_mode, "MODE",
		   "a document is a 'file' or a 'blank-line'-separated block (encode; file)"),
	OPT_INT(0, "chunk-tokens", &chunk_tokens, "N",
		"tokens per compressed chunk: the unit a streaming reader decompresses (encode; 65536)"),
	OPT_INT('j', "threads", &threads, "N", "encoding threads (encode; all cores)"),
	OPT_FLAG(0, "ids", &print_ids,
		 "print token ids, one document a line, instead of writing shards (encode)"),
	OPT_FLAG(0, "show-eot", &show_eot, "print <|endoftext|> between documents (decode)"),
	OPT_FLAG(0, "force", &force, "replace output files that exist (they are kept otherwise)"),
	OPT_FLAG('q', "quiet", &quiet, "no progress or summary on stderr"),
	OPT_END(),
};

/* ---- train ---- */

static int do_train(int n, char **files)
{
	if (!n)
		opts_usage_error(usage, options, "train needs text files");
	if (!output)
		opts_usage_error(usage, options, "train needs -o TOK");
	if (opts_output_is_new(output, force))
		return EXIT_FAIL;
	if (vocab < 257 || vocab > (long)TOKENIZER_MAX_VOCAB)
		opts_usage_error(usage, options, "--vocab must be in 257..%u", TOKENIZER_MAX_VOCAB);
	double t0 = now_sec();
	struct bpe_counter *c = bpe_counter_new();
	size_t total = 0;
	for (int i = 0; i < n; i++) {
		struct buf b = {0};
		if (read_file(files[i], &b)) {
			bpe_counter_free(c);
			return EXIT_FAIL;
		}
		bpe_counter_add(c, b.data, b.len);
		total += b.len;
		buf_free(&b);
	}
	struct tokenizer *tok;
	struct bpe_train_opts o = {.vocab_size = (uint32_t)vocab,
				   .verbose = !quiet && stderr_is_tty()};
	int rc = bpe_train(&tok, c, &o);
	bpe_counter_free(c);
	if (rc)
		return EXIT_FAIL;
	if (tokenizer_vocab_size(tok) < (uint32_t)vocab)
		warning("the text has only enough pairs for %u tokens (asked for %ld)",
			tokenizer_vocab_size(tok), vocab);
	rc = tokenizer_save(tok, output);
	if (!rc && !quiet)
		fprintf(stderr, "asyncpp: %s: %u tokens (%u merges) from %.1f MB in %.1f s\n",
			output, tokenizer_vocab_size(tok), tokenizer_nmerges(tok), total / 1e6,
			now_sec() - t0);
	tokenizer_free(tok);
	return rc ? EXIT_FAIL : EXIT_OK;
}

/* ---- import-gpt2 ---- */

static int do_import(int n, char **args)
{
	if (n != 2)
		opts_usage_error(usage, options, "import-gpt2 needs ENCODER_JSON and VOCAB_BPE");
	if (!output)
		opts_usage_error(usage, options, "import-gpt2 needs -o TOK");
	if (opts_output_is_new(output, force))
		return EXIT_FAIL;
	struct tokenizer *tok;
	if (gpt2_import(&tok, args[0], args[1]))
		return EXIT_FAIL;
	int rc = tokenizer_save(tok, output);
	tokenizer_free(tok);
	return rc ? EXIT_FAIL : EXIT_OK;
}

/* ---- encode ---- */

#define CHUNK_BYTES (256 << 10) /* pieces that threads encode */
#define BATCH_BYTES (4 << 20)   /* text encoded between writes (and progress lines) */

struct piece {
	const unsigned char *p;
	size_t n;
	int doc_start; /* first piece of a document */
	uint32_t *ids;
	size_t nids;
};

/* Append the documents of text[0..n) to *docs as (start, end) pairs. */
static void split_docs(const unsigned char *s, size_t n, int blank_line, size_t **docs,
		       size_t *ndocs, size_t *cap)
{
	size_t start = 0;
#define EMIT(a, b)                                                            \
	do {                                                                  \
		if (*ndocs + 1 > *cap) {                                      \
			*cap = *cap ? 2 * *cap : 64;                          \
			*docs = xrealloc(*docs, st_mult(*cap, 2 * sizeof(size_t))); \
		}                                                             \
		(*docs)[2 * *ndocs] = (a);                                    \
		(*docs)[2 * *ndocs + 1] = (b);                                \
		(*ndocs)++;                                                   \
	} while (0)
	if (blank_line) {
		int content = 0, in_sep = 0;
		for (size_t ls = 0, le; ls < n; ls = le) {
			const unsigned char *nl = memchr(s + ls, '\n', n - ls);
			le = nl ? (size_t)(nl - s) + 1 : n;
			int blank = 1;
			for (size_t i = ls; i < le && blank; i++)
				blank = s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n';
			if (!blank) {
				if (in_sep) {
					EMIT(start, ls);
					start = ls;
				}
				in_sep = 0;
				content = 1;
			} else if (content) {
				in_sep = 1;
			}
		}
	}
	if (n > start)
		EMIT(start, n);
#undef EMIT
}

struct encoder {
	const struct tokenizer *tok;
	struct tok_cache **caches;
	int nthreads;
	struct shard_writer *train, *val;
	uint64_t doc_index, bytes_done;
	double t0;
	struct piece *pieces;
	size_t npieces, pcap, batch_bytes;
	uint32_t *docbuf;
	size_t docbuf_cap;
};

static void progress(struct encoder *e, int final)
{
	if (quiet || !stderr_is_tty())
		return;
	double dt = now_sec() - e->t0;
	fprintf(stderr, "\rencoding: %.1f MB  %.1f MB/s%s", e->bytes_done / 1e6,
		dt > 0 ? e->bytes_done / 1e6 / dt : 0.0, final ? "\n" : "");
}

/* Encode the queued pieces in parallel, then write their documents. */
static int flush_pieces(struct encoder *e)
{
	long np = (long)e->npieces;
#pragma omp parallel for schedule(dynamic, 1) num_threads(e->nthreads)
	for (long i = 0; i < np; i++) {
		struct piece *pc = &e->pieces[i];
		pc->ids = xmalloc(st_mult(pc->n ? pc->n : 1, sizeof(uint32_t)));
		pc->nids = tokenizer_encode_cached(e->tok, e->caches[omp_get_thread_num()], pc->p,
						   pc->n, pc->ids);
	}
	uint32_t eot = tokenizer_eot_id(e->tok);
	int rc = 0;
	for (size_t i = 0; i < e->npieces;) {
		size_t j = i + 1, n = eot != TOKENIZER_NO_ID;
		n += e->pieces[i].nids;
		while (j < e->npieces && !e->pieces[j].doc_start)
			n += e->pieces[j++].nids;
		if (n > e->docbuf_cap) {
			e->docbuf_cap = n;
			free(e->docbuf);
			e->docbuf = xmalloc(st_mult(n, sizeof(uint32_t)));
		}
		size_t k = 0;
		if (eot != TOKENIZER_NO_ID)
			e->docbuf[k++] = eot;
		for (size_t q = i; q < j; q++) {
			memcpy(e->docbuf + k, e->pieces[q].ids, e->pieces[q].nids * sizeof(uint32_t));
			k += e->pieces[q].nids;
			e->bytes_done += e->pieces[q].n;
		}
		if (print_ids) {
			for (size_t q = eot != TOKENIZER_NO_ID; q < k; q++)
				printf(q > (eot != TOKENIZER_NO_ID) ? " %u" : "%u", e->docbuf[q]);
			putchar('\n');
			i = j;
			continue;
		}
		uint64_t st = rng_mix((uint64_t)seed, e->doc_index++);
		int to_val = val_fraction > 0 && rng_uniform(&st) < val_fraction;
		if (!rc && shard_writer_add_doc(to_val ? e->val : e->train, e->docbuf, k))
			rc = -1;
		i = j;
	}
	for (size_t i = 0; i < e->npieces; i++)
		free(e->pieces[i].ids);
	e->npieces = 0;
	e->batch_bytes = 0;
	progress(e, 0);
	return rc;
}

static void add_piece(struct encoder *e, const unsigned char *p, size_t n, int doc_start)
{
	if (e->npieces == e->pcap) {
		e->pcap = e->pcap ? 2 * e->pcap : 256;
		e->pieces = xrealloc(e->pieces, st_mult(e->pcap, sizeof(*e->pieces)));
	}
	e->pieces[e->npieces++] = (struct piece){.p = p, .n = n, .doc_start = doc_start};
	e->batch_bytes += n;
}

static int encode_file(struct encoder *e, const char *path)
{
	struct buf b = {0};
	if (read_file(path, &b))
		return -1;
	size_t *docs = NULL, ndocs = 0, cap = 0;
	split_docs(b.data, b.len, !strcmp(docs_mode, "blank-line"), &docs, &ndocs, &cap);
	int rc = 0;
	/* a document is written whole, so batches end at document ends */
	for (size_t d = 0; d < ndocs && !rc; d++) {
		const unsigned char *s = b.data + docs[2 * d];
		size_t n = docs[2 * d + 1] - docs[2 * d], at = 0;
		while (at < n) {
			size_t cut = n - at <= CHUNK_BYTES ? n - at :
				     pretok_split_point(s + at, n - at, CHUNK_BYTES);
			add_piece(e, s + at, cut, at == 0);
			at += cut;
		}
		if (e->batch_bytes >= BATCH_BYTES)
			rc = flush_pieces(e);
	}
	if (!rc)
		rc = flush_pieces(e);
	free(docs);
	buf_free(&b);
	return rc;
}

static int do_encode(int n, char **files)
{
	if (!n)
		opts_usage_error(usage, options, "encode needs text files (or - for stdin)");
	if (!tok_path)
		opts_usage_error(usage, options, "encode needs -t TOK");
	if (strcmp(docs_mode, "file") && strcmp(docs_mode, "blank-line"))
		opts_usage_error(usage, options, "--docs must be 'file' or 'blank-line', not '%s'",
				 docs_mode);
	if (!(val_fraction >= 0 && val_fraction <= 1))
		opts_usage_error(usage, options, "--val-fraction must be in [0, 1]");
	if (threads < 0 || threads > 4096)
		opts_usage_error(usage, options, "--threads must be in 0..4096");
	if (chunk_tokens < 1 || chunk_tokens > (1L << 26))
		opts_usage_error(usage, options, "--chunk-tokens must be in 1..67108864");
	struct encoder e = {0};
	struct tokenizer *tok;
	if (tokenizer_load(&tok, tok_path))
		return EXIT_FAIL;
	e.tok = tok;
	e.nthreads = threads ? (int)threads : omp_get_num_procs();
	e.caches = xmalloc(st_mult(e.nthreads, sizeof(*e.caches)));
	for (int i = 0; i < e.nthreads; i++)
		e.caches[i] = tok_cache_new(tok);
	const char *prefix = output ? output : "tokens";
	size_t plen = strlen(prefix) + 16;
	char *train_path = xmalloc(plen), *val_path = xmalloc(plen);
	snprintf(train_path, plen, "%s_train.shard", prefix);
	snprintf(val_path, plen, "%s_val.shard", prefix);
	int rc = EXIT_FAIL;
	uint32_t V = tokenizer_vocab_size(tok);
	uint64_t h = tokenizer_hash(tok);
	e.t0 = now_sec();
	if (print_ids) {
		for (int i = 0; i < n; i++)
			if (encode_file(&e, files[i]))
				goto out;
		rc = EXIT_OK;
		goto out;
	}
	if (opts_output_is_new(train_path, force) ||
	    (val_fraction > 0 && opts_output_is_new(val_path, force)))
		goto out;
	if (shard_writer_open(&e.train, train_path, V, h) ||
	    shard_writer_set_chunk_tokens(e.train, (uint32_t)chunk_tokens))
		goto out;
	if (val_fraction > 0 && (shard_writer_open(&e.val, val_path, V, h) ||
				 shard_writer_set_chunk_tokens(e.val, (uint32_t)chunk_tokens)))
		goto out;
	for (int i = 0; i < n; i++)
		if (encode_file(&e, files[i]))
			goto out;
	progress(&e, 1);
	uint64_t ntrain = shard_writer_ntokens(e.train), nval = e.val ? shard_writer_ntokens(e.val) : 0;
	int bad = shard_writer_close(e.train);
	e.train = NULL;
	if (e.val) {
		bad |= shard_writer_close(e.val);
		e.val = NULL;
	}
	if (bad)
		goto out;
	if (!quiet) {
		double dt = now_sec() - e.t0;
		fprintf(stderr, "asyncpp: %s: %" PRIu64 " tokens", train_path, ntrain);
		if (val_fraction > 0)
			fprintf(stderr, "; %s: %" PRIu64 " tokens", val_path, nval);
		fprintf(stderr, " (%.1f MB in %.2f s, %d threads)\n", e.bytes_done / 1e6, dt,
			e.nthreads);
	}
	if (val_fraction > 0 && nval == 0)
		warning("%s holds no tokens: none of the %" PRIu64 " documents was drawn for "
			"validation at --val-fraction %g; split the text into more documents "
			"(--docs blank-line) or raise --val-fraction", val_path, e.doc_index,
			val_fraction);
	rc = EXIT_OK;
out:
	shard_writer_abort(e.train);
	shard_writer_abort(e.val);
	for (size_t i = 0; i < e.npieces; i++)
		free(e.pieces[i].ids);
	free(e.pieces);
	free(e.docbuf);
	for (int i = 0; i < e.nthreads; i++)
		tok_cache_free(e.caches[i]);
	free(e.caches);
	free(train_path);
	free(val_path);
	tokenizer_free(tok);
	return rc;
}

/* ---- decode ---- */

#define DECODE_TOKENS (1 << 20)

static int decode_shard(const struct tokenizer *tok, const char *path, FILE *fp,
			struct atomic_file *af)
{
	struct shard *s;
	if (shard_open(&s, path))
		return -1;
	int rc = -1;
	uint64_t h = shard_tokenizer_hash(s);
	if (h && h != tokenizer_hash(tok)) {
		error("%s: written with another tokenizer (hash %016" PRIx64 ", %s has %016" PRIx64
		      ")", path, h, tok_path, tokenizer_hash(tok));
		goto out;
	}
	if (shard_vocab_size(s) > tokenizer_vocab_size(tok)) {
		error("%s: vocabulary of %u tokens is larger than the tokenizer's %u", path,
		      shard_vocab_size(s), tokenizer_vocab_size(tok));
		goto out;
	}
	uint32_t *ids = xmalloc(DECODE_TOKENS * sizeof(*ids));
	struct buf text = {0};
	uint64_t total = shard_ntokens(s);
	for (uint64_t at = 0; at < total;) {
		size_t n = total - at < DECODE_TOKENS ? (size_t)(total - at) : DECODE_TOKENS;
		if (shard_read(s, at, n, ids))
			goto done;
		text.len = 0;
		if (tokenizer_decode(tok, ids, n, show_eot ? 0 : TOK_DECODE_SKIP_SPECIAL, &text))
			goto done;
		if (af ? atomic_write(af, text.data, text.len) :
			 fwrite(text.data, 1, text.len, fp) != text.len) {
			if (!af)
				error("cannot write the output: %s", strerror(errno));
			goto done;
		}
		at += n;
	}
	rc = 0;
done:
	free(ids);
	buf_free(&text);
out:
	shard_close(s);
	return rc;
}

static int do_decode(int n, char **files)
{
	if (!n)
		opts_usage_error(usage, options, "decode needs shard files");
	if (!tok_path)
		opts_usage_error(usage, options, "decode needs -t TOK");
	struct tokenizer *tok;
	if (tokenizer_load(&tok, tok_path))
		return EXIT_FAIL;
	struct atomic_file af;
	int use_af = output && strcmp(output, "-");
	int rc = 0;
	if (use_af && (opts_output_is_new(output, force) || atomic_open(&af, output))) {
		tokenizer_free(tok);
		return EXIT_FAIL;
	}
	for (int i = 0; i < n && !rc; i++)
		rc = decode_shard(tok, files[i], stdout, use_af ? &af : NULL);
	if (use_af) {
		if (rc)
			atomic_abort(&af);
		else
			rc = atomic_commit(&af);
	}
	tokenizer_free(tok);
	return rc ? EXIT_FAIL : EXIT_OK;
}

int cmd_tokenize(int argc, char **argv)
{
	int n = opts_parse(argc, argv, usage, options, description);
	if (!n)
		opts_usage_error(usage, options, "tokenize needs a subcommand: train, import-gpt2, encode or decode");
	const char *what = argv[0];
	if (!strcmp(what, "train"))
		return do_train(n - 1, argv + 1);
	if (!strcmp(what, "import-gpt2"))
		return do_import(n - 1, argv + 1);
	if (!strcmp(what, "encode"))
		return do_encode(n - 1, argv + 1);
	if (!strcmp(what, "decode"))
		return do_decode(n - 1, argv + 1);
	opts_usage_error(usage, options, "unknown tokenize command '%s'", what);
	return EXIT_USAGE;
}
