/* test_shard.c - token shards: round trips, random access, llm.c shards,
 * rejected corruption, versions, vocabularies and data-path globbing. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../../io/formats/container.h"
#include "../../io/formats/shard.h"
#include "../../io/util.h"
#include "../test.h"

/* Write a shard of ndocs random documents; the tokens go to *all. */
static int make_shard(const char *path, uint32_t vocab, uint32_t chunk, int ndocs,
		      uint64_t seed, uint32_t **all, size_t *n)
{
	struct shard_writer *w;
	if (shard_writer_open(&w, path, vocab, 0x1234abcd5678ef00ULL ^ seed))
		return -1;
	if (shard_writer_set_chunk_tokens(w, chunk)) {
		shard_writer_abort(w);
		return -1;
	}
	size_t cap = 1024, len = 0;
	uint32_t *v = xmalloc(cap * sizeof(*v));
	for (int d = 0; d < ndocs; d++) {
		size_t dn = (size_t)(rng_next(&seed) % 40);
		uint32_t doc[40];
		for (size_t i = 0; i < dn; i++)
			doc[i] = (uint32_t)(rng_next(&seed) % vocab);
		if (dn && d % 3 == 0)
			doc[0] = vocab - 1; /* the largest id */
		if (len + dn > cap) {
			cap *= 2;
			v = xrealloc(v, cap * sizeof(*v));
		}
		memcpy(v + len, doc, dn * sizeof(*doc));
		len += dn;
		if (shard_writer_add_doc(w, doc, dn)) {
			shard_writer_abort(w);
			free(v);
			return -1;
		}
	}
	if (shard_writer_ntokens(w) != len || shard_writer_close(w)) {
		free(v);
		return -1;
	}
	*all = v;
	*n = len;
	return 0;
}

static void check_round_trip(uint32_t vocab, int width)
{
	const char *path = test_path("rt.shard");
	uint32_t *tok;
	size_t n;
	CHECK(make_shard(path, vocab, 100, 300, vocab, &tok, &n) == 0);
	CHECK(n > 1000);
	struct shard *s;
	CHECK(shard_open(&s, path) == 0);
	CHECK(shard_ntokens(s) == n);
	CHECK(shard_ndocs(s) == 300);
	CHECK(shard_vocab_size(s) == vocab);
	CHECK(shard_tokenizer_hash(s) == (0x1234abcd5678ef00ULL ^ vocab));
	CHECK(!shard_is_llmc(s));
	CHECK(shard_token_bytes(s) == width);
	uint32_t *back = xmalloc(n * sizeof(*back));
	CHECK(shard_read(s, 0, n, back) == 0);
	CHECK(!memcmp(back, tok, n * sizeof(*tok)));
	shard_close(s);
	free(back);
	free(tok);
}

TEST(round_trip_u16) { check_round_trip(50257, 2); }
TEST(round_trip_u16_full_range) { check_round_trip(65536, 2); }
TEST(round_trip_u32) { check_round_trip(100000, 4); }

TEST(random_access_across_chunks)
{
	const char *path = test_path("ra.shard");
	uint32_t *tok;
	size_t n;
	CHECK(make_shard(path, 1000, 37, 200, 5, &tok, &n) == 0);
	struct shard *s;
	CHECK(shard_open(&s, path) == 0);
	uint64_t rng = 42;
	uint32_t back[200];
	for (int k = 0; k < 500; k++) {
		size_t len = (size_t)(rng_next(&rng) % 200);
		uint64_t start = rng_next(&rng) % (n - len + 1);
		if (k % 5 == 0) /* start right at, just before and just after a boundary */
			start = MIN((uint64_t)(37 * (k % 40) + k % 3) - (k % 3 == 1 ? 2 : 0),
				    n - len);
		CHECK(shard_read(s, start, len, back) == 0);
		CHECK_MSG(!memcmp(back, tok + start, len * sizeof(*tok)),
			  "tokens [%llu, +%zu) differ", (unsigned long long)start, len);
	}
	set_error_quiet(1);
	CHECK(shard_read(s, n - 1, 2, back) == -1);
	CHECK(strstr(last_error(), "past the end"));
	set_error_quiet(0);
	CHECK(shard_read(s, n, 0, back) == 0);
	shard_close(s);
	free(tok);
}

