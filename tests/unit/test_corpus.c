/* test_corpus.c - the corpus reader (io/text/corpus.h): the documents of
 * text, lines and JSONL files; gzip and zstd by magic, several members and
 * frames; directories and globs; JSON escapes; bad records named by file and
 * line and counted; every buffer size giving the same documents. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>
#include <zstd.h>

#include "../../io/text/corpus.h"
#include "../../io/util.h"
#include "../test.h"

static int write_str(const char *path, const char *s) { return test_write_file(path, s, strlen(s)); }

/* s[0..n) as one gzip member appended to out */
static void gzip_append(struct buf *out, const void *s, size_t n, int level)
{
	z_stream z;
	memset(&z, 0, sizeof(z));
	deflateInit2(&z, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);
	size_t cap = deflateBound(&z, (uLong)n) + 64;
	buf_reserve(out, cap);
	z.next_in = (unsigned char *)s;
	z.avail_in = (uInt)n;
	z.next_out = out->data + out->len;
	z.avail_out = (uInt)cap;
	deflate(&z, Z_FINISH);
	out->len += cap - z.avail_out;
	deflateEnd(&z);
}

static void zstd_append(struct buf *out, const void *s, size_t n)
{
	size_t cap = ZSTD_compressBound(n);
	buf_reserve(out, cap);
	out->len += ZSTD_compress(out->data + out->len, cap, s, n, 3);
}

/* Every document of the inputs, each followed by '|', into got; the return
 * value of the last corpus_next. */
static int read_docs(char **paths, int n, const struct corpus_opts *o, struct buf *got,
		     struct corpus_stats *st)
{
	struct corpus *c;
	const unsigned char *d;
	size_t len;
	int r;
	corpus_open(&c, paths, n, o);
	got->len = 0;
	while ((r = corpus_next(c, &d, &len)) > 0) {
		if (!len)
			r = -2; /* documents are never empty */
		buf_append(got, d, len);
		buf_append(got, "|", 1);
	}
	if (st)
		corpus_get_stats(c, st);
	corpus_close(c);
	buf_append(got, "", 1);
	got->len--;
	return r;
}

static int docs_are(const char *path, const struct corpus_opts *o, const char *want)
{
	struct buf got = {0};
	char *p = (char *)path;
	int r = read_docs(&p, 1, o, &got, NULL);
	int ok = r == 0 && got.len == strlen(want) && !memcmp(got.data, want, got.len);
	if (!ok)
		fprintf(stderr, "%s: got [%s] (rc %d), want [%s]\n", path, (char *)got.data, r, want);
	buf_free(&got);
	return ok;
}

TEST(text_whole_file_and_blank_lines)
{
	const char *f = test_path("a.txt");
	CHECK(!write_str(f, "\n\nOne\ntwo\n\n\nThree\r\n\r\n \t\nfour"));
	struct corpus_opts o = {.format = CORPUS_TEXT};
	CHECK(docs_are(f, &o, "\n\nOne\ntwo\n\n\nThree\r\n\r\n \t\nfour|"));
	o.blank_line = 1;
	/* the blank lines stay in the document they end; CR and spaces are blank */
	CHECK(docs_are(f, &o, "\n\nOne\ntwo\n\n\n|Three\r\n\r\n \t\n|four|"));
	CHECK(!write_str(f, ""));
	CHECK(docs_are(f, &o, ""));
	o.blank_line = 0;
	CHECK(docs_are(f, &o, ""));
	CHECK(!write_str(f, "no blank line\nat all\n"));
	o.blank_line = 1;
	CHECK(docs_are(f, &o, "no blank line\nat all\n|"));
}

TEST(lines_strip_ends_and_skip_blank)
{
	const char *f = test_path("l.txt");
	CHECK(!write_str(f, "first\r\nsecond\n\n  \r\n\tthird \nlast"));
	struct corpus_opts o = {.format = CORPUS_LINES};
	CHECK(docs_are(f, &o, "first|second|\tthird |last|"));
}

