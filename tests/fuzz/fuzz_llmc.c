/* fuzz_llmc.c - fuzz entry point for the llm.c GPT-2 checkpoint reader
 * (import-llmc): any bytes are read or refused, never a crash; what is
 * read is a model model_init accepts. */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "../../model/formats/llmc.h"
#include "../../io/util.h"
#include "../../model/model.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[512];
	if (fuzz_file(data, size, "fuzz_llmc", path))
		return 0;
	set_error_quiet(1);
	struct model_config cfg;
	float *params = NULL;
	if (!llmc_load(path, &cfg, &params)) {
		struct model m;
		if (model_init(&m, &cfg))
			abort(); /* the reader promised a valid shape */
		model_free(&m);
		free(params);
	}
	unlink(path);
	return 0;
}
