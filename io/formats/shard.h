/* shard.h - token shards: a zstd container of little-endian token ids.
 *
 * A shard holds a stream of tokens (documents separated by the tokenizer's
 * end-of-text token, added by the caller) in chunks of a fixed number of
 * tokens, so a reader can seek to any token by decompressing one chunk. The
 * header records the token width (u16 when the vocabulary has at most 65536
 * ids, else u32), the vocabulary size, token and document counts, the tokens
 * per chunk and the tokenizer's hash. man/asyncpp-formats.5 (TOKEN SHARDS)
 * gives the layout byte by byte.
 *
 * Readers also accept llm.c's .bin token shards: a 256 x int32 header
 * [20240520, 1, ntokens, 0...] then ntokens uint16 tokens. Those carry no
 * vocabulary, document count or tokenizer hash: their vocabulary is GPT-2's
 * (50257, the tokenizer that format was defined for), ndocs and the hash
 * are 0 (unknown).
 *
 * Functions return 0 on success and -1 after error() with a message naming
 * the file. A reader rejects corruption, truncation, a wrong magic, a newer
 * version and tokens outside the vocabulary; it never returns wrong data.
 * A struct shard caches one decompressed chunk: use one per thread.
 */
#ifndef ASYNCPP_SHARD_H
#define ASYNCPP_SHARD_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define SHARD_MAGIC "ASPSHARD"
#define SHARD_VERSION 1
/* default tokens per chunk: 128 KB of u16 tokens, so a streaming reader
 * decompresses little per random window (bench/NOTES.md: 0.2 ms a window
 * against 4 ms with 2^20, for 7% more bytes on disk) */
#define SHARD_CHUNK_TOKENS (1u << 16)
#define LLMC_SHARD_MAGIC 20240520
#define LLMC_SHARD_VOCAB 50257

struct shard_writer;
struct shard;

/* ---- writing ---- */

/* Start writing PATH (atomically). vocab_size >= 1; tokens must be below
 * it. tokenizer_hash identifies the tokenizer (0: unknown). */
int shard_writer_open(struct shard_writer **w, const char *path, uint32_t vocab_size,
		      uint64_t tokenizer_hash);
/* The same, written to PATH but named name in messages: a shard staged
 * under an internal name and moved into place by its caller. */
int shard_writer_open_named(struct shard_writer **w, const char *path, const char *name,
			    uint32_t vocab_size, uint64_t tokenizer_hash);
/* Tokens per chunk (default SHARD_CHUNK_TOKENS); only before the first
 * token is added. Small values are for tests. */
int shard_writer_set_chunk_tokens(struct shard_writer *w, uint32_t chunk_tokens);
/* zstd level (default 3) and worker threads (default 0), before any token. */
int shard_writer_set_compression(struct shard_writer *w, int level, int nthreads);
/* Append one document's tokens (stored as given, so include any separator)
 * and count one document. A token >= vocab_size is an error. */
int shard_writer_add_doc(struct shard_writer *w, const uint32_t *tokens, size_t n);
/* Append tokens that start ndocs documents (0: they continue the last one). */
int shard_writer_add(struct shard_writer *w, const uint32_t *tokens, size_t n, uint64_t ndocs);
uint64_t shard_writer_ntokens(const struct shard_writer *w);
/* Flush, write the header and seek table, commit atomically. Frees w, also
 * on failure (then PATH is untouched). */
int shard_writer_close(struct shard_writer *w);
/* Drop the shard; PATH is untouched. Frees w. NULL ok. */
void shard_writer_abort(struct shard_writer *w);

/* ---- reading ---- */

/* Open an asyncpp shard or an llm.c .bin shard; validates the header, the
 * seek table and the file size (it decompresses nothing). */
int shard_open(struct shard **s, const char *path);
void shard_close(struct shard *s); /* NULL ok */

const char *shard_path(const struct shard *s);
uint64_t shard_ntokens(const struct shard *s);
uint64_t shard_ndocs(const struct shard *s);       /* 0 for llm.c shards */
uint32_t shard_vocab_size(const struct shard *s);
uint64_t shard_tokenizer_hash(const struct shard *s); /* 0: unknown */
int shard_is_llmc(const struct shard *s);
int shard_token_bytes(const struct shard *s);     /* 2 or 4 */

/* Copy tokens [start, start+n) into out, from whatever chunks hold them,
 * verifying every checksum on the way and rejecting tokens >= vocab. */
int shard_read(struct shard *s, uint64_t start, size_t n, uint32_t *out);

/* Print a summary of PATH to out and verify every checksum and token.
 * Returns 0, or -1 (after error()) when the file is corrupt or unreadable. */
int shard_inspect(const char *path, FILE *out);

/* shard_open of a file that is no shard but looks like a corpus (gzip or
 * zstd data, Parquet, JSON, UTF-8 text, by its first 4 KiB) says so and
 * names the `asyncpp tokenize encode` command that makes shards of it. */

/* Is PATH a shard by its first bytes? 1 yes (asyncpp or llm.c), 0 no,
 * -1 unreadable. */
int shard_sniff(const char *path);

/* Expand a data path into a sorted list of shard files: a regular file is
 * itself; a directory gives its *.shard and *.bin files; anything else is a
 * glob(3) pattern. No match is an error. Free with shard_glob_free. */
int shard_glob(const char *pattern, char ***paths, int *n);
void shard_glob_free(char **paths, int n);

#endif
