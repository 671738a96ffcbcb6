/* corpus.c - documents from files, directories and globs (see corpus.h).
 *
 * Three layers: a byte source per file (read(2), inflate or ZSTD
 * decompressStream into a window buffer), lines cut from the window, and
 * documents made of lines (or of the whole file) by the format.
 */
#include "corpus.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "parquet.h"
#include "../util.h"
#include "json.h"

#define CORPUS_BUF_SIZE (1u << 20)

enum { SRC_PLAIN, SRC_GZIP, SRC_ZSTD };

struct corpus {
	struct corpus_opts o;
	char **paths;
	int npaths, next_path;
	struct corpus_stats st;

	/* the file being read */
	const char *path; /* for messages */
	int fd, open, kind, eof_in, eof;
	unsigned char *in;      /* compressed input, o.buf_size bytes */
	size_t in_pos, in_len;
	z_stream gz;
	int gz_live, gz_end;
	ZSTD_DCtx *zd;
	size_t zst_left;        /* last hint of ZSTD_decompressStream: 0 at a frame end */

	/* decompressed bytes: win.data[pos..win.len) not yet consumed */
	struct buf win;
	size_t pos;
	uint64_t line;          /* lines consumed in this file */

	/* document assembly */
	struct buf doc;
	/* blank-line text: the document has a non-blank line; blank lines follow it */
	int content, in_sep;

	struct parquet *pq;     /* CORPUS_PARQUET: the file being read */
	enum corpus_format fmt; /* the file's format: o.format, or by its name (o.infer) */
	int sniffed;            /* text, lines: the first lines were checked for JSON */
};

/* ---- inputs ---- */

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void push(char ***v, int *n, char *s)
{
	*v = xrealloc(*v, st_mult((size_t)*n + 1, sizeof(**v)));
	(*v)[(*n)++] = s;
}

static int has_suffix(const char *s, const char *suf)
{
	size_t n = strlen(s), m = strlen(suf);
	return n >= m && !strcmp(s + n - m, suf);
}

/* Every file under dir, recursively, into v (unsorted); with suffix, only
 * the names that end with it. */
static int walk(const char *dir, const char *suffix, char ***v, int *n, int depth)
{
	if (depth > 64)
		return error("'%s': directories nested too deep", dir);
	DIR *d = opendir(dir);
	if (!d)
		return error("cannot open '%s': %s", dir, strerror(errno));
	struct dirent *e;
	int rc = 0;
	while (!rc && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char *p = path_join(dir, e->d_name);
		struct stat ls, st;
		if (lstat(p, &ls) || stat(p, &st)) {
			rc = error("cannot open '%s': %s", p, strerror(errno));
			free(p);
		} else if (S_ISDIR(st.st_mode)) {
			if (!S_ISLNK(ls.st_mode))
				rc = walk(p, suffix, v, n, depth + 1);
			free(p);
		} else if (suffix && !has_suffix(e->d_name, suffix)) {
			free(p);
		} else {
			push(v, n, p);
		}
	}
	closedir(d);
	return rc;
}

static int has_suffix_nocase(const char *s, size_t n, const char *suf);
static size_t name_length_uncompressed(const char *path);

/* A .json name (under .gz or .zst too): JSON Lines only where a folder
 * has no .jsonl or .ndjson file (else its metadata, dataset_info.json). */
static int is_json_name(const char *path)
{
	return has_suffix_nocase(path, name_length_uncompressed(path), ".json");
}

/* by_name: of a directory's files v[first..n), only its Parquet files by
 * their names when it has any, else only its JSON Lines when it has any,
 * its .json files only when it has no .jsonl or .ndjson (a dataset folder's
 * README.md and dataset_info.json are not corpus). */