TEST(empty_shard)
{
	const char *path = test_path("empty.shard");
	struct shard_writer *w;
	CHECK(shard_writer_open(&w, path, 256, 0) == 0);
	CHECK(shard_writer_close(w) == 0);
	struct shard *s;
	CHECK(shard_open(&s, path) == 0);
	CHECK(shard_ntokens(s) == 0 && shard_ndocs(s) == 0);
	shard_close(s);
}

TEST(writer_rejects_tokens_beyond_vocab)
{
	const char *path = test_path("vocab.shard");
	struct shard_writer *w;
	CHECK(shard_writer_open(&w, path, 100, 0) == 0);
	uint32_t ok[3] = {0, 50, 99}, bad[2] = {5, 100};
	CHECK(shard_writer_add_doc(w, ok, 3) == 0);
	set_error_quiet(1);
	CHECK(shard_writer_add_doc(w, bad, 2) == -1);
	set_error_quiet(0);
	CHECK(strstr(last_error(), "token 100 is outside the vocabulary"));
	CHECK(shard_writer_close(w) == 0);
	struct shard *s;
	CHECK(shard_open(&s, path) == 0);
	CHECK(shard_ntokens(s) == 3 && shard_ndocs(s) == 1);
	shard_close(s);
}

/* A shard written through the container by hand, with tokens beyond its
 * declared vocabulary: the reader must refuse them. */
TEST(reader_rejects_tokens_beyond_vocab)
{
	const char *path = test_path("badvocab.shard");
	unsigned char h[40] = {0}, data[8];
	put_le32(h, 2);
	put_le32(h + 4, 100);
	put_le64(h + 8, 4);
	put_le64(h + 16, 1);
	put_le32(h + 32, 1024);
	put_le16(data, 1);
	put_le16(data + 2, 99);
	put_le16(data + 4, 150);
	put_le16(data + 6, 2);
	struct container_writer *w;
	CHECK(container_create(&w, path, SHARD_MAGIC, SHARD_VERSION, h, 40, 0) == 0);
	CHECK(container_add_chunk(w, data, 8) == 0);
	CHECK(container_commit(w) == 0);
	struct shard *s;
	CHECK(shard_open(&s, path) == 0);
	uint32_t out[4];
	set_error_quiet(1);
	CHECK(shard_read(s, 0, 2, out) == -1);
	set_error_quiet(0);
	CHECK(strstr(last_error(), "token 150 at position 2 is outside the vocabulary (100"));
	shard_close(s);
	FILE *devnull = fopen("/dev/null", "w");
	set_error_quiet(1);
	CHECK(shard_inspect(path, devnull) == -1);
	set_error_quiet(0);
	fclose(devnull);
}

TEST(newer_version_and_wrong_magic)
{
	const char *path = test_path("v7.shard");
	unsigned char h[40] = {0};
	put_le32(h, 2);
	put_le32(h + 4, 100);
	put_le32(h + 32, 1024);
	struct container_writer *w;
	CHECK(container_create(&w, path, SHARD_MAGIC, 7, h, 40, 0) == 0);
	CHECK(container_commit(w) == 0);
	struct shard *s;
	set_error_quiet(1);
	CHECK(shard_open(&s, path) == -1);
	CHECK(strstr(last_error(), "format version 7 is newer than this asyncpp supports (1)"));
	CHECK(strstr(last_error(), path));
	CHECK(container_create(&w, path, "ASPCKPT1", 1, h, 40, 0) == 0);
	CHECK(container_commit(w) == 0);
	CHECK(shard_open(&s, path) == -1);
	CHECK(strstr(last_error(), "not an asyncpp shard (bad magic)"));
	CHECK(test_write_file(path, "hello world, this is text\n", 26) == 0);
	CHECK(shard_open(&s, path) == -1);
	CHECK(strstr(last_error(), "not a token shard but text, a corpus to encode first: asyncpp "
			"tokenize encode -t TOK -o PREFIX "));
	CHECK(strstr(last_error(), path));
	CHECK(shard_sniff(path) == 0);
	set_error_quiet(0);
}

