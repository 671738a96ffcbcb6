/* shard.c - token shards on the zstd container, and llm.c .bin shards. */
#include "shard.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "container.h"
#include "../text/corpus.h"
#include "../text/json.h"
#include "../util.h"

/* bytes read to tell a corpus given as a shard (text, JSON, Parquet) */
#define SNIFF_BYTES 4096

/* Header blob of format version 1 (all little-endian):
 *   0 u32 token bytes (2 or 4)   4 u32 vocabulary size
 *   8 u64 tokens                16 u64 documents
 *  24 u64 tokenizer hash        32 u32 tokens per chunk   36 u32 zero */
#define SHARD_HEADER_LEN 40
/* Readers refuse bigger chunks: a chunk is decompressed whole. */
#define SHARD_MAX_CHUNK_TOKENS (1u << 26)
#define LLMC_HEADER_BYTES 1024
#define SHARD_ZSTD_LEVEL 3

static int token_bytes_for(uint32_t vocab) { return vocab <= 65536 ? 2 : 4; }

/* ---- writing ---- */

struct shard_writer {
	struct container_writer *cw;
	char *path;
	uint32_t vocab, chunk_tokens, nbuf;
	int width;
	uint64_t hash, ntokens, ndocs;
	unsigned char *buf; /* nbuf encoded tokens of the chunk being filled */
};

static void encode_header(unsigned char *h, int width, uint32_t vocab, uint64_t ntokens,
			  uint64_t ndocs, uint64_t hash, uint32_t chunk_tokens)
{
	memset(h, 0, SHARD_HEADER_LEN);
	put_le32(h, (uint32_t)width);
	put_le32(h + 4, vocab);
	put_le64(h + 8, ntokens);
	put_le64(h + 16, ndocs);
	put_le64(h + 24, hash);
	put_le32(h + 32, chunk_tokens);
}

int shard_writer_open(struct shard_writer **wp, const char *path, uint32_t vocab_size,
		      uint64_t tokenizer_hash)
{
	return shard_writer_open_named(wp, path, path, vocab_size, tokenizer_hash);
}

int shard_writer_open_named(struct shard_writer **wp, const char *path, const char *name,
			    uint32_t vocab_size, uint64_t tokenizer_hash)
{
	*wp = NULL;
	if (vocab_size == 0)
		return error("'%s': a shard needs a vocabulary of at least one token", name);
	struct shard_writer *w = xcalloc(1, sizeof(*w));
	w->path = xstrdup(name);
	w->vocab = vocab_size;
	w->hash = tokenizer_hash;
	w->width = token_bytes_for(vocab_size);
	w->chunk_tokens = SHARD_CHUNK_TOKENS;
	unsigned char h[SHARD_HEADER_LEN];
	encode_header(h, w->width, w->vocab, 0, 0, w->hash, w->chunk_tokens);
	if (container_create_named(&w->cw, path, name, SHARD_MAGIC, SHARD_VERSION, h, sizeof(h),
				   SHARD_ZSTD_LEVEL)) {
		free(w->path);
		free(w);
		return -1;
	}
	*wp = w;
	return 0;
}

int shard_writer_set_chunk_tokens(struct shard_writer *w, uint32_t chunk_tokens)
{
	if (w->ntokens || w->buf)
		return error("'%s': chunk size set after tokens were added", w->path);
	if (chunk_tokens == 0 || chunk_tokens > SHARD_MAX_CHUNK_TOKENS)
		return error("'%s': %" PRIu32 " tokens per chunk is out of range (1..%u)",
			     w->path, chunk_tokens, SHARD_MAX_CHUNK_TOKENS);
	w->chunk_tokens = chunk_tokens;
	return 0;
}

int shard_writer_set_compression(struct shard_writer *w, int level, int nthreads)
{
	if (container_set_level(w->cw, level))
		return -1;
	return container_set_threads(w->cw, nthreads);
}

