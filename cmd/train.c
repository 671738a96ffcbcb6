/* train.c - `asyncpp train`: train a model from a config.
 *
 * With no arguments it trains the built-in tiny llama preset on the
 * built-in corpus on the CPU. Logging, evaluation and checkpoints happen at
 * step boundaries; the work between two boundaries is one call of
 * trainer_run (a pipeline segment for the pipeline schedules).
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../io/formats/checkpoint.h"
#include "../io/config/config.h"
#include "../io/data/dataloader.h"
#include "../io/report/metrics.h"
#include "../io/report/tensorboard.h"
#include "../io/staged.h"
#include "../io/text/tokenizer.h"
#include "../io/util.h"
#include "../optim/optim.h"
#include "../sched/comm/dist.h"
#include "../sched/trainer.h"
#include "builtin.h"
#include "generate.h"
#include "cmd.h"
#include "opts.h"
#include "run_common.h"
#include "train_dir.h"

static const char *const usage[] = {
	"asyncpp train [-c FILE] [--set SECTION.KEY=VALUE]... [--resume PATH] [--overwrite] [-q]",
	"asyncpp train --print-config [-c FILE] [--set SECTION.KEY=VALUE]...",
	NULL,
};

static volatile int stop_signal; /* the signal that asked to stop */

/* The first SIGINT/SIGTERM/SIGHUP (a closed terminal or ssh session) asks
 * the run to stop at the next step boundary
 * and write a checkpoint; a second one ends the process at once, removing
 * the files it was writing (io/staged.h). */
static void on_signal(int sig)
{
	if (stop_signal) {
		staged_remove_all();
		signal(sig, SIG_DFL);
		raise(sig);
	}
	stop_signal = sig;
}

/* A pipeline segment ends with a drain, where the run can stop, log and
 * save. A drain leaves about (S-1) micro-batch slots idle, so segments are
 * not cut at every log interval (at log.every = 1 that would be 1F1B's
 * bubble again): they run for about PIPELINE_SEGMENT_S seconds (from the
 * last segment's time per step; at least PIPELINE_SEGMENT_MIN steps, the
 * first one that long, and at most PIPELINE_SEGMENT_MAX), or to the next
 * evaluation or checkpoint, and their steps are logged when they end. A
 * drain then costs about (S-1)/(n*M+S-1) of the time for segments of n
 * steps: under 1% once steps are fast, and a signal is still served within
 * seconds (or 20 steps, when steps are slower than half a second). */
#define PIPELINE_SEGMENT_S 10.0
#define PIPELINE_SEGMENT_MIN 20
#define PIPELINE_SEGMENT_MAX 1000

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

