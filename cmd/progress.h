/* progress.h - a progress line for a long phase of a command, on a terminal.
 *
 * A phase that may take minutes (allocating and initialising a model,
 * loading or writing a checkpoint, a first training step, importing or
 * inspecting a big file) shows "asyncpp: WHAT... 12 s" on standard error,
 * rewritten in place, but only when standard error is a terminal and the
 * command is not quiet, only once the phase has run PROGRESS_AFTER seconds
 * (ASYNCPP_PROGRESS_AFTER=SECONDS changes that), and at most every
 * PROGRESS_EVERY seconds (at once when the delay is 0); the line is erased
 * when the phase ends. A thread
 * draws it, so a phase that is one long call shows it too. A message of
 * error(), warning() or die() during the phase erases it first (io/util.h's
 * report guard) and starts a line of its own; the line is drawn again below.
 * Elsewhere (a log file, a pipe, -q) nothing is drawn and no thread starts.
 *
 *	struct progress pg;
 *	progress_begin(&pg, !quiet, "writing %s", path);
 *	rc = long_call();
 *	progress_end(&pg);          (before anything else is printed)
 */
#ifndef ASYNCPP_PROGRESS_H
#define ASYNCPP_PROGRESS_H

#include <pthread.h>

#define PROGRESS_AFTER 2.0  /* seconds before the first line */
#define PROGRESS_EVERY 0.25 /* seconds between two lines, at least */

struct progress {
	int on;        /* drawing: a terminal, not quiet, a thread running */
	double after;  /* PROGRESS_AFTER, or ASYNCPP_PROGRESS_AFTER */
	double start;  /* when the phase began (now_sec) */
	double drawn;  /* when the line was last drawn; < 0: never */
	int cols;      /* the terminal's width (0: unknown) */
	char what[200];
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int stop;
};

/* Start a phase described by FMT (printf) when SHOW is set and standard
 * error is a terminal; otherwise only record it (progress_end is then a
 * no-op). */
void progress_begin(struct progress *p, int show, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* End the phase: stop the thread and erase the line if one was drawn. */
void progress_end(struct progress *p);

/* The logic, apart from the clock and the thread (tests/unit/test_progress.c):
 * the phase's state at START with delay AFTER on a terminal COLS wide (0:
 * unknown), drawing nothing yet ... */
void progress_init(struct progress *p, double start, double after, int cols, const char *what);
/* ... the line due at NOW, "\rasyncpp: WHAT... N s\033[K" (within COLS - 1
 * characters: "...END OF WHAT" when it is too long), into BUF (1), or
 * nothing because it is too early or too soon after the last one (0) ... */
int progress_line(struct progress *p, double now, char *buf, size_t len);
/* ... and what erases it at the end ("\r\033[K", or "" when none was drawn). */
const char *progress_erase(const struct progress *p);
/* ASYNCPP_PROGRESS_AFTER as seconds when it is a number >= 0, else PROGRESS_AFTER. */
double progress_after_env(void);

#endif
