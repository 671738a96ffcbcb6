/* test_container.c - the zstd container: round trips, streaming chunks,
 * zstd compatibility, atomic writes and rejected corruption. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../io/formats/checkpoint.h"
#include "../../io/formats/container.h"
#include "../../io/util.h"
#include "../test.h"

/* Chunk i of a test container: mixes random and repetitive bytes. */
static size_t make_chunk(int i, unsigned char *out, size_t max)
{
	static const size_t sizes[] = {1000, 0, 1, 300000, 77, 5000};
	size_t n = sizes[i % 6];
	if (n > max)
		n = max;
	uint64_t rng = 1234 + (uint64_t)i;
	for (size_t j = 0; j < n; j++)
		out[j] = (j / 64) % 2 ? (unsigned char)rng_next(&rng) : (unsigned char)(j % 7);
	return n;
}

static int file_exists(const char *path)
{
	struct stat st;
	return !stat(path, &st);
}

TEST(round_trip)
{
	const char *path = test_path("rt.bin");
	struct container_writer *w;
	const char hdr[] = "caller header blob";
	CHECK(container_create(&w, path, "TESTMAGC", 3, hdr, sizeof(hdr), 0) == 0);
	unsigned char *data = xmalloc(300000), *back = xmalloc(300000);
	for (int i = 0; i < 6; i++) {
		size_t n = make_chunk(i, data, 300000);
		CHECK(container_add_chunk(w, data, n) == 0);
	}
	CHECK(container_writer_nchunks(w) == 6);
	CHECK(container_commit(w) == 0);

	struct container *c;
	CHECK(container_open(&c, path, "TESTMAGC", "test file") == 0);
	CHECK(container_version(c) == 3);
	CHECK(!memcmp(container_magic(c), "TESTMAGC", 8));
	size_t hl;
	const void *h = container_header(c, &hl);
	CHECK(hl == sizeof(hdr) && !memcmp(h, hdr, hl));
	CHECK(container_nchunks(c) == 6);
	/* read them out of order: each chunk stands alone */
	for (int k = 0; k < 6; k++) {
		int i = (k * 5 + 3) % 6;
		size_t n = make_chunk(i, data, 300000);
		CHECK(container_chunk_size(c, i) == n);
		memset(back, 0xAB, n);
		CHECK(container_read_chunk(c, i, back) == 0);
		CHECK(!memcmp(back, data, n));
	}
	CHECK(container_verify(c) == 0);
	set_error_quiet(1);
	CHECK(container_read_chunk(c, 6, back) == -1);
	set_error_quiet(0);
	container_close(c);
	free(data);
	free(back);
}

TEST(streamed_chunk_equals_whole)
{
	const char *path = test_path("stream.bin");
	size_t n = 400000;
	unsigned char *data = xmalloc(n), *back = xmalloc(n);
	uint64_t rng = 7;
	for (size_t j = 0; j < n; j++)
		data[j] = (unsigned char)(rng_next(&rng) % 13);
	struct container_writer *w;
	CHECK(container_create(&w, path, "STREAMED", 1, NULL, 0, 1) == 0);
	CHECK(container_chunk_begin(w, n) == 0);
	for (size_t off = 0; off < n; off += 9999)
		CHECK(container_chunk_write(w, data + off, MIN((size_t)9999, n - off)) == 0);
	CHECK(container_chunk_end(w) == 0);
	CHECK(container_add_chunk(w, data, 1000) == 0);
	CHECK(container_commit(w) == 0);
	struct container *c;
	CHECK(container_open(&c, path, "STREAMED", NULL) == 0);
	CHECK(container_nchunks(c) == 2 && container_chunk_size(c, 0) == n);
	CHECK(container_read_chunk(c, 0, back) == 0 && !memcmp(back, data, n));
	CHECK(container_read_chunk(c, 1, back) == 0 && !memcmp(back, data, 1000));
	container_close(c);
	free(data);
	free(back);
}

TEST(streamed_chunk_wrong_length_is_an_error)
{
	const char *path = test_path("short.bin");
	struct container_writer *w;
	CHECK(container_create(&w, path, "STREAMED", 1, NULL, 0, 0) == 0);
	set_error_quiet(1);
	CHECK(container_chunk_begin(w, 10) == 0);
	CHECK(container_chunk_write(w, "abcde", 5) == 0);
	CHECK(container_chunk_end(w) == -1);
	CHECK(container_commit(w) == -1);
	set_error_quiet(0);
	CHECK(!file_exists(path));
}

