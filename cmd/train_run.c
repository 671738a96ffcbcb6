/* train_run.c - one `asyncpp train` run once it is set up (train_run.h):
 * its data, and the loop of trainer_run calls (a pipeline segment each, for
 * the pipeline schedules) with logging, evaluation, samples and
 * checkpoints at their boundaries.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../io/formats/checkpoint.h"
#include "../io/text/tokenizer.h"
#include "../io/util.h"
#include "../optim/optim.h"
#include "../sched/comm/dist.h"
#include "../sched/expert_mem.h"
#include "builtin.h"
#include "generate.h"
#include "progress.h"
#include "run_common.h"
#include "train_dir.h"
#include "train_run.h"

/* A pipeline segment ends with a drain, where the run can stop, log and
 * save. A drain leaves about (S-1) micro-batch slots idle, so segments are
 * not cut at every log interval (at log.every = 1 that would be 1F1B's
 * bubble again): they run for about PIPELINE_SEGMENT_S seconds (from the
 * last segment's time per step, at most PIPELINE_SEGMENT_MAX steps), or to
 * the next evaluation or checkpoint, and their steps are logged when they
 * end. A drain costs about (S-1)/(n*M+S-1) of the time of a segment of n
 * steps of M micro-batches: under 1% once steps are fast. When steps are
 * slow, a segment is no shorter than segment_floor, whose drain costs at
 * most 5%, so a big model's steps are logged about every 10 s at no more
 * than that cost. The first segment, whose pace sizes the next, is
 * PIPELINE_SEGMENT_FIRST steps: the first line comes after those, not
 * after 20 steps of a model whose steps take seconds. A signal does not
 * wait for the segment's end: the stages agree on a step a few steps later
 * and end the segment there (sched/executor.c). */
#define PIPELINE_SEGMENT_S 10.0
#define PIPELINE_SEGMENT_FIRST 2
#define PIPELINE_SEGMENT_MAX 1000

/* The fewest steps a segment of this pipeline runs: n with
 * (S-1)/(n*M+S-1) <= 5%, that is n >= 19(S-1)/M (M the micro-batches of a
 * step per replica), from 1 to PIPELINE_SEGMENT_MAX. */
static long segment_floor(const struct trainer *tr)
{
	long m = MAX(tr->mb_per_replica, 1);
	return MIN(MAX((19L * (tr->S - 1) + m - 1) / m, 1), PIPELINE_SEGMENT_MAX);
}
/* A step line at least every LOG_AT_LEAST_S seconds (ASYNCPP_LOG_SECONDS),
 * whatever log.every is (a big model's steps take seconds): without a
 * pipeline, a call runs the first step alone, then as many steps as fit in
 * that time at the last call's pace (pipelines: their segments, above). */
#define LOG_AT_LEAST_S 10.0

static double log_at_least_s(void)
{
	const char *s = getenv("ASYNCPP_LOG_SECONDS");
	char *end;
	double v = s && *s ? strtod(s, &end) : -1;
	return s && *s && !*end && v >= 0 ? v : LOG_AT_LEAST_S;
}