/* A corpus given where a shard belongs is named for what it is, with the
 * command that encodes it; anything else is still "bad magic". */
TEST(corpus_given_as_shard)
{
	static const struct {
		const char *bytes;
		size_t n; /* 0: strlen */
		const char *want;
	} cases[] = {
		{"caf\xc3\xa9 au lait\n\nsecond paragraph", 0, "but text, a corpus"},
		{"\xEF\xBB\xBF  {\"text\": \"a\"}\n", 0, "but JSON, a corpus"},
		{"[{\"text\": 1}]", 0, "but a JSON array: make it JSON Lines (jq -c"},
		{"\x1f\x8b\x08\x00\x00\x00", 6, "but gzip-compressed data"},
		{"\x28\xb5\x2f\xfd\x00\x00", 6, "but zstd-compressed data"},
		{"PAR1\x15\x00\x00\x00", 8, "but Parquet data"},
		{"\xff\xfe\x00\x01binary", 10, "not an asyncpp shard (bad magic)"},
		{"text with a \x01 control byte", 0, "not an asyncpp shard (bad magic)"},
		{"bad utf-8 \xc3\x28 here", 0, "not an asyncpp shard (bad magic)"},
	};
	const char *path = test_path("corpus.shard");
	struct shard *s;
	set_error_quiet(1);
	for (size_t i = 0; i < ARRAY_SIZE(cases); i++) {
		size_t n = cases[i].n ? cases[i].n : strlen(cases[i].bytes);
		CHECK(test_write_file(path, cases[i].bytes, n) == 0);
		CHECK(shard_open(&s, path) == -1);
		CHECK(strstr(last_error(), cases[i].want));
	}
	/* a character cut by the 4 KiB read is still text; a file ending in one is not */
	char big[5000];
	memset(big, 'a', sizeof(big));
	memcpy(big + 4095, "\xc3\xa9", 2);
	CHECK(test_write_file(path, big, sizeof(big)) == 0);
	CHECK(shard_open(&s, path) == -1 && strstr(last_error(), "but text, a corpus"));
	CHECK(test_write_file(path, big, 4096) == 0);
	CHECK(shard_open(&s, path) == -1 && strstr(last_error(), "(bad magic)"));
	/* JSON under a name encode reads as text gets --format jsonl */
	const char *rec = "{\"text\": \"a\"}\n";
	CHECK(test_write_file(path, rec, strlen(rec)) == 0);
	CHECK(shard_open(&s, path) == -1 && strstr(last_error(), "--format jsonl "));
	const char *jl = test_path("corpus.jsonl");
	CHECK(test_write_file(jl, rec, strlen(rec)) == 0);
	CHECK(shard_open(&s, jl) == -1 && !strstr(last_error(), "--format"));
	set_error_quiet(0);
}

/* Open and read everything: 0 if identical to tok, 1 if different data
 * came back, -1 if an error was reported. */
static int read_back(const char *path, const uint32_t *tok, size_t n, uint32_t vocab)
{
	struct shard *s;
	if (shard_open(&s, path))
		return -1;
	uint32_t *back = xcalloc(n + 1, sizeof(*back));
	int rc = 0;
	if (shard_ntokens(s) != n || shard_vocab_size(s) != vocab)
		rc = 1;
	else if (shard_read(s, 0, n, back))
		rc = -1;
	else if (memcmp(back, tok, n * sizeof(*tok)))
		rc = 1;
	free(back);
	shard_close(s);
	return rc;
}