static void keep_data_names(char **v, int first, int *n)
{
	int k = first, as[4] = {0}, lines = 0;
	for (int i = first; i < *n; i++) {
		as[corpus_format_of_name(v[i])] = 1;
		lines |= corpus_format_of_name(v[i]) == CORPUS_JSONL && !is_json_name(v[i]);
	}
	enum corpus_format keep = as[CORPUS_PARQUET] ? CORPUS_PARQUET : CORPUS_JSONL;
	if (!as[keep])
		return;
	for (int i = first; i < *n; i++) {
		if (corpus_format_of_name(v[i]) == keep &&
		    !(keep == CORPUS_JSONL && lines && is_json_name(v[i])))
			v[k++] = v[i];
		else
			free(v[i]);
	}
	*n = k;
}

/* The files of one argument, sorted, appended to v. */
static int expand_one(const char *arg, const char *suffix, int by_name, char ***v, int *n)
{
	struct stat st;
	int first = *n, rc = 0;
	if (!strcmp(arg, "-")) {
		push(v, n, xstrdup(arg));
		return 0;
	}
	if (!stat(arg, &st)) {
		if (!S_ISDIR(st.st_mode)) {
			push(v, n, xstrdup(arg));
			return 0;
		}
		rc = walk(arg, suffix, v, n, 0);
		if (!rc && by_name)
			keep_data_names(*v, first, n);
		if (!rc && *n == first)
			rc = suffix ? error("'%s': no %s files in this directory", arg, suffix)
				    : error("'%s': no files in this directory", arg);
	} else if (!strpbrk(arg, "*?[")) {
		return error("cannot open '%s': %s", arg, strerror(errno));
	} else {
		glob_t g;
		int r = glob(arg, 0, NULL, &g);
		if (r == 0)
			for (size_t i = 0; i < g.gl_pathc && !rc; i++) {
				if (stat(g.gl_pathv[i], &st))
					continue;
				if (S_ISDIR(st.st_mode)) {
					int at = *n;
					rc = walk(g.gl_pathv[i], suffix, v, n, 0);
					if (!rc && by_name)
						keep_data_names(*v, at, n);
				} else
					push(v, n, xstrdup(g.gl_pathv[i]));
			}
		if (r != GLOB_NOMATCH)
			globfree(&g);
		if (!rc && *n == first)
			rc = error("'%s': no such file, directory or matching files", arg);
	}
	if (!rc)
		qsort(*v + first, (size_t)(*n - first), sizeof(**v), cmp_str);
	return rc;
}

static int expand(char *const *args, int nargs, const char *dir_suffix, int by_name,
		  char ***paths, int *npaths)
{
	char **v = NULL;
	int n = 0;
	for (int i = 0; i < nargs; i++)
		if (expand_one(args[i], dir_suffix, by_name, &v, &n)) {
			corpus_paths_free(v, n);
			*paths = NULL;
			*npaths = 0;
			return -1;
		}
	*paths = v;
	*npaths = n;
	return 0;
}

int corpus_expand(char *const *args, int nargs, const char *dir_suffix, char ***paths,
		  int *npaths)
{
	return expand(args, nargs, dir_suffix, 0, paths, npaths);
}

int corpus_expand_by_name(char *const *args, int nargs, char ***paths, int *npaths)
{
	return expand(args, nargs, NULL, 1, paths, npaths);
}

void corpus_paths_free(char **paths, int npaths)
{
	for (int i = 0; i < npaths; i++)
		free(paths[i]);
	free(paths);
}

static const char *const format_names[] = {"text", "lines", "jsonl", "parquet"};

int corpus_format_parse(const char *name, enum corpus_format *f)
{
	for (size_t i = 0; i < ARRAY_SIZE(format_names); i++)
		if (!strcmp(name, format_names[i])) {
			*f = (enum corpus_format)i;
			return 0;
		}
	return -1;
}

const char *corpus_format_name(enum corpus_format f) { return format_names[f]; }

/* A name ending in s, ignoring ASCII case. */
static int has_suffix_nocase(const char *s, size_t n, const char *suf)
{
	size_t m = strlen(suf);
	if (n < m)
		return 0;
	for (size_t i = 0; i < m; i++)
		if ((s[n - m + i] | 0x20) != suf[i])
			return 0;
	return 1;
}

