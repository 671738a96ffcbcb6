/* test_dataloader.c - micro-batches from shards: windows and targets, the
 * order of shards, both token widths in memory, every window once per epoch,
 * batches that depend on (seed, index) alone, clear errors, and streaming
 * (asyncpp and llm.c shards) that gives the batches memory gives. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../io/data/dataloader.h"
#include "../../io/formats/shard.h"
#include "../../io/util.h"
#include "../test.h"

/* One shard of tokens[0..n) as a single document, small chunks so that
 * windows straddle them. */
static int write_shard(const char *path, uint32_t vocab, const uint32_t *tokens, size_t n)
{
	struct shard_writer *w;
	if (shard_writer_open(&w, path, vocab, 0))
		return -1;
	if (shard_writer_set_chunk_tokens(w, 37) || shard_writer_add_doc(w, tokens, n)) {
		shard_writer_abort(w);
		return -1;
	}
	return shard_writer_close(w);
}

enum { N = 1000, B = 3, T = 16 };

static void fill(uint32_t *v, size_t n, uint32_t vocab, uint64_t seed)
{
	for (size_t i = 0; i < n; i++)
		v[i] = (uint32_t)(rng_next(&seed) % vocab);
}

/* Do loaders a and b give the same micro-batch `index`? */
static int same_batch(struct dataloader *a, struct dataloader *b, long index)
{
	int32_t ia[B * T], ta[B * T], ib[B * T], tb[B * T];
	dataloader_batch(a, index, ia, ta);
	dataloader_batch(b, index, ib, tb);
	return !memcmp(ia, ib, sizeof(ia)) && !memcmp(ta, tb, sizeof(ta));
}

TEST(windows_in_order_without_shuffle)
{
	uint32_t tok[N];
	fill(tok, N, 500, 1);
	CHECK(write_shard(test_path("a.shard"), 500, tok, N) == 0);
	struct dataloader dl;
	CHECK(dataloader_open(&dl, test_path("a.shard"), B, T, 9, 0) == 0);
	CHECK(dl.n == N && dl.n_windows == (N - 1) / T && dl.tokens16 && !dl.tokens32);
	int32_t in[B * T], tg[B * T];
	for (long index = 0; index < 30; index++) {
		dataloader_batch(&dl, index, in, tg);
		for (int b = 0; b < B; b++) {
			size_t w = ((size_t)index * B + (size_t)b) % dl.n_windows;
			for (int t = 0; t < T; t++) {
				CHECK(in[b * T + t] == (int32_t)tok[w * T + (size_t)t]);
				CHECK(tg[b * T + t] == (int32_t)tok[w * T + (size_t)t + 1]);
			}
		}
	}
	dataloader_close(&dl);
}

/* Shards concatenate in sorted file order, whatever order they were made in. */
TEST(shards_concatenate_sorted)
{
	char *dir = test_path("multi");
	CHECK(mkdir(dir, 0755) == 0);
	uint32_t a[300], b[400];
	fill(a, 300, 800, 2);
	fill(b, 400, 800, 3);
	char pb[600], pa[600];
	snprintf(pb, sizeof(pb), "%s/b.shard", dir);
	snprintf(pa, sizeof(pa), "%s/a.shard", dir);
	CHECK(write_shard(pb, 800, b, 400) == 0);
	CHECK(write_shard(pa, 800, a, 300) == 0);
	struct dataloader dl;
	CHECK(dataloader_open(&dl, dir, 1, T, 0, 0) == 0);
	CHECK(dl.n == 700);
	int32_t in[T], tg[T];
	/* window 18 covers tokens 288..304: the seam between a and b */
	dataloader_batch(&dl, 18, in, tg);
	for (int t = 0; t < T; t++) {
		size_t i = 18 * T + (size_t)t + 1;
		CHECK(tg[t] == (int32_t)(i < 300 ? a[i] : b[i - 300]));
	}
	dataloader_close(&dl);
}

