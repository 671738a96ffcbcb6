/* util.c - errors, checked allocation, atomic files, checksums, timing. */
#include "util.h"
#include "staged.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int error_quiet;
static char last_error_msg[1024];
/* set_report_guard's: the messages are printed one at a time under report_mu */
static pthread_mutex_t report_mu = PTHREAD_MUTEX_INITIALIZER;
static void (*report_guard)(void *arg, int before);
static void *report_guard_arg;

static void vreport(const char *prefix, const char *fmt, va_list ap)
{
	char msg[1024];
	vsnprintf(msg, sizeof(msg), fmt, ap);
	snprintf(last_error_msg, sizeof(last_error_msg), "%s", msg);
	if (!error_quiet) {
		pthread_mutex_lock(&report_mu);
		if (report_guard)
			report_guard(report_guard_arg, 1);
		fflush(stdout);
		fprintf(stderr, "asyncpp: %s%s\n", prefix, msg);
		if (report_guard)
			report_guard(report_guard_arg, 0);
		pthread_mutex_unlock(&report_mu);
	}
}

void set_report_guard(void (*guard)(void *arg, int before), void *arg)
{
	pthread_mutex_lock(&report_mu);
	report_guard = guard;
	report_guard_arg = arg;
	pthread_mutex_unlock(&report_mu);
}

void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	error_quiet = 0;
	vreport("", fmt, ap);
	va_end(ap);
	staged_remove_all(); /* what it was writing is unfinished (io/staged.h) */
	exit(EXIT_FAIL);
}

void die_usage(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	error_quiet = 0;
	vreport("", fmt, ap);
	va_end(ap);
	staged_remove_all();
	exit(EXIT_USAGE);
}

void bug(const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	error_quiet = 0;
	error("internal error: %s (a bug in asyncpp: please report it)", msg);
	staged_remove_all();
	fflush(stdout);
	abort(); /* a core to debug, and under MPI the launcher ends the job */
}

int error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vreport("", fmt, ap);
	va_end(ap);
	return -1;
}

void warning(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vreport("warning: ", fmt, ap);
	va_end(ap);
}

void set_error_quiet(int quiet) { error_quiet = quiet; }
const char *last_error(void) { return last_error_msg; }

void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p)
		die("out of memory allocating %zu bytes", n);
	return p;
}

void *xcalloc(size_t count, size_t size)
{
	void *p = calloc(count ? count : 1, size ? size : 1);
	if (!p)
		die("out of memory allocating %zu x %zu bytes", count, size);
	return p;
}

void *xrealloc(void *p, size_t n)
{
	p = realloc(p, n ? n : 1);
	if (!p)
		die("out of memory allocating %zu bytes", n);
	return p;
}

char *xstrdup(const char *s)
{
	size_t n = strlen(s) + 1;
	return memcpy(xmalloc(n), s, n);
}

char *path_join(const char *dir, const char *name)
{
	size_t n = strlen(dir) + strlen(name) + 2;
	char *p = xmalloc(n);
	snprintf(p, n, "%s%s%s", dir, *dir && dir[strlen(dir) - 1] == '/' ? "" : "/", name);
	return p;
}

size_t st_mult(size_t a, size_t b)
{
	if (b && a > SIZE_MAX / b)
		die("size overflow: %zu * %zu", a, b);
	return a * b;
}

size_t st_add(size_t a, size_t b)
{
	if (a > SIZE_MAX - b)
		die("size overflow: %zu + %zu", a, b);
	return a + b;
}

void *xalloc_aligned(size_t n)
{
	void *p = NULL;
	size_t rounded = st_add(n, 63) & ~(size_t)63;
	if (posix_memalign(&p, 64, rounded ? rounded : 64))
		die("out of memory allocating %zu bytes", n);
	memset(p, 0, rounded);
	return p;
}

