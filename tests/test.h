/* test.h - a tiny unit-test harness.
 *
 *   TEST(name) { CHECK(x == 1); CHECK_NEAR(a, b, 1e-5); }
 *
 * Each tests/unit/NAME.c becomes a binary; it prints one line per test,
 * "PASS name", "FAIL name: why" or "SKIP name: why", which tests/run counts.
 * Run one binary with a test name to run only that test. Tests find the
 * project through the environment: ASYNCPP (the binary), TESTDATA (the
 * fixtures folder) and TMPDIR (a scratch folder of their own).
 */
#ifndef ASYNCPP_TEST_H
#define ASYNCPP_TEST_H

#include <math.h>
#include <stdio.h>

typedef void (*test_fn)(void);
void test_register(const char *name, test_fn fn);
void test_fail(const char *file, int line, const char *fmt, ...);
void test_skip(const char *why);
int test_failed(void);
/* Scratch directory for this test binary (created, removed at exit). */
const char *test_tmpdir(void);
/* test_tmpdir()/name; the last 8 results stay valid */
char *test_path(const char *name);
/* Write n bytes to path: 0, or -1 */
int test_write_file(const char *path, const void *p, size_t n);
/* Path of a file in testdata/. */
const char *test_data(const char *name);
/* The backend the device-independent tests run on: ASYNCPP_TEST_DEVICE
 * (cpu when unset; cuda on a GPU machine, see tools/gpu-check). A device
 * that cannot be served ends the binary with a FAIL line, never a pass on
 * the CPU in its place. */
struct backend;
const struct backend *test_backend(void);

#define TEST(name)                                                          \
	static void name(void);                                             \
	__attribute__((constructor)) static void register_##name(void)      \
	{                                                                   \
		test_register(#name, name);                                 \
	}                                                                   \
	static void name(void)

#define CHECK(cond)                                                         \
	do {                                                                \
		if (!(cond)) {                                              \
			test_fail(__FILE__, __LINE__, "%s", #cond);         \
			return;                                             \
		}                                                           \
	} while (0)

#define CHECK_MSG(cond, ...)                                                \
	do {                                                                \
		if (!(cond)) {                                              \
			test_fail(__FILE__, __LINE__, __VA_ARGS__);         \
			return;                                             \
		}                                                           \
	} while (0)

#define CHECK_NEAR(a, b, tol)                                               \
	do {                                                                \
		double a_ = (a), b_ = (b);                                  \
		if (!(fabs(a_ - b_) <= (tol))) {                            \
			test_fail(__FILE__, __LINE__, "%s = %.9g, %s = %.9g, tol %g", \
				  #a, a_, #b, b_, (double)(tol));           \
			return;                                             \
		}                                                           \
	} while (0)

#define SKIP(why)                                                           \
	do {                                                                \
		test_skip(why);                                             \
		return;                                                     \
	} while (0)

#endif
