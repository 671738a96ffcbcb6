/* fuzz_ini.c - the INI reader on arbitrary bytes: it must never crash, leak
 * or read out of bounds, and a load that fails must leave the configuration
 * as it was. A load that succeeds must print back to text that loads again
 * to the same configuration.
 *
 *   clang -fsanitize=fuzzer,address -I. tests/fuzz/fuzz_ini.c io/config/config.c \
 *         io/util.c -linih -lm
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/config/config.h"
#include "../../io/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = xmalloc(size + 1);
	memcpy(text, data, size);
	text[size] = '\0';
	set_error_quiet(1);
	struct config cfg;
	config_defaults(&cfg);
	char *before = config_to_string(&cfg);
	if (config_load_string(&cfg, text, "fuzz.ini") == 0) {
		char *once = config_to_string(&cfg);
		struct config again;
		config_defaults(&again);
		if (config_load_string(&again, once, "printed") != 0)
			abort();
		char *twice = config_to_string(&again);
		if (strcmp(once, twice))
			abort();
		free(once);
		free(twice);
		config_free(&again);
	} else {
		char *after = config_to_string(&cfg);
		if (strcmp(before, after))
			abort();
		free(after);
	}
	free(before);
	config_free(&cfg);
	free(text);
	return 0;
}