/* The length of path's name less a .gz or .zst (the compression is told
 * by the file's first bytes; the format by the name under it). */
static size_t name_length_uncompressed(const char *path)
{
	size_t n = strlen(path);
	if (has_suffix_nocase(path, n, ".gz"))
		return n - 3;
	if (has_suffix_nocase(path, n, ".zst"))
		return n - 4;
	return n;
}

enum corpus_format corpus_format_of_name(const char *path)
{
	size_t n = name_length_uncompressed(path);
	if (has_suffix_nocase(path, n, ".jsonl") || has_suffix_nocase(path, n, ".ndjson") ||
	    has_suffix_nocase(path, n, ".json"))
		return CORPUS_JSONL;
	if (has_suffix_nocase(path, n, ".parquet"))
		return CORPUS_PARQUET;
	return CORPUS_TEXT;
}

/* ---- bytes of one file ---- */

/* read(2) up to cap bytes of the file into dst: the count, 0 at its end, -1. */
static ssize_t read_raw(struct corpus *c, unsigned char *dst, size_t cap)
{
	ssize_t k;
	do
		k = read(c->fd, dst, cap);
	while (k < 0 && errno == EINTR);
	if (k < 0)
		return error("cannot read '%s': %s", c->path, strerror(errno));
	if (!k)
		c->eof_in = 1;
	c->st.bytes_read += (uint64_t)k;
	return k;
}

/* More compressed input into c->in (when all of it was used): -1 on error. */
static int refill_in(struct corpus *c)
{
	if (c->in_pos < c->in_len || c->eof_in)
		return 0;
	ssize_t k = read_raw(c, c->in, c->o.buf_size);
	if (k < 0)
		return -1;
	c->in_pos = 0;
	c->in_len = (size_t)k;
	return 0;
}

static void close_file(struct corpus *c)
{
	if (!c->open)
		return;
	if (c->fd > 0)
		close(c->fd);
	if (c->gz_live)
		inflateEnd(&c->gz);
	c->gz_live = 0;
	parquet_close(c->pq);
	c->pq = NULL;
	c->open = 0;
}

/* One more file read as format f (for the summary). */
static void count_format(struct corpus *c, const char *path, enum corpus_format f)
{
	c->fmt = f;
	if (!c->st.files_as[f]++)
		c->st.first_as[f] = path;
}

/* A Parquet file (footer first: mapped, not streamed). */
static int open_parquet(struct corpus *c, const char *path)
{
	c->path = path;
	c->fd = -1;
	if (!strcmp(path, "-"))
		return error("standard input cannot be read as Parquet (its metadata is at the "
			     "end): save it to a file first");
	if (parquet_open(&c->pq, path, c->o.field))
		return -1;
	c->open = 1;
	c->st.files++;
	count_format(c, path, CORPUS_PARQUET);
	c->st.bytes_read += parquet_file_bytes(c->pq);
	return 0;
}