TEST(threads_round_trip)
{
	const char *path = test_path("mt.bin");
	size_t n = 3 << 20;
	unsigned char *data = xmalloc(n), *back = xmalloc(n);
	uint64_t rng = 99;
	for (size_t j = 0; j < n; j++)
		data[j] = (unsigned char)(rng_next(&rng) % 5);
	struct container_writer *w;
	CHECK(container_create(&w, path, "THREADED", 1, "x", 1, 1) == 0);
	CHECK(container_set_threads(w, 2) == 0);
	CHECK(container_add_chunk(w, data, n) == 0);
	CHECK(container_commit(w) == 0);
	struct container *c;
	CHECK(container_open(&c, path, "THREADED", NULL) == 0);
	CHECK(container_read_chunk(c, 0, back) == 0 && !memcmp(back, data, n));
	container_close(c);
	free(data);
	free(back);
}

TEST(set_header_is_written_at_commit)
{
	const char *path = test_path("sethdr.bin");
	struct container_writer *w;
	CHECK(container_create(&w, path, "SETHEADR", 2, "00000000", 8, 0) == 0);
	CHECK(container_add_chunk(w, "hello", 5) == 0);
	set_error_quiet(1);
	CHECK(container_set_header(w, "123", 3) == -1);
	set_error_quiet(0);
	CHECK(container_set_header(w, "12345678", 8) == 0);
	CHECK(container_commit(w) == 0);
	struct container *c;
	CHECK(container_open(&c, path, "SETHEADR", NULL) == 0);
	size_t hl;
	const char *h = container_header(c, &hl);
	CHECK(hl == 8 && !memcmp(h, "12345678", 8));
	char back[5];
	CHECK(container_read_chunk(c, 0, back) == 0 && !memcmp(back, "hello", 5));
	container_close(c);
}

/* zstd's own tool must accept the file, and decompress it to the chunks. */
TEST(zstd_cli_accepts_container)
{
	if (system("zstd --version > /dev/null 2>&1"))
		SKIP("no zstd program");
	const char *path = test_path("cli.bin");
	struct container_writer *w;
	CHECK(container_create(&w, path, "ZSTDTEST", 1, "hdr", 3, 0) == 0);
	unsigned char *data = xmalloc(300000);
	struct buf all = {0};
	for (int i = 0; i < 6; i++) {
		size_t n = make_chunk(i, data, 300000);
		CHECK(container_add_chunk(w, data, n) == 0);
		buf_append(&all, data, n);
	}
	CHECK(container_commit(w) == 0);
	char cmd[1200];
	snprintf(cmd, sizeof(cmd), "zstd -q -t '%s'", path);
	CHECK(system(cmd) == 0);
	const char *out = test_path("cli.out");
	snprintf(cmd, sizeof(cmd), "zstd -q -d -c '%s' > '%s'", path, out);
	CHECK(system(cmd) == 0);
	struct buf got = {0};
	CHECK(read_file(out, &got) == 0);
	CHECK(got.len == all.len && !memcmp(got.data, all.data, all.len));
	buf_free(&got);
	buf_free(&all);
	free(data);
}

TEST(abort_leaves_destination_untouched)
{
	const char *path = test_path("keep.bin");
	CHECK(test_write_file(path, "old contents", 12) == 0);
	struct container_writer *w;
	CHECK(container_create(&w, path, "ABORTING", 1, NULL, 0, 0) == 0);
	CHECK(container_add_chunk(w, "new", 3) == 0);
	container_abort(w);
	struct buf b = {0};
	CHECK(read_file(path, &b) == 0);
	CHECK(b.len == 12 && !memcmp(b.data, "old contents", 12));
	buf_free(&b);
	char tmp[600];
	snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
	CHECK(!file_exists(tmp));
}

