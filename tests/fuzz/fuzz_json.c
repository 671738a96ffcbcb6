/* fuzz_json.c - the JSON reader: any bytes either parse or fail with a
 * message, never crash, hang or read out of bounds; a parsed tree's strings
 * are valid UTF-8 and written back they parse to the same strings. */
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
