/* dataloader.h - micro-batches of (input, target) windows from token shards.
 *
 * The shards' tokens are concatenated (in sorted file order) and cut into
 * windows of T+1 tokens starting every T tokens (window w is tokens
 * [w*T, w*T+T]: its inputs are the first T, its targets the last T, and
 * its last token is the next window's first). Sequence q of the run (q counts
 * sequences from the start of training: micro-batch index * B + b) reads
 * window perm_e[q mod W] where W is the number of windows, e = q / W the
 * epoch, and perm_e a permutation drawn from (seed, e). So every batch is a
 * function of (seed, micro-batch index) alone: resuming at any step gives
 * exactly the batches an uninterrupted run would have seen, and a pipeline
 * stage can fetch the batch of any micro-batch independently.
 * With shuffle off (validation) window q mod W is used in order.
 */
#ifndef ASYNCPP_DATALOADER_H
#define ASYNCPP_DATALOADER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct dataloader {
	/* [n] all tokens of all shards, in one of two widths: u16 when every id
	 * fits (vocabularies of at most 65536, GPT-2's included), which halves
	 * the memory; else u32. Exactly one is non-NULL. */
	uint16_t *tokens16;
	uint32_t *tokens32;
	size_t n;
	uint32_t max_token; /* largest id in the data */
	uint32_t vocab;     /* vocabulary size recorded in the shards */
	uint64_t tokenizer_hash;
	int B, T, shuffle;
	uint64_t seed;
	size_t n_windows;
	long perm_epoch;    /* epoch whose permutation is cached, -1 none */
	uint32_t *perm;     /* [n_windows] */
	pthread_mutex_t lock;
	char *pattern;
};

/* Open every shard that pattern names (file, directory or glob). Fails
 * with a clear message if there are no shards, shards disagree on their
 * vocabulary, or there are fewer than T+1 tokens. */
int dataloader_open(struct dataloader *dl, const char *pattern, int B, int T, uint64_t seed,
		    int shuffle);
/* From tokens already in memory (tests, the built-in corpus). Copies them. */
int dataloader_from_tokens(struct dataloader *dl, const uint32_t *tokens, size_t n,
			   uint32_t vocab, int B, int T, uint64_t seed, int shuffle);
/* inputs[B*T], targets[B*T] of micro-batch `index`. Thread-safe. */
void dataloader_batch(struct dataloader *dl, long index, int32_t *inputs, int32_t *targets);
void dataloader_close(struct dataloader *dl);

#endif
