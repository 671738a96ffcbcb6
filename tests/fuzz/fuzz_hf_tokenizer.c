/* fuzz_hf_tokenizer.c - tokenizer.json conversion: any bytes are refused
 * with a message or give a tokenizer that round-trips text and, written
 * back as tokenizer.json, reads back with the same hash. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../io/text/regex_split.h"
#include "../../io/text/tokenizer.h"
#include "../../io/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char dir[512], path[600];
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, sizeof(dir), "%s/fuzz_hftok.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(dir))
		return 0;
	snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
	FILE *f = fopen(path, "wb");
	if (!f || fwrite(data, 1, size, f) != size) {
		if (f)
			fclose(f);
		remove(path);
		rmdir(dir);
		return 0;
	}
	fclose(f);
	set_error_quiet(1);
	struct tokenizer *tok, *back;
	if (!hf_tokenizer_read(&tok, path, -1)) {
		static const char text[] = "the then thin\n\n\xff caf\xc3\xa9 12";
		uint32_t *ids = xmalloc(st_mult(tokenizer_max_ids(tok, sizeof(text)), sizeof(*ids)));
		size_t n = tokenizer_encode(tok, text, sizeof(text) - 1, ids);
		struct buf out = {0};
		struct split_step st[SPLIT_MAX_STEPS];
		size_t k = 0;
		int removes = 0; /* a Split that drops text on purpose */
		if (!tokenizer_split_chain(tok, st, &k))
			for (size_t i = 0; i < k; i++)
				removes |= st[i].behavior == SPLIT_REMOVED;
		/* a SentencePiece-style tokenizer's normalizers may change the text */
		if (tokenizer_decode(tok, ids, n, 0, &out) ||
		    (!removes && !(tokenizer_flags(tok) & TOK_SPM) &&
		     (out.len != sizeof(text) - 1 || memcmp(out.data, text, out.len))))
			abort();
		free(ids);
		buf_free(&out);
		/* written back: the same tokenizer, unless two tokens share bytes
		 * (refused with a message) */
		if (!hf_tokenizer_write(tok, dir, 1, 16)) {
			if (hf_tokenizer_read(&back, path, -1) ||
			    tokenizer_hash(back) != tokenizer_hash(tok))
				abort();
			tokenizer_free(back);
		}
		tokenizer_free(tok);
	}
	static const char *const names[] = {"tokenizer.json", "tokenizer_config.json",
					    "vocab.json", "merges.txt"};
	for (size_t i = 0; i < ARRAY_SIZE(names); i++) {
		snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
		remove(path);
	}
	rmdir(dir);
	return 0;
}
