/* fuzz_jsonl.c - the JSONL record scanner and the corpus reader.
 *
 * 1. json_record_string agrees with the tree parser on any bytes: the same
 *    records are valid, the same ones are objects with a string "text", and
 *    the decoded strings are equal. Both share the string decoder, so the
 *    bytes are also taken as the inside of a string and checked against a
 *    plain byte-by-byte decoder written here (utf8_decode for UTF-8).
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
#include "../../io/text/pretok.h"
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

static int hexval(uint8_t c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 :
	       c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

static int hex4_ref(const uint8_t *d, size_t n, size_t i, uint32_t *cp)
{
	*cp = 0;
	if (i + 4 > n)
		return -1;
	for (int k = 0; k < 4; k++) {
		int v = hexval(d[i + k]);
		if (v < 0)
			return -1;
		*cp = *cp * 16 + (uint32_t)v;
	}
	return 0;
}

/* d[0..n) as the inside of a JSON string, the slow way: 1 and its bytes in
 * out, 0 when it is not valid, -1 when it holds a raw quote (not comparable:
 * the string would end there). */
static int ref_string(const uint8_t *d, size_t n, struct buf *out)
{
	for (size_t i = 0; i < n;) {
		uint8_t c = d[i];
		uint32_t cp, lo;
		if (c == '"')
			return -1;
		if (c < 0x20)
			return 0;
		if (c != '\\') {
			size_t k = utf8_decode(d + i, n - i, &cp);
			if (!k)
				return 0;
			buf_append(out, d + i, k);
			i += k;
			continue;
		}
		if (i + 1 >= n)
			return 0;
		const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
		const char *m = d[i + 1] ? strchr(from, d[i + 1]) : NULL;
		if (m) {
			buf_append(out, to + (m - from), 1);
			i += 2;
			continue;
		}
		if (d[i + 1] != 'u' || hex4_ref(d, n, i + 2, &cp))
			return 0;
		i += 6;
		if (cp >= 0xD800 && cp <= 0xDBFF) {
			if (i + 2 > n || d[i] != '\\' || d[i + 1] != 'u' || hex4_ref(d, n, i + 2, &lo) ||
			    lo < 0xDC00 || lo > 0xDFFF)
				return 0;
			i += 6;
			cp = 0x10000 + (cp - 0xD800) * 0x400 + (lo - 0xDC00);
		} else if (cp >= 0xDC00 && cp <= 0xDFFF) {
			return 0;
		}
		uint8_t u[4];
		size_t k;
		if (cp < 0x80)
			u[0] = (uint8_t)cp, k = 1;
		else if (cp < 0x800)
			u[0] = 0xC0 | cp >> 6, u[1] = 0x80 | (cp & 63), k = 2;
		else if (cp < 0x10000)
			u[0] = 0xE0 | cp >> 12, u[1] = 0x80 | (cp >> 6 & 63), u[2] = 0x80 | (cp & 63), k = 3;
		else
			u[0] = 0xF0 | cp >> 18, u[1] = 0x80 | (cp >> 12 & 63), u[2] = 0x80 | (cp >> 6 & 63),
			u[3] = 0x80 | (cp & 63), k = 4;
		buf_append(out, u, k);
	}
	return 1;
}

static void string_contents(const uint8_t *data, size_t size)
{
	struct buf rec = {0}, want = {0}, got = {0};
	int ref = ref_string(data, size, &want);
	if (ref >= 0) {
		struct json_record_error e;
		buf_append(&rec, "{\"text\":\"", 9);
		buf_append(&rec, data, size);
		buf_append(&rec, "\"}", 2);
		enum json_record r = json_record_string((const char *)rec.data, rec.len, "text", &got, &e);
		if (ref ? r != JSON_RECORD_OK || got.len != want.len ||
				  (got.len && memcmp(got.data, want.data, got.len)) :
			  r != JSON_RECORD_INVALID)
			abort();
	}
	buf_free(&rec);
	buf_free(&want);
	buf_free(&got);
}

static int is_blank(const uint8_t *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
			return 0;
	return 1;
}

/* Is the file read as plain lines? Not when it is gzip or zstd, nor when it
 * starts as a Parquet file does (the reader refuses it, naming
 * --format parquet). */
static int plain(const uint8_t *d, size_t n)
{
	return !(n >= 2 && d[0] == 0x1f && d[1] == 0x8b) &&
	       !(n >= 5 && !memcmp(d, "PAR1\x15", 5)) &&
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
	if (!plain(data, size)) { /* compressed, corrupt or refused: no crash */
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
	string_contents(data, size);
	as_file(data, size);
	return 0;
}