TEST(wrong_magic_and_any_magic)
{
	const char *path = test_path("magic.bin");
	struct container_writer *w;
	CHECK(container_create(&w, path, "MAGIC_AA", 1, NULL, 0, 0) == 0);
	CHECK(container_commit(w) == 0);
	struct container *c;
	set_error_quiet(1);
	CHECK(container_open(&c, path, "MAGIC_BB", "widget") == -1);
	set_error_quiet(0);
	CHECK(strstr(last_error(), "not an asyncpp widget (bad magic)"));
	CHECK(container_open(&c, path, NULL, NULL) == 0);
	CHECK(!memcmp(container_magic(c), "MAGIC_AA", 8));
	CHECK(container_nchunks(c) == 0 && container_data_size(c) == 0);
	container_close(c);
	char m[8];
	CHECK(container_peek(path, m) == 1 && !memcmp(m, "MAGIC_AA", 8));
	const char *txt = test_path("text.txt");
	CHECK(test_write_file(txt, "just some text, long enough", 27) == 0);
	CHECK(container_peek(txt, m) == 0);
	set_error_quiet(1);
	CHECK(container_open(&c, txt, NULL, "shard") == -1);
	CHECK(strstr(last_error(), "not an asyncpp shard (bad magic)"));
	CHECK(container_open(&c, test_path("missing"), NULL, NULL) == -1);
	CHECK(strstr(last_error(), "No such file"));
	set_error_quiet(0);
}

TEST(newer_layout_version_is_rejected)
{
	const char *path = test_path("layout.bin");
	struct container_writer *w;
	CHECK(container_create(&w, path, "LAYOUTVV", 1, "ab", 2, 0) == 0);
	CHECK(container_commit(w) == 0);
	struct buf b = {0};
	CHECK(read_file(path, &b) == 0);
	/* layout version at byte 20; the header crc32c follows the blob */
	put_le32(b.data + 20, 9);
	put_le32(b.data + 30, crc32c(0, b.data + 8, 22));
	CHECK(test_write_file(path, b.data, b.len) == 0);
	buf_free(&b);
	struct container *c;
	set_error_quiet(1);
	CHECK(container_open(&c, path, "LAYOUTVV", NULL) == -1);
	set_error_quiet(0);
	CHECK(strstr(last_error(), "layout version 9 is newer than this asyncpp supports (1)"));
}

/* Open, verify and read every chunk; 0 only if all succeed and every chunk
 * equals the original. */
static int read_all_ok(const char *path, const struct buf *chunks, int nchunks)
{
	struct container *c;
	if (container_open(&c, path, "CORRUPTX", NULL))
		return -1;
	int rc = 0;
	if (container_nchunks(c) != (uint64_t)nchunks || container_version(c) != 1)
		rc = 1;
	for (int i = 0; i < nchunks && !rc; i++) {
		unsigned char out[256];
		if (container_chunk_size(c, i) != chunks[i].len)
			rc = 1;
		else if (container_read_chunk(c, i, out))
			rc = -1;
		else if (memcmp(out, chunks[i].data, chunks[i].len))
			rc = 1;
	}
	if (!rc && container_verify(c))
		rc = -1;
	container_close(c);
	return rc;
}

/* Every single-byte change and every truncation of a small container is
 * reported as an error: no byte goes unchecked. */
TEST(every_flipped_byte_and_truncation_is_rejected)
{
	const char *path = test_path("orig.bin"), *bad = test_path("bad.bin");
	struct container_writer *w;
	CHECK(container_create(&w, path, "CORRUPTX", 1, "hdr!", 4, 0) == 0);
	struct buf chunks[3] = {{0}};
	const char *text[3] = {"the first chunk, the first chunk", "", "third"};
	for (int i = 0; i < 3; i++) {
		buf_append(&chunks[i], text[i], strlen(text[i]));
		CHECK(container_add_chunk(w, text[i], strlen(text[i])) == 0);
	}
	CHECK(container_commit(w) == 0);
	struct buf orig = {0};
	CHECK(read_file(path, &orig) == 0);
	CHECK(orig.len < 400);
	CHECK(read_all_ok(path, chunks, 3) == 0);
	set_error_quiet(1);
	int accepted = -1, wrong = -1;
	for (size_t pos = 0; pos < orig.len && accepted < 0 && wrong < 0; pos++) {
		for (int bit = 0; bit < 8; bit += 3) {
			orig.data[pos] ^= (unsigned char)(1u << bit);
			CHECK(test_write_file(bad, orig.data, orig.len) == 0);
			orig.data[pos] ^= (unsigned char)(1u << bit);
			int r = read_all_ok(bad, chunks, 3);
			if (r == 0)
				accepted = (int)pos;
			if (r == 1)
				wrong = (int)pos;
		}
	}
	for (size_t len = 0; len < orig.len && accepted < 0; len++) {
		CHECK(test_write_file(bad, orig.data, len) == 0);
		if (read_all_ok(bad, chunks, 3) != -1)
			accepted = (int)(100000 + len);
	}
	set_error_quiet(0);
	CHECK_MSG(wrong < 0, "byte %d flipped gave wrong data", wrong);
	CHECK_MSG(accepted < 0, "corruption at %d went unnoticed", accepted);
	for (int i = 0; i < 3; i++)
		buf_free(&chunks[i]);
	buf_free(&orig);
}

