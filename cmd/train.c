/* train.c - `asyncpp train`: train a model from a config.
 *
 * With no arguments it trains the built-in tiny llama preset on the
 * built-in corpus on the CPU. This file parses the command, sets up the
 * model, trainer and output directory (a resume, or a claim of a new or
 * --overwrite'd one) and hands the run to train_loop (train_run.c), where
 * logging, evaluation and checkpoints happen at step boundaries.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../io/config/config.h"
#include "../io/formats/checkpoint.h"
#include "../io/report/metrics.h"
#include "../io/report/tensorboard.h"
#include "../io/staged.h"
#include "../io/util.h"
#include "../sched/comm/dist.h"
#include "../sched/trainer.h"
#include "cmd.h"
#include "opts.h"
#include "progress.h"
#include "run_common.h"
#include "run_paths.h"
#include "train_dir.h"
#include "train_run.h"

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
		/* how the experts are spread is not the model: checkpoints hold
		 * every expert whatever model.expert_parallel was */
		int is_fixed = !strcmp(k->section, "model") && strcmp(k->key, "expert_parallel");
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

/* A checkpoint that lies in its run's folder (one whose run-id is the run
 * the checkpoint records, or any run-id for a checkpoint that records none)
 * continues in that folder, wherever the command is started: the
 * train.out_dir stored in it is relative to the directory the run was
 * started in, so a resume from another directory would otherwise begin a
 * second run there. A symbolic link is followed to the folder it points
 * into. -c and --set still choose another folder. A checkpoint outside its
 * run's folder (a backup copy, an import-hf output) keeps the stored
 * train.out_dir. */
