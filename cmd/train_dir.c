/* train_dir.c - the run directory's lock, run id and orphaned temporaries.
 * See train_dir.h. */
#include "train_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../io/formats/checkpoint.h"
#include "../io/util.h"
#include "run_common.h"

/* The error for DIR in use: fd holds DIR/train.lock (path), whose owner
 * wrote its pid there; e is flock's errno. Closes fd. */
static int busy_error(const char *dir, const char *path, int fd, int e, const char *fix)
{
	char buf[32] = "";
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
	buf[n > 0 ? n : 0] = 0;
	long pid = strtol(buf, NULL, 10);
	close(fd);
	if (e == EWOULDBLOCK && pid > 0)
		return error("'%s' is in use by another trainer (pid %ld holds '%s'); %s", dir, pid,
			     path, fix);
	if (e == EWOULDBLOCK)
		return error("'%s' is in use by another trainer (it holds '%s'); %s", dir, path,
			     fix);
	return error("cannot lock '%s': %s", path, strerror(e));
}

/* Whether the text of a train.lock is train's: empty, or a pid line. */
static int lock_text_is_train(const char *buf, ssize_t n)
{
	ssize_t i = 0;
	while (i < n && buf[i] >= '0' && buf[i] <= '9')
		i++;
	return n == 0 || (i > 0 && i == n - 1 && buf[i] == '\n');
}

int train_dir_lock(const char *dir, int *fd)
{
	char *path = path_join(dir, "train.lock");
	*fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (*fd < 0) {
		int rc = error("cannot create '%s': %s (train.out_dir must be writable)", path,
			       strerror(errno));
		free(path);
		return rc;
	}
	if (flock(*fd, LOCK_EX | LOCK_NB)) {
		int rc = busy_error(dir, path, *fd, errno, "wait for it to end, or set "
				    "train.out_dir to another directory");
		*fd = -1;
		free(path);
		return rc;
	}
	/* the pid is for the message above; the lock itself is the flock. A
	 * train.lock of other text is someone else's file: left as it was */
	char buf[32];
	ssize_t old = pread(*fd, buf, sizeof(buf), 0);
	if (old < 0 || !lock_text_is_train(buf, old)) {
		close(*fd);
		*fd = -1;
		int rc = error("'%s' is not a lock file of asyncpp train (it holds other text); "
			       "the run would write its pid there: move it away, or set "
			       "train.out_dir to another directory", path);
		free(path);
		return rc;
	}
	int n = snprintf(buf, sizeof(buf), "%ld\n", (long)getpid());
	if (ftruncate(*fd, 0) || pwrite(*fd, buf, (size_t)n, 0) != n)
		warning("cannot write the pid into '%s': %s", path, strerror(errno));
	free(path);
	return 0;
}

int train_dir_check_free(const char *dir)
{
	char *path = path_join(dir, "train.lock");
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	int rc = 0;
	if (fd >= 0 && flock(fd, LOCK_SH | LOCK_NB))
		rc = busy_error(dir, path, fd, errno, "it has written no checkpoint yet: wait "
				"for it to end, or stop it (it writes one as it stops) and "
				"resume then");
	else if (fd >= 0)
		close(fd); /* closing drops the shared lock */
	free(path);
	return rc;
}

/* DIR/run-id's id into *id: 1 when it is train's ("0x" + 16 hex digits and
 * a newline, non-zero), 0 when there is none, -1 when the file holds
 * anything else (someone else's file of that name), -2 when it cannot be
 * read (errno says why). */
static int read_run_id(const char *dir, uint64_t *id)
{
	char *path = path_join(dir, "run-id");
	FILE *fp = fopen(path, "r");
	int e = errno;
	free(path);
	*id = 0;
	if (!fp) {
		errno = e;
		return e == ENOENT ? 0 : -2;
	}
	char buf[32] = "";
	size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
	fclose(fp);
	buf[n] = 0;
	int ok = n == 19 && buf[0] == '0' && buf[1] == 'x' && buf[18] == '\n';
	for (int i = 2; i < 18 && ok; i++)
		ok = (buf[i] >= '0' && buf[i] <= '9') || (buf[i] >= 'a' && buf[i] <= 'f');
	if (ok)
		*id = strtoull(buf, NULL, 16);
	return ok && *id ? 1 : -1;
}

uint64_t train_dir_run_id(const char *dir)
{
	uint64_t id;
	return read_run_id(dir, &id) == 1 ? id : 0;
}

uint64_t train_dir_ckpt_run_id(const char *ckpt_path)
{
	struct ckpt *k;
	uint64_t id = 0;
	set_error_quiet(1); /* unreadable or without one: 0, said by the caller */
	if (!ckpt_open(&k, ckpt_path)) {
		if (ckpt_meta_u64(k, "run_id", &id)) /* ckpt_open checked it: absent */
			id = 0;
		ckpt_close(k);
	}
	set_error_quiet(0);
	return id;
}