static int open_file(struct corpus *c, const char *path)
{
	int is_stdin = !strcmp(path, "-");
	enum corpus_format f = c->o.infer && !is_stdin ? corpus_format_of_name(path) :
			       c->o.infer ? CORPUS_TEXT : c->o.format;
	c->sniffed = 0;
	if (f == CORPUS_PARQUET)
		return open_parquet(c, path);
	c->path = is_stdin ? "standard input" : path;
	c->fd = is_stdin ? 0 : open(path, O_RDONLY);
	if (c->fd < 0)
		return error("cannot open '%s': %s", path, strerror(errno));
	c->open = 1;
	c->st.files++;
	c->eof_in = c->eof = 0;
	c->win.len = c->pos = 0;
	c->line = 0;
	c->content = c->in_sep = 0;
	/* the first bytes tell the compression (a pipe may give them one by one) */
	c->in_pos = c->in_len = 0;
	while (c->in_len < 4 && !c->eof_in) {
		ssize_t k = read_raw(c, c->in + c->in_len, c->o.buf_size - c->in_len);
		if (k < 0)
			return -1;
		c->in_len += (size_t)k;
	}
	const unsigned char *m = c->in;
	uint32_t m32 = c->in_len >= 4 ? get_le32(m) : 0;
	if (c->in_len >= 2 && m[0] == 0x1f && m[1] == 0x8b)
		c->kind = SRC_GZIP;
	else if (m32 == ZSTD_MAGICNUMBER ||
		 (m32 & ZSTD_MAGIC_SKIPPABLE_MASK) == ZSTD_MAGIC_SKIPPABLE_START)
		c->kind = SRC_ZSTD;
	else
		c->kind = SRC_PLAIN;
	/* "PAR1" then a page header's first byte (field 1, an i32): read as
	 * Parquet when the format is inferred, else refused */
	if (c->kind == SRC_PLAIN && c->in_len >= 5 && !memcmp(m, "PAR1\x15", 5)) {
		if (!c->o.infer || is_stdin)
			return error("'%s' is a Parquet file: read it with --format parquet "
				     "(--field names its text column)", c->path);
		close(c->fd);
		c->open = 0;
		c->st.files--;
		c->st.bytes_read -= c->in_len;
		return open_parquet(c, path);
	}
	count_format(c, path, f);
	if (c->kind != SRC_GZIP && has_suffix(path, ".gz"))
		return error("'%s': not gzip data (no gzip magic number)", path);
	if (c->kind != SRC_ZSTD && has_suffix(path, ".zst"))
		return error("'%s': not zstd data (no zstd magic number)", path);
	if (c->kind == SRC_PLAIN) {
		buf_append(&c->win, c->in, c->in_len);
		c->st.bytes += c->in_len;
		c->in_len = 0;
	} else if (c->kind == SRC_GZIP) {
		memset(&c->gz, 0, sizeof(c->gz));
		if (inflateInit2(&c->gz, 15 + 16) != Z_OK)
			return error("'%s': cannot start zlib", c->path);
		c->gz_live = 1;
		c->gz_end = 0;
	} else {
		ZSTD_DCtx_reset(c->zd, ZSTD_reset_session_only);
		c->zst_left = 1;
	}
	return 0;
}

/* Decompress into out[0..cap): the bytes produced, 0 at the end, -1. */
static ssize_t inflate_some(struct corpus *c, unsigned char *out, size_t cap)
{
	z_stream *z = &c->gz;
	z->next_out = out;
	z->avail_out = (uInt)cap;
	while (z->avail_out == cap) {
		if (refill_in(c))
			return -1;
		if (c->in_pos == c->in_len) { /* the end of the file */
			if (!c->gz_end)
				return error("'%s': truncated gzip data", c->path);
			break;
		}
		if (c->gz_end) { /* another member follows */
			inflateReset(z);
			c->gz_end = 0;
		}
		z->next_in = c->in + c->in_pos;
		z->avail_in = (uInt)(c->in_len - c->in_pos);
		int r = inflate(z, Z_NO_FLUSH);
		c->in_pos = c->in_len - z->avail_in;
		if (r == Z_STREAM_END)
			c->gz_end = 1;
		else if (r != Z_OK && r != Z_BUF_ERROR)
			return error("'%s': corrupt gzip data (%s)", c->path,
				     z->msg ? z->msg : "inflate failed");
	}
	return (ssize_t)(cap - z->avail_out);
}

static ssize_t unzstd_some(struct corpus *c, unsigned char *out, size_t cap)
{
	ZSTD_outBuffer ob = {out, cap, 0};
	while (ob.pos == 0) {
		if (refill_in(c))
			return -1;
		ZSTD_inBuffer ib = {c->in, c->in_len, c->in_pos};
		size_t r = ZSTD_decompressStream(c->zd, &ob, &ib);
		if (ZSTD_isError(r))
			return error("'%s': corrupt zstd data (%s)", c->path, ZSTD_getErrorName(r));
		int progress = ib.pos > c->in_pos || ob.pos > 0;
		c->in_pos = ib.pos;
		if (progress)
			c->zst_left = r;
		else if (c->in_pos == c->in_len && c->eof_in) {
			if (c->zst_left)
				return error("'%s': truncated zstd data", c->path);
			break;
		}
	}
	return (ssize_t)ob.pos;
}

