/* staged.c - staged outputs removed when a signal ends the command
 * (staged.h). */
#include "staged.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

enum { SLOT_FREE, SLOT_LIVE, SLOT_BUSY };

/* A slot is filled (under mu) before it turns live. The handler reads a
 * path only after claiming its slot, LIVE -> BUSY, and gives it back after;
 * staged_drop frees a slot LIVE -> FREE, waiting while the handler holds
 * it, so a path is never rewritten under the handler's eyes. */
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

/* Free slot i (under mu; the path is only read, never written, here). */
static void free_slot(int i)
{
	int live = SLOT_LIVE;
	while (!atomic_compare_exchange_weak(&slots[i].state, &live, SLOT_FREE))
		live = SLOT_LIVE; /* BUSY: the handler is removing it, then dies */
}

void staged_drop(const char *path)
{
	pthread_mutex_lock(&mu);
	int dir = 0;
	for (int i = 0; i < STAGED_MAX; i++)
		if (atomic_load(&slots[i].state) != SLOT_FREE && !strcmp(slots[i].path, path)) {
			dir |= slots[i].is_dir;
			free_slot(i);
		}
	for (int i = 0; dir && i < STAGED_MAX; i++)
		if (atomic_load(&slots[i].state) != SLOT_FREE && inside(slots[i].path, path))
			free_slot(i);
	pthread_mutex_unlock(&mu);
}

void staged_commit_to(const char *path)
{
	const char *slash = strrchr(path, '/');
	if (!slash || slash == path)
		return;
	size_t n = (size_t)(slash - path);
	pthread_mutex_lock(&mu);
	for (int i = 0; i < STAGED_MAX; i++)
		if (atomic_load(&slots[i].state) != SLOT_FREE && slots[i].is_dir &&
		    strlen(slots[i].path) == n && !strncmp(slots[i].path, path, n)) {
			add_locked(path, 0);
			break;
		}
	pthread_mutex_unlock(&mu);
}

int staged_remove_all(void)
{
	int removed = 0;
	uint64_t gone = 0; /* folders removed (STAGED_MAX <= 64) */
	/* files first, so that the folders that held them are empty; then the
	 * folders, in rounds until none goes, so that one staged inside another
	 * (export's staging folder in the output folder it made) goes first */
	for (int i = 0; i < STAGED_MAX; i++) {
		struct slot *s = &slots[i];
		int live = SLOT_LIVE;
		if (!atomic_compare_exchange_strong(&s->state, &live, SLOT_BUSY))
			continue;
		if (!s->is_dir)
			removed += !unlink(s->path);
		atomic_store(&s->state, SLOT_LIVE);
	}
	for (int round = 0, progress = 1; progress && round < STAGED_MAX; round++) {
		progress = 0;
		for (int i = 0; i < STAGED_MAX; i++) {
			struct slot *s = &slots[i];
			int live = SLOT_LIVE;
			if (gone >> i & 1 || !atomic_compare_exchange_strong(&s->state, &live, SLOT_BUSY))
				continue;
			if (s->is_dir && !rmdir(s->path)) {
				gone |= (uint64_t)1 << i;
				removed++;
				progress = 1;
			}
			atomic_store(&s->state, SLOT_LIVE);
		}
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

void staged_catch(int sig, void (*handler)(int))
{
	struct sigaction old, sa;
	if (sigaction(sig, NULL, &old) || old.sa_handler == SIG_IGN)
		return;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = handler;
	sigemptyset(&sa.sa_mask);
	sigaction(sig, &sa, NULL);
}

void staged_on_signals(void)
{
	staged_catch(SIGINT, on_signal);
	staged_catch(SIGTERM, on_signal);
	staged_catch(SIGHUP, on_signal);
	signal(SIGXFSZ, SIG_IGN);
}

void staged_children_default(void)
{
	signal(SIGXFSZ, SIG_DFL);
}
