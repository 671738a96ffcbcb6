/* fuzz_safetensors.c - the safetensors reader: open, read every tensor.
 * Must never crash, hang or read out of bounds, whatever the bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../../io/safetensors.h"
#include "../../io/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[512];
	const char *tmp = getenv("TMPDIR");
	snprintf(path, sizeof(path), "%s/fuzz_st.XXXXXX", tmp && *tmp ? tmp : "/tmp");
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
