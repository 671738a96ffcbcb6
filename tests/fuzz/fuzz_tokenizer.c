/* fuzz_tokenizer.c - the tokenizer-file reader and the encoder.
 *
 * The input is (1) loaded as a tokenizer file, which must either fail cleanly
 * or give a tokenizer that round-trips text and the input itself (a
 * SentencePiece-style one, whose normalizers may change the text, at least
 * encodes within its bound and the same with the cache), and (2)
 * encoded as text with a fixed tokenizer, which must decode to the input
 * byte for byte. Any mismatch aborts. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../io/text/regex_split.h"
#include "../../io/text/tokenizer.h"
#include "../../io/text/unicode_nfc.h"
#include "../../io/util.h"

/* Whether decode(encode(text)) gives the text back (or its NFC form): all
 * but a Split regex (or a step of a chain of them) that removes its
 * matches. */
static int lossless(const struct tokenizer *tok)
{
	struct split_step st[SPLIT_MAX_STEPS];
	size_t k;
	if (tokenizer_split_chain(tok, st, &k))
		return 1;
	for (size_t i = 0; i < k; i++)
		if (st[i].behavior == SPLIT_REMOVED)
			return 0;
	return 1;
}

/* decode(encode(text)) is the text, or with TOK_NFC its NFC form */
static void check_round_trip(const struct tokenizer *tok, const uint8_t *data, size_t size)
{
	size_t max = tokenizer_max_ids(tok, size);
	uint32_t *ids = xmalloc(st_mult(max + 1, sizeof(*ids)));
	size_t n = tokenizer_encode(tok, data, size, ids);
	struct buf out = {0}, want = {0};
	buf_append(&want, data, size);
	if (tokenizer_flags(tok) & TOK_NFC) {
		buf_reserve(&want, UTF8_NFC_MAX(size) + 1);
		want.len = utf8_nfc((const char *)data, size, (char *)want.data, UTF8_NFC_MAX(size));
	}
	/* a SentencePiece-style tokenizer's normalizers may change the text */
	int exact = lossless(tok) && !(tokenizer_flags(tok) & TOK_SPM);
	if (n > max || tokenizer_decode(tok, ids, n, 0, &out) ||
	    (exact && (out.len != want.len || (want.len && memcmp(out.data, want.data, want.len)))))
		abort();
	buf_free(&want);
	struct tok_cache *c = tok_cache_new(tok);
	uint32_t *ids2 = xmalloc(st_mult(max + 1, sizeof(*ids2)));
	if (tokenizer_encode_cached(tok, c, data, size, ids2) != n ||
	    (n && memcmp(ids, ids2, n * sizeof(*ids))))
		abort();
	tok_cache_free(c);
	free(ids2);
	free(ids);
	buf_free(&out);
}

/* A fixed tokenizer trained on a fixed text. */
static struct tokenizer *fixed(void)
{
	static struct tokenizer *tok;
	if (!tok) {
		static const char text[] =
			"The tide came in over the flat sand, and the gulls rose and settled "
			"again. It's the third time they've done it; we'll watch 12 more.\n\n"
			"  Indented lines, tabs\tand caf\xc3\xa9s; na\xc3\xafve \xe4\xbd\xa0\xe5\xa5\xbd!!\n";
		struct bpe_counter *c = bpe_counter_new();
		bpe_counter_add(c, text, sizeof(text) - 1);
		struct bpe_train_opts o = {.vocab_size = 320};
		if (bpe_train(&tok, c, &o))
			abort();
		bpe_counter_free(c);
	}
	return tok;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	set_error_quiet(1);
	struct tokenizer *tok;
	if (!tokenizer_load_mem(&tok, data, size, "fuzz.tok")) {
		static const char sample[] = "Hello, world! It's 2026.\n\n\xff\xfe end  ";
		check_round_trip(tok, (const uint8_t *)sample, sizeof(sample) - 1);
		check_round_trip(tok, data, size);
		struct buf b = {0};
		tokenizer_serialize(tok, &b);
		if (b.len != size || memcmp(b.data, data, size))
			abort(); /* a valid file is in canonical form */
		buf_free(&b);
		tokenizer_free(tok);
	}
	check_round_trip(fixed(), data, size);
	return 0;
}