void buf_reserve(struct buf *b, size_t extra)
{
	size_t need = st_add(st_add(b->len, extra), 1);
	if (need <= b->cap)
		return;
	size_t cap = b->cap ? b->cap : 256;
	while (cap < need)
		cap = st_mult(cap, 2);
	b->data = xrealloc(b->data, cap);
	b->cap = cap;
}

void buf_append(struct buf *b, const void *p, size_t n)
{
	buf_reserve(b, n);
	if (n)
		memcpy(b->data + b->len, p, n);
	b->len += n;
	b->data[b->len] = 0;
}

void buf_free(struct buf *b)
{
	free(b->data);
	b->data = NULL;
	b->len = b->cap = 0;
}

int read_file(const char *path, struct buf *out)
{
	int is_stdin = !strcmp(path, "-");
	FILE *fp = is_stdin ? stdin : fopen(path, "rb");
	if (!fp)
		return error("cannot open '%s': %s", path, strerror(errno));
	out->len = 0;
	buf_reserve(out, 0);
	char chunk[1 << 16];
	size_t n;
	while ((n = fread(chunk, 1, sizeof(chunk), fp)) > 0)
		buf_append(out, chunk, n);
	int bad = ferror(fp);
	if (!is_stdin)
		fclose(fp);
	if (bad)
		return error("cannot read '%s': %s", path, strerror(errno));
	out->data[out->len] = 0;
	return 0;
}

int atomic_open(struct atomic_file *af, const char *path)
{
	return atomic_open_named(af, path, path);
}

int atomic_open_named(struct atomic_file *af, const char *path, const char *name)
{
	memset(af, 0, sizeof(*af));
	af->path = xstrdup(path);
	af->name = xstrdup(name);
	size_t n = strlen(path) + 32;
	af->tmp_path = xmalloc(n);
	snprintf(af->tmp_path, n, "%s.tmp.%ld", path, (long)getpid());
	staged_add(af->tmp_path, 0); /* first: a signal after fopen finds it */
	af->fp = fopen(af->tmp_path, "wb");
	if (!af->fp) {
		int e = errno;
		staged_drop(af->tmp_path);
		free(af->path);
		free(af->tmp_path);
		free(af->name);
		af->path = af->tmp_path = af->name = NULL;
		return error("cannot create '%s': %s", name, strerror(e));
	}
	return 0;
}

int atomic_write(struct atomic_file *af, const void *p, size_t n)
{
	if (af->failed)
		return -1;
	if (n && fwrite(p, 1, n, af->fp) != n) {
		af->failed = 1;
		return error("cannot write '%s': %s", af->name, strerror(errno));
	}
	return 0;
}

static void fsync_dir_of(const char *path)
{
	char *dir = xstrdup(path);
	char *slash = strrchr(dir, '/');
	if (slash)
		*(slash == dir ? slash + 1 : slash) = 0;
	else
		strcpy(dir, ".");
	int fd = open(dir, O_RDONLY);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
	free(dir);
}

void atomic_abort(struct atomic_file *af)
{
	if (af->fp)
		fclose(af->fp);
	if (af->tmp_path) {
		unlink(af->tmp_path);
		staged_drop(af->tmp_path);
	}
	free(af->path);
	free(af->tmp_path);
	free(af->name);
	memset(af, 0, sizeof(*af));
}

int atomic_commit(struct atomic_file *af)
{
	int rc = af->failed ? -1 : 0;
	if (!rc && (fflush(af->fp) || fsync(fileno(af->fp))))
		rc = error("cannot write '%s': %s", af->name, strerror(errno));
	if (fclose(af->fp) && !rc)
		rc = error("cannot close '%s': %s", af->name, strerror(errno));
	af->fp = NULL;
	if (!rc)
		staged_commit_to(af->path);
	if (!rc && rename(af->tmp_path, af->path))
		rc = error("cannot rename '%s' to '%s': %s", af->tmp_path, af->path,
			   strerror(errno));
	if (rc) {
		atomic_abort(af);
		return -1;
	}
	staged_drop(af->tmp_path);
	fsync_dir_of(af->path);
	free(af->path);
	free(af->tmp_path);
	free(af->name);
	memset(af, 0, sizeof(*af));
	return 0;
}

