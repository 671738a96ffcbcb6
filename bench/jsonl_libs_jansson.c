/* jsonl_libs_jansson.c - Jansson's side of bench/jsonl_libs.c (a file of
 * its own: jansson.h and io/text/json.h define the same names). */
#include <jansson.h>
#include <string.h>

void run_jansson(const unsigned char *s, size_t n, size_t *records, size_t *bytes);
void run_jansson(const unsigned char *s, size_t n, size_t *records, size_t *bytes)
{
	for (size_t at = 0; at < n;) {
		const unsigned char *nl = memchr(s + at, '\n', n - at);
		size_t end = nl ? (size_t)(nl - s) : n;
		json_error_t err;
		json_t *root = json_loadb((const char *)s + at, end - at, JSON_ALLOW_NUL, &err);
		json_t *v = root ? json_object_get(root, "text") : NULL;
		if (v && json_is_string(v)) {
			(*records)++;
			*bytes += json_string_length(v);
		}
		json_decref(root);
		at = end + 1;
	}
}