/* Append more of the file's bytes to the window (after dropping what was
 * consumed): 1, 0 at the end of the file, -1. */
static int fill(struct corpus *c)
{
	if (c->eof)
		return 0;
	if (c->pos) {
		memmove(c->win.data, c->win.data + c->pos, c->win.len - c->pos);
		c->win.len -= c->pos;
		c->pos = 0;
	}
	size_t cap = c->o.buf_size;
	buf_reserve(&c->win, cap + 1);
	unsigned char *out = c->win.data + c->win.len;
	ssize_t k = c->kind == SRC_GZIP ? inflate_some(c, out, cap) :
		    c->kind == SRC_ZSTD ? unzstd_some(c, out, cap) : read_raw(c, out, cap);
	if (k < 0)
		return -1;
	if (!k) {
		c->eof = 1;
		return 0;
	}
	c->win.len += (size_t)k;
	if (c->kind != SRC_PLAIN)
		c->st.bytes += (uint64_t)k;
	return 1;
}

/* The next line of the file, s[0..n) with its '\n' (the last line may have
 * none): 1, 0 at the end of the file, -1. Valid until the next call. */
static int next_line(struct corpus *c, const unsigned char **s, size_t *n)
{
	size_t searched = 0;
	for (;;) {
		const unsigned char *start = c->win.data + c->pos;
		size_t avail = c->win.len - c->pos;
		const unsigned char *nl =
			avail > searched ? memchr(start + searched, '\n', avail - searched) : NULL;
		if (nl || (c->eof && avail)) {
			*s = start;
			*n = nl ? (size_t)(nl - start) + 1 : avail;
			c->pos += *n;
			c->line++;
			return 1;
		}
		searched = avail;
		int r = fill(c);
		if (r < 0)
			return -1;
		if (!r && !avail)
			return 0;
	}
}

/* Put back the line just returned by next_line. */
static void unread_line(struct corpus *c, size_t n)
{
	c->pos -= n;
	c->line--;
}

static int blank(const unsigned char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
			return 0;
	return 1;
}

/* ---- documents ---- */

void corpus_open(struct corpus **cp, char *const *paths, int n, const struct corpus_opts *o)
{
	struct corpus *c = xcalloc(1, sizeof(*c));
	c->o = *o;
	if (!c->o.buf_size)
		c->o.buf_size = CORPUS_BUF_SIZE;
	c->o.buf_size = MAX(c->o.buf_size, 8);
	if (!c->o.field)
		c->o.field = "text";
	c->paths = xmalloc(st_mult((size_t)(n ? n : 1), sizeof(*c->paths)));
	for (int i = 0; i < n; i++)
		c->paths[i] = xstrdup(paths[i]);
	c->npaths = n;
	c->in = xmalloc(c->o.buf_size);
	buf_reserve(&c->win, c->o.buf_size); /* never NULL */
	c->zd = ZSTD_createDCtx();
	if (!c->zd)
		die("out of memory creating a zstd context");
	*cp = c;
}

void corpus_close(struct corpus *c)
{
	if (!c)
		return;
	close_file(c);
	corpus_paths_free(c->paths, c->npaths);
	free(c->in);
	ZSTD_freeDCtx(c->zd);
	buf_free(&c->win);
	buf_free(&c->doc);
	free(c);
}

void corpus_get_stats(const struct corpus *c, struct corpus_stats *st) { *st = c->st; }

/* The first record of a JSON Lines file opens a JSON array: a JSON
 * document of records, not JSON Lines (a .json file can be either). */
static int json_array_start(const unsigned char *s, size_t n)
{
	size_t i = 0;
	while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r'))
		i++;
	return i < n && s[i] == '[';
}

