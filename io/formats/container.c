/* container.c - the checksummed, seekable zstd container (see container.h). */
#include "container.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "../util.h"

#define HEADER_FRAME_MAGIC 0x184D2A5Au
#define SEEK_FRAME_MAGIC 0x184D2A5Bu
#define FOOTER_MAGIC "ASPCSEEK"
#define SKIP_HDR 8          /* skippable frame: u32 magic, u32 content size */
#define HDR_FIXED 20        /* format magic, format version, layout version, blob length */
#define HDR_OVERHEAD (SKIP_HDR + HDR_FIXED + 4) /* plus the crc32c */
#define ENTRY_SIZE 24       /* u64 csize, u64 dsize, u32 ccrc, u32 dcrc */
#define FOOTER_SIZE 20      /* u64 nchunks, u32 table crc, footer magic */
/* A zstd block holds at most 128 KiB and takes at least 4 bytes (an RLE
 * block), so no valid frame decompresses to more than 32768 times its size. */
#define MAX_RATIO 32768

struct entry {
	uint64_t csize, dsize;
	uint32_t ccrc, dcrc;
};

/* ---- writing ---- */

struct container_writer {
	struct atomic_file af;
	char magic[CONTAINER_MAGIC_LEN];
	uint32_t version;
	unsigned char *header;
	size_t header_len;
	int header_dirty, failed;
	ZSTD_CCtx *cctx;
	struct entry *entries;
	uint64_t n, cap;
	/* the chunk being written */
	int in_chunk;
	struct entry cur;
	uint64_t got;
	unsigned char *obuf;
	size_t obuf_size;
};

static void encode_header_frame(struct buf *b, const char magic[8], uint32_t version,
				const void *header, size_t len)
{
	unsigned char fixed[SKIP_HDR + HDR_FIXED], crc[4];
	put_le32(fixed, HEADER_FRAME_MAGIC);
	put_le32(fixed + 4, (uint32_t)(HDR_FIXED + len + 4));
	memcpy(fixed + 8, magic, CONTAINER_MAGIC_LEN);
	put_le32(fixed + 16, version);
	put_le32(fixed + 20, CONTAINER_LAYOUT_VERSION);
	put_le32(fixed + 24, (uint32_t)len);
	uint32_t c = crc32c(0, fixed + SKIP_HDR, HDR_FIXED);
	c = crc32c(c, header, len);
	put_le32(crc, c);
	b->len = 0;
	buf_append(b, fixed, sizeof(fixed));
	buf_append(b, header, len);
	buf_append(b, crc, 4);
}

static int writer_fail(struct container_writer *w)
{
	w->failed = 1;
	return -1;
}

int container_create(struct container_writer **wp, const char *path, const char magic[8],
		     uint32_t version, const void *header, size_t header_len, int zstd_level)
{
	return container_create_named(wp, path, path, magic, version, header, header_len,
				      zstd_level);
}

int container_create_named(struct container_writer **wp, const char *path, const char *name,
			   const char magic[8], uint32_t version, const void *header,
			   size_t header_len, int zstd_level)
{
	*wp = NULL;
	if (header_len > CONTAINER_MAX_HEADER)
		return error("'%s': container header of %zu bytes is too large", name,
			     header_len);
	struct container_writer *w = xcalloc(1, sizeof(*w));
	if (atomic_open_named(&w->af, path, name)) {
		free(w);
		return -1;
	}
	memcpy(w->magic, magic, CONTAINER_MAGIC_LEN);
	w->version = version;
	w->header_len = header_len;
	w->header = xmalloc(header_len);
	if (header_len)
		memcpy(w->header, header, header_len);
	w->cctx = ZSTD_createCCtx();
	if (!w->cctx) {
		atomic_abort(&w->af);
		free(w->header);
		free(w);
		return error("'%s': cannot create a zstd compression context", name);
	}
	ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_compressionLevel,
			       zstd_level ? zstd_level : ZSTD_CLEVEL_DEFAULT);
	ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_checksumFlag, 1);
	ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_contentSizeFlag, 1);
	w->obuf_size = ZSTD_CStreamOutSize();
	w->obuf = xmalloc(w->obuf_size);
	struct buf b = {0};
	encode_header_frame(&b, w->magic, version, w->header, header_len);
	int rc = atomic_write(&w->af, b.data, b.len);
	buf_free(&b);
	if (rc) {
		container_abort(w);
		return -1;
	}
	*wp = w;
	return 0;
}