/* Flip every byte of a small multi-chunk shard (one at a time) and cut it
 * at every length: each must be reported, never give other tokens. */
TEST(every_flipped_byte_and_truncation_is_rejected)
{
	const char *path = test_path("small.shard"), *bad = test_path("bad.shard");
	uint32_t *tok;
	size_t n;
	CHECK(make_shard(path, 300, 16, 4, 11, &tok, &n) == 0);
	struct buf orig = {0};
	CHECK(read_file(path, &orig) == 0);
	CHECK_MSG(orig.len < 600 && n > 32, "%zu bytes, %zu tokens", orig.len, n);
	CHECK(read_back(path, tok, n, 300) == 0);
	set_error_quiet(1);
	int accepted = -1, wrong = -1;
	for (size_t pos = 0; pos < orig.len; pos++) {
		unsigned char flips[2] = {0x01, 0xff};
		for (int f = 0; f < 2; f++) {
			orig.data[pos] ^= flips[f];
			CHECK(test_write_file(bad, orig.data, orig.len) == 0);
			orig.data[pos] ^= flips[f];
			int r = read_back(bad, tok, n, 300);
			if (r == 0 && accepted < 0)
				accepted = (int)pos;
			if (r == 1 && wrong < 0)
				wrong = (int)pos;
		}
	}
	for (size_t len = 0; len < orig.len; len++) {
		CHECK(test_write_file(bad, orig.data, len) == 0);
		int r = read_back(bad, tok, n, 300);
		if (r == 1 && wrong < 0)
			wrong = (int)(100000 + len);
		if (r == 0 && accepted < 0)
			accepted = (int)(100000 + len);
	}
	set_error_quiet(0);
	CHECK_MSG(wrong < 0, "corruption at %d gave wrong tokens", wrong);
	CHECK_MSG(accepted < 0, "corruption at %d went unnoticed", accepted);
	buf_free(&orig);
	free(tok);
}

static void write_llmc(const char *path, const uint16_t *tok, int32_t n, int32_t header_n,
		       size_t extra)
{
	unsigned char *b = xcalloc(1024 + 2 * (size_t)n + extra, 1);
	put_le32(b, LLMC_SHARD_MAGIC);
	put_le32(b + 4, 1);
	put_le32(b + 8, (uint32_t)header_n);
	for (int32_t i = 0; i < n; i++)
		put_le16(b + 1024 + 2 * i, tok[i]);
	test_write_file(path, b, 1024 + 2 * (size_t)n + extra);
	free(b);
}

TEST(llmc_shard)
{
	const char *path = test_path("llmc.bin");
	uint16_t tok[1000];
	uint64_t rng = 3;
	for (int i = 0; i < 1000; i++)
		tok[i] = (uint16_t)(i % 100 == 0 ? 50256 : rng_next(&rng) % 50257);
	write_llmc(path, tok, 1000, 1000, 0);
	CHECK(shard_sniff(path) == 1);
	struct shard *s;
	CHECK(shard_open(&s, path) == 0);
	CHECK(shard_is_llmc(s) && shard_ntokens(s) == 1000 && shard_vocab_size(s) == 50257);
	CHECK(shard_token_bytes(s) == 2 && shard_tokenizer_hash(s) == 0);
	uint32_t back[1000];
	CHECK(shard_read(s, 0, 1000, back) == 0);
	for (int i = 0; i < 1000; i++)
		CHECK(back[i] == tok[i]);
	CHECK(shard_read(s, 517, 100, back) == 0);
	CHECK(back[0] == tok[517] && back[99] == tok[616]);
	shard_close(s);
	FILE *devnull = fopen("/dev/null", "w");
	CHECK(shard_inspect(path, devnull) == 0);

	set_error_quiet(1);
	write_llmc(path, tok, 999, 1000, 0);
	CHECK(shard_open(&s, path) == -1);
	CHECK(strstr(last_error(), "truncated"));
	write_llmc(path, tok, 1000, 1000, 1);
	CHECK(shard_open(&s, path) == -1);
	write_llmc(path, tok, 10, 10, 0);
	unsigned char cut[6] = {0};
	put_le32(cut, LLMC_SHARD_MAGIC);
	cut[4] = 1;
	CHECK(test_write_file(path, cut, 6) == 0); /* header cut short */
	CHECK(shard_open(&s, path) == -1);
	CHECK(strstr(last_error(), "truncated"));
	tok[5] = 60000;
	write_llmc(path, tok, 10, 10, 0);
	CHECK(shard_open(&s, path) == 0);
	CHECK(shard_read(s, 0, 10, back) == -1);
	CHECK(strstr(last_error(), "token 60000 at position 5 is outside the vocabulary"));
	shard_close(s);
	CHECK(shard_inspect(path, devnull) == -1);
	set_error_quiet(0);
	fclose(devnull);
}

