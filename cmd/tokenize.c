/* tokenize.c - `asyncpp tokenize`: train a BPE tokenizer, import GPT-2's,
 * encode corpora into train/val shards, decode shards back to text.
 *
 * train and encode read their inputs through the corpus reader
 * (io/text/corpus.h: text, lines or JSONL, compressed or not, from files,
 * directories and globs); encode runs the pipeline of cmd/encode.h. Decoding
 * drops <|endoftext|>, so for plain text with --val-fraction 0
 * decode(encode(FILES)) is the concatenation of FILES, byte for byte.
 */
#include <errno.h>
#include <inttypes.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../io/formats/shard.h"
#include "../io/suggest.h"
#include "../io/text/corpus.h"
#include "../io/text/pretok.h"
#include "../io/text/tokenizer.h"
#include "../io/util.h"
#include "cmd.h"
#include "encode.h"
#include "opts.h"

static const char *const usage[] = {
	"asyncpp tokenize train [--vocab N] [--format FMT] [--field NAME] [--docs MODE] [--max-bad N] -o TOK INPUT...",
	"asyncpp tokenize import-gpt2 -o TOK ENCODER_JSON VOCAB_BPE",
	"asyncpp tokenize import-tiktoken -o TOK [--pattern cl100k|o200k|llama3|REGEX] [--special NAME=ID]... FILE",
	"asyncpp tokenize import-hf -o TOK TOKENIZER_JSON",
	"asyncpp tokenize encode -t TOK [-o PREFIX] [--val-fraction F] [--seed S] [--format FMT] [--field NAME] [--docs MODE] [--max-bad N] [--chunk-tokens N] [-j N] INPUT...",
	"asyncpp tokenize encode -t TOK --ids [--format FMT] [--field NAME] [--docs MODE] [--max-bad N] [-j N] INPUT...",
	"asyncpp tokenize decode -t TOK [-o FILE] [--show-eot] SHARD...",
	NULL,
};

static const char *description =
	"Train a byte-level BPE tokenizer, import GPT-2's, a tiktoken rank file (cl100k_base,\n"
	"o200k_base, Llama 3's) or a Hugging Face tokenizer.json (GPT-2, SmolLM, Llama 2 and 3,\n"
	"Mistral, Qwen, DeepSeek-V3, or any Split regex), encode corpora into token shards\n"
	"(PREFIX_train.shard, PREFIX_val.shard), or decode shards back into text. An INPUT is\n"
	"a file, a directory, a glob pattern or - (stdin); files may be gzip or zstd compressed.";

static long vocab = 8192, seed = 1, threads = 0, chunk_tokens = SHARD_CHUNK_TOKENS, max_bad;
static double val_fraction = 0.01;
static const char *tok_path, *output, *docs_mode, *format, *field, *pattern;
static struct opt_list specials;
static int show_eot, quiet, print_ids, force;

/* bad JSONL records named on stderr; the rest are counted */
#define SHOW_BAD 20