int container_set_level(struct container_writer *w, int zstd_level)
{
	size_t r = ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_compressionLevel,
					  zstd_level ? zstd_level : ZSTD_CLEVEL_DEFAULT);
	if (ZSTD_isError(r))
		return error("'%s': zstd level %d: %s", w->af.name, zstd_level,
			     ZSTD_getErrorName(r));
	return 0;
}

int container_set_threads(struct container_writer *w, int nthreads)
{
	/* An error here means libzstd was built without threads: stay serial. */
	ZSTD_CCtx_setParameter(w->cctx, ZSTD_c_nbWorkers, nthreads > 0 ? nthreads : 0);
	return 0;
}

int container_set_header(struct container_writer *w, const void *header, size_t header_len)
{
	if (header_len != w->header_len)
		return error("'%s': container header changed size (%zu, was %zu)", w->af.name,
			     header_len, w->header_len);
	if (header_len)
		memcpy(w->header, header, header_len);
	w->header_dirty = 1;
	return 0;
}

uint64_t container_writer_nchunks(const struct container_writer *w) { return w->n; }

/* Compress in[0..n) with the given directive and write what comes out. */
static int chunk_feed(struct container_writer *w, const void *data, size_t n,
		      ZSTD_EndDirective mode)
{
	ZSTD_inBuffer in = {data, n, 0};
	for (;;) {
		ZSTD_outBuffer out = {w->obuf, w->obuf_size, 0};
		size_t left = ZSTD_compressStream2(w->cctx, &out, &in, mode);
		if (ZSTD_isError(left)) {
			error("'%s': zstd compression failed: %s", w->af.name,
			      ZSTD_getErrorName(left));
			return writer_fail(w);
		}
		if (out.pos) {
			if (atomic_write(&w->af, w->obuf, out.pos))
				return writer_fail(w);
			w->cur.ccrc = crc32c(w->cur.ccrc, w->obuf, out.pos);
			w->cur.csize += out.pos;
		}
		if (mode == ZSTD_e_end ? left == 0 : in.pos == in.size)
			return 0;
	}
}

int container_chunk_begin(struct container_writer *w, uint64_t size)
{
	if (w->failed)
		return -1;
	if (w->in_chunk) {
		error("'%s': container chunk begun twice", w->af.name);
		return writer_fail(w);
	}
	ZSTD_CCtx_reset(w->cctx, ZSTD_reset_session_only);
	size_t r = ZSTD_CCtx_setPledgedSrcSize(w->cctx, size);
	if (ZSTD_isError(r)) {
		error("'%s': zstd: %s", w->af.name, ZSTD_getErrorName(r));
		return writer_fail(w);
	}
	memset(&w->cur, 0, sizeof(w->cur));
	w->cur.dsize = size;
	w->got = 0;
	w->in_chunk = 1;
	return 0;
}

int container_chunk_write(struct container_writer *w, const void *data, size_t n)
{
	if (w->failed)
		return -1;
	if (!w->in_chunk || n > w->cur.dsize - w->got) {
		error("'%s': container chunk given more bytes than begun with (%" PRIu64 ")",
		      w->af.name, w->cur.dsize);
		return writer_fail(w);
	}
	w->cur.dcrc = crc32c(w->cur.dcrc, data, n);
	w->got += n;
	return chunk_feed(w, data, n, ZSTD_e_continue);
}

/* Record the chunk whose frame has just been completed. */
static void chunk_record(struct container_writer *w)
{
	if (w->n == w->cap) {
		w->cap = w->cap ? 2 * w->cap : 64;
		w->entries = xrealloc(w->entries, st_mult(w->cap, sizeof(*w->entries)));
	}
	w->entries[w->n++] = w->cur;
	w->in_chunk = 0;
}