TEST(corruption_messages_name_the_file_and_problem)
{
	const char *path = test_path("msg.bin");
	struct container_writer *w;
	CHECK(container_create(&w, path, "MESSAGES", 1, NULL, 0, 0) == 0);
	for (int i = 0; i < 4; i++)
		CHECK(container_add_chunk(w, "some chunk data", 15) == 0);
	CHECK(container_commit(w) == 0);
	struct buf b = {0};
	CHECK(read_file(path, &b) == 0);
	struct container *c;
	CHECK(container_open(&c, path, "MESSAGES", NULL) == 0);
	uint64_t off3 = 8 + 24; /* header frame, no blob */
	for (int i = 0; i < 3; i++)
		off3 += container_chunk_csize(c, i);
	container_close(c);
	b.data[off3 + 10] ^= 0x20;
	CHECK(test_write_file(path, b.data, b.len) == 0);
	set_error_quiet(1);
	CHECK(container_open(&c, path, "MESSAGES", NULL) == 0);
	char out[15];
	CHECK(container_read_chunk(c, 2, out) == 0);
	CHECK(container_read_chunk(c, 3, out) == -1);
	CHECK(strstr(last_error(), "chunk 3 checksum mismatch (file is corrupt)"));
	CHECK(strstr(last_error(), path));
	CHECK(container_verify(c) == -1);
	container_close(c);
	CHECK(test_write_file(path, b.data, b.len - 3) == 0);
	CHECK(container_open(&c, path, "MESSAGES", NULL) == -1);
	CHECK(strstr(last_error(), "truncated"));
	CHECK(test_write_file(path, b.data, 10) == 0);
	CHECK(container_open(&c, path, "MESSAGES", NULL) == -1);
	CHECK(strstr(last_error(), "truncated"));
	set_error_quiet(0);
	buf_free(&b);
}

/* inspect names the tensors that hold NaN or infinity and fails, while
 * still reading the file (the checksums are fine: the values are not). */
TEST(inspect_reports_nonfinite_tensors)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/nan.ckpt", test_tmpdir());
	float good[4] = {1, 2, 3, 4}, bad[6] = {0, 1, NAN, 3, INFINITY, 5};
	struct ckpt_writer *w;
	CHECK(ckpt_create(&w, path, "", "step = 1\nversions = 1\n") == 0);
	CHECK(ckpt_add(w, "weights.v0/a", good, 4, 4, 0) == 0);
	CHECK(ckpt_add(w, "weights.v0/b", bad, 6, 2, 3) == 0);
	CHECK(ckpt_commit(w) == 0);
	char *text = NULL;
	size_t len = 0;
	FILE *out = open_memstream(&text, &len);
	set_error_quiet(1);
	int rc = checkpoint_inspect(path, out, 0);
	set_error_quiet(0);
	fclose(out);
	CHECK(rc != 0);
	CHECK_MSG(strstr(last_error(), "2 values in 1 tensors are NaN or infinite"), "%s",
		  last_error());
	CHECK_MSG(strstr(text, "weights.v0/b") && strstr(text, "2 NON-FINITE"), "%s", text);
	CHECK(strstr(strstr(text, "weights.v0/a"), "\n") < strstr(text, "NON-FINITE"));
	free(text);
}

/* A checkpoint of `sets` weight versions (two tensors each) with metadata
 * META: does ckpt_open take it? If not, last_error() says why. */
static int meta_opens(const char *meta, int sets)
{
	char path[512], name[32];
	snprintf(path, sizeof(path), "%s/meta.ckpt", test_tmpdir());
	static const float x[6] = {1, 2, 3, 4, 5, 6};
	struct ckpt_writer *w;
	if (ckpt_create(&w, path, "", meta))
		return 0;
	for (int v = 0; v < sets; v++) {
		snprintf(name, sizeof(name), "weights.v%d/a", v);
		ckpt_add(w, name, x, 6, 2, 3);
		snprintf(name, sizeof(name), "weights.v%d/b", v);
		ckpt_add(w, name, x, 4, 4, 0);
	}
	ckpt_add(w, "adam_m/a", x, 6, 2, 3);
	if (ckpt_commit(w))
		return 0;
	struct ckpt *k;
	set_error_quiet(1);
	int ok = ckpt_open(&k, path) == 0;
	set_error_quiet(0);
	if (ok)
		ckpt_close(k);
	return ok;
}