static const struct option options[] = {
	OPT_STRING('t', "tokenizer", &tok_path, "TOK", "tokenizer file (encode, decode)"),
	OPT_STRING('o', "output", &output, "PATH",
		   "tokenizer to write (train, import-gpt2, import-tiktoken, import-hf); shard "
		   "prefix (encode, default "
		   "'tokens'); text file (decode, default stdout)"),
	OPT_INT(0, "vocab", &vocab, "N", "vocabulary size, <|endoftext|> included (train; 8192)"),
	OPT_STRING(0, "pattern", &pattern, "NAME",
		   "import-tiktoken: the encoding's pre-tokenizer pattern and special tokens, "
		   "'cl100k', 'o200k' or 'llama3' (default: told by the file's number of ranks); "
		   "any other value is a regex (PCRE2, its matches the pieces) with no special "
		   "tokens but --special's"),
	OPT_LIST(0, "special", &specials, "NAME=ID",
		 "import-tiktoken: a special token besides the pattern's, or a new id for one "
		 "of them (repeatable)"),
	OPT_GROUP("Inputs (train, encode):"),
	OPT_STRING(0, "format", &format, "FMT",
		   "'text', 'lines' (a document a line), 'jsonl' (a JSON object a line) or "
		   "'parquet' (a row a document); default: by each file's name (.jsonl, "
		   ".ndjson, .json: jsonl; .parquet: parquet; else text; under .gz, .zst)"),
	OPT_STRING(0, "field", &field, "NAME",
		   "jsonl, parquet: the member or column that holds a document's text "
		   "(default 'text')"),
	OPT_STRING(0, "docs", &docs_mode, "MODE",
		   "text: a document is a 'file' or a 'blank-line'-separated block (file)"),
	OPT_INT(0, "max-bad", &max_bad, "N",
		"jsonl: skip up to N bad records, each named; one more is an error (0)"),
	OPT_GROUP("Encoding:"),
	OPT_DOUBLE(0, "val-fraction", &val_fraction, "F",
		   "fraction of documents (or, when too few, of tokens) for the val shard (0.01)"),
	OPT_INT(0, "seed", &seed, "S", "seed of the train/val split (1)"),
	OPT_INT(0, "chunk-tokens", &chunk_tokens, "N",
		"tokens per compressed chunk: the unit a streaming reader decompresses (65536)"),
	OPT_INT('j', "threads", &threads, "N", "encoding threads (all cores)"),
	OPT_FLAG(0, "ids", &print_ids,
		 "print token ids, one document a line, instead of writing shards"),
	OPT_GROUP("Other:"),
	OPT_FLAG(0, "show-eot", &show_eot, "print <|endoftext|> between documents (decode)"),
	OPT_FLAG(0, "force", &force, "replace output files that exist (they are kept otherwise)"),
	OPT_FLAG('q', "quiet", &quiet, "no progress or summary on stderr"),
	OPT_END(),
};

/* The input options into corpus_opts (usage errors exit). */
static void input_opts(struct corpus_opts *co)
{
	memset(co, 0, sizeof(*co));
	co->infer = !format;
	if (format && corpus_format_parse(format, &co->format))
		opts_usage_error(usage, options,
				 "--format must be 'text', 'lines', 'jsonl' or 'parquet', not '%s'",
				 format);
	if (docs_mode && strcmp(docs_mode, "file") && strcmp(docs_mode, "blank-line"))
		opts_usage_error(usage, options, "--docs must be 'file' or 'blank-line', not '%s'",
				 docs_mode);
	if (docs_mode && !co->infer && co->format != CORPUS_TEXT)
		opts_usage_error(usage, options,
				 "--docs is for --format text (a %s document is %s)", format,
				 co->format == CORPUS_LINES ? "a line" : "a record");
	if (field && !co->infer && co->format != CORPUS_JSONL && co->format != CORPUS_PARQUET)
		opts_usage_error(usage, options, "--field is for --format jsonl and parquet");
	if (field && !*field)
		opts_usage_error(usage, options, "--field needs a member name");
	if (max_bad < 0)
		opts_usage_error(usage, options, "--max-bad must be 0 or more");
	co->blank_line = docs_mode && !strcmp(docs_mode, "blank-line");
	co->field = field ? field : "text";
	co->max_bad = (uint64_t)max_bad;
	co->show_bad = SHOW_BAD;
}

/* Open the documents of INPUT...; -1 after error(). */
static int open_corpus(struct corpus **c, int n, char **args, const struct corpus_opts *co)
{
	char **paths;
	int npaths;
	/* a dataset folder holds its Parquet shards among README.md and the like */
	if (co->infer ? corpus_expand_by_name(args, n, &paths, &npaths) :
	    corpus_expand(args, n, co->format == CORPUS_PARQUET ? ".parquet" : NULL, &paths,
			  &npaths))
		return -1;
	if (co->infer && (field || docs_mode)) { /* is an option for none of the files? */
		int as[4] = {0};
		for (int i = 0; i < npaths; i++)
			as[strcmp(paths[i], "-") ? corpus_format_of_name(paths[i])
						 : CORPUS_TEXT] = 1;
		if (field && !as[CORPUS_JSONL] && !as[CORPUS_PARQUET])
			opts_usage_error(usage, options,
					 "--field is for jsonl and parquet inputs, and none is one "
					 "by its name: --format FMT sets the format");
		if (docs_mode && !as[CORPUS_TEXT])
			opts_usage_error(usage, options,
					 "--docs is for text inputs, and none is one by its name: "
					 "--format FMT sets the format");
	}
	corpus_open(c, paths, npaths, co);
	corpus_paths_free(paths, npaths);
	return 0;
}

