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

static int no_entry_starting(const char *prefix)
{
	char cmd[1024];
	snprintf(cmd, sizeof(cmd), "ls -a '%s' | grep -q '^%s'", test_tmpdir(), prefix);
	return system(cmd) != 0;
}

/* Run body in a child with the handler installed; a body that returns
 * (having staged what it stages) is then sent sig; a failed set-up exits
 * 3. The child's wait status, or -1. */
static int in_child(int (*body)(void), int sig)
{
	test_tmpdir(); /* made before the fork: the child's paths are the parent's */
	pid_t pid = fork();
	if (pid == 0) {
		staged_on_signals();
		if (body())
			_exit(3);
		raise(sig);
		_exit(7); /* not reached: the handler re-raises with the default action */
	}
	int status = 0;
	return pid > 0 && waitpid(pid, &status, 0) == pid ? status : -1;
}

static int died_by(int status, int sig)
{
	return status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == sig;
}

/* a file being written (its temporary); a staged folder holding a
 * committed file and one being written; a file committed outside any
 * staged folder, which is in place and kept */
static int stage_the_writers_way(void)
{
	struct atomic_file a, b;
	char *dir = test_path(".partial.1");
	if (atomic_open(&a, test_path("out.bin")) || atomic_write(&a, "abc", 3) || fflush(a.fp))
		return -1;
	staged_add(dir, 1);
	if (mkdir(dir, 0777))
		return -1;
	char *done = path_join(dir, "model.safetensors"), *doing = path_join(dir, "config.json");
	return atomic_write_file(done, "x", 1) || atomic_open(&b, doing) ||
	       atomic_write_file(test_path("keep.txt"), "kept", 4);
}

TEST(signal_removes_what_was_staged)
{
	static const int sigs[] = {SIGTERM, SIGINT, SIGHUP};
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
		CHECK(died_by(in_child(stage_the_writers_way, sigs[i]), sigs[i]));
		CHECK(!exists(test_path(".partial.1")));
		CHECK(no_entry_starting("out.bin"));
		CHECK(exists(test_path("keep.txt")));
		unlink(test_path("keep.txt"));
	}
}

/* export's case: the output folder it made is staged first, then its
 * staging folder inside it, holding a committed file */
static int stage_nested_folders(void)
{
	char *out = test_path("made_out"), *stage = path_join(out, ".partial.1");
	staged_add(out, 1);
	staged_add(stage, 1);
	return mkdir(out, 0777) || mkdir(stage, 0777) ||
	       atomic_write_file(path_join(stage, "config.json"), "{}", 2);
}

TEST(nested_folders_go_inner_first)
{
	CHECK(died_by(in_child(stage_nested_folders, SIGTERM), SIGTERM));
	CHECK(!exists(test_path("made_out")));
}

/* a staged folder that holds a file the command did not stage */
static int stage_a_folder_with_a_users_file(void)
{
	char *dir = test_path("made");
	staged_add(dir, 1);
	return mkdir(dir, 0777) || test_write_file(path_join(dir, "notes.txt"), "mine", 4);
}

TEST(a_folder_with_other_files_is_kept)
{
	/* rmdir only: the folder keeps the file, and is kept */
	char *user = path_join(test_path("made"), "notes.txt");
	CHECK(died_by(in_child(stage_a_folder_with_a_users_file, SIGTERM), SIGTERM));
	CHECK(exists(user));
	unlink(user);
	rmdir(test_path("made"));
	free(user);
}

/* a file staged then dropped (moved into place); SIGHUP ignored as nohup
 * leaves it, before the handler is installed */
static int drop_and_ignore(void)
{
	char *path = test_path("placed.bin");
	staged_add(path, 0);
	if (test_write_file(path, "x", 1))
		return -1;
	staged_drop(path);
	signal(SIGHUP, SIG_IGN);
	staged_on_signals(); /* again: SIGHUP is now ignored, and stays so */
	raise(SIGHUP);
	return 0;
}

TEST(dropped_and_ignored_are_left_alone)
{
	CHECK(died_by(in_child(drop_and_ignore, SIGTERM), SIGTERM));
	CHECK(exists(test_path("placed.bin")));
	unlink(test_path("placed.bin"));
}

/* SIGXFSZ would kill the writer with its temporary in place; it is a write
 * error instead, named, and the temporary goes */
static int write_past_the_size_limit(void)
{
	struct rlimit rl = {4096, 4096};
	if (setrlimit(RLIMIT_FSIZE, &rl))
		return -1;
	static char block[65536];
	set_error_quiet(1);
	int rc = atomic_write_file(test_path("big.bin"), block, sizeof(block));
	const char *msg = last_error();
	_exit(rc == -1 && strstr(msg, "big.bin") && strstr(msg, strerror(EFBIG)) ? 0 : 8);
}

TEST(a_file_size_limit_is_a_named_write_error)
{
	int status = in_child(write_past_the_size_limit, SIGTERM);
	CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK(!exists(test_path("big.bin")));
	CHECK(no_entry_starting("big.bin"));
}

/* more paths than slots */
static int stage_too_many(void)
{
	for (int i = 0; i < STAGED_MAX + 8; i++) {
		char name[32];
		snprintf(name, sizeof(name), "many.%d", i);
		staged_add(test_path(name), 0);
		if (test_write_file(test_path(name), "x", 1))
			return -1;
	}
	return 0;
}

TEST(slots_run_out_without_harm)
{
	/* the first STAGED_MAX are removed, the rest are left as a killed
	 * writer leaves them, and nothing fails */
	CHECK(died_by(in_child(stage_too_many, SIGTERM), SIGTERM));
	int left = 0;
	for (int i = 0; i < STAGED_MAX + 8; i++) {
		char name[32];
		snprintf(name, sizeof(name), "many.%d", i);
		left += exists(test_path(name));
		unlink(test_path(name));
	}
	CHECK(left == 8);
}