/* The in-memory width follows the vocabulary (u16 up to 65536, else u32);
 * the batches are the same either way, and the largest ids survive. */
TEST(token_widths_give_the_same_batches)
{
	uint32_t tok[N];
	fill(tok, N, 65536, 4);
	tok[5] = 65535;
	CHECK(write_shard(test_path("w16.shard"), 65536, tok, N) == 0);
	CHECK(write_shard(test_path("w32.shard"), 70000, tok, N) == 0);
	struct dataloader d16, d32;
	CHECK(dataloader_open(&d16, test_path("w16.shard"), B, T, 5, 1) == 0);
	CHECK(dataloader_open(&d32, test_path("w32.shard"), B, T, 5, 1) == 0);
	CHECK(d16.tokens16 && d32.tokens32);
	CHECK(d16.max_token == 65535 && d32.max_token == 65535);
	for (long index = 0; index < 50; index++)
		CHECK(same_batch(&d16, &d32, index));
	dataloader_close(&d16);
	dataloader_close(&d32);

	uint32_t big[N];
	fill(big, N, 70000, 5);
	big[7] = 69999;
	CHECK(write_shard(test_path("big.shard"), 70000, big, N) == 0);
	CHECK(dataloader_open(&d32, test_path("big.shard"), 1, T, 0, 0) == 0);
	CHECK(d32.max_token == 69999);
	int32_t in[T], tg[T];
	dataloader_batch(&d32, 0, in, tg);
	CHECK(in[7] == 69999 && tg[6] == 69999);
	dataloader_close(&d32);
}

/* Shuffled: each epoch visits every window exactly once, epochs differ,
 * and a batch depends on (seed, index) alone, not on what was read before. */
TEST(shuffle_is_a_permutation_per_epoch_and_stateless)
{
	uint32_t tok[N];
	for (size_t i = 0; i < N; i++)
		tok[i] = (uint32_t)i; /* a window's first token names it */
	struct dataloader dl, fresh;
	CHECK(dataloader_from_tokens(&dl, tok, N, N, 1, T, 11, 1) == 0);
	size_t W = dl.n_windows;
	int *seen = xcalloc(W, sizeof(int));
	int32_t in[T], tg[T], in2[T], tg2[T];
	int differs = 0;
	for (long index = 0; index < 2 * (long)W; index++) {
		dataloader_batch(&dl, index, in, tg);
		CHECK(in[0] % T == 0);
		size_t w = (size_t)in[0] / T;
		CHECK(w < W);
		seen[w] += 1;
		if (index >= (long)W) {
			dataloader_batch(&dl, index - (long)W, in2, tg2);
			differs |= in2[0] != in[0];
		}
		if (index == (long)W - 1) {
			for (size_t k = 0; k < W; k++)
				CHECK(seen[k] == 1);
		}
	}
	CHECK(differs);
	/* out of order, from a fresh loader: the same batch for the same index */
	CHECK(dataloader_from_tokens(&fresh, tok, N, N, 1, T, 11, 1) == 0);
	for (long index = 3 * (long)W; index >= 0; index -= 7) {
		dataloader_batch(&fresh, index, in, tg);
		dataloader_batch(&dl, index, in2, tg2);
		CHECK(!memcmp(in, in2, sizeof(in)) && !memcmp(tg, tg2, sizeof(tg)));
	}
	free(seen);
	dataloader_close(&dl);
	dataloader_close(&fresh);
	/* another seed, another order */
	CHECK(dataloader_from_tokens(&dl, tok, N, N, 1, T, 12, 1) == 0);
	CHECK(dataloader_from_tokens(&fresh, tok, N, N, 1, T, 11, 1) == 0);
	differs = 0;
	for (long index = 0; index < 10; index++) {
		dataloader_batch(&dl, index, in, tg);
		dataloader_batch(&fresh, index, in2, tg2);
		differs |= in[0] != in2[0];
	}
	CHECK(differs);
	dataloader_close(&dl);
	dataloader_close(&fresh);
}

