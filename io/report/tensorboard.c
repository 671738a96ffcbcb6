/* tensorboard.c - TensorBoard scalar event files. See tensorboard.h. */
#include "tensorboard.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../util.h"

/* protocol buffer wire format: varints, fixed 64/32-bit, length-delimited */
static void pb_varint(struct buf *b, uint64_t v)
{
	unsigned char c[10];
	int n = 0;
	do {
		c[n] = (unsigned char)(v & 0x7f);
		v >>= 7;
		if (v)
			c[n] |= 0x80;
		n++;
	} while (v);
	buf_append(b, c, (size_t)n);
}

static void pb_key(struct buf *b, int field, int wire)
{
	pb_varint(b, (uint64_t)field << 3 | (uint64_t)wire);
}

static void pb_bytes(struct buf *b, int field, const void *p, size_t n)
{
	pb_key(b, field, 2);
	pb_varint(b, n);
	buf_append(b, p, n);
}

static void pb_double(struct buf *b, int field, double v)
{
	unsigned char c[8];
	uint64_t u;
	memcpy(&u, &v, 8);
	put_le64(c, u);
	pb_key(b, field, 1);
	buf_append(b, c, 8);
}

static void pb_float(struct buf *b, int field, float v)
{
	unsigned char c[4];
	uint32_t u;
	memcpy(&u, &v, 4);
	put_le32(c, u);
	pb_key(b, field, 5);
	buf_append(b, c, 4);
}

static uint32_t masked_crc(const void *p, size_t n)
{
	uint32_t c = crc32c(0, p, n);
	return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

/* One TFRecord around data. */
static int write_record(struct tb_writer *tb, const struct buf *data)
{
	unsigned char head[12], tail[4];
	put_le64(head, data->len);
	put_le32(head + 8, masked_crc(head, 8));
	put_le32(tail, masked_crc(data->data, data->len));
	if (fwrite(head, 1, 12, tb->fp) != 12 ||
	    fwrite(data->data, 1, data->len, tb->fp) != data->len ||
	    fwrite(tail, 1, 4, tb->fp) != 4 || fflush(tb->fp))
		return error("cannot write '%s': %s", tb->path, strerror(errno));
	return 0;
}

int tb_open(struct tb_writer *tb, const char *dir)
{
	memset(tb, 0, sizeof(*tb));
	if (mkdir(dir, 0755) && errno != EEXIST)
		return error("cannot create log.tensorboard directory '%s': %s", dir,
			     strerror(errno));
	char host[64] = "localhost";
	gethostname(host, sizeof(host) - 1);
	size_t n = strlen(dir) + strlen(host) + 80;
	tb->path = xmalloc(n);
	snprintf(tb->path, n, "%s/events.out.tfevents.%lld.%s.%ld", dir, (long long)time(NULL),
		 host, (long)getpid());
	/* "x": a new file, never another run's */
	if (!(tb->fp = fopen(tb->path, "wbx"))) {
		int rc = error("cannot create '%s': %s", tb->path, strerror(errno));
		free(tb->path);
		tb->path = NULL;
		return rc;
	}
	struct buf ev = {0};
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	pb_double(&ev, 1, (double)ts.tv_sec + ts.tv_nsec * 1e-9);
	pb_bytes(&ev, 3, "brain.Event:2", 13);
	int rc = write_record(tb, &ev);
	buf_free(&ev);
	if (rc)
		tb_close(tb);
	return rc;
}

int tb_scalar(struct tb_writer *tb, const char *tag, long step, double wall_time, float value)
{
	if (!tb->fp)
		return 0;
	struct buf val = {0}, sum = {0}, ev = {0};
	pb_bytes(&val, 1, tag, strlen(tag));
	pb_float(&val, 2, value);
	pb_bytes(&sum, 1, val.data, val.len);
	pb_double(&ev, 1, wall_time);
	pb_key(&ev, 2, 0);
	pb_varint(&ev, (uint64_t)step);
	pb_bytes(&ev, 5, sum.data, sum.len);
	int rc = write_record(tb, &ev);
	buf_free(&val);
	buf_free(&sum);
	buf_free(&ev);
	return rc;
}

void tb_close(struct tb_writer *tb)
{
	if (tb->fp)
		fclose(tb->fp);
	free(tb->path);
	memset(tb, 0, sizeof(*tb));
}

void tb_discard(struct tb_writer *tb)
{
	if (tb->fp && tb->path)
		unlink(tb->path);
	tb_close(tb);
}
