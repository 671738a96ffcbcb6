/* util.h - errors, checked allocation, atomic files, checksums, timing.
 *
 * Error conventions (GNU style, see STYLE.md):
 *   die()   prints "asyncpp: MSG", removes the files io/staged.h tracks
 *           and exits 1; only cmd/ and main call it.
 *   error() prints "asyncpp: MSG" and returns -1, for library layers.
 *   bug()   prints "asyncpp: internal error: MSG (a bug in asyncpp)",
 *           removes the staged files and aborts: a broken invariant of
 *           the program itself, never bad input, a full disk or a failed
 *           peer (those are error() and -1), so any layer may call it.
 *   Library functions return 0 on success and -1 on failure after calling
 *   error() with a message that names the file (and line) involved.
 */
#ifndef ASYNCPP_UTIL_H
#define ASYNCPP_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define ASYNCPP_VERSION "0.1.0"

#if defined(__GNUC__)
#define NORETURN __attribute__((noreturn))
#define PRINTF_LIKE(f, a) __attribute__((format(printf, f, a)))
#else
#define NORETURN
#define PRINTF_LIKE(f, a)
#endif

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* Exit codes shared by every command. */
enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

NORETURN void die(const char *fmt, ...) PRINTF_LIKE(1, 2);
NORETURN void die_usage(const char *fmt, ...) PRINTF_LIKE(1, 2); /* exit 2 */
NORETURN void bug(const char *fmt, ...) PRINTF_LIKE(1, 2);       /* abort() */
int error(const char *fmt, ...) PRINTF_LIKE(1, 2);                /* returns -1 */
void warning(const char *fmt, ...) PRINTF_LIKE(1, 2);
/* Tests silence error() output while checking that a reader rejects input. */
void set_error_quiet(int quiet);
/* The last message error() produced (also when quiet), for tests. */
const char *last_error(void);
/* A line drawn in place on stderr (cmd/progress.h) registers GUARD: each
 * message of error(), warning() and die() is printed between GUARD(ARG, 1)
 * (erase the line, hold it off) and GUARD(ARG, 0), so that it starts a line
 * of its own; NULL unregisters, once no message is being printed. */
void set_report_guard(void (*guard)(void *arg, int before), void *arg);

/* Checked allocation: die on out-of-memory or size_t overflow. */
void *xmalloc(size_t n);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
/* "dir/name" (no second slash when dir ends in one); malloc'ed. */
char *path_join(const char *dir, const char *name);
size_t st_mult(size_t a, size_t b); /* a*b, die on overflow */
size_t st_add(size_t a, size_t b);  /* a+b, die on overflow */
/* 64-byte aligned, zeroed; free with free(). */
void *xalloc_aligned(size_t n);

/* Growable byte buffer. */
struct buf {
	unsigned char *data;
	size_t len, cap;
};
void buf_reserve(struct buf *b, size_t extra);
void buf_append(struct buf *b, const void *p, size_t n);
void buf_free(struct buf *b);

/* Read a whole file into *out (NUL-terminated, len excludes the NUL).
 * path "-" reads stdin. Returns 0, or -1 with error() naming the file. */
int read_file(const char *path, struct buf *out);

/* Atomic file writing: data goes to "PATH.tmp.PID", is fsync'ed, then
 * renamed over PATH and the directory fsync'ed; until then a signal removes
 * it (staged.h). On any failure the temp file is removed and PATH is left
 * untouched. */
struct atomic_file {
	FILE *fp;
	char *path, *tmp_path;
	char *name; /* the file messages name: path, or atomic_open_named's name */
	int failed;
};
int atomic_open(struct atomic_file *af, const char *path);
/* The same, naming name in messages: a file staged under an internal path
 * and moved into place later (tokenize encode's shard pair) by its final
 * name. */
int atomic_open_named(struct atomic_file *af, const char *path, const char *name);
int atomic_write(struct atomic_file *af, const void *p, size_t n);
int atomic_commit(struct atomic_file *af); /* fsync+rename; closes */
/* The whole of p[0..n) as the file path, atomically (the three above). */
int atomic_write_file(const char *path, const void *p, size_t n);
void atomic_abort(struct atomic_file *af); /* remove temp; closes */

/* Checksums. crc32c (Castagnoli) for frames; 64-bit FNV-1a for identities
 * such as the tokenizer hash. */
uint32_t crc32c(uint32_t crc, const void *p, size_t n);
uint64_t fnv1a64(uint64_t h, const void *p, size_t n);
#define FNV1A64_INIT 0xcbf29ce484222325ULL

/* How many of x[0..n) are NaN or infinite; the first one's index in *first
 * (when first is not NULL and there is one). The one test of weights every
 * door shares: checkpoint writes, loads, imports and `asyncpp inspect`. */
size_t floats_nonfinite(const float *x, size_t n, size_t *first);

/* Little-endian encoding helpers, independent of host order. */
void put_le16(unsigned char *p, uint16_t v);
void put_le32(unsigned char *p, uint32_t v);
void put_le64(unsigned char *p, uint64_t v);
uint16_t get_le16(const unsigned char *p);
uint32_t get_le32(const unsigned char *p);
uint64_t get_le64(const unsigned char *p);

/* Monotonic wall time in seconds. */
double now_sec(void);

/* splitmix64/xoshiro-style deterministic RNG; state is one uint64 so it can
 * be checkpointed and derived from (seed, step). */
uint64_t rng_next(uint64_t *state);
float rng_uniform(uint64_t *state);      /* [0,1) */
float rng_normal(uint64_t *state);       /* N(0,1), Box-Muller */
uint64_t rng_mix(uint64_t a, uint64_t b); /* derive a stream from two ints */

/* Progress line on a terminal (stderr); silent when stderr is not a tty. */
int stderr_is_tty(void);

#endif