/* Write a checkpoint for the trainer's current step and keep the newest K. */
static int save_checkpoint(struct trainer *tr, const struct config *cfg, char **saved)
{
	char name[64];
	snprintf(name, sizeof(name), "ckpt-%08ld.ckpt", tr->step);
	char *path = path_join(cfg->train_out_dir, name);
	char *text = config_to_string(cfg);
	char meta[64] = "";
	if (tr->data && tr->data->tokenizer_hash)
		snprintf(meta, sizeof(meta), "tokenizer_hash = 0x%016llx\n",
			 (unsigned long long)tr->data->tokenizer_hash);
	int rc = pipeline_save(tr, path, text, meta); /* MPI: rank 0 writes */
	free(text);
	if (rc) {
		free(path);
		return -1;
	}
	char **paths = NULL;
	int n = dist_is_root() ? list_checkpoints(cfg->train_out_dir, &paths) : 0;
	for (int i = 0; i < n; i++) {
		if (i < n - cfg->checkpoint_keep && strcmp(paths[i], path))
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

struct run {
	struct config cfg;
	struct model m;
	const struct backend *be;
	struct dataloader train, val;
	int has_val;
	struct trainer tr;
	struct metrics_file metrics;
	struct tb_writer tb; /* log.tensorboard; closed when not asked for */
	struct sampler *sampler; /* sample.every; NULL until the first sample */
	double flops_per_token, peak;
	int quiet, tty;
	long skips_in_row; /* steps skipped in a row (count_skips) */
	long sample_every; /* sample.every, 0 where it cannot run (under MPI) */
	uint64_t run_id;   /* cmd/train_dir.h: the run train.out_dir holds */
	double last_save;  /* now_sec() of the last checkpoint (or the start) */
	int lock_fd;       /* holds train.out_dir's lock (root only; else -1) */
};

static int setup_data(struct run *r)
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
	/* Under MPI a rank that runs neither the first stage (inputs) nor the
	 * last (targets) never reads a token: it opens the shards for their
	 * sizes only, instead of holding a copy of the data. */
	int S = (int)cfg->pipeline_stages, s = dist_rank() % MAX(S, 1);
	if (dist_active() && strcmp(cfg->train_schedule, "none") && s != 0 && s != S - 1)
		load = DATA_LOAD_STREAM;
	if (dataloader_open_load(&r->train, cfg->data_train, B, T, (uint64_t)cfg->train_seed, 1,
				 load))
		return -1;
	if (cfg->data_val[0]) {
		if (dataloader_open_load(&r->val, cfg->data_val, B, T, 0, 0, load))
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
	double now = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
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

static void log_step(struct run *r, long step, const struct step_stats *st, double tps,
		     double mfu, double bubble, double wall, int with_rate)
{
	struct metrics_row row = {
		.step = step,
		.tokens = (double)step * r->tr.mb_per_step * r->tr.B * r->tr.T,
		.wall_s = wall,
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

static void sampler_free(struct sampler *sp)
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
	if (!dist_max_int(r->train.failed || r->val.failed))
		return 0;
	error("reading the data failed (above): the steps after step %ld were not kept; "
	      "checkpoints already in '%s' are intact. Replace or re-encode the shard "
	      "('asyncpp inspect SHARD' verifies one), then run again (--resume continues from "
	      "a checkpoint)", first, r->cfg.train_out_dir);
	return 1;
}

/* Steps whose gradient norm was not finite were skipped by every stage (no
 * NaN reached the weights); each is reported, and train.max_skipped of
 * them in a row stop the run before anything more is written. The ranks
 * see the same norms, so under MPI they stop together; the root speaks. */
static int count_skips(struct run *r, long first, const struct step_stats *stats, int n)
{
	const struct config *cfg = &r->cfg;
	for (int i = 0; i < n; i++) {
		long step = first + i + 1;
		if (!stats[i].skipped) {
			r->skips_in_row = 0;
			continue;
		}
		r->skips_in_row++;
		if (dist_is_root())
			fprintf(stderr, "%sasyncpp: step %ld: gradient norm is %s (loss %.4g); update "
				"skipped (%ld of train.max_skipped = %ld in a row)\n",
				r->tty ? "\n" : "", step, isnan(stats[i].grad_norm) ? "NaN" : "infinite",
				stats[i].loss, r->skips_in_row, cfg->train_max_skipped);
		if (r->skips_in_row < cfg->train_max_skipped)
			continue;
		if (!dist_is_root())
			return -1;
		char **paths = NULL;
		int np = list_checkpoints(cfg->train_out_dir, &paths);
		char where[1200];
		if (np > 0)
			snprintf(where, sizeof(where), "the newest checkpoint, %s, holds finite weights; "
				 "resume from it with a lower optim.lr (asyncpp train --resume %s "
				 "--set optim.lr=...)", paths[np - 1], paths[np - 1]);
		else
			snprintf(where, sizeof(where), "no checkpoint was written yet; start again with "
				 "a lower optim.lr");
		for (int k = 0; k < np; k++)
			free(paths[k]);
		free(paths);
		return error("training diverged: the gradient norm was not finite for %ld steps in "
			     "a row (steps %ld to %ld); no update was applied in them and nothing "
			     "more is written; %s", r->skips_in_row, step - r->skips_in_row + 1, step,
			     where);
	}
	return 0;
}

static int train_loop(struct run *r)
{
	struct config *cfg = &r->cfg;
	struct trainer *tr = &r->tr;
	long total = cfg->train_steps;
	long log_every = cfg->log_every > 0 ? cfg->log_every : 1;
	double t_start = now_sec(), t_last = t_start;
	long step_last = tr->step;
	double busy_last = 0, idle_last = 0;
	struct step_stats *stats =
		xcalloc((size_t)MAX(log_every, PIPELINE_SEGMENT_MAX), sizeof(*stats));
	long segment = PIPELINE_SEGMENT_MIN; /* steps of the next pipeline segment */
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
			"replica(s), schedule %s, optimizer %s, %ld steps of %d x %d x %d tokens\n",
			cfg->model_arch, r->m.numel, tr->S, cut, cfg->pipeline_data_parallel,
			cfg->train_schedule, cfg->optim_name, total, tr->mb_per_step, tr->B, tr->T);
	}
	if (!r->quiet && r->has_val && cfg->eval_every > 0) {
		int nb = trainer_eval_batches(tr, &r->val, (int)cfg->eval_batches);
		/* what `asyncpp eval CKPT --batches N` repeats */
		fprintf(stderr, "asyncpp: validation every %ld steps on the first %d batch%s of %d x "
			"%d tokens of %s (asyncpp eval CKPT --batches %d evaluates the same)\n",
			cfg->eval_every, nb, nb == 1 ? "" : "es", tr->B, tr->T, cfg->data_val, nb);
	}
	/* MPI: the ranks agree on stopping, so they stop at the same step */
	while (tr->step < total && !(stop_signal = dist_max_int(stop_signal))) {
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
		if (tr->kind >= 0)
			next = MIN(next, tr->step + segment);
		int n = (int)(next - tr->step);
		long first = tr->step;
		double t_run = now_sec();
		if (trainer_run(tr, n, stats)) {
			free(stats); /* error() said what failed */
			return -1;
		}
		t_run = now_sec() - t_run;
		if (tr->kind >= 0 && tr->step > first) {
			/* the next segment's length from this one's pace; the root's
			 * clock decides, so that every rank runs the same schedule */
			double want = PIPELINE_SEGMENT_S * (double)(tr->step - first) / MAX(t_run, 1e-9);
			long steps = want >= PIPELINE_SEGMENT_MAX ? PIPELINE_SEGMENT_MAX
				   : MAX((long)want, PIPELINE_SEGMENT_MIN);
			segment = dist_max_int(dist_is_root() ? (int)steps : 0);
		}
		if (data_failed(r, first)) {
			rc = -1;
			break;
		}
		n = (int)(tr->step - first); /* fewer when a signal stopped the run */
		/* a progress line when the segment reached or passed a log step */
		int log_due = tr->step / log_every > first / log_every;
		double now = now_sec();
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
			log_step(r, first + i + 1, &stats[i], tps, mfu, bubble, now - t_start,
				 i == n - 1);
		if (count_skips(r, first, stats, n)) {
			rc = -1;
			break;
		}
		if (r->sample_every > 0 && tr->step % r->sample_every == 0 && sample_now(r)) {
			warning("no more samples in this run (above); training goes on");
			r->sample_every = 0;
		}
		const struct step_stats *last = &stats[n - 1];
		double val = NAN;
		if (r->has_val && cfg->eval_every > 0 &&
		    (tr->step % cfg->eval_every == 0 || tr->step == total)) {
			val = pipeline_eval(tr, &r->val, (int)cfg->eval_batches);
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
						w->st.numel * 4.0 / 1e6, w->n_versions, state * 4.0 / 1e6,
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
			      dist_max_int(dist_is_root() && now_sec() - r->last_save >=
								    60 * cfg->checkpoint_every_minutes);
		if ((by_steps || by_time) && tr->step < total && r->skips_in_row == 0) {
			if (save_checkpoint(tr, cfg, NULL)) {
				rc = -1;
				break;
			}
			r->last_save = now_sec();
		}
	}
	free(stats);
	return rc;
}

/* Keys a resumed run may not change: the model, and what decides which
 * data each step reads (so resuming stays exact). Steps, learning rate,
 * schedule and stages may change: checkpoints do not depend on them. */
static int check_resume_config(const struct config *cfg, struct ckpt *ck)
{
	static const char *const fixed[] = {"train.batch_size", "train.seed", "pipeline.micro_batches",
					    "pipeline.data_parallel"};
	struct config saved;
	config_defaults(&saved);
	if (config_load_string(&saved, ckpt_config(ck), ckpt_path(ck)))
		return -1;
	int rc = 0;
	for (int i = 0; i < config_key_count && !rc; i++) {
		const struct config_key_info *k = &config_key_table[i];
		char name[64];
		snprintf(name, sizeof(name), "%s.%s", k->section, k->key);
		int is_fixed = !strcmp(k->section, "model");
		for (size_t j = 0; j < ARRAY_SIZE(fixed); j++)
			is_fixed |= !strcmp(name, fixed[j]);
		if (!is_fixed)
			continue;
		char *a = config_get_string(&saved, k->section, k->key);
		char *b = config_get_string(cfg, k->section, k->key);
		if (strcmp(a, b))
			rc = error("%s is %s in '%s'; a resumed run cannot change it to %s (the model "
				   "and the data order must stay the same)", name, a, ckpt_path(ck), b);
		free(a);
		free(b);
	}
	config_free(&saved);
	return rc;
}

/* --resume PATH: the checkpoint file, or the newest readable checkpoint of
 * a directory. A directory's newest checkpoint that fails to open or to
 * verify (cut short by a full disk, damaged since) is named, and the one
 * before it is taken. */
static int open_resume(const char *resume, struct ckpt **ck, char **ck_path)
{
	struct stat sb;
	if (stat(resume, &sb) || !S_ISDIR(sb.st_mode))
		return !(*ck_path = find_checkpoint(resume)) || ckpt_open(ck, *ck_path) ? -1 : 0;
	char **paths = NULL;
	int n = list_checkpoints(resume, &paths);
	int rc = n ? -1 : error("'%s' holds no checkpoint (ckpt-*.ckpt)", resume);
	for (int i = n - 1; i >= 0 && rc; i--) {
		if (!ckpt_open(ck, paths[i]) && !ckpt_verify(*ck)) {
			*ck_path = xstrdup(paths[i]);
			rc = 0;
		} else {
			if (*ck)
				ckpt_close(*ck);
			*ck = NULL;
			if (i > 0)
				warning("cannot resume from '%s' (above); taking the checkpoint before "
					"it, '%s'", paths[i], paths[i - 1]);
		}
	}
	for (int i = 0; i < n; i++)
		free(paths[i]);
	free(paths);
	return rc;
}

static void remove_checkpoints(char **paths, int n, const char *keep)
{
	for (int i = 0; i < n; i++)
		if (!keep || strcmp(paths[i], keep))
			unlink(paths[i]);
}

/* Make train.out_dir this run's (cmd/train_dir.h), in two calls. The first
 * (take = 0) locks it and refuses to write over another run's checkpoints
 * or metrics unless --overwrite; it changes nothing, so a run that fails
 * while it sets up (backend, data, model, log files) loses the earlier run
 * nothing. The second (take = 1, once the run is ready to start) clears
 * orphaned temporaries, removes what --overwrite replaces and sets
 * r->run_id. Only the root calls
 * it: it alone writes there. */
static int claim_out_dir(struct run *r, struct ckpt *ck, const char *ck_path, int overwrite,
			 const char *metrics_path, int take)
{
	const char *dir = r->cfg.train_out_dir;
	if (!take && train_dir_lock(dir, &r->lock_fd))
		return -1;
	if (!metrics_is_metrics_file(metrics_path))
		return error("log.metrics = '%s' is a file that is not a metrics file; this run "
			     "would replace it: choose another path", metrics_path);
	if (take)
		train_dir_remove_temporaries(dir, overwrite, r->quiet);
	char **old = NULL;
	int n_old = list_checkpoints(dir, &old);
	struct stat sb;
	int has_metrics = !stat(metrics_path, &sb) && sb.st_size > 0;
	uint64_t dir_id = train_dir_run_id(dir);
	uint64_t ck_id = ck ? train_dir_run_id_of(ck_path) : 0;
	/* a resumed run continues the directory's run when the ids agree (or,
	 * for checkpoints older than run ids, when it lies in the directory) */
	int same = ck && (!(n_old || has_metrics) ||
			  (dir_id && ck_id ? dir_id == ck_id : train_dir_holds(dir, ck_path)));
	int rc = 0;
	if (!ck && n_old && !overwrite)
		rc = error("'%s' holds checkpoints of an earlier run (newest '%s'); continue it with "
			   "--resume %s, start afresh with --overwrite (which deletes them), or set "
			   "train.out_dir", dir, old[n_old - 1], dir);
	else if (!ck && has_metrics && !overwrite)
		rc = error("'%s' holds the metrics of an earlier run; start afresh with --overwrite "
			   "(which replaces them), or set %s", metrics_path,
			   r->cfg.log_metrics[0] ? "log.metrics" : "train.out_dir");
	else if (ck && !same && !overwrite)
		rc = error("'%s' holds another run (run 0x%016llx, %s) than the checkpoint '%s' "
			   "(run 0x%016llx); resuming into it would append to its metrics and let "
			   "checkpoint.keep delete its checkpoints: set train.out_dir to another "
			   "directory, or pass --overwrite to replace that run", dir,
			   (unsigned long long)dir_id,
			   n_old ? "with checkpoints" : "with metrics", ck_path,
			   (unsigned long long)ck_id);
	int removed = 0;
	if (!rc && take && (!ck || !same) && (n_old || has_metrics)) { /* --overwrite */
		remove_checkpoints(old, n_old, ck_path);
		removed = 1;
		if (has_metrics)
			unlink(metrics_path);
		if (!r->quiet)
			fprintf(stderr, "asyncpp: --overwrite: removed %d checkpoint%s%s of the "
				"earlier run in '%s'\n", n_old, n_old == 1 ? "" : "s",
				has_metrics ? " and its metrics" : "", dir);
	}
	const char *ck_name = ck_path && strrchr(ck_path, '/') ? strrchr(ck_path, '/') + 1 : ck_path;
	if (!rc && take && !removed && ck && n_old &&
	    strcmp(strrchr(old[n_old - 1], '/') + 1, ck_name) > 0)
		warning("'%s' is newer than the checkpoint resumed; this run overwrites it when it "
			"reaches that step, and --resume %s would pick it until then",
			old[n_old - 1], dir);
	for (int i = 0; i < n_old; i++)
		free(old[i]);
	free(old);
	if (rc || !take)
		return rc;
	r->run_id = ck && ck_id ? ck_id : ck && same && dir_id ? dir_id : train_dir_new_run_id();
	return train_dir_set_run_id(dir, r->run_id);
}

/* The directory path lies in ("." for a bare name; malloc'ed). */
static char *parent_dir(const char *path)
{
	const char *slash = strrchr(path, '/');
	if (!slash)
		return xstrdup(".");
	if (slash == path)
		return xstrdup("/");
	char *dir = xstrdup(path);
	dir[slash - path] = 0;
	return dir;
}

/* The command line, shell-quoted where a word needs it (malloc'ed). */
static char *command_line(int argc, char **argv)
{
	struct buf b = {0};
	buf_append(&b, "asyncpp", 7);
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		int plain = *a != 0;
		for (const char *c = a; *c; c++)
			if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
				    "-_./=:,+@%", *c))
				plain = 0;
		buf_append(&b, " ", 1);
		if (plain) {
			buf_append(&b, a, strlen(a));
			continue;
		}
		buf_append(&b, "'", 1);
		for (const char *c = a; *c; c++)
			if (*c == '\'')
				buf_append(&b, "'\\''", 4);
			else
				buf_append(&b, c, 1);
		buf_append(&b, "'", 1);
	}
	buf_append(&b, "", 1);
	return (char *)b.data;
}

