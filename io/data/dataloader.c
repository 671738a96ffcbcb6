/* dataloader.c - deterministic micro-batches from shards (see dataloader.h). */
#include "dataloader.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "../formats/shard.h"
#include "../util.h"

static uint32_t token_at(const struct dataloader *dl, size_t i)
{
	return dl->tokens16 ? dl->tokens16[i] : dl->tokens32[i];
}

/* Room for n tokens in the width the vocabulary needs (u16 up to 65536). */
static void alloc_tokens(struct dataloader *dl, size_t n)
{
	if (dl->vocab <= 65536)
		dl->tokens16 = xmalloc(st_mult(n ? n : 1, sizeof(uint16_t)));
	else
		dl->tokens32 = xmalloc(st_mult(n ? n : 1, sizeof(uint32_t)));
}

/* Store tokens [at, at+n) from a u32 buffer; the caller checked them
 * against the vocabulary, so they fit the width. */
static void put_tokens(struct dataloader *dl, size_t at, const uint32_t *src, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (dl->tokens16)
			dl->tokens16[at + i] = (uint16_t)src[i];
		else
			dl->tokens32[at + i] = src[i];
		dl->max_token = src[i] > dl->max_token ? src[i] : dl->max_token;
	}
}

static int finish_open(struct dataloader *dl, int B, int T, uint64_t seed, int shuffle)
{
	dl->B = B;
	dl->T = T;
	dl->seed = seed;
	dl->shuffle = shuffle;
	if (dl->n < (size_t)T + 1 && dl->what)
		return error("'%s' (%s): %zu tokens is too few for sequences of %d tokens (%d or "
			     "more needed)", dl->pattern, dl->what, dl->n, T, T + 1);
	if (dl->n < (size_t)T + 1)
		return error("%s: %zu tokens is too few for sequences of %d tokens",
			     dl->pattern ? dl->pattern : "data", dl->n, T);
	dl->n_windows = (dl->n - 1) / (size_t)T;
	if (dl->n_windows > UINT32_MAX) /* the permutation holds u32 window numbers */
		return error("%s: %zu windows of %d tokens is more than this loader indexes "
			     "(2^32); use longer sequences or fewer shards", dl->pattern ? dl->pattern
			     : "data", dl->n_windows, T);
	dl->perm = xmalloc(st_mult(dl->n_windows, sizeof(uint32_t)));
	dl->perm_epoch = -1;
	pthread_mutex_init(&dl->lock, NULL);
	return 0;
}

int dataloader_from_tokens(struct dataloader *dl, const uint32_t *tokens, size_t n,
			   uint32_t vocab, int B, int T, uint64_t seed, int shuffle)
{
	memset(dl, 0, sizeof(*dl));
	uint32_t max = 0;
	for (size_t i = 0; i < n; i++)
		max = tokens[i] > max ? tokens[i] : max;
	dl->vocab = max < 65536 ? 65536 : max + 1; /* the width the ids need */
	alloc_tokens(dl, n);
	put_tokens(dl, 0, tokens, n);
	dl->vocab = vocab;
	dl->n = n;
	return finish_open(dl, B, T, seed, shuffle);
}

int dataloader_open(struct dataloader *dl, const char *pattern, int B, int T, uint64_t seed,
		    int shuffle)
{
	return dataloader_open_load(dl, pattern, B, T, seed, shuffle, DATA_LOAD_AUTO);
}

enum data_load data_load_parse(const char *name)
{
	return !strcmp(name, "memory") ? DATA_LOAD_MEMORY
	       : !strcmp(name, "stream") ? DATA_LOAD_STREAM
					 : DATA_LOAD_AUTO;
}

int dataloader_streaming(const struct dataloader *dl)
{
	return dl->shards != NULL;
}