TEST(jsonl_escapes_and_fields)
{
	const char *f = test_path("j.jsonl");
	CHECK(!write_str(f,
			 "\xEF\xBB\xBF{\"text\": \"a\\\"b\\\\c\\/d\\n\\t\\u00e9\\u20AC\\ud83d\\ude00\"}\r\n"
			 "\n"
			 "  {\"id\": 1, \"meta\": {\"text\": \"inner\"}, \"text\": \"caf\xC3\xA9\"}  \n"
			 "{\"text\": \"first\", \"text\": \"second\"}\n"
			 "{\"text\": \"\"}\n"
			 "{\"body\": \"other field\", \"text\": \"x\"}\n"
			 "{\"te\\u0078t\": \"escaped name\"}"));
	struct corpus_opts o = {.format = CORPUS_JSONL};
	struct buf got = {0};
	struct corpus_stats st;
	char *p = (char *)f;
	CHECK(read_docs(&p, 1, &o, &got, &st) == 0);
	const char want[] = "a\"b\\c/d\n\t\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80|caf\xC3\xA9|second|"
			    "x|"
			    "escaped name|";
	CHECK_MSG(got.len == sizeof(want) - 1 && !memcmp(got.data, want, got.len), "got [%s]",
		  (char *)got.data);
	CHECK(st.records == 6 && st.docs == 5 && st.empty == 1 && st.bad == 0);
	o.field = "body";
	CHECK(!write_str(f, "{\"body\": \"nul\\u0000inside\"}\n"));
	CHECK(read_docs(&p, 1, &o, &got, &st) == 0);
	CHECK(got.len == 11 && !memcmp(got.data, "nul\0inside|", 11));
	buf_free(&got);
}

TEST(jsonl_bad_records_named_and_counted)
{
	const char *f = test_path("bad.jsonl");
	CHECK(!write_str(f, "{\"text\": \"ok 1\"}\n"
			    "{\"text\": \"unterminated}\n"           /* line 2 */
			    "[\"an array\"]\n"                       /* 3 */
			    "{\"title\": \"no text\"}\n"              /* 4 */
			    "{\"text\": null}\n"                     /* 5 */
			    "{\"text\": \"lone \\ud800\"}\n"          /* 6 */
			    "{\"text\": \"bad utf8 \xFF\"}\n"         /* 7 */
			    "{\"text\": \"ok 2\"} trailing\n"        /* 8 */
			    "{\"text\": \"ok 3\"}\n"));
	struct corpus_opts o = {.format = CORPUS_JSONL, .max_bad = 7, .show_bad = 2};
	struct buf got = {0};
	struct corpus_stats st;
	char *p = (char *)f;
	set_error_quiet(1);
	int r = read_docs(&p, 1, &o, &got, &st);
	set_error_quiet(0);
	CHECK(r == 0);
	CHECK(!strcmp((char *)got.data, "ok 1|ok 3|"));
	CHECK(st.records == 9 && st.bad == 7 && st.docs == 2 && !st.too_many_bad);
	/* one fewer allowed: the read stops at the 7th bad record, named */
	const char *why[] = {
		"bad.jsonl:2: not valid JSON (byte 24: unterminated string)",
		"bad.jsonl:3: an array, not a JSON object",
		"bad.jsonl:4: no member \"text\"",
		"bad.jsonl:5: member \"text\" is null, not a string",
		"bad.jsonl:6: not valid JSON (byte 22: bad surrogate pair in a \\u escape)",
		"bad.jsonl:7: not valid JSON (byte 20: string is not valid UTF-8)",
		"bad.jsonl:8: not valid JSON (byte 18: trailing characters after the JSON value)",
	};
	for (int k = 0; k < 7; k++) {
		o.max_bad = (uint64_t)k;
		set_error_quiet(1);
		r = read_docs(&p, 1, &o, &got, &st);
		set_error_quiet(0);
		CHECK(r == -1 && st.too_many_bad && st.bad == (uint64_t)k + 1);
		const char *msg = last_error();
		CHECK_MSG(strstr(msg, why[k]) && strstr(msg, test_tmpdir()), "k=%d: %s", k, msg);
	}
	/* skipped ones are named too (as warnings) */
	o.max_bad = 1;
	CHECK(!write_str(f, "{\"text\": 1}\n{\"text\": \"fine\"}\n"));
	set_error_quiet(1);
	r = read_docs(&p, 1, &o, &got, &st);
	set_error_quiet(0);
	CHECK(r == 0 && st.bad == 1 && !strcmp((char *)got.data, "fine|"));
	CHECK_MSG(strstr(last_error(), "bad.jsonl:1: member \"text\" is a number, not a string; "
				       "record skipped"), "%s", last_error());
	buf_free(&got);
}

