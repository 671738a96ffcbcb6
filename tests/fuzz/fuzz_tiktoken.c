/* fuzz_tiktoken.c - the .tiktoken rank-file reader (tokenize import-tiktoken).
 *
 * The input is a rank file, read from a file as the command does, with the
 * o200k pattern when its first byte is odd (cl100k otherwise) and one special
 * token. Read or refused, never a crash; what is read round-trips through
 * the tokenizer file format and encodes the input itself losslessly, with
 * and without the pre-token cache alike. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../io/text/pretok.h"
#include "../../io/text/tokenizer.h"
#include "../../io/util.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char path[512];
	if (fuzz_file(data, size, "fuzz_ranks", path))
		return 0;
	set_error_quiet(1);
	static const char *const names[] = {TOKENIZER_EOT};
	static const uint32_t ids[] = {1000};
	uint32_t kind = size && (data[0] & 1) ? PRETOK_O200K : PRETOK_CL100K;
	struct tokenizer *tok;
	if (!tiktoken_import(&tok, path, kind, 1, names, ids)) {
		struct buf ser = {0}, out = {0};
		tokenizer_serialize(tok, &ser);
		struct tokenizer *back;
		/* what import builds, the tokenizer file format holds */
		if (tokenizer_load_mem(&back, ser.data, ser.len, "fuzz") ||
		    tokenizer_pretok(back) != kind || tokenizer_hash(back) != tokenizer_hash(tok))
			abort();
		uint32_t *t = xmalloc(st_mult(size + 1, sizeof(*t)));
		size_t n = tokenizer_encode(back, data, size, t);
		if (n > size || tokenizer_decode(back, t, n, 0, &out) || out.len != size ||
		    (size && memcmp(out.data, data, size)))
			abort();
		/* the pre-token cache gives the same ids, filling and then hitting */
		uint32_t *t2 = xmalloc(st_mult(size + 1, sizeof(*t2)));
		struct tok_cache *c = tok_cache_new(back);
		for (int pass = 0; pass < 2; pass++)
			if (tokenizer_encode_cached(back, c, data, size, t2) != n ||
			    (n && memcmp(t, t2, n * sizeof(*t))))
				abort();
		tok_cache_free(c);
		free(t2);
		free(t);
		buf_free(&out);
		tokenizer_free(back);
		buf_free(&ser);
		tokenizer_free(tok);
	}
	unlink(path);
	return 0;
}
