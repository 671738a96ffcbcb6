/* fuzz_checkpoint.c - fuzz entry point for the checkpoint reader: open,
 * read every tensor, inspect, parse the metadata. Must never crash, hang
 * or read out of bounds, whatever the bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../io/checkpoint.h"
#include "../../io/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[512];
	const char *tmp = getenv("TMPDIR");
	snprintf(path, sizeof(path), "%s/fuzz_ckpt.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	int fd = mkstemp(path);
	if (fd < 0)
		return 0;
	if (write(fd, data, size) != (ssize_t)size) {
		close(fd);
		unlink(path);
		return 0;
	}
	close(fd);
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