int container_chunk_end(struct container_writer *w)
{
	if (w->failed)
		return -1;
	if (!w->in_chunk || w->got != w->cur.dsize) {
		error("'%s': container chunk given %" PRIu64 " bytes, begun with %" PRIu64,
		      w->af.name, w->got, w->cur.dsize);
		return writer_fail(w);
	}
	if (chunk_feed(w, NULL, 0, ZSTD_e_end))
		return -1;
	chunk_record(w);
	return 0;
}

int container_add_chunk(struct container_writer *w, const void *data, size_t n)
{
	if (container_chunk_begin(w, n))
		return -1;
	w->cur.dcrc = crc32c(0, data, n);
	w->got = n;
	if (chunk_feed(w, data, n, ZSTD_e_end))
		return -1;
	chunk_record(w);
	return 0;
}

static void writer_free(struct container_writer *w)
{
	ZSTD_freeCCtx(w->cctx);
	free(w->header);
	free(w->entries);
	free(w->obuf);
	free(w);
}

int container_commit(struct container_writer *w)
{
	if (!w->failed && w->in_chunk) {
		error("'%s': container committed inside a chunk", w->af.name);
		writer_fail(w);
	}
	if (w->failed) {
		container_abort(w);
		return -1;
	}
	/* seek table frame: entries, then the footer */
	size_t tlen = st_add(st_mult(w->n, ENTRY_SIZE), FOOTER_SIZE);
	if (tlen > UINT32_MAX) {
		error("'%s': too many chunks (%" PRIu64 ")", w->af.name, w->n);
		container_abort(w);
		return -1;
	}
	unsigned char *t = xmalloc(SKIP_HDR + tlen), *p = t + SKIP_HDR;
	put_le32(t, SEEK_FRAME_MAGIC);
	put_le32(t + 4, (uint32_t)tlen);
	for (uint64_t i = 0; i < w->n; i++, p += ENTRY_SIZE) {
		put_le64(p, w->entries[i].csize);
		put_le64(p + 8, w->entries[i].dsize);
		put_le32(p + 16, w->entries[i].ccrc);
		put_le32(p + 20, w->entries[i].dcrc);
	}
	put_le64(p, w->n);
	put_le32(p + 8, crc32c(0, t + SKIP_HDR, (size_t)(p + 8 - (t + SKIP_HDR))));
	memcpy(p + 12, FOOTER_MAGIC, 8);
	int rc = atomic_write(&w->af, t, SKIP_HDR + tlen);
	free(t);
	if (!rc && w->header_dirty) {
		struct buf b = {0};
		encode_header_frame(&b, w->magic, w->version, w->header, w->header_len);
		if (fflush(w->af.fp) || fseek(w->af.fp, 0, SEEK_SET))
			rc = error("'%s': cannot rewrite the header: %s", w->af.name,
				   strerror(errno));
		if (!rc)
			rc = atomic_write(&w->af, b.data, b.len);
		if (!rc && fseek(w->af.fp, 0, SEEK_END))
			rc = error("'%s': cannot seek: %s", w->af.name, strerror(errno));
		buf_free(&b);
	}
	if (rc) {
		container_abort(w);
		return -1;
	}
	rc = atomic_commit(&w->af);
	writer_free(w);
	return rc;
}

void container_abort(struct container_writer *w)
{
	if (!w)
		return;
	atomic_abort(&w->af);
	writer_free(w);
}

/* ---- reading ---- */

struct container {
	char *path, *what;
	int fd;
	uint64_t fsize;
	char magic[CONTAINER_MAGIC_LEN];
	uint32_t version;
	unsigned char *header;
	size_t header_len;
	uint64_t n;
	struct entry *e;
	uint64_t *off; /* file offset of each chunk frame */
	uint64_t data_size;
};

