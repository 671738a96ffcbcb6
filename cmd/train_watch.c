/* train_watch.c - bad steps, loss spikes and the newest good checkpoint of
 * a training run (train_watch.h). */
#include "train_watch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../io/util.h"

void watch_init(struct watch *w, const struct config *cfg, const struct trainer *tr)
{
	memset(w, 0, sizeof(*w));
	w->factor = cfg->train_spike_factor;
	w->window = cfg->train_spike_window;
	w->recent = xcalloc((size_t)w->window, sizeof(double));
	w->first_loss = NAN;
	w->delay = trainer_n_versions(tr) - 1;
}

static void mark_free(struct ckpt_mark *m)
{
	free(m->path);
	m->path = NULL;
}

static void drop_pending(struct watch *w)
{
	for (int i = 0; i < w->n_pending; i++)
		mark_free(&w->pending[i]);
	w->n_pending = 0;
}

void watch_free(struct watch *w)
{
	drop_pending(w);
	free(w->pending);
	mark_free(&w->good);
	free(w->recent);
	memset(w, 0, sizeof(*w));
}

void watch_saved(struct watch *w, long step, const char *path)
{
	w->pending = xrealloc(w->pending, sizeof(*w->pending) * (size_t)(w->n_pending + 1));
	w->pending[w->n_pending++] = (struct ckpt_mark){step, xstrdup(path)};
}

/* Whether a and b name the same file. */
static int same_file(const char *a, const char *b)
{
	struct stat sa, sb;
	return !strcmp(a, b) || (!stat(a, &sa) && !stat(b, &sb) && sa.st_dev == sb.st_dev &&
				 sa.st_ino == sb.st_ino);
}

int watch_holds(const struct watch *w, const char *path)
{
	if (w->good.path && same_file(w->good.path, path))
		return 1;
	for (int i = 0; i < w->n_pending; i++)
		if (same_file(w->pending[i].path, path))
			return 1;
	return 0;
}

void watch_restart(struct watch *w)
{
	drop_pending(w);
	w->n_recent = 0;
	w->bad_in_row = 0;
}

enum watch_verdict watch_step(struct watch *w, long step, const struct step_stats *st)
{
	if (st->skipped || !isfinite(st->loss)) {
		w->bad_in_row++;
		drop_pending(w);
		return WATCH_BAD;
	}
	w->bad_in_row = 0;
	if (w->factor > 0 && w->n_recent >= w->window) {
		double sum = 0;
		for (long i = 0; i < w->window; i++)
			sum += w->recent[i];
		w->spike_mean = sum / (double)w->window;
		if (st->loss > w->factor * w->spike_mean) {
			drop_pending(w);
			return WATCH_SPIKE;
		}
	}
	w->recent[w->n_recent++ % w->window] = st->loss;
	if (isnan(w->first_loss))
		w->first_loss = st->loss;
	/* the checkpoints whose weights this step measured leave the waiting
	 * list: good when its loss is no worse than the first one */
	int k = 0;
	while (k < w->n_pending && w->pending[k].step + 1 + w->delay <= step) {
		if (w->pending[k].step + 1 + w->delay == step && st->loss <= w->first_loss) {
			mark_free(&w->good);
			w->good = w->pending[k];
		} else {
			mark_free(&w->pending[k]);
		}
		k++;
	}
	if (k) /* pending may be NULL when none is waiting (memmove wants a pointer) */
		memmove(w->pending, w->pending + k,
			sizeof(*w->pending) * (size_t)(w->n_pending - k));
	w->n_pending -= k;
	return WATCH_GOOD;
}