static int resume_in_its_folder(struct config *cfg, const char *ck_path)
{
	char *real = realpath(ck_path, NULL);
	if (!real)
		return 0; /* ckpt_open read it: gone since, as the run will say */
	char *slash = strrchr(real, '/');
	*(slash == real ? slash + 1 : slash) = 0;
	uint64_t dir_id = train_dir_run_id(real), own = train_dir_ckpt_run_id(ck_path);
	struct stat a, b;
	int rc = 0;
	if (dir_id && (!own || own == dir_id) &&
	    (stat(cfg->train_out_dir, &a) || stat(real, &b) || a.st_dev != b.st_dev ||
	     a.st_ino != b.st_ino))
		rc = config_set_key(cfg, "train", "out_dir", real, ck_path);
	free(real);
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
	int n = train_dir_checkpoints(resume, train_dir_run_id(resume), &paths);
	/* none yet: a trainer that is still before its first one is the reason */
	if (!n)
		train_dir_mention_others(resume);
	int rc = n ? -1 : train_dir_check_free(resume) ? -1 :
		 error("'%s' holds no checkpoint (ckpt-NNNNNNNN.ckpt)", resume);
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

/* The step a checkpoint holds (ckpt_open checked it). */
static long ckpt_step_of(struct ckpt *ck)
{
	long step = 0;
	return ckpt_meta_long(ck, "step", &step) ? 0 : step;
}

/* --overwrite: the checkpoints of run id (train_dir.h) but keep; returns
 * how many went. */
static int remove_checkpoints(char **paths, int n, const char *keep, uint64_t id)
{
	int removed = 0;
	for (int i = 0; i < n; i++)
		if ((!keep || strcmp(paths[i], keep)) && train_dir_ckpt_of_run(paths[i], id))
			removed += !unlink(paths[i]);
	return removed;
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
	if (!take && access(dir, W_OK | X_OK)) /* an earlier run's train.lock opens */
		return error("cannot write in '%s' (train.out_dir): %s; make the directory "
			     "writable, or set train.out_dir to another directory", dir,
			     strerror(errno));
	if (!take && train_dir_check_own(dir, r->cfg.sample_every > 0))
		return -1;
	if (!take)
		train_dir_mention_others(dir);
	if (!take && train_dir_check_others_ahead(dir, ck ? ckpt_step_of(ck) : 0,
						  r->cfg.train_steps))
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
		int gone = remove_checkpoints(old, n_old, ck_path, dir_id);
		removed = 1;
		if (has_metrics)
			unlink(metrics_path);
		if (!r->quiet)
			fprintf(stderr, "asyncpp: --overwrite: removed %d checkpoint%s%s of the "
				"earlier run in '%s'\n", gone, gone == 1 ? "" : "s",
				has_metrics ? " and its metrics" : "", dir);
	}
	const char *ck_name = ck_path && strrchr(ck_path, '/') ? strrchr(ck_path, '/') + 1 : ck_path;
	/* the newest of the folder's run (another run's is left alone) */
	int last = n_old - 1;
	while (last >= 0 && !train_dir_ckpt_of_run(old[last], dir_id))
		last--;
	const char *newest = last >= 0 ? strrchr(old[last], '/') + 1 : NULL;
	/* by step: a longer name is a later step (past 8 digits), as listed */
	if (!rc && take && !removed && ck && newest &&
	    (strlen(newest) != strlen(ck_name) ? strlen(newest) > strlen(ck_name)
					       : strcmp(newest, ck_name) > 0))
		warning("'%s' is newer than the checkpoint resumed; this run overwrites it when it "
			"reaches that step, and --resume %s would pick it until then",
			old[last], dir);
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
		int n = snprintf(head, sizeof(head),
				 TRAIN_CONFIG_HEAD "%s at %04d-%02d-%02dT%02d:%02d:%02dZ for:\n# ",
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

int cmd_train(int argc, char **argv, const char *prog)
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
	struct run r = {.quiet = quiet, .tty = stderr_is_tty(), .prog = prog};
	struct ckpt *ck = NULL;
	char *ck_path = NULL;
	struct progress pg; /* on a terminal, a line for each long phase */
	if (resume) {
		progress_begin(&pg, !quiet, "opening %s", resume);
		int opened = open_resume(resume, &ck, &ck_path);
		progress_end(&pg);
		if (opened)
			return EXIT_FAIL;
		config_defaults(&r.cfg);
		if (config_load_string(&r.cfg, ckpt_config(ck), ck_path))
			return EXIT_FAIL;
		run_paths_resolve(&r.cfg, ck_path); /* stored as given before they were absolute */
		if (resume_in_its_folder(&r.cfg, ck_path))
			return EXIT_FAIL;
		struct run_paths_saved stored; /* a stored path that is gone: named */
		run_paths_save(&r.cfg, &stored);
		if (config_file && config_load_file(&r.cfg, config_file))
			return EXIT_FAIL;
		for (int i = 0; i < sets.n; i++)
			if (config_set(&r.cfg, sets.items[i]))
				return EXIT_FAIL;
		if (config_finish(&r.cfg) || check_resume_config(&r.cfg, ck) ||
		    (!print_config && run_paths_check_kept(&r.cfg, &stored, ck_path)))
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
	/* stored absolute (config.ini, checkpoints): eval and sample find them
	 * from any directory */
	run_paths_absolute(cfg);
	if (dist_init(cfg, &r.dist)) /* under mpirun/srun: one pipeline stage per process */
		return EXIT_FAIL; /* every rank failed there, and no runtime is left */
	if (!dist_is_root(r.dist)) /* only rank 0 prints, writes metrics and checkpoints */
		r.quiet = quiet = 1;
	/* From here one path leads out (`out`): it frees what was made and
	 * agrees on the status with the other processes. A step that can fail
	 * on one process and not on another sets `failed` and the later steps
	 * are skipped, so that every process meets the others at the same
	 * agreements (dist_max_int) in the same order: none leaves while
	 * another still waits for it. */
	int rc = 0, failed = 0, sig = 0;
	char *metrics_path = NULL, *saved = NULL;
	float *params = NULL;
	if (cfg->log_every < 1 || cfg->checkpoint_keep < 1 || cfg->eval_batches < 1 ||
	    cfg->train_steps < 0) {
		rc = error("log.every, checkpoint.keep and eval.batches must be at least 1 and "
			   "train.steps at least 0 (got %ld, %ld, %ld, %ld)", cfg->log_every,
			   cfg->checkpoint_keep, cfg->eval_batches, cfg->train_steps);
		goto out; /* every rank finds it */
	}
	if (expert_parallel_check(cfg) || run_check_schedule(cfg) ||
	    trainer_check_config(cfg, r.dist)) {
		rc = -1; /* before anything is written; every rank finds it */
		goto out;
	}
	if (!strcmp(cfg->train_delay_mode, "per-stage") &&
	    (cfg->train_delay || strcmp(cfg->train_schedule, "none"))) {
		rc = error("train.delay_mode = per-stage gives stage s the delay S-1-s by itself: it "
			   "cannot be combined with train.delay = %ld or train.schedule = %s",
			   cfg->train_delay, cfg->train_schedule);
		goto out; /* every rank finds it */
	}
	failed = make_dirs(cfg->train_out_dir) != 0;
	metrics_path = cfg->log_metrics[0]
			       ? xstrdup(cfg->log_metrics)
			       : path_join(cfg->train_out_dir, strcmp(cfg->log_format, "jsonl")
								   ? "metrics.csv"
								   : "metrics.jsonl");
	r.lock_fd = -1;
	if (!failed && dist_is_root(r.dist))
		failed = claim_out_dir(&r, ck, ck_path, overwrite, metrics_path, 0) != 0;
	if (dist_max_int(r.dist, failed)) { /* every rank stops when one could not */
		rc = -1;
		goto out;
	}
	failed = !(r.be = backend_from_config(cfg)) ||
		 backend_lanes_from_config(r.be, cfg, r.dist);
	/* (the built-in data says what it does itself) */
	progress_begin(&pg, !quiet && !failed && cfg->data_train[0], "reading %s", cfg->data_train);
	failed = failed || train_setup_data(&r);
	progress_end(&pg);
	failed = failed || (ck_path ? model_from_ckpt_config(&r.m, cfg, (int)r.train.vocab, ck_path)
				    : model_from_config(&r.m, cfg, (int)r.train.vocab));
	if (!failed) {
		progress_begin(&pg, !quiet, "allocating and initialising %zu parameters",
			       r.m.numel);
		/* the checkpoint's config must describe the model without the data */
		char vocab[32];
		snprintf(vocab, sizeof(vocab), "%d", r.m.cfg.V);
		config_set_key(cfg, "model", "vocab_size", vocab, "data");
		/* one stage per process: the trainer initialises its pieces (its
		 * cut), the rest of the arena untouched */
		if (!dist_active(r.dist)) {
			params = xmalloc(st_mult(r.m.numel, sizeof(float)));
			model_init_weights(&r.m, params, (uint64_t)cfg->train_seed);
		}
		failed = failed || trainer_init_on(&r.tr, r.dist, cfg, &r.m, r.be, params, &r.train);
		failed = failed || dist_fault(r.dist, "setup", 0, 0, "set up its part of the run");
		progress_end(&pg);
		free(params);
		params = NULL;
	}
	if (!failed && ck) {
		progress_begin(&pg, !quiet, "loading %s", ck_path);
		failed = trainer_load(&r.tr, ck) != 0;
		progress_end(&pg);
		if (!failed && !quiet)
			fprintf(stderr, "asyncpp: resuming %s at step %ld\n", ck_path, r.tr.step);
	}
	if (!failed) {
		watch_init(&r.watch, cfg, &r.tr); /* the checkpoint resumed waits like any other */
		if (ck)
			watch_saved(&r.watch, r.tr.step, ck_path);
	}
	/* the log files that can still refuse the run, before anything of an
	 * earlier run is touched (the tensorboard file is new, never another's) */
	if (!failed && dist_is_root(r.dist)) {
		char *mdir = parent_dir(metrics_path);
		if (access(mdir, W_OK | X_OK))
			failed = error("cannot write the metrics '%s': its directory '%s': %s; %s",
				       metrics_path, mdir, strerror(errno), errno == ENOENT ?
				       "create it or set log.metrics" :
				       "make it writable or set log.metrics") != 0;
		free(mdir);
		if (!failed && cfg->log_tensorboard[0] && tb_open(&r.tb, cfg->log_tensorboard))
			failed = 1;
	}
	if (dist_agree(r.dist, failed, "to set up its part of the run")) {
		tb_discard(&r.tb);
		rc = -1;
		goto out;
	}
	/* everything that can refuse the run has run: now --overwrite removes
	 * the earlier run, and this run's files go in (their own failures, a
	 * full disk, are all that can stop it from here) */
	int claimed = dist_is_root(r.dist) ? claim_out_dir(&r, ck, ck_path, overwrite, metrics_path, 1) : 0;
	int wrote = claimed || !dist_is_root(r.dist) ? 0 : write_run_config(cfg, cmdline);
	free(cmdline);
	cmdline = NULL;
	free(ck_path);
	ck_path = NULL;
	if (ck)
		ckpt_close(ck);
	ck = NULL;
	/* resuming from an earlier checkpoint rewrites history from there */
	if (!claimed && !wrote && dist_is_root(r.dist))
		wrote = (resume && metrics_keep_until(metrics_path, r.tr.step)) ||
			metrics_open(&r.metrics, metrics_path,
				     strcmp(cfg->log_format, "jsonl") ? METRICS_CSV : METRICS_JSONL,
				     r.m.cfg.E);
	if (dist_max_int(r.dist, claimed || wrote)) {
		tb_discard(&r.tb);
		rc = -1;
		goto out;
	}
	r.flops_per_token = model_flops_per_token(&r.m);
	r.peak = device_peak_flops(r.be, (int)cfg->train_threads);
	r.tr.stop = r.stop = &stop_signal;
	staged_catch(SIGINT, on_signal);
	staged_catch(SIGTERM, on_signal);
	staged_catch(SIGHUP, on_signal);

	r.last_save = now_sec();
	r.sample_every = dist_is_root(r.dist) ? cfg->sample_every : 0;
	if (r.sample_every && dist_active(r.dist)) {
		warning("sample.every needs the whole model in one process; under MPI there are no "
			"samples during training (asyncpp sample reads any checkpoint)");
		r.sample_every = 0;
	} else if (r.sample_every && !cfg->data_tokenizer[0]) {
		warning("sample.every needs data.tokenizer to write text; no samples in this run");
		r.sample_every = 0;
	}
	char advice[400]; /* an uneven cut (pipeline.split = even or layers) */
	if (!quiet && r.tr.S > 1 &&
	    cut_advice(&r.tr.cut, &r.m, cfg->pipeline_split, advice, sizeof(advice)))
		warning("%s", advice);
	/* train_loop's failures are agreed on where they happen (every rank
	 * returns -1 at the same point: sched/executor.c) */
	rc = train_loop(&r);
	if (!rc && r.watch.bad_in_row > 0) {
		/* a signal stopped the run amid bad steps (a run that ends in
		 * them fails in train_loop): their weights are the ones that led
		 * into them, so no checkpoint, and none of the earlier ones goes.
		 * The ranks saw the same steps: they all come here */
		rc = -1;
		if (dist_is_root(r.dist)) {
			char where[1400];
			train_fallback(&r, where, sizeof(where));
			error("stopped by a signal at step %ld, after %ld step(s) in a row whose gradient "
			      "norm or loss was not finite: no checkpoint is written for them; %s",
			      r.tr.step, r.watch.bad_in_row, where);
		}
	}
	progress_begin(&pg, !quiet && !rc, "writing the checkpoint of step %ld", r.tr.step);
	if (!rc && train_save_checkpoint(&r.tr, cfg, r.run_id, NULL, &saved))
		rc = -1;
	progress_end(&pg);
	/* a signal may reach one rank after the loop's last agreement (rank 0
	 * still writing the checkpoint): agree once more, so that every rank
	 * leaves the same way (under MPI one rank in MPI_Finalize and another
	 * in the agreement below would wait for each other) */
	sig = dist_mpi(r.dist) ? dist_max_int(r.dist, stop_signal) : stop_signal;
	if (sig && !rc && dist_is_root(r.dist))
		fprintf(stderr, "\nasyncpp: %s: wrote %s at step %ld; continue with: %s train "
			"--resume %s\n", sig == SIGINT ? "interrupted" : sig == SIGHUP ?
			"hung up" : "terminated", saved,
			r.tr.step, prog, cfg->train_out_dir);
	else if (!rc && !quiet)
		fprintf(stderr, "asyncpp: done: checkpoint %s, metrics %s\n"
			"  evaluate:  %s eval %s\n"
			"  sample:    %s sample %s --prompt \"The\"\n",
			saved, metrics_path, prog, saved, prog, saved);
out:
	metrics_close(&r.metrics);
	tb_close(&r.tb);
	train_sampler_free(r.sampler);
	free(metrics_path);
	free(saved);
	free(cmdline);
	free(ck_path);
	ckpt_close(ck);
	watch_free(&r.watch);
	if (r.tr.be)
		trainer_free(&r.tr);
	dataloader_close(&r.train);
	if (r.has_val)
		dataloader_close(&r.val);
	model_free(&r.m);
	config_free(cfg);
	if (sig && dist_mpi(r.dist)) {
		/* mpirun's daemon is busy killing the job (asyncpp-distributed(7)),
		 * and MPI_Finalize would wait for it until its SIGKILL: once every
		 * rank is here (rank 0 has closed its files), leave without it */
		dist_max_int(r.dist, 0);
		fflush(NULL);
		_exit(rc ? EXIT_FAIL : 128 + sig);
	}
	/* a failure was agreed on where it happened: one more agreement, so
	 * that no rank leaves (and has the launcher end the job) before every
	 * rank has printed its message */
	if (dist_active(r.dist))
		rc = dist_max_int(r.dist, rc != 0) ? -1 : 0;
	dist_finalize(r.dist);
	if (sig)
		return rc ? EXIT_FAIL : 128 + sig;
	return rc ? EXIT_FAIL : EXIT_OK;
}