/* Which format each file was read as, when told by the names (no --format):
 * "read a.jsonl as jsonl, 3 files as text (by their names; ...)". */
static void report_formats(const struct corpus_stats *st)
{
	if (format || quiet)
		return;
	char line[4 * 360]; /* four formats, a name of up to 300 bytes each */
	size_t at = 0;
	uint64_t files = 0;
	for (int f = 0; f < 4; f++) {
		uint64_t k = st->files_as[f];
		if (!k || at >= sizeof(line))
			continue;
		files += k;
		const char *name = corpus_format_name((enum corpus_format)f);
		const char *sep = at ? ", " : "";
		if (k == 1 && strcmp(st->first_as[f], "-"))
			at += snprintf(line + at, sizeof(line) - at, "%s%.300s as %s", sep,
				       st->first_as[f], name);
		else if (k == 1)
			at += snprintf(line + at, sizeof(line) - at, "%sstandard input as %s", sep,
				       name);
		else
			at += snprintf(line + at, sizeof(line) - at, "%s%" PRIu64 " files as %s",
				       sep, k, name);
	}
	int stdin_only = files == 1 && st->files_as[CORPUS_TEXT] == 1 &&
			 !strcmp(st->first_as[CORPUS_TEXT], "-");
	if (files)
		fprintf(stderr, "asyncpp: read %s (%s; --format FMT sets it)\n", line,
			stdin_only ? "standard input has no name to tell its format" :
			files == 1 ? "by its name" : "by their names");
}

/* What the reader skipped, said even with -q: bad records are never dropped
 * silently. ok: the read went to the end. */
static void report_reader(struct corpus *c, int ok)
{
	struct corpus_stats st;
	corpus_get_stats(c, &st);
	int pq = st.files_as[CORPUS_PARQUET] && !st.files_as[CORPUS_JSONL];
	if (ok)
		report_formats(&st);
	if (st.json_like > 1)
		warning("%" PRIu64 " more files read as text begin with JSON objects "
			"(--format jsonl reads them as JSON Lines)", st.json_like - 1);
	if (st.too_many_bad)
		error("stopped at bad record %" PRIu64 ", named above (--max-bad %ld; --max-bad N "
		      "skips up to N bad records, naming each)%s", st.bad, max_bad,
		      format ? "" : "; its file was read as jsonl by its name: --format FMT sets "
		      "the format");
	else if (ok && st.bad > SHOW_BAD)
		warning("%" PRIu64 " bad records of %" PRIu64 " skipped (the first %d named above)",
			st.bad, st.records, SHOW_BAD);
	else if (ok && st.bad)
		warning("%" PRIu64 " bad record%s of %" PRIu64 " skipped (named above)", st.bad,
			st.bad == 1 ? "" : "s", st.records);
	if (ok && st.empty && !quiet)
		fprintf(stderr,
			"asyncpp: %" PRIu64 " %s with an empty%s \"%s\" (no document)\n", st.empty,
			pq ? (st.empty == 1 ? "row" : "rows") : (st.empty == 1 ? "record" : "records"),
			pq ? " or null" : "", field ? field : "text");
}

/* ---- train ---- */

