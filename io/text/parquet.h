/* parquet.h - the strings of one column of an Apache Parquet file, the
 * format Hugging Face datasets ship in (FineWeb, The Stack, Wikipedia...).
 *
 * Read, per the Parquet specification (parquet-format: Thrift compact
 * metadata in the footer, column chunks of pages):
 *   - a top-level column of BYTE_ARRAY values (strings), REQUIRED or
 *     OPTIONAL (a null is reported as such); nested and repeated columns,
 *     and the file's other columns, are skipped, never decoded;
 *   - pages DATA_PAGE (v1) and DATA_PAGE_V2, with a DICTIONARY_PAGE;
 *     values PLAIN, dictionary-encoded (PLAIN_DICTIONARY, RLE_DICTIONARY)
 *     or delta-encoded (DELTA_LENGTH_BYTE_ARRAY, DELTA_BYTE_ARRAY: Spark's
 *     and parquet-java's v2 pages); definition levels in the RLE/bit-packed
 *     hybrid;
 *   - codecs UNCOMPRESSED, SNAPPY, GZIP and ZSTD.
 * Anything else (another encoding, codec, or a chunk in another file) is
 * refused naming it, never guessed at. Every offset, size and count is
 * checked against the file before use, and pages are capped
 * (PARQUET_MAX_PAGE bytes, PARQUET_MAX_VALUES values), so a damaged or hostile file is an error, not a
 * crash (tests/fuzz/fuzz_parquet.c).
 *
 * The file is mapped, not read: memory holds one page (and the chunk's
 * dictionary) at a time.
 */
#ifndef ASYNCPP_PARQUET_H
#define ASYNCPP_PARQUET_H

#include <stddef.h>
#include <stdint.h>

#define PARQUET_MAX_PAGE (1u << 28)   /* bytes of one page, uncompressed */
#define PARQUET_MAX_VALUES (1u << 24) /* values of one page */

struct parquet;

/* Open path and find its top-level string column named column. 0, or -1
 * after error() naming the file (and the column). */
int parquet_open(struct parquet **p, const char *path, const char *column);
/* The same over data[0..len) (not copied; kept until parquet_close); name
 * is for messages. */
int parquet_open_mem(struct parquet **p, const uint8_t *data, size_t len, const char *name,
		     const char *column);

/* The next value of the column, in row order: 1 with s[0..n) (valid until
 * the next call; possibly empty), 2 for a null, 0 after the last row, -1
 * after error() naming the file, the row group and the problem. */
int parquet_next(struct parquet *p, const uint8_t **s, size_t *n);

uint64_t parquet_rows(const struct parquet *p);       /* the file's rows */
uint64_t parquet_file_bytes(const struct parquet *p); /* its size */
void parquet_close(struct parquet *p);

#endif
