/* progress.c - a progress line for a long phase, on a terminal (progress.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "../io/util.h"
#include "progress.h"

void progress_init(struct progress *p, double start, double after, int cols, const char *what)
{
	memset(p, 0, sizeof(*p));
	p->start = start;
	p->cols = cols;
	p->after = after;
	p->drawn = -1;
	snprintf(p->what, sizeof(p->what), "%s", what);
}

int progress_line(struct progress *p, double now, char *buf, size_t len)
{
	double t = now - p->start;
	if (t < p->after || (p->drawn >= 0 && now - p->drawn < PROGRESS_EVERY))
		return 0;
	p->drawn = now;
	/* one row of the terminal, or "\r" would not reach the line's start:
	 * a long WHAT keeps its end ("...ckpt-00002000.ckpt") */
	char tail[32];
	snprintf(tail, sizeof(tail), "... %.0f s", t);
	const char *what = p->what, *cut = "";
	int room = p->cols - 1 - (int)strlen("asyncpp: ") - (int)strlen(tail);
	if (p->cols > 0 && (int)strlen(what) > room) {
		room = MAX(room - 3, 0);
		what += strlen(what) - (size_t)room;
		cut = "...";
	}
	snprintf(buf, len, "\rasyncpp: %s%s%s\033[K", cut, what, tail);
	return 1;
}

const char *progress_erase(const struct progress *p)
{
	return p->drawn >= 0 ? "\r\033[K" : "";
}

double progress_after_env(void)
{
	const char *s = getenv("ASYNCPP_PROGRESS_AFTER");
	char *end;
	double v = s && *s ? strtod(s, &end) : -1;
	return s && *s && !*end && v >= 0 ? v : PROGRESS_AFTER;
}

/* the thread: wakes every tenth of a second, draws when a line is due */
static void *progress_thread(void *arg)
{
	struct progress *p = arg;
	char line[256];
	pthread_mutex_lock(&p->mu);
	while (!p->stop) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 100 * 1000 * 1000;
		if (ts.tv_nsec >= 1000 * 1000 * 1000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000 * 1000 * 1000;
		}
		int rc = pthread_cond_timedwait(&p->cv, &p->mu, &ts);
		if (!p->stop && (rc == 0 || rc == ETIMEDOUT) && progress_line(p, now_sec(), line,
									    sizeof(line)))
			fputs(line, stderr);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

/* the report guard (io/util.h): a message printed during the phase
 * (error(), warning(), die()) erases the line and starts at the row's
 * start; the thread draws it again below the message */
static void progress_guard(void *arg, int before)
{
	struct progress *p = arg;
	if (!before) {
		pthread_mutex_unlock(&p->mu);
		return;
	}
	pthread_mutex_lock(&p->mu);
	fputs(progress_erase(p), stderr);
	p->drawn = -1;
}

void progress_begin(struct progress *p, int show, const char *fmt, ...)
{
	char what[sizeof(p->what)];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	struct winsize ws;
	int cols = ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 ? ws.ws_col : 0;
	progress_init(p, now_sec(), progress_after_env(), cols, what);
	if (!show || !stderr_is_tty())
		return;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	/* without a thread there is no line: the phase runs as before */
	if (pthread_create(&p->thread, NULL, progress_thread, p)) {
		pthread_cond_destroy(&p->cv);
		pthread_mutex_destroy(&p->mu);
		return;
	}
	p->on = 1;
	set_report_guard(progress_guard, p);
	/* with no delay, at once: a phase shorter than the thread's first
	 * wake-up shows its line too (the tests rely on it) */
	char line[256];
	pthread_mutex_lock(&p->mu);
	if (p->after <= 0 && progress_line(p, p->start, line, sizeof(line)))
		fputs(line, stderr);
	pthread_mutex_unlock(&p->mu);
}

void progress_end(struct progress *p)
{
	if (!p->on)
		return;
	set_report_guard(NULL, NULL);
	pthread_mutex_lock(&p->mu);
	p->stop = 1;
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mu);
	pthread_join(p->thread, NULL);
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	fputs(progress_erase(p), stderr);
	p->on = 0;
}
