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
 *
 * The tokens are either read into memory at open, or streamed: the shards
 * stay open and each window is read through their seek tables (one chunk
 * decompressed and checksummed per window), so data far larger than memory
 * trains with the same batches. A read that fails while streaming (a shard
 * changed or damaged after open) is reported with error(), sets `failed`
 * and yields a batch of zeros; the caller must check `failed` and stop
 * before keeping anything computed from such a batch.
 */
#ifndef ASYNCPP_DATALOADER_H
#define ASYNCPP_DATALOADER_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct shard;

enum data_load {
	DATA_LOAD_AUTO,   /* in memory up to DATA_MEMORY_LIMIT bytes of tokens, else streamed */
	DATA_LOAD_MEMORY, /* every token in memory */
	DATA_LOAD_STREAM, /* read through the shards' seek tables as needed */
};
#define DATA_MEMORY_LIMIT (4ull << 30)

/* Streaming: a few recent batches, since the first and the last pipeline
 * stage each ask for every micro-batch (one for inputs, one for targets). */
#define DATA_RECENT 16

struct dataloader {
	/* [n] all tokens of all shards, in one of two widths: u16 when every id
	 * fits (vocabularies of at most 65536, GPT-2's included), which halves
	 * the memory; else u32. Exactly one is non-NULL. */
	uint16_t *tokens16;
	uint32_t *tokens32;
	size_t n;
	uint32_t max_token; /* largest id in the data; when streaming, vocab - 1 (not read) */
	/* streaming: shard i holds tokens [shard_first[i], shard_first[i+1]) */
	struct shard **shards;
	uint64_t *shard_first; /* [nshards + 1] */
	int nshards;
	uint32_t *window;      /* [T+1] scratch */
	struct {
		long index; /* -1: empty */
		int32_t *inputs, *targets; /* [B*T] */
	} recent[DATA_RECENT];
	int recent_next;
	int failed;            /* a streamed read failed (error() said where) */
	uint32_t vocab;     /* vocabulary size recorded in the shards */
	uint64_t tokenizer_hash;
	int B, T, shuffle;
	uint64_t seed;
	size_t n_windows;
	long perm_epoch;    /* epoch whose permutation is cached, -1 none */
	uint32_t *perm;     /* [n_windows] */
	pthread_mutex_t lock;
	char *pattern;
	const char *what;   /* dataloader_open_named's description, for messages */
};

/* Open every shard that pattern names (file, directory or glob). Fails
 * with a clear message if there are no shards, shards disagree on their
 * vocabulary, or there are fewer than T+1 tokens. */
int dataloader_open(struct dataloader *dl, const char *pattern, int B, int T, uint64_t seed,
		    int shuffle);
/* The same, choosing memory or streaming (dataloader_open is AUTO). */
int dataloader_open_load(struct dataloader *dl, const char *pattern, int B, int T,
			 uint64_t seed, int shuffle, enum data_load load);
/* The same, with what the data are for messages (a static string: "the
 * validation data, data.val"): "'x_val.shard' (the validation data,
 * data.val): 0 tokens is too few for sequences of 64 tokens (65 or more
 * needed)". */
int dataloader_open_named(struct dataloader *dl, const char *what, const char *pattern, int B,
			  int T, uint64_t seed, int shuffle, enum data_load load);
/* "auto", "memory" or "stream" (data.load) as an enum data_load. */
enum data_load data_load_parse(const char *name);
int dataloader_streaming(const struct dataloader *dl);
/* From tokens already in memory (tests, the built-in corpus). Copies them. */
int dataloader_from_tokens(struct dataloader *dl, const uint32_t *tokens, size_t n,
			   uint32_t vocab, int B, int T, uint64_t seed, int shuffle);
/* inputs[B*T], targets[B*T] of micro-batch `index`. Thread-safe. */
void dataloader_batch(struct dataloader *dl, long index, int32_t *inputs, int32_t *targets);
void dataloader_close(struct dataloader *dl);

#endif
