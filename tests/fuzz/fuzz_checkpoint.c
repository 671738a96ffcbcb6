/* fuzz_checkpoint.c - fuzz entry point for the checkpoint reader: open,
 * read every tensor, inspect, parse the metadata. Must never crash, hang
 * or read out of bounds, whatever the bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../io/formats/checkpoint.h"
#include "../../io/util.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[512];
	if (fuzz_file(data, size, "fuzz_ckpt", path))
		return 0;
	set_error_quiet(1);
	struct ckpt *k;
	if (!ckpt_open(&k, path)) {
		long v;
		ckpt_meta_long(k, "step", &v);
		for (int i = 0; i < ckpt_count(k) && i < 256; i++) {
			size_t n = ckpt_numel(k, i);
			if (n > (1u << 24))
				continue; /* bounded work; the reader checked it against the file */
			float *x = malloc((n ? n : 1) * sizeof(float));
			if (x && ckpt_read(k, i, x)) {
				free(x);
				break;
			}
			free(x);
		}
		ckpt_close(k);
	}
	FILE *null = fopen("/dev/null", "w");
	if (null) {
		checkpoint_inspect(path, null, 1);
		fclose(null);
	}
	unlink(path);
	return 0;
}