/* OUT_DIR/config.ini: the run's whole configuration, resolved (the data the
 * built-in corpus gave, the vocabulary), so `asyncpp train -c
 * OUT_DIR/config.ini` reruns it; the command line and build in comments. */
static int write_run_config(const struct config *cfg, const char *cmdline)
{
	char *path = path_join(cfg->train_out_dir, "config.ini");
	char *text = config_to_string(cfg);
	struct atomic_file af;
	int rc = atomic_open(&af, path);
	if (!rc) {
		char head[160];
		time_t now = time(NULL);
		struct tm tm;
		gmtime_r(&now, &tm);
		int n = snprintf(head, sizeof(head), "# written by asyncpp %s at %04d-%02d-%02dT%02d:%02d:%02dZ for:\n# ",
				 ASYNCPP_VERSION, tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
				 tm.tm_hour, tm.tm_min, tm.tm_sec);
		/* comment lines short enough for the INI reader (and a newline in
		 * an argument must not end the comment): wrapped at blanks, a
		 * trailing backslash continues, as in a shell */
		struct buf line = {0};
		size_t col = 0;
		for (const char *c = cmdline; *c; c++) {
			if (*c == '\n' || (col >= 100 && *c == ' ') || col >= 150) {
				buf_append(&line, *c == ' ' ? " \\\n# " : "\\\n# ", *c == ' ' ? 5 : 4);
				col = 0;
				if (*c == ' ' || *c == '\n')
					continue;
			}
			buf_append(&line, c, 1);
			col++;
		}
		static const char rerun[] =
			"\n# rerun: asyncpp train -c THIS_FILE --set train.out_dir=NEW_DIR\n\n";
		if (atomic_write(&af, head, (size_t)n) || atomic_write(&af, line.data, line.len) ||
		    atomic_write(&af, rerun, sizeof(rerun) - 1) ||
		    atomic_write(&af, text, strlen(text)) || atomic_commit(&af))
			rc = -1;
		buf_free(&line);
	}
	free(text);
	free(path);
	return rc;
}