uint64_t shard_writer_ntokens(const struct shard_writer *w) { return w->ntokens; }

static int flush_chunk(struct shard_writer *w)
{
	if (!w->nbuf)
		return 0;
	if (container_add_chunk(w->cw, w->buf, (size_t)w->nbuf * w->width))
		return -1;
	w->nbuf = 0;
	return 0;
}

int shard_writer_add_doc(struct shard_writer *w, const uint32_t *tokens, size_t n)
{
	return shard_writer_add(w, tokens, n, 1);
}

int shard_writer_add(struct shard_writer *w, const uint32_t *tokens, size_t n, uint64_t ndocs)
{
	for (size_t i = 0; i < n; i++)
		if (tokens[i] >= w->vocab)
			return error("'%s': token %" PRIu32 " is outside the vocabulary (%" PRIu32
				     " tokens)", w->path, tokens[i], w->vocab);
	if (!w->buf)
		w->buf = xmalloc(st_mult(w->chunk_tokens, (size_t)w->width));
	for (size_t i = 0; i < n; i++) {
		unsigned char *p = w->buf + (size_t)w->nbuf * w->width;
		if (w->width == 2)
			put_le16(p, (uint16_t)tokens[i]);
		else
			put_le32(p, tokens[i]);
		if (++w->nbuf == w->chunk_tokens && flush_chunk(w))
			return -1;
	}
	w->ntokens += n;
	w->ndocs += ndocs;
	return 0;
}

static void writer_free(struct shard_writer *w)
{
	free(w->buf);
	free(w->path);
	free(w);
}

int shard_writer_close(struct shard_writer *w)
{
	unsigned char h[SHARD_HEADER_LEN];
	encode_header(h, w->width, w->vocab, w->ntokens, w->ndocs, w->hash, w->chunk_tokens);
	if (flush_chunk(w) || container_set_header(w->cw, h, sizeof(h))) {
		shard_writer_abort(w);
		return -1;
	}
	int rc = container_commit(w->cw);
	writer_free(w);
	return rc;
}

void shard_writer_abort(struct shard_writer *w)
{
	if (!w)
		return;
	container_abort(w->cw);
	writer_free(w);
}

/* ---- reading ---- */

struct shard {
	char *path;
	int llmc, width;
	uint32_t vocab, chunk_tokens;
	uint64_t ntokens, ndocs, hash;
	struct container *c;      /* asyncpp shards */
	int fd;                   /* llm.c shards */
	unsigned char *cache;     /* one decompressed, validated chunk */
	uint64_t cached;          /* its index, or UINT64_MAX */
};

static int open_llmc(struct shard *s)
{
	s->fd = open(s->path, O_RDONLY);
	if (s->fd < 0)
		return error("cannot open '%s': %s", s->path, strerror(errno));
	struct stat st;
	if (fstat(s->fd, &st))
		return error("cannot stat '%s': %s", s->path, strerror(errno));
	uint64_t fsize = (uint64_t)st.st_size;
	unsigned char h[LLMC_HEADER_BYTES];
	if (fsize < sizeof(h))
		return error("'%s': truncated: %" PRIu64 " bytes, an llm.c shard header is %d",
			     s->path, fsize, LLMC_HEADER_BYTES);
	if (pread(s->fd, h, sizeof(h), 0) != (ssize_t)sizeof(h))
		return error("cannot read '%s': %s", s->path, strerror(errno));
	int32_t version = (int32_t)get_le32(h + 4), n = (int32_t)get_le32(h + 8);
	if (version != 1)
		return error("'%s': llm.c shard version %" PRId32 " is not supported (1)", s->path,
			     version);
	if (n < 0)
		return error("'%s': corrupt llm.c shard header: %" PRId32 " tokens", s->path, n);
	uint64_t want = LLMC_HEADER_BYTES + 2 * (uint64_t)n;
	if (fsize < want)
		return error("'%s': truncated: the header says %" PRId32 " tokens (%" PRIu64
			     " bytes), the file has %" PRIu64, s->path, n, want, fsize);
	if (fsize > want)
		return error("'%s': corrupt: %" PRIu64 " bytes after the %" PRId32
			     " tokens the header announces", s->path, fsize - want, n);
	s->llmc = 1;
	s->width = 2;
	s->vocab = LLMC_SHARD_VOCAB;
	s->ntokens = (uint64_t)n;
	return 0;
}

