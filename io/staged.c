/* staged.c - staged outputs removed when a signal ends the command
 * (staged.h). */
#include "staged.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

enum { SLOT_FREE, SLOT_LIVE };

/* The handler reads a slot's path only while its state is SLOT_LIVE; a slot
 * is filled before it turns live and freed before it is refilled. */
static struct slot {
	atomic_int state;
	int is_dir;
	char path[PATH_MAX];
} slots[STAGED_MAX];

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void add_locked(const char *path, int is_dir)
{
	size_t n = strlen(path);
	if (n >= PATH_MAX)
		return;
	for (int i = 0; i < STAGED_MAX; i++)
		if (atomic_load(&slots[i].state) == SLOT_FREE) {
			memcpy(slots[i].path, path, n + 1);
			slots[i].is_dir = is_dir;
			atomic_store(&slots[i].state, SLOT_LIVE);
			return;
		}
}

/* Is path inside folder dir (dir, a '/', then at least one byte)? */
static int inside(const char *path, const char *dir)
{
	size_t n = strlen(dir);
	return !strncmp(path, dir, n) && path[n] == '/' && path[n + 1];
}

void staged_add(const char *path, int is_dir)
{
	pthread_mutex_lock(&mu);
	add_locked(path, is_dir);
	pthread_mutex_unlock(&mu);
}

void staged_drop(const char *path)
{
	pthread_mutex_lock(&mu);
	int dir = 0;
	for (int i = 0; i < STAGED_MAX; i++)
		if (atomic_load(&slots[i].state) == SLOT_LIVE && !strcmp(slots[i].path, path)) {
			dir |= slots[i].is_dir;
			atomic_store(&slots[i].state, SLOT_FREE);
		}
	for (int i = 0; dir && i < STAGED_MAX; i++)
		if (atomic_load(&slots[i].state) == SLOT_LIVE && inside(slots[i].path, path))
			atomic_store(&slots[i].state, SLOT_FREE);
	pthread_mutex_unlock(&mu);
}

void staged_renamed(const char *tmp, const char *path)
{
	staged_drop(tmp);
	const char *slash = strrchr(path, '/');
	if (!slash || slash == path)
		return;
	size_t n = (size_t)(slash - path);
	pthread_mutex_lock(&mu);
	for (int i = 0; i < STAGED_MAX; i++)
		if (atomic_load(&slots[i].state) == SLOT_LIVE && slots[i].is_dir &&
		    strlen(slots[i].path) == n && !strncmp(slots[i].path, path, n)) {
			add_locked(path, 0);
			break;
		}
	pthread_mutex_unlock(&mu);
}

int staged_remove_all(void)
{
	int removed = 0;
	/* files first, so that the folders that held them are empty */
	for (int dirs = 0; dirs < 2; dirs++)
		for (int i = 0; i < STAGED_MAX; i++) {
			struct slot *s = &slots[i];
			if (atomic_load(&s->state) != SLOT_LIVE || s->is_dir != dirs)
				continue;
			removed += !(dirs ? rmdir(s->path) : unlink(s->path));
		}
	return removed;
}

static void on_signal(int sig)
{
	if (staged_remove_all() > 0) {
		static const char msg[] = "\nasyncpp: stopped by a signal; its unfinished "
					  "output was removed\n";
		ssize_t w = write(STDERR_FILENO, msg, sizeof(msg) - 1);
		(void)w;
	}
	signal(sig, SIG_DFL);
	raise(sig); /* delivered once the handler returns: the signal's status */
}

void staged_on_signals(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
		struct sigaction old;
		/* a signal ignored by whoever started us (nohup) stays ignored */
		if (!sigaction(sigs[i], NULL, &old) && old.sa_handler == SIG_IGN)
			continue;
		sigaction(sigs[i], &sa, NULL);
	}
	signal(SIGXFSZ, SIG_IGN);
}