/* issue 32: every metadata field is checked on open, naming the file, the
 * line and key, and the range (tests/scripts/ckpt_meta.sh: the commands) */
TEST(checkpoint_metadata_checked_on_open)
{
	CHECK_MSG(meta_opens("step = 0\nversions = 1\n", 1), "%s", last_error());
	CHECK_MSG(meta_opens("step = 5\nversions = 3\nseed = 7\ndata_position = 5\nnew_key = x y\n"
			     "tokenizer_hash = 0xABCdef\nimported_from = a = b\n", 3), "%s",
		  last_error());
	CHECK_MSG(meta_opens("step = 5\nversions = 1\nrollbacks = 2\ndata_skip = 9\n", 1), "%s",
		  last_error());
	static const struct {
		const char *meta;
		int sets;
		const char *want;
	} bad[] = {
		{"step = 0\nversions = 0\n", 1,
		 "metadata line 2: versions = 0 is out of range (1 to 65)"},
		{"step = 0\nversions = 66\n", 1, "versions = 66 is out of range (1 to 65)"},
		{"step = -1\nversions = 1\n", 1, "step = -1 is out of range (0 to 1099511627776)"},
		{"step = 1099511627777\nversions = 1\n", 1, "step = 1099511627777 is out of range"},
		{"step =  1\nversions = 1\n", 1, "step =  1 is not a decimal number"},
		{"step = 0x1\nversions = 1\n", 1, "step = 0x1 is not a decimal number"},
		{"step = 1\n", 1, "metadata has no 'versions'"},
		{"versions = 1\n", 1, "metadata has no 'step'"},
		{"step = 1\nversions = 1\nstep = 1\n", 1, "metadata line 3 gives 'step' again"},
		{"step = 1\nversions = 1\nx = 1\nx = 2\n", 1, "metadata line 4 gives 'x' again"},
		{"step = 1\nversions = 1", 1, "metadata line 2 does not end in a newline"},
		{"step = 1\n\nversions = 1\n", 1, "metadata line 2 is not 'KEY = VALUE'"},
		{"step = 1\nversions = \n", 1, "metadata line 2 is not 'KEY = VALUE'"},
		{"step = 1\nversions = 1\nSeed = 1\n", 1, "key 'Seed' is not lower-case"},
		{"step = 1\nversions = 1\nstages = 4097\n", 1,
		 "stages = 4097 is out of range (1 to 4096)"},
		{"step = 1\nversions = 1\nmicro_batches = 0\n", 1,
		 "micro_batches = 0 is out of range"},
		{"step = 1\nversions = 1\nseed = 9223372036854775808\n", 1,
		 "seed = 9223372036854775808 is out"},
		{"step = 3\nversions = 1\ndata_position = 2\n", 1,
		 "data_position = 2 is below step = 3"},
		{"step = 3\nversions = 1\ntokenizer_hash = 0x\n", 1,
		 "tokenizer_hash = 0x is not a decimal or 0x hex number"},
		{"step = 3\nversions = 1\nrng_state = -1\n", 1, "rng_state = -1 is out of range"},
		{"step = 3\nversions = 2\n", 1, "weights.v1 holds 0 tensors, weights.v0 2"},
		{"step = 3\nversions = 1\n", 2,
		 "tensor 'weights.v1/a' is beyond the metadata's versions = 1"},
		/* what a resume of a run that rolled back reads (trainer_load) */
		{"step = 3\nversions = 1\nrollbacks = 1\n", 1,
		 "metadata gives rollbacks without data_skip"},
		{"step = 3\nversions = 1\ndata_skip = 4\n", 1,
		 "metadata gives data_skip without rollbacks"},
		{"step = 3\nversions = 1\nrollbacks = 1\ndata_skip = x\n", 1,
		 "data_skip = x is not a decimal number"},
		{"step = 3\nversions = 1\nrollbacks = 0\ndata_skip = 4\n", 1,
		 "rollbacks = 0 is out of range"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		CHECK_MSG(!meta_opens(bad[i].meta, bad[i].sets), "accepted: %s", bad[i].meta);
		CHECK_MSG(strstr(last_error(), bad[i].want) && strstr(last_error(), "meta.ckpt"),
			  "'%s': wanted '%s', got '%s'", bad[i].meta, bad[i].want, last_error());
	}
}