TEST(errors_name_the_data)
{
	uint32_t tok[N];
	fill(tok, N, 500, 6);
	CHECK(write_shard(test_path("v500.shard"), 500, tok, N) == 0);
	CHECK(write_shard(test_path("v600.shard"), 600, tok, N) == 0);
	struct dataloader dl;
	/* shards of two vocabularies */
	CHECK(dataloader_open(&dl, test_path("v[56]00.shard"), B, T, 0, 0) == -1);
	dataloader_close(&dl);
	/* nothing matches */
	CHECK(dataloader_open(&dl, test_path("none-*.shard"), B, T, 0, 0) == -1);
	dataloader_close(&dl);
	/* fewer than T + 1 tokens */
	CHECK(write_shard(test_path("tiny.shard"), 500, tok, T) == 0);
	CHECK(dataloader_open(&dl, test_path("tiny.shard"), B, T, 0, 0) == -1);
	dataloader_close(&dl);
}

/* Streaming reads windows through the shards' seek tables: the batches are
 * those of the tokens in memory, across chunks, shards (an empty one
 * included) and epochs, in and out of order, and for both widths. */
static void check_stream_equals_memory(uint32_t vocab)
{
	char dir[600];
	snprintf(dir, sizeof(dir), "%s/stream-%u", test_tmpdir(), vocab);
	CHECK(mkdir(dir, 0755) == 0);
	static const size_t sizes[] = {300, 0, 517, 17, 400};
	uint64_t seed = vocab;
	for (size_t i = 0; i < ARRAY_SIZE(sizes); i++) {
		uint32_t v[600];
		fill(v, sizes[i], vocab, ++seed);
		char p[700];
		snprintf(p, sizeof(p), "%s/part%zu.shard", dir, i);
		CHECK(write_shard(p, vocab, v, sizes[i]) == 0);
	}
	for (int shuffle = 0; shuffle <= 1; shuffle++) {
		struct dataloader mem, str;
		CHECK(dataloader_open_load(&mem, dir, B, T, 21, shuffle, DATA_LOAD_MEMORY) == 0);
		CHECK(dataloader_open_load(&str, dir, B, T, 21, shuffle, DATA_LOAD_STREAM) == 0);
		CHECK(!dataloader_streaming(&mem) && dataloader_streaming(&str));
		CHECK(mem.n == 1234 && str.n == 1234 && mem.n_windows == str.n_windows);
		/* forwards over three epochs, then every index again backwards
		 * (past the recent-batch cache), then repeats (from it) */
		long W = (long)str.n_windows, order[600];
		int k = 0;
		for (long i = 0; i < 3 * W / B + 2; i++)
			order[k++] = i;
		for (long i = 3 * W / B + 1; i >= 0 && k < 590; i -= 3)
			order[k++] = i;
		order[k++] = 5;
		order[k++] = 5;
		for (int j = 0; j < k; j++)
			CHECK_MSG(same_batch(&mem, &str, order[j]), "batch %ld differs (shuffle %d)",
				  order[j], shuffle);
		CHECK(!str.failed);
		dataloader_close(&mem);
		dataloader_close(&str);
	}
}

TEST(stream_equals_memory_u16) { check_stream_equals_memory(1000); }
TEST(stream_equals_memory_u32) { check_stream_equals_memory(70000); }

/* A chunk damaged after the loader opened the shard: the batch that needs
 * it comes back as zeros with `failed` set, and error() names the file. */
