/* test_dist_abort.c - dist_abort, the end of a job that a peer's failure
 * stopped mid-segment (sched/comm/dist.h): the process exits 1 with every
 * output stream written out, and without exit's teardown, which can wait
 * for a GPU whose NCCL kernels wait for peers that wait for this process
 * (an atexit handler stands for that teardown here: it must not run). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../io/util.h"
#include "../../sched/comm/dist.h"
#include "../test.h"

static int teardown_fd = -1;

static void teardown(void)
{
	if (write(teardown_fd, "T", 1) != 1)
		_exit(4);
}

TEST(abort_writes_its_streams_and_skips_the_teardown)
{
	int out[2], torn[2];
	CHECK(pipe(out) == 0 && pipe(torn) == 0);
	fflush(NULL); /* nothing of the parent's twice */
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		close(out[0]);
		close(torn[0]);
		teardown_fd = torn[1];
		FILE *f = fdopen(out[1], "w");
		if (!f || setvbuf(f, NULL, _IOFBF, 4096) || atexit(teardown))
			_exit(3);
		fprintf(f, "the last metrics line\n"); /* buffered, not written yet */
		dist_abort();
	}
	close(out[1]);
	close(torn[1]);
	int status = 0;
	CHECK(waitpid(pid, &status, 0) == pid);
	CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 1, "status %d", status);
	char buf[64] = "", t = 0;
	ssize_t n = read(out[0], buf, sizeof(buf) - 1);
	CHECK_MSG(n > 0 && !strcmp(buf, "the last metrics line\n"), "the stream lost its line");
	CHECK_MSG(read(torn[0], &t, 1) == 0, "exit's teardown ran");
	close(out[0]);
	close(torn[0]);
}