/* A text of many short documents, as text, lines and JSONL. */
static void make_corpus(struct buf *text, struct buf *lines, struct buf *jsonl, int ndocs)
{
	uint64_t s = 7;
	for (int d = 0; d < ndocs; d++) {
		char doc[200];
		int n = snprintf(doc, sizeof(doc), "Doc %d says \"hi\" \\ %llu \xC3\xA9 end", d,
				 (unsigned long long)(rng_next(&s) % 100000));
		buf_append(text, doc, (size_t)n);
		buf_append(text, "\n\n", 2);
		buf_append(lines, doc, (size_t)n);
		buf_append(lines, d % 2 ? "\r\n" : "\n", d % 2 ? 2 : 1);
		buf_append(jsonl, "{\"n\": [1, {\"x\": 2.5e3}], \"text\": \"", 34);
		for (int i = 0; i < n; i++) {
			if (doc[i] == '"' || doc[i] == '\\')
				buf_append(jsonl, "\\", 1);
			buf_append(jsonl, doc + i, 1);
		}
		buf_append(jsonl, "\"}\n", 3);
	}
}

TEST(compressed_and_every_buffer_size)
{
	struct buf text = {0}, lines = {0}, jsonl = {0}, gz = {0}, zs = {0}, want = {0}, got = {0};
	make_corpus(&text, &lines, &jsonl, 300);
	/* gzip in two members, zstd in two frames, cut mid-line */
	size_t half = jsonl.len / 2 + 3;
	gzip_append(&gz, jsonl.data, half, 6);
	gzip_append(&gz, jsonl.data + half, jsonl.len - half, 1);
	zstd_append(&zs, jsonl.data, half);
	zstd_append(&zs, jsonl.data + half, jsonl.len - half);
	const char *fj = test_path("c.jsonl"), *fg = test_path("c.jsonl.gz"), *fz = test_path("c.jsonl.zst");
	const char *fgz_noext = test_path("c-gzip-no-suffix"), *ft = test_path("c.txt"), *fl = test_path("c.lines");
	CHECK(!test_write_file(fj, jsonl.data, jsonl.len) && !test_write_file(fg, gz.data, gz.len) &&
	      !test_write_file(fz, zs.data, zs.len) && !test_write_file(fgz_noext, gz.data, gz.len) &&
	      !test_write_file(ft, text.data, text.len) && !test_write_file(fl, lines.data, lines.len));
	char *p = (char *)fl;
	struct corpus_opts o = {.format = CORPUS_LINES};
	CHECK(read_docs(&p, 1, &o, &want, NULL) == 0);
	CHECK(want.len > 300 * 30);
	/* the documents of the text's blank-line blocks, less their "\n\n" */
	const char *inputs[] = {fj, fg, fz, fgz_noext, ft, fl};
	for (size_t bs = 8; bs <= (1u << 20); bs = bs < 64 ? bs + 7 : bs * 5) {
		for (int k = 0; k < 6; k++) {
			struct corpus_opts oo = {.format = k < 4 ? CORPUS_JSONL : k == 4 ? CORPUS_TEXT :
									  CORPUS_LINES,
						 .blank_line = 1, .buf_size = bs};
			p = (char *)inputs[k];
			CHECK_MSG(read_docs(&p, 1, &oo, &got, NULL) == 0, "%s, buffer %zu: %s",
				  inputs[k], bs, last_error());
			if (k == 4) { /* drop the blank lines the text documents keep */
				size_t w = 0;
				for (size_t i = 0; i < got.len; i++)
					if (!(got.data[i] == '\n' && i + 1 < got.len &&
					      (got.data[i + 1] == '\n' || got.data[i + 1] == '|')))
						got.data[w++] = got.data[i];
				got.len = w;
			}
			CHECK_MSG(got.len == want.len && !memcmp(got.data, want.data, want.len),
				  "%s differs with a %zu-byte buffer", inputs[k], bs);
		}
	}
	buf_free(&text);
	buf_free(&lines);
	buf_free(&jsonl);
	buf_free(&gz);
	buf_free(&zs);
	buf_free(&want);
	buf_free(&got);
}