static void fmt_duration(char *out, size_t len, double s)
{
	if (!isfinite(s) || s < 0)
		s = 0;
	long t = (long)(s + 0.5);
	if (t >= 3600)
		snprintf(out, len, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
	else
		snprintf(out, len, "%ld:%02ld", t / 60, t % 60);
}

/* Write a checkpoint for the trainer's current step and keep the newest K
 * (and those the watch holds). */
int train_save_checkpoint(struct trainer *tr, const struct config *cfg, uint64_t run_id,
			  const struct watch *w, char **saved)
{
	char name[64];
	snprintf(name, sizeof(name), "ckpt-%08ld.ckpt", tr->step);
	char *path = path_join(cfg->train_out_dir, name);
	char *text = config_to_string(cfg);
	char meta[96] = "", *m = meta;
	if (tr->data && tr->data->tokenizer_hash)
		m += snprintf(m, 48, "tokenizer_hash = 0x%016llx\n",
			      (unsigned long long)tr->data->tokenizer_hash);
	if (run_id) /* cmd/train_dir.h: only the run's own are rotated */
		snprintf(m, 48, "run_id = 0x%016llx\n", (unsigned long long)run_id);
	int rc = pipeline_save(tr, path, text, meta); /* MPI: rank 0 writes */
	free(text);
	if (rc) {
		free(path);
		return -1;
	}
	char **paths = NULL;
	int n = dist_is_root(tr->dist) ? train_dir_checkpoints(cfg->train_out_dir, run_id, &paths) : 0;
	for (int i = 0; i < n; i++) {
		if (i < n - cfg->checkpoint_keep && strcmp(paths[i], path) &&
		    !(w && watch_holds(w, paths[i])))
			unlink(paths[i]);
		free(paths[i]);
	}
	free(paths);
	if (saved)
		*saved = path;
	else
		free(path);
	return 0;
}


int train_setup_data(struct run *r)
{
	struct config *cfg = &r->cfg;
	if (!cfg->data_train[0]) {
		char *dir = path_join(cfg->train_out_dir, "data");
		char *tok, *tr_path, *val_path;
		int rc = builtin_prepare(dir, r->quiet, &tok, &tr_path, &val_path);
		free(dir);
		/* absolute, so eval and sample find them from any directory */
		char *abs[3] = {realpath(tok, NULL), realpath(tr_path, NULL), realpath(val_path, NULL)};
		if (!rc && abs[0] && abs[1] && abs[2]) {
			free(tok);
			free(tr_path);
			free(val_path);
			tok = abs[0];
			tr_path = abs[1];
			val_path = abs[2];
		} else {
			for (int i = 0; i < 3; i++)
				free(abs[i]);
		}
		if (rc)
			return -1;
		if (config_set_key(cfg, "data", "train", tr_path, "built-in") ||
		    (!cfg->data_val[0] && config_set_key(cfg, "data", "val", val_path, "built-in")) ||
		    (!cfg->data_tokenizer[0] &&
		     config_set_key(cfg, "data", "tokenizer", tok, "built-in")))
			rc = -1;
		free(tok);
		free(tr_path);
		free(val_path);
		if (rc)
			return -1;
	}
	int B = (int)cfg->train_batch_size, T = (int)cfg->model_seq_len;
	if (B < 1 || T < 1)
		return error("train.batch_size and model.seq_len must be positive");
	enum data_load load = data_load_parse(cfg->data_load);
	/* Under MPI a rank that runs neither the first piece (inputs) nor the
	 * last (targets) never reads a token: it opens the shards for their
	 * sizes only, instead of holding a copy of the data. The last piece is
	 * the last stage's, but stage 0's under zb-v (its V turns back). */
	int S = (int)cfg->pipeline_stages, s = dist_rank(r->dist) % MAX(S, 1);
	int last = strcmp(cfg->train_schedule, "zb-v") ? S - 1 : 0;
	if (dist_active(r->dist) && strcmp(cfg->train_schedule, "none") && s != 0 && s != last)
		load = DATA_LOAD_STREAM;
	if (dataloader_open_named(&r->train, "the training data, data.train", cfg->data_train, B,
				  T, (uint64_t)cfg->train_seed, 1, load))
		return -1;
	if (cfg->data_val[0]) {
		if (dataloader_open_named(&r->val, "the validation data, data.val", cfg->data_val,
					  B, T, 0, 0, load))
			return -1;
		r->has_val = 1;
		if (r->val.vocab != r->train.vocab ||
		    (r->val.tokenizer_hash && r->train.tokenizer_hash &&
		     r->val.tokenizer_hash != r->train.tokenizer_hash))
			return error("validation shards '%s' and training shards '%s' were made with "
				     "different tokenizers", cfg->data_val, cfg->data_train);
	}
	/* sample decodes with data.tokenizer: it must be the shards' tokenizer */
	if (cfg->data_tokenizer[0] && r->train.tokenizer_hash) {
		struct tokenizer *tok;
		if (tokenizer_load(&tok, cfg->data_tokenizer))
			return -1;
		uint64_t h = tokenizer_hash(tok);
		tokenizer_free(tok);
		if (h != r->train.tokenizer_hash)
			return error("data.tokenizer '%s' is not the tokenizer that encoded '%s'",
				     cfg->data_tokenizer, cfg->data_train);
	}
	return 0;
}

/* One metrics row, to the metrics file and (log.tensorboard) as scalars. */
static void log_row(struct run *r, const struct metrics_row *row)
{
	metrics_write(&r->metrics, row);
	if (!r->tb.fp)
		return;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	double now = row->time > 0 ? row->time : (double)ts.tv_sec + ts.tv_nsec * 1e-9;
	const struct {
		int has;
		const char *tag;
		double v;
	} scalars[] = {
		{row->has_loss, "train/loss", row->loss},
		{row->has_val_loss, "eval/val_loss", row->val_loss},
		{row->has_lr, "train/lr", row->lr},
		{row->has_grad_norm, "train/grad_norm", row->grad_norm},
		{row->has_skipped, "train/skipped", row->skipped},
		{row->has_tps, "perf/tokens_per_s", row->tokens_per_s},
		{row->has_mfu, "perf/mfu", row->mfu},
		{row->has_bubble, "perf/bubble", row->bubble},
		{row->has_moe, "moe/balance", row->moe_balance},
		{row->has_moe, "moe/z_loss", row->moe_z},
	};
	for (size_t i = 0; i < ARRAY_SIZE(scalars); i++)
		if (scalars[i].has && tb_scalar(&r->tb, scalars[i].tag, row->step, now,
						(float)scalars[i].v)) {
			warning("TensorBoard events stop here; the metrics file goes on");
			tb_close(&r->tb);
			return;
		}
}

/* The Unix time of a past now_sec() reading. */
static double unix_time_of(double mono)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9 - (now_sec() - mono);
}

