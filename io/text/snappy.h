/* snappy.h - decompression of raw Snappy blocks (the format of
 * google/snappy's format_description.txt; Parquet's SNAPPY codec, with no
 * framing).
 *
 * A block is the uncompressed length (a little-endian base-128 varint)
 * followed by elements: literals (tag bits 00) and copies of earlier output
 * with a 1-, 2- or 4-byte offset (tags 01, 10, 11). Every length and offset
 * is checked against the input and the output written so far.
 */
#ifndef ASYNCPP_SNAPPY_H
#define ASYNCPP_SNAPPY_H

#include <stddef.h>
#include <stdint.h>

/* The uncompressed length the block declares, in *n: 0, or -1 when the
 * varint is malformed. */
int snappy_length(const uint8_t *in, size_t in_len, size_t *n);

/* Decompress the block in[0..in_len) into out[0..out_len), which must be
 * exactly the declared length. 0, or -1 for corrupt input (no message:
 * the caller names the file). */
int snappy_uncompress(const uint8_t *in, size_t in_len, uint8_t *out, size_t out_len);

#endif