TEST(corrupt_truncated_or_misnamed_compression)
{
	const char *doc = "{\"text\": \"hello\"}\n";
	struct buf gz = {0}, zs = {0}, got = {0};
	for (int i = 0; i < 50; i++) {
		gzip_append(&gz, doc, strlen(doc), 6);
		zstd_append(&zs, doc, strlen(doc));
	}
	struct corpus_opts o = {.format = CORPUS_JSONL, .buf_size = 16};
	char *p = test_path("t.jsonl.gz");
	CHECK(!test_write_file(p, gz.data, gz.len - 5));
	set_error_quiet(1);
	CHECK(read_docs(&p, 1, &o, &got, NULL) == -1 && strstr(last_error(), "truncated gzip"));
	p = test_path("t.jsonl.zst");
	CHECK(!test_write_file(p, zs.data, zs.len - 3));
	CHECK(read_docs(&p, 1, &o, &got, NULL) == -1 && strstr(last_error(), "truncated zstd"));
	zs.data[zs.len / 2] ^= 0x55;
	CHECK(!test_write_file(p, zs.data, zs.len));
	CHECK(read_docs(&p, 1, &o, &got, NULL) == -1 && strstr(last_error(), "zstd"));
	gz.data[gz.len / 2] ^= 0x55;
	p = test_path("u.jsonl.gz");
	CHECK(!test_write_file(p, gz.data, gz.len));
	CHECK(read_docs(&p, 1, &o, &got, NULL) == -1 && strstr(last_error(), "gzip"));
	/* the name says compressed, the bytes do not */
	p = test_path("plain.txt.gz");
	CHECK(!write_str(p, doc));
	CHECK(read_docs(&p, 1, &o, &got, NULL) == -1 && strstr(last_error(), "not gzip data"));
	p = test_path("plain.txt.zst");
	CHECK(!write_str(p, doc));
	CHECK(read_docs(&p, 1, &o, &got, NULL) == -1 && strstr(last_error(), "not zstd data"));
	p = test_path("missing.txt");
	CHECK(read_docs(&p, 1, &o, &got, NULL) == -1 && strstr(last_error(), "missing.txt"));
	set_error_quiet(0);
	/* a short plain file (under 4 bytes) is text */
	p = test_path("ab");
	CHECK(!write_str(p, "ab"));
	o.format = CORPUS_TEXT;
	CHECK(read_docs(&p, 1, &o, &got, NULL) == 0 && !strcmp((char *)got.data, "ab|"));
	buf_free(&gz);
	buf_free(&zs);
	buf_free(&got);
}

TEST(directories_and_globs_sorted)
{
	char dir[512], sub[600], hid[600];
	snprintf(dir, sizeof(dir), "%s/docs", test_tmpdir());
	snprintf(sub, sizeof(sub), "%s/b-sub", dir);
	snprintf(hid, sizeof(hid), "%s/.hidden", dir);
	CHECK(!mkdir(dir, 0755) && !mkdir(sub, 0755) && !mkdir(hid, 0755));
	char f[700];
	const char *names[][2] = {{"c.txt", "C"}, {"a.txt", "A"}, {"b-sub/x.txt", "X"},
				  {".hidden/h.txt", "H"}, {".dot.txt", "D"}, {"b.md", "B"}};
	for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
		snprintf(f, sizeof(f), "%s/%s", dir, names[i][0]);
		CHECK(!write_str(f, names[i][1]));
	}
	char **paths;
	int n;
	char glob[600], *args[3] = {dir, glob, NULL};
	snprintf(glob, sizeof(glob), "%s/*.txt", dir);
	CHECK(corpus_expand(args, 2, NULL, &paths, &n) == 0);
	struct buf got = {0};
	struct corpus_opts o = {.format = CORPUS_TEXT};
	CHECK(read_docs(paths, n, &o, &got, NULL) == 0);
	corpus_paths_free(paths, n);
	/* the directory: a.txt b-sub/x.txt b.md c.txt; the glob: a.txt c.txt */
	CHECK_MSG(!strcmp((char *)got.data, "A|X|B|C|A|C|"), "got %s", (char *)got.data);
	snprintf(glob, sizeof(glob), "%s/*.nothing", dir);
	set_error_quiet(1);
	CHECK(corpus_expand(args + 1, 1, NULL, &paths, &n) == -1 && strstr(last_error(), "*.nothing"));
	snprintf(glob, sizeof(glob), "%s/absent.txt", dir);
	CHECK(corpus_expand(args + 1, 1, NULL, &paths, &n) == -1 &&
	      strstr(last_error(), "No such file"));
	set_error_quiet(0);
	buf_free(&got);
}