/* A step's row; its times are when it finished (st->done_s), which for the
 * steps of a pipeline segment is earlier than now, when they are logged. */
static void log_step(struct run *r, long step, const struct step_stats *st, double tps,
		     double mfu, double bubble, double t_start, int with_rate)
{
	double done = st->done_s > 0 ? st->done_s : now_sec();
	struct metrics_row row = {
		.step = step,
		.tokens = (double)step * r->tr.mb_per_step * r->tr.B * r->tr.T,
		.wall_s = done - t_start,
		.time = unix_time_of(done),
		.loss = st->loss, .has_loss = 1,
		.lr = st->lr, .has_lr = 1,
		.grad_norm = st->grad_norm, .has_grad_norm = 1,
		.skipped = st->skipped, .has_skipped = 1,
		.moe_balance = st->moe_balance, .moe_z = st->moe_z,
		.expert_tokens = st->expert_tokens, .has_moe = st->expert_tokens != NULL,
	};
	if (with_rate) {
		row.tokens_per_s = tps;
		row.has_tps = 1;
		row.mfu = mfu;
		row.has_mfu = 1;
		if (r->tr.S > 1) {
			row.bubble = bubble;
			row.has_bubble = 1;
		}
	}
	log_row(r, &row);
}

/* sample.every: the newest weights, gathered into a one-stage copy of the
 * model (batch 1) on the run's backend, continue sample.prompt; the text
 * goes to OUT_DIR/samples.txt and, unless quiet, to the log. Greedy, so
 * that samples at different steps compare; it reads the weights only, so
 * the run is the same with or without it. */
struct sampler {
	struct stage st;
	float *global, *arena; /* host: the global and the one-stage arena */
	float *params;         /* the arena on the backend */
	struct tokenizer *tok;
	FILE *fp;
};

static void emit_text(const void *text, size_t len, void *ctx)
{
	buf_append(ctx, text, len);
}

void train_sampler_free(struct sampler *sp)
{
	if (!sp)
		return;
	if (sp->params)
		sp->st.be->free(sp->params);
	if (sp->st.m)
		stage_free(&sp->st);
	free(sp->global);
	free(sp->arena);
	if (sp->tok)
		tokenizer_free(sp->tok);
	if (sp->fp)
		fclose(sp->fp);
	free(sp);
}

static int sample_now(struct run *r)
{
	const struct config *cfg = &r->cfg;
	struct sampler *sp = r->sampler;
	if (!sp) {
		sp = r->sampler = xcalloc(1, sizeof(*sp));
		char *path = path_join(cfg->train_out_dir, "samples.txt");
		sp->fp = fopen(path, "a");
		int bad = !sp->fp ? error("cannot open '%s': %s", path, strerror(errno)) : 0;
		free(path);
		if (bad || tokenizer_load(&sp->tok, cfg->data_tokenizer) ||
		    stage_init(&sp->st, &r->m, r->be, NULL, 0, 1, r->m.cfg.T, 1))
			return -1;
		sp->global = xmalloc(st_mult(r->m.numel, sizeof(float)));
		sp->arena = xmalloc(st_mult(sp->st.numel, sizeof(float)));
		if (!(sp->params = r->be->alloc(st_mult(sp->st.numel, sizeof(float)))))
			return -1;
	}
	trainer_gather_weights(&r->tr, 0, sp->global);
	stage_gather(&sp->st, sp->arena, sp->global);
	r->be->to_device(sp->params, sp->arena, sp->st.numel * sizeof(float));
	struct gen_opts go = {.max_tokens = cfg->sample_tokens, .temperature = 0};
	struct buf text = {0};
	buf_append(&text, cfg->sample_prompt, strlen(cfg->sample_prompt));
	generate(&sp->st, sp->params, sp->tok, cfg->sample_prompt, &go, emit_text, &text);
	/* one line per sample: the text's newlines shown as \n */
	fprintf(sp->fp, "step %ld: ", r->tr.step);
	for (size_t i = 0; i < text.len; i++)
		fputs(text.data[i] == '\n' ? "\\n" : (char[]){(char)text.data[i], 0}, sp->fp);
	fputc('\n', sp->fp);
	fflush(sp->fp);
	if (!r->quiet)
		fprintf(stderr, "%ssample at step %ld: %.*s\n", r->tty ? "\r\033[K" : "", r->tr.step,
			(int)text.len, (const char *)text.data);
	buf_free(&text);
	return 0;
}

