/* encode.h - the pipeline of `asyncpp tokenize encode`: documents from a
 * corpus reader, encoded on all cores, written to train/val shards (or
 * printed as ids). `asyncpp bench tokenizer` times the same code.
 *
 * Each document is written as <|endoftext|> then its tokens. The val split
 * is by document: a document goes to val when a number drawn from (seed, a
 * 64-bit hash of its text) is below val_fraction, so the same documents land
 * on the same side in any order, on any thread count. When the corpus has
 * too few documents for that (fewer than 1/val_fraction, or none was drawn)
 * the split is by position instead: the last val_fraction of all tokens (at
 * least one) form the val shard, and a warning says so.
 */
#ifndef ASYNCPP_ENCODE_H
#define ASYNCPP_ENCODE_H

#include <stdint.h>
#include <stdio.h>

struct tokenizer;
struct corpus;

struct encode_opts {
	const struct tokenizer *tok;
	int nthreads;                     /* >= 1 */
	double val_fraction;              /* 0..1; 0 writes no val shard */
	uint64_t seed;
	uint32_t chunk_tokens;            /* tokens per shard chunk; 0: the default */
	const char *train_path, *val_path; /* NULL train_path: print ids to ids_out */
	FILE *ids_out;                    /* one document a line, without <|endoftext|> */
	int progress;                     /* a progress line on stderr */
};

struct encode_result {
	uint64_t docs, val_docs;          /* val_docs: drawn for val by the document split */
	uint64_t train_tokens, val_tokens;
	uint64_t bytes;                   /* text encoded */
	uint64_t min_docs;                /* fewer documents split by position: ceil(1/F) */
	int by_position;                  /* the val split fell back to position */
};

/* Encode every document of c. Shards are written atomically: on failure
 * (-1 after error()) none is left. */
int encode_corpus(struct corpus *c, const struct encode_opts *o, struct encode_result *r);

#endif