TEST(format_names)
{
	enum corpus_format f;
	CHECK(!corpus_format_parse("jsonl", &f) && f == CORPUS_JSONL);
	CHECK(!corpus_format_parse("lines", &f) && f == CORPUS_LINES);
	CHECK(!corpus_format_parse("text", &f) && f == CORPUS_TEXT);
	CHECK(corpus_format_parse("json", &f) == -1);
}

TEST(format_by_name)
{
	static const struct {
		const char *name;
		enum corpus_format f;
	} cases[] = {
		{"a.jsonl", CORPUS_JSONL},        {"d/b.JSONL.zst", CORPUS_JSONL},
		{"c.ndjson.gz", CORPUS_JSONL},    {"c.json", CORPUS_JSONL},
		{"x.parquet", CORPUS_PARQUET},    {"x.Parquet.zst", CORPUS_PARQUET},
		{"kjv.txt", CORPUS_TEXT},         {"kjv.txt.gz", CORPUS_TEXT},
		{"jsonl", CORPUS_TEXT},           {"a.jsonl.bak", CORPUS_TEXT},
		{"a.gz", CORPUS_TEXT},            {"", CORPUS_TEXT},
	};
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++)
		CHECK_MSG(corpus_format_of_name(cases[i].name) == cases[i].f, "%s", cases[i].name);
	enum corpus_format f;
	CHECK(!corpus_format_parse("parquet", &f) && !strcmp(corpus_format_name(f), "parquet"));
}

/* o.infer: each file read as its name says (Parquet also by its magic),
 * counted by format; JSON Lines in a text file is flagged; a .json array is
 * refused. */
