/* fuzz_hf_config.c - the Hugging Face config.json reader (import-hf's first
 * step): read the bytes as a model folder's config.json. Must never crash,
 * hang or read out of bounds; what it accepts must be a model asyncpp can
 * build (model_init takes it, within the reader's bounds). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../model/formats/hf_model.h"
#include "../../io/util.h"
#include "../../model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *tmp = getenv("TMPDIR");
	char dir[512];
	snprintf(dir, sizeof(dir), "%s/fuzz_hfc.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir))
		return 0;
	char *path = path_join(dir, "config.json");
	FILE *fp = fopen(path, "wb");
	int ok = fp && fwrite(data, 1, size, fp) == size;
	if (fp)
		fclose(fp);
	set_error_quiet(1);
	struct model_config mc;
	long eos;
	if (ok && !hf_read_config(dir, &mc, &eos)) {
		/* accepted: in range for a model (the sizes are bounded by the
		 * reader; building one allocates only its tables) */
		if (mc.L < 1 || mc.C < 1 || mc.NH < 1 || mc.V < 1 || mc.T < 1 ||
		    eos >= (long)mc.V)
			abort();
		struct model m;
		if (mc.L <= 64 && !model_init(&m, &mc))
			model_free(&m);
	}
	unlink(path);
	free(path);
	rmdir(dir);
	return 0;
}
