/* fuzz_file.h - the fuzz entry points read files, as the commands do: put
 * the fuzzer's bytes into a fresh temporary file. */
#ifndef ASYNCPP_FUZZ_FILE_H
#define ASYNCPP_FUZZ_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Write data[size] to a new file under $TMPDIR (or /tmp) named after tag;
 * its path goes to path[512]. Returns 0, or -1 (the input is then skipped). */
static inline int fuzz_file(const uint8_t *data, size_t size, const char *tag, char *path)
{
	const char *tmp = getenv("TMPDIR");
	snprintf(path, 512, "%s/%s.XXXXXX", tmp && *tmp ? tmp : "/tmp", tag);
	int fd = mkstemp(path);
	if (fd < 0)
		return -1;
	int ok = write(fd, data, size) == (ssize_t)size;
	close(fd);
	if (!ok)
		unlink(path);
	return ok ? 0 : -1;
}

#endif
