/* fuzz_shard.c - fuzz entry point for the shard readers (asyncpp container
 * shards and llm.c .bin shards): open, read every token in pieces, inspect.
 * Must never crash, hang or read out of bounds, whatever the bytes. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../io/formats/shard.h"
#include "../../io/util.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[512];
	if (fuzz_file(data, size, "fuzz_shard", path))
		return 0;
	set_error_quiet(1);
	struct shard *s;
	if (!shard_open(&s, path)) {
		uint64_t n = shard_ntokens(s);
		uint32_t buf[4096];
		/* bounded work even when a header claims billions of tokens */
		for (uint64_t pos = 0, k = 0; pos < n && k < 64; k++) {
			size_t len = (size_t)(n - pos < 777 ? n - pos : 777);
			if (shard_read(s, pos, len, buf))
				break;
			for (size_t i = 0; i < len; i++)
				if (buf[i] >= shard_vocab_size(s))
					abort(); /* a token the reader should have refused */
			pos += len;
		}
		shard_close(s);
	}
	if (size < (1u << 20)) {
		FILE *devnull = fopen("/dev/null", "w");
		if (devnull) {
			shard_inspect(path, devnull);
			fclose(devnull);
		}
	}
	unlink(path);
	return 0;
}