TEST(infer_format_per_file)
{
	const char *j = test_path("r.jsonl"), *t = test_path("r.txt"), *g = test_path("r.json.gz");
	const char *pq = test_path("pq.dat");
	CHECK(!write_str(j, "{\"text\": \"J1\"}\n{\"text\": \"J2\"}\n"));
	CHECK(!write_str(t, "plain text\n"));
	struct buf z = {0}, data = {0};
	gzip_append(&z, "{\"text\": \"G\"}\n", 14, 6);
	CHECK(!test_write_file(g, z.data, z.len));
	CHECK(!read_file(test_data("parquet/v1_plain.parquet"), &data));
	CHECK(!test_write_file(pq, data.data, data.len));
	char *paths[] = {(char *)j, (char *)t, (char *)g, (char *)pq};
	struct corpus_opts o = {.format = CORPUS_LINES, .infer = 1};
	struct corpus_stats st;
	struct buf got = {0};
	CHECK(read_docs(paths, 3, &o, &got, &st) == 0);
	CHECK_MSG(!strcmp((char *)got.data, "J1|J2|plain text\n|G|"), "got %s", (char *)got.data);
	CHECK(st.files_as[CORPUS_JSONL] == 2 && st.files_as[CORPUS_TEXT] == 1 &&
	      st.files_as[CORPUS_LINES] == 0 && st.json_like == 0);
	CHECK(read_docs(paths + 3, 1, &o, &got, &st) == 0);
	CHECK(st.files_as[CORPUS_PARQUET] == 1 && st.docs > 0);
	/* without infer the named format is used for every file */
	set_error_quiet(1); /* the warnings of JSON read as text */
	o.infer = 0;
	o.format = CORPUS_TEXT;
	CHECK(read_docs(paths, 1, &o, &got, &st) == 0 && st.files_as[CORPUS_TEXT] == 1);
	/* ... and JSON objects read as text are flagged: text, lines, blank lines first */
	CHECK(st.json_like == 1);
	CHECK(!write_str(t, "\n\n  {\"a\": 1}\r\n{\"text\": 2}\n"));
	o.format = CORPUS_LINES;
	CHECK(read_docs(paths + 1, 1, &o, &got, &st) == 0 && st.json_like == 1);
	o.buf_size = 8; /* the first lines found across window refills */
	CHECK(read_docs(paths, 2, &o, &got, &st) == 0 && st.json_like == 2);
	o.buf_size = 0;
	CHECK(!write_str(t, "{\"text\": \"a\"}\nbut then prose\n"));
	CHECK(read_docs(paths + 1, 1, &o, &got, &st) == 0 && st.json_like == 0);
	CHECK(!write_str(t, "[1, 2]\n"));
	CHECK(read_docs(paths + 1, 1, &o, &got, &st) == 0 && st.json_like == 0);
	/* a JSON array where JSON Lines are read: a bad record named as one, with jq */
	const char *a = test_path("arr.json");
	CHECK(!write_str(a, "\n[\n  {\"text\": \"a\"}\n]\n"));
	char *ap = (char *)a;
	o.format = CORPUS_JSONL;
	CHECK(read_docs(&ap, 1, &o, &got, &st) == -1);
	CHECK(strstr(last_error(), "arr.json:2: a JSON array, not JSON Lines") &&
	      strstr(last_error(), "jq -c '.[]' ") && strstr(last_error(), "/arr.jsonl"));
	o.max_bad = 10; /* skipped like any bad record ("[" and "]"; the object is read) */
	CHECK(read_docs(&ap, 1, &o, &got, &st) == 0 && st.bad == 2 && st.docs == 1);
	set_error_quiet(0);
	buf_free(&got);
	buf_free(&z);
	buf_free(&data);
}

/* Formats by name: a folder's Parquet files, else its JSON Lines (.json only without
 * .jsonl or .ndjson), else all. */
TEST(expand_by_name_keeps_data_files)
{
	char dir[512], f[700];
	snprintf(dir, sizeof(dir), "%s/ds", test_tmpdir());
	CHECK(!mkdir(dir, 0755));
	const char *names[] = {"README.md", "info.json", "b.jsonl.zst", "a.parquet", "c.PARQUET"};
	char *args[] = {dir};
	char **paths;
	int n;
	for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
		snprintf(f, sizeof(f), "%s/%s", dir, names[i]);
		CHECK(!write_str(f, "x"));
	}
	CHECK(corpus_expand_by_name(args, 1, &paths, &n) == 0);
	CHECK(n == 2 && strstr(paths[0], "/a.parquet") && strstr(paths[1], "/c.PARQUET"));
	corpus_paths_free(paths, n);
	for (size_t i = 3; i < ARRAY_SIZE(names); i++) {
		snprintf(f, sizeof(f), "%s/%s", dir, names[i]);
		CHECK(!unlink(f));
	}
	/* a .json beside .jsonl files is the folder's metadata (dataset_info.json) */
	CHECK(corpus_expand_by_name(args, 1, &paths, &n) == 0);
	CHECK(n == 1 && strstr(paths[0], "/b.jsonl.zst"));
	corpus_paths_free(paths, n);
	snprintf(f, sizeof(f), "%s/b.jsonl.zst", dir);
	CHECK(!unlink(f));
	CHECK(corpus_expand_by_name(args, 1, &paths, &n) == 0);
	CHECK(n == 1 && strstr(paths[0], "/info.json"));
	corpus_paths_free(paths, n);
	snprintf(f, sizeof(f), "%s/info.json", dir);
	CHECK(!unlink(f));
	CHECK(corpus_expand_by_name(args, 1, &paths, &n) == 0);
	CHECK(n == 1 && strstr(paths[0], "/README.md"));
	corpus_paths_free(paths, n);
	/* explicit files are all taken */
	char *files[] = {f};
	snprintf(f, sizeof(f), "%s/README.md", dir);
	CHECK(corpus_expand_by_name(files, 1, &paths, &n) == 0 && n == 1);
	corpus_paths_free(paths, n);
}
