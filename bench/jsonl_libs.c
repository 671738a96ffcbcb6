/* jsonl_libs.c - the JSONL record scanner (json_record_string, used by
 * `asyncpp tokenize --format jsonl`) against Jansson and cJSON on the same
 * records: each method takes every line of a JSONL file, checks it and gets
 * its "text" string; the best time of 5 rounds is printed as MB/s of JSONL.
 * All three must agree on the records and the bytes of their texts.
 *
 * Not part of the build (the project links neither library). With Debian's
 * libjansson-dev and libcjson-dev installed, from the top of the tree:
 *
 *   cc -O3 -march=native -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE \
 *      -I/usr/include/cjson -o /tmp/jsonl_libs bench/jsonl_libs.c \
 *      bench/jsonl_libs_jansson.c io/text/json.c io/text/pretok.c \
 *      io/text/unicode_tables.c io/util.c -ljansson -lcjson -lm -lpthread
 *   python3 bench/jsonl_samples.py kjv.txt /tmp/samples
 *   /tmp/jsonl_libs /tmp/samples/*.jsonl
 *
 * bench/NOTES.md has the figures.
 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../io/text/json.h"
#include "../io/util.h"

struct tally {
	size_t records, bytes;
};

static void run_asyncpp(const unsigned char *s, size_t n, struct tally *t)
{
	struct buf out = {0};
	struct json_record_error e;
	for (size_t at = 0; at < n;) {
		const unsigned char *nl = memchr(s + at, '\n', n - at);
		size_t end = nl ? (size_t)(nl - s) : n;
		if (json_record_string((const char *)s + at, end - at, "text", &out, &e) ==
		    JSON_RECORD_OK) {
			t->records++;
			t->bytes += out.len;
		}
		at = end + 1;
	}
	buf_free(&out);
}

/* in jsonl_libs_jansson.c: jansson.h and json.h both define JSON_NULL... */
void run_jansson(const unsigned char *s, size_t n, size_t *records, size_t *bytes);

static void jansson(const unsigned char *s, size_t n, struct tally *t)
{
	run_jansson(s, n, &t->records, &t->bytes);
}

static void run_cjson(const unsigned char *s, size_t n, struct tally *t)
{
	for (size_t at = 0; at < n;) {
		const unsigned char *nl = memchr(s + at, '\n', n - at);
		size_t end = nl ? (size_t)(nl - s) : n;
		cJSON *root = cJSON_ParseWithLength((const char *)s + at, end - at);
		cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "text");
		if (cJSON_IsString(v)) {
			t->records++;
			t->bytes += strlen(v->valuestring); /* cJSON strings stop at a NUL */
		}
		cJSON_Delete(root);
		at = end + 1;
	}
}

int main(int argc, char **argv)
{
	static const struct {
		const char *name;
		void (*fn)(const unsigned char *, size_t, struct tally *);
	} m[] = {{"asyncpp json_record_string", run_asyncpp},
		 {"Jansson 2.14 json_loadb", jansson},
		 {"cJSON 1.7.15 ParseWithLength", run_cjson}};
	for (int f = 1; f < argc; f++) {
		struct buf b = {0};
		if (read_file(argv[f], &b))
			return 1;
		printf("%s: %.1f MB\n", argv[f], b.len / 1e6);
		struct tally first = {0};
		for (int k = 0; k < 3; k++) {
			double best = 1e30;
			struct tally t = {0};
			for (int round = 0; round < 5; round++) {
				t = (struct tally){0};
				double t0 = now_sec();
				m[k].fn(b.data, b.len, &t);
				double dt = now_sec() - t0;
				best = dt < best ? dt : best;
			}
			if (!k)
				first = t;
			printf("  %-30s %8.1f MB/s  %zu records, %zu bytes of text%s\n", m[k].name,
			       b.len / 1e6 / best, t.records, t.bytes,
			       k && (t.records != first.records || t.bytes != first.bytes) ?
				       "  DIFFERENT" : "");
		}
		buf_free(&b);
	}
	return 0;
}
