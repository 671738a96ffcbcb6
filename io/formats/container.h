/* container.h - a checksummed, seekable zstd container (shards, checkpoints).
 *
 * A container is a sequence of standard zstd frames, so `zstd -t FILE`
 * accepts it and `zstd -dc FILE` prints the concatenated chunk payloads:
 *
 *   header frame   zstd skippable frame (magic 0x184D2A5A) holding the
 *                  caller's 8-byte format magic, format version, the
 *                  container layout version, a caller-defined header blob
 *                  and the crc32c of all of these;
 *   chunk frames   one zstd frame per chunk, with its content size and
 *                  zstd's content checksum;
 *   seek table     zstd skippable frame (magic 0x184D2A5B): per chunk the
 *                  compressed size, decompressed size, crc32c of the
 *                  compressed frame and crc32c of the decompressed bytes;
 *                  then the chunk count, a crc32c of the table and the
 *                  footer magic "ASPCSEEK", which end the file.
 *
 * man/asyncpp-formats.5 (CONTAINER) gives the layout byte by byte.
 *
 * Every byte of a container is covered by a check: a reader rejects a
 * flipped byte anywhere and a truncation at any length, naming the file and
 * what is wrong. A reader never allocates from an unbounded length.
 *
 * Writing streams chunk by chunk: only the chunk being compressed (or, with
 * container_chunk_begin/write/end, a small streaming buffer) is held in
 * memory, so checkpoints of any size can be written. The file is written
 * atomically (io/util.h atomic_*): until container_commit() returns 0 the
 * destination is untouched.
 *
 * Reading opens the file, validates the header, the seek table and every
 * offset (no chunk is decompressed), then reads any single chunk on demand.
 * container_read_chunk() may be called from several threads at once on the
 * same container; the other functions are not for concurrent use.
 *
 * All functions return 0 on success and -1 after error() with a message
 * that names the file, e.g.
 *   'x.shard': chunk 3 checksum mismatch (file is corrupt)
 *   'x.shard': truncated: file is 120 bytes, the seek table needs 144
 *   'x.shard': not an asyncpp shard (bad magic)
 */
#ifndef ASYNCPP_CONTAINER_H
#define ASYNCPP_CONTAINER_H

#include <stddef.h>
#include <stdint.h>

#define CONTAINER_MAGIC_LEN 8
/* The container layout version this code reads and writes. */
#define CONTAINER_LAYOUT_VERSION 1
/* The largest caller header blob accepted (writer and reader). */
#define CONTAINER_MAX_HEADER (64u << 20)

struct container_writer;
struct container;

/* ---- writing ---- */

/* Start writing PATH (atomically). magic: the 8-byte format magic (not
 * NUL-terminated; e.g. "ASPSHARD"). version: the caller's format version.
 * header/header_len: the caller's header blob (may be NULL/0). zstd_level:
 * the compression level (0 means zstd's default). */
int container_create(struct container_writer **w, const char *path, const char magic[8],
		     uint32_t version, const void *header, size_t header_len, int zstd_level);
/* The same, naming name in messages (io/util.h atomic_open_named). */
int container_create_named(struct container_writer **w, const char *path, const char *name,
			   const char magic[8], uint32_t version, const void *header,
			   size_t header_len, int zstd_level);
/* Change the zstd level for the chunks that follow (0: zstd's default). */
int container_set_level(struct container_writer *w, int zstd_level);
/* Compress with N zstd worker threads (0: single-threaded, the default).
 * Worth it for chunks of several MB. Ignored where libzstd lacks threads. */
int container_set_threads(struct container_writer *w, int nthreads);
/* Replace the header blob, for fields known only at the end (counts). Its
 * length must equal the length given to container_create; it is written at
 * commit. */
int container_set_header(struct container_writer *w, const void *header, size_t header_len);
/* Append one chunk of n bytes (n may be 0). */
int container_add_chunk(struct container_writer *w, const void *data, size_t n);
/* Append one chunk of exactly `size` bytes given in pieces: begin, any
 * number of writes whose lengths add up to size, end. */
int container_chunk_begin(struct container_writer *w, uint64_t size);
int container_chunk_write(struct container_writer *w, const void *data, size_t n);
int container_chunk_end(struct container_writer *w);
/* Number of chunks added so far. */
uint64_t container_writer_nchunks(const struct container_writer *w);
/* Write the seek table, fsync and rename into place. Frees w, also on
 * failure (then the destination is untouched). */
int container_commit(struct container_writer *w);
/* Drop everything written; the destination is untouched. Frees w. NULL ok. */
void container_abort(struct container_writer *w);

/* ---- reading ---- */

/* Open and validate PATH. magic: the expected 8-byte format magic, or NULL
 * to accept any (container_magic() reports it). what: a noun for messages
 * ("shard", "checkpoint"); NULL says "container". The caller checks
 * container_version() against the format versions it supports. */
int container_open(struct container **c, const char *path, const char magic[8],
		   const char *what);
void container_close(struct container *c); /* NULL ok */

const char *container_path(const struct container *c);
const char *container_magic(const struct container *c); /* 8 bytes, not NUL-terminated */
uint32_t container_version(const struct container *c);
const void *container_header(const struct container *c, size_t *len);
uint64_t container_nchunks(const struct container *c);
uint64_t container_chunk_size(const struct container *c, uint64_t i);  /* decompressed */
uint64_t container_chunk_csize(const struct container *c, uint64_t i); /* compressed */
uint64_t container_file_size(const struct container *c);
/* Total decompressed bytes of all chunks. */
uint64_t container_data_size(const struct container *c);

/* Read chunk i into out (container_chunk_size(c, i) bytes), verifying the
 * compressed and decompressed checksums, the frame sizes and zstd's own
 * checks. On error out holds no usable data. Thread-safe. */
int container_read_chunk(struct container *c, uint64_t i, void *out);
/* Read and verify every chunk; -1 at the first bad one. */
int container_verify(struct container *c);

/* Does PATH start with a container header frame? Returns 1 and fills
 * magic (8 bytes) if so, 0 if not (or the file is too short), -1 if the file
 * cannot be read. Validates nothing else: use it to pick a reader. */
int container_peek(const char *path, char magic[8]);

#endif