/* Read exactly n bytes at off; a short read means the file shrank. */
static int read_at(const struct container *c, uint64_t off, void *p, size_t n)
{
	unsigned char *q = p;
	while (n) {
		ssize_t r = pread(c->fd, q, n, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return error("cannot read '%s': %s", c->path, strerror(errno));
		if (r == 0)
			return error("'%s': truncated: unexpected end of file at byte %" PRIu64,
				     c->path, off);
		q += r;
		off += (uint64_t)r;
		n -= (size_t)r;
	}
	return 0;
}

static int check_header(struct container *c, const char *magic)
{
	const char *what = c->what;
	unsigned char fixed[SKIP_HDR + HDR_FIXED];
	size_t have = c->fsize < sizeof(fixed) ? (size_t)c->fsize : sizeof(fixed);
	if (read_at(c, 0, fixed, have))
		return -1;
	/* The leading bytes decide "not this kind of file" vs "truncated". */
	unsigned char want[16];
	put_le32(want, HEADER_FRAME_MAGIC);
	size_t cmp = magic ? 16 : 4;
	if (magic)
		memcpy(want + 8, magic, 8);
	for (size_t i = 0; i < cmp && i < have; i++) {
		if (i >= 4 && i < 8)
			continue; /* the frame size */
		if (fixed[i] != want[i])
			return error("'%s': not an asyncpp %s (bad magic)", c->path, what);
	}
	if (have < sizeof(fixed))
		return error("'%s': truncated: %zu bytes, too short for a %s header", c->path,
			     have, what);
	memcpy(c->magic, fixed + 8, 8);
	uint32_t fsz = get_le32(fixed + 4);
	uint32_t hlen = get_le32(fixed + 24);
	if (fsz < HDR_FIXED + 4 || hlen > CONTAINER_MAX_HEADER || fsz != HDR_FIXED + hlen + 4)
		return error("'%s': corrupt %s header (frame size %" PRIu32
			     ", header length %" PRIu32 ")", c->path, what, fsz, hlen);
	if (SKIP_HDR + (uint64_t)fsz > c->fsize)
		return error("'%s': truncated: the %s header needs %" PRIu64
			     " bytes, the file has %" PRIu64, c->path, what,
			     SKIP_HDR + (uint64_t)fsz, c->fsize);
	c->header = xmalloc(hlen);
	unsigned char crcb[4];
	if (read_at(c, sizeof(fixed), c->header, hlen) ||
	    read_at(c, sizeof(fixed) + hlen, crcb, 4))
		return -1;
	uint32_t crc = crc32c(crc32c(0, fixed + SKIP_HDR, HDR_FIXED), c->header, hlen);
	if (crc != get_le32(crcb))
		return error("'%s': header checksum mismatch (file is corrupt)", c->path);
	uint32_t layout = get_le32(fixed + 20);
	if (layout != CONTAINER_LAYOUT_VERSION)
		return error("'%s': container layout version %" PRIu32 " is %s than this "
			     "asyncpp supports (%d)", c->path, layout,
			     layout > CONTAINER_LAYOUT_VERSION ? "newer" : "other",
			     CONTAINER_LAYOUT_VERSION);
	c->version = get_le32(fixed + 16);
	c->header_len = hlen;
	return 0;
}

static int check_seek_table(struct container *c)
{
	uint64_t hend = SKIP_HDR + HDR_FIXED + (uint64_t)c->header_len + 4;
	unsigned char foot[FOOTER_SIZE];
	if (c->fsize < hend + SKIP_HDR + FOOTER_SIZE)
		return error("'%s': truncated: %" PRIu64 " bytes, no room for a seek table",
			     c->path, c->fsize);
	if (read_at(c, c->fsize - FOOTER_SIZE, foot, FOOTER_SIZE))
		return -1;
	if (memcmp(foot + 12, FOOTER_MAGIC, 8))
		return error("'%s': truncated or corrupt: no seek table at the end of the file",
			     c->path);
	uint64_t n = get_le64(foot);
	uint64_t room = (c->fsize - hend - SKIP_HDR - FOOTER_SIZE) / ENTRY_SIZE;
	if (n > room)
		return error("'%s': corrupt seek table: %" PRIu64 " chunks do not fit in %"
			     PRIu64 " bytes", c->path, n, c->fsize);
	uint64_t tlen = n * ENTRY_SIZE + FOOTER_SIZE;
	uint64_t tstart = c->fsize - SKIP_HDR - tlen;
	unsigned char *t = xmalloc((size_t)(SKIP_HDR + tlen));
	if (read_at(c, tstart, t, (size_t)(SKIP_HDR + tlen))) {
		free(t);
		return -1;
	}
	int rc = 0;
	if (get_le32(t) != SEEK_FRAME_MAGIC || get_le32(t + 4) != tlen)
		rc = error("'%s': corrupt seek table frame (file is corrupt)", c->path);
	else if (crc32c(0, t + SKIP_HDR, (size_t)(tlen - 12)) != get_le32(foot + 8))
		rc = error("'%s': seek table checksum mismatch (file is corrupt)", c->path);
	if (rc) {
		free(t);
		return -1;
	}
	c->n = n;
	c->e = xcalloc(n ? n : 1, sizeof(*c->e));
	c->off = xcalloc(n ? n : 1, sizeof(*c->off));
	uint64_t off = hend;
	for (uint64_t i = 0; i < n && !rc; i++) {
		const unsigned char *p = t + SKIP_HDR + i * ENTRY_SIZE;
		struct entry *e = &c->e[i];
		e->csize = get_le64(p);
		e->dsize = get_le64(p + 8);
		e->ccrc = get_le32(p + 16);
		e->dcrc = get_le32(p + 20);
		c->off[i] = off;
		if (e->csize > tstart - off || e->csize == 0)
			rc = error("'%s': corrupt seek table: chunk %" PRIu64 " of %" PRIu64
				   " bytes runs past the table", c->path, i, e->csize);
		else if (e->dsize / MAX_RATIO > e->csize)
			rc = error("'%s': corrupt seek table: chunk %" PRIu64 " claims %" PRIu64
				   " bytes from %" PRIu64, c->path, i, e->dsize, e->csize);
		else {
			off += e->csize;
			c->data_size += e->dsize;
		}
	}
	if (!rc && off != tstart)
		rc = error("'%s': corrupt seek table: chunks end at byte %" PRIu64
			   ", the table starts at %" PRIu64, c->path, off, tstart);
	free(t);
	return rc;
}

int container_open(struct container **cp, const char *path, const char magic[8],
		   const char *what)
{
	*cp = NULL;
	struct container *c = xcalloc(1, sizeof(*c));
	c->path = xstrdup(path);
	c->what = xstrdup(what ? what : "container");
	c->fd = open(path, O_RDONLY);
	if (c->fd < 0) {
		error("cannot open '%s': %s", path, strerror(errno));
		container_close(c);
		return -1;
	}
	struct stat st;
	if (fstat(c->fd, &st) || !S_ISREG(st.st_mode)) {
		error("'%s': not a regular file", path);
		container_close(c);
		return -1;
	}
	c->fsize = (uint64_t)st.st_size;
	if (check_header(c, magic) || check_seek_table(c)) {
		container_close(c);
		return -1;
	}
	*cp = c;
	return 0;
}

void container_close(struct container *c)
{
	if (!c)
		return;
	if (c->fd >= 0)
		close(c->fd);
	free(c->path);
	free(c->what);
	free(c->header);
	free(c->e);
	free(c->off);
	free(c);
}

const char *container_path(const struct container *c) { return c->path; }
const char *container_magic(const struct container *c) { return c->magic; }
uint32_t container_version(const struct container *c) { return c->version; }
uint64_t container_nchunks(const struct container *c) { return c->n; }
uint64_t container_file_size(const struct container *c) { return c->fsize; }
uint64_t container_data_size(const struct container *c) { return c->data_size; }

const void *container_header(const struct container *c, size_t *len)
{
	if (len)
		*len = c->header_len;
	return c->header;
}

uint64_t container_chunk_size(const struct container *c, uint64_t i)
{
	return i < c->n ? c->e[i].dsize : 0;
}

uint64_t container_chunk_csize(const struct container *c, uint64_t i)
{
	return i < c->n ? c->e[i].csize : 0;
}

/* Stream chunk i through zstd into out (or nowhere, with out NULL), checking
 * both checksums, both sizes and that the chunk is exactly one frame. Uses
 * bounded memory whatever the chunk size. */
static int read_chunk(struct container *c, uint64_t i, unsigned char *out)
{
	if (i >= c->n)
		return error("'%s': no chunk %" PRIu64 " (the file has %" PRIu64 ")", c->path, i,
			     c->n);
	const struct entry *e = &c->e[i];
	ZSTD_DCtx *d = ZSTD_createDCtx();
	if (!d)
		return error("'%s': cannot create a zstd decompression context", c->path);
	size_t isize = ZSTD_DStreamInSize(), osize = ZSTD_DStreamOutSize();
	unsigned char *ibuf = xmalloc(isize), *obuf = xmalloc(osize);
	uint64_t pos = 0, dpos = 0;
	uint32_t ccrc = 0, dcrc = 0;
	size_t zret = 1, zerr = 0;
	const char *why = NULL;
	int rc = 0;
	ZSTD_inBuffer in = {ibuf, 0, 0};
	for (;;) {
		if (in.pos == in.size && pos < e->csize) {
			size_t n = (size_t)MIN((uint64_t)isize, e->csize - pos);
			if ((rc = read_at(c, c->off[i] + pos, ibuf, n)))
				break;
			ccrc = crc32c(ccrc, ibuf, n);
			pos += n;
			in = (ZSTD_inBuffer){ibuf, n, 0};
		}
		if (in.pos == in.size && pos == e->csize && zret == 0)
			break; /* the frame ended with the chunk's bytes */
		ZSTD_outBuffer ob = {obuf, osize, 0};
		size_t in_before = in.pos;
		zret = ZSTD_decompressStream(d, &ob, &in);
		if (ZSTD_isError(zret)) {
			zerr = zret;
			break;
		}
		if (ob.pos > e->dsize - dpos) {
			why = "it decompresses to more bytes than the seek table says";
			break;
		}
		if (out && ob.pos)
			memcpy(out + dpos, obuf, ob.pos);
		dcrc = crc32c(dcrc, obuf, ob.pos);
		dpos += ob.pos;
		if (zret == 0 && (in.pos < in.size || pos < e->csize)) {
			why = "bytes follow the end of its zstd frame";
			break;
		}
		if (zret != 0 && pos == e->csize && in.pos == in.size && in.pos == in_before &&
		    ob.pos == 0) {
			why = "its zstd frame is incomplete";
			break;
		}
	}
	/* Checksum the rest of the compressed bytes, so that corruption is
	 * reported as such whatever zstd made of it. */
	while (!rc && pos < e->csize) {
		size_t n = (size_t)MIN((uint64_t)isize, e->csize - pos);
		if ((rc = read_at(c, c->off[i] + pos, ibuf, n)))
			break;
		ccrc = crc32c(ccrc, ibuf, n);
		pos += n;
	}
	if (rc)
		;
	else if (ccrc != e->ccrc)
		rc = error("'%s': chunk %" PRIu64 " checksum mismatch (file is corrupt)", c->path,
			   i);
	else if (zerr)
		rc = error("'%s': chunk %" PRIu64 " is corrupt: zstd: %s", c->path, i,
			   ZSTD_getErrorName(zerr));
	else if (why)
		rc = error("'%s': chunk %" PRIu64 " is corrupt: %s", c->path, i, why);
	else if (dpos != e->dsize)
		rc = error("'%s': chunk %" PRIu64 " is corrupt: it holds %" PRIu64
			   " bytes, the seek table says %" PRIu64, c->path, i, dpos, e->dsize);
	else if (dcrc != e->dcrc)
		rc = error("'%s': chunk %" PRIu64 " checksum mismatch (file is corrupt)", c->path,
			   i);
	ZSTD_freeDCtx(d);
	free(ibuf);
	free(obuf);
	return rc;
}

int container_read_chunk(struct container *c, uint64_t i, void *out)
{
	return read_chunk(c, i, out);
}

int container_verify(struct container *c)
{
	for (uint64_t i = 0; i < c->n; i++)
		if (read_chunk(c, i, NULL))
			return -1;
	return 0;
}

int container_peek(const char *path, char magic[8])
{
	FILE *fp = fopen(path, "rb");
	if (!fp)
		return error("cannot open '%s': %s", path, strerror(errno));
	unsigned char b[16];
	size_t n = fread(b, 1, sizeof(b), fp);
	int bad = ferror(fp);
	fclose(fp);
	if (bad)
		return error("cannot read '%s': %s", path, strerror(errno));
	if (n < sizeof(b) || get_le32(b) != HEADER_FRAME_MAGIC)
		return 0;
	memcpy(magic, b + 8, 8);
	return 1;
}