int cmd_train(int argc, char **argv)
{
	char *cmdline = command_line(argc, argv); /* "train ...", before opts_parse moves argv */
	const char *config_file = NULL, *resume = NULL;
	struct opt_list sets = {0};
	int print_config = 0, quiet = 0, overwrite = 0;
	const struct option options[] = {
		OPT_STRING('c', "config", &config_file, "FILE", "read the configuration from an INI file"),
		OPT_LIST('s', "set", &sets, "SECTION.KEY=VALUE", "set one key (repeatable; after -c)"),
		OPT_FLAG(0, "print-config", &print_config, "print the effective configuration and exit"),
		OPT_STRING(0, "resume", &resume, "PATH", "continue from a checkpoint file or the newest in a directory"),
		OPT_FLAG(0, "overwrite", &overwrite, "start afresh over an earlier run's checkpoints and metrics in train.out_dir (they are deleted)"),
		OPT_FLAG('q', "quiet", &quiet, "print errors only"),
		OPT_END(),
	};
	int npos = opts_parse(argc, argv, usage, options,
			      "Train a model. With no arguments: the built-in tiny llama on the built-in corpus.");
	if (npos)
		opts_usage_error(usage, options, "unexpected argument '%s'", argv[0]);
	struct run r = {.quiet = quiet, .tty = stderr_is_tty()};
	struct ckpt *ck = NULL;
	char *ck_path = NULL;
	if (resume) {
		if (open_resume(resume, &ck, &ck_path))
			return EXIT_FAIL;
		config_defaults(&r.cfg);
		if (config_load_string(&r.cfg, ckpt_config(ck), ck_path) ||
		    (config_file && config_load_file(&r.cfg, config_file)))
			return EXIT_FAIL;
		for (int i = 0; i < sets.n; i++)
			if (config_set(&r.cfg, sets.items[i]))
				return EXIT_FAIL;
		if (config_finish(&r.cfg) || check_resume_config(&r.cfg, ck))
			return EXIT_FAIL;
	} else if (config_from_args(&r.cfg, config_file, sets.items, sets.n)) {
		return EXIT_FAIL;
	}
	free(sets.items);
	if (print_config) {
		config_print(stdout, &r.cfg);
		return EXIT_OK;
	}
	struct config *cfg = &r.cfg;
	if (dist_init(cfg)) /* under mpirun/srun: one pipeline stage per process */
		return EXIT_FAIL;
	if (!dist_is_root()) /* only rank 0 prints, writes metrics and checkpoints */
		r.quiet = quiet = 1;
	if (cfg->log_every < 1 || cfg->checkpoint_keep < 1 || cfg->eval_batches < 1 ||
	    cfg->train_steps < 0) {
		error("log.every, checkpoint.keep and eval.batches must be at least 1 and "
		      "train.steps at least 0 (got %ld, %ld, %ld, %ld)", cfg->log_every,
		      cfg->checkpoint_keep, cfg->eval_batches, cfg->train_steps);
		return EXIT_FAIL;
	}
	if (!strcmp(cfg->train_delay_mode, "per-stage") &&
	    (cfg->train_delay || strcmp(cfg->train_schedule, "none"))) {
		error("train.delay_mode = per-stage gives stage s the delay S-1-s by itself: it "
		      "cannot be combined with train.delay = %ld or train.schedule = %s",
		      cfg->train_delay, cfg->train_schedule);
		return EXIT_FAIL;
	}
	if (make_dirs(cfg->train_out_dir))
		return EXIT_FAIL;
	char *metrics_path = cfg->log_metrics[0]
				     ? xstrdup(cfg->log_metrics)
				     : path_join(cfg->train_out_dir, strcmp(cfg->log_format, "jsonl")
									 ? "metrics.csv"
									 : "metrics.jsonl");
	r.lock_fd = -1;
	int claimed = dist_is_root() ? claim_out_dir(&r, ck, ck_path, overwrite, metrics_path, 0) : 0;
	if (dist_max_int(claimed != 0)) /* every rank stops when the root could not */
		return EXIT_FAIL;
	if (!(r.be = backend_from_config(cfg)) || backend_lanes_from_config(r.be, cfg) ||
	    setup_data(&r))
		return EXIT_FAIL;
	if (model_from_config(&r.m, cfg, (int)r.train.vocab))
		return EXIT_FAIL;
	/* the checkpoint's config must describe the model without the data */
	char vocab[32];
	snprintf(vocab, sizeof(vocab), "%d", r.m.cfg.V);
	config_set_key(cfg, "model", "vocab_size", vocab, "data");
	float *params = xmalloc(st_mult(r.m.numel, sizeof(float)));
	if (dist_active()) { /* one stage per process: the rest of the arena stays untouched */
		struct stage_cut cut; /* the trainer's: both come from cut_from_config */
		if (cut_from_config(&cut, cfg, &r.m))
			return EXIT_FAIL;
		model_init_weights_stage(&r.m, params, (uint64_t)cfg->train_seed, &cut,
					 dist_rank() % cut.S);
		cut_free(&cut);
	} else
		model_init_weights(&r.m, params, (uint64_t)cfg->train_seed);
	if (trainer_init(&r.tr, cfg, &r.m, r.be, params, &r.train))
		return EXIT_FAIL;
	free(params);
	if (ck) {
		if (trainer_load(&r.tr, ck))
			return EXIT_FAIL;
		if (!quiet)
			fprintf(stderr, "asyncpp: resuming %s at step %ld\n", ck_path, r.tr.step);
	}
	/* the log files that can still refuse the run, before anything of an
	 * earlier run is touched (the tensorboard file is new, never another's) */
	int logs = 0;
	if (dist_is_root()) {
		char *mdir = parent_dir(metrics_path);
		if (access(mdir, W_OK | X_OK))
			logs = error("cannot write the metrics '%s': its directory '%s': %s; "
				     "create it or set log.metrics", metrics_path, mdir,
				     strerror(errno));
		free(mdir);
		if (!logs && cfg->log_tensorboard[0] && tb_open(&r.tb, cfg->log_tensorboard))
			logs = -1;
	}
	if (dist_max_int(logs != 0)) {
		tb_discard(&r.tb);
		return EXIT_FAIL;
	}
	/* everything that can refuse the run has run: now --overwrite removes
	 * the earlier run, and this run's files go in (their own failures, a
	 * full disk, are all that can stop it from here) */
	claimed = dist_is_root() ? claim_out_dir(&r, ck, ck_path, overwrite, metrics_path, 1) : 0;
	int wrote = claimed || !dist_is_root() ? 0 : write_run_config(cfg, cmdline);
	free(cmdline);
	free(ck_path);
	if (ck)
		ckpt_close(ck);
	/* resuming from an earlier checkpoint rewrites history from there */
	if (!claimed && !wrote && dist_is_root())
		wrote = (resume && metrics_keep_until(metrics_path, r.tr.step)) ||
			metrics_open(&r.metrics, metrics_path,
				     strcmp(cfg->log_format, "jsonl") ? METRICS_CSV : METRICS_JSONL,
				     r.m.cfg.E);
	if (dist_max_int(claimed || wrote)) {
		tb_discard(&r.tb);
		return EXIT_FAIL;
	}
	r.flops_per_token = model_flops_per_token(&r.m);
	r.peak = device_peak_flops(r.be, (int)cfg->train_threads);
	r.tr.stop = &stop_signal;
	struct sigaction sa = {0};
	sa.sa_handler = on_signal;
	static const int stop_signals[] = {SIGINT, SIGTERM, SIGHUP};
	for (size_t i = 0; i < ARRAY_SIZE(stop_signals); i++) {
		struct sigaction old;
		/* one ignored by whoever started the run (nohup) stays ignored */
		if (!sigaction(stop_signals[i], NULL, &old) && old.sa_handler != SIG_IGN)
			sigaction(stop_signals[i], &sa, NULL);
	}

	r.last_save = now_sec();
	r.sample_every = dist_is_root() ? cfg->sample_every : 0;
	if (r.sample_every && dist_active()) {
		warning("sample.every needs the whole model in one process; under MPI there are no "
			"samples during training (asyncpp sample reads any checkpoint)");
		r.sample_every = 0;
	} else if (r.sample_every && !cfg->data_tokenizer[0]) {
		warning("sample.every needs data.tokenizer to write text; no samples in this run");
		r.sample_every = 0;
	}
	int rc = train_loop(&r);
	char *saved = NULL;
	if (!rc && save_checkpoint(&r.tr, cfg, &saved))
		rc = -1;
	if (stop_signal && !rc && dist_is_root())
		fprintf(stderr, "\nasyncpp: %s: wrote %s at step %ld; continue with: asyncpp train "
			"--resume %s\n", stop_signal == SIGINT ? "interrupted" : stop_signal == SIGHUP ?
			"hung up" : "terminated", saved,
			r.tr.step, cfg->train_out_dir);
	else if (!rc && !quiet)
		fprintf(stderr, "asyncpp: done: checkpoint %s, metrics %s\n"
			"  evaluate:  asyncpp eval %s\n"
			"  sample:    asyncpp sample %s --prompt \"The\"\n",
			saved, metrics_path, saved, saved);
	metrics_close(&r.metrics);
	tb_close(&r.tb);
	sampler_free(r.sampler);
	free(metrics_path);
	free(saved);
	trainer_free(&r.tr);
	dataloader_close(&r.train);
	if (r.has_val)
		dataloader_close(&r.val);
	model_free(&r.m);
	config_free(cfg);
	dist_finalize();
	if (stop_signal)
		return rc ? EXIT_FAIL : 128 + stop_signal;
	return rc ? EXIT_FAIL : EXIT_OK;
}
