/* spm.h - SentencePiece-style BPE (Llama 2, TinyLlama, Mistral): the
 * normalizers, the Metaspace pre-tokenizer and character-level BPE with
 * byte fallback, as Hugging Face's tokenizers runs them from a
 * tokenizer.json.
 *
 * How such a tokenizer holds its vocabulary (tokenizer.h, TOK_SPM): a
 * token's bytes are its tokenizer.json string, UTF-8 as it is (U+2581 '▁'
 * included), not GPT-2's byte alphabet; a byte-fallback token is its string
 * "<0xXX>" and decodes to the byte XX. Encoding a text:
 *
 *   1. the normalizers in order: Prepend (the string before a non-empty
 *      text), Replace (every occurrence of a string by another; no regex),
 *      NFC (Unicode Normalization Form C);
 *   2. the pre-tokenizer: none (the text is one piece) or Metaspace (every
 *      ' ' becomes the replacement character, which is prepended when the
 *      text does not start with it: always, for the stretch at the start of
 *      the document only (not one after an added token), or never; with
 *      split, the text is cut before every replacement character);
 *   3. per piece: each character that is a token is that token; one that is
 *      not becomes its UTF-8 bytes' "<0xXX>" tokens (byte fallback) or the
 *      unknown token (consecutive ones fused into one with fuse_unk), and a
 *      byte that starts no valid UTF-8 sequence is a character of its own;
 *      then the merges in rank order (lowest rank, leftmost first), as
 *      Hugging Face's BPE model does.
 *
 * A piece without pre-tokenizer is the whole text, but BPE of a text cut
 * before every '▁' that follows another character equals BPE of the whole
 * whenever no token holds '▁' after another character and '▁' is a token
 * (a merge across the cut would make such a token): true of Llama 2's and
 * Mistral's vocabularies, checked on load, and then the encoder cuts there
 * (pieces a cache can hold).
 *
 * Decoding: byte-fallback tokens give their bytes, the replacement
 * character gives ' ', and with decode_strip the ' ' at the start of a
 * sequence (or after the end-of-text token: a new document) is dropped (Hugging Face's Strip
 * decoder after Fuse, or the Metaspace decoder). Invalid UTF-8 is given back
 * as its bytes (Hugging Face writes U+FFFD), so decode(encode(text)) is the
 * text whenever the normalizers only prepend the replacement and replace
 * ' ' by it.
 */
#ifndef ASYNCPP_SPM_H
#define ASYNCPP_SPM_H

#include <stddef.h>
#include <stdint.h>

#include "../util.h"

/* Normalizer kinds: the numbers are stored in tokenizer files, never reused.
 * NFC (io/text/unicode_nfc.h) has no strings. */
enum norm_kind { NORM_PREPEND = 1, NORM_REPLACE = 2, NORM_NFC = 3 };
/* Metaspace's prepend_scheme */
enum meta_prepend { META_ALWAYS = 0, META_FIRST = 1, META_NEVER = 2 };

#define SPM_MAX_NORM 8   /* normalizer steps */
#define SPM_MAX_STR 32   /* bytes of a normalizer's string */
#define SPM_META_DEFAULT 0x2581u

struct spm_norm {
	uint32_t kind;          /* enum norm_kind */
	uint32_t alen, blen;    /* Prepend: a; Replace: a by b (a non-empty) */
	char a[SPM_MAX_STR], b[SPM_MAX_STR];
};

struct spm_params {
	uint32_t nnorm;
	struct spm_norm norm[SPM_MAX_NORM];
	uint32_t prepend;       /* enum meta_prepend (with PRETOK_METASPACE) */
	uint32_t split;         /* Metaspace's split */
	uint32_t meta_cp;       /* the replacement character (U+2581), also what decodes to ' ' */
	uint32_t decode_strip;  /* drop one leading ' ' when decoding */
	uint32_t unk;           /* the unknown token's id, or TOKENIZER_NO_ID */
};

struct tokenizer;
struct tok_cache;
struct spm;

/* Check p against the tokenizer's vocabulary (t's tokens, specials, flags
 * and pre-tokenizer kind, PRETOK_SPM or PRETOK_METASPACE, set) and build
 * the encoder's tables: *out, to free with spm_free. Returns
 * 0, or -1 after error() naming name. */
int spm_new(struct spm **out, const struct tokenizer *t, const struct spm_params *p,
	    const char *name);
void spm_free(struct spm *s);
const struct spm_params *spm_params(const struct spm *s);

/* The file's pipeline section (asyncpp-formats(5)): append, or read
 * p[0..n) into *out (0, or -1 after error() naming name). */
void spm_params_put(const struct spm_params *p, struct buf *out);
int spm_params_get(struct spm_params *out, const unsigned char *p, size_t n, const char *name);

/* Most ids an encoding of len bytes gives (the prepended characters). */
size_t spm_max_ids(const struct spm *s, size_t len);
/* Encode text[0..len) (c may be NULL: no cache); first: the text starts a
 * document (Metaspace's prepend_scheme "first"), else it follows an added
 * token. */
size_t spm_encode(const struct tokenizer *t, const struct spm *s, struct tok_cache *c,
		  const void *text, size_t len, int first, uint32_t *out);
/* The initial symbols of a piece, then BPE: into out (room for n ids). */
size_t spm_piece(const struct tokenizer *t, const struct spm *s, const unsigned char *p,
		 size_t n, uint32_t *out);
/* Append the text of ids (see above); at_start: ids begin a sequence. */
void spm_decode(const struct tokenizer *t, const struct spm *s, const uint32_t *ids, size_t n,
		int skip_special, int at_start, struct buf *out);
/* One line describing the pipeline, for inspect. */
void spm_describe(const struct spm *s, struct buf *out);

#endif
