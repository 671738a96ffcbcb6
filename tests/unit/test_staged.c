/* test_staged.c - a signal leaves no staged output (io/staged.h).
 *
 * Each test forks a child that stages files the way the writers do
 * (atomic files, a staged folder with a file committed into it), then is
 * ended by a signal; the parent checks that the child died by that signal,
 * that what it staged is gone and that nothing else was touched. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../io/staged.h"
#include "../../io/util.h"
#include "../test.h"

static int exists(const char *path)
{
	struct stat st;
	return !lstat(path, &st);
}

/* The child's part of signal_removes_what_was_staged: dies by sig. */
static void stage_then_die(int sig, const char *dir, const char *keep)
{
	staged_on_signals();
	struct atomic_file a, b;
	/* a file being written (its temporary) */
	if (atomic_open(&a, test_path("out.bin")) || atomic_write(&a, "abc", 3))
		_exit(3);
	fflush(a.fp);
	/* a staged folder holding a committed file and one being written */
	staged_add(dir, 1);
	if (mkdir(dir, 0777))
		_exit(4);
	char *done = path_join(dir, "model.safetensors"), *doing = path_join(dir, "config.json");
	if (atomic_write_file(done, "x", 1) || atomic_open(&b, doing))
		_exit(5);
	/* a file committed outside any staged folder is in place: kept */
	if (atomic_write_file(keep, "kept", 4))
		_exit(6);
	raise(sig);
	_exit(7); /* not reached: the handler re-raises with the default action */
}

static int run_child(int sig, const char *dir, const char *keep)
{
	pid_t pid = fork();
	if (pid == 0)
		stage_then_die(sig, dir, keep);
	int status = 0;
	if (pid < 0 || waitpid(pid, &status, 0) != pid)
		return -1;
	return status;
}

static int no_entry_starting(const char *prefix)
{
	char cmd[1024];
	snprintf(cmd, sizeof(cmd), "ls -a '%s' | grep -q '^%s'", test_tmpdir(), prefix);
	return system(cmd) != 0;
}

TEST(signal_removes_what_was_staged)
{
	static const int sigs[] = {SIGTERM, SIGINT, SIGHUP};
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
		char *dir = test_path(".partial.1"), *keep = test_path("keep.txt");
		int status = run_child(sigs[i], dir, keep);
		CHECK(status != -1);
		CHECK(WIFSIGNALED(status) && WTERMSIG(status) == sigs[i]);
		CHECK(!exists(dir));
		CHECK(no_entry_starting("out.bin"));
		CHECK(exists(keep));
		unlink(keep);
	}
}

TEST(nested_folders_go_inner_first)
{
	/* export's case: the output folder it made is staged first, then its
	 * staging folder inside it, holding a committed file; both go */
	char *out = test_path("made_out");
	char *stage = path_join(out, ".partial.1");
	pid_t pid = fork();
	if (pid == 0) {
		staged_on_signals();
		staged_add(out, 1);
		staged_add(stage, 1);
		char *file = path_join(stage, "config.json");
		if (mkdir(out, 0777) || mkdir(stage, 0777) || atomic_write_file(file, "{}", 2))
			_exit(3);
		raise(SIGTERM);
		_exit(7);
	}
	int status = 0;
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
	CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
	CHECK(!exists(out));
	free(stage);
}

TEST(a_folder_with_other_files_is_kept)
{
	/* rmdir only: a staged folder that holds what the child did not
	 * write keeps it, and is kept */
	char *dir = test_path("made");
	char *user = path_join(dir, "notes.txt");
	pid_t pid = fork();
	if (pid == 0) {
		staged_on_signals();
		staged_add(dir, 1);
		if (mkdir(dir, 0777) || test_write_file(user, "mine", 4))
			_exit(3);
		raise(SIGTERM);
		_exit(7);
	}
	int status = 0;
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
	CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
	CHECK(exists(user));
	unlink(user);
	rmdir(dir);
	free(user);
}

TEST(dropped_and_ignored_are_left_alone)
{
	/* what was dropped (moved into place) stays; a signal ignored by
	 * whoever started the process (nohup) stays ignored */
	char *path = test_path("placed.bin");
	pid_t pid = fork();
	if (pid == 0) {
		signal(SIGHUP, SIG_IGN);
		staged_on_signals();
		staged_add(path, 0);
		if (test_write_file(path, "x", 1))
			_exit(3);
		staged_drop(path);
		raise(SIGHUP); /* ignored */
		raise(SIGTERM);
		_exit(7);
	}
	int status = 0;
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
	CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
	CHECK(exists(path));
	unlink(path);
}

TEST(a_file_size_limit_is_a_named_write_error)
{
	/* SIGXFSZ would kill the writer with its temporary in place; it is
	 * a write error instead, named, and the temporary goes */
	char *path = test_path("big.bin");
	pid_t pid = fork();
	if (pid == 0) {
		staged_on_signals();
		struct rlimit rl = {4096, 4096};
		if (setrlimit(RLIMIT_FSIZE, &rl))
			_exit(3);
		static char block[65536];
		set_error_quiet(1);
		int rc = atomic_write_file(path, block, sizeof(block));
		const char *msg = last_error();
		_exit(rc == -1 && strstr(msg, "big.bin") && strstr(msg, strerror(EFBIG)) ? 0 : 8);
	}
	int status = 0;
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK(!exists(path));
	CHECK(no_entry_starting("big.bin"));
}

TEST(slots_run_out_without_harm)
{
	/* more paths than slots: the first STAGED_MAX are removed, the rest
	 * are left as a killed writer leaves them today, and nothing fails */
	pid_t pid = fork();
	if (pid == 0) {
		staged_on_signals();
		for (int i = 0; i < STAGED_MAX + 8; i++) {
			char name[32];
			snprintf(name, sizeof(name), "many.%d", i);
			char *p = test_path(name);
			staged_add(p, 0);
			if (test_write_file(p, "x", 1))
				_exit(3);
		}
		raise(SIGTERM);
		_exit(7);
	}
	int status = 0;
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
	CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
	int left = 0;
	for (int i = 0; i < STAGED_MAX + 8; i++) {
		char name[32];
		snprintf(name, sizeof(name), "many.%d", i);
		char *p = test_path(name);
		left += exists(p);
		unlink(p);
	}
	CHECK(left == 8);
}