int train_dir_ckpt_of_run(const char *ckpt_path, uint64_t id)
{
	uint64_t own = id ? train_dir_ckpt_run_id(ckpt_path) : 0;
	return !own || own == id;
}

int train_dir_checkpoints(const char *dir, uint64_t id, char ***paths)
{
	int n = list_checkpoints(dir, paths), kept = 0;
	for (int i = 0; i < n; i++) {
		if (train_dir_ckpt_of_run((*paths)[i], id))
			(*paths)[kept++] = (*paths)[i];
		else
			free((*paths)[i]);
	}
	return kept;
}

uint64_t train_dir_run_id_of(const char *ckpt_path)
{
	uint64_t own = train_dir_ckpt_run_id(ckpt_path);
	if (own)
		return own;
	char *dir = xstrdup(ckpt_path);
	char *slash = strrchr(dir, '/');
	if (slash)
		*(slash == dir ? slash + 1 : slash) = 0;
	uint64_t id = train_dir_run_id(slash ? dir : ".");
	free(dir);
	return id;
}

int train_dir_set_run_id(const char *dir, uint64_t id)
{
	char *path = path_join(dir, "run-id");
	char buf[32];
	int n = snprintf(buf, sizeof(buf), "0x%016" PRIx64 "\n", id);
	int rc = atomic_write_file(path, buf, (size_t)n);
	free(path);
	return rc;
}

uint64_t train_dir_new_run_id(void)
{
	uint64_t id = 0;
	FILE *fp = fopen("/dev/urandom", "rb");
	if (fp) {
		if (fread(&id, sizeof(id), 1, fp) != 1)
			id = 0;
		fclose(fp);
	}
	if (!id) { /* no random source: time and pid, mixed (splitmix64) */
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		uint64_t z = (uint64_t)ts.tv_sec * 1000000007u ^ (uint64_t)ts.tv_nsec ^
			     (uint64_t)getpid() << 32;
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
		id = z ^ (z >> 31);
	}
	return id ? id : 1;
}

/* Whether path is absent or holds what train writes there: text that begins
 * with head (sized with its NUL). An empty file is not (train writes its
 * files whole); samples.txt's caller accepts an empty one. */
static int begins_with(const char *path, const char *head, size_t size)
{
	struct stat sb;
	if (lstat(path, &sb))
		return 1;
	char buf[64] = "";
	FILE *fp = S_ISREG(sb.st_mode) ? fopen(path, "r") : NULL;
	size_t n = fp ? fread(buf, 1, MIN(size - 1, sizeof(buf) - 1), fp) : 0;
	if (fp)
		fclose(fp);
	return n == size - 1 && !strncmp(buf, head, size - 1);
}

int train_dir_check_own(const char *dir, int samples)
{
	uint64_t id;
	char *path = path_join(dir, "run-id");
	int rc = 0;
	int own = read_run_id(dir, &id);
	if (own == -2)
		rc = error("cannot read '%s': %s", path, strerror(errno));
	else if (own == -1)
		rc = error("'%s' is not a run id of asyncpp train (\"0x\" and 16 hex digits); "
			   "the run would replace it with its own: move it away, or set "
			   "train.out_dir to another directory", path);
	free(path);
	path = path_join(dir, "config.ini");
	if (!rc && !begins_with(path, TRAIN_CONFIG_HEAD, sizeof(TRAIN_CONFIG_HEAD)))
		rc = error("'%s' was not written by asyncpp train (its first line is not "
			   "\"%s...\"); the run would replace it with the run's own "
			   "configuration: move it away, or set train.out_dir to another "
			   "directory", path, TRAIN_CONFIG_HEAD);
	free(path);
	path = path_join(dir, "samples.txt");
	struct stat sb;
	if (!rc && samples && !(begins_with(path, "step ", 6) || (!stat(path, &sb) && !sb.st_size)))
		rc = error("'%s' was not written by asyncpp train (its first line is not "
			   "\"step N: ...\"); the run would add its samples to it: move it away, "
			   "set sample.every = 0, or set train.out_dir to another directory", path);
	free(path);
	DIR *d = rc ? NULL : opendir(dir);
	struct dirent *e;
	while (d && (e = readdir(d)) && !rc) {
		if (!checkpoint_name(e->d_name) || checkpoint_in_dir(dir, e->d_name))
			continue;
		path = path_join(dir, e->d_name);
		rc = error("'%s' has the name of a checkpoint of asyncpp train but holds no "
			   "checkpoint; the run would replace it when it reaches that step: move it "
			   "away, or set train.out_dir to another directory", path);
		free(path);
	}
	if (d)
		closedir(d);
	return rc;
}

