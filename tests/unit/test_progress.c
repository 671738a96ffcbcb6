/* test_progress.c - when a phase's progress line is drawn (cmd/progress.h),
 * on an injected clock: not before PROGRESS_AFTER seconds, at most every
 * PROGRESS_EVERY seconds, erased at the end only when it was drawn. */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../cmd/progress.h"
#include "../test.h"

TEST(progress_waits_for_the_delay)
{
	struct progress p;
	char line[256];
	progress_init(&p, 100.0, 2.0, 80, "writing x.ckpt");
	CHECK(!progress_line(&p, 100.0, line, sizeof(line)));
	CHECK(!progress_line(&p, 101.9, line, sizeof(line)));
	CHECK(!strcmp(progress_erase(&p), "")); /* a fast phase leaves nothing */
	CHECK(progress_line(&p, 102.0, line, sizeof(line)));
	CHECK_MSG(!strcmp(line, "\rasyncpp: writing x.ckpt... 2 s\033[K"), "%s", line);
	CHECK(!strcmp(progress_erase(&p), "\r\033[K"));
}

TEST(progress_is_rewritten_a_few_times_a_second_at_most)
{
	struct progress p;
	char line[256];
	progress_init(&p, 0.0, 2.0, 0, "loading");
	CHECK(progress_line(&p, 3.0, line, sizeof(line)));
	CHECK(!progress_line(&p, 3.0 + PROGRESS_EVERY / 2, line, sizeof(line)));
	CHECK(progress_line(&p, 3.0 + PROGRESS_EVERY, line, sizeof(line)));
	CHECK(!progress_line(&p, 3.0 + PROGRESS_EVERY * 1.5, line, sizeof(line)));
	CHECK(progress_line(&p, 12.4, line, sizeof(line)));
	CHECK_MSG(!strcmp(line, "\rasyncpp: loading... 12 s\033[K"), "%s", line);
}

TEST(progress_after_zero_draws_at_once)
{
	struct progress p;
	char line[256];
	progress_init(&p, 5.0, 0.0, 80, "x");
	CHECK(progress_line(&p, 5.0, line, sizeof(line)));
}

TEST(progress_fits_one_row_of_the_terminal)
{
	struct progress p;
	char line[256];
	/* 30 columns: "asyncpp: " (9), "... 12 s" (8), 12 left for "..." + 9 */
	progress_init(&p, 0.0, 2.0, 30, "writing runs/long/ckpt-00002000.ckpt");
	CHECK(progress_line(&p, 12.0, line, sizeof(line)));
	CHECK_MSG(!strcmp(line, "\rasyncpp: ...2000.ckpt... 12 s\033[K"), "%s", line);
	CHECK(strlen(line) - strlen("\r\033[K") == 29);
	progress_init(&p, 0.0, 2.0, 10, "narrow"); /* no room: the seconds alone */
	CHECK(progress_line(&p, 3.0, line, sizeof(line)));
	CHECK_MSG(!strcmp(line, "\rasyncpp: ...... 3 s\033[K"), "%s", line);
}

TEST(progress_after_from_the_environment)
{
	setenv("ASYNCPP_PROGRESS_AFTER", "0", 1);
	CHECK(progress_after_env() == 0.0);
	setenv("ASYNCPP_PROGRESS_AFTER", "0.5", 1);
	CHECK(progress_after_env() == 0.5);
	const char *bad[] = {"", "x", "-1", "2s"};
	for (int i = 0; i < 4; i++) {
		setenv("ASYNCPP_PROGRESS_AFTER", bad[i], 1);
		CHECK_MSG(progress_after_env() == PROGRESS_AFTER, "'%s'", bad[i]);
	}
	unsetenv("ASYNCPP_PROGRESS_AFTER");
	CHECK(progress_after_env() == PROGRESS_AFTER);
}

TEST(progress_off_a_terminal_draws_nothing)
{
	/* the tests' standard error is a file: begin starts no thread and
	 * end writes nothing */
	struct progress p;
	char path[512];
	snprintf(path, sizeof(path), "%s/progress-stderr.txt", test_tmpdir());
	fflush(stderr);
	int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	CHECK(saved >= 0 && fd >= 0 && dup2(fd, 2) == 2);
	close(fd);
	setenv("ASYNCPP_PROGRESS_AFTER", "0", 1);
	progress_begin(&p, 1, "phase %d", 1);
	int on = p.on;
	usleep(300 * 1000); /* past the delay and several redraws */
	progress_end(&p);
	unsetenv("ASYNCPP_PROGRESS_AFTER");
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	struct stat sb;
	CHECK(!on && !strcmp(p.what, "phase 1"));
	CHECK_MSG(!stat(path, &sb) && sb.st_size == 0, "%lld bytes drawn",
		  (long long)sb.st_size);
}