/* A streamed shard that failed to read (error() named it) fed zeros to
 * the steps since `first`: stop before they are logged or saved. The ranks
 * agree, so that all of them stop. */
static int data_failed(struct run *r, long first)
{
	if (!dist_max_int(r->dist, r->train.failed || r->val.failed))
		return 0;
	error("reading the data failed (above): the steps after step %ld were not kept; "
	      "checkpoints already in '%s' are intact. Replace or re-encode the shard "
	      "('%s inspect SHARD' verifies one), then run again (--resume continues from "
	      "a checkpoint)", first, r->cfg.train_out_dir, r->prog);
	return 1;
}

void train_fallback(struct run *r, char *out, size_t len)
{
	const struct config *cfg = &r->cfg;
	const struct ckpt_mark *good = &r->watch.good;
	if (good->path) {
		snprintf(out, len, "the newest checkpoint from before it, %s (step %ld), measured a "
			 "finite loss no worse than the first one logged; resume from it with a lower "
			 "optim.lr (%s train --resume %s --set optim.lr=...) or with "
			 "train.on_divergence = rollback", good->path, good->step, r->prog, good->path);
		return;
	}
	char **paths = NULL;
	int np = train_dir_checkpoints(cfg->train_out_dir, r->run_id, &paths);
	if (np > 0)
		snprintf(out, len, "no checkpoint from before it is known: the newest, %s, holds "
			 "weights that led into it (resuming it diverges the same way); start again "
			 "with a lower optim.lr", paths[np - 1]);
	else
		snprintf(out, len, "no checkpoint was written yet; start again with a lower optim.lr");
	for (int k = 0; k < np; k++)
		free(paths[k]);
	free(paths);
}

/* The run's checkpoints (train_dir.h: not another run's) of steps after
 * `after` go (the root's): after a
 * rollback they hold the abandoned steps, which led into the divergence;
 * left there, --resume of the folder would pick them and checkpoint.keep
 * rotate out the new ones first. Writes the newest one's name into
 * newest[len] and returns how many went. */
static int remove_checkpoints_after(const struct run *r, long after, char *newest, size_t len)
{
	char **paths = NULL;
	int np = dist_is_root(r->dist) ? train_dir_checkpoints(r->cfg.train_out_dir, r->run_id, &paths) : 0;
	int gone = 0;
	for (int i = 0; i < np; i++) {
		const char *name = strrchr(paths[i], '/') ? strrchr(paths[i], '/') + 1 : paths[i];
		if (strtol(name + 5, NULL, 10) > after && !watch_holds(&r->watch, paths[i]) &&
		    !unlink(paths[i])) {
			snprintf(newest, len, "%s", paths[i]);
			gone++;
		}
		free(paths[i]);
	}
	free(paths);
	return gone;
}

/* train.on_divergence = rollback: back to the newest good checkpoint, the
 * data up to `step` passed over, the learning rate lowered. The ranks all
 * read the same checkpoint (rank 0 wrote it before any rank moved on). */
static int roll_back(struct run *r, long step, const char *what)
{
	struct trainer *tr = &r->tr;
	struct watch *w = &r->watch;
	long rollbacks = tr->rollbacks + 1, skip = tr->data_skip + (step - w->good.step);
	struct ckpt *k;
	if (ckpt_open(&k, w->good.path))
		return -1;
	int rc = trainer_load(tr, k);
	ckpt_close(k);
	if (rc)
		return -1;
	trainer_set_rollbacks(tr, rollbacks, skip);
	watch_restart(w);
	r->last_save = now_sec();
	char newest[1024] = "", removed[1200] = "";
	int gone = remove_checkpoints_after(r, w->good.step, newest, sizeof(newest));
	if (gone)
		snprintf(removed, sizeof(removed), "; the %d checkpoint%s of the abandoned steps (the "
			 "newest %s) %s removed", gone, gone == 1 ? "" : "s", newest,
			 gone == 1 ? "was" : "were");
	if (dist_is_root(r->dist))
		fprintf(stderr, "%sasyncpp: %s; rolled back to %s (step %ld): the data of steps %ld to "
			"%ld is passed over and the learning rate is now %.3g times optim.lr's "
			"schedule (rollback %ld of train.max_rollbacks = %ld)%s\n", r->tty ? "\n" : "",
			what, w->good.path, w->good.step, w->good.step + 1, step, tr->lr_scale,
			rollbacks, r->cfg.train_max_rollbacks, removed);
	return 0;
}