/* Read every shard into memory, in order. */
static int read_all(struct dataloader *dl, struct shard **shards, int nshards, size_t total)
{
	alloc_tokens(dl, total);
	enum { PIECE = 1 << 20 };
	uint32_t *piece = xmalloc(PIECE * sizeof(uint32_t));
	int rc = 0;
	for (int i = 0; i < nshards && !rc; i++) {
		uint64_t nt = shard_ntokens(shards[i]);
		/* shard_read checks every token against the vocabulary */
		for (uint64_t at = 0; at < nt && !rc; at += PIECE) {
			size_t k = (size_t)MIN((uint64_t)PIECE, nt - at);
			if (shard_read(shards[i], at, k, piece))
				rc = -1;
			else
				put_tokens(dl, dl->n + (size_t)at, piece, k);
		}
		if (!rc)
			dl->n += (size_t)nt;
	}
	free(piece);
	return rc;
}

/* Keep the shards open and read windows from them as they are needed. */
static void start_streaming(struct dataloader *dl, struct shard **shards, int nshards,
			    size_t total, int B, int T)
{
	dl->shards = shards;
	dl->nshards = nshards;
	dl->shard_first = xmalloc(((size_t)nshards + 1) * sizeof(uint64_t));
	dl->shard_first[0] = 0;
	for (int i = 0; i < nshards; i++)
		dl->shard_first[i + 1] = dl->shard_first[i] + shard_ntokens(shards[i]);
	dl->n = total;
	dl->max_token = dl->vocab ? dl->vocab - 1 : 0;
	dl->window = xmalloc(((size_t)T + 1) * sizeof(uint32_t));
	size_t bt = st_mult((size_t)B, (size_t)T);
	for (int r = 0; r < DATA_RECENT; r++) {
		dl->recent[r].index = -1;
		dl->recent[r].inputs = xmalloc(st_mult(bt, sizeof(int32_t)));
		dl->recent[r].targets = xmalloc(st_mult(bt, sizeof(int32_t)));
	}
}

int dataloader_open_load(struct dataloader *dl, const char *pattern, int B, int T,
			 uint64_t seed, int shuffle, enum data_load load)
{
	return dataloader_open_named(dl, NULL, pattern, B, T, seed, shuffle, load);
}