static int open_container(struct shard *s)
{
	if (container_open(&s->c, s->path, SHARD_MAGIC, "shard"))
		return -1;
	uint32_t v = container_version(s->c);
	if (v > SHARD_VERSION)
		return error("'%s': format version %" PRIu32 " is newer than this asyncpp "
			     "supports (%d)", s->path, v, SHARD_VERSION);
	if (v == 0)
		return error("'%s': unsupported shard format version 0", s->path);
	size_t len;
	const unsigned char *h = container_header(s->c, &len);
	if (len != SHARD_HEADER_LEN)
		return error("'%s': corrupt shard header: %zu bytes, expected %d", s->path, len,
			     SHARD_HEADER_LEN);
	s->width = (int)get_le32(h);
	s->vocab = get_le32(h + 4);
	s->ntokens = get_le64(h + 8);
	s->ndocs = get_le64(h + 16);
	s->hash = get_le64(h + 24);
	s->chunk_tokens = get_le32(h + 32);
	if (s->vocab == 0 || s->width != token_bytes_for(s->vocab) || get_le32(h + 36))
		return error("'%s': corrupt shard header (token width %d, vocabulary %" PRIu32
			     ")", s->path, s->width, s->vocab);
	if (s->chunk_tokens == 0 || s->chunk_tokens > SHARD_MAX_CHUNK_TOKENS)
		return error("'%s': corrupt shard header: %" PRIu32 " tokens per chunk", s->path,
			     s->chunk_tokens);
	uint64_t nchunks = s->ntokens / s->chunk_tokens + (s->ntokens % s->chunk_tokens != 0);
	if (container_nchunks(s->c) != nchunks)
		return error("'%s': corrupt shard: %" PRIu64 " chunks, %" PRIu64 " tokens need %"
			     PRIu64, s->path, container_nchunks(s->c), s->ntokens, nchunks);
	for (uint64_t i = 0; i < nchunks; i++) {
		uint64_t nt = MIN((uint64_t)s->chunk_tokens, s->ntokens - i * s->chunk_tokens);
		if (container_chunk_size(s->c, i) != nt * (uint64_t)s->width)
			return error("'%s': corrupt shard: chunk %" PRIu64 " holds %" PRIu64
				     " bytes, expected %" PRIu64, s->path, i,
				     container_chunk_size(s->c, i), nt * s->width);
	}
	return 0;
}

/* What a file that is no shard holds, told by its first bytes b[0..n): a
 * compressed or Parquet corpus, JSON or UTF-8 text; NULL when none of these
 * (the container's own check names it). cut: the file goes on after b[n).
 * *json: JSON, which encode reads as JSON Lines. */