/* Each step of a segment through the watch (train_watch.h). A bad step
 * (update skipped: no NaN reached the weights; or a non-finite loss) is
 * reported and the run goes on; a spike, train.max_skipped bad steps in a
 * row, or a run whose last step was bad, has diverged: the run stops
 * before anything more is written (-1), or with train.on_divergence =
 * rollback goes back to the newest good checkpoint (1). 0: go on. The
 * ranks see the same losses and norms, so under MPI they decide alike;
 * the root speaks. */
static int check_steps(struct run *r, long first, const struct step_stats *stats, int n)
{
	const struct config *cfg = &r->cfg;
	struct watch *w = &r->watch;
	for (int i = 0; i < n; i++) {
		long step = first + i + 1;
		const struct step_stats *st = &stats[i];
		enum watch_verdict v = watch_step(w, step, st);
		char what[512];
		if (v == WATCH_SPIKE) {
			snprintf(what, sizeof(what), "the loss at step %ld, %.4g, is %.3g times the mean "
				 "of the last %ld good steps (train.spike_factor = %g)", step, st->loss,
				 st->loss / w->spike_mean, w->window, w->factor);
		} else if (v == WATCH_BAD) {
			if (dist_is_root(r->dist) && st->skipped)
				fprintf(stderr, "%sasyncpp: step %ld: gradient norm is %s (loss %.4g); "
					"update skipped (%ld of train.max_skipped = %ld in a row)\n",
					r->tty ? "\n" : "", step,
					isnan(st->grad_norm) ? "NaN" : "infinite", st->loss, w->bad_in_row,
					cfg->train_max_skipped);
			else if (dist_is_root(r->dist))
				fprintf(stderr, "%sasyncpp: step %ld: loss is %s (gradient norm %.4g); "
					"counted as a skipped step (%ld of train.max_skipped = %ld in a "
					"row)\n", r->tty ? "\n" : "", step, isnan(st->loss) ? "NaN" :
					"infinite", st->grad_norm, w->bad_in_row, cfg->train_max_skipped);
			int ended = step == cfg->train_steps;
			if (w->bad_in_row < cfg->train_max_skipped && !ended)
				continue;
			const char *last = w->bad_in_row < cfg->train_max_skipped ? ", the run's last" : "";
			if (w->bad_in_row == 1)
				snprintf(what, sizeof(what), "the gradient norm or the loss was not finite "
					 "at step %ld%s", step, last);
			else
				snprintf(what, sizeof(what), "the gradient norm or the loss was not finite "
					 "for %ld steps in a row (steps %ld to %ld%s)", w->bad_in_row,
					 step - w->bad_in_row + 1, step, last);
		} else {
			continue;
		}
		char why[160] = "";
		if (!strcmp(cfg->train_on_divergence, "rollback")) {
			if (w->good.path && r->tr.rollbacks < cfg->train_max_rollbacks)
				return roll_back(r, step, what) ? -1 : 1;
			snprintf(why, sizeof(why), " (train.on_divergence = rollback: %s)", w->good.path ?
				 "train.max_rollbacks rollbacks were made" : "no checkpoint to go back to");
		}
		if (!dist_is_root(r->dist))
			return -1;
		char where[1400];
		train_fallback(r, where, sizeof(where));
		return error("training diverged: %s; nothing more is written%s; %s", what, why, where);
	}
	return 0;
}

/* 931000 -> "931 k", 91034112 -> "91 M": three digits and a unit. */
static void fmt_count(char *out, size_t len, double v)
{
	if (v >= 1e9)
		snprintf(out, len, "%.3g G", v / 1e9);
	else if (v >= 1e6)
		snprintf(out, len, "%.3g M", v / 1e6);
	else if (v >= 1e4)
		snprintf(out, len, "%.3g k", v / 1e3);
	else
		snprintf(out, len, "%.0f", v);
}

/* More than DATA_PASSES_MAX passes over the training tokens, or fewer of
 * them than the model has parameters: the run will mostly memorise its
 * data. One line, naming both numbers. */
