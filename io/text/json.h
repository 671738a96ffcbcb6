/* json.h - a small JSON reader (RFC 8259) into a tree, and helpers to
 * write JSON strings.
 *
 * For the Hugging Face files (config.json, tokenizer.json, safetensors
 * headers). Strict: no comments, no trailing commas, no NaN; strings must be
 * valid UTF-8 and are decoded (escapes, surrogate pairs) into UTF-8 with a
 * terminating NUL (len excludes it; "\u0000" gives an embedded NUL). Nesting
 * deeper than JSON_MAX_DEPTH is refused. A member name that repeats in an
 * object is kept once, with the last value, in the first one's place (as
 * Python's json and serde_json, Hugging Face's readers, take it), so names
 * are unique within an object. Errors name the file and line.
 */
#ifndef ASYNCPP_JSON_H
#define ASYNCPP_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "../util.h"

#define JSON_MAX_DEPTH 64

enum json_type { JSON_NULL, JSON_FALSE, JSON_TRUE, JSON_NUMBER, JSON_STRING, JSON_ARRAY,
		 JSON_OBJECT };

struct json {
	enum json_type type;
	char *key;          /* member name when the parent is an object */
	size_t key_len;
	char *str;          /* JSON_STRING: decoded UTF-8, NUL-terminated */
	size_t len;         /* string length; array/object: number of kids */
	double num;         /* JSON_NUMBER */
	int is_int;         /* a number without fraction or exponent that fits int64 */
	int64_t i;          /* its value when is_int */
	int line;           /* where the value starts, for messages */
	struct json *kids;  /* array elements or object members, len of them */
};

/* Parse text[0..len) (name is for messages). Returns 0 and a tree to free
 * with json_free, or -1 after error("NAME:LINE: ..."). */
int json_parse(struct json **out, const char *text, size_t len, const char *name);
/* Read and parse a whole file. */
int json_parse_file(struct json **out, const char *path);
void json_free(struct json *j);

/* The member named key of an object (the last value given, see above), or
 * NULL (also when j is not an object). */
const struct json *json_get(const struct json *j, const char *key);
const char *json_type_name(enum json_type t);

/* One JSON Lines record: text[0..len) must be exactly one JSON value, with
 * white space around it, as strict as json_parse, and an object whose last
 * member named key (json_parse's choice) is a string. Its decoded UTF-8 then replaces the contents
 * of out (no NUL is added), and the result is JSON_RECORD_OK (0). Otherwise
 * out is emptied, nothing is printed, and *e says what is wrong: for
 * JSON_RECORD_INVALID the syntax error (why) and its byte offset (at); for
 * NOT_OBJECT the record's type, for NOT_STRING the member's. It checks the
 * whole record without building a tree: the corpus reader calls it on every
 * line of a JSONL file. */
enum json_record { JSON_RECORD_OK, JSON_RECORD_INVALID, JSON_RECORD_NOT_OBJECT,
		   JSON_RECORD_NO_MEMBER, JSON_RECORD_NOT_STRING };
struct json_record_error {
	const char *why;
	size_t at;
	enum json_type type;
};
enum json_record json_record_string(const char *text, size_t len, const char *key,
				    struct buf *out, struct json_record_error *e);

/* Append s[0..n) as a JSON string literal (quotes, escapes; bytes >= 0x80
 * copied as they are: the caller passes UTF-8). */
void json_put_string(struct buf *b, const char *s, size_t n);
/* Is s[0..n) valid UTF-8 (no surrogates, no overlong forms)? */
int json_utf8_valid(const unsigned char *s, size_t n);

#endif