static const char *sniff_corpus(const unsigned char *b, size_t n, int cut, int *json)
{
	*json = 0;
	if (n >= 2 && b[0] == 0x1f && b[1] == 0x8b)
		return "gzip-compressed data";
	if (n >= 4 && !memcmp(b, "\x28\xb5\x2f\xfd", 4))
		return "zstd-compressed data";
	if (n >= 4 && !memcmp(b, "PAR1", 4))
		return "Parquet data";
	size_t i = n >= 3 && !memcmp(b, "\xEF\xBB\xBF", 3) ? 3 : 0, k = n;
	while (i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n'))
		i++;
	if (i == n)
		return NULL;
	for (size_t j = 0; j < n; j++)
		if (b[j] < 0x20 && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' && b[j] != '\f')
			return NULL;
	/* a character cut by the end of what was read is no reason to say no */
	for (size_t back = 0; cut && back < 3 && k > 0 && (b[k - 1] & 0xC0) == 0x80; back++)
		k--;
	if (cut && k > 0 && b[k - 1] >= 0xC0)
		k--;
	if (!json_utf8_valid(b, k))
		return NULL;
	*json = b[i] == '{' ? 1 : b[i] == '[' ? 2 : 0; /* 2: an array, not JSON Lines */
	return *json == 2 ? "a JSON array" : *json ? "JSON" : "text";
}

/* The file is not a shard: when it looks like a corpus, say what it is and
 * the command that makes shards of it (-1), else 0. */
static int refuse_corpus(const char *path, const unsigned char *b, size_t n, int cut)
{
	int json;
	const char *what = sniff_corpus(b, n, cut, &json);
	if (!what)
		return 0;
	if (json == 2) /* what tokenize encode would refuse as well */
		return error("'%s': not a token shard but %s: make it JSON Lines (jq -c '.[]' %s > "
			     "FILE.jsonl), then encode that: asyncpp tokenize encode -t TOK -o PREFIX "
			     "FILE.jsonl", path, what, path);
	int flag = json && corpus_format_of_name(path) != CORPUS_JSONL;
	return error("'%s': not a token shard but %s, a corpus to encode first: asyncpp tokenize "
		     "encode -t TOK -o PREFIX %s%s (writes PREFIX_train.shard and "
		     "PREFIX_val.shard)", path, what, flag ? "--format jsonl " : "", path);
}

int shard_open(struct shard **sp, const char *path)
{
	*sp = NULL;
	struct shard *s = xcalloc(1, sizeof(*s));
	s->path = xstrdup(path);
	s->fd = -1;
	s->cached = UINT64_MAX;
	unsigned char b[SNIFF_BYTES + 1] = {0}; /* one more: does the file go on? */
	FILE *fp = fopen(path, "rb");
	if (!fp) {
		error("cannot open '%s': %s", path, strerror(errno));
		shard_close(s);
		return -1;
	}
	size_t got = fread(b, 1, sizeof(b), fp);
	fclose(fp);
	int rc;
	if (got >= 4 && get_le32(b) == LLMC_SHARD_MAGIC)
		rc = open_llmc(s);
	else if ((rc = refuse_corpus(path, b, MIN(got, SNIFF_BYTES), got > SNIFF_BYTES)) == 0)
		rc = open_container(s);
	if (rc) {
		shard_close(s);
		return -1;
	}
	*sp = s;
	return 0;
}

void shard_close(struct shard *s)
{
	if (!s)
		return;
	container_close(s->c);
	if (s->fd >= 0)
		close(s->fd);
	free(s->cache);
	free(s->path);
	free(s);
}

const char *shard_path(const struct shard *s) { return s->path; }
uint64_t shard_ntokens(const struct shard *s) { return s->ntokens; }
uint64_t shard_ndocs(const struct shard *s) { return s->ndocs; }
uint32_t shard_vocab_size(const struct shard *s) { return s->vocab; }
uint64_t shard_tokenizer_hash(const struct shard *s) { return s->hash; }
int shard_is_llmc(const struct shard *s) { return s->llmc; }
int shard_token_bytes(const struct shard *s) { return s->width; }

/* Decode n little-endian tokens starting at token `first` of the file,
 * rejecting any outside the vocabulary. */
static int decode(const struct shard *s, const unsigned char *p, size_t n, uint64_t first,
		  uint32_t *out)
{
	for (size_t i = 0; i < n; i++) {
		uint32_t t = s->width == 2 ? get_le16(p + 2 * i) : get_le32(p + 4 * i);
		if (t >= s->vocab)
			return error("'%s': token %" PRIu32 " at position %" PRIu64
				     " is outside the vocabulary (%" PRIu32 " tokens)", s->path,
				     t, first + i, s->vocab);
		if (out)
			out[i] = t;
	}
	return 0;
}

static int load_chunk(struct shard *s, uint64_t i)
{
	if (s->cached == i)
		return 0;
	if (!s->cache)
		s->cache = xmalloc((size_t)MIN((uint64_t)s->chunk_tokens, s->ntokens) * s->width);
	s->cached = UINT64_MAX;
	uint64_t first = i * s->chunk_tokens;
	size_t nt = (size_t)MIN((uint64_t)s->chunk_tokens, s->ntokens - first);
	if (container_read_chunk(s->c, i, s->cache) || decode(s, s->cache, nt, first, NULL))
		return -1;
	s->cached = i;
	return 0;
}

static int read_llmc(struct shard *s, uint64_t start, size_t n, uint32_t *out)
{
	unsigned char b[1 << 16];
	while (n) {
		size_t k = MIN(n, sizeof(b) / 2);
		off_t off = (off_t)(LLMC_HEADER_BYTES + 2 * start);
		ssize_t r = pread(s->fd, b, 2 * k, off);
		if (r < 0)
			return error("cannot read '%s': %s", s->path, strerror(errno));
		if ((size_t)r != 2 * k)
			return error("'%s': truncated: unexpected end of file at token %" PRIu64,
				     s->path, start + (uint64_t)r / 2);
		if (decode(s, b, k, start, out))
			return -1;
		start += k;
		out += k;
		n -= k;
	}
	return 0;
}

int shard_read(struct shard *s, uint64_t start, size_t n, uint32_t *out)
{
	if (start > s->ntokens || n > s->ntokens - start)
		return error("'%s': tokens [%" PRIu64 ", %" PRIu64 ") are past the end (%" PRIu64
			     " tokens)", s->path, start, start + n, s->ntokens);
	if (s->llmc)
		return read_llmc(s, start, n, out);
	while (n) {
		uint64_t ci = start / s->chunk_tokens, in = start % s->chunk_tokens;
		if (load_chunk(s, ci))
			return -1;
		uint64_t nt = MIN((uint64_t)s->chunk_tokens, s->ntokens - ci * s->chunk_tokens);
		size_t k = (size_t)MIN((uint64_t)n, nt - in);
		(void)decode(s, s->cache + in * s->width, k, start, out); /* checked at load */
		start += k;
		out += k;
		n -= k;
	}
	return 0;
}

int shard_sniff(const char *path)
{
	char magic[8];
	int r = container_peek(path, magic);
	if (r)
		return r < 0 ? -1 : !memcmp(magic, SHARD_MAGIC, 8);
	FILE *fp = fopen(path, "rb");
	if (!fp)
		return -1;
	unsigned char b[4];
	size_t got = fread(b, 1, 4, fp);
	fclose(fp);
	return got == 4 && get_le32(b) == LLMC_SHARD_MAGIC;
}

/* ---- inspect ---- */

int shard_inspect(const char *path, FILE *out)
{
	struct shard *s;
	if (shard_open(&s, path))
		return -1;
	if (s->llmc)
		fprintf(out, "%s: llm.c token shard (magic %d, version 1)\n", path,
			LLMC_SHARD_MAGIC);
	else
		fprintf(out, "%s: asyncpp token shard (format %" PRIu32 ")\n", path,
			container_version(s->c));
	fprintf(out, "  tokens          %" PRIu64 "\n", s->ntokens);
	if (!s->llmc) {
		fprintf(out, "  documents       %" PRIu64 "\n", s->ndocs);
		fprintf(out, "  vocabulary      %" PRIu32 " (u%d tokens)\n", s->vocab,
			8 * s->width);
		fprintf(out, "  tokenizer hash  %016" PRIx64 "\n", s->hash);
		fprintf(out, "  chunks          %" PRIu64 " of up to %" PRIu32 " tokens\n",
			container_nchunks(s->c), s->chunk_tokens);
		uint64_t fsize = container_file_size(s->c);
		fprintf(out, "  file size       %" PRIu64 " bytes", fsize);
		if (s->ntokens)
			fprintf(out, " (%.2f bytes/token)", (double)fsize / (double)s->ntokens);
		fputc('\n', out);
	} else {
		fprintf(out, "  vocabulary      %" PRIu32 " (u16 tokens; GPT-2 assumed)\n",
			s->vocab);
	}
	/* Verify: every chunk's checksums, every token against the vocabulary. */
	uint32_t *buf = xmalloc(sizeof(uint32_t) << 16);
	uint64_t eot = 0, maxid = 0;
	int rc = 0;
	for (uint64_t pos = 0; pos < s->ntokens && !rc;) {
		size_t k = (size_t)MIN((uint64_t)1 << 16, s->ntokens - pos);
		rc = shard_read(s, pos, k, buf);
		for (size_t i = 0; i < k && !rc; i++) {
			eot += buf[i] == 50256;
			maxid = MAX(maxid, buf[i]);
		}
		pos += k;
	}
	free(buf);
	if (!rc && s->llmc)
		fprintf(out, "  documents       %" PRIu64 " (<|endoftext|> tokens)\n", eot);
	if (!rc && s->ntokens)
		fprintf(out, "  largest token   %" PRIu64 "\n", maxid);
	if (!rc)
		fprintf(out, "  verified        %s; all tokens in the vocabulary\n",
			s->llmc ? "size (the format has no checksums)" : "every checksum");
	fflush(out);
	shard_close(s);
	return rc;
}

/* ---- data paths ---- */

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static int has_suffix(const char *s, const char *suf)
{
	size_t n = strlen(s), m = strlen(suf);
	return n >= m && !strcmp(s + n - m, suf);
}

static int is_regular(const char *path)
{
	struct stat st;
	return !stat(path, &st) && S_ISREG(st.st_mode);
}

int shard_glob(const char *pattern, char ***paths, int *n)
{
	*paths = NULL;
	*n = 0;
	struct stat st;
	char **v = NULL;
	int nv = 0;
	if (!stat(pattern, &st) && S_ISREG(st.st_mode)) {
		v = xmalloc(sizeof(*v));
		v[nv++] = xstrdup(pattern);
	} else if (!stat(pattern, &st) && S_ISDIR(st.st_mode)) {
		DIR *d = opendir(pattern);
		if (!d)
			return error("cannot open '%s': %s", pattern, strerror(errno));
		struct dirent *e;
		while ((e = readdir(d))) {
			if (e->d_name[0] == '.' ||
			    !(has_suffix(e->d_name, ".shard") || has_suffix(e->d_name, ".bin")))
				continue;
			char *p = path_join(pattern, e->d_name);
			if (!is_regular(p)) {
				free(p);
				continue;
			}
			v = xrealloc(v, st_mult((size_t)nv + 1, sizeof(*v)));
			v[nv++] = p;
		}
		closedir(d);
		if (!nv)
			return error("'%s': no *.shard or *.bin files in this directory", pattern);
	} else {
		glob_t g;
		int r = glob(pattern, 0, NULL, &g);
		if (r == 0)
			for (size_t i = 0; i < g.gl_pathc; i++) {
				if (!is_regular(g.gl_pathv[i]))
					continue;
				v = xrealloc(v, st_mult((size_t)nv + 1, sizeof(*v)));
				v[nv++] = xstrdup(g.gl_pathv[i]);
			}
		if (r != GLOB_NOMATCH)
			globfree(&g);
		if (!nv)
			return error("'%s': no such shard file, directory or matching files",
				     pattern);
	}
	qsort(v, (size_t)nv, sizeof(*v), cmp_str);
	*paths = v;
	*n = nv;
	return 0;
}

void shard_glob_free(char **paths, int n)
{
	for (int i = 0; i < n; i++)
		free(paths[i]);
	free(paths);
}
