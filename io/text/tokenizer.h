/* tokenizer.h - BPE tokenizer: file format, encoding, decoding.
 *
 * Tokens are byte strings; ids run from 0 to vocab_size-1. A byte-level
 * tokenizer has the 256 single-byte tokens (so any bytes encode losslessly),
 * one token per merge, and special tokens such as <|endoftext|> that plain
 * text never produces. A SentencePiece-style one (TOK_SPM: Llama 2,
 * Mistral) holds each token as its UTF-8 string instead ('▁' and all, the
 * byte-fallback tokens as their names "<0xXX>"), starts BPE from a piece's
 * characters and has a normalizer chain: io/text/spm.h says how.
 *
 * Text is pre-tokenized by the tokenizer's kind of pre-tokenizer
 * (io/text/pretok.h: GPT-2's, tiktoken's cl100k or o200k, SmolLM's), then
 * merges are applied within each piece in rank order (with
 * TOK_IGNORE_MERGES, a piece that is a token is taken whole).
 *
 * The file format (magic "ASYNCTOK", version 3, crc32c) is documented byte by
 * byte in asyncpp-formats(5): version 1 has no pre-tokenizer section (GPT-2's),
 * and is still what a GPT-2-kind tokenizer is written as; version 2 is what
 * other byte-level ones are written as; version 3 (TOK_SPM alone) adds the
 * SentencePiece parameters to the pre-tokenizer section. Readers check
 * everything before use.
 */
#ifndef ASYNCPP_TOKENIZER_H
#define ASYNCPP_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "../util.h"
#include "regex_split.h"

#define TOKENIZER_MAGIC "ASYNCTOK"
#define TOKENIZER_VERSION 3
#define TOKENIZER_MAX_VOCAB (1u << 24)
#define TOKENIZER_NO_ID UINT32_MAX
#define TOKENIZER_EOT "<|endoftext|>"
/* Llama 3's end of text: the end-of-text token of a tokenizer without
 * <|endoftext|> (tiktoken and tokenizer.json imports) */
#define TOKENIZER_EOT_LLAMA3 "<|end_of_text|>"

struct tokenizer;

/* Load and validate a tokenizer file (or bytes in memory; name is used in
 * messages). Returns 0, or -1 after error() naming the file. */
int tokenizer_load(struct tokenizer **tok, const char *path);
int tokenizer_load_mem(struct tokenizer **tok, const void *data, size_t len, const char *name);
/* Write atomically. */
int tokenizer_save(const struct tokenizer *tok, const char *path);
/* The file's bytes, as tokenizer_save writes them. */
void tokenizer_serialize(const struct tokenizer *tok, struct buf *out);
void tokenizer_free(struct tokenizer *tok);

/* Build from parts (the trainer and the GPT-2 importer). lens[vocab] are the
 * token lengths, bytes their concatenation; merges[nmerges][3] are (left,
 * right, result) in rank order; special[nspecial] the special ids; eot the
 * <|endoftext|> id or TOKENIZER_NO_ID. Validated exactly as a loaded file. */
int tokenizer_build(struct tokenizer **tok, uint32_t vocab, const uint32_t *lens,
		    const unsigned char *bytes, uint32_t nmerges, const uint32_t (*merges)[3],
		    uint32_t nspecial, const uint32_t *special, uint32_t eot);

/* The same with flags (the file header's): TOK_IGNORE_MERGES is Hugging
 * Face's BPE ignore_merges: a pre-token that is itself a (non-special) token
 * is taken whole, without merging; and the merges are Hugging Face's, which
 * may make a token more than once (one merge for each split of it, as Llama
 * 3's) and use tokens that later merges make. */
#define TOK_IGNORE_MERGES 1u
/* TOK_NFC: text is put in Unicode NFC before pre-tokenizing (the NFC
 * normalizer of Qwen's tokenizer.json; io/text/unicode_nfc.h), so decoding
 * gives the NFC form of the text. TOK_SPLIT_ADDED: the special (added)
 * tokens are found in the text first, as Hugging Face's encode does by
 * default (leftmost, longest; io/text/added_tokens.h), and the text between
 * them is normalized and pre-tokenized apart (set by tokenizer.json import;
 * without it a special token's text is plain text). */
#define TOK_NFC 2u
#define TOK_SPLIT_ADDED 4u
/* SentencePiece-style BPE (io/text/spm.h), with its BPE options: a character
 * that is no token becomes its bytes' "<0xXX>" tokens, consecutive unknown
 * characters give one unknown token. Merges may make a token more than once
 * (the converter lists every split) and the base characters are tokens that
 * no merge makes. */
