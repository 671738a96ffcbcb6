/* fuzz_gpt2_vocab.c - fuzz entry point for the GPT-2 tokenizer import
 * (encoder.json + vocab.bpe): the input is both files, split at its first
 * NUL byte (no NUL: all of it is encoder.json, vocab.bpe is empty). Read or
 * refused, never a crash; what is read encodes and decodes text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../io/text/tokenizer.h"
#include "../../io/util.h"
#include "fuzz_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *nul = memchr(data, 0, size);
	size_t n_json = nul ? (size_t)(nul - data) : size;
	size_t n_bpe = nul ? size - n_json - 1 : 0;
	char json[512], bpe[512];
	if (fuzz_file(data, n_json, "fuzz_encoder", json))
		return 0;
	if (fuzz_file(nul ? nul + 1 : data, n_bpe, "fuzz_vocab", bpe)) {
		unlink(json);
		return 0;
	}
	set_error_quiet(1);
	struct tokenizer *tok;
	if (!gpt2_import(&tok, json, bpe)) {
		struct buf ser = {0};
		tokenizer_serialize(tok, &ser);
		struct tokenizer *back;
		/* what import builds, the tokenizer file format holds */
		if (tokenizer_load_mem(&back, ser.data, ser.len, "fuzz"))
			abort();
		tokenizer_free(back);
		buf_free(&ser);
		tokenizer_free(tok);
	}
	unlink(json);
	unlink(bpe);
	return 0;
}
