/* corpus.h - documents from corpora as they ship: plain text, one document
 * per line, or JSON Lines, each optionally gzip- or zstd-compressed, or
 * Parquet, from files, directories and glob patterns.
 *
 * Inputs (corpus_expand): a file is itself; a directory gives every file
 * under it, recursively (names starting with '.' and symbolic links to
 * directories skipped), sorted by path; anything else that does not exist is
 * a glob(3) pattern whose matches are taken sorted, a matching directory
 * expanded as above. "-" is standard input. The arguments keep their order.
 *
 * Compression is told by the first bytes, whatever the name: gzip (1f 8b,
 * several members one after the other allowed) or zstd (a zstd or skippable
 * frame magic, several frames allowed); anything else is read as it is. A
 * name ending in .gz or .zst whose data lacks that magic is an error, as is
 * corrupt or truncated compressed data. Everything is streamed in buffers of
 * buf_size bytes: memory is bounded by the largest document (text split by
 * file: the largest file) and the largest line.
 *
 * Documents, by format:
 *   CORPUS_TEXT   the whole file, or with blank_line the blocks of lines that
 *                 end after the blank lines (empty, or only spaces, tabs and
 *                 carriage returns) following a non-blank line: the blank
 *                 lines stay in the document they end, so the documents of a
 *                 file are a partition of its bytes. An empty file is none.
 *   CORPUS_LINES  each line without its end of line (\n or \r\n); a blank
 *                 line is no document.
 *   CORPUS_JSONL  each line holds a JSON object (RFC 8259, strict; a byte
 *                 order mark before the first is skipped); the document is
 *                 its member named field, a string, decoded to UTF-8 (all
 *                 escapes, surrogate pairs included). Blank lines are
 *                 skipped; an empty string is no document (counted as
 *                 empty). A record that is not valid JSON, not an object,
 *                 lacks the member or whose member is not a string is bad:
 *                 the first show_bad of them are named on stderr
 *                 ("FILE:LINE: why; record skipped") and all are counted; one
 *                 more than max_bad ends the read with an error naming it.
 *
 *   CORPUS_PARQUET each row's value of the top-level string column named
 *                 field (io/text/parquet.h: how Hugging Face datasets
 *                 ship); a null or an empty string is no document (counted
 *                 as empty). The file is mapped, not streamed, so standard
 *                 input cannot be Parquet. A Parquet file given another
 *                 format (not o.infer) is refused, naming --format parquet.
 *
 * Formats by name (o.infer, `tokenize` without --format): each file's
 * name tells its format (corpus_format_of_name); standard input is text. A
 * file whose first bytes are Parquet's is read as Parquet whatever its name.
 * A .json file is read as JSON Lines. A JSON Lines file whose first record
 * opens a JSON array ('[') holds JSON, not JSON Lines: that bad record is
 * named so, with the jq command that turns the file into JSON Lines.
 *
 * JSON read as text: a text or lines file whose first non-blank lines (up
 * to 5, within its first 64 KiB) all parse as JSON objects is counted
 * (stats.json_like) and the first such file is named in a warning, naming
 * --format jsonl.
 *
 * Functions return 0 (or 1 for "a document") and -1 after error() with a
 * message naming the file, and the line where there is one.
 */
#ifndef ASYNCPP_CORPUS_H
#define ASYNCPP_CORPUS_H

#include <stddef.h>
#include <stdint.h>

enum corpus_format { CORPUS_TEXT, CORPUS_LINES, CORPUS_JSONL, CORPUS_PARQUET };

struct corpus_opts {
	enum corpus_format format;
	int infer;          /* each file's format by its name (corpus_format_of_name), not format */
	int blank_line;     /* CORPUS_TEXT: blank-line separated blocks, not files */
	const char *field;  /* CORPUS_JSONL: the member holding the text ("text") */
	uint64_t max_bad;   /* bad records skipped before the read fails */
	uint64_t show_bad;  /* bad records named on stderr */
	size_t buf_size;    /* read and decompression buffers (0: 1 MiB); tests use tiny ones */
};

struct corpus_stats {
	uint64_t files;       /* files opened so far */
	uint64_t docs;        /* documents returned */
	uint64_t records;     /* JSONL: non-blank lines; Parquet: rows */
	uint64_t bad;         /* JSONL: bad records skipped */
	uint64_t empty;       /* JSONL, Parquet: records whose text is empty (or null) */
	uint64_t bytes_read;  /* bytes read from the files (compressed) */
	uint64_t bytes;       /* bytes after decompression */
	int too_many_bad;     /* the read stopped at bad record max_bad + 1 */
	uint64_t files_as[4]; /* files read as each enum corpus_format */
	const char *first_as[4]; /* the first of them (valid while the corpus is open) */
	uint64_t json_like;   /* text, lines: files whose first lines are JSON objects */
};

/* Expand input arguments into the list of files to read (see above); with
 * dir_suffix (".parquet"), the files found under a directory are only those
 * whose names end with it (a dataset folder's README and the like are not
 * corpus), while files named or matched themselves are all taken. Free
 * with corpus_paths_free. */
int corpus_expand(char *const *args, int nargs, const char *dir_suffix, char ***paths,
		  int *npaths);
/* The same for formats by name (o.infer): a directory with Parquet files
 * by their names (corpus_format_of_name) gives only those, else one with
 * JSON Lines files gives only those (a dataset folder's README.md and
 * dataset_info.json are not corpus), else all its files. */
int corpus_expand_by_name(char *const *args, int nargs, char ***paths, int *npaths);
void corpus_paths_free(char **paths, int npaths);

struct corpus;
/* Read the documents of paths[0..n) in order (the list is copied). */
void corpus_open(struct corpus **c, char *const *paths, int n, const struct corpus_opts *o);
/* The next document: returns 1 with doc[0..*len) (valid until the next call;
 * never empty), 0 when every file is done, -1 on an error. */
int corpus_next(struct corpus *c, const unsigned char **doc, size_t *len);
void corpus_get_stats(const struct corpus *c, struct corpus_stats *st);
void corpus_close(struct corpus *c); /* NULL ok */

/* "text", "lines", "jsonl" or "parquet" into *f; -1 (nothing printed) for
 * another name. corpus_format_name is the reverse. */
int corpus_format_parse(const char *name, enum corpus_format *f);
const char *corpus_format_name(enum corpus_format f);
/* The format a file's name tells (o.infer), after dropping a .gz or .zst:
 * .jsonl, .ndjson and .json are CORPUS_JSONL, .parquet CORPUS_PARQUET (any
 * case), anything else CORPUS_TEXT. */
enum corpus_format corpus_format_of_name(const char *path);

#endif