#define TOK_SPM 8u
#define TOK_BYTE_FALLBACK 16u
#define TOK_FUSE_UNK 32u
/* TOK_DOC_TEMPLATE: the end-of-text id is the token of tokenizer.json's
 * TemplateProcessing [SpecialToken X, Sequence A] (Llama 2's <s>, Meta's
 * Llama 3 <|begin_of_text|>): what tokenize encode puts before each document,
 * so a shard holds Hugging Face's encode(document, add_special_tokens=true)
 * for each; export writes the template back. */
#define TOK_DOC_TEMPLATE 64u
#define TOK_KNOWN_FLAGS (TOK_IGNORE_MERGES | TOK_NFC | TOK_SPLIT_ADDED | TOK_SPM | \
			 TOK_BYTE_FALLBACK | TOK_FUSE_UNK | TOK_DOC_TEMPLATE)
int tokenizer_build_flags(struct tokenizer **tok, uint32_t vocab, const uint32_t *lens,
			  const unsigned char *bytes, uint32_t nmerges,
			  const uint32_t (*merges)[3], uint32_t nspecial, const uint32_t *special,
			  uint32_t eot, uint32_t flags);
uint32_t tokenizer_flags(const struct tokenizer *tok);

/* A SentencePiece-style tokenizer (flags hold TOK_SPM; kind PRETOK_SPM or
 * PRETOK_METASPACE; p its normalizers, Metaspace, unknown token, decoder),
 * built as tokenizer_build_flags; and its parameters (NULL for another). */
struct spm_params;
int tokenizer_build_spm(struct tokenizer **tok, uint32_t vocab, const uint32_t *lens,
			const unsigned char *bytes, uint32_t nmerges, const uint32_t (*merges)[3],
			uint32_t nspecial, const uint32_t *special, uint32_t eot, uint32_t flags,
			uint32_t kind, const struct spm_params *p);
const struct spm_params *tokenizer_spm(const struct tokenizer *tok);

/* The pre-tokenizer kind (enum pretok_kind); a built tokenizer has GPT-2's
 * until set (which updates the identity hash). Returns 0, or -1 after error()
 * for an unknown kind. */
uint32_t tokenizer_pretok(const struct tokenizer *tok);
int tokenizer_set_pretok(struct tokenizer *tok, uint32_t kind);
/* PRETOK_SPLIT_REGEX: Hugging Face's Split with pattern[0..n), behavior
 * (enum split_behavior) and invert, through PCRE2 (io/text/regex_split.h);
 * 0, or -1 after error() starting with where (the regex refused, or no
 * PCRE2). tokenizer_split_regex reads them back (-1 for another kind). */
int tokenizer_set_split_regex(struct tokenizer *tok, const char *pattern, size_t n,
			      uint32_t behavior, int invert, const char *where);
int tokenizer_split_regex(const struct tokenizer *tok, const char **pattern, size_t *n,
			  uint32_t *behavior, int *invert);
/* The same for a chain of Splits st[0..k) (a pre_tokenizer Sequence of
 * several Splits, see regex_split.h), stored as the kind's parameters;
 * tokenizer_split_chain reads them back, patterns pointing into tok (-1 for
 * another kind; tokenizer_split_regex is -1 for a chain). */
int tokenizer_set_split_chain(struct tokenizer *tok, const struct split_step *st, size_t k,
			      const char *where);
int tokenizer_split_chain(const struct tokenizer *tok, struct split_step st[SPLIT_MAX_STEPS],
			  size_t *k);
/* How many regex matches ran out of PCRE2's limits while encoding with tok
 * (any thread, since it was loaded); when some did, *pattern, *n is the
 * regex that failed last. Output encoded with such a tok lost its splits:
 * a caller must fail, not keep it. */
uint64_t tokenizer_regex_failures(const struct tokenizer *tok, const char **pattern, size_t *n);

uint32_t tokenizer_vocab_size(const struct tokenizer *tok);
uint32_t tokenizer_eot_id(const struct tokenizer *tok); /* TOKENIZER_NO_ID if none */
uint32_t tokenizer_nmerges(const struct tokenizer *tok);
/* Merge of rank r < nmerges: (left, right, result) ids. */
void tokenizer_merge(const struct tokenizer *tok, uint32_t r, uint32_t out[3]);
/* 64-bit identity of the vocabulary and merges (FNV-1a, see the format). */
uint64_t tokenizer_hash(const struct tokenizer *tok);
/* Bytes of token id (id < vocab size). */
const unsigned char *tokenizer_token(const struct tokenizer *tok, uint32_t id, size_t *len);
int tokenizer_is_special(const struct tokenizer *tok, uint32_t id);