int atomic_write_file(const char *path, const void *p, size_t n)
{
	struct atomic_file af;
	if (atomic_open(&af, path))
		return -1;
	if (atomic_write(&af, p, n)) {
		atomic_abort(&af);
		return -1;
	}
	return atomic_commit(&af);
}

size_t floats_nonfinite(const float *x, size_t n, size_t *first)
{
	size_t bad = 0;
	for (size_t i = 0; i < n; i++)
		if (!isfinite(x[i]) && !bad++ && first)
			*first = i;
	return bad;
}

/* crc32c, slicing-by-8: eight table lookups per 8 input bytes. */
static uint32_t crc32c_table[8][256];
static pthread_once_t crc32c_once = PTHREAD_ONCE_INIT;
static void crc32c_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1)));
		crc32c_table[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int t = 1; t < 8; t++)
			crc32c_table[t][i] = (crc32c_table[t - 1][i] >> 8) ^
					     crc32c_table[0][crc32c_table[t - 1][i] & 0xff];
}

uint32_t crc32c(uint32_t crc, const void *p, size_t n)
{
	pthread_once(&crc32c_once, crc32c_init);
	const unsigned char *s = p;
	crc = ~crc;
	while (n && ((uintptr_t)s & 7)) {
		crc = crc32c_table[0][(crc ^ *s++) & 0xff] ^ (crc >> 8);
		n--;
	}
	while (n >= 8) {
		uint32_t lo = crc ^ get_le32(s), hi = get_le32(s + 4);
		crc = crc32c_table[7][lo & 0xff] ^ crc32c_table[6][(lo >> 8) & 0xff] ^
		      crc32c_table[5][(lo >> 16) & 0xff] ^ crc32c_table[4][lo >> 24] ^
		      crc32c_table[3][hi & 0xff] ^ crc32c_table[2][(hi >> 8) & 0xff] ^
		      crc32c_table[1][(hi >> 16) & 0xff] ^ crc32c_table[0][hi >> 24];
		s += 8;
		n -= 8;
	}
	while (n--)
		crc = crc32c_table[0][(crc ^ *s++) & 0xff] ^ (crc >> 8);
	return ~crc;
}

uint64_t fnv1a64(uint64_t h, const void *p, size_t n)
{
	const unsigned char *s = p;
	while (n--) {
		h ^= *s++;
		h *= 0x100000001b3ULL;
	}
	return h;
}

void put_le16(unsigned char *p, uint16_t v) { p[0] = v; p[1] = v >> 8; }
void put_le32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}
void put_le64(unsigned char *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}
uint16_t get_le16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
uint32_t get_le32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}
uint64_t get_le64(const unsigned char *p)
{
	return (uint64_t)get_le32(p) | (uint64_t)get_le32(p + 4) << 32;
}

double now_sec(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t rng_next(uint64_t *state)
{
	/* splitmix64 */
	uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
	return z ^ (z >> 31);
}

float rng_uniform(uint64_t *state)
{
	return (float)(rng_next(state) >> 40) * (1.0f / 16777216.0f);
}

float rng_normal(uint64_t *state)
{
	float u1 = rng_uniform(state), u2 = rng_uniform(state);
	if (u1 < 1e-7f)
		u1 = 1e-7f;
	return sqrtf(-2.0f * logf(u1)) * cosf(6.28318530717958647692f * u2);
}

uint64_t rng_mix(uint64_t a, uint64_t b)
{
	uint64_t s = a * 0x9E3779B97F4A7C15ULL ^ (b + 0x632BE59BD9B4E019ULL);
	rng_next(&s);
	return rng_next(&s);
}

int stderr_is_tty(void) { return isatty(2); }