void train_dir_mention_others(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		size_t len = strlen(e->d_name);
		if (len < 10 || strncmp(e->d_name, "ckpt-", 5) ||
		    strcmp(e->d_name + len - 5, ".ckpt") || checkpoint_name(e->d_name))
			continue;
		char *path = path_join(dir, e->d_name);
		warning("'%s' is not named as train names its checkpoints (ckpt-NNNNNNNN.ckpt, the "
			"step); it is left alone: never resumed, rotated or removed", path);
		free(path);
	}
	closedir(d);
	uint64_t id = train_dir_run_id(dir);
	char **paths = NULL;
	int n = id ? list_checkpoints(dir, &paths) : 0;
	for (int i = 0; i < n; i++) {
		uint64_t other = train_dir_ckpt_run_id(paths[i]);
		if (other && other != id)
			warning("'%s' is a checkpoint of another run (0x%016" PRIx64 ") than this "
				"folder's (0x%016" PRIx64 "); it is left alone: never resumed from "
				"the folder, rotated or removed", paths[i], other, id);
		free(paths[i]);
	}
	free(paths);
}

int train_dir_check_others_ahead(const char *dir, long from, long to)
{
	uint64_t id = train_dir_run_id(dir);
	char **paths = NULL;
	int n = list_checkpoints(dir, &paths), rc = 0;
	for (int i = 0; i < n; i++) {
		const char *name = strrchr(paths[i], '/') ? strrchr(paths[i], '/') + 1 : paths[i];
		long step = strtol(name + 5, NULL, 10);
		uint64_t other = train_dir_ckpt_run_id(paths[i]);
		if (!rc && step > from && step <= to && other && other != id)
			rc = error("'%s' is a checkpoint of another run (0x%016" PRIx64 "); this run "
				   "would replace it when it reaches step %ld: move it away, or set "
				   "train.out_dir to another directory", paths[i], other, step);
		free(paths[i]);
	}
	free(paths);
	return rc;
}

/* Is NAME (the part before ".tmp.PID", len bytes) a file train writes
 * into its directory: a checkpoint, config.ini, run-id or the metrics?
 * Only those temporaries are train's to remove; a user's "notes.tmp.1" is
 * not. */
static int train_file(const char *name, size_t len)
{
	static const char *const fixed[] = {"config.ini", "run-id", "metrics.csv", "metrics.jsonl"};
	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
		if (len == strlen(fixed[i]) && !strncmp(name, fixed[i], len))
			return 1;
	return len > 10 && !strncmp(name, "ckpt-", 5) && !strncmp(name + len - 5, ".ckpt", 5);
}

/* The writer's pid of "NAME.tmp.PID" where NAME is a file train writes
 * (train_file), or 0 when name is not such a file. */
static long temporary_pid(const char *name)
{
	const char *t = strstr(name, ".tmp.");
	if (!t || t == name || !train_file(name, (size_t)(t - name)))
		return 0;
	const char *digits = t + 5;
	while (strstr(digits, ".tmp.")) /* the last one */
		digits = strstr(digits, ".tmp.") + 5;
	if (!*digits)
		return 0;
	char *end;
	long pid = strtol(digits, &end, 10);
	return *end || pid <= 0 ? 0 : pid;
}

int train_dir_remove_temporaries(const char *dir, int all, int quiet)
{
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	int removed = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		long pid = temporary_pid(e->d_name);
		if (!pid || pid == (long)getpid())
			continue;
		/* kill(pid, 0) fails with ESRCH once the writer is gone (a live
		 * process that reused the pid keeps its file: the safe side) */
		int gone = kill((pid_t)pid, 0) && errno == ESRCH;
		if (!gone && !all)
			continue;
		char *path = path_join(dir, e->d_name);
		struct stat sb;
		if (!lstat(path, &sb) && S_ISREG(sb.st_mode) && !unlink(path)) {
			removed++;
			if (!quiet)
				fprintf(stderr, "asyncpp: removed '%s' (%.1f MB), a temporary file %s\n",
					path, (double)sb.st_size / 1e6,
					gone ? "whose writer is gone" : "(--overwrite)");
		}
		free(path);
	}
	closedir(d);
	return removed;
}

int train_dir_holds(const char *dir, const char *path)
{
	char *copy = xstrdup(path);
	char *slash = strrchr(copy, '/');
	const char *parent = ".";
	if (slash) {
		*(slash == copy ? slash + 1 : slash) = 0;
		parent = copy;
	}
	char a[PATH_MAX], b[PATH_MAX];
	int same = realpath(dir, a) && realpath(parent, b) && !strcmp(a, b);
	free(copy);
	return same;
}