static int do_train(int n, char **files)
{
	if (!n)
		opts_usage_error(usage, options, "train needs inputs (files, directories, globs)");
	if (!output)
		opts_usage_error(usage, options, "train needs -o TOK");
	struct corpus_opts co;
	input_opts(&co);
	if (opts_output_is_new(output, force))
		return EXIT_FAIL;
	if (vocab < 257 || vocab > (long)TOKENIZER_MAX_VOCAB)
		opts_usage_error(usage, options, "--vocab must be in 257..%u", TOKENIZER_MAX_VOCAB);
	double t0 = now_sec(), shown = t0;
	int tty = !quiet && stderr_is_tty();
	struct corpus *c;
	if (open_corpus(&c, n, files, &co))
		return EXIT_FAIL;
	struct bpe_counter *bc = bpe_counter_new();
	size_t total = 0, len;
	const unsigned char *doc;
	int got;
	while ((got = corpus_next(c, &doc, &len)) > 0) {
		bpe_counter_add(bc, doc, len);
		total += len;
		if (tty && now_sec() - shown > 0.5) {
			shown = now_sec();
			fprintf(stderr, "\rreading: %.1f MB", total / 1e6);
		}
	}
	if (tty)
		fprintf(stderr, "\rreading: %.1f MB\n", total / 1e6);
	report_reader(c, got == 0);
	corpus_close(c);
	if (got < 0) {
		bpe_counter_free(bc);
		return EXIT_FAIL;
	}
	struct tokenizer *tok;
	struct bpe_train_opts o = {.vocab_size = (uint32_t)vocab, .verbose = tty};
	int rc = bpe_train(&tok, bc, &o);
	bpe_counter_free(bc);
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

/* ---- import-tiktoken ---- */

#define MAX_SPECIAL_OPTS 64

/* --special NAME=ID into names and ids (names point into the items);
 * usage errors exit. */
static void parse_specials(char **copies, uint32_t *ids)
{
	if (specials.n > MAX_SPECIAL_OPTS)
		opts_usage_error(usage, options, "at most %d --special tokens", MAX_SPECIAL_OPTS);
	for (int i = 0; i < specials.n; i++) {
		const char *item = specials.items[i], *eq = strrchr(item, '=');
		char *end = NULL;
		errno = 0;
		unsigned long id = eq && eq[1] >= '0' && eq[1] <= '9' ? strtoul(eq + 1, &end, 10) : 0;
		if (!end || *end || errno || eq == item || id >= TOKENIZER_MAX_VOCAB)
			opts_usage_error(usage, options,
					 "--special wants NAME=ID with an id below %u, not '%s'",
					 TOKENIZER_MAX_VOCAB, item);
		copies[i] = xmalloc((size_t)(eq - item) + 1);
		memcpy(copies[i], item, (size_t)(eq - item));
		copies[i][eq - item] = 0;
		ids[i] = (uint32_t)id;
	}
}

static int do_import_tiktoken(int n, char **args)
{
	if (n != 1)
		opts_usage_error(usage, options, "import-tiktoken needs one FILE (a .tiktoken rank file)");
	if (!output)
		opts_usage_error(usage, options, "import-tiktoken needs -o TOK");
	int kind = PRETOK_GPT2, llama3 = 0; /* none yet */
	if (pattern) {
		llama3 = !strcmp(pattern, "llama3");
		kind = llama3 ? PRETOK_CL100K : pretok_kind_parse(pattern);
		if (kind != PRETOK_CL100K && kind != PRETOK_O200K) /* a regex */
			kind = PRETOK_SPLIT_REGEX;
	}
	char *copies[MAX_SPECIAL_OPTS];
	uint32_t opt_ids[MAX_SPECIAL_OPTS];
	parse_specials(copies, opt_ids);
	char (*llama3_names)[40] = xmalloc(LLAMA3_NSPECIAL * sizeof(*llama3_names));
	struct buf file = {0};
	struct tokenizer *tok = NULL;
	int rc = -1;
	if (opts_output_is_new(output, force) || tiktoken_read(args[0], &file))
		goto out;
	if (kind == PRETOK_SPLIT_REGEX && !regex_split_available()) {
		error("--pattern %s: not cl100k, o200k or llama3, so a regex, and this asyncpp was "
		      "built without PCRE2 (install libpcre2-dev and rebuild)", pattern);
		goto out;
	}
	if (kind == PRETOK_GPT2) { /* told by the number of ranks */
		uint32_t nr = tiktoken_count_ranks(file.data, file.len);
		for (int k = 0; k < PRETOK_NKINDS; k++)
			if (tiktoken_published_ranks(k) == nr)
				kind = k;
		if (nr == LLAMA3_RANKS)
			kind = PRETOK_CL100K, llama3 = 1;
		if (kind == PRETOK_GPT2) {
			error("%s: %u ranks, neither cl100k_base's (%u), o200k_base's (%u) nor "
			      "Llama 3's (%u): --pattern cl100k|o200k|llama3 says which pattern it "
			      "uses",
			      args[0], nr, tiktoken_published_ranks(PRETOK_CL100K),
			      tiktoken_published_ranks(PRETOK_O200K), LLAMA3_RANKS);
			goto out;
		}
	}
	/* the encoding's special tokens, then each --special: a new one, or a
	 * new id for one of the encoding's */
	const char *names[MAX_SPECIAL_OPTS + LLAMA3_NSPECIAL];
	uint32_t ids[MAX_SPECIAL_OPTS + LLAMA3_NSPECIAL];
	const char *const *pn;
	const uint32_t *pi;
	uint32_t ns = llama3 || kind == PRETOK_SPLIT_REGEX ? 0 : tiktoken_published(kind, &pn, &pi);
	for (uint32_t i = 0; i < ns; i++) {
		names[i] = pn[i];
		ids[i] = pi[i];
	}
	for (uint32_t i = 0; llama3 && i < LLAMA3_NSPECIAL; i++, ns++) {
		tiktoken_llama3_special(i, llama3_names[i], sizeof(llama3_names[i]));
		names[ns] = llama3_names[i];
		ids[ns] = LLAMA3_RANKS + i;
	}
	for (int i = 0; i < specials.n; i++) {
		uint32_t j = 0;
		while (j < ns && strcmp(names[j], copies[i]))
			j++;
		names[j] = copies[i];
		ids[j] = opt_ids[i];
		ns += j == ns;
	}
	/* a regex: its matches are the pieces (Isolated), set once the ranks
	 * are read */
	uint32_t read_kind = kind == PRETOK_SPLIT_REGEX ? PRETOK_GPT2 : (uint32_t)kind;
	rc = tiktoken_import_mem(&tok, file.data, file.len, args[0], read_kind, ns, names, ids);
	if (!rc && kind == PRETOK_SPLIT_REGEX)
		rc = tokenizer_set_split_regex(tok, pattern, strlen(pattern), SPLIT_ISOLATED, 0,
					       "--pattern");
	if (!rc)
		rc = tokenizer_save(tok, output);
out:
	tokenizer_free(tok);
	buf_free(&file);
	free(llama3_names);
	for (int i = 0; i < specials.n; i++)
		free(copies[i]);
	return rc ? EXIT_FAIL : EXIT_OK;
}

/* ---- import-hf ---- */

static int do_import_hf(int n, char **args)
{
	if (n != 1)
		opts_usage_error(usage, options, "import-hf needs one TOKENIZER_JSON (a Hugging "
				 "Face tokenizer.json)");
	if (!output)
		opts_usage_error(usage, options, "import-hf needs -o TOK");
	struct tokenizer *tok = NULL;
	int rc = opts_output_is_new(output, force) || hf_tokenizer_read(&tok, args[0], -1) ||
		 tokenizer_save(tok, output);
	tokenizer_free(tok);
	return rc ? EXIT_FAIL : EXIT_OK;
}

/* ---- encode ---- */

static int do_encode(int n, char **files)
{
	if (!n)
		opts_usage_error(usage, options,
				 "encode needs inputs (files, directories, globs, or - for stdin)");
	if (!tok_path)
		opts_usage_error(usage, options, "encode needs -t TOK");
	struct corpus_opts co;
	input_opts(&co);
	if (!(val_fraction >= 0 && val_fraction <= 1))
		opts_usage_error(usage, options, "--val-fraction must be in [0, 1]");
	if (threads < 0 || threads > 4096)
		opts_usage_error(usage, options, "--threads must be in 0..4096");
	if (chunk_tokens < 1 || chunk_tokens > (1L << 26))
		opts_usage_error(usage, options, "--chunk-tokens must be in 1..67108864");
	struct tokenizer *tok;
	if (tokenizer_load(&tok, tok_path))
		return EXIT_FAIL;
	const char *prefix = output ? output : "tokens";
	size_t plen = strlen(prefix) + 16;
	char *train_path = xmalloc(plen), *val_path = xmalloc(plen);
	snprintf(train_path, plen, "%s_train.shard", prefix);
	snprintf(val_path, plen, "%s_val.shard", prefix);
	struct encode_opts o = {
		.tok = tok,
		.nthreads = threads ? (int)threads : omp_get_num_procs(),
		.val_fraction = val_fraction,
		.seed = (uint64_t)seed,
		.chunk_tokens = (uint32_t)chunk_tokens,
		.train_path = print_ids ? NULL : train_path,
		.val_path = val_path,
		.ids_out = stdout,
		.progress = !quiet && stderr_is_tty(),
	};
	struct encode_result r;
	struct corpus *c = NULL;
	int rc = EXIT_FAIL;
	if (!print_ids && (opts_output_is_new(train_path, force) ||
			   (val_fraction > 0 && opts_output_is_new(val_path, force))))
		goto out;
	if (open_corpus(&c, n, files, &co))
		goto out;
	double t0 = now_sec();
	int bad = encode_corpus(c, &o, &r);
	report_reader(c, !bad);
	if (bad)
		goto out;
	rc = EXIT_OK;
	if (print_ids)
		goto out;
	if (!quiet) {
		fprintf(stderr, "asyncpp: %s: %" PRIu64 " tokens", train_path, r.train_tokens);
		if (val_fraction > 0)
			fprintf(stderr, "; %s: %" PRIu64 " tokens", val_path, r.val_tokens);
		else
			fprintf(stderr, ", no val shard at --val-fraction 0");
		fprintf(stderr, " (%" PRIu64 " document%s, %.1f MB in %.2f s, %d threads)\n",
			r.docs, r.docs == 1 ? "" : "s", r.bytes / 1e6, now_sec() - t0, o.nthreads);
	}
	if (val_fraction <= 0 && access(val_path, F_OK) == 0)
		warning("'%s' is left from before: --val-fraction 0 writes no val shard, so it does "
			"not hold this input's text; remove it, or encode with --val-fraction above 0 "
			"to replace it", val_path);
	if (!r.docs)
		warning("the input holds no documents: %s%s%s %s empty (training needs more tokens "
			"than model.seq_len)", train_path, val_fraction > 0 ? " and " : "",
			val_fraction > 0 ? val_path : "", val_fraction > 0 ? "are" : "is");
	else if (r.by_position && r.docs < r.min_docs)
		warning("%" PRIu64 " document%s too few to split by document at --val-fraction %g "
			"(that takes %" PRIu64 " or more); split by position instead: the last %"
			PRIu64 " of %" PRIu64 " tokens are %s", r.docs,
			r.docs == 1 ? " is" : "s are", val_fraction, r.min_docs, r.val_tokens,
			r.train_tokens + r.val_tokens, val_path);
	else if (r.by_position)
		warning("none of the %" PRIu64 " documents was drawn for validation at "
			"--val-fraction %g; split by position instead: the last %" PRIu64 " of %"
			PRIu64 " tokens are %s", r.docs, val_fraction, r.val_tokens,
			r.train_tokens + r.val_tokens, val_path);
out:
	corpus_close(c);
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
	int cont = 0; /* ids continue a document of the chunk before */
	for (uint64_t at = 0; at < total;) {
		size_t n = total - at < DECODE_TOKENS ? (size_t)(total - at) : DECODE_TOKENS;
		if (shard_read(s, at, n, ids))
			goto done;
		text.len = 0;
		if (tokenizer_decode(tok, ids, n, (show_eot ? 0 : TOK_DECODE_SKIP_SPECIAL) |
				     (cont ? TOK_DECODE_CONTINUE : 0), &text))
			goto done;
		cont = !tokenizer_is_special(tok, ids[n - 1]);
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

int cmd_tokenize(int argc, char **argv, const char *prog)
{
	int n = opts_parse(argc, argv, usage, options, description);
	if (!n)
		opts_usage_error(usage, options, "tokenize needs a subcommand: train, import-gpt2, "
				 "import-tiktoken, import-hf, encode or decode");
	const char *what = argv[0];
	if (!strcmp(what, "train"))
		return do_train(n - 1, argv + 1);
	if (!strcmp(what, "import-gpt2"))
		return do_import(n - 1, argv + 1);
	if (!strcmp(what, "import-tiktoken"))
		return do_import_tiktoken(n - 1, argv + 1);
	if (!strcmp(what, "import-hf"))
		return do_import_hf(n - 1, argv + 1);
	if (!strcmp(what, "encode"))
		return do_encode(n - 1, argv + 1);
	if (!strcmp(what, "decode"))
		return do_decode(n - 1, argv + 1);
	static const char *const whats[] = {"train", "import-gpt2", "import-tiktoken",
					    "import-hf", "encode", "decode"};
	struct suggest sg;
	char near[128];
	suggest_init(&sg, what);
	for (size_t i = 0; i < ARRAY_SIZE(whats); i++)
		suggest_offer(&sg, whats[i]);
	if (suggest_text(&sg, "'%s'", near, sizeof(near)))
		opts_usage_error(usage, options, "unknown tokenize command '%s'; did you mean %s?",
				 what, near);
	opts_usage_error(usage, options, "unknown tokenize command '%s'", what);
	return EXIT_USAGE;
}