int dataloader_open_named(struct dataloader *dl, const char *what, const char *pattern, int B,
			  int T, uint64_t seed, int shuffle, enum data_load load)
{
	memset(dl, 0, sizeof(*dl));
	dl->pattern = xstrdup(pattern);
	dl->what = what;
	char **paths = NULL;
	int npaths = 0;
	if (shard_glob(pattern, &paths, &npaths))
		return -1;
	if (npaths == 0)
		return error("no shards match '%s'", pattern);
	/* open every shard first: the vocabularies must agree, and the total
	 * sizes the one allocation (or decides to stream) */
	struct shard **shards = xcalloc((size_t)npaths, sizeof(*shards));
	int rc = 0;
	size_t total = 0;
	for (int i = 0; i < npaths && !rc; i++) {
		if (shard_open(&shards[i], paths[i])) {
			rc = -1;
			break;
		}
		uint32_t vocab = shard_vocab_size(shards[i]);
		if (i == 0) {
			dl->vocab = vocab;
			dl->tokenizer_hash = shard_tokenizer_hash(shards[i]);
		} else if (vocab != dl->vocab) {
			rc = error("'%s': vocabulary size %u differs from '%s' (%u); shards of "
				   "one run must share a tokenizer", paths[i], vocab, paths[0],
				   dl->vocab);
		}
		total = st_add(total, shard_ntokens(shards[i]));
	}
	size_t width = dl->vocab <= 65536 ? 2 : 4;
	int stream = load == DATA_LOAD_STREAM ||
		     (load == DATA_LOAD_AUTO && (double)total * width > (double)DATA_MEMORY_LIMIT);
	if (!rc && stream && total >= (size_t)T + 1) {
		start_streaming(dl, shards, npaths, total, B, T);
		shards = NULL; /* the loader owns them now */
	} else if (!rc) {
		rc = read_all(dl, shards, npaths, total);
	}
	for (int i = 0; shards && i < npaths; i++)
		shard_close(shards[i]);
	free(shards);
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

/* Tokens [g, g+n) of the concatenated shards, through their seek tables. */
static int read_stream(struct dataloader *dl, uint64_t g, size_t n, uint32_t *out)
{
	while (n) {
		/* the last shard starting at or before g (empty shards are skipped,
		 * as the next one starts at the same token) */
		int lo = 0, hi = dl->nshards - 1;
		while (lo < hi) {
			int mid = lo + (hi - lo + 1) / 2;
			if (dl->shard_first[mid] <= g)
				lo = mid;
			else
				hi = mid - 1;
		}
		size_t k = (size_t)MIN((uint64_t)n, dl->shard_first[lo + 1] - g);
		if (k == 0) /* g past the last token: a bug, not the data */
			return error("%s: token %" PRIu64 " is past the end of the data (%zu tokens)",
				     dl->pattern, g, dl->n);
		if (shard_read(dl->shards[lo], g - dl->shard_first[lo], k, out))
			return -1;
		g += k;
		out += k;
		n -= k;
	}
	return 0;
}

/* Window w (T+1 tokens) into row b of the batch. */
static int load_window(struct dataloader *dl, size_t w, int b, int32_t *inputs,
		       int32_t *targets)
{
	size_t start = w * (size_t)dl->T;
	int32_t *in = inputs + (size_t)b * dl->T, *tg = targets + (size_t)b * dl->T;
	if (dl->shards) {
		if (dl->failed || read_stream(dl, start, (size_t)dl->T + 1, dl->window))
			return -1;
		for (int t = 0; t < dl->T; t++) {
			in[t] = (int32_t)dl->window[t];
			tg[t] = (int32_t)dl->window[t + 1];
		}
		return 0;
	}
	for (int t = 0; t < dl->T; t++) {
		in[t] = (int32_t)token_at(dl, start + (size_t)t);
		tg[t] = (int32_t)token_at(dl, start + (size_t)t + 1);
	}
	return 0;
}

void dataloader_batch(struct dataloader *dl, long index, int32_t *inputs, int32_t *targets)
{
	size_t bt = (size_t)dl->B * (size_t)dl->T;
	pthread_mutex_lock(&dl->lock);
	for (int r = 0; dl->shards && r < DATA_RECENT; r++)
		if (dl->recent[r].index == index) {
			memcpy(inputs, dl->recent[r].inputs, bt * sizeof(int32_t));
			memcpy(targets, dl->recent[r].targets, bt * sizeof(int32_t));
			pthread_mutex_unlock(&dl->lock);
			return;
		}
	int ok = 1;
	for (int b = 0; b < dl->B && ok; b++) {
		uint64_t q = (uint64_t)index * (uint64_t)dl->B + (uint64_t)b;
		long epoch = (long)(q / dl->n_windows);
		size_t w = (size_t)(q % dl->n_windows);
		if (dl->shuffle) {
			if (epoch != dl->perm_epoch)
				make_perm(dl, epoch);
			w = dl->perm[w];
		}
		ok = !load_window(dl, w, b, inputs, targets);
	}
	if (!ok) { /* streaming failed: error() named the shard; the caller stops */
		dl->failed = 1;
		memset(inputs, 0, bt * sizeof(int32_t));
		memset(targets, 0, bt * sizeof(int32_t));
	} else if (dl->shards) {
		int r = dl->recent_next;
		dl->recent_next = (r + 1) % DATA_RECENT;
		dl->recent[r].index = index;
		memcpy(dl->recent[r].inputs, inputs, bt * sizeof(int32_t));
		memcpy(dl->recent[r].targets, targets, bt * sizeof(int32_t));
	}
	pthread_mutex_unlock(&dl->lock);
}

void dataloader_close(struct dataloader *dl)
{
	free(dl->tokens16);
	free(dl->tokens32);
	for (int r = 0; dl->shards && r < DATA_RECENT; r++) {
		free(dl->recent[r].inputs);
		free(dl->recent[r].targets);
	}
	for (int i = 0; i < dl->nshards; i++)
		shard_close(dl->shards[i]);
	free(dl->shards);
	free(dl->shard_first);
	free(dl->window);
	free(dl->perm);
	free(dl->pattern);
	if (dl->perm)
		pthread_mutex_destroy(&dl->lock);
	memset(dl, 0, sizeof(*dl));
}
