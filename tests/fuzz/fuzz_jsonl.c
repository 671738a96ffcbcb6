/* fuzz_jsonl.c - the JSONL record scanner and the corpus reader.
 *
 * 1. json_record_string agrees with the tree parser on any bytes: the same
 *    records are valid, the same ones are objects with a string "text", and
 *    the decoded strings are equal.
 * 2. Read as a file (a buffer size taken from the first byte, so records
 *    cross buffer boundaries; gzip or zstd when the bytes say so), the JSONL
 *    documents are exactly the lines' records as the scanner decodes them,
 *    every non-blank line is a document, an empty one or a bad record, and
 *    the text documents of the file are a partition of its bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../io/text/corpus.h"
#include "../../io/text/json.h"
#include "../../io/util.h"
#include "fuzz_file.h"

static void differential(const uint8_t *data, size_t size)
{
	struct buf out = {0};
	struct json_record_error e;
	enum json_record r = json_record_string((const char *)data, size, "text", &out, &e);
	struct json *j;
	if (json_parse(&j, (const char *)data, size, "fuzz")) {
		if (r != JSON_RECORD_INVALID || !e.why)
			abort();
		buf_free(&out);
		return;
	}
	const struct json *t = json_get(j, "text");
	if (j->type != JSON_OBJECT) {
		if (r != JSON_RECORD_NOT_OBJECT || e.type != j->type)
			abort();
	} else if (!t) {
		if (r != JSON_RECORD_NO_MEMBER)
			abort();
	} else if (t->type != JSON_STRING) {
		if (r != JSON_RECORD_NOT_STRING || e.type != t->type)
			abort();
	} else if (r != JSON_RECORD_OK || out.len != t->len || memcmp(out.data, t->str, t->len)) {
		abort();
	}
	json_free(j);
	buf_free(&out);
}

static int is_blank(const uint8_t *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
			return 0;
	return 1;
}

static int plain(const uint8_t *d, size_t n)
{
	return !(n >= 2 && d[0] == 0x1f && d[1] == 0x8b) &&
	       !(n >= 4 && ((d[0] == 0x28 && d[1] == 0xb5 && d[2] == 0x2f && d[3] == 0xfd) ||
			    ((d[0] & 0xf0) == 0x50 && d[1] == 0x2a && d[2] == 0x4d && d[3] == 0x18)));
}

static void as_file(const uint8_t *data, size_t size)
{
	char path[512];
	if (fuzz_file(data, size, "fuzz-jsonl", path))
		return;
	char *p = path;
	size_t bs = size ? 8 + data[0] % 64 : 8;
	struct corpus_opts o = {.format = CORPUS_JSONL, .max_bad = UINT64_MAX, .buf_size = bs};
	struct corpus *c;
	const unsigned char *doc;
	size_t len;
	int r;
	corpus_open(&c, &p, 1, &o);
	if (!plain(data, size)) { /* compressed, or corrupt: either way no crash */
		while (corpus_next(c, &doc, &len) > 0)
			;
		corpus_close(c);
		unlink(path);
		return;
	}
	/* the lines, as the reader should see them */
	struct buf want = {0};
	uint64_t records = 0, bad = 0, empty = 0;
	for (size_t at = 0, line = 1; at < size; line++) {
		const uint8_t *nl = memchr(data + at, '\n', size - at);
		size_t end = nl ? (size_t)(nl - data) : size, n = end - at;
		const uint8_t *s = data + at;
		at = nl ? end + 1 : size;
		if (is_blank(s, n))
			continue;
		records++;
		n -= s[n - 1] == '\r';
		if (line == 1 && n >= 3 && !memcmp(s, "\xEF\xBB\xBF", 3))
			s += 3, n -= 3;
		struct buf out = {0};
		struct json_record_error e;
		if (json_record_string((const char *)s, n, "text", &out, &e) != JSON_RECORD_OK)
			bad++;
		else if (!out.len)
			empty++;
		else
			buf_append(&want, out.data, out.len), buf_append(&want, "\x1e", 1);
		buf_free(&out);
	}
	struct buf got = {0};
	while ((r = corpus_next(c, &doc, &len)) > 0)
		buf_append(&got, doc, len), buf_append(&got, "\x1e", 1);
	struct corpus_stats st;
	corpus_get_stats(c, &st);
	corpus_close(c);
	if (r || got.len != want.len || (got.len && memcmp(got.data, want.data, got.len)) ||
	    st.records != records || st.bad != bad || st.empty != empty ||
	    st.docs + st.bad + st.empty != st.records)
		abort();
	/* text, blank-line documents: a partition of the bytes */
	o.format = CORPUS_TEXT;
	o.blank_line = 1;
	corpus_open(&c, &p, 1, &o);
	got.len = 0;
	while ((r = corpus_next(c, &doc, &len)) > 0) {
		if (!len)
			abort();
		buf_append(&got, doc, len);
	}
	corpus_close(c);
	if (r || got.len != size || (size && memcmp(got.data, data, size)))
		abort();
	buf_free(&got);
	buf_free(&want);
	unlink(path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	set_error_quiet(1);
	differential(data, size);
	as_file(data, size);
	return 0;
}