/* A bad JSONL record: named (the first show_bad), counted; -1 past max_bad.
 * array: it is the file's first and opens a JSON array. */
static int bad_record(struct corpus *c, enum json_record r, const struct json_record_error *e,
		      int array)
{
	char why[1024];
	const char *f = c->o.field;
	size_t k = strlen(c->path) - (has_suffix(c->path, ".json") ? 5 : 0);
	switch (array ? -1 : (int)r) {
	case -1: /* the path without .json, then .jsonl */
		snprintf(why, sizeof(why), "a JSON array, not JSON Lines (one object a line): "
			 "convert it with: jq -c '.[]' %.300s > %.*s.jsonl", c->path,
			 (int)MIN(k, 300), c->path);
		break;
	case JSON_RECORD_INVALID:
		snprintf(why, sizeof(why), "not valid JSON (byte %zu: %s)", e->at + 1, e->why);
		break;
	case JSON_RECORD_NOT_OBJECT:
		snprintf(why, sizeof(why), "%s, not a JSON object", json_type_name(e->type));
		break;
	case JSON_RECORD_NO_MEMBER:
		snprintf(why, sizeof(why), "no member \"%.200s\"", f);
		break;
	default:
		snprintf(why, sizeof(why), "member \"%.200s\" is %s, not a string", f,
			 json_type_name(e->type));
		break;
	}
	c->st.bad++;
	if (c->st.bad > c->o.max_bad) {
		c->st.too_many_bad = 1;
		return error("%s:%" PRIu64 ": %s", c->path, c->line, why);
	}
	if (c->st.bad <= c->o.show_bad)
		warning("%s:%" PRIu64 ": %s; record skipped", c->path, c->line, why);
	return 0;
}

/* The next document of a Parquet file: each row's string; a null or an
 * empty string is no document (counted as empty). */
static int parquet_doc(struct corpus *c, const unsigned char **doc, size_t *len)
{
	int r;
	while ((r = parquet_next(c->pq, doc, len)) > 0) {
		c->st.records++;
		if (r == 2 || !*len) {
			c->st.empty++;
			continue;
		}
		c->st.bytes += *len;
		return 1;
	}
	return r;
}

/* Text or lines whose first lines (up to SNIFF_LINES non-blank ones within
 * SNIFF_BYTES) are all JSON objects: JSON Lines read as text, which would
 * encode the JSON syntax. Warned about for the first such file, counted. */
#define SNIFF_LINES 5
#define SNIFF_BYTES (64u << 10)

/* The line ends in s[0..n), counting up to max. */
static int count_lines(const unsigned char *s, size_t n, int max)
{
	int k = 0;
	for (const unsigned char *e = s + n; k < max && (s = memchr(s, '\n', (size_t)(e - s)));
	     s++)
		k++;
	return k;
}

static int sniff_json(struct corpus *c)
{
	int lines = 0, objects = 0, r;
	/* enough of the file in the window (nothing of it is consumed yet) */
	while (count_lines(c->win.data + c->pos, c->win.len - c->pos, SNIFF_LINES + 1) <=
		       SNIFF_LINES && c->win.len - c->pos < SNIFF_BYTES && (r = fill(c)) != 0)
		if (r < 0)
			return -1;
	const unsigned char *p = c->win.data + c->pos, *end = c->win.data + c->win.len;
	struct buf out = {0};
	while (p < end && lines < SNIFF_LINES) {
		const unsigned char *nl = memchr(p, '\n', (size_t)(end - p));
		if (!nl && !c->eof)
			break; /* a line cut by the window: not judged */
		size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
		const unsigned char *line = p;
		p += n + (nl != NULL);
		if (blank(line, n))
			continue;
		if (line == c->win.data + c->pos && n >= 3 && !memcmp(line, "\xEF\xBB\xBF", 3)) {
			line += 3;
			n -= 3;
		}
		struct json_record_error e;
		enum json_record jr;
		jr = json_record_string((const char *)line, n, c->o.field, &out, &e);
		lines++;
		objects += jr != JSON_RECORD_INVALID && jr != JSON_RECORD_NOT_OBJECT;
	}
	buf_free(&out);
	if (!lines || objects < lines)
		return 0;
	if (!c->st.json_like++) {
		const char *its = lines == 1 ? "its" : "their";
		char first[32] = "line is a";
		if (lines > 1)
			snprintf(first, sizeof(first), "%d lines are", lines);
		warning("'%s' is read as %s, but its first %s JSON object%s: %s JSON syntax is "
			"encoded too; --format jsonl reads %s \"%s\" member", c->path,
			corpus_format_name(c->fmt), first, lines == 1 ? "" : "s", its, its,
			c->o.field);
	}
	return 0;
}