TEST(inspect_summary)
{
	const char *path = test_path("insp.shard"), *out = test_path("insp.txt");
	uint32_t *tok;
	size_t n;
	CHECK(make_shard(path, 1000, 50, 20, 9, &tok, &n) == 0);
	free(tok);
	FILE *fp = fopen(out, "w");
	CHECK(fp);
	CHECK(shard_inspect(path, fp) == 0);
	fclose(fp);
	struct buf b = {0};
	CHECK(read_file(out, &b) == 0);
	char want[64];
	snprintf(want, sizeof(want), "tokens          %zu\n", n);
	CHECK(strstr((char *)b.data, "asyncpp token shard (format 1)"));
	CHECK(strstr((char *)b.data, want));
	CHECK(strstr((char *)b.data, "documents       20\n"));
	CHECK(strstr((char *)b.data, "vocabulary      1000 (u16 tokens)"));
	CHECK(strstr((char *)b.data, "verified        every checksum"));
	buf_free(&b);
}

TEST(glob_file_dir_pattern)
{
	char dir[512];
	snprintf(dir, sizeof(dir), "%s/data", test_tmpdir());
	CHECK(mkdir(dir, 0755) == 0);
	const char *names[] = {"b.shard", "a.bin", "c.shard", "notes.txt"};
	for (int i = 0; i < 4; i++) {
		char p[600];
		snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
		CHECK(test_write_file(p, "x", 1) == 0);
	}
	char **v;
	int n;
	CHECK(shard_glob(dir, &v, &n) == 0);
	CHECK(n == 3);
	CHECK(strstr(v[0], "/a.bin") && strstr(v[1], "/b.shard") && strstr(v[2], "/c.shard"));
	shard_glob_free(v, n);
	char pat[600];
	snprintf(pat, sizeof(pat), "%s/*.shard", dir);
	CHECK(shard_glob(pat, &v, &n) == 0);
	CHECK(n == 2 && strstr(v[0], "/b.shard") && strstr(v[1], "/c.shard"));
	shard_glob_free(v, n);
	snprintf(pat, sizeof(pat), "%s/notes.txt", dir);
	CHECK(shard_glob(pat, &v, &n) == 0 && n == 1 && !strcmp(v[0], pat));
	shard_glob_free(v, n);
	snprintf(pat, sizeof(pat), "%s/*.none", dir);
	set_error_quiet(1);
	CHECK(shard_glob(pat, &v, &n) == -1);
	set_error_quiet(0);
	CHECK(strstr(last_error(), "*.none"));
}

TEST(abort_writes_nothing)
{
	const char *path = test_path("aborted.shard");
	struct shard_writer *w;
	CHECK(shard_writer_open(&w, path, 100, 0) == 0);
	uint32_t t[2] = {1, 2};
	CHECK(shard_writer_add_doc(w, t, 2) == 0);
	shard_writer_abort(w);
	struct stat st;
	CHECK(stat(path, &st) != 0);
}