#define DATA_PASSES_MAX 10.0
static void warn_data_passes(const struct run *r)
{
	const struct trainer *tr = &r->tr;
	double data = (double)r->train.n;
	double read = (double)r->cfg.train_steps * tr->mb_per_step * tr->B * tr->T;
	double params = (double)r->m.numel, passes = data > 0 ? read / data : 0;
	if (data <= 0 || (passes <= DATA_PASSES_MAX && data >= params))
		return;
	char d[32], p[32], rd[32];
	fmt_count(d, sizeof(d), data);
	fmt_count(p, sizeof(p), params);
	fmt_count(rd, sizeof(rd), read);
	const char *why = "fewer tokens than parameters";
	if (passes > DATA_PASSES_MAX)
		why = data >= params ? "more than 10 passes over the data"
				     : "more than 10 passes over fewer tokens than parameters";
	warning("data.train holds %s tokens for %s parameters, and train.steps = %ld reads %s "
		"tokens (%.1f passes): %s; expect the model to memorise its data (more data, a "
		"smaller model or fewer steps)", d, p, r->cfg.train_steps, rd, passes, why);
}

/* Under a launcher that kills the ranks a known time after its SIGTERM
 * (dist_kill_grace), say so at the start when a stop may not fit in it: a
 * stop runs a few more steps (pipeline_stop_steps) before the checkpoint
 * is written. The root speaks, after the second segment. */
static void check_kill_grace(struct run *r, double step_s)
{
	double grace = dist_kill_grace();
	if (grace <= 0 || !dist_is_root(r->dist))
		return;
	int steps = pipeline_stop_steps(&r->tr);
	double stop_s = step_s * steps;
	if (stop_s <= grace)
		return;
	warning("a step takes %.2f s: SIGTERM stops this %s run up to %d steps later (%.1f s), "
		"then it writes the checkpoint, but mpirun kills the ranks %g s after it passes "
		"SIGTERM on and all steps since the last checkpoint would be lost; give them time "
		"with mpirun --mca odls_base_sigkill_timeout %.0f (see asyncpp-distributed(7))",
		step_s, r->cfg.train_schedule, steps, stop_s, grace, ceil(MAX(30.0, 3 * stop_s)));
}

/* model.expert_parallel > 1: what the experts' exchange holds beside the
 * trainer's arenas (sched/expert_mem.h), this process's (rank 0's when
 * there are several: the other stages' differ by their layers and slots) */
static void log_expert_mem(const struct run *r)
{
	const struct trainer *tr = &r->tr;
	if (r->cfg.model_expert_parallel < 2)
		return;
	if (!dist_active(r->dist)) {
		fprintf(stderr, "asyncpp: expert exchange: in threads it holds nothing of its own "
			"(the owners compute in the members' buffers)\n");
		return;
	}
	struct ep_mem e;
	char host[48] = "";
	trainer_ep_mem(tr, &e);
	if (e.staging)
		snprintf(host, sizeof(host), ", host copies %.1f MB", e.staging / 1e6);
	fprintf(stderr, "asyncpp: expert exchange: at most %.1f MB on rank %d (the owners' kept "
		"rows %.1f MB, scratch %.1f MB, gradient accumulators %.1f MB%s)\n",
		ep_mem_total(&e) / 1e6, dist_rank(r->dist), e.kept / 1e6, e.scratch / 1e6,
		e.acc / 1e6, host);
}

