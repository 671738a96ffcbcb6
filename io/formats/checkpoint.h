/* checkpoint.h - checkpoint files: named float tensors, the config and
 * run metadata in a container (io/formats/container.h).
 *
 * Layout (container magic "ASPCKPT\0", format version 1):
 *   chunk 0        the effective configuration, as INI text
 *   chunk 1        metadata, "key = value" lines (step, seed, versions, ...)
 *   chunks 2..N+1  one chunk per tensor: little-endian float32 values
 *   chunk N+2      the index: one line per tensor, in chunk order,
 *                  "NAME NUMEL ROWS COLS" (COLS 0 for a vector)
 * The container header blob is "ASPCKPT1" followed by the tensor count N as
 * a little-endian uint64. Tensor names are "SET/PARAM", e.g.
 * "weights.v0/h.3.qkvw" (v0 the newest weights, v1 one step older, ...),
 * "adam_m/wte", "ef_prev_update/h.0.fcw". man/asyncpp-formats.5 has the
 * byte-level details.
 */
#ifndef ASYNCPP_CHECKPOINT_H
#define ASYNCPP_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define CKPT_MAGIC "ASPCKPT\0"
#define CKPT_VERSION 1
/* The metadata's ranges: versions (weights.v0 to weights.v64: a delay of at
 * most 64) and step. */
#define CKPT_MAX_VERSIONS 65
#define CKPT_MAX_STEP (1ULL << 40)

struct ckpt_writer;
struct ckpt;

/* Start writing PATH atomically with the config and metadata texts. */
int ckpt_create(struct ckpt_writer **w, const char *path, const char *config_text,
		const char *meta_text);
/* Append the metadata line "KEY = TEXT\n" to the text in meta[size] as a
 * reader accepts it, whatever TEXT holds (a path): its control characters
 * become '?', and it is cut where the line would not fit (the line always
 * ends in '\n'; nothing is added when not even "KEY = ?\n" fits). */
void ckpt_meta_add_text(char *meta, size_t size, const char *key, const char *text);
/* Add one tensor (host memory). rows/cols describe its shape (cols 0 for a
 * vector). Names are at most 95 bytes without spaces. */
int ckpt_add(struct ckpt_writer *w, const char *name, const float *data, size_t numel,
	     int rows, int cols);
int ckpt_commit(struct ckpt_writer *w); /* frees w */
void ckpt_abort(struct ckpt_writer *w); /* frees w; PATH untouched */

/* Open and validate (header, index, every size, every metadata field: its
 * syntax, range and agreement with the others and with the weight sets the
 * index holds; tensors are read on demand and verified as they are read). */
int ckpt_open(struct ckpt **c, const char *path);
void ckpt_close(struct ckpt *c);
const char *ckpt_path(const struct ckpt *c);
const char *ckpt_config(const struct ckpt *c);
const char *ckpt_meta(const struct ckpt *c);
/* A metadata value as a long (decimal, not negative) / an unsigned 64-bit
 * number (decimal or 0x hex); -1 with error() when missing or malformed. */
int ckpt_meta_long(const struct ckpt *c, const char *key, long *out);
int ckpt_meta_u64(const struct ckpt *c, const char *key, uint64_t *out);
int ckpt_count(const struct ckpt *c);
const char *ckpt_name(const struct ckpt *c, int i);
size_t ckpt_numel(const struct ckpt *c, int i);
void ckpt_shape(const struct ckpt *c, int i, int *rows, int *cols);
int ckpt_find(const struct ckpt *c, const char *name); /* -1 if absent */
/* Read tensor i into out[numel], verifying its checksums. */
int ckpt_read(struct ckpt *c, int i, float *out);
/* Verify every chunk's checksums (the whole file). */
int ckpt_verify(struct ckpt *c);
/* Read tensor `name`, which must have the shape rows x cols (cols 0: a
 * vector of rows), as the model's configuration gives it. */
int ckpt_read_named(struct ckpt *c, const char *name, float *out, int rows, int cols);

/* Is PATH a checkpoint? 1 yes, 0 no, -1 unreadable. */
int ckpt_sniff(const char *path);
/* `asyncpp inspect CKPT`: config, metadata, every tensor (shape, dtype,
 * norm, min, max) and checksum verification. -1 on corruption. */
int checkpoint_inspect(const char *path, FILE *out, int verbose);
/* `asyncpp inspect --diff A B`: the verdict first ("identical: ..." or
 * "different: ..."), then the counts, the tensors only in one file (or of
 * another shape), and the `top` tensors that differ most (max abs and
 * relative L2); verbose lists every tensor, the identical ones too. */
int checkpoint_diff(const char *a, const char *b, FILE *out, int top, int verbose);

#endif
