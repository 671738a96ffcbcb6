/* hf_parts.h - helpers that the tokenizer.json readers share
 * (hf_tokenizer.c: byte-level BPE; hf_spm.c: SentencePiece-style BPE).
 * Internal to io/text. */
#ifndef ASYNCPP_HF_PARTS_H
#define ASYNCPP_HF_PARTS_H

#include <stddef.h>
#include <stdint.h>

#include "json.h"

/* A map from token strings to ids (strings owned by the caller). */
struct tokenizer;

struct smap {
	const char **s;
	size_t *len;
	uint32_t *slot; /* id + 1, 0 empty */
	size_t mask;
};
void hf_smap_init(struct smap *m, uint32_t n, const char **s, size_t *len);
long hf_smap_find(const struct smap *m, const char *s, size_t n);
/* add id (its string already in s/len); returns the id already there, or -1 */
long hf_smap_add(struct smap *m, uint32_t id);

/* The "type" member of j, or "?" */
const char *hf_type_of(const struct json *j);
int hf_is_true(const struct json *obj, const char *key);
/* null or absent, or (when empty_ok) "" */
int hf_unset(const struct json *obj, const char *key, int empty_ok);

/* model.vocab and added_tokens: V ids without gaps, each id's string
 * (JSON-owned), special[id] for the special added tokens. Non-special added
 * tokens are refused. The arrays (V + 1 each) are the caller's to free. */
struct hf_vocab {
	uint32_t V;
	const char **s;
	size_t *len;
	unsigned char *special;
};
int hf_read_vocab(const char *path, const struct json *root, struct hf_vocab *v,
		  int normalizer);
/* post_processor: null, ByteLevel (with bytelevel), a TemplateProcessing
 * whose single template is [SpecialToken X, Sequence A], or a Sequence of
 * them: *sep = X's id (TOKENIZER_NO_ID: no template); else -1 after error()
 * naming the JSON path. */
/* The TemplateProcessing of a TOK_DOC_TEMPLATE tokenizer (its end-of-text
 * token first), as JSON into j. */
void hf_put_template(struct buf *j, const struct tokenizer *tok);
int hf_read_post(const char *path, const struct json *root, int bytelevel,
		 const struct hf_vocab *v, uint32_t *sep);
/* A merge entry: "a b" or ["a", "b"]; 0, or -1 when it is neither. */
int hf_merge_parts(const struct json *e, const char **a, size_t *na, const char **b,
		   size_t *nb);

/* SentencePiece-style tokenizer.json files (hf_spm.c): is root one (no
 * pre-tokenizer or Metaspace, or byte_fallback)? Read it
 * (as hf_tokenizer_read), write one into dir (as hf_tokenizer_write). */
struct tokenizer;
int hf_spm_style(const struct json *root);
int hf_spm_read(struct tokenizer **tok, const char *path, const struct json *root,
		long eos_hint);
int hf_spm_write(const struct tokenizer *tok, const char *dir, int max_length);

#endif
