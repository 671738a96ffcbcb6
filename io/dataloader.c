/* dataloader.c - deterministic micro-batches from shards (see dataloader.h). */
#include "dataloader.h"

#include <stdlib.h>
#include <string.h>

#include "shard.h"
#include "util.h"

static int finish_open(struct dataloader *dl, int B, int T, uint64_t seed, int shuffle)
{
	dl->B = B;
	dl->T = T;
	dl->seed = seed;
	dl->shuffle = shuffle;
	if (dl->n < (size_t)T + 1)
		return error("%s: %zu tokens is too few for sequences of %d tokens",
			     dl->pattern ? dl->pattern : "data", dl->n, T);
	dl->n_windows = (dl->n - 1) / (size_t)T;
	dl->perm = xmalloc(st_mult(dl->n_windows, sizeof(uint32_t)));
	dl->perm_epoch = -1;
	pthread_mutex_init(&dl->lock, NULL);
	return 0;
}

int dataloader_from_tokens(struct dataloader *dl, const uint32_t *tokens, size_t n,
			   uint32_t vocab, int B, int T, uint64_t seed, int shuffle)
{
	memset(dl, 0, sizeof(*dl));
	dl->tokens = xmalloc(st_mult(n ? n : 1, sizeof(uint32_t)));
	memcpy(dl->tokens, tokens, n * sizeof(uint32_t));
	dl->n = n;
	dl->vocab = vocab;
	return finish_open(dl, B, T, seed, shuffle);
}

int dataloader_open(struct dataloader *dl, const char *pattern, int B, int T, uint64_t seed,
		    int shuffle)
{
	memset(dl, 0, sizeof(*dl));
	dl->pattern = xstrdup(pattern);
	char **paths = NULL;
	int npaths = 0;
	if (shard_glob(pattern, &paths, &npaths))
		return -1;
	if (npaths == 0)
		return error("no shards match '%s'", pattern);
	int rc = 0;
	for (int i = 0; i < npaths && !rc; i++) {
		struct shard *s;
		if (shard_open(&s, paths[i])) {
			rc = -1;
			break;
		}
		uint32_t vocab = shard_vocab_size(s);
		if (i == 0) {
			dl->vocab = vocab;
			dl->tokenizer_hash = shard_tokenizer_hash(s);
		} else if (vocab != dl->vocab) {
			rc = error("'%s': vocabulary size %u differs from '%s' (%u); shards of "
				   "one run must share a tokenizer", paths[i], vocab, paths[0],
				   dl->vocab);
		}
		uint64_t nt = shard_ntokens(s);
		if (!rc) {
			dl->tokens = xrealloc(dl->tokens,
					      st_mult(st_add(dl->n, nt), sizeof(uint32_t)));
			if (shard_read(s, 0, nt, dl->tokens + dl->n))
				rc = -1;
			else
				dl->n += nt;
		}
		shard_close(s);
	}
	shard_glob_free(paths, npaths);
	if (rc)
		return -1;
	return finish_open(dl, B, T, seed, shuffle);
}

/* Fisher-Yates permutation of the windows for one epoch. */
static void make_perm(struct dataloader *dl, long epoch)
{
	uint64_t state = rng_mix(dl->seed, (uint64_t)epoch + 0x5eed);
	for (size_t i = 0; i < dl->n_windows; i++)
		dl->perm[i] = (uint32_t)i;
	for (size_t i = dl->n_windows; i > 1; i--) {
		size_t j = (size_t)(rng_next(&state) % i);
		uint32_t t = dl->perm[i - 1];
		dl->perm[i - 1] = dl->perm[j];
		dl->perm[j] = t;
	}
	dl->perm_epoch = epoch;
}

void dataloader_batch(struct dataloader *dl, long index, int32_t *inputs, int32_t *targets)
{
	pthread_mutex_lock(&dl->lock);
	for (int b = 0; b < dl->B; b++) {
		uint64_t q = (uint64_t)index * (uint64_t)dl->B + (uint64_t)b;
		long epoch = (long)(q / dl->n_windows);
		size_t w = (size_t)(q % dl->n_windows);
		if (dl->shuffle) {
			if (epoch != dl->perm_epoch)
				make_perm(dl, epoch);
			w = dl->perm[w];
		}
		const uint32_t *src = dl->tokens + w * (size_t)dl->T;
		for (int t = 0; t < dl->T; t++) {
			inputs[b * dl->T + t] = (int32_t)src[t];
			targets[b * dl->T + t] = (int32_t)src[t + 1];
		}
	}
	pthread_mutex_unlock(&dl->lock);
}

void dataloader_close(struct dataloader *dl)
{
	free(dl->tokens);
	free(dl->perm);
	free(dl->pattern);
	if (dl->perm)
		pthread_mutex_destroy(&dl->lock);
	memset(dl, 0, sizeof(*dl));
}