/* The next document of the open file: 1, 0 at its end, -1. */
static int file_next(struct corpus *c, const unsigned char **doc, size_t *len)
{
	const unsigned char *s;
	size_t n;
	int r;
	if (c->fmt == CORPUS_PARQUET)
		return parquet_doc(c, doc, len);
	if (!c->sniffed && c->fmt != CORPUS_JSONL) {
		c->sniffed = 1;
		if (sniff_json(c))
			return -1;
	}
	if (c->fmt == CORPUS_TEXT && !c->o.blank_line) {
		while ((r = fill(c)) > 0)
			;
		if (r < 0 || c->win.len == c->pos)
			return r;
		*doc = c->win.data + c->pos;
		*len = c->win.len - c->pos;
		c->pos = c->win.len;
		return 1;
	}
	if (c->fmt == CORPUS_TEXT) {
		c->doc.len = 0;
		while ((r = next_line(c, &s, &n)) > 0) {
			if (!blank(s, n)) {
				if (c->in_sep) { /* this line starts the next document */
					unread_line(c, n);
					c->in_sep = c->content = 0;
					break;
				}
				c->content = 1;
			} else if (c->content) {
				c->in_sep = 1;
			}
			buf_append(&c->doc, s, n);
		}
		if (r < 0 || !c->doc.len)
			return r < 0 ? -1 : 0;
		*doc = c->doc.data;
		*len = c->doc.len;
		return 1;
	}
	while ((r = next_line(c, &s, &n)) > 0) {
		if (blank(s, n))
			continue;
		if (c->fmt == CORPUS_LINES) {
			n -= s[n - 1] == '\n';
			n -= n && s[n - 1] == '\r';
			*doc = s;
			*len = n;
			return 1;
		}
		n -= s[n - 1] == '\n'; /* so that a string cut by the line end is "unterminated" */
		n -= n && s[n - 1] == '\r';
		if (c->line == 1 && n >= 3 && !memcmp(s, "\xEF\xBB\xBF", 3)) {
			s += 3; /* a byte order mark */
			n -= 3;
		}
		int first = !c->sniffed;
		c->sniffed = 1;
		c->st.records++;
		struct json_record_error e;
		enum json_record jr;
		jr = json_record_string((const char *)s, n, c->o.field, &c->doc, &e);
		if (jr != JSON_RECORD_OK) {
			if (bad_record(c, jr, &e, first && json_array_start(s, n)))
				return -1;
			continue;
		}
		if (!c->doc.len) {
			c->st.empty++;
			continue;
		}
		*doc = c->doc.data;
		*len = c->doc.len;
		return 1;
	}
	return r;
}

int corpus_next(struct corpus *c, const unsigned char **doc, size_t *len)
{
	for (;;) {
		if (!c->open) {
			if (c->next_path >= c->npaths)
				return 0;
			if (open_file(c, c->paths[c->next_path++])) {
				close_file(c);
				c->next_path = c->npaths;
				return -1;
			}
		}
		int r = file_next(c, doc, len);
		if (r > 0) {
			c->st.docs++;
			return 1;
		}
		close_file(c);
		if (r < 0) {
			c->next_path = c->npaths;
			return -1;
		}
	}
}