/* Most ids the encoding of len bytes gives: len for a byte-level tokenizer
 * (a token is at least one byte), three times that with TOK_NFC (NFC at most
 * triples the bytes), and for a SentencePiece-style one what its normalizer
 * chain can grow the text to (io/text/spm.h). */
size_t tokenizer_max_ids(const struct tokenizer *tok, size_t len);
/* pretok_split_point_of for the tokenizer: a cut in text[0..len) at or after
 * target where encoding the two sides apart gives the ids of the whole (also
 * with its normalizer and added tokens); len when there is none. */
size_t tokenizer_split_point(const struct tokenizer *tok, const void *text, size_t len,
			     size_t target);

/* Encode len bytes of text into out, which must have room for
 * tokenizer_max_ids(tok, len) ids. Returns the number of ids. Special tokens
 * are produced from text only with TOK_SPLIT_ADDED; else "<|endoftext|>" in
 * the text is plain text. Thread-safe on a shared tokenizer. */
size_t tokenizer_encode(const struct tokenizer *tok, const void *text, size_t len, uint32_t *out);

/* The same with a cache of encoded pre-tokens, much faster on real text.
 * One cache per thread. */
struct tok_cache;
struct tok_cache *tok_cache_new(const struct tokenizer *tok);
void tok_cache_free(struct tok_cache *c);
size_t tokenizer_encode_cached(const struct tokenizer *tok, struct tok_cache *c,
			       const void *text, size_t len, uint32_t *out);

/* BPE alone (no pre-tokenizer) on the bytes s[0..n) into out (room for n
 * ids); method 0 is the short-piece scan, 1 the heap. Returns the count. */
size_t tokenizer_bpe_piece(const struct tokenizer *tok, const void *s, size_t n, uint32_t *out,
			   int method);

/* For spm.c: the merges on the initial symbols sym[0..n) (in place; returns
 * the count); the non-special token with bytes s[0..n) under
 * TOK_IGNORE_MERGES (UINT32_MAX: none); one pre-token through the cache. */
size_t tokenizer_bpe_ids(const struct tokenizer *tok, uint32_t *sym, size_t n);
uint32_t tokenizer_whole_id(const struct tokenizer *tok, const void *s, size_t n);
size_t tokenizer_piece_cached(const struct tokenizer *tok, struct tok_cache *c, const void *s,
			      size_t n, const void *end, uint32_t *out);

/* Append the bytes of ids to out. With TOK_DECODE_SKIP_SPECIAL special
 * tokens produce nothing. A SentencePiece-style tokenizer gives the text
 * (spm.h), dropping the leading ' ' of a sequence unless
 * TOK_DECODE_CONTINUE says ids continue an earlier call's. Returns 0, or
 * -1 (error()) on an id >= vocab. */
#define TOK_DECODE_SKIP_SPECIAL 1
#define TOK_DECODE_CONTINUE 2
int tokenizer_decode(const struct tokenizer *tok, const uint32_t *ids, size_t n, int flags,
		     struct buf *out);

/* Print what a tokenizer file holds; verify it. Returns 0, or -1 when it is
 * unreadable or corrupt (the reason goes through error()). */
int tokenizer_inspect(const char *path, FILE *out);

/* BPE training (io/text/bpe_train.c): learn vocab-257 merges from text, the
 * pre-tokenized words of all texts, then add <|endoftext|>. Deterministic:
 * the most frequent pair wins, ties go to the smallest (left, right) ids.
 * Returns 0, or -1 after error(). */
struct bpe_train_opts {
	uint32_t vocab_size; /* >= 257 */
	int verbose;         /* progress on stderr */
};
struct bpe_counter;
struct bpe_counter *bpe_counter_new(void);
void bpe_counter_add(struct bpe_counter *c, const void *text, size_t len);
void bpe_counter_free(struct bpe_counter *c);
int bpe_train(struct tokenizer **tok, struct bpe_counter *c, const struct bpe_train_opts *o);

/* GPT-2 import (io/text/gpt2_import.c): encoder.json + vocab.bpe. */
int gpt2_import(struct tokenizer **tok, const char *encoder_json, const char *vocab_bpe);
/* GPT-2's bytes_to_unicode alphabet, in which byte-level BPE vocabularies
 * (encoder.json, tokenizer.json) spell token bytes: the code point of a
 * byte, and the byte of a code point (-1 when it spells none). */
uint32_t gpt2_cp_of_byte(unsigned char b);
int gpt2_byte_of_cp(uint32_t cp);

