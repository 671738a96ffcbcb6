/* added_tokens.h - finding a tokenizer's added tokens in text, as Hugging
 * Face's tokenizers do before normalizing and pre-tokenizing (its
 * AddedVocabulary): at the leftmost position where any token's bytes occur,
 * the longest token that occurs there. */
#ifndef ASYNCPP_ADDED_TOKENS_H
#define ASYNCPP_ADDED_TOKENS_H

#include <stddef.h>
#include <stdint.h>

struct added_tokens;

/* The n tokens ids[i] with bytes s[i][0..len[i]) (the pointers must outlive
 * the result; empty tokens are never found). */
struct added_tokens *added_tokens_new(uint32_t n, const uint32_t *ids,
				      const unsigned char *const *s, const uint32_t *len);
void added_tokens_free(struct added_tokens *a);

/* The first occurrence in s[0..n): its offset in *at, its id in *id; returns
 * its length, or 0 when there is none (*at is then n). */
size_t added_tokens_find(const struct added_tokens *a, const unsigned char *s, size_t n,
			 size_t *at, uint32_t *id);

#endif
