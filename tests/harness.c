/* harness.c - registry and main() for unit-test binaries (see test.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../io/util.h"
#include "../kernels/backend.h"
#include "test.h"

struct test_entry {
	const char *name;
	test_fn fn;
};
static struct test_entry tests[512];
static int n_tests;
static int cur_failed, cur_skipped;
static char cur_msg[2048];
static char tmpdir[256];

void test_register(const char *name, test_fn fn)
{
	if (n_tests < (int)(sizeof(tests) / sizeof(tests[0])))
		tests[n_tests++] = (struct test_entry){name, fn};
}

void test_fail(const char *file, int line, const char *fmt, ...)
{
	char msg[1536];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (!cur_failed)
		snprintf(cur_msg, sizeof(cur_msg), "%s:%d: %s", file, line, msg);
	cur_failed = 1;
}

void test_skip(const char *why)
{
	cur_skipped = 1;
	snprintf(cur_msg, sizeof(cur_msg), "%s", why);
}

int test_failed(void) { return cur_failed; }

const char *test_tmpdir(void)
{
	if (!tmpdir[0]) {
		const char *base = getenv("TMPDIR");
		snprintf(tmpdir, sizeof(tmpdir), "%s/unitXXXXXX", base ? base : "/tmp");
		if (!mkdtemp(tmpdir)) {
			perror("mkdtemp");
			exit(1);
		}
	}
	return tmpdir;
}

char *test_path(const char *name)
{
	static char p[8][512];
	static int k;
	k = (k + 1) % 8;
	snprintf(p[k], sizeof(p[k]), "%s/%s", test_tmpdir(), name);
	return p[k];
}

int test_write_file(const char *path, const void *p, size_t n)
{
	FILE *fp = fopen(path, "wb");
	if (!fp)
		return -1;
	int rc = fwrite(p, 1, n, fp) == n ? 0 : -1;
	return fclose(fp) || rc;
}

const char *test_data(const char *name)
{
	static char path[1024];
	const char *dir = getenv("TESTDATA");
	snprintf(path, sizeof(path), "%s/%s", dir ? dir : "testdata", name);
	return path;
}

const struct backend *test_backend(void)
{
	static const struct backend *be;
	if (!be) {
		const char *name = getenv("ASYNCPP_TEST_DEVICE");
		be = backend_by_name(name && *name ? name : "cpu");
		if (!be) {
			printf("FAIL ASYNCPP_TEST_DEVICE=%s: %s\n", name, last_error());
			exit(1);
		}
	}
	return be;
}

static void cleanup(void)
{
	if (tmpdir[0]) {
		char cmd[512];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
		if (system(cmd)) {
		}
	}
}

int main(int argc, char **argv)
{
	atexit(cleanup);
	int failed = 0;
	for (int i = 0; i < n_tests; i++) {
		if (argc > 1 && strcmp(argv[1], tests[i].name))
			continue;
		cur_failed = cur_skipped = 0;
		cur_msg[0] = 0;
		tests[i].fn();
		if (cur_failed) {
			printf("FAIL %s: %s\n", tests[i].name, cur_msg);
			failed++;
		} else if (cur_skipped) {
			printf("SKIP %s: %s\n", tests[i].name, cur_msg);
		} else {
			printf("PASS %s\n", tests[i].name);
		}
		fflush(stdout);
	}
	return failed ? 1 : 0;
}