/* tiktoken import (io/text/tiktoken_import.c): a .tiktoken rank file (lines
 * "BASE64 RANK", ranks 0..N-1 each once, every byte among them) and the
 * special tokens names[nspecial] with ids[nspecial] >= N. Ids are tiktoken's:
 * a token's id is its rank, and ids between N and the largest special id
 * that no special token takes are filled by special tokens "<|unused_ID|>"
 * (never produced by encoding). The merge of rank r is the pair that
 * tiktoken's BPE reaches on the token's bytes with ranks below r. Where
 * that BPE does not rebuild a token (Llama 3's file), every split of each
 * token into two tokens is a merge and the tokenizer takes whole pieces
 * first (TOK_IGNORE_MERGES); a token no split of which is two tokens of the
 * file is refused, naming its line.
 * The pre-tokenizer is kind. The _mem form reads data[0..len) named name. */
#define TIKTOKEN_MAX_BYTES ((size_t)256 << 20)
int tiktoken_import(struct tokenizer **tok, const char *path, uint32_t kind, uint32_t nspecial,
		    const char *const *names, const uint32_t *ids);
int tiktoken_import_mem(struct tokenizer **tok, const void *data, size_t len, const char *name,
			uint32_t kind, uint32_t nspecial, const char *const *names,
			const uint32_t *ids);
/* Read a rank file whole, refusing one over TIKTOKEN_MAX_BYTES; 0 or -1
 * after error(). Its number of tokens (non-empty lines), at most 2^32-1. */
int tiktoken_read(const char *path, struct buf *out);
uint32_t tiktoken_count_ranks(const void *data, size_t len);

/* The special tokens of the published encoding of a pre-tokenizer kind
 * (cl100k_base's, o200k_base's; none for others): their count, names and ids
 * in *names and *ids. And its number of ranks (0 for other kinds). */
uint32_t tiktoken_published(uint32_t kind, const char *const **names, const uint32_t **ids);
uint32_t tiktoken_published_ranks(uint32_t kind);
/* Llama 3's encoding: cl100k's pattern on LLAMA3_RANKS ranks, and
 * LLAMA3_NSPECIAL special tokens from id LLAMA3_RANKS on; the name of the
 * i-th (< LLAMA3_NSPECIAL) into name[cap] (cap >= 40). */
#define LLAMA3_RANKS 128000
#define LLAMA3_NSPECIAL 256
void tiktoken_llama3_special(uint32_t i, char *name, size_t cap);

/* Hugging Face tokenizer.json (io/text/hf_tokenizer.c): a byte-level BPE (model
 * BPE, ByteLevel decoder, no normalizer or NFC: TOK_NFC) whose pre-tokenizer
 * is GPT-2's (ByteLevel with its regex, no prefix space; alone or a Sequence
 * of one), a Split then ByteLevel without its regex (Llama 3's regex string,
 * Isolated: PRETOK_CL100K; Qwen's: PRETOK_QWEN; any other regex, behavior or
 * invert through PCRE2: PRETOK_SPLIT_REGEX) or SmolLM's (Sequence[Digits
 * individual; ByteLevel]: PRETOK_GPT2_DIGITS); BPE's ignore_merges becomes
 * TOK_IGNORE_MERGES. Anything else (another model type, normalizer or
 * pre-tokenizer, a regex Oniguruma reads otherwise than PCRE2, a
 * post-processor that adds tokens, dropout, byte fallback, an added token
 * with lstrip, rstrip, single_word, or normalized under a normalizer) is
 * refused naming its JSON path. Added tokens (special or not) become special
 * tokens, found in text first (TOK_SPLIT_ADDED); the end-of-text id is
 * <|endoftext|>'s, else eos_hint when that is a special token (-1: none),
 * else <|end_of_text|>'s. A SentencePiece-style file (no pre-tokenizer,
 * Metaspace, or byte_fallback: Llama 2's, Mistral's) is read by hf_spm.c
 * instead (io/text/hf_parts.h; end of text </s> after eos_hint). */
int hf_tokenizer_read(struct tokenizer **tok, const char *path, long eos_hint);
/* Write DIR/tokenizer.json and DIR/tokenizer_config.json (max_length: the
 * model's context), and with gpt2_files also GPT-2's DIR/vocab.json and
 * DIR/merges.txt (only for GPT-2's pre-tokenizer without flags); each file
 * atomically. A SentencePiece-style tokenizer is written by hf_spm.c. The
 * o200k pre-tokenizer is refused. Refused when two tokens have the
 * same bytes or a special token is not UTF-8 (JSON cannot hold it). */
int hf_tokenizer_write(const struct tokenizer *tok, const char *dir, int gpt2_files,
		       int max_length);

#endif
