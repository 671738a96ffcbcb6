/* replay.c - plain main() that feeds every file of a corpus folder to a fuzz
 * entry point, so the saved corpus runs in the normal test suite. With
 * libFuzzer, build the fuzz_*.c file with -fsanitize=fuzzer instead. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
		return 2;
	}
	DIR *d = opendir(argv[1]);
	if (!d) {
		printf("FAIL replay %s: no corpus folder\n", argv[1]);
		return 1;
	}
	set_error_quiet(1);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char path[4096];
		snprintf(path, sizeof(path), "%s/%s", argv[1], e->d_name);
		struct buf b = {0};
		if (read_file(path, &b))
			continue;
		LLVMFuzzerTestOneInput(b.data, b.len);
		buf_free(&b);
		n++;
	}
	closedir(d);
	printf("PASS replay %s (%d inputs)\n", argv[1], n);
	return 0;
}
