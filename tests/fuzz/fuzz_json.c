/* fuzz_json.c - the JSON reader: any bytes either parse or fail with a
 * message, never crash, hang or read out of bounds; a parsed tree's strings
 * are valid UTF-8 and written back they parse to the same strings; an
 * object's member names are unique. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/text/json.h"
#include "../../io/util.h"

static void walk(const struct json *j)
{
	if (j->type == JSON_STRING) {
		if (!json_utf8_valid((const unsigned char *)j->str, j->len) || j->str[j->len])
			abort();
		struct buf b = {0};
		struct json *back;
		json_put_string(&b, j->str, j->len);
		if (json_parse(&back, (const char *)b.data, b.len, "fuzz") ||
		    back->type != JSON_STRING || back->len != j->len ||
		    memcmp(back->str, j->str, j->len))
			abort();
		json_free(back);
		buf_free(&b);
	}
	if (j->type == JSON_OBJECT) /* names are unique: a repeated one was merged */
		for (size_t i = 0; i < j->len && i < 64; i++)
			for (size_t k = i + 1; k < j->len; k++)
				if (j->kids[i].key_len == j->kids[k].key_len &&
				    !memcmp(j->kids[i].key, j->kids[k].key, j->kids[i].key_len))
					abort();
	if (j->type == JSON_ARRAY || j->type == JSON_OBJECT)
		for (size_t i = 0; i < j->len; i++)
			walk(&j->kids[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct json *j;
	set_error_quiet(1);
	if (!json_parse(&j, (const char *)data, size, "fuzz.json")) {
		walk(j);
		json_get(j, "model");
		json_free(j);
	}
	return 0;
}