TEST(stream_read_failure_is_reported)
{
	uint32_t tok[N];
	fill(tok, N, 500, 8);
	char *path = test_path("damaged.shard");
	CHECK(write_shard(path, 500, tok, N) == 0);
	struct dataloader dl;
	CHECK(dataloader_open_load(&dl, path, B, T, 0, 0, DATA_LOAD_STREAM) == 0);
	int32_t in[B * T], tg[B * T];
	dataloader_batch(&dl, 0, in, tg);
	CHECK(!dl.failed && in[1] == (int32_t)tok[1]);
	/* flip one byte in every chunk frame but the first: the header frame
	 * and seek table stay intact, so only reading the data can tell */
	struct stat st;
	CHECK(stat(path, &st) == 0);
	FILE *fp = fopen(path, "r+b");
	CHECK(fp != NULL);
	unsigned char *bytes = xmalloc((size_t)st.st_size);
	CHECK(fread(bytes, 1, (size_t)st.st_size, fp) == (size_t)st.st_size);
	for (long at = st.st_size / 2; at < st.st_size * 3 / 4; at += 7)
		bytes[at] ^= 0x5a;
	CHECK(fseek(fp, 0, SEEK_SET) == 0);
	CHECK(fwrite(bytes, 1, (size_t)st.st_size, fp) == (size_t)st.st_size);
	CHECK(fclose(fp) == 0);
	free(bytes);
	set_error_quiet(1);
	for (long index = 1; index < (long)dl.n_windows / B && !dl.failed; index++)
		dataloader_batch(&dl, index, in, tg);
	set_error_quiet(0);
	CHECK(dl.failed);
	CHECK_MSG(strstr(last_error(), "damaged.shard") != NULL, "error: %s", last_error());
	int zeros = 1;
	for (int i = 0; i < B * T; i++)
		zeros &= in[i] == 0 && tg[i] == 0;
	CHECK(zeros);
	dataloader_close(&dl);
}

/* auto reads small data into memory */
TEST(auto_reads_small_data_into_memory)
{
	uint32_t tok[N];
	fill(tok, N, 500, 9);
	CHECK(write_shard(test_path("auto.shard"), 500, tok, N) == 0);
	struct dataloader dl;
	CHECK(dataloader_open_load(&dl, test_path("auto.shard"), B, T, 0, 0, DATA_LOAD_AUTO) == 0);
	CHECK(!dataloader_streaming(&dl) && dl.tokens16);
	dataloader_close(&dl);
	CHECK(data_load_parse("stream") == DATA_LOAD_STREAM &&
	      data_load_parse("memory") == DATA_LOAD_MEMORY && data_load_parse("auto") == DATA_LOAD_AUTO);
}

/* llm.c .bin shards (uncompressed u16 after a 1024-byte header) stream too */
TEST(stream_llmc_shards_equals_memory)
{
	char dir[600];
	snprintf(dir, sizeof(dir), "%s/llmc", test_tmpdir());
	CHECK(mkdir(dir, 0755) == 0);
	for (int f = 0; f < 2; f++) {
		int32_t n = f ? 700 : 450;
		unsigned char *b = xcalloc(1024 + 2 * (size_t)n, 1);
		put_le32(b, LLMC_SHARD_MAGIC);
		put_le32(b + 4, 1);
		put_le32(b + 8, (uint32_t)n);
		uint64_t seed = 40 + (uint64_t)f;
		for (int32_t i = 0; i < n; i++)
			put_le16(b + 1024 + 2 * i, (uint16_t)(rng_next(&seed) % LLMC_SHARD_VOCAB));
		char p[700];
		snprintf(p, sizeof(p), "%s/fineweb_%d.bin", dir, f);
		FILE *fp = fopen(p, "wb");
		CHECK(fp && fwrite(b, 1, 1024 + 2 * (size_t)n, fp) == 1024 + 2 * (size_t)n);
		CHECK(fclose(fp) == 0);
		free(b);
	}
	struct dataloader mem, str;
	CHECK(dataloader_open_load(&mem, dir, B, T, 3, 1, DATA_LOAD_MEMORY) == 0);
	CHECK(dataloader_open_load(&str, dir, B, T, 3, 1, DATA_LOAD_STREAM) == 0);
	CHECK(mem.n == 1150 && str.n == 1150 && str.vocab == LLMC_SHARD_VOCAB);
	for (long index = 0; index < 60; index++)
		CHECK(same_batch(&mem, &str, index));
	dataloader_close(&mem);
	dataloader_close(&str);
}