int train_loop(struct run *r)
{
	struct config *cfg = &r->cfg;
	struct trainer *tr = &r->tr;
	long total = cfg->train_steps;
	long log_every = cfg->log_every > 0 ? cfg->log_every : 1;
	double t_start = now_sec(), t_last = t_start;
	long step_last = tr->step;
	int segments_run = 0; /* pipeline segments */
	double busy_last = 0, idle_last = 0;
	struct step_stats *stats =
		xcalloc((size_t)MAX(log_every, PIPELINE_SEGMENT_MAX), sizeof(*stats));
	long segment = PIPELINE_SEGMENT_FIRST; /* steps of the next pipeline segment */
	long chunk = 1; /* without a pipeline, steps of the next call: see LOG_AT_LEAST_S */
	double t_logged = t_start; /* when a step line was last printed */
	double log_s = log_at_least_s();
	int rc = 0;
	if (!r->quiet) {
		/* with stages, the cut: "4 stage(s) of 4,4,4,0 layers (balanced)" */
		char cut[96] = "";
		if (tr->S > 1) {
			char list[64];
			cut_format(&tr->cut, list, sizeof(list));
			snprintf(cut, sizeof(cut), " of %s layers (%s)", list, cfg->pipeline_split);
		}
		fprintf(stderr, "asyncpp: training %s, %zu parameters, %d stage(s)%s x %ld "
			"replica(s), schedule %s, optimizer %s, %ld steps of %d micro-batch%s x %d "
			"sequence%s x %d tokens\n",
			cfg->model_arch, r->m.numel, tr->S, cut, cfg->pipeline_data_parallel,
			cfg->train_schedule, cfg->optim_name, total, tr->mb_per_step,
			tr->mb_per_step == 1 ? "" : "es", tr->B, tr->B == 1 ? "" : "s", tr->T);
		log_expert_mem(r);
		warn_data_passes(r);
	}
	if (!r->quiet && r->has_val && cfg->eval_every > 0) {
		int nb = trainer_eval_batches(tr, &r->val, (int)cfg->eval_batches);
		/* what `asyncpp eval CKPT` repeats (its default on the run's data.val) */
		fprintf(stderr, "asyncpp: validation every %ld steps on the first %d batch%s of %d "
			"sequences x %d tokens of %s (%s eval CKPT evaluates the same)\n",
			cfg->eval_every, nb, nb == 1 ? "" : "es", tr->B, tr->T, cfg->data_val, r->prog);
	}
	/* MPI: the ranks agree on stopping, so they stop at the same step */
	while (tr->step < total && !(*r->stop = dist_max_int(r->dist, *r->stop))) {
		long next_log = (tr->step / log_every + 1) * log_every;
		long next = MIN(total, next_log);
		if (tr->kind >= 0) /* a pipeline: see PIPELINE_SEGMENT_S */
			next = MIN(total, log_every >= segment ? next_log : tr->step + segment);
		if (cfg->eval_every > 0)
			next = MIN(next, (tr->step / cfg->eval_every + 1) * cfg->eval_every);
		if (r->sample_every > 0)
			next = MIN(next, (tr->step / r->sample_every + 1) * r->sample_every);
		if (cfg->checkpoint_every > 0)
			next = MIN(next, (tr->step / cfg->checkpoint_every + 1) * cfg->checkpoint_every);
		next = MIN(next, tr->step + (tr->kind >= 0 ? segment : chunk));
		int n = (int)(next - tr->step);
		long first = tr->step;
		struct progress pg; /* on a terminal, when the steps take seconds */
		if (n > 1)
			progress_begin(&pg, !r->quiet, "running steps %ld to %ld of %ld", first + 1,
				       next, total);
		else
			progress_begin(&pg, !r->quiet, "running step %ld of %ld", first + 1, total);
		double t_run = now_sec();
		int failed = trainer_run(tr, n, stats);
		t_run = now_sec() - t_run;
		progress_end(&pg);
		if (failed) {
			free(stats); /* error() said what failed */
			return -1;
		}
		if (tr->kind < 0 && tr->step > first) {
			/* as many steps as fit in log_s seconds at this call's
			 * pace; the root's clock decides, as for segments */
			double fit = log_s * (double)(tr->step - first) / MAX(t_run, 1e-9);
			long most = PIPELINE_SEGMENT_MAX * 1000L; /* an int for dist_max_int */
			long steps = fit >= (double)most ? most : MAX((long)fit, 1);
			chunk = dist_max_int(r->dist, dist_is_root(r->dist) ? (int)steps : 0);
		}
		if (tr->kind >= 0 && tr->step > first) {
			/* the next segment's length from this one's pace; the root's
			 * clock decides, so that every rank runs the same schedule */
			double want = PIPELINE_SEGMENT_S * (double)(tr->step - first) / MAX(t_run, 1e-9);
			long steps = want >= PIPELINE_SEGMENT_MAX ? PIPELINE_SEGMENT_MAX
				   : MAX((long)want, segment_floor(tr));
			segment = dist_max_int(r->dist, dist_is_root(r->dist) ? (int)steps : 0);
			if (++segments_run == 2) /* the first one includes the start-up */
				check_kill_grace(r, t_run / (double)(tr->step - first));
		}
		if (data_failed(r, first)) {
			rc = -1;
			break;
		}
		n = (int)(tr->step - first); /* fewer when a signal stopped the run */
		/* a progress line when the segment reached or passed a log step,
		 * or log_s seconds passed since the last one */
		double now = now_sec();
		int log_due = tr->step / log_every > first / log_every ||
			      now - t_logged >= log_s;
		double dt = now - t_last;
		double tokens = (double)(tr->step - step_last) * tr->mb_per_step * tr->B * tr->T;
		double tps = dt > 0 ? tokens / dt : 0;
		double mfu = r->peak > 0 ? tps * r->flops_per_token / r->peak : 0;
		double busy = 0, idle = 0;
		for (int s = 0; s < tr->S; s++) {
			busy += tr->w[s].busy_s;
			idle += tr->w[s].idle_s;
		}
		double dbusy = busy - busy_last, didle = idle - idle_last;
		double bubble = dbusy + didle > 0 ? didle / (dbusy + didle) : 0;
		for (int i = 0; i < n; i++)
			log_step(r, first + i + 1, &stats[i], tps, mfu, bubble, t_start,
				 i == n - 1);
		int verdict = check_steps(r, first, stats, n);
		if (verdict < 0) {
			rc = -1;
			break;
		}
		if (verdict > 0) { /* rolled back: the next segment from there */
			t_last = now_sec();
			step_last = tr->step;
			busy_last = busy;
			idle_last = idle;
			continue;
		}
		if (r->sample_every > 0 && tr->step % r->sample_every == 0 && sample_now(r)) {
			warning("no more samples in this run (above); training goes on");
			r->sample_every = 0;
		}
		const struct step_stats *last = &stats[n - 1];
		double val = NAN;
		if (r->has_val && cfg->eval_every > 0 &&
		    (tr->step % cfg->eval_every == 0 || tr->step == total)) {
			if (pipeline_eval(tr, &r->val, (int)cfg->eval_batches, &val)) {
				rc = -1; /* every rank: error() said why on the failing one */
				break;
			}
			if (data_failed(r, tr->step)) {
				rc = -1;
				break;
			}
			struct metrics_row row = {.step = tr->step, .wall_s = now_sec() - t_start,
						  .tokens = (double)tr->step * tr->mb_per_step * tr->B * tr->T,
						  .val_loss = val, .has_val_loss = 1};
			log_row(r, &row);
		}
		if (!r->quiet && (log_due || tr->step == total || !isnan(val))) {
			char eta[32];
			fmt_duration(eta, sizeof(eta), dt / MAX(1, tr->step - step_last) * (double)(total - tr->step));
			char valbuf[32] = "";
			if (!isnan(val))
				snprintf(valbuf, sizeof(valbuf), " val %.4f", val);
			char bub[32] = "";
			if (tr->S > 1)
				snprintf(bub, sizeof(bub), " bubble %.1f%%", 100 * bubble);
			fprintf(stderr, "%sstep %*ld/%ld  loss %.4f%s  lr %.2e  norm %.3f  %.0f tok/s  "
				"mfu %.1f%%%s  eta %s%s",
				r->tty ? "\r" : "", (int)snprintf(NULL, 0, "%ld", total), tr->step,
				total, last->loss, valbuf, last->lr,
				isnan(last->grad_norm) ? NAN : last->grad_norm, tps, 100 * mfu, bub,
				eta, r->tty && isnan(val) && tr->step != total ? "  \033[K" : "\n");
			t_logged = now;
			if (!r->tty && tr->S > 1) {
				for (int s = 0; s < tr->S; s++) {
					struct stage_worker *w = &tr->w[s];
					double tot = w->busy_s + w->idle_s;
					if (!worker_alive(w)) { /* under MPI: rank s holds it */
						fprintf(stderr, "  stage %d: busy %.2fs idle %.2fs "
							"bubble %.1f%%  (rank %d)\n", s, w->busy_s,
							w->idle_s, tot > 0 ? 100 * w->idle_s / tot : 0,
							s);
						continue;
					}
					size_t state = 0;
					for (int i = 0; i < optim_state_count(&w->opt); i++)
						state += optim_state(&w->opt, i).numel;
					fprintf(stderr, "  stage %d: busy %.2fs idle %.2fs bubble %.1f%%  "
						"weights %.1f MB x %d versions  optimizer+correction "
						"state %.1f MB  activations %.1f MB x %d slots\n",
						s, w->busy_s, w->idle_s, tot > 0 ? 100 * w->idle_s / tot : 0,
						w->st.wnumel * 4.0 / 1e6, w->n_versions,
						state * 4.0 / 1e6,
						w->st.act_bytes_per_slot / 1e6, w->st.n_slots);
				}
			}
		}
		t_last = now;
		step_last = tr->step;
		busy_last = busy;
		idle_last = idle;
		/* not in a run of skipped steps: nothing changed since the last
		 * update, and a run about to stop must not rotate out the
		 * checkpoints written before it diverged */
		int by_steps = cfg->checkpoint_every > 0 && tr->step % cfg->checkpoint_every == 0;
		/* by the clock: the root's clock decides, so that every rank agrees */
		int by_time = cfg->checkpoint_every_minutes > 0 &&
			      dist_max_int(r->dist, dist_is_root(r->dist) && now_sec() - r->last_save >=
								    60 * cfg->checkpoint_every_minutes);
		if ((by_steps || by_time) && tr->step < total && r->watch.bad_in_row == 0) {
			char *saved = NULL;
			struct progress pg;
			progress_begin(&pg, !r->quiet, "writing the checkpoint of step %ld",
				       tr->step);
			int failed = train_save_checkpoint(tr, cfg, r->run_id, &r->watch, &saved);
			progress_end(&pg);
			if (failed) {
				rc = -1;
				break;
			}
			watch_saved(&r->watch, tr->step, saved);
			free(saved);
			r->last_save = now_sec();
		}
	}
	free(stats);
	return rc;
}
