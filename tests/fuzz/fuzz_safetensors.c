/* fuzz_safetensors.c - the safetensors reader: open, read every tensor.
 * Must never crash, hang or read out of bounds, whatever the bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../../model/formats/safetensors.h"
#include "../../io/util.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[512];
	if (fuzz_file(data, size, "fuzz_st", path))
		return 0;
	set_error_quiet(1);
	struct st_file *f;
	if (!st_open(&f, path)) {
		st_meta(f, "format");
		for (int i = 0; i < st_count(f); i++) {
			size_t n = st_numel(f, i);
			if (n > ((size_t)1 << 24))
				continue; /* bounded work; the reader checked it against the file */
			float *x = malloc((n ? n : 1) * sizeof(float));
			if (x && st_read(f, i, x)) {
				free(x);
				break;
			}
			free(x);
		}
		st_close(f);
	}
	unlink(path);
	return 0;
}
