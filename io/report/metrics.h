/* metrics.h - training metrics files (CSV or JSON lines).
 *
 * One row per logged step. Columns, in order (a missing value is an empty
 * CSV field or an absent JSON key):
 *   step        optimizer steps done
 *   tokens      training tokens consumed so far
 *   wall_s      seconds from the run's (or its resume's) start to when this
 *               step finished (each step its own, also within a pipeline
 *               segment logged at once)
 *   loss        mean training loss of this step
 *   val_loss    validation loss (only on evaluation steps)
 *   lr          learning rate used by this step
 *   grad_norm   global gradient norm before clipping
 *   tokens_per_s  throughput over the last logging interval
 *   mfu         model FLOPs utilisation (0..1) against the device peak
 *   bubble      idle fraction of the pipeline stages over the interval
 *   skipped     1 when the step's update was skipped (its gradient norm was
 *               not finite), else 0
 *   time        when the step (or evaluation) finished: Unix seconds (UTC),
 *               milliseconds
 * and, for a mixture-of-experts model (metrics_open's n_expert > 0), three
 * more:
 *   moe_balance the load-balancing term per layer (1 when balanced)
 *   moe_z       the router z-loss per layer
 *   expert_tokens  the (token, expert) slots routed to each expert, summed
 *               over the step's micro-batches and the layers: E integers,
 *               separated by spaces in CSV, a JSON array in JSON lines
 * asyncpp plot reads these files; the CSV header names the columns, so
 * readers find columns by name.
 */
#ifndef ASYNCPP_METRICS_H
#define ASYNCPP_METRICS_H

#include <stdio.h>

enum metrics_format { METRICS_CSV, METRICS_JSONL };

struct metrics_row {
	long step;
	double tokens, wall_s, loss, val_loss, lr, grad_norm, tokens_per_s, mfu, bubble, skipped;
	double moe_balance, moe_z;
	const double *expert_tokens; /* [the file's n_expert] */
	double time;                 /* the time column; 0: when the row is written */
	/* which optional fields are set (has_moe: the three MoE ones) */
	int has_loss, has_val_loss, has_lr, has_grad_norm, has_tps, has_mfu, has_bubble,
		has_skipped, has_moe;
};

struct metrics_file {
	FILE *fp;
	enum metrics_format format;
	char *path;
	int n_expert; /* > 0: the MoE columns follow time */
};

/* Open for appending (a resumed run continues its file); writes the CSV
 * header when the file is new or empty. Rows are flushed as written.
 * n_expert > 0 adds the MoE columns. */
int metrics_open(struct metrics_file *mf, const char *path, enum metrics_format format,
		 int n_expert);
int metrics_write(struct metrics_file *mf, const struct metrics_row *row);
void metrics_close(struct metrics_file *mf);
/* Drop the rows of steps after `step` (a run resumed from an earlier
 * checkpoint rewrites history from there); atomic. No file is fine. */
int metrics_keep_until(const char *path, long step);
/* Whether path may be taken as a metrics file: it is absent or empty, or
 * its first line is a metrics CSV header ("step,...") or a JSONL row
 * ({"step": ...}). Anything else (a mistyped log.metrics = run.ini) is
 * not ours to truncate or replace. */
int metrics_is_metrics_file(const char *path);

/* Reading, for plot: every row of a CSV or JSONL metrics file. */
struct metrics_series {
	struct metrics_row *rows;
	int n;
};
int metrics_read(const char *path, struct metrics_series *out);
void metrics_series_free(struct metrics_series *s);

#endif
